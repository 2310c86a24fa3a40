"""`pardiag analyze [PATH] [--json] [--nccl-log FILE]`"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pardiag import analysis as model
from pardiag import rundir
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
        from pardiag.analyzers.analyze import analyze_path

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


HTA_MISSING = ("--hta needs HolisticTraceAnalysis, which is not installed: "
               "pip install 'pardiag[hta]' (or pip install HolisticTraceAnalysis)")


def require_hta() -> None:
    """HTA is an optional extra: say how to get it before any trace is read."""
    import importlib.util

    if importlib.util.find_spec("hta") is None:
        raise UserError(HTA_MISSING)


def nccl_log_paths(given: list[str]) -> list[Path]:
    logs = [Path(p) for p in given]
    for p in logs:
        if not p.exists():
            raise UserError(f"--nccl-log {p}: no such file or directory")
    return logs


def cache_is_fresh(run: rundir.RunDir) -> bool:
    """analysis.json newer than everything it was computed from."""
    try:
        cached = run.analysis.stat().st_mtime
    except FileNotFoundError:
        return False
    for p in [run.manifest, *run.ranks_dir.glob("*/*")]:
        try:
            if p.stat().st_mtime > cached:
                return False
        except FileNotFoundError:
            continue
    return True


def load_or_analyze(
    path: Path,
    jobs: int | None = None,
    force: bool = False,
    quiet: bool = False,
    use_hta: bool = False,
    nccl_logs: list[Path] | None = None,
) -> model.Analysis:
    if path.is_file() and path.name.endswith("analysis.json"):
        return model.load(path)
    is_run = path.is_dir() and rundir.is_run_dir(path)
    run = rundir.RunDir(path) if is_run else None
    if run is not None and not force and cache_is_fresh(run):
        try:
            cached = model.load(run.analysis)
            if cached.hta is not None or not use_hta:
                return cached
        except UserError:
            pass  # an older or broken cache: analyse again
    if use_hta:
        require_hta()  # only now: a cached analysis with HTA's numbers needs no HTA
    a = analyze_with_progress(path, jobs, quiet, use_hta, nccl_logs or [])
    if run is not None:
        try:
            rundir.atomic_write_text(run.analysis, a.to_json() + "\n")
        except OSError as e:
            print(f"pardiag: warning: could not cache the analysis in {run.analysis}: {e.strerror}", file=sys.stderr)
    return a


def analyze_with_progress(
    path: Path, jobs: int | None, quiet: bool, use_hta: bool = False, nccl_logs: list[Path] | None = None
) -> model.Analysis:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pardiag.analyzers.analyze import analyze_path

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return analyze_path(path, jobs=jobs, use_hta=use_hta, nccl_logs=nccl_logs or [])
    with Progress(TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("traces", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze_path(path, jobs=jobs, progress=progress, use_hta=use_hta, nccl_logs=nccl_logs or [])
