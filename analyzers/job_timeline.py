"""The job as one timeline: every rank's profiled window on one clock, its steps, the
collectives matched across ranks (each rank's wait and transfer in them) and the
critical path of every step, ready to be drawn over the ranks' own events (the merged
Perfetto export, ``pardiag.export_perfetto``); and one step of every rank in the
breakdown's categories, on the same clock, for the report (``step_view``).

Nothing here is computed a second way: the clocks are aligned by
``replay.clock_alignment`` (the replay model's alignment: collective ends, one clock
per host), the collectives are those ``collectives.match`` counts
(``matched_instances``), with its wait and transfer, and the critical path is the
replay's (``replay.critical_path_segments``). Times are microseconds on the aligned
clock (the lowest rank's), less ``zero_us`` (the earliest event of any rank), so that
the timeline starts at 0.

A critical-path segment is found in replayed time; it is drawn over the measured
events, at the node's measured end (a collective: where it completed) back by the time
it holds on the path. The replay reproduces the measured steps (its error is given with
the analysis' critical path), so the marks lie on what the path went through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pardiag.analyzers import replay as rp
from pardiag.analyzers.collectives import matched_instances
from pardiag.analyzers.rank_trace import CollectiveCall, RankTrace, StepSpan, collective_calls, profiled_window
from pardiag.analyzers.trace import Trace

MERGE_GAP_US = 1.0
"""Consecutive critical-path segments of one kind on one rank this close are drawn as one."""
ABSORB_GAP_US = 50.0
"""A host gap shorter than this between two segments (Python between two operators) is
drawn as part of the segment before it."""


@dataclass(frozen=True)
class RankWindow:
    """What one rank's trace contributes, in the rank's own clock (small: the trace
    itself can be let go)."""

    rank: int
    host: str | None  # as the trace names it: ranks of one host share a clock
    main_tid: int | None  # the thread of the training loop
    steps: tuple[StepSpan, ...]
    window_us: tuple[float, float]
    calls: tuple[CollectiveCall, ...]
    first_us: float  # the earliest start of an event with a category and a duration


def rank_window(rank: int, trace: Trace, complete: bool = True, host: str | None = None) -> RankWindow:
    """``complete`` False: the window was cut short by the process exiting (its last step
    is left out, as the analysis leaves it out)."""
    steps, main, window = profiled_window(trace, drop_last_step=not complete)
    return RankWindow(rank, host, main, steps, window, tuple(collective_calls(trace, steps, window)),
                      float(trace.min_ts_us))


def alignment_hosts(windows: Mapping[int, RankWindow]) -> dict[int, str | None] | None:
    """The hosts the clocks are aligned with: those of the ranks with steps (the ranks
    the replay model holds), None unless every one is known (as ``replay.model_of``)."""
    hosts = {r: w.host for r, w in windows.items() if w.steps}
    return hosts if all(hosts.values()) else None


@dataclass(frozen=True)
class StepTile:
    """A profiled step: from its start to the next one's (the last: to its end), as the
    analysis tiles the window."""

    step: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Member:
    """One rank's part in a matched collective: it arrived at ``start_us``, waited
    ``wait_us`` for the others, then moved data for ``transfer_us`` (the shortest
    duration across the ranks), ending at ``end_us``."""

    rank: int
    start_us: float
    end_us: float
    wait_us: float
    transfer_us: float
    timing: str  # "host" (gloo), "device" (kernels), "launch" (only the enqueue was seen: not timed)


@dataclass(frozen=True)
class MatchedCollective:
    index: int
    op: str
    process_group: str
    step: int | None
    position: int  # its place among the group's calls of that step
    bytes: int | None
    members: tuple[Member, ...]  # in rank order


@dataclass(frozen=True)
class PathMark:
    """Time on a step's critical path, on one rank's measured timeline."""

    step: int
    rank: int
    start_us: float
    end_us: float
    on_path_us: float  # the replay's time on the path (merged marks: their sum)
    kind: str  # replay node kind: work, gap, wait, sync, collective, kernel
    phase: str
    name: str


@dataclass(frozen=True)
class JobTimeline:
    offsets_us: dict[int, float]  # rank -> offset of its clock from the lowest rank's
    zero_us: float  # aligned time drawn as 0
    steps: dict[int, tuple[StepTile, ...]]
    collectives: tuple[MatchedCollective, ...]
    paths: dict[int, tuple[int, tuple[PathMark, ...]]]  # step -> (rank whose step ended last, marks in time order)
    notices: tuple[str, ...] = ()

    def at(self, rank: int, t_us: float) -> float:
        """A time of ``rank``'s own clock on the timeline."""
        return t_us - self.offsets_us.get(rank, 0.0) - self.zero_us


