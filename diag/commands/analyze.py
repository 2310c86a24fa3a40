"""`pardiag analyze [PATH] [--json] [--nccl-log FILE]`"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pardiag.analysis_cache import load_or_analyze, nccl_log_paths
from pardiag.errors import UserError

DESCRIPTION = """Analyse a run directory written by `pardiag run`, a folder of plain
torch.profiler traces (*.json, *.json.gz; the rank is read from each trace), or one
trace file: per rank, where the profiled time went (compute, communication hidden or
exposed, copies, input loading, idle) and by phase; collectives matched across ranks
(transfer versus waiting, bandwidth); the rank that holds the others back and why.
With only --nccl-log (no PATH): the NCCL setup, a hang diagnosis and the NCCL findings
from the logs alone. A run directory's result is cached in its analysis.json."""

EPILOG = """examples:
  pardiag analyze pardiag-runs/exp1
  pardiag analyze traces/ --json > analysis.json
  pardiag analyze rank-0.json.gz
  pardiag analyze traces/ --nccl-log logs/
  pardiag analyze --nccl-log nccl.log          # only a log
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="run directory, folder of traces, or a trace file "
                                          "(may be left out when --nccl-log is given)")
    p.add_argument("--json", action="store_true", help="print the Analysis as JSON on stdout")
    p.add_argument("--jobs", "-j", type=int, default=None, help="processes that parse traces (default: all cores)")
    p.add_argument("--force", action="store_true", help="ignore a cached analysis.json")
    p.add_argument("--nccl-log", action="append", default=[], metavar="FILE",
                   help="also read this NCCL_DEBUG log (or folder of logs); repeatable")
    p.add_argument("--hta", action="store_true",
                   help="also run HolisticTraceAnalysis on GPU traces: idle time (host/kernel wait), "
                        "kernel launch statistics, kernel breakdown")


def execute(args: argparse.Namespace) -> int:
    logs = nccl_log_paths(args.nccl_log)
    if args.path is None:
        if not logs:
            raise UserError("nothing to analyse: pardiag analyze PATH (a run directory, traces) or --nccl-log FILE")
        from pardiag.analyzers.pipeline import analyze_path

        a = analyze_path(None, nccl_logs=logs)
    else:
        a = load_or_analyze(Path(args.path), jobs=args.jobs, force=args.force or bool(logs), quiet=args.json,
                            use_hta=args.hta, nccl_logs=logs)
    if args.json:
        sys.stdout.write(a.to_json() + "\n")
    else:
        from pardiag.render_text import print_summary

        print_summary(a, next_for=args.path)
    return 0
