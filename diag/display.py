"""What every renderer shows, formatted once: the display layer.

The job-level figures (median step, exposed communication, the job's step percentiles)
are read from the Analysis' `summary`, computed once by the analysis, and worded here
(`headline`, `step_words`, `exposed_words`, `job_step_words`); so are the per-rank
cells, the percentiles across ranks, the orderings of findings, stragglers,
collectives and notices, the GPU split and free-form facts. The terminal summary, the
markdown, the HTML and the TUI all take them from here, so they agree. Reads only the
Analysis; imports nothing heavy.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pardiag.analysis import Analysis, Collective, Finding, GpuTime, Notice, RankResult, StepPercentiles, Straggler
from pardiag.analysis_blocks import Hang, HangLate, HangWait
from pardiag.analyzers.steps import percentile
from pardiag.manifest import rank_ranges
from pardiag.style import CATEGORY_LABELS

__all__ = [
    "rank_ranges", "MAX_TEXT", "WORST_N", "PERCENTILES", "SEVERITY_ORDER",
    "ms", "pct", "clip", "fact_text", "action_env_text",
    "step_us", "per_step_us", "share", "quantile", "worst_ranks",
    "ordered_findings", "ordered_stragglers", "ordered_collectives", "ordered_notices",
    "Headline", "headline", "step_words", "exposed_words", "job_step_words", "no_straggler_words",
    "RANK_VALUE_HEADER", "rank_cells", "percentile_rows", "gpu_split",
    "job_hang", "hang_wait_words", "hang_late_words",
]

MAX_TEXT = 200  # characters kept of any one string that came from a trace or a command line
WORST_N = 8
PERCENTILES = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))
NOTICE_ORDER = {"error": 0, "warning": 1, "info": 2}
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


# -- numbers ----------------------------------------------------------------------------------


def ms(us: float | None, digits: int = 1) -> str:
    return "-" if us is None else f"{us / 1000:.{digits}f}"


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def clip(s: object, limit: int = MAX_TEXT) -> str:
    text = " ".join(str(s).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fact_text(key: str, v: Any, limit: int = MAX_TEXT) -> str:
    """A free-form fact for people: _us as ms, _bytes as MB, ratios as %, increasing
    integer lists (ranks) as ranges, other lists joined (the first 20), a mapping as
    'key value, …', a list of records as JSON."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if key.endswith("_us"):
            return f"{v / 1000:,.2f} ms"
        if key.endswith("_bytes"):
            return f"{v / 1e6:,.1f} MB"
        if "_ratio" in key or key.endswith("_share"):
            return f"{v:.0%}"
        return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
    if isinstance(v, list) and v and all(type(x) is int for x in v) and all(a < b for a, b in zip(v, v[1:])):
        return clip(rank_ranges(v), limit)  # increasing integers (rank lists): as ranges, losslessly
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        shown = ", ".join(str(x) for x in v[:20])
        return clip(shown + (f", … ({len(v)} in all)" if len(v) > 20 else ""), limit)
    if isinstance(v, dict):
        return clip(", ".join(f"{k} {fact_text(key, x, limit)}" for k, x in v.items()), limit)
    if isinstance(v, list):  # records
        return clip(json.dumps(v, sort_keys=True, default=str), limit)
    return clip(v, limit)


def action_env_text(env: dict[str, object]) -> str:
    """A finding's env change as shell lines (None: remove the variable)."""
    return "\n".join(f"unset {k}" if v is None else f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items()))


# -- per rank ---------------------------------------------------------------------------------


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


_RANK_VALUES: list[tuple[Callable[[RankResult], float | None], Callable[[float | None], str]]] = [
    (lambda r: r.step_time_us.p50, ms), (lambda r: r.step_time_us.p90, ms), (lambda r: r.step_time_us.max, ms),
    (lambda r: per_step_us(r, r.window_us), ms),
    *((lambda r, k=k: share(r, k), pct) for k in CATEGORY_LABELS),
    (lambda r: per_step_us(r, r.wait_us), ms),
]
RANK_VALUE_HEADER = ("step p50", "p90", "max", "prof. step", *CATEGORY_LABELS.values(), "wait/step")


def rank_cells(r: RankResult) -> list[str]:
    """One rank's row, as RANK_VALUE_HEADER: step p50/p90/max (ms, all steps), ms per
    profiled step, the category shares of the window, ms waiting per profiled step."""
    return [fmt(get(r)) for get, fmt in _RANK_VALUES]


def percentile_rows(ranks: Sequence[RankResult]) -> list[tuple[str, list[str]]]:
    """The same columns as `rank_cells`, as min/p50/p90/max across ranks."""
    rows = []
    for name, q in PERCENTILES:
        cells = [fmt(quantile([v for r in ranks if (v := get(r)) is not None], q)) for get, fmt in _RANK_VALUES]
        rows.append((name, cells))
    return rows


def gpu_split(g: GpuTime) -> dict[str, float]:
    """The GPU timeline (first to last kernel) in disjoint parts, keyed as style.GPU_LABELS."""
    busy = g.compute_us + g.comm_us - g.overlap_us
    return {"compute_only": g.compute_us - g.overlap_us, "overlap": g.overlap_us,
            "comm_only": g.comm_us - g.overlap_us, "memory": max(0.0, g.span_us - g.idle_us - busy),
            "idle": g.idle_us}


