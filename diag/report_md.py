"""A pull-request-comment-sized markdown summary of an Analysis.

Also home of the words every report headlines with: the job-level figures (median
step, exposed communication, the job's step percentiles) are read from the Analysis'
`summary`, computed once by the analysis; the HTML report, the terminal summary and
the TUI take them through `headline` so that all of them agree. Reads only the
Analysis; imports nothing heavy.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from pardiag.analysis import Analysis, Finding, RankResult, StepPercentiles, Straggler
from pardiag.analyzers.steps import percentile
from pardiag.manifest import rank_ranges
from pardiag.style import CATEGORY_LABELS

MAX_CHARS = 60_000
FULL_TABLE_RANKS = 16  # past this many ranks: percentiles across ranks + the worst ranks
WORST_N = 8
TOP_COLLECTIVES = 8
TOP_FINDINGS = 5
MAX_EVIDENCE = 5
MAX_NOTICES = 15
MAX_TEXT = 200  # characters kept of any one string that came from a trace or a command line
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
PERCENTILES = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))


# -- numbers shared by the reports ------------------------------------------------------------


def step_us(r: RankResult) -> float | None:
    """Median step time of a rank: over all steps (steps.jsonl), else over the profiled window."""
    if r.step_time_us.p50 is not None:
        return r.step_time_us.p50
    return r.window_us / r.steps_profiled if r.steps_profiled else None


def per_step_us(r: RankResult, us: float) -> float | None:
    return us / r.steps_profiled if r.steps_profiled else None


def share(r: RankResult, key: str) -> float | None:
    return r.breakdown_us.get(key, 0.0) / r.window_us if r.window_us > 0 else None


def quantile(values: Sequence[float], q: float) -> float | None:
    """Percentiles across ranks: pardiag's one percentile function (`steps.percentile`)."""
    return percentile(values, q)


def worst_ranks(a: Analysis, n: int = WORST_N) -> list[RankResult]:
    """The n slowest ranks by median step time, slowest first (ties by rank)."""
    timed = [r for r in a.ranks if step_us(r) is not None]
    return sorted(timed, key=lambda r: (-(step_us(r) or 0.0), r.rank))[:n]


def ordered_findings(a: Analysis) -> list[Finding]:
    """Most important first, in the advisor's order (severity, a memory limit first,
    changes that keep the training the same before ones that change it, saving)."""
    from pardiag.analyzers.levers import rank_key

    return sorted(a.findings, key=rank_key)


STEP_SOURCE_WORDS = {"all steps": "all steps", "profiled window": "profiled window", "none": "no step times"}
STEP_PERCENTILE_WORDS = {"steps": "the slowest rank of each undisturbed step",
                         "profiled": "one value per rank, its profiled window per step"}


@dataclass(frozen=True)
class Headline:
    step_us: float | None  # summary.step_p50_us
    step_source: str  # "all steps" or "profiled window"
    ranks: int
    world_size: int | None
    hosts: int
    comm_exposed_share: float | None  # summary.comm_exposed_ratio: waiting included
    comm_exposed_transfer_share: float | None  # summary.comm_exposed_transfer_ratio: waiting left out
    job_steps: StepPercentiles
    inflation: float | None  # summary.profiled_step_inflation.job
    straggler: Straggler | None
    finding: Finding | None


def headline(a: Analysis) -> Headline:
    s = a.job_summary
    top = max(a.stragglers, key=lambda s: (s.excess_us_per_step, -s.rank), default=None)
    findings = ordered_findings(a)
    return Headline(
        step_us=s.step_p50_us,
        step_source=STEP_SOURCE_WORDS.get(s.step_p50_source, s.step_p50_source),
        ranks=len(a.ranks),
        world_size=a.run.get("world_size"),
        hosts=len(a.run.get("hosts") or sorted({r.host for r in a.ranks if r.host})),
        comm_exposed_share=s.comm_exposed_ratio,
        comm_exposed_transfer_share=s.comm_exposed_transfer_ratio,
        job_steps=s.step_percentiles_us,
        inflation=s.profiled_step_inflation.job,
        straggler=top,
        finding=findings[0] if findings else None,
    )


def step_words(h: Headline) -> str:
    """'105.0 ms (median of the ranks' p50, all steps)'."""
    return f"{ms(h.step_us)} ms (median of the ranks' p50, {h.step_source})" if h.step_us is not None else "unknown"


def exposed_words(h: Headline) -> str:
    """'15% of the profiled time, waiting for other ranks included (12% without)'."""
    if h.comm_exposed_share is None:
        return "unknown"
    without = (f" ({pct(h.comm_exposed_transfer_share)} without)"
               if h.comm_exposed_transfer_share is not None else "")
    return f"{pct(h.comm_exposed_share)} of the profiled time, waiting for other ranks included{without}"


