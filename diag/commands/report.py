"""`pardiag report PATH [-o FILE] [--format html|md|json|text]`"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pardiag import rundir
from pardiag.errors import UserError
from pardiag.renderers import FORMATS

DESCRIPTION = """Render a report of a run directory, a folder of plain torch.profiler
traces, one trace file, or an analysis.json (`pardiag analyze --json` output).

html: one self-contained file that works offline (charts, tables, findings with the
change to make); written to -o, else into the run directory, else ./report.html.
md: a summary sized for a pull-request comment. json: the Analysis. text: the
terminal summary that `pardiag analyze` prints, without colours.
md, json and text go to stdout unless -o is given."""

EPILOG = """examples:
  pardiag report pardiag-runs/exp1
  pardiag report pardiag-runs/exp1 --format md > comment.md
  pardiag report traces/ -o traces-report.html
  pardiag report analysis.json --format md -o summary.md
"""

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="run directory, folder of traces, trace file, or analysis.json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (html default: RUN/report.html or ./report.html)")
    p.add_argument("--format", choices=list(FORMATS), default="html",
                   help="; ".join(f"{f.name}: {f.help}" for f in FORMATS.values()) + " (default html)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="processes that parse traces (default: all cores)")
    p.add_argument("--force", action="store_true", help="ignore a cached analysis.json")
    p.add_argument("--nccl-log", action="append", default=[], metavar="FILE",
                   help="also read this NCCL_DEBUG log (or folder of logs); repeatable")
    p.add_argument("--hta", action="store_true", help="also run HolisticTraceAnalysis on GPU traces")


def default_output(path: Path) -> Path:
    return path / "report.html" if rundir.is_run_dir(path) else Path("report.html")


def execute(args: argparse.Namespace) -> int:
    from pardiag.analysis_cache import load_or_analyze, nccl_log_paths

    path = Path(args.path)
    fmt = FORMATS[args.format]
    logs = nccl_log_paths(args.nccl_log)
    a = load_or_analyze(path, jobs=args.jobs, force=args.force or bool(logs), quiet=not fmt.to_file,
                        use_hta=args.hta, nccl_logs=logs)
    text = fmt.render(a)
    if args.output is None and not fmt.to_file:
        sys.stdout.write(text)
        return 0
    out = Path(args.output) if args.output else default_output(path)
    try:
        rundir.atomic_write_text(out, text, durable=False)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    size = len(text.encode("utf-8"))
    print(f"pardiag: wrote {out} ({_size(size)})")
    return 0


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"
