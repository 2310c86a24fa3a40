"""The whole run over time, from steps.jsonl: when the job's step time changed, which
steps spiked (and whether they come back every K steps), how long the warm-up took,
and per step which rank the others waited for.

The job's step (per step number, the slowest rank's duration, as `steps.job_step_times_us`)
over the steps that count (`step_records.counted`: past warm-up, outside the profiler
window, not disturbed by pardiag) is cut into segments of steady speed:

* change points: binary segmentation on medians. A split of a segment is kept when both
  sides have at least ``MIN_SEGMENT`` steps, their medians differ by at least
  ``MIN_SHIFT`` of the earlier one, and by at least ``SIGMAS`` standard errors of that
  difference (noise: 1.4826 x the median absolute deviation of consecutive differences
  over sqrt 2, which a slowdown that came and went inside the segment does not inflate;
  a median's standard error 1.2533 sigma / sqrt(n)). At most ``MAX_CHANGES``.
  A change lasts to the run's end ("persistent") or to the next change.
* spikes: steps at least ``SPIKE_SHARE`` of their segment's median and ``SIGMAS``
  sigmas above it. Spikes whose step numbers are evenly spaced (``PERIODIC_MIN`` or
  more, three quarters of the gaps within one step of the median gap) are periodic.
* warm-up: the leading steps (step 0 on) above ``WARMUP_OVER`` x the first segment's
  median.

Who: per step and rank, how long the others waited for it: the median over the other
ranks of the signal that holds DDP's wait (backward) less its own (the rank that
arrives last waits least). A change is a rank's when that rank's lateness grew by at
least half the change; a spike is a rank's when it was that late in that step. Why:
the host signals of that step (garbage collection on a rank covering half the spike),
else the phase of steps.jsonl that grew most on the rank (or on all ranks).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pardiag import step_records
from pardiag.step_records import StepRecord, counted

MIN_SEGMENT = 5
MIN_SHIFT = 0.10
SIGMAS = 5.0
MAX_CHANGES = 3
SPIKE_SHARE = 0.5
PERIODIC_MIN = 3
WARMUP_OVER = 1.5
EXPLAINS = 0.5
MAX_BASE = 200  # ordinary steps a spike's cause is judged against
STORED_STEPS = 4000  # a longer run's series is stored in buckets of steps (each its largest value)
MAX_SPIKES = 200  # spikes stored (the first ones; periodic ones keep their period and count)
STORED_RANKS = 32  # late_us is stored for the ranks the others waited for most
EXACT_RANKS = 64  # up to this many ranks, each rank's lateness against the exact median of the others


@dataclass(frozen=True)
class Change:
    step: int  # the first step of the new level
    until: int | None  # the last step of it; None: to the run's end (persistent)
    before_us: float
    after_us: float
    rank: int | None  # the rank whose lateness grew by at least half the change; None: all ranks
    cause: str | None

    @property
    def ratio(self) -> float:
        return self.after_us / self.before_us if self.before_us > 0 else math.inf


@dataclass(frozen=True)
class Spike:
    step: int
    step_us: float
    excess_us: float  # over its segment's median
    rank: int | None
    cause: str | None


@dataclass(frozen=True)
class Periodic:
    every: int
    steps: list[int]
    excess_us: float  # median over its spikes
    rank: int | None  # the rank of most of them, None: all ranks
    cause: str | None


@dataclass(frozen=True)
class Temporal:
    steps: list[int]  # the counted steps, in order
    job_us: list[float]  # the job's step time of each
    changes: list[Change] = field(default_factory=list)
    spikes: list[Spike] = field(default_factory=list)
    periodic: list[Periodic] = field(default_factory=list)
    warmup_steps: int = 0
    warmup_us: float = 0.0  # the warm-up's time beyond its steps at the steady median
    windows: list[tuple[int, int]] = field(default_factory=list)  # profiler windows (first, last step)
    late_us: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> step -> wait it caused
    last_rank: dict[int, int] = field(default_factory=dict)  # step -> the rank the others waited for most

    def late_stretches(self) -> list[tuple[int, int, int | None]]:
        """(rank, first step, last step or None: to the run's end) of each stretch in which
        one rank's lateness raised the job's level: a change the rank explains, lasting
        until a later level comes back halfway to the one before it (a later split of the
        slow stretch is still it)."""
        out = []
        for i, c in enumerate(self.changes):
            if c.rank is None or c.after_us <= c.before_us:
                continue
            back = next((x for x in self.changes[i + 1:] if x.after_us < c.before_us + 0.5 * (c.after_us - c.before_us)),
                        None)
            out.append((c.rank, c.step, back.step - 1 if back is not None else None))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON block. Bounded whatever the run's length and size: the series in at
        most STORED_STEPS points (buckets of consecutive steps, each at its first step
        with its largest value), late_us for the STORED_RANKS ranks the others waited
        for most, in the same buckets."""
        steps, job = _bucketed(self.steps, self.job_us)
        top = sorted(self.late_us, key=lambda r: -sum(max(v, 0.0) for v in self.late_us[r].values()))[:STORED_RANKS]
        late = {}
        for r in sorted(top):
            d = self.late_us[r]
            ks = sorted(d)
            ks2, vs = _bucketed(ks, [d[k] for k in ks])
            late[str(r)] = {str(k): round(v, 1) for k, v in zip(ks2, vs)}
        return {
            "steps": steps, "job_step_us": [round(v, 1) for v in job],
            "change_points": [{"step": c.step, "until": c.until, "before_us": round(c.before_us, 1),
                               "after_us": round(c.after_us, 1), "rank": c.rank, "cause": c.cause}
                              for c in self.changes],
            "spikes": [{"step": s.step, "step_us": round(s.step_us, 1), "excess_us": round(s.excess_us, 1),
                        "rank": s.rank, "cause": s.cause} for s in self.spikes[:MAX_SPIKES]],
            "periodic": [{"every": p.every, "steps": p.steps[:MAX_SPIKES], "excess_us": round(p.excess_us, 1),
                          "rank": p.rank, "cause": p.cause} for p in self.periodic],
            "warmup": {"steps": self.warmup_steps, "extra_us": round(self.warmup_us, 1)},
            "windows": [list(w) for w in self.windows],
            "late_us": late,
            "last_rank": {str(s): r for s, r in list(self.last_rank.items())[-STORED_STEPS:]},
        }


def _bucketed(steps: Sequence[int], values: Sequence[float]) -> tuple[list[int], list[float]]:
    if len(steps) <= STORED_STEPS:
        return list(steps), list(values)
    k = -(-len(steps) // STORED_STEPS)
    return ([steps[i] for i in range(0, len(steps), k)], [max(values[i:i + k]) for i in range(0, len(steps), k)])


# ------------------------------------------------------------------------ statistics
def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _sigma(*segments: Sequence[float]) -> float:
    """Robust noise of values around their own segment's median (1.4826 x MAD)."""
    dev = np.concatenate([np.abs(np.asarray(seg, float) - np.median(seg)) for seg in segments if len(seg)] or [[]])
    return float(1.4826 * np.median(dev)) if len(dev) else 0.0


def _diff_sigma(xs: Sequence[float]) -> float:
    """Robust noise from consecutive differences (1.4826 x their MAD / sqrt 2): level
    shifts inside `xs` (a slowdown that came and went) barely move it."""
    d = np.diff(np.asarray(xs, float))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2)) if len(d) else 0.0