def job_step_words(h: Headline) -> str | None:
    """'p50 110.0 · p90 … · p99 … · max … ms (the slowest rank of each undisturbed step, 40 steps)';
    None without steps.jsonl (the median step time then already is the profiled one)."""
    j = h.job_steps
    if j.source != "steps" or j.p50 is None:
        return None
    n = f"{j.n} step{'s' if j.n != 1 else ''}"
    text = f"p50 {ms(j.p50)} · p90 {ms(j.p90)} · p99 {ms(j.p99)} · max {ms(j.max)} ms ({STEP_PERCENTILE_WORDS[j.source]}, {n})"
    if h.inflation is not None:
        text += f"; profiled steps {h.inflation:.2f}x as long"
    return text


def ms(us: float | None, digits: int = 1) -> str:
    return "-" if us is None else f"{us / 1000:.{digits}f}"


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def clip(s: object, limit: int = MAX_TEXT) -> str:
    text = " ".join(str(s).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- markdown ---------------------------------------------------------------------------------

_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "&#64;", "#": "&#35;"}
_MD_SPECIAL = re.compile(r"[&<>@#\\`*_\[\]|~]")


def md_text(s: object, limit: int = MAX_TEXT) -> str:
    """Untrusted text as literal markdown: no HTML, no emphasis, no table cells,
    no @mentions or #references; one line, clipped."""
    return _MD_SPECIAL.sub(lambda m: _MD_ENTITIES.get(m[0], "\\" + m[0]), clip(s, limit))


def md_code_block(code: str, lang: str = "") -> list[str]:
    """A fenced block whose fence is longer than any run of backticks inside."""
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{lang}", *code.rstrip("\n").splitlines(), fence]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], right_from: int = 1) -> list[str]:
    align = [":--" if i < right_from else "--:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _headline_lines(a: Analysis) -> list[str]:
    h = headline(a)
    run = a.run
    setup = ", ".join(md_text(x) for x in (run.get("backend"), run.get("device_type")) if x) or "backend unknown"
    lines = ["## pardiag report", ""]
    if not a.ranks:
        return [*lines, "**No rank produced data**: nothing to analyse (see the notices below).", ""]
    lines.append(f"- **Median step time:** {step_words(h)}")
    if (job := job_step_words(h)) is not None:
        lines.append(f"- **Job step:** {job}")
    world = h.world_size or h.ranks
    hosts = f"{h.hosts} host{'s' if h.hosts != 1 else ''}" if h.hosts else "unknown hosts"
    lines.append(f"- **Ranks:** {h.ranks} analysed of {world}, on {hosts} ({setup})")
    if h.comm_exposed_share is not None:
        lines.append(f"- **Exposed communication:** {exposed_words(h)}")
    if h.straggler is not None:
        s = h.straggler
        lines.append(f"- **Straggler:** rank {s.rank}, +{ms(s.excess_us_per_step)} ms per step ({md_text(s.cause)})")
    elif len(a.ranks) > 1:
        lines.append("- **Straggler:** none; the ranks wait on each other evenly")
    if h.finding is not None:
        f = h.finding
        lines.append(f"- **Top finding:** {_finding_title(f)}")
    return [*lines, ""]


def _finding_title(f: Finding) -> str:
    saving = f" (est. {f.est_saving_pct:.0f}% faster steps)" if f.est_saving_pct else ""
    return f"[{md_text(f.severity)}] {md_text(f.title)}{saving}"


def _rank_row(r: RankResult, stragglers: set[int]) -> list[str]:
    mark = f"**{r.rank}**" if r.rank in stragglers else str(r.rank)
    st = r.step_time_us
    wait = per_step_us(r, r.wait_us)
    return [mark, md_text(r.host or "?", 60), ms(st.p50), ms(st.p90), ms(st.max), ms(per_step_us(r, r.window_us)),
            *(pct(share(r, k)) for k in CATEGORY_LABELS), ms(wait)]


RANK_HEADER = ("rank", "host", "step p50", "p90", "max", "prof. step", *CATEGORY_LABELS.values(), "wait/step")


def _rank_lines(a: Analysis) -> list[str]:
    if not a.ranks:
        return []
    stragglers = {s.rank for s in a.stragglers}
    legend = ("Step times in ms over all steps; prof. step: ms per step inside the profiled window; "
              "categories: share of the profiled window; wait: ms per profiled step spent waiting in collectives.")
    out = ["### Where each rank's time goes", "", legend, ""]
    if len(a.ranks) <= FULL_TABLE_RANKS:
        return [*out, *_table(RANK_HEADER, (_rank_row(r, stragglers) for r in a.ranks), right_from=2), ""]
    out += [f"Across {len(a.ranks)} ranks:", ""]
    out += [*_table(("across ranks", *RANK_HEADER[2:]), _percentile_rows(a)), ""]
    worst = worst_ranks(a)
    if worst:
        out += [f"The {len(worst)} slowest ranks by median step time:", ""]
        out += _table(RANK_HEADER, (_rank_row(r, stragglers) for r in worst), right_from=2)
        out.append("")
    return out


def _percentile_rows(a: Analysis) -> list[list[str]]:
    columns: list[tuple[Callable[[RankResult], float | None], Callable[[float | None], str]]] = [
        (lambda r: r.step_time_us.p50, ms), (lambda r: r.step_time_us.p90, ms), (lambda r: r.step_time_us.max, ms),
        (lambda r: per_step_us(r, r.window_us), ms),
        *((lambda r, k=k: share(r, k), pct) for k in CATEGORY_LABELS),
        (lambda r: per_step_us(r, r.wait_us), ms),
    ]
    rows = []
    for name, q in PERCENTILES:
        row = [name]
        for get, fmt in columns:
            vals = [v for r in a.ranks if (v := get(r)) is not None]
            row.append(fmt(quantile(vals, q)))
        rows.append(row)
    return rows


def _straggler_lines(a: Analysis) -> list[str]:
    if not a.stragglers:
        return []
    out = ["### Stragglers", ""]
    for s in sorted(a.stragglers, key=lambda s: (-s.excess_us_per_step, s.rank))[:WORST_N]:
        out.append(f"- **rank {s.rank}**: +{ms(s.excess_us_per_step)} ms per step, cause: {md_text(s.cause)}")
        out += [f"  - {md_text(e)}" for e in s.evidence[:MAX_EVIDENCE]]
    return [*out, ""]


def _collective_lines(a: Analysis) -> list[str]:
    if not a.collectives:
        return []
    top = sorted(a.collectives, key=lambda c: (-c.total_us, c.op, c.process_group))[:TOP_COLLECTIVES]
    rows = ([md_text(c.op, 60), md_text(c.process_group, 60), str(c.calls),
             f"{c.bytes / 1e6:.1f}" if c.bytes else "-", ms(c.transfer_us), ms(c.wait_us),
             f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "-"] for c in top)
    more = len(a.collectives) - len(top)
    out = [f"### Collectives (top {len(top)} of {len(a.collectives)} by time)" if more else "### Collectives", "",
           "Transfer: the shortest duration across ranks; wait: the rest, mean over ranks (ms in the profiled window).", ""]
    out += _table(("op", "group", "calls", "MB", "transfer ms", "wait ms", "busbw GB/s"), rows, right_from=2)
    return [*out, ""]


def _finding_lines(a: Analysis) -> list[str]:
    findings = ordered_findings(a)
    if not findings:
        return []
    out = ["### Findings", ""]
    for f in findings[:TOP_FINDINGS]:
        ranks = f" (rank{'s' if len(set(f.ranks)) > 1 else ''} {rank_ranges(f.ranks)})" if f.ranks else ""
        out += [f"**{_finding_title(f)}**{ranks}", ""]
        out += [f"- {md_text(e)}" for e in f.evidence[:MAX_EVIDENCE]]
        out += ["", *_action_lines(f), ""]
    if len(findings) > TOP_FINDINGS:
        out += [f"_{len(findings) - TOP_FINDINGS} more in the full report._", ""]
    return out


def action_env_text(env: dict[str, object]) -> str:
    """A finding's env change as shell lines (None: remove the variable)."""
    return "\n".join(f"unset {k}" if v is None else f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items()))