def job_timeline(windows: Mapping[int, RankWindow], model: rp.Model | None = None) -> JobTimeline:
    """The job's timeline from its ranks' windows; ``model`` (the replay model of the same
    traces) adds the critical paths."""
    # the replay model's alignment, on the same inputs: ranks with steps, hosts when all known
    offsets = rp.clock_alignment({r: w.calls for r, w in sorted(windows.items()) if w.steps},
                                 alignment_hosts(windows))
    offsets = {r: offsets.get(r, 0.0) for r in sorted(windows)}
    firsts = [w.first_us - offsets[r] for r, w in windows.items() if math.isfinite(w.first_us)]
    zero = min(firsts, default=0.0)

    def at(rank: int, t: float) -> float:
        return t - offsets[rank] - zero

    steps = {r: tuple(StepTile(sp.step, at(r, sp.start_us),
                               at(r, w.steps[i + 1].start_us if i + 1 < len(w.steps) else sp.end_us))
                      for i, sp in enumerate(w.steps))
             for r, w in sorted(windows.items())}
    colls = _collectives(windows, at)
    paths = _paths(model, zero) if model is not None else {}
    notices = tuple(model.notices) if model is not None else ()
    return JobTimeline(offsets, zero, steps, colls, paths, notices)


def _collectives(windows: Mapping[int, RankWindow], at: Callable[[int, float], float]) -> tuple[MatchedCollective, ...]:
    """The instances ``collectives.match`` counts, on two ranks or more, with each rank's
    wait and transfer as ``match`` splits them."""
    return tuple(_matched(matched_instances({r: w.calls for r, w in sorted(windows.items())}), at))


def _matched(instances: Iterable[tuple[Any, Mapping[int, CollectiveCall]]],
             at: Callable[[int, float], float]) -> list[MatchedCollective]:
    out: list[MatchedCollective] = []
    for (pg, step, pos), by_rank in instances:
        if len(by_rank) < 2:
            continue
        launch = any(c.timing == "launch" for c in by_rank.values())
        durs = {r: 0.0 if launch else c.dur_us for r, c in by_rank.items()}
        transfer = min(durs.values())
        members = tuple(Member(r, at(r, c.start_us), at(r, c.start_us + c.dur_us),
                               durs[r] - transfer, transfer, c.timing)
                        for r, c in sorted(by_rank.items()))
        first = next(iter(by_rank.values()))
        sizes = [c.bytes for c in by_rank.values() if c.bytes]
        out.append(MatchedCollective(len(out), first.op, pg, step, pos,
                                     round(sum(sizes) / len(sizes)) if sizes else None, members))
    return out


def _paths(model: rp.Model, zero: float) -> dict[int, tuple[int, tuple[PathMark, ...]]]:
    nodes = model.nodes
    out = {}
    for step, (rank, segments) in rp.critical_path_segments(model).items():
        marks: list[PathMark] = []
        for seg in segments:
            n = nodes[seg.node]
            span = max(seg.end_us - seg.start_us, 0.0)
            if span <= 0:
                continue
            end = (n.done if n.kind == rp.COLL and n.done is not None else n.measured_end) - zero
            marks.append(PathMark(step, n.rank, end - span, end, span, n.kind, n.phase, _mark_name(n)))
        out[step] = (rank, tuple(_merged(marks)))
    return out


def _mark_name(n: rp.Node) -> str:
    if n.kind == rp.COLL:
        return n.name.split(" ")[0] or "collective"
    if n.kind == rp.KERNEL:
        return f"GPU {n.phase}"
    if n.kind == rp.GAP:
        return "host gap"
    if n.kind == rp.SYNC:
        return "device sync"
    if n.kind == rp.WAIT:
        return "wait" if n.phase in ("wait", "host") else f"wait ({n.phase})"
    return n.phase


def _merged(marks: Sequence[PathMark]) -> list[PathMark]:
    """In time order per rank, without overlaps (a mark starts where the rank's previous
    one ended at the earliest), neighbours of one name joined, short host gaps joined to
    the mark before them."""
    out: list[PathMark] = []
    last: dict[int, int] = {}  # rank -> index in `out` of its latest mark
    for m in sorted(marks, key=lambda m: (m.end_us, m.start_us)):
        j = last.get(m.rank)
        prev = out[j] if j is not None else None
        start = max(m.start_us, prev.end_us) if prev is not None else m.start_us
        if m.end_us <= start:
            continue
        joins = prev is not None and start - prev.end_us <= MERGE_GAP_US and (
            prev.name == m.name or (m.kind == rp.GAP and m.end_us - start < ABSORB_GAP_US))
        if prev is not None and j is not None and joins:
            out[j] = PathMark(prev.step, prev.rank, prev.start_us, m.end_us, prev.on_path_us + m.on_path_us,
                              prev.kind, prev.phase, prev.name)
        else:
            last[m.rank] = len(out)
            out.append(PathMark(m.step, m.rank, start, m.end_us, m.on_path_us, m.kind, m.phase, m.name))
    return sorted(out, key=lambda m: (m.rank, m.start_us))


# ------------------------------------------------------------------------------ one step of every rank
STEP_VIEW_RANKS = 32
"""Ranks a step's chart holds at most: the ones named first (the stragglers), then by rank."""