def _split(xs: Sequence[float]) -> tuple[int, float] | None:
    """The best split of xs in two (index of the second part's first value), when it is
    significant. Candidates by the drop in squared deviation from each part's mean over
    values clipped to 5 sigmas around the median (a spike must not make a level), in one
    pass with cumulative sums; the test on the parts' medians."""
    n = len(xs)
    if n < 2 * MIN_SEGMENT:
        return None
    m, sig = _med(xs), _sigma(xs)
    lo_c, hi_c = (m - 5 * sig, m + 5 * sig) if sig > 0 else (-math.inf, math.inf)
    c = [min(max(x, lo_c), hi_c) for x in xs]
    s1 = [0.0]
    s2 = [0.0]
    for x in c:
        s1.append(s1[-1] + x)
        s2.append(s2[-1] + x * x)

    def sse(a: int, b: int) -> float:
        k = b - a
        return s2[b] - s2[a] - (s1[b] - s1[a]) ** 2 / k

    best = min(range(MIN_SEGMENT, n - MIN_SEGMENT + 1), key=lambda k: sse(0, k) + sse(k, n))
    a, b = xs[:best], xs[best:]
    ma, mb = _med(a), _med(b)
    shift = abs(mb - ma)
    se = 1.2533 * _diff_sigma(xs) * math.sqrt(1 / len(a) + 1 / len(b))
    if ma <= 0 or shift < MIN_SHIFT * ma or shift < SIGMAS * se:
        return None
    return best, shift


