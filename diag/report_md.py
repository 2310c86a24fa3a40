"""A pull-request-comment-sized markdown summary of an Analysis.

Markdown only: the figures, rows and orderings come from `pardiag.display`, as in
every other renderer. Reads only the Analysis; imports nothing heavy.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from pardiag.analysis import Analysis, Finding, RankResult
from pardiag.display_efficiency import (
    RANK_EFFICIENCY_HEADER,
    efficiency_lines,
    efficiency_words,
    rank_efficiency_cells,
)
from pardiag.display_memory import memory_lines, memory_words
from pardiag.display import (
    over_time_lines,
    critical_path_of,
    critical_path_words,
    estimate_words,
    what_if_words,
    op_text,
    MAX_TEXT,
    RANK_VALUE_HEADER,
    WORST_N,
    action_env_text,
    clip,
    exposed_words,
    hang_flight_lines,
    hang_late_words,
    hang_wait_words,
    headline,
    job_hang,
    job_step_words,
    ms,
    ordered_collectives,
    ordered_findings,
    ordered_notices,
    no_straggler_words,
    ordered_stragglers,
    percentile_rows,
    rank_cells,
    rank_ranges,
    step_words,
    worst_ranks,
)

MAX_CHARS = 60_000
FULL_TABLE_RANKS = 16  # past this many ranks: percentiles across ranks + the worst ranks
TOP_COLLECTIVES = 8
TOP_FINDINGS = 5
MAX_EVIDENCE = 5
MAX_NOTICES = 15
MAX_HANG_RANKS = 8  # ranks listed per kind (waited, never arrived) in a hang


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


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]], right_from: int = 1) -> list[str]:
    align = [":--" if i < right_from else "--:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _headline_lines(a: Analysis) -> list[str]:
    h = headline(a)
    run = a.run
    setup = ", ".join(md_text(x) for x in (run.backend, run.device_type) if x) or "backend unknown"
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
    elif (words := no_straggler_words(a)) is not None:
        lines.append(f"- **Straggler:** {md_text(words)}")
    if h.finding is not None:
        f = h.finding
        lines.append(f"- **Top finding:** {_finding_title(f)}")
    if (what_if := what_if_words(a.what_if)) is not None:
        lines.append(f"- **If all were applied:** {md_text(what_if, 400)}")
    if (cp := critical_path_of(a)) is not None:
        lines.append(f"- **Critical path:** {md_text(critical_path_words(cp), 400)}")
    if (eff := efficiency_words(a)) is not None:
        lines.append(f"- **Efficiency:** {md_text(eff, 400)}")
    return [*lines, ""]


def _hang_lines(a: Analysis) -> list[str]:
    """The hang, whichever diagnosed it (pardiag's records, else the NCCL logs): who
    waited in which collective, who never arrived."""
    h = job_hang(a)
    if h is None:
        return []
    out = ["### Hang", "", f"**{md_text(h.summary, 400)}**", ""]
    out += [f"- {md_text(hang_wait_words(w))}" for w in h.waited[:MAX_HANG_RANKS]]
    out += [f"- {md_text(hang_late_words(x))}" for x in h.late[:MAX_HANG_RANKS]]
    out += [f"- {md_text(line, 300)}" for line in hang_flight_lines(h, MAX_HANG_RANKS)]
    more = max(0, len(h.waited) - MAX_HANG_RANKS) + max(0, len(h.late) - MAX_HANG_RANKS)
    if more:
        out.append(f"- … and {more} more ranks in the full report")
    if h.collect_next:
        out.append(f"- next: {md_text(h.collect_next[0], 300)}")
    return [*out, ""]


def _finding_title(f: Finding) -> str:
    saving = f" (est. {f.est_saving_pct:.0f}% faster steps)" if f.est_saving_pct else ""
    return f"[{md_text(f.severity)}] {md_text(f.title)}{saving}"


def _rank_row(r: RankResult, stragglers: set[int]) -> list[str]:
    mark = f"**{r.rank}**" if r.rank in stragglers else str(r.rank)
    return [mark, md_text(r.host or "?", 60), *rank_cells(r)]


RANK_HEADER = ("rank", "host", *RANK_VALUE_HEADER)


def _rank_lines(a: Analysis) -> list[str]:
    if not a.ranks:
        return []
    stragglers = {s.rank for s in a.stragglers}
    legend = ("Step times in ms over all steps; prof. step: ms per step inside the profiled window; "
              "categories: share of the profiled window; wait: ms per profiled step spent waiting in collectives.")
    out = ["### Where each rank's time goes", "", legend, ""]
    if len(a.ranks) <= FULL_TABLE_RANKS:
        return [*out, *md_table(RANK_HEADER, (_rank_row(r, stragglers) for r in a.ranks), right_from=2), ""]
    out += [f"Across {len(a.ranks)} ranks:", ""]
    out += [*md_table(("across ranks", *RANK_HEADER[2:]), ([name, *cells] for name, cells in percentile_rows(a.ranks))), ""]
    worst = worst_ranks(a)
    if worst:
        out += [f"The {len(worst)} slowest ranks by median step time:", ""]
        out += md_table(RANK_HEADER, (_rank_row(r, stragglers) for r in worst), right_from=2)
        out.append("")
    return out


def _straggler_lines(a: Analysis) -> list[str]:
    if not a.stragglers:
        return []
    out = ["### Stragglers", ""]
    for s in ordered_stragglers(a)[:WORST_N]:
        out.append(f"- **rank {s.rank}**: +{ms(s.excess_us_per_step)} ms per step, cause: {md_text(s.cause)}")
        out += [f"  - {md_text(e)}" for e in s.evidence[:MAX_EVIDENCE]]
    return [*out, ""]


def _over_time_lines(a: Analysis) -> list[str]:
    said = over_time_lines(a)
    if not said:
        return []
    return ["### Over time", "", *(f"- {md_text(x, 300)}" for x in said), ""]


def _efficiency_lines(a: Analysis) -> list[str]:
    """MFU in detail: FLOPs per step, the peak and its source, notes; per rank when the
    ranks differ (at most FULL_TABLE_RANKS rows, the lowest MFU first past that)."""
    said = efficiency_lines(a)
    if not said or a.efficiency is None:
        return []
    out = ["### Efficiency (MFU)", "", *(f"- {md_text(x, 400)}" for x in said), ""]
    rows = a.efficiency.ranks
    if len(rows) > 1:
        shown = sorted(rows, key=lambda x: (x.mfu if x.mfu is not None else 2.0, x.rank))[:FULL_TABLE_RANKS]
        out += [*md_table(RANK_EFFICIENCY_HEADER, (rank_efficiency_cells(x) for x in sorted(shown, key=lambda x: x.rank))), ""]
    return out


def _memory_lines(a: Analysis) -> list[str]:
    """Memory by category: the job's line, then one line per rank (at most
    MAX_RANK_LINES, the largest peaks past that); nothing without a memory block."""
    words = memory_words(a)
    if words is None:
        return []
    return ["### Memory", "", md_text(words, 400), "", *(f"- {md_text(x, 400)}" for x in memory_lines(a)), ""]


def _collective_lines(a: Analysis) -> list[str]:
    if not a.collectives:
        return []
    top = ordered_collectives(a)[:TOP_COLLECTIVES]
    rows = ([md_text(op_text(c), 60), md_text(c.process_group, 60), str(c.calls),
             f"{c.bytes / 1e6:.1f}" if c.bytes else "-", ms(c.transfer_us), ms(c.wait_us),
             f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "-"] for c in top)
    more = len(a.collectives) - len(top)
    out = [f"### Collectives (top {len(top)} of {len(a.collectives)} by time)" if more else "### Collectives", "",
           "Transfer: the shortest duration across ranks; wait: the rest, mean over ranks (ms in the profiled window).", ""]
    out += md_table(("op", "group", "calls", "MB", "transfer ms", "wait ms", "busbw GB/s"), rows, right_from=2)
    return [*out, ""]


def _finding_lines(a: Analysis) -> list[str]:
    findings = ordered_findings(a)
    if not findings:
        return []
    out = ["### Findings", ""]
    for f in findings[:TOP_FINDINGS]:
        ranks = f" (rank{'s' if len(set(f.ranks)) > 1 else ''} {rank_ranges(f.ranks)})" if f.ranks else ""
        out += [f"**{_finding_title(f)}** `{f.lever}`{ranks}", ""]  # lever ids are a closed vocabulary: no escaping
        if (basis := estimate_words(f)) is not None:
            out += [f"Estimate: {md_text(basis, 1000)}", ""]  # the figure, what held it, its factors
        out += [f"- {md_text(e)}" for e in f.evidence[:MAX_EVIDENCE]]
        out += ["", *_action_lines(f), ""]
    if len(findings) > TOP_FINDINGS:
        out += [f"_{len(findings) - TOP_FINDINGS} more in the full report._", ""]
    return out


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
    notices = ordered_notices(a)
    out = ["### Missing data and warnings", ""]
    out += [f"- **{md_text(n.level)}**: {md_text(n.message, 400)}" for n in notices[:MAX_NOTICES]]
    if len(notices) > MAX_NOTICES:
        out.append(f"- … and {len(notices) - MAX_NOTICES} more in the full report")
    return [*out, ""]


FOOTER = "<sub>pardiag: the full report with charts is `report.html` (`pardiag report RUN`).</sub>"


def render_markdown(a: Analysis, max_chars: int = MAX_CHARS) -> str:
    """The summary, guaranteed shorter than max_chars: sections that do not fit are
    left out whole, and the comment says so."""
    sections = [_headline_lines(a), _hang_lines(a), _finding_lines(a), _straggler_lines(a), _over_time_lines(a), _rank_lines(a),
                _efficiency_lines(a), _memory_lines(a), _collective_lines(a), _notice_lines(a)]
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
