"""`pardiag merge DIR DIR ... -o RUN`: join run directories written per node."""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
from pathlib import Path

from pardiag import manifest, rundir
from pardiag.errors import UserError

DESCRIPTION = """Join run directories that nodes of one job wrote separately (no shared
filesystem) into one run directory, then rebuild its manifest. Ranks, NCCL logs,
launcher records and logs are copied; a rank present in two inputs with different
files is an error, nothing is overwritten."""

PARTS = ("ranks", "nccl", "logs", "launchers", "flight")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="DIR", help="per-node run directories")
    p.add_argument("-o", "--out", required=True, metavar="RUN", help="the joined run directory (new or empty)")


def execute(args: argparse.Namespace) -> int:
    sources = [Path(p) for p in args.inputs]
    for s in sources:
        if not rundir.is_run_dir(s):
            raise UserError(f"{s} is not a pardiag run directory")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    copied = 0
    for s in sources:
        for part in PARTS:
            src = s / part
            if src.is_dir():
                copied += _copy_tree(src, out / part)
    run = rundir.RunDir(out)
    doc = manifest.write(run)
    print(f"pardiag: merged {len(sources)} directories ({copied} files) into {out}: "
          f"{len(doc['ranks'])} ranks, hosts {', '.join(doc['hosts']) or '?'}")
    return 0


def _copy_tree(src: Path, dst: Path) -> int:
    n = 0
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            a, b = Path(root) / name, dst / rel / name
            if b.exists():
                if filecmp.cmp(a, b, shallow=False):
                    continue
                raise UserError(f"{b.relative_to(dst.parent)} comes from two inputs with different contents")
            shutil.copy2(a, b)
            n += 1
    return n
