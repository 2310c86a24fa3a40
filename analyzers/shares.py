"""Whether a symptom's share of the step clears a rule's threshold beyond step-to-step noise.

A share rule (exposed communication, input wait) judged on the pooled figure alone fires
on noise: a share that wanders between 1% and 23% from step to step can pool to 10.5%
in one recording and 9% in the next. So a share rule makes its finding only when a lower
confidence bound of the share clears its threshold (`ShareBound.clears`):

- the unit is the step: per step, the symptom's time summed over the ranks that ran it,
  over the step's length summed over the same ranks (the ranks of one step wait for
  each other, so they are not independent samples). The share over all steps is the
  ratio of the sums, the pooled figure the summary shows;
- with SHARE_MIN_STEPS steps or more, the bound is the one-sided SHARE_CONFIDENCE (95%)
  lower bound of that ratio: its (1 - SHARE_CONFIDENCE) quantile over SHARE_BOOTSTRAP
  bootstrap resamples of the steps (with a fixed seed, so that the same run always gets
  the same findings);
- with fewer steps (the default profiler window records 3) a bootstrap has too few
  distinct resamples to say anything, and the bound is the smallest step's share: every
  step must clear the threshold.

The series come from the Analysis' ranks: the profiled window's per-step breakdown
(`RankResult.breakdown_per_step_us`) or the counted steps of steps.jsonl
(`RankResult.host_per_step_us`). An Analysis without them (an older file, one built by
hand) has no bound, and its rules judge the pooled share as before, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from pardiag.analysis import RankResult

SHARE_CONFIDENCE = 0.95  # one-sided: the share's lower bound at this level must clear the threshold
SHARE_BOOTSTRAP = 2000  # resamples of the steps
SHARE_MIN_STEPS = 5  # fewer steps: the smallest step's share is the bound
SHARE_SEED = 0  # fixed: the same run always gets the same bound


@dataclass(frozen=True)
class ShareBound:
    share: float  # over all steps: the sum of the parts over the sum of the lengths
    lower: float  # the lower bound (bootstrap) or the smallest step's share
    steps: int
    method: str  # "bootstrap" or "smallest step"

    def clears(self, threshold: float) -> bool:
        return self.lower >= threshold

    def words(self, what: str, threshold: float) -> str:
        """The evidence line: the bound, how it was made, and the threshold it was held to."""
        if self.method == "bootstrap":
            how = (f"{SHARE_CONFIDENCE:.0%} lower bound {self.lower:.1%} (bootstrap over {self.steps} steps, "
                   f"{SHARE_BOOTSTRAP} resamples)")
        else:
            how = (f"smallest of its {self.steps} step{'s' if self.steps != 1 else ''} {self.lower:.1%} "
                   f"(under {SHARE_MIN_STEPS} steps every step must clear it)")
        rel = "above" if self.clears(threshold) else "not above"
        return f"{what} step by step: {self.share:.1%} over the steps, {how}, {rel} the {threshold:.0%} threshold"


def share_bound(parts: Sequence[float], lengths: Sequence[float]) -> ShareBound | None:
    """The bound of the share sum(parts) / sum(lengths), one value per step (already
    summed over ranks); None without a step of positive length."""
    p = np.asarray(parts, dtype=float)
    n = np.asarray(lengths, dtype=float)
    keep = n > 0
    p, n = np.clip(p[keep], 0.0, n[keep]), n[keep]  # a part is at most its step
    if n.size == 0:
        return None
    share = float(p.sum() / n.sum())
    if n.size < SHARE_MIN_STEPS:
        return ShareBound(share, float((p / n).min()), int(n.size), "smallest step")
    rng = np.random.default_rng(SHARE_SEED)
    idx = rng.integers(0, n.size, size=(SHARE_BOOTSTRAP, n.size))
    ratios = p[idx].sum(axis=1) / n[idx].sum(axis=1)
    return ShareBound(share, float(np.quantile(ratios, 1 - SHARE_CONFIDENCE)), int(n.size), "bootstrap")


Part = Callable[[RankResult, Mapping[str, float]], float]


def step_series(ranks: Sequence[RankResult], per_step: Callable[[RankResult], Mapping[str, Mapping[str, float]]],
                part: Part, length: Callable[[Mapping[str, float]], float]) -> tuple[list[float], list[float]]:
    """(parts, lengths) per step, each summed over the ranks that have that step:
    `per_step(r)` is a rank's steps (number -> figures), `part(r, figures)` the
    symptom's time in one, `length(figures)` the step's length."""
    parts: dict[str, float] = {}
    lengths: dict[str, float] = {}
    for r in ranks:
        for step, figures in per_step(r).items():
            n = length(figures)
            if n <= 0:
                continue
            parts[step] = parts.get(step, 0.0) + min(max(part(r, figures), 0.0), n)
            lengths[step] = lengths.get(step, 0.0) + n
    order = sorted(lengths, key=lambda k: (len(k), k))
    return [parts[k] for k in order], [lengths[k] for k in order]


def window_bound(ranks: Sequence[RankResult], part: Part) -> ShareBound | None:
    """The bound of a share of the profiled window, from each rank's per-step breakdown
    (a step's length is the sum of its categories); None when no rank has one."""
    return share_bound(*step_series(ranks, lambda r: r.breakdown_per_step_us, part, lambda f: sum(f.values())))


def host_bound(ranks: Sequence[RankResult], phase: str) -> ShareBound | None:
    """The bound of a host phase's share of the step over the counted steps of
    steps.jsonl; None when no rank kept them."""
    return share_bound(*step_series(ranks, lambda r: r.host_per_step_us, lambda r, f: f.get(phase, 0.0),
                                    lambda f: f.get("step", 0.0)))
