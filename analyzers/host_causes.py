"""Host causes behind a rank's extra time, from the host signals of steps.jsonl
(collectors/host_signals.py): waiting for a CPU, garbage collection, bigger inputs.

A straggler's phases say where its extra time goes (forward, backward, outside them);
these say why, when one of them accounts for it: per rank the median over the counted
steps of

* ``run_queue``: the time the training thread was runnable but had no CPU. A rank
  whose thread waits for a CPU while the others' do not shares its cores with
  something else (another process, too many threads);
* ``gc``: Python's garbage-collection pauses;
* ``input_elements``: the elements of the first tensor the model's forward gets (the
  batch of token ids: its tokens);
* ``page_faults`` (and ``backward_page_faults``): the process's minor page faults, at
  what one costs (measured after the job, factors/faults.json; else ``FAULT_US``,
  labelled a typical cost). A rank whose C library allocator hands freed memory back
  to the kernel faults it in again every step, while its peers, running the same code,
  reuse theirs: its backward is longer by its faults, and backward's time holds the
  wait, so the phase table alone puts the extra time elsewhere (the comm_bound job's
  rank 0 faulted 8,160 times per step in backward and its peer none: 19.0 ms more CPU
  per step, of which the phases showed 2.0 ms outside forward, backward and optimizer).

A host cause is named when the candidate's excess over the other ranks' median in that
signal is at least ``EXPLAINS`` of the time the others wait for it (the straggler's
``held_us_per_step``) and 1 ms; input imbalance when its batches hold at least
``INPUT_RATIO`` times the others' elements and its extra time is in forward or
backward. Each comes with its evidence line; the phase table stays as it was.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from pardiag.analysis import Straggler
from pardiag.analyzers.factors import FaultCost
from pardiag.analyzers.summary import FAULT_US
from pardiag.step_records import StepRecord, counted

EXPLAINS = 0.5  # share of the others' wait a host signal must account for
MIN_US = 1000.0
INPUT_RATIO = 1.2  # a rank's batches this many times the others' elements: input imbalance

CONTENTION = "CPU contention"
GC = "garbage collection"
INPUT = "input imbalance"
FAULTS = "page faults"


@dataclass(frozen=True)
class HostMedians:
    """One rank's host signals, medians over its counted steps (None: not recorded)."""

    run_queue_us: float | None
    gc_us: float | None
    gcs_per_100: float | None  # collections per 100 steps (the mean, times 100)
    input_elements: float | None
    involuntary_switches: float | None
    cpu_us: float | None
    steps: int
    page_faults: float | None = None
    backward_page_faults: float | None = None


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def host_medians(records: Sequence[StepRecord]) -> HostMedians:
    recs = [r for r in records if counted(r)]

    def col(name: str) -> list[float]:
        return [v for r in recs if (v := r.get(name)) is not None]

    gcs = col("gcs")
    return HostMedians(
        run_queue_us=_med(col("run_queue")), gc_us=_med(col("gc")),
        gcs_per_100=100 * sum(gcs) / len(gcs) if gcs else None,
        input_elements=_med([v for r in recs if (v := r.get("input_elements")) is not None and v > 0]),
        involuntary_switches=_med(col("involuntary_switches")), cpu_us=_med(col("cpu")), steps=len(recs),
        page_faults=_med(col("page_faults")), backward_page_faults=_med(col("backward_page_faults")))


def _others(per: Mapping[int, HostMedians], rank: int, attr: str) -> float | None:
    vals = [v for r, m in per.items() if r != rank and (v := getattr(m, attr)) is not None]
    return statistics.median(vals) if vals else None


def excess_us(rank: int, records: Mapping[int, Sequence[StepRecord]]) -> float:
    """The largest of `rank`'s host-signal times (run-queue wait, garbage collection) over
    the other ranks' median, per step (median over the counted steps); 0 when none is
    recorded or none exceeds the others'."""
    per = {r: host_medians(recs) for r, recs in records.items()}
    mine = per.get(rank)
    if mine is None or len(per) < 2:
        return 0.0
    out = 0.0
    for attr in ("run_queue_us", "gc_us"):
        v, o = getattr(mine, attr), _others(per, rank, attr)
        if v is not None and o is not None:
            out = max(out, v - o)
    return out