# -- orderings --------------------------------------------------------------------------------


def worst_ranks(a: Analysis, n: int = WORST_N) -> list[RankResult]:
    """The n slowest ranks by median step time, slowest first (ties by rank)."""
    timed = [r for r in a.ranks if step_us(r) is not None]
    return sorted(timed, key=lambda r: (-(step_us(r) or 0.0), r.rank))[:n]


def ordered_findings(a: Analysis) -> list[Finding]:
    """Most important first, in the advisor's order (severity, a memory limit first,
    changes that keep the training the same before ones that change it, saving)."""
    from pardiag.analyzers.levers import rank_key

    return sorted(a.findings, key=rank_key)


def ordered_stragglers(a: Analysis) -> list[Straggler]:
    """The rank that holds the others back most first (ties by rank)."""
    return sorted(a.stragglers, key=lambda s: (-s.excess_us_per_step, s.rank))


def ordered_collectives(a: Analysis) -> list[Collective]:
    """Most time first (ties by op and process group)."""
    return sorted(a.collectives, key=lambda c: (-c.total_us, c.op, c.process_group))


def op_text(c: Collective) -> str:
    """The op the program asked for, and how the backend ran it when that differs."""
    return f"{c.op} (as {c.implementation})" if c.implementation else c.op


def ordered_notices(a: Analysis) -> list[Notice]:
    """Errors, then warnings, then the rest; the analysis' order within a level."""
    return sorted(a.notices, key=lambda n: NOTICE_ORDER.get(n.level, len(NOTICE_ORDER)))


# -- the headline -----------------------------------------------------------------------------

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
    stragglers = ordered_stragglers(a)
    findings = ordered_findings(a)
    return Headline(
        step_us=s.step_p50_us,
        step_source=STEP_SOURCE_WORDS.get(s.step_p50_source, s.step_p50_source),
        ranks=len(a.ranks),
        world_size=a.run.world_size,
        hosts=len(a.run.hosts or sorted({r.host for r in a.ranks if r.host})),
        comm_exposed_share=s.comm_exposed_ratio,
        comm_exposed_transfer_share=s.comm_exposed_transfer_ratio,
        job_steps=s.step_percentiles_us,
        inflation=s.profiled_step_inflation.job,
        straggler=stragglers[0] if stragglers else None,
        finding=findings[0] if findings else None,
    )


def step_words(h: Headline) -> str:
    """'105.0 ms (median of the ranks' p50, all steps)'."""
    return f"{ms(h.step_us)} ms (median of the ranks' p50, {h.step_source})" if h.step_us is not None else "unknown"


EVEN_SHARE = 0.10  # waits closer than this share of the step (or 1 ms) are "even"
EVEN_US = 1000.0


def no_straggler_words(a: Analysis) -> str | None:
    """What to say when no straggler is named, following the numbers shown: the ranks'
    waits per profiled step (the rank table's wait/step), else their backward host time
    from steps.jsonl (DDP's wait included); "even" only when those were measured and
    lie within 10% of the step (1 ms at least); "not measured" when neither was. None
    with one rank or a named straggler."""
    if len(a.ranks) < 2 or a.stragglers:
        return None
    waits = {r.rank: w for r in a.ranks if a.collectives and (w := per_step_us(r, r.wait_us)) is not None}
    where, what = "profiled window", "waits"
    if len(waits) < 2:
        waits = {r.rank: r.host_phases_us["backward"] for r in a.ranks if "backward" in r.host_phases_us}
        where, what = "all steps, steps.jsonl", "spends in backward, DDP's wait included,"
    if len(waits) < 2:
        return ("not measured: no rank's wait per step is known (no profiled steps with matched collectives, "
                "no backward times in steps.jsonl), so pardiag cannot tell whether one holds the others back")
    lo, hi = min(waits, key=lambda r: (waits[r], r)), max(waits, key=lambda r: (waits[r], -r))
    step = a.job_summary.step_p50_us or 0.0
    if waits[hi] - waits[lo] <= max(EVEN_US, EVEN_SHARE * step):
        return f"none; the ranks wait on each other evenly ({ms(waits[lo])} to {ms(waits[hi])} ms per step, {where})"
    return (f"none named; rank {hi} {what} {ms(waits[hi])} ms per step and rank {lo} {ms(waits[lo])} ms ({where}), "
            "but no rank holds the others back significantly over the steps with work of its own to explain it")


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


# -- a hang -------------------------------------------------------------------------------------


def job_hang(a: Analysis) -> Hang | None:
    """The hang to show: pardiag's own diagnosis (exit and step records), else the one
    from the NCCL logs. Both are the same type; `source` says which."""
    return a.hang or (a.nccl.hang if a.nccl is not None else None)


def hang_wait_words(w: HangWait, limit: int = 120) -> str:
    """One rank that waited: "rank 0 waited in step 6: <message>" (the step when known)."""
    where = f" in step {w.step}" if w.step is not None else ""
    return f"rank {w.rank if w.rank is not None else '?'} waited{where}: {w.message[:limit]}"


def hang_late_words(x: HangLate) -> str:
    """One rank that never arrived, and why it is named."""
    return f"rank {x.rank} {x.reason}"