def _action_lines(f: Finding) -> list[str]:
    out: list[str] = []
    code, env, doc = f.action.get("code"), f.action.get("env"), f.action.get("doc")
    if isinstance(code, str) and code.strip():
        out += md_code_block(code[:2000], "python")
    if isinstance(env, dict) and env:
        out += md_code_block(action_env_text(env)[:2000], "sh")
    if isinstance(doc, str) and re.match(r"https?://", doc):
        out.append(f"See {md_text(doc, 300)}")
    return out


def _notice_lines(a: Analysis) -> list[str]:
    if not a.notices:
        return []
    order = {"error": 0, "warning": 1, "info": 2}
    notices = sorted(a.notices, key=lambda n: order.get(n.level, 3))  # stable: keeps analysis order per level
    out = ["### Missing data and warnings", ""]
    out += [f"- **{md_text(n.level)}**: {md_text(n.message, 400)}" for n in notices[:MAX_NOTICES]]
    if len(notices) > MAX_NOTICES:
        out.append(f"- … and {len(notices) - MAX_NOTICES} more in the full report")
    return [*out, ""]


FOOTER = "<sub>pardiag: the full report with charts is `report.html` (`pardiag report RUN`).</sub>"


def render_markdown(a: Analysis, max_chars: int = MAX_CHARS) -> str:
    """The summary, guaranteed shorter than max_chars: sections that do not fit are
    left out whole, and the comment says so."""
    sections = [_headline_lines(a), _finding_lines(a), _straggler_lines(a), _rank_lines(a),
                _collective_lines(a), _notice_lines(a)]
    footer = FOOTER + "\n"
    cut = "_Some sections did not fit in a comment; see the full report._\n"
    budget = max_chars - len(footer) - len(cut) - 1
    parts: list[str] = []
    dropped = False
    for lines in sections:
        text = "\n".join(lines) + ("\n" if lines else "")
        if len("".join(parts)) + len(text) <= budget:
            parts.append(text)
        else:
            dropped = True
    out = "".join(parts) + (cut if dropped else "") + footer
    return out if len(out) < max_chars else out[: max(0, max_chars - 1)]
