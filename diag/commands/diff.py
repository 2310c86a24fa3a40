"""`pardiag diff BASE HEAD [--fail-over PCT] [--format text|md|json]`"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from pardiag import rundir
from pardiag.errors import UserError
from pardiag.display import ms, pct
from pardiag.report_md import md_table, md_text

if TYPE_CHECKING:  # numpy stays out of the CLI's start-up
    from pardiag.analyzers.diff import DiffResult, FindingChange, RunInput

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
TOP_COLLECTIVES = 8
TOP_FINDINGS = 5
MAX_NOTES = 10


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
        sys.stdout.write(render_markdown(result))
    else:
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


# -- words shared by the renderers ----------------------------------------------------------------

WORDS = {"regression": "REGRESSION", "slower": "OK (slower, under the threshold)", "faster": "OK (faster)",
         "unchanged": "OK (no significant change)", "unknown": "OK (nothing to compare)"}


def _signed_ms(b: float | None, h: float | None) -> str:
    if b is None and h is None:
        return "-"
    return f"{((h or 0.0) - (b or 0.0)) / 1000:+.1f}"


def _signed_pct(r: float | None) -> str:
    return "-" if r is None else f"{r:+.1%}"


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2g}"


def verdict_line(d: DiffResult) -> str:
    s = d.steps
    word = WORDS[d.verdict]
    if s.change_ratio is None:
        return f"{word}: no step times to compare"
    ci = f"{s.confidence:.0%} CI {_signed_pct(s.ci_low_ratio)} to {_signed_pct(s.ci_high_ratio)}"
    text = (f"{word}: median {_sample(s)} {_signed_pct(s.change_ratio)} ({ms(s.base_p50_us)} -> {ms(s.head_p50_us)} ms), "
            f"p = {_p(s.p_value)}, {ci}")
    return f"{text}; threshold +{d.fail_over_pct:g}% at p < {d.alpha:g}"


def _sample(s: Any) -> str:
    """What the compared step is: the job's (its slowest rank, per step; the reports' job
    step percentiles) or, without steps.jsonl, the ranks' profiled step."""
    return "job step" if s.source == "steps" else "profiled step"


def _step_rows(d: DiffResult) -> list[tuple[str, str, str, str]]:
    s = d.steps
    what = _sample(s)
    return [
        (f"{what} p50 (ms)", ms(s.base_p50_us), ms(s.head_p50_us), _signed_ms(s.base_p50_us, s.head_p50_us)),
        (f"{what} p90 (ms)", ms(s.base_p90_us), ms(s.head_p90_us), _signed_ms(s.base_p90_us, s.head_p90_us)),
        (f"{what} mean (ms)", ms(s.base_mean_us), ms(s.head_mean_us), _signed_ms(s.base_mean_us, s.head_mean_us)),
        ("steps compared" if s.source == "steps" else "ranks compared", str(s.base_n), str(s.head_n), ""),
    ]


def _category_rows(d: DiffResult) -> list[tuple[str, ...]]:
    from pardiag.style import CATEGORY_LABELS

    return [(CATEGORY_LABELS.get(c.key, c.key), pct(c.base_share), pct(c.head_share), ms(c.base_us_per_step),
             ms(c.head_us_per_step), _signed_ms(c.base_us_per_step, c.head_us_per_step))
            for c in d.categories if c.base_us_per_step or c.head_us_per_step]


def _phase_rows(d: DiffResult) -> list[tuple[str, ...]]:
    from pardiag.style import PHASE_LABELS

    return [(PHASE_LABELS.get(p.key, p.key), ms(p.base_us_per_step), ms(p.head_us_per_step),
             _signed_ms(p.base_us_per_step, p.head_us_per_step))
            for p in d.phases if p.base_us_per_step or p.head_us_per_step]


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _collective_rows(d: DiffResult, text: Callable[[str], str]) -> list[tuple[str, ...]]:
    return [(text(c.op), text(c.process_group), f"{_num(c.base_calls_per_step)} / {_num(c.head_calls_per_step)}",
             f"{_num(_mb(c.base_bytes_per_step), '{:.2f}')} / {_num(_mb(c.head_bytes_per_step), '{:.2f}')}",
             f"{ms(c.base_transfer_us_per_step)} / {ms(c.head_transfer_us_per_step)}",
             f"{ms(c.base_wait_us_per_step)} / {ms(c.head_wait_us_per_step)}")
            for c in d.collectives[:TOP_COLLECTIVES]]


def _mb(b: float | None) -> float | None:
    return None if b is None else b / 1e6


