"""The renderers of `pardiag diff`: the terminal text and the markdown of a DiffResult.

The verdict line comes first in both; every string from a run (labels, ops, titles)
is escaped in markdown and never read as markup by rich. Numbers are formatted by
`pardiag.display`, as in every report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from pardiag.display import ms, pct
from pardiag.report_md import md_table, md_text

if TYPE_CHECKING:  # numpy stays out of the CLI's start-up
    from pardiag.analyzers.diff import DiffResult, FindingChange

TOP_COLLECTIVES = 8
TOP_FINDINGS = 5
MAX_NOTES = 10


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


def _efficiency_rows(d: DiffResult) -> list[tuple[str, str, str, str]]:
    """MFU, HFU, achieved, FLOPs per step and throughput, BASE against HEAD; [] when
    neither run has an efficiency block."""
    from pardiag.display_efficiency import flops_text, rate_text, ratio_text

    e = d.efficiency
    if e is None:
        return []

    def points(b: float | None, h: float | None) -> str:
        return "-" if b is None or h is None else f"{(h - b) * 100:+.1f} pt"

    def rel(b: float | None, h: float | None) -> str:
        return "-" if not b or h is None else f"{h / b - 1:+.1%}"

    rows = [("MFU", ratio_text(e.base_mfu), ratio_text(e.head_mfu), points(e.base_mfu, e.head_mfu))]
    if e.base_hfu != e.base_mfu or e.head_hfu != e.head_mfu:
        rows.append(("HFU", ratio_text(e.base_hfu), ratio_text(e.head_hfu), points(e.base_hfu, e.head_hfu)))
    rows += [("model achieved", rate_text(e.base_model_tflops), rate_text(e.head_model_tflops),
              rel(e.base_model_tflops, e.head_model_tflops)),
             ("model FLOPs per step", flops_text(e.base_model_flops_per_step), flops_text(e.head_model_flops_per_step),
              rel(e.base_model_flops_per_step, e.head_model_flops_per_step))]
    for name, b, h in (("samples/s", e.base_samples_per_s, e.head_samples_per_s),
                       ("tokens/s", e.base_tokens_per_s, e.head_tokens_per_s)):
        if b is not None or h is not None:
            rows.append((name, _num(b, "{:,.1f}"), _num(h, "{:,.1f}"), rel(b, h)))
    return rows


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
    eff = _efficiency_rows(d)
    if eff:
        out += ["### Efficiency", "", *md_table(("", "BASE", "HEAD", "change"), eff), ""]
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
    eff = _efficiency_rows(d)
    if eff:
        console.print(_table("efficiency", ("", "BASE", "HEAD", "change"), eff))
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
