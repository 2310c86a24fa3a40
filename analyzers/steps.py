"""Step-time statistics from `steps.jsonl` (every step, every rank)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

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


def percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        raise ValueError("empty")
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


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
    plain.sort()
    profiled.sort()
    return StepStats(
        n=len(plain),
        p50_us=percentile(plain, 0.5) if plain else None,
        mean_us=sum(plain) / len(plain) if plain else None,
        p90_us=percentile(plain, 0.9) if plain else None,
        max_us=plain[-1] if plain else None,
        data_share=data / total if total > 0 else None,
        disturbed=disturbed,
        profiled_p50_us=percentile(profiled, 0.5) if profiled else None,
        last_step=last,
    )