def step_view(traces: Mapping[int, RankTrace], hosts: Mapping[int, str | None] | None = None,
              first: Sequence[int] = ()) -> dict[str, Any] | None:
    """The middle profiled step that every rank recorded, on every rank (at most
    ``STEP_VIEW_RANKS``), on the export's clock: ``rank_trace.step_segments``' runs of
    the breakdown's categories, shifted by the replay's alignment (``hosts``: each rank's
    host as its trace names it), the earliest rank's start of the step at 0. None
    without a step recorded by every rank. The Analysis' ``step_timeline`` block.

    ``steps`` holds every such step (at most ``STEP_VIEW_STEPS`` and ``STEP_VIEW_SEGMENTS``
    runs in all, the nearest to the middle one first)
    the same way, each on its own zero, with the step's matched collectives, for the
    TUI's timeline; ``step`` and ``ranks`` stay the middle one."""
    timed = {r: t for r, t in sorted(traces.items()) if t.steps and t.segments_per_step_us}
    if not timed:
        return None
    common = set.intersection(*(set(t.segments_per_step_us) for t in timed.values()))
    steps = sorted(s for s in common if all(t.segments_per_step_us[s] for t in timed.values()))
    if not steps:
        return None
    step = steps[(len(steps) - 1) // 2]
    known = {r: hosts.get(r) for r in timed} if hosts else {}
    offsets = rp.clock_alignment({r: t.collectives for r, t in timed.items()},
                                 known if known and all(known.values()) else None)
    shown = sorted(list(dict.fromkeys([r for r in first if r in timed] + list(timed)))[:STEP_VIEW_RANKS])
    matched = matched_instances({r: t.collectives for r, t in timed.items()})
    sizes = {s: sum(len(timed[r].segments_per_step_us[s]) for r in shown) for s in steps}
    every = [_step_rows(timed, offsets, shown, s, matched) for s in _bounded(steps, step, sizes)]
    middle = next(e for e in every if e["step"] == step)
    return {"step": step, "ranks": middle["ranks"], "ranks_total": len(timed),
            "clock_offsets_us": {str(r): offsets.get(r, 0.0) for r in shown}, "steps": every}


STEP_VIEW_STEPS = 16
"""Profiled steps the block holds in ``steps`` at most: those around the middle one."""
STEP_VIEW_SEGMENTS = 100_000
"""Category runs ``steps`` holds at most, all steps and ranks together (about 4 MB of
JSON); the middle step is always held."""
STEP_VIEW_COLLECTIVES = 512
"""Matched collectives a step of ``steps`` holds at most (the first in time)."""


def _bounded(steps: Sequence[int], middle: int, sizes: Mapping[int, int]) -> list[int]:
    """The steps held: the middle one, then the nearest to it (the earlier of two as near)
    while the step and run budgets allow, in step order."""
    i = steps.index(middle)
    nearest = sorted(range(len(steps)), key=lambda j: (abs(j - i), j))
    held: list[int] = []
    runs = 0
    for j in nearest:
        if len(held) == STEP_VIEW_STEPS or (held and runs + sizes[steps[j]] > STEP_VIEW_SEGMENTS):
            break
        held.append(steps[j])
        runs += sizes[steps[j]]
    return sorted(held)


def _step_rows(timed: Mapping[int, RankTrace], offsets: Mapping[int, float], shown: Sequence[int], step: int,
               matched: Sequence[tuple[Any, Mapping[int, CollectiveCall]]]) -> dict[str, Any]:
    """One step of the ranks ``shown``: their category runs and the step's matched
    collectives (each rank's arrival, end, wait and transfer as ``collectives.match``
    splits them), the earliest shown rank's start of the step at 0."""
    zero = min(timed[r].segments_per_step_us[step][0][0] - offsets.get(r, 0.0) for r in shown)

    def at(r: int, t: float) -> float:
        return t - offsets.get(r, 0.0) - zero

    rows = []
    for r in shown:
        segs = timed[r].segments_per_step_us[step]
        rows.append({"rank": r, "start_us": at(r, segs[0][0]), "end_us": at(r, segs[-1][1]),
                     "segments": [[at(r, s), at(r, e), c] for s, e, c in segs]})
    colls: list[dict[str, Any]] = []
    for c in _matched(((k, b) for k, b in matched if k[1] == step), at):
        members = [m for m in c.members if m.rank in shown]
        if members:
            colls.append({"op": c.op, "process_group": c.process_group, "position": c.position, "bytes": c.bytes,
                          "members": [{"rank": m.rank, "start_us": m.start_us, "end_us": m.end_us,
                                       "wait_us": m.wait_us, "transfer_us": m.transfer_us, "timing": m.timing}
                                      for m in members]})
    colls.sort(key=lambda c: (min(m["start_us"] for m in c["members"]), c["process_group"], c["position"]))
    return {"step": step, "ranks": rows, "collectives": colls[:STEP_VIEW_COLLECTIVES]}
