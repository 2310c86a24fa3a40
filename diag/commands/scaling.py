"""`pardiag scaling RUN RUN ...`"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pardiag.errors import UserError

DESCRIPTION = """Compare runs of the same job at different world sizes: throughput and
scaling efficiency against the smallest run, strong or weak scaling (from the batch
sizes), the growth of exposed communication, Amdahl's serial fraction fitted to the
speed-ups, and the efficiency it projects at 2x and 4x the largest world size."""

EPILOG = """example:
  pardiag scaling runs/n1 runs/n2 runs/n4 runs/n8
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (or analysis.json files)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def execute(args: argparse.Namespace) -> int:
    from pardiag.analyzers.scaling import scaling
    from pardiag.analysis_cache import load_or_analyze

    if len(args.runs) < 2:
        raise UserError("scaling needs at least two runs")
    runs = [(p, load_or_analyze(Path(p), quiet=True)) for p in args.runs]
    result = scaling(runs)
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    from pardiag.display_efficiency import ratio_text

    console = Console(highlight=False)
    t = Table(title=f"scaling ({result.mode})", title_justify="left")
    for col in ("run", "ranks", "median step ms", "batch/rank", "samples/s", "speed-up", "efficiency",
                "exposed comm", "MFU"):
        t.add_column(col, justify="left" if col == "run" else "right", overflow="fold")
    for pt in result.points:
        t.add_row(
            pt.label, str(pt.world_size), f"{pt.step_us / 1000:.1f}", str(pt.batch_per_rank or "?"),
            f"{pt.throughput:.1f}" if pt.throughput else "-", f"{pt.speedup:.2f}" if pt.speedup else "-",
            f"{pt.efficiency:.0%}" if pt.efficiency else "-", f"{pt.comm_exposed_share:.0%}", ratio_text(pt.mfu),
        )
    console.print(t)
    console.print("median step: the median of the ranks' p50; exposed comm: of the profiled time, waiting for other "
                  "ranks included, pooled over ranks; MFU: model FLOPs of the devices' peak (the figures of each run's "
                  "report)", style="dim", markup=False)
    if result.serial_fraction is not None:
        console.print(f"Amdahl serial fraction: {result.serial_fraction:.1%}")
        for p in result.projected:
            console.print(f"  projected at {p['world_size']} ranks: speed-up {p['speedup']:.2f}, efficiency {p['efficiency']:.0%}")
    for n in result.notes:
        console.print(f"note: {n}", style="dim", markup=False)
    return 0