def change_indices(xs: Sequence[float]) -> list[int]:
    """Indices where a new level starts (binary segmentation, largest shift first)."""
    cuts: list[int] = []
    segments = [(0, len(xs))]
    while segments and len(cuts) < MAX_CHANGES:
        found = []
        for lo, hi in segments:
            s = _split(xs[lo:hi])
            if s is not None:
                found.append((s[1], lo + s[0], lo, hi))
        if not found:
            break
        _, k, lo, hi = max(found)
        cuts.append(k)
        segments = [seg for seg in segments if seg != (lo, hi)] + [(lo, k), (k, hi)]
    return sorted(cuts)


# ------------------------------------------------------------------------ the analysis
def _lateness(records: Mapping[int, Sequence[StepRecord]]) -> dict[int, dict[int, float]]:
    """Per rank and step: the others' median wait signal less its own (us). With more
    than ``EXACT_RANKS`` ranks the median over all ranks stands for the others' (one
    value of many barely moves it)."""
    wait = next(s.name for s in step_records.SIGNALS if s.holds_wait)
    per: dict[int, dict[int, float]] = {}
    for r, recs in records.items():
        per[r] = {rec.step: v for rec in recs if (v := rec.get(wait)) is not None}
    out: dict[int, dict[int, float]] = {r: {} for r in per}
    if len(per) < 2:
        return out
    steps = sorted(set.intersection(*(set(d) for d in per.values())))
    if not steps:
        return out
    ranks = list(per)
    w = np.array([[per[r][s] for s in steps] for r in ranks], float)  # rank x step
    if len(ranks) <= EXACT_RANKS:
        others = np.stack([np.median(np.delete(w, i, axis=0), axis=0) for i in range(len(ranks))])
    else:
        others = np.broadcast_to(np.median(w, axis=0), w.shape)
    late = others - w
    for i, r in enumerate(ranks):
        out[r] = dict(zip(steps, late[i].tolist()))
    return out


PHASES = (("dataloader", "input loading"), ("forward", "forward"), ("backward", "backward"),
          ("optimizer", "optimizer"))


def _cause_at(records: Mapping[int, Mapping[int, StepRecord]], steps: Sequence[int], base: Sequence[int],
              excess: float, rank: int | None) -> str | None:
    """Why steps `steps` took `excess` more than steps `base`: garbage collection on a
    rank when its pauses cover half of it, else the phase (or the step's untimed rest)
    that grew most on `rank` (with no rank: that grew on every rank)."""
    if excess <= 0:
        return None

    def mean_of(r: int, ss: Sequence[int], name: str | None) -> float | None:
        vals = []
        for s in ss:
            rec = records[r].get(s)
            if rec is None:
                continue
            if name is None:  # untimed: the step less its host phases (backward's wait included in backward)
                if rec.dur_us is None:
                    continue
                vals.append(rec.dur_us - sum(rec.get(p) or 0.0 for p, _ in PHASES))
            elif (v := rec.get(name)) is not None:
                vals.append(v)
        return statistics.mean(vals) if vals else None

    ranks = [rank] if rank is not None else list(records)
    gc = {r: ((mean_of(r, steps, "gc") or 0.0) - (mean_of(r, base, "gc") or 0.0)) for r in records}
    if gc:
        r_gc = max(gc, key=lambda r: gc[r])
        if gc[r_gc] >= EXPLAINS * excess:
            return f"garbage collection on rank {r_gc}"
    grew: dict[str, float] = {}
    for name, words in (*PHASES, (None, "outside the timed phases (checkpoints, evaluation, logging)")):
        d = []
        for r in ranks:
            a, b = mean_of(r, steps, name), mean_of(r, base, name)
            if a is not None and b is not None:
                d.append(a - b)
        if d:
            # on all ranks: what grew everywhere (a rank's backward also holds its wait for the others)
            grew[words] = min(d)
    if not grew:
        return None
    best = max(grew, key=lambda k: grew[k])
    return best if grew[best] >= EXPLAINS * excess else None


