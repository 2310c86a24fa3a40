"""`pardiag run [options] -- COMMAND ...`"""

from __future__ import annotations

import argparse
import os
import re

from pardiag.collectors.config import CollectorConfig, ProfileSchedule, parse_ranks
from pardiag.errors import UserError
from pardiag.recording import choose_run_dir, job_key_from, record
from pardiag.torch_check import check_job_torch

DESCRIPTION = """Run a training command, unchanged, with every Python rank it starts under
torch.profiler (one window of steps), per-step timestamps for all steps, NCCL debug
logging and PyTorch's flight recorder. Works with torchrun, python -m
torch.distributed.run, srun, mpirun, horovodrun, deepspeed, accelerate launch and
plain python. The command's exit code is returned unchanged."""

EPILOG = """A step ends when the script's torch optimizer finishes step() (or when a loop
without one calls pardiag.step()). Steps are numbered from 0 on every rank.

examples:
  pardiag run -- torchrun --nproc-per-node 2 examples/train_ddp.py --epochs 1
  pardiag run --out runs/exp1 --profile-steps 20,2,3 -- torchrun --nproc-per-node 8 train.py
  srun pardiag run --out /shared/runs/exp1 -- python train.py   # every node, one --out
"""

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", metavar="DIR", help="run directory (default: pardiag-runs/<time>-<script>)")
    p.add_argument(
        "--profile-steps",
        metavar="WAIT,WARMUP,ACTIVE",
        default="5,2,3",
        help="profiler window: skip WAIT steps, warm up for WARMUP, record ACTIVE (default: 5,2,3)",
    )
    p.add_argument("--ranks", metavar="LIST", help="profile only these ranks, e.g. 0,1 or 0-3,8 (default: all)")
    p.add_argument("--no-profile", action="store_true", help="no profiler trace; steps, meta and logs only")
    p.add_argument("--no-shapes", action="store_true", help="do not record tensor shapes/dtypes: collectives then have no "
                   "bytes or bandwidth and matrix multiplies no shapes (saves a few percent of a profiled step on the "
                   "bundled example)")
    p.add_argument("--no-profile-on-slowdown", action="store_true",
                   help="do not record a second profiler window when a rank's step stays 1.3x over its median for "
                        "5 steps after the first window (on by default: all ranks record the same steps, agreed "
                        "through the job's rendezvous store, read once every 20 steps)")
    p.add_argument("--with-stack", action="store_true", help="record Python stacks (costly)")
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--profile-memory", action="store_true", default=None,
                        help="record allocations in the profiled window on a GPU job too (on by default for a "
                             "CPU-only job, whose activations are known only from them; a GPU job's come from "
                             "the CUDA allocator's counts)")
    memory.add_argument("--no-profile-memory", dest="profile_memory", action="store_false",
                        help="do not record allocations, on a CPU job either")
    p.add_argument("--no-nccl-log", action="store_true", help="do not set NCCL_DEBUG/NCCL_DEBUG_FILE")
    p.add_argument("--memory-per-rank", metavar="SIZE",
                   help="plan for devices of this memory (e.g. 24GiB, 80GB): the sharding advice uses it "
                        "instead of the memory the ranks have")
    p.add_argument("--job-id", help="shared by every node's `pardiag run` of one job (default: from SLURM or the torchrun rendezvous)")
    p.add_argument("--telemetry-interval", type=float, default=0.1, metavar="SECONDS",
                   help="GPU telemetry (NVML) sampling interval; 0 turns it off (default: 0.1)")
    p.add_argument("--no-report", action="store_true", help="do not write report.html after the run")
    p.add_argument("--no-measure", action="store_true",
                   help="after the job, do not time its top GEMM shapes in fp32 and bf16/fp16 nor sweep all_reduce "
                        "sizes (factors/; at most about 20 s and 30 s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the run directory at the end")
    p.add_argument("--no-torch-check", action="store_true",
                   help="start the command even when its Python seems to have no torch")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")


def execute(args: argparse.Namespace) -> int:
    cmd = [c for c in (args.cmd or [])]
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("nothing to run: pardiag run [options] -- COMMAND [ARGS...]")
    cfg = collector_config(args)
    if not getattr(args, "no_torch_check", False):
        check_job_torch(cmd, os.environ)
    extra_env = {}
    if args.memory_per_rank:
        extra_env["PARDIAG_MEMORY_PER_RANK"] = str(parse_size(args.memory_per_rank))
    job_key = args.job_id or job_key_from(cmd, os.environ)
    run = choose_run_dir(args.out, cmd, job_key)
    if args.telemetry_interval < 0:
        raise UserError("--telemetry-interval must be 0 (off) or a positive number of seconds")
    return record(run, cmd, cfg, job_key, nccl_log=not args.no_nccl_log, quiet=args.quiet,
                  report=not args.no_report, extra_env=extra_env, telemetry_interval=args.telemetry_interval,
                  measure=not args.no_measure)


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '512MiB', '1.5G', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"--memory-per-rank: {text!r} is not a size (e.g. 24GiB, 80GB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    decimal = bool(unit) and not binary and text.strip()[-1:] in "Bb"  # "80GB": powers of 1000
    base = 1000 if decimal else 1024
    power = " KMGT".index(unit or " ")
    return int(value * base**power)


def collector_config(args: argparse.Namespace) -> CollectorConfig:
    try:
        schedule = ProfileSchedule.parse(args.profile_steps)
        ranks = parse_ranks(args.ranks) if args.ranks else None
    except ValueError as e:
        raise UserError(str(e)) from None
    return CollectorConfig(
        schedule=schedule,
        profile=not args.no_profile,
        ranks=ranks,
        record_shapes=not args.no_shapes,
        with_stack=args.with_stack,
        profile_memory=args.profile_memory,
        profile_on_slowdown=not getattr(args, "no_profile_on_slowdown", False),
    )
