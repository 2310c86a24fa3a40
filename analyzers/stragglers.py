"""The rank(s) that hold the others back, by how much, and why.

In a synchronous job every rank waits at each collective for the last one to
arrive. The straggler is the rank that waits least while the others wait a lot; the
time the others lose per step is its excess. Its cause is the phase in which it
spends more than the other ranks (input loading, forward, backward compute,
optimizer, or host work outside those), compared per step.

Two sources, the stronger first:
- the profiled window: waits measured on matched collectives and phases cut from the
  trace;
- every counted step from steps.jsonl (`step_records.counted`): the host time inside
  backward includes DDP's wait for the all-reduce (the signal marked `holds_wait`), so
  a straggler shows as the rank with the shortest backward in most steps, and its
  extra time in the other signals with a straggler cause (DataLoader, forward,
  optimizer: `step_records.SIGNALS`) is measured directly. A signal a rank never
  observed is missing from its medians, not 0.

The excess reported is the straggler's extra work per step (the sum of its phases'
excess over the other ranks' medians), at least the others' extra waiting.

Thresholds: a straggler must cost the others at least 10% of the median step time (as
TraceML: below that, no finding) and
at least 1 ms per step, and (where steps.jsonl has at least 5 steps) wait least in at
least 75% of the steps. Below that, differences between ranks are noise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from pardiag.analysis import Straggler
from pardiag import step_records
from pardiag.analyzers.intervals import total_length
from pardiag.analyzers.rank_trace import CollectiveCall, StepSpan
from pardiag.analyzers.timeline import clip
from pardiag.step_records import StepRecord, counted

MIN_SHARE = 0.10  # TraceML: under 10% of the step is no finding
MIN_US = 1000.0
MIN_CONSISTENCY = 0.75
CAUSE_NAMES = {
    "dataloader": "dataloader",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "host overhead",
}


@dataclass(frozen=True)
class RankEvidence:
    rank: int
    steps_in_window: int
    wait_us: float  # in the window, inside collectives
    phases_us: Mapping[str, float]  # in the window
    step_records: Sequence[StepRecord]  # steps.jsonl
    # per profiled step (ProfilerStep spans, tiled): the time the rank waited inside
    # collectives, overlapping waits counted once (`step_waits`), and the step's length
    step_waits_us: Mapping[int, float] = field(default_factory=dict)
    step_lengths_us: Mapping[int, float] = field(default_factory=dict)


def step_tiles(spans: Sequence[StepSpan]) -> dict[int, tuple[float, float]]:
    """Each profiled step's time: from its start to the next step's start (the steps
    tile the window, as the phases do), the last to its own end."""
    return {sp.step: (sp.start_us, spans[i + 1].start_us if i + 1 < len(spans) else sp.end_us)
            for i, sp in enumerate(spans)}


def step_waits(calls: Mapping[int, Sequence[CollectiveCall]],
               spans: Mapping[int, Sequence[StepSpan]]) -> dict[int, dict[int, float]]:
    """Per rank and profiled step, the time spent waiting for other ranks inside
    collectives. A collective matched across ranks (same group, step and position, same
    op, timed) makes each rank wait its duration minus the shortest one, at the start
    of the call (it arrived early). Several collectives in flight at once (gloo runs
    DDP's buckets concurrently) wait for the same late rank: their waits overlap in
    time and are counted once, as the union of the intervals, cut to each step."""
    instances: dict[tuple[str, int | None, int], dict[int, CollectiveCall]] = defaultdict(dict)
    for rank, cs in calls.items():
        seen: dict[tuple[str, int | None], int] = defaultdict(int)
        for c in cs:
            k = (c.process_group, c.step)
            instances[(c.process_group, c.step, seen[k])][rank] = c
            seen[k] += 1
    iv: dict[int, tuple[list[float], list[float]]] = {r: ([], []) for r in calls}
    for by_rank in instances.values():
        if len(by_rank) < 2 or len({c.op for c in by_rank.values()}) > 1:
            continue
        if any(c.timing == "launch" for c in by_rank.values()):
            continue
        transfer = min(c.dur_us for c in by_rank.values())
        for r, c in by_rank.items():
            if c.dur_us > transfer:
                iv[r][0].append(c.start_us)
                iv[r][1].append(c.start_us + c.dur_us - transfer)
    out: dict[int, dict[int, float]] = {}
    for r, sp in spans.items():
        starts = np.array(iv.get(r, ([], []))[0], dtype=np.float64)
        ends = np.array(iv.get(r, ([], []))[1], dtype=np.float64)
        out[r] = {step: total_length(*clip((starts, ends), lo, hi)) for step, (lo, hi) in step_tiles(sp).items()}
    return out
def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _window_wait(ev: RankEvidence) -> float:
    """Time waiting inside collectives per profiled step: the per-step union when
    measured, else the sum over collectives (which counts overlapping waits twice)."""
    if ev.step_waits_us:
        return sum(ev.step_waits_us.values()) / len(ev.step_waits_us)
    return ev.wait_us / max(ev.steps_in_window, 1)


def _per_step(ev: RankEvidence) -> dict[str, float]:
    n = max(ev.steps_in_window, 1)
    out = {k: v / n for k, v in ev.phases_us.items()}
    # what backward did besides waiting for the others
    out["backward"] = max(out.get("backward", 0.0) - _window_wait(ev), 0.0)
    return out


def _wait_signal() -> str:
    return next(s.name for s in step_records.SIGNALS if s.holds_wait)


def _host_medians(ev: RankEvidence) -> dict[str, float]:
    """Medians over the counted steps: "step" (the duration), "<wait signal>_host" (the
    host time that holds the wait) and every other signal with a straggler cause, keyed
    by its cause; a signal with no value in any counted step is absent."""
    recs = [r for r in ev.step_records if counted(r)]
    out: dict[str, float] = {}
    cols: dict[str, list[float]] = {"step": [r.dur_us for r in recs if r.dur_us is not None]}
    for s in step_records.SIGNALS:
        if s.cause is not None:
            key = f"{s.cause}_host" if s.holds_wait else s.cause
            cols[key] = [v for r in recs if (v := r.get(s.name)) is not None]
    for key, xs in cols.items():
        if xs:
            out[key] = _median(xs)
    return out


def _consistency(candidate: int, evidence: Mapping[int, RankEvidence]) -> float | None:
    """Share of the counted steps in which the candidate's host backward time (which
    contains its wait) is below every other rank's."""
    wait = _wait_signal()
    by_step: dict[int, dict[int, float]] = {}
    for r, ev in evidence.items():
        for rec in ev.step_records:
            if counted(rec) and (v := rec.get(wait)) is not None:
                by_step.setdefault(rec.step, {})[r] = v
    full = [d for d in by_step.values() if len(d) == len(evidence)]
    if len(full) < 5:
        return None
    wins = sum(1 for d in full if d[candidate] <= min(v for r, v in d.items() if r != candidate))
    return wins / len(full)


