"""`pardiag tui PATH`"""

from __future__ import annotations

import argparse
from pathlib import Path

from pardiag import rundir
from pardiag.analysis_cache import is_analysis_file, load_or_analyze, nccl_log_paths
from pardiag.errors import UserError

DESCRIPTION = """Explore a run in the terminal: ranks side by side (sortable, filterable),
one rank in detail, collectives and who waits in them, one profiled step across ranks,
the NCCL setup (and the diagnosis of a hang), and the findings with the change to make
(copied to the clipboard with `c`). PATH is a run directory, a folder of plain
torch.profiler traces, one trace file, or an analysis.json. Keys: 1-5 switch screens,
? help, / filter, s sort, q quit; the mouse works too."""

EPILOG = """examples:
  pardiag tui pardiag-runs/exp1
  pardiag tui traces/ --nccl-log logs/nccl.log
  pardiag tui analysis.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="run directory, folder of traces, trace file, or analysis.json")
    p.add_argument("--nccl-log", action="append", default=[], metavar="FILE",
                   help="also read this NCCL_DEBUG log (or folder of logs); repeatable")


def check_path(path: Path) -> None:
    """Refuse what cannot be analysed before the terminal is taken over."""
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_file():
        name = path.name
        if not (name.endswith(".json") or name.endswith(".json.gz")):
            raise UserError(f"{path}: not a run directory, a trace (.json, .json.gz) or an analysis.json")
        return
    if rundir.is_run_dir(path):
        return
    if not any(p.name.endswith((".json", ".json.gz")) for p in path.rglob("*") if p.is_file()):
        raise UserError(f"{path}: no pardiag run and no trace files (*.json, *.json.gz) in this folder")


def execute(args: argparse.Namespace) -> int:
    path = Path(args.path)
    check_path(path)
    logs = nccl_log_paths(args.nccl_log)
    from pardiag.tui.app import make_app

    if is_analysis_file(path) and not logs:
        app = make_app(load_or_analyze(path))  # a bad file is refused before the terminal is taken over
    else:
        app = make_app(path, nccl_logs=logs)
    app.run()
    if app.load_error:
        raise UserError(app.load_error)  # shown in the app too; said again once the terminal is back
    return 0
