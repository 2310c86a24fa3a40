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
filesystem) into one run directory, then rebuild its manifest. Everything the nodes
collected is copied (ranks, GPU telemetry, NCCL logs, flight-recorder dumps, launcher
records, logs); a file present in two inputs with different contents is an error,
nothing is overwritten."""


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
        copied += _copy_collected(s, out)
    run = rundir.RunDir(out)
    doc = manifest.write(run)
    print(f"pardiag: merged {len(sources)} directories ({copied} files) into {out}: "
          f"{len(doc['ranks'])} ranks, hosts {', '.join(doc['hosts']) or '?'}")
    return 0


def _copy_collected(src: Path, out: Path) -> int:
    """Copy what a node collected, as the run directory's list of entries says."""
    n = 0
    for entry in rundir.ENTRIES:
        if entry.role != "collected":
            continue
        if entry.kind == "dir" and (src / entry.name).is_dir():
            n += _copy_tree(src / entry.name, out / entry.name, out)
        elif entry.kind == "file" and (src / entry.name).is_file():
            n += _copy_file(src / entry.name, out / entry.name, out)
    return n


def _copy_tree(src: Path, dst: Path, out: Path) -> int:
    n = 0
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            n += _copy_file(Path(root) / name, dst / rel / name, out)
    return n


def _copy_file(a: Path, b: Path, out: Path) -> int:
    """1 when `a` was copied to `b`, 0 when `b` holds the same already."""
    if b.exists():
        if filecmp.cmp(a, b, shallow=False):
            return 0
        raise UserError(f"{b.relative_to(out)} comes from two inputs with different contents")
    shutil.copy2(a, b)
    return 1
