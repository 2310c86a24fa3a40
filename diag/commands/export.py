"""`pardiag export PATH --perfetto [-o FILE]`"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pardiag.errors import UserError

if TYPE_CHECKING:
    from pardiag.export_perfetto import Progress

DESCRIPTION = """Write the whole job as one Chrome/Perfetto trace: every rank a process
("rank N (host)") with all the events of its profiled window, its threads and GPU streams;
the ranks' clocks aligned as the analysis aligns them (on the ends of their collectives;
ranks of one host share its clock), the job starting at 0.

Above each rank's own threads, pardiag's tracks: "steps" (one slice per profiled step),
"collectives (matched)" (each collective matched across ranks, split into the wait for the
other ranks and the transfer, with a flow arrow to the same collective on every other
rank) and "critical path" (what each step's end waited on, from the replay of the window).
The straggler the analysis names is labelled on its process and marked at its first step.

The file is the trace-event JSON format (gzip-compressed when its name ends in .gz): open
it in https://ui.perfetto.dev ("Open trace file") or in chrome://tracing ("Load").
A rank whose trace is missing or unreadable is left out and named, on stderr and in the
file's otherData; with no readable trace at all the command fails."""

EPILOG = """examples:
  pardiag export pardiag-runs/exp1 --perfetto -o job.json.gz
  pardiag export traces/ --perfetto -o traces.json      # plain JSON, no compression
  pardiag export pardiag-runs/exp1 --perfetto           # writes ./exp1.perfetto.json.gz
  pardiag export pardiag-runs/big --perfetto --ranks 0-7 -o first-node.json.gz
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="run directory, folder of traces, or a trace file")
    p.add_argument("--perfetto", dest="format", action="store_const", const="perfetto", default="perfetto",
                   help="Chrome/Perfetto trace-event JSON (the only format, and the default)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write here; gzip when the name ends in .gz (default: ./<name of PATH>.perfetto.json.gz)")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-3,8 (a large job's file stays "
                                                   "small enough for a browser; clocks and collectives among them)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="processes that parse traces for the analysis "
                                                                "(default: all cores)")
    p.add_argument("--force", action="store_true", help="ignore a cached analysis.json")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, only the line that says what was written")


def default_output(path: Path) -> Path:
    name = path.resolve().name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return Path(f"{name or 'job'}.perfetto.json.gz")


def execute(args: argparse.Namespace) -> int:
    from pardiag.analysis_cache import load_or_analyze
    from pardiag.export_perfetto import export_perfetto, rank_selection

    path = Path(args.path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    only = rank_selection(args.ranks) if args.ranks else None
    out = Path(args.output) if args.output else default_output(path)
    analysis = load_or_analyze(path, jobs=args.jobs, force=args.force, quiet=args.quiet)
    with _progress(args.quiet) as progress:
        res = export_perfetto(path, out, analysis, progress, only)
    for said in res.notices:
        print(f"pardiag: note: {said}", file=sys.stderr)
    for r, why in res.missing.items():
        print(f"pardiag: warning: rank {r} left out of the export: {why}", file=sys.stderr)
    if res.critical_path is not None:
        print(f"pardiag: note: no critical path drawn: {res.critical_path}", file=sys.stderr)
    if res.left_out:
        print(f"pardiag: note: {res.left_out:,} events of the traces left out (no time, a negative duration "
              "or a phase the format does not draw)", file=sys.stderr)
    ranks = len(res.ranks)
    print(f"pardiag: wrote {out} ({_size(res.bytes)}): {res.events:,} events of {ranks} rank{'s' * (ranks != 1)}, "
          f"{res.flows:,} flow{'s' * (res.flows != 1)} joining the collectives matched across ranks"
          + (f"; ranks left out: {', '.join(map(str, res.missing))}" if res.missing else ""))
    print("pardiag: open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)")
    return 0


@contextmanager
def _progress(quiet: bool) -> Iterator[Progress | None]:
    """A progress bar on stderr when it is a terminal (as `pardiag analyze` shows one)."""
    from rich.console import Console

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("reading traces", total=None)

        def on_progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield on_progress


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"
