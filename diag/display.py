"""What every renderer shows, formatted once: the display layer.

The job-level figures (median step, exposed communication, the job's step percentiles)
are read from the Analysis' `summary`, computed once by the analysis, and worded here
(`headline`, `step_words`, `exposed_words`, `job_step_words`); so are the per-rank
cells, the percentiles across ranks, the orderings of findings, stragglers,
collectives and notices, the GPU split and free-form facts, where each estimate comes
from (`estimate_words`, `what_if_words`) and the critical path (`critical_path_words`,
`critical_path_rows`). The terminal summary, the markdown, the HTML and the TUI all
take them from here, so they agree. Reads only the Analysis; imports nothing heavy.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pardiag.analysis import Analysis, Collective, Finding, GpuTime, Notice, RankResult, StepPercentiles, Straggler
from pardiag.analysis_blocks import FlightCall, Hang, HangLate, HangWait, WhatIf
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
    "job_hang", "hang_wait_words", "hang_late_words", "hang_flight_lines",
    "Factor", "Estimate", "estimate_of", "factor_words", "estimate_words", "what_if_method_words", "what_if_words",
    "CriticalPath", "critical_path_of", "critical_path_rows", "critical_path_words",
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


def _fr_call(c: FlightCall | None) -> str:
    return "none" if c is None else f"#{c.seq} {c.op}" + (f" ({c.state})" if c.state != "completed" else "")


def hang_flight_lines(h: Hang, max_ranks: int = 8) -> list[str]:
    """What the flight-recorder dumps add to a hang: per rank of the group they blame (else
    the first group), the last collective it completed and the last it entered; where the
    culprits called it; the files or ranks the dumps left out. Empty without dumps."""
    f = h.flight
    if f is None:
        return []
    g = next((g for g in f.groups if g.first_mismatch), f.groups[0] if f.groups else None)
    out = []
    if g is not None:
        out += [f"flight recorder, process group {g.process_group}: rank {x.rank} last completed "
                f"{_fr_call(x.last_completed)}, last entered {_fr_call(x.last_entered)}" for x in g.last[:max_ranks]]
        if g.first_mismatch is not None:
            out += [f"rank {c.rank} called {c.op} at {c.user_frame}"
                    for c in (g.first_mismatch.expected, *g.first_mismatch.found) if c.user_frame][:max_ranks]
    return out + [f"flight recorder: {n}" for n in f.notes]


# -- where an estimate comes from, and the critical path ---------------------------------------
# Both blocks are plain dicts in the Analysis (a newer pardiag may write more keys); they are
# read here, once, into the shapes below: a value of the wrong type reads as unknown.


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v.strip() else None


@dataclass(frozen=True)
class Factor:
    """A speed-up factor an estimate used: measured (where: `source`) or assumed."""

    name: str
    value: float | None
    unit: str
    source: str
    measured: bool


@dataclass(frozen=True)
class Estimate:
    """Where a finding's saving comes from (`Finding.estimate`)."""

    method: str  # "replay" or "share"
    saving_pct: float | None  # the figure shown: the finding's est_saving_pct unless the block says otherwise
    share_saving_pct: float | None
    replay_error_pct: float | None
    refused: str | None
    edits: list[str]
    factors: list[Factor]
    bound: str | None = None  # what held the saving down (a host's cores doing the ranks' CPU work), in words


def estimate_of(f: Finding) -> Estimate | None:
    """The finding's estimate basis; None when the analysis does not state it (older ones)."""
    d = f.estimate
    if not isinstance(d, Mapping) or _str(d.get("method")) is None:
        return None
    factors = [Factor(name=_str(x.get("name")) or "factor", value=_num(x.get("value")), unit=str(x.get("unit") or ""),
                      source=_str(x.get("source")) or "", measured=x.get("measured") is True)
               for x in d.get("factors") or () if isinstance(x, Mapping)]
    saving = _num(d.get("saving_pct"))
    return Estimate(method=str(d["method"]), saving_pct=saving if saving is not None else f.est_saving_pct,
                    share_saving_pct=_num(d.get("share_saving_pct")), replay_error_pct=_num(d.get("replay_error_pct")),
                    refused=_str(d.get("refused")), edits=[str(e) for e in d.get("edits") or () if _str(e)],
                    factors=factors, bound=_str(d.get("bound")))


def _value(v: float, unit: str) -> str:
    """2.3x, 15%, 0.4 ms, 1.54 us: a factor's value with its unit (microseconds shown as
    ms from 100 us: a page fault's 1.5 us read "0.0 ms")."""
    if unit == "us":
        return f"{ms(v)} ms" if abs(v) >= 100 else f"{v:.3g} us"
    text = f"{v:.3g}"
    return f"{text}{unit}" if unit in ("x", "%") or not unit else f"{text} {unit}"


