"""The rank(s) that hold the others back, by how much, and why.

In a synchronous job every rank waits at each collective for the last one to
arrive. The straggler is the rank that waits least while the others wait a lot; the
time the others lose per step is its excess. Its cause is the phase in which it
spends more than the other ranks (input loading, forward, backward compute,
optimizer, or host work outside those), compared per step.

The per-step evidence, the longer first:
- every counted step from steps.jsonl (`step_records.counted`): the host time inside
  backward includes DDP's wait for the all-reduce (the signal marked `holds_wait`), so
  a straggler shows as the rank with the shortest backward, and its extra time in the
  other signals with a straggler cause (DataLoader, forward, optimizer:
  `step_records.SIGNALS`) or outside all of them is measured directly. A signal a rank
  never observed is missing from its medians, not 0.
- the profiled window's steps (ProfilerStep spans; a plain trace folder has only
  these): per step, the time each rank waited inside matched collectives, waits of
  collectives in flight together counted once (`step_waits`), and the phases cut from
  the trace. Judged when steps.jsonl shows no straggler; where steps.jsonl has its
  steps, the window may only name a rank slow in backward (the one phase steps.jsonl
  cannot see apart from the wait): any other phase it timed over every step, and a
  rank slower only in the few profiled steps is not a straggler.

Significance: per step, the others' wait (median) less the candidate's is its excess;
the 95% bootstrap interval of its median over the steps (with fewer than 5 steps, the
smallest step) must clear a floor: 10% of the median step (as TraceML: below that, no
finding), 1 ms, and the noise measured on the run itself (the spread between the other
ranks, or with two ranks how far the excess wanders from step to step). The candidate
must also wait least in at least 75% of the steps, and its own phases (the tables the
Analysis shows) must hold extra work above the same 10% and 1 ms: otherwise the
evidence would contradict the tables, and nothing is named.

Causes: the phase with the most extra time. Time with no torch operator and no wait
on the rank's training thread (the window's "host" phase), or the step less every
timed signal (steps.jsonl), is host work, not forward: where the window shows that
rank's extra gaps, the cause says where in the step they lie ("host work outside torch
operators: at the step's start, before forward").

Figures: `held_us_per_step` is the median excess, `excess_us_per_step` the extra work
its phases show; both are bounded by the step. On CPUs, from steps.jsonl, the training
threads' time on a CPU (or waiting for one) also times both (`_cpu_excess`): backward's
time hides the straggler's own extra backward work, the CPU time does not, and the
larger measure is taken.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from pardiag.analysis import Straggler
from pardiag import step_records
from pardiag.analyzers import host_causes
from pardiag.analyzers.factors import FaultCost
from pardiag.analyzers.intervals import total_length
from pardiag.analyzers.rank_trace import CollectiveCall, StepSpan
from pardiag.analyzers.timeline import clip
from pardiag.step_records import StepRecord, counted

MIN_SHARE = 0.10  # TraceML: under 10% of the step is no finding
MIN_US = 1000.0
MIN_CONSISTENCY = 0.75
MIN_STEPS = 5  # fewer steps: every one must clear the floor (no interval from so few)
BOOTSTRAP = 2000
CAUSE_NAMES = {
    "dataloader": "dataloader",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "operators after backward",  # the window's phase: operators after the last backward op
    "host": "host work outside torch operators",  # the window's gaps with no operator and no wait
    "untimed": "work outside DataLoader, forward, backward and optimizer",  # steps.jsonl: the step less its signals
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
    host_gaps_us: Mapping[str, float] = field(default_factory=dict)  # window total, by where in the step
    device_type: str | None = None  # where its operators compute ("cpu", "cuda", ...)

    @property
    def window_step_us(self) -> float:
        """The profiled window's mean step: its steps' lengths, else 0."""
        v = self.step_lengths_us
        return sum(v.values()) / len(v) if v else 0.0


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
    """Medians over the counted steps (the rank's host phases in the Analysis):
    "step" (the duration), "<wait signal>_host" (the host time that holds the wait),
    every other signal with a straggler cause, keyed by its cause, and "untimed": the
    step less those medians (time no signal measures). A signal with no value in any
    counted step is absent, and so is "untimed" then."""
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
    if len(out) == len(cols):
        out["untimed"] = max(out["step"] - sum(v for k, v in out.items() if k != "step"), 0.0)
    return out


@dataclass(frozen=True)
class _Series:
    """Per step, each rank's wait (or the signal that holds it) and the step's length."""

    source: str
    waits: dict[int, dict[int, float]]  # step -> rank -> us
    lengths: list[float]
    off_cpu: bool = False  # waits are the training threads' time off a CPU (`_cpu_series`)


def _all_series(evidence: Mapping[int, RankEvidence], busy: _Busy | None) -> list[_Series]:
    """The per-step evidence, in the order it is judged: steps.jsonl when every rank
    has at least MIN_STEPS counted steps in common (the backward signal holds the wait,
    so a rank slow in backward itself does not show there), then the profiled window's
    steps (ProfilerStep spans, waits measured inside collectives; a plain trace folder
    has only these). On CPUs, between the two, steps.jsonl's training-thread time off a
    CPU (`_cpu_series` of ``busy``: what backward's time hides)."""
    return [x for x in (_jsonl_series(evidence), _cpu_series(busy), _window_series(evidence)) if x is not None]


_Busy = dict[int, dict[int, tuple[float, float]]]
"""rank -> counted step -> (the step's duration, its training thread's time on a CPU or
waiting for one), us (`_cpu_busy`)."""


def _cpu_busy(evidence: Mapping[int, RankEvidence]) -> _Busy | None:
    """On CPUs, per rank and counted step: (the step's duration, its training thread's
    time on a CPU or waiting for one: steps.jsonl ``cpu_us`` + ``runq_us``), on the steps
    every rank has; None off CPUs (a GPU rank's host thread spins or sleeps on its
    device as it likes) or under MIN_STEPS such steps."""
    if any(ev.device_type != "cpu" for ev in evidence.values()):
        return None
    busy: _Busy = {}
    for r, ev in evidence.items():
        busy[r] = {rec.step: (rec.dur_us, v + (rec.get("run_queue") or 0.0)) for rec in ev.step_records
                   if counted(rec) and rec.dur_us is not None and (v := rec.get("cpu")) is not None}
    steps = set.intersection(*(set(d) for d in busy.values())) if busy else set()
    if len(steps) < MIN_STEPS:
        return None
    return {r: {k: d[k] for k in sorted(steps)} for r, d in busy.items()}


def _cpu_series(busy: _Busy | None) -> _Series | None:
    """On CPUs, each rank's time per counted step off its CPU (the step less its
    training thread's time on a CPU or waiting for one): a rank that computes longer
    (bigger batches, more work) is off it least while the others wait. Backward's time
    holds the wait but also the straggler's own extra backward work, which can hide the
    difference under the noise floor: in one recording of the long-inputs scenario
    (rank 1 with twice the tokens) backward's time put the others' wait at about 4 ms of
    a 37.5 ms step, while they were off their CPU 14.0 ms per step longer than rank 1."""
    if busy is None:
        return None
    steps = list(next(iter(busy.values())))
    return _Series("steps.jsonl", _off_cpu(busy), [_median([d[k][0] for d in busy.values()]) for k in steps],
                   off_cpu=True)


def _off_cpu(busy: _Busy) -> dict[int, dict[int, float]]:
    """Per counted step, each rank's time off its CPU: the step less its training
    thread's time on a CPU or waiting for one."""
    steps = list(next(iter(busy.values())))
    return {k: {r: d[k][0] - d[k][1] for r, d in busy.items()} for k in steps}


def _jsonl_series(evidence: Mapping[int, RankEvidence]) -> _Series | None:
    wait = _wait_signal()
    by_step: dict[int, dict[int, float]] = {}
    durs: dict[int, list[float]] = {}
    for r, ev in evidence.items():
        for rec in ev.step_records:
            if counted(rec) and (v := rec.get(wait)) is not None:
                by_step.setdefault(rec.step, {})[r] = v
                if rec.dur_us is not None:
                    durs.setdefault(rec.step, []).append(rec.dur_us)
    full = {k: d for k, d in by_step.items() if len(d) == len(evidence)}
    if len(full) >= MIN_STEPS:
        return _Series("steps.jsonl", full, [_median(durs.get(k, [])) for k in full])
    return None


def _window_series(evidence: Mapping[int, RankEvidence]) -> _Series | None:
    if not all(ev.steps_in_window > 0 for ev in evidence.values()):
        return None
    if all(ev.step_waits_us for ev in evidence.values()):
        common = set.intersection(*(set(ev.step_waits_us) for ev in evidence.values()))
        waits = {k: {r: ev.step_waits_us[k] for r, ev in evidence.items()} for k in sorted(common)}
        lengths = [_median([ev.step_lengths_us[k] for ev in evidence.values() if k in ev.step_lengths_us])
                   for k in waits]
    else:  # no per-step waits: the window as one step
        waits = {0: {r: _window_wait(ev) for r, ev in evidence.items()}}
        lengths = [_median([ev.window_step_us for ev in evidence.values() if ev.window_step_us > 0])]
    if not waits or not any(x > 0 for x in lengths):
        return None
    return _Series("profiled window", waits, lengths)


def _interval(xs: Sequence[float]) -> tuple[float, float]:
    """95% bootstrap interval of the median (fixed seed: the same run gives the same
    answer); under MIN_STEPS values, the smallest and largest."""
    if len(xs) < MIN_STEPS:
        return min(xs), max(xs)
    a = np.asarray(xs, dtype=np.float64)
    rng = np.random.default_rng(0)
    meds = np.median(a[rng.integers(0, a.size, size=(BOOTSTRAP, a.size))], axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def _noise(series: _Series, candidate: int, excess: Sequence[float]) -> float:
    """How much ranks differ per step when none holds the others back, measured on the
    run itself: with three or more ranks, the median spread of the other ranks' waits
    (ranks that are not the candidate); with two, the median change of the candidate's
    excess from one step to the next (how far it wanders by itself)."""
    spreads = []
    for d in series.waits.values():
        others = [v for r, v in d.items() if r != candidate]
        if len(others) >= 2:
            spreads.append(max(others) - min(others))
    if spreads:
        return _median(spreads)
    return _median([abs(b - a) for a, b in zip(excess, excess[1:])])


def find_stragglers(evidence: Mapping[int, RankEvidence],
                    fault_cost: FaultCost | None = None) -> list[Straggler]:
    """The rank the others wait for, when the wait is significant over the steps (its
    95% interval clears a noise floor measured from the run) and the rank's own phases
    show the extra work that explains it; otherwise none. ``fault_cost``: a page fault's
    cost measured after the job, for its host cause (`host_causes.refine`)."""
    if len(evidence) < 2:
        return []
    busy = _cpu_busy(evidence)
    all_series = _all_series(evidence, busy)
    for series in all_series:
        found = _judge(series, evidence, busy)
        if found and series.source == "profiled window" and all_series[0].source == "steps.jsonl" \
                and (found[0].cause != "backward" or not _cpu_time_agrees(found[0], evidence)):
            # steps.jsonl timed that phase over every step and found no straggler: a
            # rank slower only in the few profiled steps (the profiler's own load) is
            # not one. Only backward work hides from steps.jsonl (its wait is inside),
            # and on CPUs not even that: the training thread's CPU time shows it.
            return []
        if found:
            records = {r: ev.step_records for r, ev in evidence.items() if ev.step_records}
            return ([host_causes.refine(f, records, fault_cost) for f in found] if len(records) == len(evidence)
                    else found)
    return []


def _judge(series: _Series, evidence: Mapping[int, RankEvidence], busy: _Busy | None) -> list[Straggler]:
    """The straggler one source of per-step evidence shows, or []. ``busy``: the ranks'
    time on a CPU per step, on CPUs (`_cpu_busy`)."""
    steps = list(series.waits.values())
    mean_wait = {r: sum(d[r] for d in steps) / len(steps) for r in evidence}
    candidate = min(mean_wait, key=lambda r: (mean_wait[r], r))
    step_us = _median([x for x in series.lengths if x > 0])
    excess = [min(_median([v for r, v in d.items() if r != candidate]) - d[candidate], length or step_us)
              for d, length in zip(steps, series.lengths)]
    held = min(max(_median(excess), 0.0), step_us)
    lo, hi = _interval(excess)
    noise = _noise(series, candidate, excess)
    floor = max(MIN_US, MIN_SHARE * step_us, noise)
    if step_us <= 0 or lo <= floor:
        return []
    consistency = _consistency(candidate, series)
    if consistency is not None and consistency < MIN_CONSISTENCY:
        return []
    window = series.source == "profiled window"
    window_tables = window  # the phase tables quoted: the window's, or steps.jsonl's medians
    tables = _tables(evidence, window)
    cause, deltas = _cause(candidate, tables)
    if series.off_cpu and cause == "unknown" and all(ev.steps_in_window > 0 for ev in evidence.values()):
        # steps.jsonl's phases hold the others' wait in backward as long as the straggler's
        # extra backward work: the window's phases (backward less its wait) can tell them apart
        w_tables = _tables(evidence, True)
        w_cause, w_deltas = _cause(candidate, w_tables)
        if w_cause != "unknown":
            window_tables, tables, cause, deltas = True, w_tables, w_cause, w_deltas
    if cause in (CAUSE_NAMES["host"], CAUSE_NAMES["untimed"]) and (where := _host_where(candidate, evidence, deltas)):
        cause = f"{CAUSE_NAMES['host']}: {where}"
    extra_work = min(sum(d for d in deltas.values() if d > 0), step_us)
    cpu = None if window or busy is None else _cpu_excess(candidate, busy)
    if series.off_cpu and (cpu is None or cpu[1] < CPU_AGREES * held):
        return []  # the others are off their CPU longer, but not for work this rank does on its own
    if cpu is not None:
        # its phases' work, or all it computes; the window's phases time a few steps: they name the cause only
        extra_work = max(0.0 if window_tables else extra_work, min(max(cpu[1], 0.0), step_us))
    if extra_work < max(MIN_US, MIN_SHARE * step_us):
        # the others wait, but this rank's own phases do not show the work that would
        # make them: no rank to name (the evidence would contradict the tables), unless
        # its host signals show the time (waiting for a CPU inside backward, whose
        # signal also holds the wait, shows in no phase)
        records = {r: ev.step_records for r, ev in evidence.items()}
        host = host_causes.excess_us(candidate, records) if all(records.values()) else 0.0
        if host < max(MIN_US, MIN_SHARE * step_us):
            return []
        extra_work, cause = min(host, step_us), "unknown"
    signal_held = held
    if cpu is not None and not series.off_cpu and min(cpu[0], cpu[1]) > held:
        # backward's wall time holds the wait, and also the straggler's own extra
        # backward work: on CPUs its training thread's time shows all of it
        held = min(cpu[0], cpu[1], step_us)
    n = len(excess)
    evidence_lines = [
        f"the other ranks wait {held / 1000:.1f} ms per step more than rank {candidate} "
        f"({held / step_us:.0%} of the {step_us / 1000:.1f} ms median step; both from "
        f"{'the profiled window' if series.source == 'profiled window' else 'steps.jsonl'}"
        f"{OFF_CPU_WORDS if series.off_cpu else CPU_WORDS if held > signal_held else ''})",
        f"per step over {n} step{'s' if n != 1 else ''}"
        + (f", from backward's time alone ({signal_held / 1000:.1f} ms median)" if held > signal_held else "")
        + f": {'95% interval' if n >= MIN_STEPS else 'range'} "
        f"{lo / 1000:.1f} to {hi / 1000:.1f} ms, above the noise floor of {floor / 1000:.1f} ms",
    ]
    if consistency is not None:
        evidence_lines.append(f"rank {candidate} waits least in {consistency:.0%} of all steps")
    if cpu is not None and (held > signal_held or series.off_cpu):
        evidence_lines.append(
            f"rank {candidate}'s training thread is on a CPU (or waiting for one) {cpu[1] / 1000:.1f} ms per step "
            f"longer than the others', and they are off it {cpu[0] / 1000:.1f} ms longer than rank {candidate} "
            f"(median over {cpu[2]} steps, steps.jsonl cpu_us and runq_us): backward's time holds its wait and, "
            "on this rank, extra work of its own")
    table = "profiled window, per step" if window_tables else "medians over all steps, steps.jsonl"
    others_of = {k: _median([t[k] for r, t in tables.items() if r != candidate and k in t]) for k in deltas}
    for phase, d in sorted(deltas.items(), key=lambda kv: -kv[1])[:3]:
        if d > 0:
            name = "backward less its wait in collectives" if window_tables and phase == "backward" else \
                CAUSE_NAMES.get(phase, phase)
            evidence_lines.append(f"{name}: {tables[candidate][phase] / 1000:.1f} ms per step on rank {candidate} vs "
                                  f"{others_of[phase] / 1000:.1f} ms on the others (median; {table})")
    return [Straggler(rank=candidate, excess_us_per_step=extra_work, cause=cause,
                      evidence=evidence_lines, held_us_per_step=held, held_from=series.source)]


CPU_WORDS = ": the training threads' time on a CPU"
OFF_CPU_WORDS = ": the training threads' time off a CPU"


def _cpu_excess(candidate: int, busy: _Busy) -> tuple[float, float, int] | None:
    """On CPUs, the candidate's lead measured by its training thread's time (steps.jsonl
    ``cpu_us`` + ``runq_us``: on a CPU or waiting for one), per counted step common to all
    ranks, as medians over those steps: (how much longer the others are off their CPU
    than the candidate: their wait for it, the transfer cancelling; how much longer the
    candidate is on its CPU than the others: its extra work; the steps). The backward
    signal holds the others' wait but also any extra backward work of the candidate's,
    which hides that much of the wait: rank 1 of the long-inputs scenario does twice the
    tokens, its backward took 20.4 ms per step against rank 0's 24.8 (4.4 ms "wait"),
    while rank 0 was off its CPU 14.3 ms per step and rank 1 1.8 (12.5 ms), and rank 1
    was on its CPU 12.2 ms longer. A straggler slow off its CPU (asleep, on a disk) shows
    no extra time here, and the backward signal stands. None without the candidate's."""
    if candidate not in busy:
        return None
    waits, works = [], []
    for k, off in _off_cpu(busy).items():
        waits.append(_median([v for r, v in off.items() if r != candidate]) - off[candidate])
        works.append(busy[candidate][k][1] - _median([d[k][1] for r, d in busy.items() if r != candidate]))
    return _median(waits), _median(works), len(waits)


CPU_AGREES = 0.5
"""A straggler slow in backward in the profiled window only, on CPUs: its training
thread's time on a CPU or waiting for one per step over every counted step (steps.jsonl
``cpu_us`` + ``runq_us``) must exceed its peers' median by at least this share of the
extra work the window shows."""


def _cpu_time_agrees(s: Straggler, evidence: Mapping[int, RankEvidence]) -> bool:
    """Whether steps.jsonl bears out a window's backward straggler: on CPUs its operators
    run on the training thread, so work it does over every step shows in that thread's
    CPU time (on a fp32 job on 2 cores, the profiler's 3 steps named rank 1 70.6 ms
    slower in backward while the 20 steps outside them had its CPU time 3.8 ms above
    rank 0's), and work slowed by another process on its CPU in the time the thread
    waited to run (its run queue: a rank sharing its CPU with a spinning process ran
    backward 17.9 ms longer than its peer in the window, at the same CPU time per step
    as its peer, 34 ms, and 26-41 ms more in the run queue on every step). Elsewhere
    (GPUs), or without the CPU time, the window stands."""
    ev = evidence.get(s.rank)
    if ev is None or ev.device_type != "cpu" or any(e.device_type != "cpu" for e in evidence.values()):
        return True
    cpu = {r: [v + (rec.get("run_queue") or 0.0) for rec in e.step_records
               if counted(rec) and (v := rec.get("cpu")) is not None]
           for r, e in evidence.items()}
    if any(len(v) < MIN_STEPS for v in cpu.values()):
        return True
    peers = _median([_median(v) for r, v in cpu.items() if r != s.rank])
    return _median(cpu[s.rank]) - peers >= CPU_AGREES * s.excess_us_per_step


def _host_where(candidate: int, evidence: Mapping[int, RankEvidence], deltas: Mapping[str, float]) -> str | None:
    """Where in the step the candidate's extra host work lies (the window's host gaps,
    per profiled step, against the other ranks' median): the place with the most, when
    it holds at least half of the extra time the cause stands for; else None."""
    if any(ev.steps_in_window <= 0 for ev in evidence.values()):
        return None
    per = {r: {k: v / ev.steps_in_window for k, v in ev.host_gaps_us.items()} for r, ev in evidence.items()}
    places = {k: per[candidate][k] - _median([p.get(k, 0.0) for r, p in per.items() if r != candidate])
              for k in per[candidate]}
    if not places:
        return None
    best = max(places, key=lambda k: places[k])
    return best if places[best] >= 0.5 * max(deltas.values()) else None


def _consistency(candidate: int, series: _Series) -> float | None:
    """Share of the steps in which the candidate waits least (on steps.jsonl: its host
    backward time, which contains its wait, is below every other rank's)."""
    steps = list(series.waits.values())
    if len(steps) < MIN_STEPS:
        return None
    wins = sum(1 for d in steps if d[candidate] <= min(v for r, v in d.items() if r != candidate))
    return wins / len(steps)


def _tables(evidence: Mapping[int, RankEvidence], window: bool) -> dict[int, dict[str, float]]:
    """Each rank's per-step phases as the Analysis shows them: the window's phases per
    profiled step (backward less the rank's wait in collectives), or the medians over
    the counted steps of steps.jsonl."""
    if window:
        return {r: _per_step(ev) for r, ev in evidence.items()}
    return {r: _host_medians(ev) for r, ev in evidence.items()}


def _cause(candidate: int, per: Mapping[int, Mapping[str, float]]) -> tuple[str, dict[str, float]]:
    # every phase of the table (the window's, or each signal with a straggler cause), not
    # the step itself nor the backward signal that holds the wait
    keys = [k for k in per[candidate] if k != "step" and not k.endswith("_host")]
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
