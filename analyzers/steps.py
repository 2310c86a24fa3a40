"""Step-time statistics from `steps.jsonl` (every step, every rank), and the one
percentile function of pardiag: every median and percentile of a list of numbers
(the reports', the advisor's, the diff's) calls `percentile`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

WARMUP_STEPS = 1  # step 0 carries one-time costs (allocator, first collectives)
# A step in which pardiag itself spent this long (opening or closing the profiler,
# writing the trace) is left out of the statistics of undisturbed steps.
DISTURBED_US = 1000.0


@dataclass(frozen=True)
class StepStats:
    n: int
    p50_us: float | None
    mean_us: float | None
    p90_us: float | None
    max_us: float | None
    data_share: float | None  # host time waiting on the DataLoader / step time
    disturbed: int  # steps left out because pardiag worked in them (profiler start/stop)
    profiled_p50_us: float | None  # steps inside the profiler's active window
    last_step: int | None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between closest ranks (numpy's
    default, `np.percentile(xs, 100 q)`); None for no values. The median of an even
    count is the mean of the two middle values: 100 and 110 give 105."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 0.5)


def step_stats(records: Iterable[dict[str, Any]]) -> StepStats:
    """Statistics over steps outside the profiler window, step 0 and steps in which
    pardiag itself worked left out."""
    plain: list[float] = []
    disturbed = 0
    profiled: list[float] = []
    data = total = 0.0
    last = None
    for r in records:
        last = r["step"] if last is None else max(last, r["step"])
        dur = r.get("dur_us")
        if not isinstance(dur, (int, float)) or r["step"] < WARMUP_STEPS:
            continue
        if r.get("profiler") == "active":
            profiled.append(float(dur))
        elif float(r.get("pardiag_us") or 0.0) >= DISTURBED_US:
            disturbed += 1
        elif r.get("profiler") is None:
            plain.append(float(dur))
            total += dur
            data += float(r.get("data_us") or 0.0)
    return StepStats(
        n=len(plain),
        p50_us=median(plain),
        mean_us=sum(plain) / len(plain) if plain else None,
        p90_us=percentile(plain, 0.9),
        max_us=max(plain) if plain else None,
        data_share=data / total if total > 0 else None,
        disturbed=disturbed,
        profiled_p50_us=median(profiled),
        last_step=last,
    )


def undisturbed_us(rec: Mapping[str, Any]) -> float | None:
    """A step's duration when it counts (as in `step_stats`), else None: step 0, steps
    inside the profiler window and steps in which pardiag itself worked are left out."""
    dur = rec.get("dur_us")
    if not isinstance(dur, (int, float)) or rec["step"] < WARMUP_STEPS or rec.get("profiler") is not None:
        return None
    if float(rec.get("pardiag_us") or 0.0) >= DISTURBED_US:
        return None
    return float(dur)


@dataclass(frozen=True)
class JobSteps:
    values_us: list[float]  # per-step job time, in step order
    steps: list[int]
    left_out: int  # step numbers seen but not counted (warm-up, profiler window, disturbed, missing on a rank)


def job_step_times_us(steps_by_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> JobSteps:
    """The job's step time: per step number, the longest `dur_us` over the ranks (the
    ranks meet in every step's collectives, so the job's step is its slowest rank's); a
    step counts only when it is undisturbed on every rank that wrote steps."""
    per_rank = {r: {rec["step"]: rec for rec in recs} for r, recs in steps_by_rank.items() if recs}
    if not per_rank:
        return JobSteps([], [], 0)
    seen = sorted(set().union(*per_rank.values()))
    values, kept = [], []
    for step in seen:
        durs = [undisturbed_us(recs[step]) if step in recs else None for recs in per_rank.values()]
        if all(d is not None for d in durs):
            values.append(max(d for d in durs if d is not None))
            kept.append(step)
    return JobSteps(values, kept, len(seen) - len(kept))