def factor_words(x: Factor, limit: int = 120) -> str:
    """'bf16 GEMM speed-up 2.3x (measured: bf16 vs fp32 GEMMs on rank 0)' or '... (assumed)'."""
    value = f" {_value(x.value, x.unit)}" if x.value is not None else ""
    basis = (f"measured: {clip(x.source, limit)}" if x.source else "measured") if x.measured else "assumed"
    return f"{clip(x.name, 60)}{value} ({basis})"


def _saving(v: float | None) -> str:
    """'-12%' for a saving of 12%; '0%' for one that rounds to nothing (not '-0%')."""
    if v is None:
        return "-"
    return "0%" if round(v) == 0 else f"-{v:.0f}%"


BOUND_CHARS = 400  # of the words on what held a saving down (a floor under the step), in one line


def estimate_words(f: Finding, factors: bool = True, bound: bool = True) -> str | None:
    """One line on where the finding's saving comes from: 'replayed: -12% (replay within
    3.1% of the measured step); factors: ...' or 'share-based: -10% (replay refused: why)',
    with what held a replayed saving down ('; bounded: raised from 19.5 to 24.8 ms per
    step: ...': a 0% otherwise reads as nothing found); None when the analysis does not say."""
    e = estimate_of(f)
    if e is None:
        return None
    if e.method == "replay":
        within = f" (replay within {e.replay_error_pct:.1f}% of the measured step)" if e.replay_error_pct is not None else ""
        text = f"replayed: {_saving(e.saving_pct)}{within}"
        if bound and e.bound:  # (``bound=False``: where the replay's edits, which hold it, are listed)
            text += f"; bounded: {clip(e.bound, BOUND_CHARS)}"
    else:
        share = e.share_saving_pct if e.share_saving_pct is not None else e.saving_pct
        why = f" (replay refused: {clip(e.refused, 160)})" if e.refused else ""
        name = "share-based" if e.method == "share" else clip(e.method, 20)
        text = f"{name}: {_saving(share)}{why}"
    if factors and e.factors:
        text += "; factors: " + ", ".join(factor_words(x) for x in e.factors[:4])
        if len(e.factors) > 4:
            text += f", {len(e.factors) - 4} more"
    return text


def what_if_method_words(w: WhatIf | None) -> str | None:
    """How the what-if was projected: 'one replay with every finding's edits (replay within
    2.0% of the measured step)', 'share-based (replay refused: why)'; None when not stated."""
    if w is None or w.method is None:
        return None
    if w.method == "replay":
        within = f" (replay within {w.replay_error_pct:.1f}% of the measured step)" if w.replay_error_pct is not None else ""
        return f"one replay with every finding's edits{within}"
    return "share-based" + (f" (replay refused: {clip(w.refused, 160)})" if w.refused else "")


def what_if_words(w: WhatIf | None) -> str | None:
    """'step 200.0 → 164.0 ms (-18%), one replay with every finding's edits (...)': the
    projection with all findings applied and how it was made; None when the analysis does
    not say how (older ones: their readers showed no such line)."""
    method = what_if_method_words(w)
    if w is None or method is None or not w.step_us or not w.all_step_us:
        return None
    return f"step {ms(w.step_us)} → {ms(w.all_step_us)} ms ({_saving(w.all_saving_pct)}), {method}"


@dataclass(frozen=True)
class CriticalPath:
    """What the end of the median step waited on (`Analysis.critical_path`)."""

    step: int | None
    rank: int | None  # the rank whose step end the path leads to
    path_us: float
    by_rank_us: dict[str, float]
    by_phase_us: dict[str, float]
    by_collective_us: dict[str, float]
    top_rank: int | None
    top_phase: str | None
    top_collective: str | None
    replay_error_pct: float | None


def _times(d: Any) -> dict[str, float]:
    return {str(k): v for k, x in (d.items() if isinstance(d, Mapping) else ()) if (v := _num(x)) is not None}


def critical_path_of(a: Analysis) -> CriticalPath | None:
    """The critical path of the median step; None when the analysis has none (older ones)
    or it is empty."""
    d = a.critical_path
    if not isinstance(d, Mapping) or not (path := _num(d.get("path_us"))) or path <= 0:
        return None
    by_rank, by_phase, by_coll = _times(d.get("by_rank_us")), _times(d.get("by_phase_us")), _times(d.get("by_collective_us"))

    def top(given: Any, times: dict[str, float]) -> str | None:
        return str(given) if given is not None and str(given) else (max(times, key=lambda k: times[k]) if times else None)

    top_rank = _int(d.get("top_rank"))
    if top_rank is None and (r := top(None, by_rank)) is not None and r.lstrip("-").isdigit():
        top_rank = int(r)
    return CriticalPath(step=_int(d.get("step")), rank=_int(d.get("rank")), path_us=path, by_rank_us=by_rank,
                        by_phase_us=by_phase, by_collective_us=by_coll, top_rank=top_rank,
                        top_phase=top(_str(d.get("top_phase")), by_phase),
                        top_collective=top(_str(d.get("top_collective")), by_coll),
                        replay_error_pct=_num(d.get("replay_error_pct")))