def find_stragglers(evidence: Mapping[int, RankEvidence]) -> list[Straggler]:
    if len(evidence) < 2:
        return []
    have_window = all(ev.steps_in_window > 0 for ev in evidence.values())
    step_medians = [_host_medians(ev).get("step") for ev in evidence.values()]
    step_us = _median([s for s in step_medians if s is not None and s > 0])
    if have_window:
        # Waiting inside collectives only: gaps between operators ("idle") on a CPU
        # rank are also Python time, so they do not tell waiting from working.
        waits = {r: _window_wait(ev) for r, ev in evidence.items()}
        candidate = min(waits, key=lambda r: waits[r])
        others = [w for r, w in waits.items() if r != candidate]
        excess = _median(others) - waits[candidate]
        source = "profiled window"
        # the share is of the window's own steps: profiled steps run longer than the
        # others, so a wait measured there is not a share of the steps.jsonl median
        lengths = [v for ev in evidence.values() for v in ev.step_lengths_us.values() if v > 0]
        if lengths:
            step_us = _median(lengths)
    else:
        wait_key = f"{_wait_signal()}_host"
        host = {r: _host_medians(ev) for r, ev in evidence.items()}
        bwd = {r: h[wait_key] for r, h in host.items() if wait_key in h}
        if len(bwd) < 2:
            return []
        candidate = min(bwd, key=lambda r: bwd[r])
        excess = _median([b for r, b in bwd.items() if r != candidate]) - bwd[candidate]
        source = "steps.jsonl"
    if step_us <= 0 or excess < max(MIN_US, MIN_SHARE * step_us):
        return []
    consistency = _consistency(candidate, evidence)
    if consistency is not None and consistency < MIN_CONSISTENCY:
        return []
    cause, deltas = _cause(candidate, evidence, have_window)
    # a per-step figure cannot exceed the step it is part of
    excess = min(excess, step_us)
    extra_work = min(sum(d for d in deltas.values() if d > 0), step_us)
    evidence_lines = [
        f"the other ranks wait {excess / 1000:.1f} ms per step more than rank {candidate} "
        f"({excess / step_us:.0%} of the {step_us / 1000:.1f} ms median step; from the {source})",
    ]
    held = excess
    if consistency is not None:
        evidence_lines.append(f"rank {candidate} waits least in {consistency:.0%} of all steps")
    for phase, d in sorted(deltas.items(), key=lambda kv: -kv[1])[:3]:
        if d > 0:
            evidence_lines.append(f"{CAUSE_NAMES.get(phase, phase)}: +{d / 1000:.1f} ms per step vs the median of the other ranks")
    return [Straggler(rank=candidate, excess_us_per_step=max(held, extra_work), cause=cause,
                      evidence=evidence_lines, held_us_per_step=held)]


def _cause(candidate: int, evidence: Mapping[int, RankEvidence], have_window: bool) -> tuple[str, dict[str, float]]:
    if have_window:
        per = {r: _per_step(ev) for r, ev in evidence.items()}
        keys: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer", "other")
    else:
        per = {r: _host_medians(ev) for r, ev in evidence.items()}
        keys = tuple(s.cause for s in step_records.SIGNALS if s.cause is not None and not s.holds_wait)
    deltas = {}
    for k in keys:
        others = [p[k] for r, p in per.items() if r != candidate and k in p]
        if k in per[candidate] and others:  # a phase not observed is no evidence either way
            deltas[k] = per[candidate][k] - _median(others)
    if not deltas:
        return "unknown", deltas
    best = max(deltas, key=lambda k: deltas[k])
    if deltas[best] <= 0:
        return "unknown", deltas
    return CAUSE_NAMES.get(best, best), deltas