def _grew(d: DiffResult) -> str:
    from pardiag.analyzers.diff import largest_increases
    from pardiag.style import CATEGORY_LABELS, PHASE_LABELS

    def name(kind: str, key: str) -> str:
        if kind == "category":
            return CATEGORY_LABELS.get(key, key)
        if kind == "phase":
            return f"{PHASE_LABELS.get(key, key)} phase"
        return f"{key} {kind}"

    return ", ".join(f"{name(kind, key)} +{us / 1000:.1f} ms" for kind, key, us in largest_increases(d))


# -- markdown -----------------------------------------------------------------------------------


def render_markdown(d: DiffResult) -> str:
    """A PR-comment-sized summary; every string from a run (labels, ops, titles) is escaped."""
    out = [f"**pardiag diff: {md_text(verdict_line(d), 400)}**", "",
           f"BASE: {md_text(d.base_label)} · HEAD: {md_text(d.head_label)}", ""]
    out += [*md_table(("step time", "BASE", "HEAD", "change"), _step_rows(d)), ""]
    grew = _grew(d)
    if grew:
        out += [f"**Where the time per step grew (profiled window):** {md_text(grew, 400)}", ""]
    out += _md_findings("Findings new in HEAD", d.new_findings)
    out += _md_findings("Findings resolved since BASE", d.resolved_findings)
    cats = _category_rows(d)
    if cats:
        out += ["### Breakdown per profiled step", ""]
        out += [*md_table(("category", "BASE share", "HEAD share", "BASE ms", "HEAD ms", "change ms"), cats), ""]
    phases = _phase_rows(d)
    if phases:
        out += [*md_table(("phase", "BASE ms", "HEAD ms", "change ms"), phases), ""]
    if d.collectives:
        out += ["### Collectives per profiled step (BASE / HEAD)", ""]
        out += [*md_table(("op", "group", "calls", "MB", "transfer ms", "wait ms"), _collective_rows(d, lambda s: md_text(s, 60)),
                        right_from=2), ""]
    if d.notes:
        out += ["### Notes", "", *(f"- {md_text(n, 400)}" for n in d.notes[:MAX_NOTES]), ""]
    return "\n".join(out) + "\n"


def _md_findings(title: str, findings: Sequence[FindingChange]) -> list[str]:
    if not findings:
        return []
    out = [f"### {title}", ""]
    for f in findings[:TOP_FINDINGS]:
        saving = f" (est. {f.est_saving_pct:.0f}% faster steps)" if f.est_saving_pct else ""
        out.append(f"- **{md_text(f.lever)}** [{md_text(f.severity)}] {md_text(f.title)}{saving}")
    if len(findings) > TOP_FINDINGS:
        out.append(f"- … and {len(findings) - TOP_FINDINGS} more")
    return [*out, ""]


# -- terminal -----------------------------------------------------------------------------------


def print_text(d: DiffResult) -> None:
    from rich.console import Console

    console = Console(highlight=False)
    style = "bold red" if d.regression else "bold green"
    console.print(f"pardiag diff: {verdict_line(d)}", style=style, markup=False, soft_wrap=True)
    console.print(f"BASE {d.base_label}  HEAD {d.head_label}", style="dim", markup=False, soft_wrap=True)
    console.print(_table("step time", ("", "BASE", "HEAD", "change"), _step_rows(d)))
    grew = _grew(d)
    if grew:
        console.print(f"time per step grew most in: {grew}", markup=False)
    for title, findings in (("new in HEAD", d.new_findings), ("resolved since BASE", d.resolved_findings)):
        for f in findings:
            console.print(f"finding {title}: [{f.lever}] {f.title}", markup=False)
    cats = _category_rows(d)
    if cats:
        console.print(_table("breakdown per profiled step",
                             ("category", "BASE share", "HEAD share", "BASE ms", "HEAD ms", "change ms"), cats))
    phases = _phase_rows(d)
    if phases:
        console.print(_table("phases per profiled step", ("phase", "BASE ms", "HEAD ms", "change ms"), phases))
    if d.collectives:
        console.print(_table("collectives per profiled step (BASE / HEAD)",
                             ("op", "group", "calls", "MB", "transfer ms", "wait ms"), _collective_rows(d, str), left=2))
    for n in d.notes:
        console.print(f"note: {n}", style="dim", markup=False)


def _table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    for i, col in enumerate(header):
        t.add_column(col, justify="left" if i < left else "right", overflow="fold")
    for row in rows:
        t.add_row(*(Text(cell) for cell in row))  # strings from runs are never markup
    return t
