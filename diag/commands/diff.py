"""`pardiag diff BASE HEAD [--fail-over PCT] [--format text|md|json]`"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pardiag import rundir
from pardiag.errors import UserError

if TYPE_CHECKING:  # numpy stays out of the CLI's start-up
    from pardiag.analyzers.diff import RunInput

DESCRIPTION = """Compare two runs of the same job (run directories, folders of plain
traces, trace files or analysis.json files): the step-time distributions (median, p90,
the change of the median with a bootstrap confidence interval and a Mann-Whitney U
test over the per-step job time, the slowest rank of each undisturbed step), where
the time per step moved (breakdown, phases, collectives) and which findings are new
or resolved.

The verdict line comes first. Exit status 1 when HEAD's median job step is slower
than BASE's by more than --fail-over percent and the difference is significant
(p < 0.01 and the 99% bootstrap interval of the change above zero); 0 otherwise;
2 when an input cannot be read."""

EPILOG = """examples:
  pardiag diff runs/main runs/pr-123
  pardiag diff runs/main runs/pr-123 --fail-over 5 --format md > diff.md
  pardiag diff base/analysis.json head/analysis.json --format json
"""

FORMATS = ("text", "md", "json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", metavar="BASE", help="the reference run (run directory, traces or analysis.json)")
    p.add_argument("head", metavar="HEAD", help="the run to judge")
    p.add_argument("--fail-over", type=float, default=5.0, metavar="PCT",
                   help="exit 1 when HEAD's median job step is significantly slower by more than PCT percent (default 5)")
    p.add_argument("--format", choices=FORMATS, default="text", help="text (default), md (a PR comment) or json")


def execute(args: argparse.Namespace) -> int:
    from pardiag.analyzers.diff import diff_runs

    if not args.fail_over >= 0:
        raise UserError(f"--fail-over {args.fail_over:g}: must be a percentage of 0 or more")
    base, head = load_input(args.base), load_input(args.head)
    result = diff_runs(base, head, fail_over_pct=args.fail_over)
    for side, n in (("BASE", result.steps.base_n), ("HEAD", result.steps.head_n)):
        if n == 0:
            label = args.base if side == "BASE" else args.head
            raise UserError(f"{label}: no step times to compare (no steps.jsonl and no profiled steps)")
    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    elif args.format == "md":
        from pardiag.report_diff import render_markdown

        sys.stdout.write(render_markdown(result))
    else:
        from pardiag.report_diff import print_text

        print_text(result)
    return 1 if result.regression else 0


def load_input(arg: str) -> RunInput:
    """A RunInput: the Analysis, and the step records when the path is (in) a run directory."""
    from pardiag.analyzers.diff import RunInput
    from pardiag.analysis_cache import load_or_analyze

    path = Path(arg)
    if not path.exists():
        raise UserError(f"{arg}: no such file or directory")
    a = load_or_analyze(path, quiet=True)
    root = path if path.is_dir() else path.parent
    steps = None
    if rundir.is_run_dir(root) and (path.is_dir() or path.name == "analysis.json"):
        run = rundir.RunDir(root)
        steps = {r: rundir.read_steps(run, r) for r in run.ranks()}
    return RunInput(label=arg, analysis=a, steps_by_rank=steps)