def refine(s: Straggler, records: Mapping[int, Sequence[StepRecord]],
           fault_cost: FaultCost | None = None) -> Straggler:
    """The straggler with the host cause its signals show, and the evidence for it; as
    it was when none accounts for its extra time. ``fault_cost``: a page fault's cost
    measured after the job (else ``FAULT_US``)."""
    per = {r: host_medians(recs) for r, recs in records.items()}
    mine = per.get(s.rank)
    if mine is None or len(per) < 2:
        return s
    held = s.wait_us
    need = max(EXPLAINS * held, MIN_US)
    found: list[tuple[float, str, str]] = []  # (excess, cause, evidence)
    for attr, name, words in (("run_queue_us", CONTENTION, "waited for a CPU (run queue)"),
                              ("gc_us", GC, "paused for garbage collection")):
        v, o = getattr(mine, attr), _others(per, s.rank, attr)
        if v is None or o is None or v - o < need:
            continue
        part = "all" if v - o >= held else f"{(v - o) / held:.0%}"
        line = (f"rank {s.rank} {words} {v / 1000:.1f} ms per step, the others {o / 1000:.1f} ms (median over "
                f"{mine.steps} steps, steps.jsonl): {part} of the {held / 1000:.1f} ms they wait for it")
        if attr == "gc_us" and mine.gcs_per_100 is not None:
            others_n = _others(per, s.rank, "gcs_per_100")
            line += (f"; {mine.gcs_per_100:.0f} collections per 100 steps"
                     + (f", the others {others_n:.0f}" if others_n is not None else ""))
        if attr == "run_queue_us" and mine.involuntary_switches is not None:
            o_sw = _others(per, s.rank, "involuntary_switches")
            line += (f"; {mine.involuntary_switches:.0f} involuntary context switches per step"
                     + (f", the others {o_sw:.0f}" if o_sw is not None else ""))
        found.append((v - o, name, line))
    faults = _faults(s, mine, per, fault_cost, need, held)
    if faults is not None:
        found.append(faults[:3])
    v, o = mine.input_elements, _others(per, s.rank, "input_elements")
    if v is not None and o and v >= INPUT_RATIO * o and s.cause in ("forward", "backward"):
        found.append((held, INPUT, f"rank {s.rank}'s batches have {v / o:.2f}x the elements of the others' "
                                   f"({v:,.0f} against {o:,.0f} per step, median; the first tensor its model's "
                                   "forward gets)"))
    if not found:
        return s
    found.sort(key=lambda f: -f[0])
    _, name, _ = found[0]
    phase = s.cause
    if name == FAULTS and faults is not None and faults[3]:
        phase = "backward"  # where the faults are, whatever the phase table showed beside the wait
    cause = name if phase in ("unknown", "") else f"{name} ({phase})"
    return replace(s, cause=cause, evidence=[*s.evidence, *(line for _, _, line in found)])


def _faults(s: Straggler, mine: HostMedians, per: Mapping[int, HostMedians], cost: FaultCost | None,
            need: float, held: float) -> tuple[float, str, str, bool] | None:
    """(the time, FAULTS, the evidence line, whether most of them are inside backward)
    when the straggler's page faults beyond its peers', at a fault's cost, account for
    ``need`` of the others' wait; else None."""
    v, o = mine.page_faults, _others(per, s.rank, "page_faults")
    if v is None or o is None:
        return None
    us = cost.us if cost is not None else FAULT_US
    extra = (v - o) * us
    if extra < need:
        return None
    part = "all" if extra >= held else f"{extra / held:.0%}"
    bwd, bwd_o = mine.backward_page_faults, _others(per, s.rank, "backward_page_faults")
    inside, in_backward = "", False
    if bwd is not None and bwd_o is not None:
        inside = f", {bwd:,.0f} of them inside backward (the others {bwd_o:,.0f})"
        in_backward = bwd - bwd_o >= 0.5 * (v - o)
    where = (f"measured after the job: {cost.source.removeprefix('measured: ')}" if cost is not None
             else "a typical cost: none was measured after the job")
    return extra, FAULTS, (
        f"rank {s.rank} page-faulted {v:,.0f} times per step, the others {o:,.0f}{inside} (median over "
        f"{mine.steps} steps, steps.jsonl): at {us:.2f} us a fault ({where}) {extra / 1000:.1f} ms per step, "
        f"{part} of the {held / 1000:.1f} ms they wait for it. Its C library's allocator hands freed memory back "
        "to the kernel and takes it again every step; the others' keep theirs"), in_backward


def cause_kind(cause: str) -> str | None:
    """The host cause a straggler's cause names (CONTENTION, GC, INPUT, FAULTS), or None."""
    for k in (CONTENTION, GC, INPUT, FAULTS):
        if cause.startswith(k):
            return k
    return None
