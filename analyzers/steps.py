"""Step-time statistics from `steps.jsonl` (every step, every rank), and the one
percentile function of pardiag: every median and percentile of a list of numbers
(the reports', the advisor's, the diff's) calls `percentile`. Which steps count is
`step_records.counted`, for every reader."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from pardiag.step_records import DISTURBED_US, WARMUP_STEPS, StepRecord, counted, is_disturbed

__all__ = ["DISTURBED_US", "WARMUP_STEPS", "JobSteps", "StepStats", "job_step_times_us", "median", "percentile",
           "step_stats", "undisturbed_us"]


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


def step_stats(records: Iterable[StepRecord]) -> StepStats:
    """Statistics over the counted steps (`step_records.counted`); the steps inside the
    profiler's active window and the disturbed ones are counted apart."""
    plain: list[float] = []
    disturbed = 0
    profiled: list[float] = []
    data = total = 0.0
    last = None
    for r in records:
        last = r.step if last is None else max(last, r.step)
        dur = r.dur_us
        if dur is None or r.step < WARMUP_STEPS:
            continue
        if r.profiler == "active":
            profiled.append(dur)
        elif is_disturbed(r):
            disturbed += 1
        elif counted(r):
            plain.append(dur)
            total += dur
            data += r.get("dataloader") or 0.0  # the share of the time it was observed waiting
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


def undisturbed_us(rec: StepRecord) -> float | None:
    """A step's duration when it counts (`step_records.counted`), else None."""
    return rec.dur_us if counted(rec) else None


@dataclass(frozen=True)
class JobSteps:
    values_us: list[float]  # per-step job time, in step order
    steps: list[int]
    left_out: int  # step numbers seen but not counted (warm-up, profiler window, disturbed, missing on a rank)


def job_step_times_us(steps_by_rank: Mapping[int, Sequence[StepRecord]]) -> JobSteps:
    """The job's step time: per step number, the longest `dur_us` over the ranks (the
    ranks meet in every step's collectives, so the job's step is its slowest rank's); a
    step counts only when it is undisturbed on every rank that wrote steps."""
    per_rank = {r: {rec.step: rec for rec in recs} for r, recs in steps_by_rank.items() if recs}
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