def analyze(records: Mapping[int, Sequence[StepRecord]]) -> Temporal | None:
    """The temporal view of a job's step records; None without counted steps."""
    by_rank = {r: {rec.step: rec for rec in recs} for r, recs in records.items() if recs}
    if not by_rank:
        return None
    seen = sorted(set().union(*by_rank.values()))
    steps, job = [], []
    for s in seen:
        recs = [d.get(s) for d in by_rank.values()]
        if all(rec is not None and counted(rec) and rec.dur_us is not None for rec in recs):
            steps.append(s)
            job.append(max(rec.dur_us for rec in recs if rec is not None and rec.dur_us is not None))
    windows = _windows(by_rank)
    if not steps:
        return None
    # the warm-up first: its leading slow steps are not a level nor spikes of the run
    w_steps, w_us = _warmup(by_rank, seen, _med(job))
    last_warm = seen[w_steps - 1] if w_steps else -1
    keep = [i for i, s in enumerate(steps) if s > last_warm]
    if not keep:
        return Temporal(steps=steps, job_us=job, warmup_steps=w_steps, warmup_us=w_us, windows=windows)
    steps, job = [steps[i] for i in keep], [job[i] for i in keep]
    late = _lateness({r: [rec for rec in d.values() if counted(rec)] for r, d in by_rank.items()})
    last_rank = {}
    for s in steps:
        vals = {r: late[r][s] for r in late if s in late[r]}
        if vals:
            r = max(vals, key=lambda k: vals[k])
            if vals[r] > 0:
                last_rank[s] = r
    cuts = change_indices(job)
    bounds = [0, *cuts, len(job)]
    segs = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    changes = []
    for i, k in enumerate(cuts):
        lo, hi = segs[i]
        nlo, nhi = segs[i + 1]
        before, after = _med(job[lo:hi]), _med(job[nlo:nhi])
        rank = _rank_of(late, steps[lo:hi], steps[nlo:nhi], after - before)
        cause = _cause_at(by_rank, steps[nlo:nhi], steps[lo:hi], after - before, rank)
        changes.append(Change(step=steps[k], until=steps[nhi - 1] if nhi < len(job) else None,
                              before_us=before, after_us=after, rank=rank, cause=cause))
    spikes = []
    for lo, hi in segs:
        seg = job[lo:hi]
        m, sig = _med(seg), _sigma(seg)
        for j in range(lo, hi):
            ex = job[j] - m
            if ex >= SPIKE_SHARE * m and ex >= SIGMAS * sig:
                s = steps[j]
                vals = {r: late[r].get(s, 0.0) for r in late}
                top = max(vals, key=lambda k: vals[k]) if vals else None
                rank = top if top is not None and vals[top] >= EXPLAINS * ex else None
                # the cause against the segment's ordinary steps (at most MAX_BASE of them)
                base = [steps[x] for x in range(lo, hi) if job[x] - m < SPIKE_SHARE * m]
                base = base[:: max(1, len(base) // MAX_BASE)]
                spikes.append(Spike(s, job[j], ex, rank, _cause_at(by_rank, [s], base, ex, rank)))
    periodic = _periodic(spikes)
    return Temporal(steps=steps, job_us=job, changes=changes, spikes=spikes, periodic=periodic,
                    warmup_steps=w_steps, warmup_us=w_us, windows=windows, late_us=late, last_rank=last_rank)


def _rank_of(late: Mapping[int, Mapping[int, float]], before: Sequence[int], after: Sequence[int],
             shift: float) -> int | None:
    grew = {}
    for r, d in late.items():
        a = [d[s] for s in after if s in d]
        b = [d[s] for s in before if s in d]
        if a and b:
            grew[r] = _med(a) - _med(b)
    if not grew or shift <= 0:
        return None
    r = max(grew, key=lambda k: grew[k])
    return r if grew[r] >= EXPLAINS * shift else None


def _periodic(spikes: Sequence[Spike]) -> list[Periodic]:
    if len(spikes) < PERIODIC_MIN:
        return []
    steps = [s.step for s in spikes]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    k = int(_med(gaps))
    if k < 2 or sum(1 for g in gaps if abs(g - k) <= 1) < 0.75 * len(gaps):
        return []
    ranks = [s.rank for s in spikes]
    top = max(set(ranks), key=ranks.count)
    causes = [s.cause for s in spikes]
    cause = max(set(causes), key=causes.count)
    return [Periodic(every=k, steps=steps, excess_us=_med([s.excess_us for s in spikes]),
                     rank=top if ranks.count(top) > len(ranks) / 2 else None,
                     cause=cause if causes.count(cause) > len(causes) / 2 else None)]


def _windows(by_rank: Mapping[int, Mapping[int, StepRecord]]) -> list[tuple[int, int]]:
    inside = sorted({s for d in by_rank.values() for s, rec in d.items() if rec.profiler is not None})
    out: list[tuple[int, int]] = []
    for s in inside:
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _warmup(by_rank: Mapping[int, Mapping[int, StepRecord]], seen: Sequence[int], steady: float) -> tuple[int, float]:
    """Leading steps above WARMUP_OVER x the steady median, and their time beyond it."""
    if steady <= 0:
        return 0, 0.0
    n, extra = 0, 0.0
    for s in seen:
        durs = [rec.dur_us for d in by_rank.values() if (rec := d.get(s)) is not None and rec.dur_us is not None]
        if not durs or max(durs) < WARMUP_OVER * steady:
            break
        n += 1
        extra += max(durs) - steady
    return n, extra