def critical_path_rows(cp: CriticalPath) -> list[tuple[str, str, float, float]]:
    """(by, name, µs, share of the path) for each rank, phase and collective on the path,
    the largest first within each; those with no time left out."""
    out: list[tuple[str, str, float, float]] = []
    for by, times, name in (("rank", cp.by_rank_us, "rank {}"), ("phase", cp.by_phase_us, "{}"),
                            ("collective", cp.by_collective_us, "{}")):
        for k, us in sorted(times.items(), key=lambda kv: (-kv[1], kv[0])):
            if us > 0:
                out.append((by, name.format(k), us, us / cp.path_us))
    return out


def critical_path_words(cp: CriticalPath) -> str:
    """'step 8 (96.0 ms, ending on rank 0): most on rank 1 58.2 ms (61%) · forward 38.4 ms
    (40%) · all_reduce 19.2 ms (20%)': the path, then the rank, phase and collective it
    spent most in, each with its time and share of the path."""
    step = f"step {cp.step}" if cp.step is not None else "the median step"
    end = f", ending on rank {cp.rank}" if cp.rank is not None else ""
    text = f"{step} ({ms(cp.path_us)} ms{end})"
    tops = [(f"rank {cp.top_rank}", cp.by_rank_us.get(str(cp.top_rank))) if cp.top_rank is not None else None,
            (cp.top_phase, cp.by_phase_us.get(cp.top_phase)) if cp.top_phase else None,
            (cp.top_collective, cp.by_collective_us.get(cp.top_collective)) if cp.top_collective else None]
    parts = [label if us is None else f"{label} {ms(us)} ms ({pct(us / cp.path_us)})" for t in tops if t for label, us in [t]]
    if parts:
        text += ": most on " + " · ".join(parts)
    if cp.replay_error_pct is not None:
        text += f"; replay within {cp.replay_error_pct:.1f}%"
    return text


MAX_SPIKES_SAID = 3


def over_time_lines(a: Analysis) -> list[str]:
    """The temporal block in sentences (analyzers/temporal.py): changes of the job's
    step, periodic pauses, the largest spikes, the warm-up; [] when there is nothing to
    say (or no block: no steps.jsonl, an older analysis)."""
    t = a.temporal or {}
    out: list[str] = []

    def who(x: Mapping[str, Any]) -> str:
        r = _int(x.get("rank"))
        return f"rank {r}" if r is not None else "all ranks"

    def why(x: Mapping[str, Any]) -> str:
        c = _str(x.get("cause"))
        return f"; {c}" if c else ""

    for c in t.get("change_points") or []:
        step, before, after = _int(c.get("step")), _num(c.get("before_us")), _num(c.get("after_us"))
        if step is None or before is None or after is None:
            continue
        until = _int(c.get("until"))
        span = f"steps {step}-{until}" if until is not None else f"from step {step} on"
        out.append(f"{span}: the step {ms(before)} → {ms(after)} ms ({who(c)}{why(c)})")
    for p in t.get("periodic") or []:
        every, excess = _int(p.get("every")), _num(p.get("excess_us"))
        if every is None or excess is None:
            continue
        out.append(f"every {every} steps a {ms(excess, 0)} ms pause, {len(p.get('steps') or [])} times ({who(p)}{why(p)})")
    periodic_steps = {s for p in t.get("periodic") or [] for s in (p.get("steps") or [])}
    rest = [s for s in t.get("spikes") or [] if s.get("step") not in periodic_steps and _num(s.get("excess_us"))]
    for s in sorted(rest, key=lambda s: -(_num(s.get("excess_us")) or 0.0))[:MAX_SPIKES_SAID]:
        out.append(f"spike at step {s.get('step')}: +{ms(_num(s.get('excess_us')))} ms ({who(s)}{why(s)})")
    if len(rest) > MAX_SPIKES_SAID:
        out.append(f"and {len(rest) - MAX_SPIKES_SAID} more spikes")
    if a.extra_window:
        from pardiag.analyzers.extra_window import words

        if (said := words(a.extra_window)) is not None:
            out.append(said)
    w = t.get("warmup") or {}
    n, extra = _int(w.get("steps")), _num(w.get("extra_us"))
    if n and extra is not None:
        out.append(f"warm-up: the first {n} step{'s' if n != 1 else ''}, {extra / 1e6:.2f} s over steady steps")
    return out
