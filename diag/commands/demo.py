"""`pardiag demo`: the bundled example job, 2 ranks on the CPU, end to end."""

from __future__ import annotations

import argparse
import os
import sys
import time
from importlib import resources
from pathlib import Path

from pardiag.collectors.config import CollectorConfig
from pardiag.errors import UserError
from pardiag.recording import choose_run_dir, record
from pardiag.torch_check import check_job_torch

DESCRIPTION = """Run the bundled DDP example (examples/train_ddp.py: a small transformer on
synthetic data) with 2 ranks on this machine's CPU under `pardiag run`, then print
the summary. Needs nothing but pardiag and torch."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", metavar="DIR", help="run directory (default: pardiag-runs/demo-<time>)")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (default: 2)")
    p.add_argument("--epochs", type=int, default=1, help="epochs of the example (default: 1)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the run directory at the end")
    p.add_argument("--no-measure", action="store_true",
                   help="after the job, do not time its GEMM shapes nor sweep all_reduce sizes (factors/)")
    p.add_argument("example_args", nargs=argparse.REMAINDER, help="more options for the example, after --")


def example_script() -> Path:
    return Path(str(resources.files("pardiag.examples").joinpath("train_ddp.py")))


def execute(args: argparse.Namespace) -> int:
    extra = [a for a in (getattr(args, "cmd", None) or args.example_args or []) if a != "--"]
    python = sys.executable  # the example runs with pardiag's own interpreter
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.nproc),
        "--standalone",
        str(example_script()),
        "--epochs",
        str(args.epochs),
        *extra,
    ]
    try:
        check_job_torch(cmd, os.environ)
    except UserError:
        raise UserError(f"pardiag demo runs the example with {python}, which has no torch: install torch there, "
                        "or run pardiag demo from the environment that has torch") from None
    out = args.out or str(Path("pardiag-runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    run = choose_run_dir(out, cmd, None)
    return record(run, cmd, CollectorConfig(), None, quiet=args.quiet, measure=not args.no_measure)
