"""A replay of the profiled window across ranks: a small dependency model of what each
rank did, re-timed from its measured durations, so that edits to those durations
(what-ifs) give a projected step time instead of a share times a constant.

The model, per rank:

* host streams: the thread of the training loop (and the autograd engine's threads
  where backward runs on its own, as on GPUs) cut into segments that tile the window: work (the operators, by phase),
  host gaps (no torch operator runs: Python, I/O, sleeping) and waits. A wait is a gap
  or a device sync call that contains the end of something it depends on (a collective,
  a kernel, another thread's work) and ends within ``WAIT_TOL_US`` of it: in the replay
  it starts when that dependency ends and lasts only what came after it (the wake-up);
* collective streams: gloo runs each collective on one of its own threads; NCCL runs it
  as a kernel on a device stream. A collective is issued by the host (``c10d::*`` call,
  or the kernel launch), starts when its stream is free, and is a synchronisation point
  across ranks matched as ``collectives.match`` matches them (process group, step,
  order): it ends for every member when the last one has arrived plus its transfer
  time. The transfer time runs from the last arrival to the first sign of completion
  on any member: an annotation's end (for the last to arrive, its whole duration, as
  ``collectives.match`` takes it) or a thread it released. On gloo a worker thread
  descheduled on a busy CPU closes its annotation milliseconds after the collective
  released the waiting loop, so the shortest duration would end it late;
* device streams (GPU traces): kernels in program order per stream, each after its
  launch (correlation ids).

What the trace cannot explain (a worker thread picking a collective up late, a kernel
starting after its launch) is kept as a measured delay before the operation, so the
replay with the measured durations reproduces the measured step only when the
dependencies are right: its error is the test of the model. Estimates are refused
when it exceeds ``MAX_ERROR``.

The replayed step of a rank runs from the replayed start of its ``ProfilerStep`` to the
next one's (the last: its end); the measured one likewise, so both tile the window.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from array import array
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from pardiag.analyzers.collectives import _key, clock_offsets, end_times
from pardiag.analyzers.gemm_shapes import FOLLOWER_NAMES
from pardiag.analyzers.kernels import KernelKind, event_kinds
from pardiag.analyzers.rank_trace import (
    BACKWARD, BACKEND_PREFIXES, CPU_GEMM, DATALOADER, GEMM, OPTIMIZER, SYNC_CALLS, CollectiveCall, StepSpan,
    collective_calls, gemm_dtype, profiled_steps)
from pardiag.analyzers.trace import Trace

WAIT_TOL_US = 250.0
"""A gap or sync call that ends this soon after something ends is a wait for it (the
thread's wake-up after a collective or a device sync takes tens of microseconds)."""
WAKE_MAX_US = 5000.0
"""A gap in which the last member of a collective arrived, ending at most this long after
the collective completed (or after its worker closed it on the gap's rank), waited for it
(the rest is the thread's wake-up)."""
ACCUMULATE_GRAD = re.compile(r"^torch::autograd::AccumulateGrad$")
GRAD_ADD = re.compile(r"^aten::add_?$")
DDP_REDUCER = re.compile(r"^(torch::distributed::reducer::|torch\.distributed\.ddp\.reducer::)")
"""DDP's reducer on the host: gradients copied into its buckets (``reducer::mul_out``) and
the reduced buckets back into the gradients (``copy_bucket_to_grad``). Under ``no_sync``
the reducer does neither (its hooks return at once)."""
MAX_ERROR = 0.08
"""Replay error above which replay-based estimates are refused (the bound per run)."""
TARGET_MEDIAN_ERROR = 0.03

Key = tuple[str, "int | None", int]

# node kinds (SYNC: a device sync call that did not wait)
WORK, GAP, WAIT, SYNC, COLL, KERNEL = "work", "gap", "wait", "sync", "collective", "kernel"
COMPUTE_PHASES = frozenset({"forward", "backward", "optimizer", "other"})


@dataclass(slots=True)
class Node:
    """One operation of the model: it starts when the previous one on its stream has
    ended, its dependencies have ended and ``delay`` has passed, and lasts ``dur``
    (a collective: until the last member arrives, then ``dur``). Slots: a job of 1,024
    ranks has millions of them."""

    rank: int
    stream: str
    kind: str
    phase: str
    dur: float
    measured_start: float
    measured_end: float
    deps: tuple[int, ...] = ()  # (a tuple: most nodes have none, and an empty tuple is shared)
    delay: float = 0.0
    key: Key | None = None  # collectives: the match key
    group_size: int | None = None  # collectives: the process group's size, when the trace says
    transfer: float | None = None  # collectives: from the last member's arrival to its completion
    done: float | None = None  # collectives: when it completed (measured)
    name: str = ""
    step: int | None = None
    gemm: float = 0.0  # matrix multiplies/convolutions inside it (host work on CPU; a GEMM kernel: all)
    reducer: float = 0.0  # DDP's reducer work inside it (host work: DDP_REDUCER)
    bytes: int | None = None  # collectives: the message size, when the trace says
    ew: float = 0.0  # host work on CPU: calls of gemm_shapes.FOLLOWER_NAMES inside it (elementwise activations)


@dataclass
class Model:
    """Nodes, their streams (ids in program order) and the matched collectives."""

    nodes: list[Node]
    streams: dict[tuple[int, str], list[int]]
    groups: dict[Key, list[int]]  # collective key -> member node ids (one per rank)
    steps: dict[int, list[tuple[int, int]]]  # rank -> (step number, first host node id)
    window_end: dict[int, int]  # rank -> last host node id
    origin: dict[int, float]  # rank -> measured window start (aligned clock)
    measured_steps: dict[int, dict[int, float]]  # rank -> step -> measured length (us)
    notices: list[str] = field(default_factory=list)
    sharing: CpuSharing | None = None  # ranks on CPUs that share their host's cores
    base_load: list[float] | None = None  # each node's load factor unedited (with ``sharing``)
    grad_adds: dict[int, tuple[int, int]] = field(default_factory=dict)
    """rank -> (autograd's AccumulateGrad calls in the window, those that added into a
    gradient already there: an ``aten::add``/``add_`` inside). None added: every
    gradient was None when backward reached it (freed by ``zero_grad(set_to_none=True)``),
    and backward's output became the gradient, memory taken afresh in every step. Ranks
    with a GPU trace are not read (their gradients are device memory)."""

    def main_stream(self, rank: int) -> list[int]:
        return self.streams[(rank, "host")]


@dataclass(frozen=True)
class CpuSharing:
    """Ranks computing on CPUs, and the cores they share: per rank its host and the
    threads its operators use, per host its cores. With it, an edited replay re-times
    the host's work for the cores it finds busy (``_shared_durations``)."""

    host: Mapping[int, str]  # rank -> host
    threads: Mapping[int, int]  # rank -> intra-op threads of its operators
    cores: Mapping[str, int]  # host -> cores


# ------------------------------------------------------------------------------ edits
@dataclass(frozen=True)
class Straggler:
    """A rank's operations set to its peers' median: in each step, each phase's time
    (forward, backward, optimizer, DataLoader, host gaps, ...) scaled to the peers'
    median total of that phase in that step (over the window where a step is not
    every rank's). Only the phases that made it late (``STRAGGLER_PHASE_SHARE``), or
    with ``every_phase`` all of them: a cause that slows the whole rank (a CPU it
    shares with another process slows its every operator), not one part of its step.
    Its waits are always set to its peers': what a wait keeps is the wake-up after what
    it waited for, and a straggler on a shared CPU wakes late (one recording of the 2-rank
    straggler job: its loop woke 4.1 and 3.8 ms after the step's last all-reduce in 2 of
    the window's 3 steps, its peer 0.06-0.09 ms; kept, they lengthened the edited
    window's median step from 9.1 to 11.0 ms). Its collectives stay as they are (they
    end with the group's). A straggler that began the window after its peers begins it
    with them (its lag was its slowness in the step before: one recording's straggler
    began 4.5 ms late, and the edited window's first step kept the 4.5 ms)."""

    rank: int
    every_phase: bool = False


@dataclass(frozen=True)
class RemoveHostGaps:
    """Host gaps (time on the loop's thread outside any torch operator) removed."""

    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class CollectivesAtTransfer:
    """Every collective lasts its transfer time from its own rank's arrival: nobody
    waits for a late peer."""


@dataclass(frozen=True)
class ScaleCompute:
    """Compute (operators of forward, backward and the optimizer; compute kernels on a
    GPU) scaled by ``factor`` (0.5: twice as fast, e.g. a lower precision)."""

    factor: float
    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RemoveInputWait:
    """Input waits shortened. Without ``workers``: each DataLoader fetch cut to the rank's
    quickest (a batch that was ready). With ``workers`` (the loader then has that many
    worker processes, prefetching): a batch that took F to load in the loop is ready after
    F / workers, in parallel with the rest of the step R, so the loop waits
    max(0, F / workers - R) plus ``handover_us``, what taking a ready batch from a worker
    costs the loop (measured after the job, factors/loader.json; 0 when not measured),
    the workers taken as having CPUs of their own."""

    ranks: tuple[int, ...] | None = None
    workers: int | None = None
    handover_us: float = 0.0


@dataclass(frozen=True)
class ScaleGemm:
    """Matrix multiplies and convolutions divided by ``speedup`` (a lower precision's
    speed-up at the job's shapes): their time inside host work on a CPU; on a GPU the
    GEMM kernels of the precisions in ``dtypes`` (``rank_trace.gemm_dtype``)."""

    speedup: float
    dtypes: tuple[str, ...] = ("fp32", "tf32", "unknown")
    ranks: tuple[int, ...] | None = None
    follower_speedup: float = 1.0
    """Of the host work's calls of ``gemm_shapes.FOLLOWER_NAMES`` (elementwise activations
    that would run in the lower precision after the matrix multiplies, on a CPU)."""


@dataclass(frozen=True)
class ScalePhase:
    """Host work of one phase (forward, backward, optimizer, dataloader, other) scaled by
    ``factor`` on the ranks given (all when None): e.g. the profiler's inflation of that
    phase taken out."""

    phase: str
    factor: float
    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Accumulate:
    """``k`` micro-batches per optimizer step (gradient accumulation), per micro-batch:
    each step of the window replayed as it is (the micro-batch that syncs) and again
    without its gradient collectives (those issued from backward: DDP's all-reduces,
    FSDP's reduce-scatters), without DDP's reducer copying gradients into its buckets and
    back (``DDP_REDUCER``) and without the optimizer and the loop's host time after it
    (``_after_optimizer``: the ``k - 1`` that do not), each
    step's time the mean of one of the first and ``k - 1`` of the second. What waited for
    a dropped collective waits no longer, and the ranks are no longer synchronised by it.

    Backward itself changes in the ``k - 1`` micro-batches that accumulate into the
    gradients already in memory, on ranks whose gradients were taken afresh each step:
    ``refault_us`` (rank, time per step) is what its backward spent faulting that memory
    in, which they do not; ``add_us`` (rank, time) what adding each new gradient into the
    one there costs them, which the measured step did not. Both change the rank's backward
    work in each of them, spread over it in proportion (at most ``REFAULT_MAX_SHARE`` of
    it taken off)."""

    k: int
    refault_us: tuple[tuple[int, float], ...] = ()
    add_us: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RegroupBuckets:
    """DDP's gradient all-reduces of each step regrouped under a larger bucket cap of
    ``cap_bytes``: consecutive calls of a step merge until the pack reaches the cap (as
    DDP fills a bucket with gradients in ready order and closes it once it holds the cap
    or more), each merged call issued when its last part was. Its time
    is the curve's (``alpha_us + bytes * beta_us_per_byte``, measured after the job) at the
    level of the job's own calls: times the ratio of its parts' measured times to what the
    curve gives them (a call left alone keeps its measured time)."""

    cap_bytes: int
    alpha_us: float
    beta_us_per_byte: float


@dataclass(frozen=True)
class UncontendedCollectives:
    """The collectives of ``ranks`` (ranks whose CPU another process shared) re-timed as
    without that process: each all-reduce's transfer at most the curve's time for its
    bytes (``alpha_us + bytes * beta_us_per_byte``, measured after the job), every
        member's; each pick-up delay of their worker threads, and each time their loop took to
    wake after a collective it waited for had completed, at most the peers' median (0 where
    the peers have none: the contended rank woke 4.8 ms per step late, its peer never).
    On CPUs a collective is the work of every member's worker thread (gloo copies and
    reduces on the CPU), so a member whose CPU is shared slows it for all: the contended
    scenario's 2.6 MB all-reduce took 7.3-9.5 ms per call, the same job without the other
    process 3.0-4.6 ms, the sweep after the job 2.2-2.9 ms. Only ever shortens."""

    ranks: tuple[int, ...]
    alpha_us: float
    beta_us_per_byte: float


Edit = (Straggler | RemoveHostGaps | CollectivesAtTransfer | ScaleCompute | RemoveInputWait | ScaleGemm
        | Accumulate | RegroupBuckets | ScalePhase | UncontendedCollectives)


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class CriticalPath:
    """What the end of one step waited on: time on the path by rank, by phase and by
    collective, and the largest of each."""

    step: int
    rank: int  # the rank whose step ended last
    by_rank_us: dict[int, float]
    by_phase_us: dict[str, float]
    by_collective_us: dict[str, float]

    @property
    def top_rank(self) -> int:
        return max(self.by_rank_us, key=lambda r: self.by_rank_us[r]) if self.by_rank_us else self.rank

    @property
    def top_phase(self) -> str | None:
        return max(self.by_phase_us, key=lambda p: self.by_phase_us[p]) if self.by_phase_us else None

    @property
    def top_collective(self) -> str | None:
        return (max(self.by_collective_us, key=lambda c: self.by_collective_us[c])
                if self.by_collective_us else None)


@dataclass(frozen=True)
class ReplayResult:
    replayed_steps: dict[int, dict[int, float]]  # rank -> step -> us
    measured_steps: dict[int, dict[int, float]]
    critical_paths: dict[int, CriticalPath]  # step -> path

    @property
    def measured_step_us(self) -> float:
        return _mean_step(self.measured_steps)

    @property
    def replayed_step_us(self) -> float:
        return _mean_step(self.replayed_steps)

    def rank_errors(self) -> dict[int, tuple[float, float, float]]:
        """Per rank: (mean measured step, mean replayed step, relative error)."""
        out = {}
        for r, meas in self.measured_steps.items():
            rep = self.replayed_steps.get(r, {})
            m = sum(meas.values()) / len(meas) if meas else 0.0
            p = sum(rep.values()) / len(rep) if rep else 0.0
            out[r] = (m, p, abs(p - m) / m if m > 0 and rep else math.inf)
        return out

    @property
    def error(self) -> float:
        """The largest relative error of a rank's mean replayed step against its
        measured one (every rank must come out right, not only the slowest)."""
        return max((e for _, _, e in self.rank_errors().values()), default=math.inf)

    @property
    def step_errors(self) -> dict[int, dict[int, float]]:
        return {r: {s: (abs(v - self.measured_steps[r][s]) / self.measured_steps[r][s]
                        if self.measured_steps[r].get(s) else math.inf)
                    for s, v in steps.items()}
                for r, steps in self.replayed_steps.items()}

    def refusal(self, bound: float = MAX_ERROR) -> str | None:
        """Why replay-based estimates cannot be given, or None when they can."""
        if not self.measured_steps or not any(self.measured_steps.values()):
            return "no profiled step to replay"
        if self.error > bound:
            errs = self.rank_errors()
            r = max(errs, key=lambda k: errs[k][2])
            m, p, e = errs[r]
            return (f"the replay does not reproduce the measured step (rank {r}: {p / 1e3:.2f} ms "
                    f"replayed, {m / 1e3:.2f} ms measured, {e:.1%} off, more than {bound:.0%})")
        return None

    def median_path(self) -> CriticalPath | None:
        """The critical path of the step whose replayed length is the median."""
        if not self.critical_paths:
            return None
        lengths = {s: max(st.get(s, 0.0) for st in self.replayed_steps.values()) for s in self.critical_paths}
        order = sorted(lengths, key=lambda s: (lengths[s], s))
        return self.critical_paths[order[(len(order) - 1) // 2]]


@dataclass(frozen=True)
class WhatIf:
    """The projected step with some edits applied, in one replay."""

    edits: tuple[Edit, ...]
    step_us: float
    saving: float  # fraction of the baseline replayed step


@dataclass(frozen=True)
class WhatIfResult:
    """Each edit alone and all of them together, against the replay of the measured
    durations. ``refused`` says why the projections must not be given as estimates
    (the replay misses the measured step by more than the bound); None when they can."""

    baseline_step_us: float
    measured_step_us: float
    error: float
    refused: str | None
    each: tuple[WhatIf, ...]
    combined: WhatIf


def _mean_step(steps: Mapping[int, Mapping[int, float]]) -> float:
    """The job's step: the slowest rank's mean step (the job moves at its pace)."""
    per_rank = [sum(s.values()) / len(s) for s in steps.values() if s]
    return max(per_rank) if per_rank else 0.0


# ------------------------------------------------------------------------------ building
_MATCHES: dict[re.Pattern[str], dict[str, bool]] = {}


def _ids(names: Sequence[str], pattern: re.Pattern[str]) -> list[int]:
    """The ids of the names ``pattern`` matches, each distinct name tried once per
    process (a job's ranks share their names)."""
    known = _MATCHES.setdefault(pattern, {})
    out = []
    for i, n in enumerate(names):
        v = known.get(n)
        if v is None:
            v = known[n] = pattern.match(n) is not None
        if v:
            out.append(i)
    return out


def _union(starts: Iterable[float], ends: Iterable[float]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(zip(starts, ends)):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _inside_all(ivs: list[tuple[float, float]], t: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """For each of the times ``t``, whether it lies inside one of the sorted, disjoint
    intervals ``ivs`` (start included, end not)."""
    if not ivs:
        return np.zeros(len(t), dtype=bool)
    st = np.array([x for x, _ in ivs], dtype=np.float64)
    en = np.array([y for _, y in ivs], dtype=np.float64)
    i = np.searchsorted(st, t, "right") - 1
    ic = np.maximum(i, 0)
    return (i >= 0) & (st[ic] <= t) & (t < en[ic])


def _covered_all(ivs: list[tuple[float, float]], cum: list[float], a: npt.NDArray[np.float64],
                 b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """For each segment [a, b], how much of it the sorted, disjoint intervals ``ivs``
    cover (``cum``: their running total lengths, from 0)."""
    st = np.array([x for x, _ in ivs], dtype=np.float64)
    en = np.array([y for _, y in ivs], dtype=np.float64)
    c = np.asarray(cum, dtype=np.float64)
    i = np.maximum(np.searchsorted(st, a, "right") - 1, 0)
    j = np.searchsorted(st, b, "left")
    total = c[j] - c[i]
    last = np.maximum(j - 1, 0)
    inner = (total - np.maximum(0.0, np.minimum(en[i], a) - st[i])) - np.maximum(0.0, en[last] - np.maximum(st[last], b))
    return np.maximum(np.where(i < j, inner, total), 0.0)


def _work_covered(ivs: list[tuple[float, float]], a: npt.NDArray[np.float64], b: npt.NDArray[np.float64],
                  work: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """Per segment [a, b): its time inside the union ``ivs`` where ``work``, else 0."""
    if not ivs:
        return np.zeros(len(a))
    cum = np.concatenate([[0.0], np.cumsum([y - x for x, y in ivs])]).tolist()
    return np.where(work, _covered_all(ivs, cum, a, b), 0.0)


class _RankBuilder:
    """Builds one rank's streams into the shared model."""

    def __init__(self, model: Model, rank: int, trace: Trace, steps: tuple[StepSpan, ...],
                 main_tid: int, calls: list[CollectiveCall], offset: float) -> None:
        self.m, self.rank, self.t, self.steps, self.main = model, rank, trace, steps, main_tid
        self.calls, self.off = calls, offset
        self.window = (steps[0].start_us, steps[-1].end_us)
        self._stream_ids: dict[str, list[int]] = {}

    def add(self, kind: str, stream: str, phase: str, s: float, e: float, **kw: object) -> int:
        return self._append(stream, Node(self.rank, stream, kind, phase, max(e - s, 0.0), s - self.off,
                                         e - self.off, **kw))  # type: ignore[arg-type]

    def add_host(self, kind: str, stream: str, phase: str, s: float, e: float, step: int | None,
                 gemm: float, reducer: float, ew: float = 0.0) -> int:
        """``add`` for a host segment, its arguments in Node's order (millions of calls)."""
        return self._append(stream, Node(self.rank, stream, kind, phase, max(e - s, 0.0), s - self.off,
                                         e - self.off, (), 0.0, None, None, None, None, "", step, gemm, reducer,
                                         None, ew))

    def _append(self, stream: str, node: Node) -> int:
        nodes = self.m.nodes
        nid = len(nodes)
        nodes.append(node)
        ids = self._stream_ids.get(stream)
        if ids is None:
            ids = self._stream_ids[stream] = self.m.streams.setdefault((self.rank, stream), [])
        ids.append(nid)
        return nid

    def build(self) -> None:
        t, lo, hi = self.t, *self.window
        cpu = t.cpu
        in_win = (cpu.ts_us < hi) & (cpu.ts_us + cpu.dur_us > lo) & (cpu.dur_us >= 0)
        names = t.names
        bwd_ids = _ids(names, BACKWARD)
        is_bwd = np.isin(cpu.name_id, bwd_ids)
        gpu_run = len(t.gpu) > 0
        # the loop's thread, and the autograd engine's threads when backward runs elsewhere (GPU)
        host_tids = [self.main] + sorted(set(np.unique(cpu.tid[is_bwd & in_win]).tolist()) - {self.main})
        # per host stream, the end and node of its work (typed arrays: a million of them at 1,024 ranks)
        self.host_ends: dict[str, tuple[array[float], array[int]]] = {}
        # collectives first: host segments are cut where they are issued
        coll_nodes = self._collectives(host_tids)
        kernel_nodes = self._kernels() if gpu_run else {}
        for i, tid in enumerate(host_tids):
            self._host(tid, "host" if i == 0 else f"host thread {tid}", in_win,
                       coll_nodes, kernel_nodes)
        self._wire_issue(coll_nodes, kernel_nodes)
        self.coll_nodes, self.kernel_nodes = coll_nodes, array("q", kernel_nodes.values())
        if not gpu_run:  # (read by the accumulation estimate on CPUs only)
            self.m.grad_adds[self.rank] = self._grad_adds(host_tids, in_win)

    def _grad_adds(self, tids: list[int], mask: np.ndarray) -> tuple[int, int]:
        """(AccumulateGrad calls in the window, those with an add inside), on ``tids``."""
        t = self.t
        cpu, names = t.cpu, t.names
        acc = np.isin(cpu.name_id, _ids(names, ACCUMULATE_GRAD)) & mask
        add = np.isin(cpu.name_id, _ids(names, GRAD_ADD)) & mask
        calls = adds = 0
        for tid in tids:
            a = np.flatnonzero(acc & (cpu.tid == tid))
            calls += len(a)
            b = np.flatnonzero(add & (cpu.tid == tid))
            if not len(a) or not len(b):
                continue
            order = np.argsort(cpu.ts_us[a], kind="stable")
            starts, ends = cpu.ts_us[a][order], (cpu.ts_us[a] + cpu.dur_us[a])[order]
            j = np.searchsorted(starts, cpu.ts_us[b], side="right") - 1
            ok = j >= 0
            inside = ok & (cpu.ts_us[b] + cpu.dur_us[b] <= ends[np.maximum(j, 0)])
            adds += len(np.unique(j[inside]))
        return calls, adds

    # -- collectives ---------------------------------------------------------------------
    def _collectives(self, host_tids: list[int]) -> list[tuple[int, float | None]]:
        """One node per collective call on its worker thread (gloo); returns (node,
        issue time on the host or None). Calls timed on the device become nodes of
        their kernels' streams (``_kernels``)."""
        t = self.t
        evs = [e for e in t.collectives if e.name.startswith(BACKEND_PREFIXES) and not e.on_gpu]
        tid_at = {round(e.ts_us, 3): e.tid for e in evs}
        issues = sorted(e.ts_us for e in t.collectives
                        if e.name.startswith("c10d::") and not e.on_gpu and e.tid in host_tids)
        taken = 0
        out: list[tuple[int, float | None]] = []
        self.device_calls: dict[float, tuple[CollectiveCall, Key]] = {}
        for c, k in sorted(zip(self.calls, _key(self.calls)), key=lambda ck: ck[0].start_us):
            if c.timing == "device":
                self.device_calls[round(c.start_us, 3)] = (c, k)
                continue
            issue = None
            if taken < len(issues) and issues[taken] <= c.start_us:
                issue = issues[taken]
                taken += 1
            nid = self.add(COLL, f"thread {tid_at.get(round(c.start_us, 3), 'comm')}", "comm", c.start_us,
                           c.start_us + c.dur_us, key=k, name=f"{c.op} {c.process_group}", step=c.step,
                           group_size=c.group_size, bytes=c.bytes)
            out.append((nid, issue))
        return out

    # -- device streams ------------------------------------------------------------------
    def _kernels(self) -> dict[int, int]:
        """Kernels in the window as nodes on their streams (a collective timed on the
        device: one node for its call, at its first kernel); correlation -> node."""
        g, t = self.t.gpu, self.t
        lo, hi = self.window
        kinds = event_kinds(g.name_id, g.cat_id, t.names, t.cats)
        sel = np.flatnonzero((g.ts_us < hi) & (g.ts_us + g.dur_us > lo) & (g.dur_us >= 0))
        sel = sel[np.argsort(g.ts_us[sel], kind="stable")]
        by_corr: dict[int, int] = {}
        pending = dict(self.device_calls)
        is_gemm = set(_ids(t.names, GEMM))  # per name, once: not a search per kernel (GEMM is anchored)
        comm_kind, compute_kind = int(KernelKind.COMMUNICATION), int(KernelKind.COMPUTATION)
        names = t.names
        stream_of: dict[int, str] = {}
        rank, off, append = self.rank, self.off, self._append
        for s, dur, stream_no, nid_name, kind, corr in zip(
                g.ts_us[sel].tolist(), g.dur_us[sel].tolist(), g.stream[sel].tolist(),
                g.name_id[sel].tolist(), kinds[sel].tolist(), g.correlation[sel].tolist()):
            stream = stream_of.get(stream_no)
            if stream is None:
                stream = stream_of[stream_no] = f"stream {stream_no}"
            call = pending.pop(round(max(s, lo), 3), None) if kind == comm_kind else None
            if call is not None:
                c, k = call
                nid = self.add(COLL, stream, "comm", c.start_us, c.start_us + c.dur_us, key=k,
                               name=f"{c.op} {c.process_group}", step=c.step, group_size=c.group_size,
                               bytes=c.bytes)
            else:  # (``add``'s node, its arguments in Node's order: a kernel per call)
                phase = "comm" if kind == comm_kind else ("compute" if kind == compute_kind else "memory")
                e = s + dur
                nid = append(stream, Node(rank, stream, KERNEL, phase, max(e - s, 0.0), s - off, e - off, (), 0.0,
                                          None, None, None, None, names[nid_name], None,
                                          dur if phase == "compute" and nid_name in is_gemm else 0.0))
            if corr >= 0:
                by_corr[corr] = nid
        for c, k in pending.values():  # no kernel found at its start: a local op of its measured length
            self.add(COLL, "stream comm", "comm", c.start_us, c.start_us + c.dur_us, name=f"{c.op} {c.process_group}",
                     step=c.step)
        return by_corr

    # -- host streams --------------------------------------------------------------------
    def _host(self, tid: int, stream: str, mask: np.ndarray, coll_nodes: list[tuple[int, float | None]],
              kernel_nodes: dict[int, int]) -> None:
        t, lo, hi = self.t, *self.window
        cpu, names = t.cpu, t.names
        on = mask & (cpu.tid == tid)
        idx = np.flatnonzero(on)
        s = np.maximum(cpu.ts_us[idx], lo)
        e = np.minimum(cpu.ts_us[idx] + cpu.dur_us[idx], hi)
        nid = cpu.name_id[idx]
        step_ids = _ids(names, re.compile(r"^ProfilerStep#"))
        not_step = ~np.isin(nid, step_ids)
        busy = _union(s[not_step].tolist(), e[not_step].tolist())
        # what the edits scale inside host work: GEMMs and elementwise followers (on a CPU), DDP's reducer
        on_cpu = not len(t.gpu)
        covers = [_union(s[m].tolist(), e[m].tolist()) for m in (
            np.isin(nid, _ids(names, CPU_GEMM)) & on_cpu, np.isin(nid, _ids(names, FOLLOWER_NAMES)) & on_cpu,
            np.isin(nid, _ids(names, DDP_REDUCER)))]
        layers = []
        for pat in (DATALOADER, OPTIMIZER, BACKWARD):
            m = np.isin(nid, _ids(names, pat))
            ivs = _union(s[m].tolist(), e[m].tolist())
            layers.append((ivs, [a for a, _ in ivs]))
        L = t.launches
        lmask = (L.tid == tid) & (L.ts_us >= lo) & (L.ts_us < hi)
        sync_ids = _ids(names, SYNC_CALLS)
        is_sync = np.isin(L.name_id, sync_ids) & lmask
        syncs = list(zip(L.ts_us[is_sync].tolist(), (L.ts_us[is_sync] + L.dur_us[is_sync]).tolist()))
        self.sync_ivs = _union([a for a, _ in syncs], [b for _, b in syncs]) if stream == "host" else []
        cuts = {lo, hi}
        for a, b in busy:
            cuts.update((a, b))
        for ivs, _ in layers:
            for a, b in ivs:
                cuts.update((a, b))
        for a, b in syncs:
            cuts.update((a, b))
        steps = self.steps if stream == "host" else ()
        cuts.update(sp.start_us for sp in steps)
        last_bwd: list[float] = []
        for i, sp in enumerate(steps):
            end = steps[i + 1].start_us if i + 1 < len(steps) else sp.end_us
            inb = [b for a, b in layers[2][0] if sp.start_us <= a < end]
            last_bwd.append(max(inb) if inb else sp.start_us)
            cuts.add(last_bwd[-1])
        # issue points (collective calls, kernel launches) on this thread
        for _, issue in coll_nodes:
            if issue is not None and lo <= issue < hi and self._on_thread(tid, issue):
                cuts.add(issue)
        launch_at = L.ts_us[lmask].tolist()
        for c, ts in zip(L.correlation[lmask].tolist(), launch_at):
            if c in kernel_nodes:
                cuts.add(ts)
        cut = np.array(sorted(c for c in cuts if lo <= c <= hi), dtype=np.float64)
        seg_a, seg_b = cut[:-1], cut[1:]  # the segments (the cuts are distinct: each has b > a)
        mid = (seg_a + seg_b) / 2
        j = np.searchsorted(np.array([sp.start_us for sp in steps], dtype=np.float64), mid, "right") - 1
        jc = np.maximum(j, 0)
        step_of = np.array([sp.step for sp in steps] or [0], dtype=np.int64)[jc if len(steps) else 0 * jc]
        # phase: dataloader, optimizer, backward, then forward before the step's last
        # backward operator (or outside any step) and other after it; a gap is "host"
        after_bwd = np.array(last_bwd or [0.0], dtype=np.float64)[jc if len(steps) else 0 * jc]
        phase_no = np.select([_inside_all(layers[0][0], mid), _inside_all(layers[1][0], mid),
                              _inside_all(layers[2][0], mid), (j < 0) | (mid < after_bwd)],
                             [np.int64(0), np.int64(1), np.int64(2), np.int64(3)], np.int64(4))
        work = _inside_all(busy, mid)
        phase_no[~work] = 5
        kind_no = np.where(work, 0, 1)  # WORK, GAP; SYNC (2) over both on the loop's thread
        if stream == "host":
            kind_no[_inside_all(self.sync_ivs, mid)] = 2
        is_work = kind_no == 0
        gemm, ew, reducer = (_work_covered(ivs, seg_a, seg_b, is_work) for ivs in covers)
        kinds, phases = (WORK, GAP, SYNC), ("dataloader", "optimizer", "backward", "forward", "other", "host")
        first_of_step: dict[int, int] = {}
        with_step = (j >= 0).tolist()
        add = self.add_host
        ends_at, ends_of = self.host_ends.setdefault(stream, (array("d"), array("q")))
        for k, ph, s0, e0, st, has, g, rd, w in zip(kind_no.tolist(), phase_no.tolist(), seg_a.tolist(),
                                                     seg_b.tolist(), step_of.tolist(), with_step, gemm.tolist(),
                                                     reducer.tolist(), ew.tolist()):
            n = add(kinds[k], stream, phases[ph], s0, e0, st if has else None, g, rd, w)
            if has and st not in first_of_step:
                first_of_step[st] = n
            if k != 1:
                ends_at.append(e0)
                ends_of.append(n)
        if stream == "host":
            self.m.steps[self.rank] = sorted(first_of_step.items())
            self.m.window_end[self.rank] = self.m.streams[(self.rank, "host")][-1]

    def _on_thread(self, tid: int, ts: float) -> bool:
        t = self.t
        m = (t.cpu.tid == tid) & (t.cpu.ts_us == ts)
        return bool(m.any())

    def _host_nodes_ending_at(self, ts: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """For each time of ``ts`` (cuts), the host node that ends there, on the first of
        the rank's host streams that has one (-1: none)."""
        out = np.full(len(ts), -1, dtype=np.int64)
        nodes = self.m.nodes
        for (rank, stream), ids in self.m.streams.items():
            if rank != self.rank or not stream.startswith("host") or not ids:
                continue
            ends = np.array([nodes[i].measured_end + self.off for i in ids], dtype=np.float64)
            j = np.searchsorted(ends, ts - 1e-6, "left")
            jc = np.minimum(j, len(ends) - 1)
            hit = (j < len(ends)) & (np.abs(ends[jc] - ts) < 1e-6) & (out < 0)
            out[hit] = np.asarray(ids, dtype=np.int64)[jc[hit]]
        return out

    def _wire_issue(self, coll_nodes: list[tuple[int, float | None]], kernel_nodes: dict[int, int]) -> None:
        """Each collective and kernel after the host work that issued it; the rest of
        its measured start is a delay (its stream was busy, or it was picked up late)."""
        L = self.t.launches
        nodes = self.m.nodes
        issued = [(nid, issue) for nid, issue in coll_nodes if issue is not None]
        # and the launches of the kernels in the model, in launch order
        issued += [(k, ts) for c, ts in zip(L.correlation.tolist(), L.ts_us.tolist())
                   if (k := kernel_nodes.get(c)) is not None]
        hosts = self._host_nodes_ending_at(np.array([t for _, t in issued], dtype=np.float64)).tolist()
        for (node, _), h in zip(issued, hosts):
            if h >= 0:
                nodes[node].deps += (h,)

    def waits(self, last_arrival: Mapping[int, float], post: Mapping[int, float]) -> None:
        """Gaps and sync calls that end just after a collective, a kernel or another
        thread's work ends become waits for it. A gap also waits for a collective when the
        collective's last member arrives during it and it ends while the collective's
        annotation is still open on this rank, no later than the quickest member's end
        after that arrival (``post``) allows, and lasts at least ``WAIT_TOL_US``: gloo's worker can close its annotation milliseconds after it
        released the waiting thread (it was descheduled on a busy CPU)."""
        nodes = self.m.nodes
        coll_ids = [n for n, _ in self.coll_nodes]
        colls = sorted((nodes[n].measured_end, n) for n in coll_ids)
        kern = sorted((nodes[k].measured_end, k) for k in self.kernel_nodes)
        off = self.off
        by_stream = {st: sorted(zip([e - off for e in at], of)) for st, (at, of) in self.host_ends.items() if at}
        for stream_key, ids in self.m.streams.items():
            if stream_key[0] != self.rank or not stream_key[1].startswith("host"):
                continue
            pools = [colls] + [v for st, v in by_stream.items() if st != stream_key[1]]
            for n in ids:
                node = nodes[n]
                if node.kind not in (GAP, SYNC):
                    continue
                best: tuple[float, int] | None = None
                for pool in (pools + [kern]) if node.kind == SYNC else pools:
                    j = bisect.bisect_right(pool, (node.measured_end, math.inf)) - 1
                    if j >= 0:
                        e, m = pool[j]
                        if node.measured_start < e and node.measured_end - e <= WAIT_TOL_US and (
                                best is None or e > best[0]):
                            best = (e, m)
                g_end = node.measured_end
                # (a blocked thread: a gap of microseconds between operators that happens to
                # span an arrival is not one, and would end the collective early)
                for c in coll_ids if node.measured_end - node.measured_start >= WAIT_TOL_US else ():
                    cn = nodes[c]
                    last = last_arrival[c]
                    if (cn.measured_start < g_end < cn.measured_end and last <= g_end
                            and g_end - last <= post[c] + WAIT_TOL_US and (best is None or g_end > best[0])):
                        best = (g_end, c)
                        continue
                    done = last + post[c]  # the quickest member's end after the last arrival
                    # the collective completed during the gap, which ended within a wake-up of
                    # that completion, or of its worker closing it on this rank:
                    # the thread was blocked on it (a busy CPU can take milliseconds to run
                    # the woken thread, and gloo's worker to close its annotation)
                    if (node.measured_start < done and done <= g_end <= max(done, cn.measured_end) + WAKE_MAX_US
                          and cn.measured_start < g_end and (best is None or done > best[0])):
                        best = (done, c)
                if best is None:
                    continue
                e, m = best
                node.kind = WAIT
                node.phase = "wait" if node.phase == "host" else node.phase
                node.deps += (m,)
                node.dur = node.measured_end - e  # collectives: set again from their completion


def clock_alignment(calls: Mapping[int, Sequence[CollectiveCall]],
                    hosts: Mapping[int, str | None] | None = None) -> dict[int, float]:
    """Each rank's clock offset from the lowest rank's (a time of rank r less its offset is
    on the lowest rank's clock), from the ends of the ranks' collectives in their profiled
    windows (``collectives.clock_offsets``); ranks on the host of the lowest rank share its
    clock (offset 0); ``hosts`` None when not every rank's host is known."""
    offsets = clock_offsets({r: end_times(c) for r, c in calls.items()})
    if hosts and calls:
        ref = hosts.get(min(calls))
        for r in calls:
            if ref is not None and hosts.get(r) == ref:
                offsets[r] = 0.0  # one clock: aligning would hide a rank's late arrival
    return offsets


MAX_NODES = 4_000_000
"""The most operations a replay model may hold: the 1,024-rank benchmark's 3.2 million
peaked at 1.8 GB in the central analysis (about 550 bytes each, with the replays)."""


class TooLarge(Exception):
    """The model would hold more than its budget of operations; the message says so."""


def build_model(traces: Mapping[int, Trace] | Iterable[tuple[int, Trace]], incomplete: Iterable[int] = (),
                hosts: Mapping[int, str | None] | None = None, ranks: int | None = None,
                max_nodes: int | None = None) -> Model:
    """The dependency model of the ranks' profiled windows. ``traces``: by rank, or
    (rank, trace) pairs in rank order, each let go once its rank is built (a job of
    1,024 ranks need not hold every trace at once). ``incomplete``: ranks whose window
    was cut short by the process exiting (their last step is left out). ``hosts``: each
    rank's host; ranks on the host of the lowest rank share its clock, the others (and all
    of them when hosts are not known) are aligned on the ends of their matched
    collectives (``collectives.clock_offsets``): each rank is built on its own clock and
    its nodes moved by its offset once every rank's collectives are known. Raises
    `TooLarge` as soon as the ranks built so far project more than ``max_nodes``
    operations over ``ranks`` ranks (a budget for memory, checked before the rest is
    read)."""
    model = Model([], {}, {}, {}, {}, {}, {})
    cut = set(incomplete)
    builders: dict[int, _RankBuilder] = {}
    worlds: list[int] = []
    pairs = sorted(traces.items()) if isinstance(traces, Mapping) else traces
    for r, t in pairs:
        if t.distributed:
            worlds.append(t.distributed.world_size or 0)
        steps, main = profiled_steps(t)
        if r in cut and len(steps) > 1:
            steps = steps[:-1]
        if not steps or main is None:
            model.notices.append(f"rank {r}: no ProfilerStep in the trace, left out of the replay")
            continue
        window = (steps[0].start_us, steps[-1].end_us)
        b = _RankBuilder(model, r, t, steps, main, collective_calls(t, steps, window), 0.0)
        b.build()
        del b.t  # what the model needs of the trace is in its nodes now
        builders[r] = b
        if max_nodes is not None and (projected := len(model.nodes) * max(ranks or 0, len(builders))
                                      / len(builders)) > max_nodes:
            raise TooLarge(f"the replay would hold about {projected:,.0f} operations "
                           f"({len(model.nodes) / len(builders):,.0f} per rank), more than its budget of "
                           f"{max_nodes:,} (memory)")
        model.measured_steps[r] = {sp.step: (steps[i + 1].start_us if i + 1 < len(steps) else sp.end_us)
                                   - sp.start_us for i, sp in enumerate(steps)}
    t = None  # (the last trace, too)
    offsets = clock_alignment({r: b.calls for r, b in builders.items()}, hosts)
    nodes = model.nodes
    for r, b in builders.items():
        off = b.off = offsets.get(r, 0.0)
        model.origin[r] = b.steps[0].start_us - off
        for ids in b._stream_ids.values() if off else ():  # (its rank's streams)
            for i in ids:
                n = nodes[i]
                n.measured_start -= off
                n.measured_end -= off
    world = max(worlds + [len(builders)])
    # collectives: matched when every rank analysed has the key with one op and one size
    colls = [i for i, n in enumerate(nodes) if n.kind == COLL]  # (a few of millions of nodes)
    members: dict[Key, list[int]] = defaultdict(list)
    for i in colls:
        if (k := nodes[i].key) is not None:
            members[k].append(i)
    for k, ids in members.items():
        ops = {model.nodes[i].name for i in ids}
        sizes = {g for i in ids if (g := model.nodes[i].group_size) is not None}
        # only a group whose members are all here can be replayed as one synchronisation
        # (a trace that names no group size: the job's world size, when the trace says it)
        whole = (max(sizes) if sizes else world) <= len(ids)
        if len(ids) == len(builders) > 1 and len(ops) == 1 and whole:
            model.groups[k] = ids
        else:
            for i in ids:  # seen on one rank, or the ranks disagree: a local op of its measured length
                model.nodes[i].key = None
    # per collective node: the last member's arrival, and the quickest member's end after it
    last_arrival: dict[int, float] = {}
    post: dict[int, float] = {}
    for i in colls:  # once per group: a group's members share the figures
        n = nodes[i]
        if i not in last_arrival:
            ids = model.groups.get(n.key, [i]) if n.key is not None else [i]
            arrived = max(nodes[m].measured_start for m in ids)
            first_end = max(min(nodes[m].measured_end for m in ids) - arrived, 0.0)
            for m in ids:
                last_arrival[m], post[m] = arrived, first_end
    for b in builders.values():
        b.waits(last_arrival, post)
    # a collective is complete at the first sign of it on any member: an annotation's end
    # or a thread it released; from the last arrival to then is its transfer time
    woken: dict[int, float] = {}
    waits = [n for n in nodes if n.kind == WAIT]
    for n in waits:
        if nodes[n.deps[0]].kind == COLL:
            d = n.deps[0]
            woken[d] = min(woken.get(d, math.inf), n.measured_end)
    settled: set[int] = set()
    for i in colls:
        n = nodes[i]
        if i not in settled:
            ids = model.groups.get(n.key, [i]) if n.key is not None else [i]
            done = min([nodes[m].measured_end for m in ids] + [woken.get(m, math.inf) for m in ids])
            for m in ids:
                nm = nodes[m]
                nm.done = max(done, last_arrival[m])
                nm.transfer = nm.dur = nm.done - last_arrival[m]
                settled.add(m)
    # a wait that ends long after the collective it was matched to completed (its worker
    # closed the annotation late) waited for the rank's collective that completed last
    # before it ended: the loop waits for DDP's buckets one after another
    done_by_rank: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for i in colls:
        n = nodes[i]
        if n.done is not None:
            done_by_rank[n.rank].append((n.done, i))
    for v in done_by_rank.values():
        v.sort()
    for n in waits:
        if nodes[n.deps[0]].kind == COLL:
            wake = n.measured_end - (nodes[n.deps[0]].done or 0.0)
            if wake > WAIT_TOL_US:
                pool = done_by_rank[n.rank]
                j = bisect.bisect_right(pool, (n.measured_end, math.inf)) - 1
                while j >= 0 and pool[j][0] > max(nodes[n.deps[0]].done or 0.0, n.measured_start):
                    c = nodes[pool[j][1]]
                    # issued before the wait began (a collective issued later cannot be what it waited for)
                    if all(nodes[d].measured_end <= n.measured_start + 1e-6 for d in c.deps):
                        n.deps = (pool[j][1], *n.deps[1:])
                        break
                    j -= 1
            # (a collective done before the wait began: the wait is its whole length)
            n.dur = max(n.measured_end - max(nodes[n.deps[0]].done or 0.0, n.measured_start), 0.0)
    # a measured delay before each non-host operation: what its dependencies do not explain
    for (r, stream), ids in model.streams.items():
        if stream == "host":
            continue
        prev_end = model.origin[r]
        for i in ids:
            n = nodes[i]
            ready = prev_end
            for d in n.deps:
                nd = nodes[d]
                at = nd.done if nd.done is not None else nd.measured_end
                if at > ready:
                    ready = at
            if n.kind in (COLL, KERNEL):
                n.delay = max(n.measured_start - ready, 0.0)
            prev_end = n.done if n.done is not None else n.measured_end
    return model


# ------------------------------------------------------------------------------ replay
@dataclass
class _Applied:
    """The model's timing with edits applied: durations, delays before operations, whether
    collectives skip the cross-rank wait, and operations an edit merged into another
    (``gone``: node -> the node that now does its work; what waited for it waits for that)."""

    dur: list[float]
    delay: list[float]
    no_sync: bool = False
    gone: dict[int, int] = field(default_factory=dict)
    accumulate: int = 1  # micro-batches per optimizer step (``Accumulate``)
    dropped: set[int] = field(default_factory=set)  # collectives that do not run (and sync no one)
    origin: dict[int, float] = field(default_factory=dict)  # rank -> its window's start, where an edit moved it


def _after_optimizer(model: Model) -> list[int]:
    """The host gaps that follow the optimizer's work on a rank's loop thread, up to the
    next work of another phase (the next micro-batch's input or forward): what the loop
    does once per optimizer step outside torch's operators (a scheduler, logging, a
    metrics push, a sleep), which a loop that accumulates does once per ``k`` micro-
    batches, as it does the optimizer. The healthy control sleeps 20 ms per optimizer
    step: with 4 micro-batches per step its time per micro-batch fell 59% (48.2 to 19.9
    and 50.2 to 20.4 ms), where the replay that kept the sleep in every micro-batch gave 34%."""
    nodes = model.nodes
    out: list[int] = []
    for (_, stream), ids in model.streams.items():
        if stream != "host":
            continue
        after = False
        for i in ids:
            n = nodes[i]
            if n.kind == WORK:
                after = n.phase == "optimizer"
            elif n.kind == GAP and after:
                out.append(i)
    return out


def _apply(model: Model, edits: Sequence[Edit], skip_sync: bool = False) -> _Applied:
    """The timing with ``edits`` applied, in order; ``skip_sync``: of a micro-batch that
    accumulates without syncing (``Accumulate``: its gradient collectives and optimizer
    dropped)."""
    nodes = model.nodes
    dur = [n.dur for n in nodes]
    delay = [n.delay for n in nodes]
    gone: dict[int, int] = {}
    no_sync = False
    accumulate = 1
    dropped: set[int] = set()
    origin: dict[int, float] = {}

    def ranks_of(rs: tuple[int, ...] | None) -> set[int]:
        return set(model.origin) if rs is None else set(rs)

    for ed in edits:
        if isinstance(ed, CollectivesAtTransfer):
            no_sync = True
            for i, n in enumerate(nodes):
                if n.transfer is not None:
                    dur[i] = n.transfer
        elif isinstance(ed, RemoveHostGaps):
            rs = ranks_of(ed.ranks)
            for i, n in enumerate(nodes):
                if n.kind == GAP and n.rank in rs:
                    dur[i] = 0.0
        elif isinstance(ed, ScaleCompute):
            rs = ranks_of(ed.ranks)
            # on a GPU the compute is the kernels; the host's operators only launch them
            gpu = {n.rank for n in nodes if n.kind == KERNEL}
            for i, n in enumerate(nodes):
                if n.rank in rs and ((n.kind == WORK and n.phase in COMPUTE_PHASES and n.rank not in gpu)
                                     or (n.kind == KERNEL and n.phase == "compute")):
                    dur[i] *= ed.factor
        elif isinstance(ed, RemoveInputWait):
            rs = ranks_of(ed.ranks)
            for r in rs:
                dl = [i for i in model.streams.get((r, "host"), []) if nodes[i].phase == "dataloader"]
                fetches = _fetches(nodes, dl)
                if not fetches:
                    continue
                fastest = min(sum(nodes[i].dur for i in f) for f in fetches)
                steps = model.measured_steps.get(r, {})
                for f in fetches:
                    total = sum(nodes[i].dur for i in f)
                    if ed.workers:
                        num = nodes[f[0]].step
                        step = steps.get(num) if num is not None else None
                        rest = max((step or total) - total, 0.0)
                        target = max(total / ed.workers - rest, 0.0) + max(ed.handover_us, 0.0)
                    else:
                        target = fastest
                    for i in f:
                        dur[i] = dur[i] * target / total if total > 0 else target / len(f)
        elif isinstance(ed, ScaleGemm):
            rs = ranks_of(ed.ranks)
            for i, n in enumerate(nodes):
                if n.rank in rs and n.gemm > 0 and ed.speedup > 0 and (
                        n.kind != KERNEL or gemm_dtype(n.name) in ed.dtypes):
                    dur[i] = max(dur[i] - n.gemm * (1 - 1 / ed.speedup), 0.0)
                if n.rank in rs and n.ew > 0 and ed.follower_speedup > 0:
                    dur[i] = max(dur[i] - n.ew * (1 - 1 / ed.follower_speedup), 0.0)
        elif isinstance(ed, Accumulate):
            accumulate = max(int(ed.k), 1)
            if skip_sync and accumulate > 1:
                for i in _after_optimizer(model):  # the loop's own per-step work goes with the optimizer
                    dur[i] = 0.0
                for i, n in enumerate(nodes):
                    if n.kind == WORK and n.phase == "optimizer":
                        dur[i] = 0.0
                    elif n.kind == WORK and n.reducer > 0:  # no_sync: DDP's reducer copies nothing
                        dur[i] = max(dur[i] - n.reducer, 0.0)
                    elif n.kind == COLL and any(nodes[d].phase == "backward" for d in n.deps):
                        dur[i] = delay[i] = 0.0
                        dropped.add(i)
                _accumulating_backward(model, dict(ed.refault_us), dict(ed.add_us), dur)
        elif isinstance(ed, RegroupBuckets):
            _regroup(model, ed, dur, delay, gone)
        elif isinstance(ed, UncontendedCollectives):
            _uncontended(model, ed, dur, delay)
        elif isinstance(ed, ScalePhase):
            rs = ranks_of(ed.ranks)
            for i, n in enumerate(nodes):
                if n.rank in rs and n.kind == WORK and n.phase == ed.phase:
                    dur[i] *= ed.factor
        elif isinstance(ed, Straggler):
            peers = [r for r in model.origin if r != ed.rank]
            if not peers or ed.rank not in model.origin:
                continue
            # step by step: a window-wide ratio let one odd step (the first profiled
            # one's 2x backward) set every other step's phase below its peers'
            mine = _phase_totals(model, ed.rank)
            theirs = [_phase_totals(model, p) for p in peers]
            mine_at = _phase_totals_by_step(model, ed.rank)
            theirs_at = [_phase_totals_by_step(model, p) for p in peers]
            late = _late_phases(model, ed.rank, mine, theirs, every=ed.every_phase)
            # a straggler that began the window after its peers did so for its slowness in
            # the step before: without it, it begins with them
            start = statistics.median(model.origin[p] for p in peers)
            if model.origin[ed.rank] > start:
                origin[ed.rank] = start
            for i, n in enumerate(nodes):
                if n.rank != ed.rank or n.kind == COLL:
                    continue
                ph = (n.kind, n.phase)
                if ph not in late:
                    continue
                at = (n.step, n.kind, n.phase)
                if n.step is not None and mine_at.get(at, 0.0) > 0 and all(n.step in t[None] for t in theirs_at):
                    dur[i] *= statistics.median(t.get(at, 0.0) for t in theirs_at) / mine_at[at]
                elif mine.get(ph, 0.0) > 0:
                    dur[i] *= statistics.median(t.get(ph, 0.0) for t in theirs) / mine[ph]
    return _Applied(dur, delay, no_sync, gone, accumulate, dropped, origin)


REFAULT_MAX_SHARE = 0.9
"""Of a step's backward work on a rank, the most ``Accumulate.refault_us`` takes off."""


def _accumulating_backward(model: Model, less: Mapping[int, float], more: Mapping[int, float],
                           dur: list[float]) -> None:
    """``Accumulate.refault_us`` and ``add_us``, in place: each step's backward work on
    the rank's host stream shortened by the one and lengthened by the other, in
    proportion to each operation's."""
    nodes = model.nodes
    for r in set(less) | set(more):
        minus, plus = max(less.get(r, 0.0), 0.0), max(more.get(r, 0.0), 0.0)
        if not minus and not plus:
            continue
        by_step: dict[int | None, list[int]] = defaultdict(list)
        for i in model.streams.get((r, "host"), []):
            n = nodes[i]
            if n.kind == WORK and n.phase == "backward":
                by_step[n.step].append(i)
        for ids in by_step.values():
            total = sum(dur[i] for i in ids)
            if total <= 0:
                continue
            scale = 1 + (plus - min(minus, REFAULT_MAX_SHARE * total)) / total
            for i in ids:
                dur[i] *= scale


def _uncontended(model: Model, ed: UncontendedCollectives, dur: list[float], delay: list[float]) -> None:
    """``UncontendedCollectives``: in place."""
    nodes = model.nodes
    hit = set(ed.ranks)
    peer_delays = [delay[i] for i, n in enumerate(nodes) if n.kind == COLL and n.rank not in hit]
    cap = statistics.median(peer_delays) if peer_delays else None
    peers = set(model.origin) - hit
    if peers:
        wakes = [dur[i] for i, n in enumerate(nodes) if n.kind == WAIT and n.rank in peers]
        wake_cap = statistics.median(wakes) if wakes else 0.0  # peers with no wait woke at once
        for i, n in enumerate(nodes):
            if n.kind == WAIT and n.rank in hit:
                dur[i] = min(dur[i], wake_cap)
    for ids in model.groups.values():
        if not any(nodes[m].rank in hit for m in ids):
            continue
        for m in ids:
            n = nodes[m]
            if n.name.startswith("all_reduce") and n.bytes:
                dur[m] = min(dur[m], ed.alpha_us + n.bytes * ed.beta_us_per_byte)
            if cap is not None and n.rank in hit:
                delay[m] = min(delay[m], cap)


def _regroup(model: Model, ed: RegroupBuckets, dur: list[float], delay: list[float], gone: dict[int, int]) -> None:
    """``RegroupBuckets``: per rank and step, the all-reduces in issue order (on all of
    the rank's collective streams: gloo alternates between two worker threads) packed
    under the cap; every call but the last of a pack is gone (no time, no delay), the last
    one lasts the pack's time, picked up after the calls' median delay. A pack closes once
    it holds ``cap_bytes`` or more (DDP's rule, as `levers.packed_buckets` counts). It closes
    before a call that its rank issues after it waited for one of the pack's calls (a
    host node that depends on it: DDP's finalize, or a gap that ended when that call
    completed): DDP could not have put them in one bucket, and the merged call would
    wait for itself."""
    nodes = model.nodes
    # per node of a rank's main host stream (where DDP issues and waits), its position
    # there; per collective, the first position that waits for it
    host_pos: dict[int, int] = {}
    for (r, stream), ids in model.streams.items():
        if stream == "host":
            for at, i in enumerate(ids):
                host_pos[i] = at
    first_waiter: dict[int, int] = {}
    for i, at in host_pos.items():
        for d in nodes[i].deps:
            if nodes[d].kind == COLL and at < first_waiter.get(d, 1 << 62):
                first_waiter[d] = at

    def issued_at(i: int) -> int:
        return max((host_pos[d] for d in nodes[i].deps if d in host_pos), default=-1)

    by_step: dict[tuple[int, int | None], list[int]] = defaultdict(list)
    for (r, stream), ids in model.streams.items():
        if stream.startswith("host"):
            continue
        for i in ids:
            n = nodes[i]
            if n.kind == COLL and n.name.startswith("all_reduce") and n.bytes:
                by_step[(r, n.step)].append(i)
    # the curve at the level of the job's own calls: the median of their measured time over
    # what the curve gives them (a median: a call the CPU's scheduler held for milliseconds
    # is a delay of its own, not its size's)
    ratios = [dur[i] / p for calls in by_step.values() for i in calls
              if (p := ed.alpha_us + (nodes[i].bytes or 0) * ed.beta_us_per_byte) > 0]
    level = statistics.median(ratios) if ratios else 1.0
    pickup = statistics.median(delay[i] for calls in by_step.values() for i in calls) if by_step else 0.0
    for calls in by_step.values():
        calls.sort(key=lambda i: (nodes[i].measured_start, i))
        for pack in _packs(calls, nodes, ed.cap_bytes, issued_at, first_waiter):
            if len(pack) > 1:
                for j in pack[:-1]:
                    dur[j] = delay[j] = 0.0
                    gone[j] = pack[-1]
                size = sum(nodes[j].bytes or 0 for j in pack)
                dur[pack[-1]] = (ed.alpha_us + size * ed.beta_us_per_byte) * level
                delay[pack[-1]] = pickup


def _packs(calls: Sequence[int], nodes: Sequence[Node], cap_bytes: int, issued_at: Callable[[int], int],
           first_waiter: Mapping[int, int]) -> list[list[int]]:
    """A step's all-reduces (in issue order) cut into packs as DDP fills buckets: a call
    joins the open pack, which closes once it holds ``cap_bytes`` or more; a call issued
    after its rank waited for one of the open pack's calls starts a new one."""
    packs: list[list[int]] = []
    pack: list[int] = []
    size = 0
    waited = 1 << 62  # the first host position that waits for a call of the open pack
    for i in calls:
        if pack and issued_at(i) >= waited:
            packs.append(pack)
            pack, size, waited = [], 0, 1 << 62
        pack.append(i)
        size += nodes[i].bytes or 0
        waited = min(waited, first_waiter.get(i, 1 << 62))
        if size >= cap_bytes:
            packs.append(pack)
            pack, size, waited = [], 0, 1 << 62
    if pack:
        packs.append(pack)
    return packs


def _fetches(nodes: list[Node], ids: list[int]) -> list[list[int]]:
    """Consecutive DataLoader segments grouped into fetches."""
    out: list[list[int]] = []
    for i in ids:
        if out and abs(nodes[out[-1][-1]].measured_end - nodes[i].measured_start) < 1e-6:
            out[-1].append(i)
        else:
            out.append([i])
    return out


STRAGGLER_PHASE_SHARE = 0.05
"""A straggler's phase (host gaps, forward, backward, ...) is set to its peers' when its
excess over their median, over the window, is at least this share of the straggler's
window: the phases that made it late. The others keep their measured durations and
their step-to-step variation: copied from a peer they would move in lock-step with it,
and the edited step would miss what waiting for the later of two noisy ranks costs (on
the 2-rank sleep job, 12.4 ms replayed against 15.0 ms run without the sleep)."""


def _late_phases(model: Model, rank: int, mine: Mapping[tuple[str, str], float],
                 theirs: Sequence[Mapping[tuple[str, str], float]], every: bool = False) -> set[tuple[str, str]]:
    """The (kind, phase) pairs of ``rank`` that ``STRAGGLER_PHASE_SHARE`` counts as late;
    every phase where none is (many small excesses: a slower host) or with ``every``. Its
    waits always: a wait keeps only the wake-up after what it waited for, which is not
    the rank's own work and barely varies when nothing delays it (0.06-0.2 ms per wake-up
    on the straggler job's peers and on both ranks with the straggler fixed), so copying
    the peers' moves nothing in lock-step."""
    window = sum(model.measured_steps.get(rank, {}).values())
    excess = {ph: v - statistics.median(t.get(ph, 0.0) for t in theirs) for ph, v in mine.items()
              if ph[0] != COLL}
    if every:
        return set(excess)
    late = {ph for ph, x in excess.items() if window > 0 and x >= STRAGGLER_PHASE_SHARE * window}
    return (late or set(excess)) | {ph for ph in excess if ph[0] == WAIT}


def _phase_totals(model: Model, rank: int) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = defaultdict(float)
    for (r, _s), ids in model.streams.items():
        if r == rank:
            for i in ids:
                n = model.nodes[i]
                out[(n.kind, n.phase)] += n.dur
    return out


def _phase_totals_by_step(model: Model, rank: int) -> dict[Any, Any]:
    """Per (step, kind, phase) the rank's total; under the key None, the steps it has."""
    out: dict[Any, Any] = defaultdict(float)
    for (r, _s), ids in model.streams.items():
        if r == rank:
            for i in ids:
                n = model.nodes[i]
                if n.step is not None:
                    out[(n.step, n.kind, n.phase)] += n.dur
    out[None] = {st for st, _ in model.steps.get(rank, [])}
    return out



def without_run_queue(model: Model, excess_us: Mapping[int, Mapping[int, float]]) -> Model:
    """The model with each rank's host time spent on the run queue beyond its usual taken
    out: ``excess_us[rank][step]`` is the time the rank's training thread was runnable but
    waited for a core in that profiled step, less its median over the job's unprofiled
    steps (steps.jsonl ``runq_us``). It is taken from the phases (kind and phase of its
    loop's thread: a forward, a fetch, a wake-up) that ran longer in that step than their
    median over the window's steps, the longest excess first, each by at most its excess:
    a preemption lengthens the one operation it fell in. On a 2-core host the straggler's
    peer ran its forward in 4.99 ms in a step whose run-queue time was 4.16 ms (0.75-0.85
    ms in the window's other steps), and a fetch in 4.74 ms (0.48-0.56) in one of 3.98 ms.
    Waiting for the straggler hid both; once the straggler's edit has nobody wait, the
    edited window kept them, where the job's own steps wait 0.00-0.13 ms on the run queue.
    Only edited replays and their baseline read it: the replay error is that of the
    model as measured. The nodes are copies; the model's are untouched."""
    nodes = list(model.nodes)
    changed = False
    for rank, per_step in excess_us.items():
        by_step: dict[int, dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(list))
        for i in model.streams.get((rank, "host"), []):
            n = nodes[i]
            if n.step is not None and n.kind in (WORK, GAP, WAIT) and n.dur > 0:
                by_step[n.step][(n.kind, n.phase)].append(i)
        if len(by_step) < 2:
            continue  # one step: no usual length of a phase to tell the excess by
        totals = {st: {ph: sum(nodes[i].dur for i in ids) for ph, ids in phases.items()}
                  for st, phases in by_step.items()}
        usual = {ph: min(t.get(ph, 0.0) for t in totals.values()) for ph in {ph for t in totals.values() for ph in t}}
        for st, x in per_step.items():
            if x <= 0 or st not in totals:
                continue
            over = sorted(((v - usual[ph], ph) for ph, v in totals[st].items() if v > usual[ph]), reverse=True)
            for extra, ph in over:
                if x <= 0:
                    break
                cut = min(extra, x)
                x -= cut
                keep = (totals[st][ph] - cut) / totals[st][ph]
                for i in by_step[st][ph]:
                    nodes[i] = replace(nodes[i], dur=nodes[i].dur * keep)
                changed = True
    if not changed:
        return model
    return replace(model, nodes=nodes, base_load=None)

@dataclass(frozen=True)
class Timeline:
    """Each node's replayed start and end, and what set its start: the node whose end
    it waited for (-1: its rank's origin; <= -2: a collective that waited for member
    ``-2 - why``)."""

    start: Sequence[float]
    end: Sequence[float]
    why: Sequence[int]


def _step_lengths(model: Model, tl: Timeline) -> dict[int, dict[int, float]]:
    replayed: dict[int, dict[int, float]] = {}
    for r, firsts in model.steps.items():
        bounds = [tl.start[i] for _, i in firsts] + [tl.end[model.window_end[r]]]
        replayed[r] = {st: bounds[j + 1] - bounds[j] for j, (st, _) in enumerate(firsts)}
    return replayed


def replay(model: Model, edits: Sequence[Edit] = ()) -> ReplayResult:
    """Re-time the model (with ``edits`` applied) and measure its steps. With
    ``Accumulate(k)``: each step is the mean of one micro-batch that syncs and ``k - 1``
    that do not (the critical path: the one that syncs)."""
    tl = timeline(model, edits)
    replayed = _step_lengths(model, tl)
    k = max((int(e.k) for e in edits if isinstance(e, Accumulate)), default=1)
    if k > 1:
        quiet = _step_lengths(model, timeline(model, edits, skip_sync=True))
        replayed = {r: {st: (v + (k - 1) * quiet.get(r, {}).get(st, v)) / k for st, v in steps.items()}
                    for r, steps in replayed.items()}
    paths = _critical_paths(model, tl.start, tl.end, tl.why, replayed)
    return ReplayResult(replayed, {r: dict(v) for r, v in model.measured_steps.items()}, paths)


SHARING_ROUNDS = 4
"""Re-timings of an edited replay for the cores its ranks share (``_shared_durations``)."""


def timeline(model: Model, edits: Sequence[Edit] = (), skip_sync: bool = False) -> Timeline:
    """The replayed times of every node (with ``edits`` applied; ``skip_sync``: as a
    micro-batch that accumulates without syncing). With ``model.sharing`` (ranks on the
    CPUs of shared hosts) and edits, the edited operations are re-timed for the cores
    they find busy, a few rounds to a fixed point."""
    ap = _apply(model, edits, skip_sync)
    tl = _schedule(model, ap, ap.dur)
    if model.sharing is None or not edits:
        return tl
    base = _base_load(model)
    if base is None:
        return tl
    dur = ap.dur
    for _ in range(SHARING_ROUNDS):
        now = _load_factors(model, tl, dur)
        dur = [d * now[i] / base[i] if base[i] > 0 else d for i, d in enumerate(ap.dur)]
        tl = _schedule(model, ap, dur)
    return tl


def _base_load(model: Model) -> list[float] | None:
    """Each node's load factor in the unedited replay (cached on the model)."""
    if model.base_load is None:
        ap = _apply(model, ())
        model.base_load = _load_factors(model, _schedule(model, ap, ap.dur), ap.dur)
    return model.base_load


def _load_factors(model: Model, tl: Timeline, dur: Sequence[float]) -> list[float]:
    """Per node, how many times slower than alone its host's cores ran it: the mean over
    its span of max(1, busy threads / cores). Busy: a rank's operators on its training
    thread (its intra-op threads, at most the cores) and each collective from the last
    member's arrival to its end (its worker thread: gloo reduces and copies on the CPU).
    Host gaps and waits count as idle (a sleep burns nothing; what does is not known).
    Nodes that are neither get 1."""
    sh = model.sharing
    assert sh is not None
    nodes = model.nodes
    out = [1.0] * len(nodes)
    spans: dict[str, list[tuple[float, float, float, int]]] = defaultdict(list)
    for i, nd in enumerate(nodes):
        h = sh.host.get(nd.rank)
        if h is None or math.isnan(tl.start[i]):
            continue
        if nd.kind == WORK and nd.stream == "host":
            threads = float(min(sh.threads.get(nd.rank, 1), sh.cores.get(h, 1)))
            spans[h].append((tl.start[i], tl.end[i], threads, i))
        elif nd.kind == COLL:
            spans[h].append((max(tl.end[i] - dur[i], tl.start[i]), tl.end[i], 1.0, i))
    for h, sp in spans.items():
        cores = float(max(sh.cores.get(h, 1), 1))
        a = np.array([x[0] for x in sp])
        b = np.array([x[1] for x in sp])
        w = np.array([x[2] for x in sp])
        edges = np.unique(np.concatenate([a, b]))
        if len(edges) < 2:
            continue
        delta = np.zeros(len(edges))
        np.add.at(delta, np.searchsorted(edges, a), w)
        np.add.at(delta, np.searchsorted(edges, b), -w)
        busy = np.cumsum(delta)[:-1]  # per segment [edges[j], edges[j+1])
        slow = np.maximum(1.0, busy / cores) * np.diff(edges)
        cum = np.concatenate([[0.0], np.cumsum(slow)])
        ia, ib = np.searchsorted(edges, a), np.searchsorted(edges, b)
        for (s0, e0, _w, i), j0, j1 in zip(sp, ia, ib):
            if e0 > s0:
                out[i] = float((cum[j1] - cum[j0]) / (e0 - s0))
    return out


def _schedule(model: Model, ap: _Applied, dur: Sequence[float]) -> Timeline:
    """Start and end of every node with these durations (``ap``: the edits' delays,
    merged and dropped collectives)."""
    nodes = model.nodes
    delay, gone = ap.delay, ap.gone
    n = len(nodes)
    # typed arrays, not lists of float objects: a job of 1,024 ranks has 3.2 million
    # nodes, and a replay's lists of them held about 600 MB of its 2.4 GB peak
    start = array("d", [math.nan]) * n
    end = array("d", [math.nan]) * n
    arrival = array("d", [math.nan]) * n  # (NaN: not arrived)
    why = array("q", [-1]) * n  # the node whose end set this node's start (-1: stream order / origin)
    # a collective merged into another no longer synchronises the ranks; what waited
    # for it waits for the one that does its work
    member_of = ({} if ap.no_sync else
                 {i: k for k, ids in model.groups.items()
                  if not any(m in gone or m in ap.dropped for m in ids) for i in ids})
    deps = [[gone.get(d, d) for d in nd.deps] if gone else nd.deps for nd in nodes]
    ptr = {s: 0 for s in model.streams}
    pending = sum(len(v) for v in model.streams.values())
    while pending:
        progress = False
        for s, ids in model.streams.items():
            while ptr[s] < len(ids):
                i = ids[ptr[s]]
                node = nodes[i]
                if math.isnan(arrival[i]):
                    if any(math.isnan(end[d]) for d in deps[i]):
                        break
                    prev = ids[ptr[s] - 1] if ptr[s] else -1
                    ready, cause = (end[prev], prev) if prev >= 0 else (
                        ap.origin.get(node.rank, model.origin[node.rank]), -1)
                    for d in deps[i]:
                        if end[d] > ready:
                            ready, cause = end[d], d
                    arrival[i] = ready + delay[i]
                    why[i] = cause
                k = member_of.get(i)
                if k is None:
                    start[i] = arrival[i]
                    end[i] = start[i] + dur[i]
                elif math.isnan(end[i]):
                    ids_k = model.groups[k]
                    if any(math.isnan(arrival[m]) for m in ids_k):
                        break
                    last = max(ids_k, key=lambda m: arrival[m])
                    for m in ids_k:
                        start[m] = arrival[m]
                        end[m] = arrival[last] + dur[m]
                        if m != last:
                            why[m] = -2 - last  # waited for `last`'s arrival
                ptr[s] += 1
                pending -= 1
                progress = True
        if not progress:
            raise ValueError("the replay is stuck: a dependency cycle in the model")
    return Timeline(start, end, why)


@dataclass(frozen=True)
class PathSegment:
    """A node on a step's critical path and the part of it on the path, in replayed time
    (a collective that waited for a later member is not on it: the path goes through that
    member's arrival)."""

    node: int
    start_us: float
    end_us: float


def _path_segments(model: Model, start: Sequence[float], end: Sequence[float],
                   why: Sequence[int]) -> dict[int, tuple[int, list[PathSegment]]]:
    """Per step: the rank whose step ended last, and the segments of the path that ended
    it, from the end of the step back to its start (last first)."""
    nodes = model.nodes
    out: dict[int, tuple[int, list[PathSegment]]] = {}
    step_bounds: dict[int, dict[int, tuple[float, int]]] = {}
    for r, firsts in model.steps.items():
        host = model.streams[(r, "host")]
        pos = {i: j for j, i in enumerate(host)}
        bd = {}
        for j, (st, first) in enumerate(firsts):
            last = host[pos[firsts[j + 1][1]] - 1] if j + 1 < len(firsts) else model.window_end[r]
            bd[st] = (start[first], last)
        step_bounds[r] = bd
    all_steps = sorted({st for bd in step_bounds.values() for st in bd})
    for st in all_steps:
        cands = [(end[bd[st][1]], r) for r, bd in step_bounds.items() if st in bd]
        _, rank = max(cands)
        t0, i = step_bounds[rank][st]
        segments: list[PathSegment] = []
        seen = 0
        while i >= 0 and end[i] > t0 and seen <= len(nodes):
            seen += 1
            w = why[i]
            if w <= -2:  # it waited for the last member to arrive: the path goes through that one
                i = -2 - w
                continue
            lo = max(end[w] if w >= 0 else start[i] - nodes[i].delay, t0)
            segments.append(PathSegment(i, lo, end[i]))
            i = w
        out[st] = (rank, segments)
    return out


def _critical_paths(model: Model, start: Sequence[float], end: Sequence[float], why: Sequence[int],
                    replayed: dict[int, dict[int, float]]) -> dict[int, CriticalPath]:
    nodes = model.nodes
    out: dict[int, CriticalPath] = {}
    for st, (rank, segments) in _path_segments(model, start, end, why).items():
        by_rank: dict[int, float] = defaultdict(float)
        by_phase: dict[str, float] = defaultdict(float)
        by_coll: dict[str, float] = defaultdict(float)
        for seg in segments:
            node = nodes[seg.node]
            span = max(seg.end_us - seg.start_us, 0.0)
            by_rank[node.rank] += span
            by_phase[node.phase] += span
            if node.kind == COLL:
                by_coll[node.name] += span
        out[st] = CriticalPath(st, rank, {r: v for r, v in by_rank.items() if v > 0},
                               {p: v for p, v in by_phase.items() if v > 0}, {c: v for c, v in by_coll.items() if v > 0})
    return out


def critical_path_segments(model: Model) -> dict[int, tuple[int, list[PathSegment]]]:
    """The measured window's critical paths (the replay with no edit), per step: the rank
    whose step ended last and the path's segments, from the step's end back to its start."""
    tl = timeline(model)
    return _path_segments(model, tl.start, tl.end, tl.why)


def what_if(model: Model, edits: Sequence[Edit], bound: float = MAX_ERROR) -> WhatIfResult:
    """The projected step with each edit alone and with all of them in one replay."""
    base = replay(model)
    b = base.replayed_step_us

    def one(eds: tuple[Edit, ...]) -> WhatIf:
        s = replay(model, eds).replayed_step_us
        return WhatIf(eds, s, (b - s) / b if b > 0 else 0.0)

    return WhatIfResult(b, base.measured_step_us, base.error, base.refusal(bound),
                        tuple(one((e,)) for e in edits), one(tuple(edits)))


# ------------------------------------------------------------------------------ runs
def load_run(path: str) -> Model:
    """The model of a run directory or a folder of traces (or one trace file). Raises
    ``UserError`` (one line) for a path that holds no readable trace."""
    from pathlib import Path

    from pardiag.analysis import Notice
    from pardiag.analyzers.pipeline import find_inputs
    from pardiag.errors import UserError

    notices: list[Notice] = []
    _run, inputs = find_inputs(Path(path), notices)
    found = [(i.rank, i.trace, i.trace_complete) for i in inputs if i.trace is not None]
    if not found:
        raise UserError(f"{path}: no trace to replay")
    model = model_of(found)
    model.notices[:0] = [n.message for n in notices]
    return model


def model_of(found: Sequence[tuple[int, object, bool]], max_nodes: int | None = MAX_NODES) -> Model:
    """The model of the given (rank, trace path, complete) traces. Raises ``UserError``
    for an unreadable trace, `TooLarge` past ``max_nodes`` operations."""
    from pardiag.analyzers.trace import TraceError, gc_paused, trace_head
    from pardiag.errors import UserError

    found = sorted(found, key=lambda x: x[0])
    with gc_paused():
        hosts = {r: _host_of(trace_head(p)) for r, p, _ in found}  # type: ignore[arg-type]
        try:
            return build_model(_load_all([(r, p) for r, p, _ in found]),
                               incomplete=[r for r, _, complete in found if not complete],
                               hosts=hosts if all(hosts.values()) else None, ranks=len(found), max_nodes=max_nodes)
        except TraceError as exc:
            raise UserError(str(exc)) from None


def _load_all(found: Sequence[tuple[int, object]]) -> Iterator[tuple[int, Trace]]:
    """Every rank's trace, in the order given, one at a time: a large one decoded on every
    core, many small ones spread over the cores (forked processes, Linux; at most a few
    per core decoded ahead); raises `TraceError` for the first that cannot be read."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from pardiag.analyzers import trace_parallel
    from pardiag.analyzers.trace import load_trace

    cores = trace_parallel.cores()
    if len(found) < 2 * cores or not trace_parallel.can_fork():
        for r, p in found:
            yield r, load_trace(p)  # type: ignore[arg-type]
        return
    ahead = 2 * cores
    with ProcessPoolExecutor(max_workers=cores, mp_context=multiprocessing.get_context("fork")) as pool:
        pending = deque((r, pool.submit(_load_one, str(p))) for r, p in found[:ahead])
        rest = iter(found[ahead:])
        try:
            while pending:
                r, fut = pending.popleft()
                nxt = next(rest, None)
                if nxt is not None:
                    pending.append((nxt[0], pool.submit(_load_one, str(nxt[1]))))
                yield r, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()


def _load_one(path: str) -> Trace:
    from pardiag.analyzers.trace import load_trace

    return load_trace(path, workers=1)


def _host_of(head: Mapping[str, object]) -> str | None:
    h = head.get("host_name")
    return h if isinstance(h, str) and h else None
