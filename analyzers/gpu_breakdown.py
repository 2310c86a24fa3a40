"""Per-rank GPU time breakdown with exactly HTA's scope and definitions.

HTA 0.5 (``TraceAnalysis(trace_dir)`` then ``get_temporal_breakdown()`` and
``get_comm_comp_overlap()``) computes, per rank:

Scope (``hta/common/trace.py``, ``hta/common/trace_parser.py``):

* Events without a ``dur`` or a ``cat``, and the ``Trace`` span, are dropped.
* Nanosecond traces: when any ``ts`` is a JSON float (or missing), every event is
  rounded inward to whole microseconds: ``ts = ceil(ts)``, ``end = floor(ts + dur)``,
  ``dur = end - ts`` (a sub-microsecond kernel can get ``end < ts``; it is kept).
* Times are shifted so that the earliest remaining event starts at 0.
* With more than one distinct ``ProfilerStep#N`` name, the last step is dropped:
  GPU events are those with ``stream >= 0`` and ``correlation >= 0`` (plus events
  named ``Event Sync``/``Context Sync``); every other event counts as CPU. CPU events
  are kept when they start before the last ``ProfilerStep`` starts, and a GPU event
  is kept only if a kept CPU event carries its ``correlation`` id (its launch).
* The breakdown then takes every kept event with ``stream != -1``: all kernels,
  copies and memsets of all streams, not one training step.

Definitions (``hta/analyzers/breakdown_analysis.py``, ``communication_analysis.py``,
``hta/utils/utils.py: merge_kernel_intervals``), with intervals merged by
sort + cumulative max (touching intervals merge):

* ``kernel_time`` = end of the last merged interval - start of the first (span_us);
* ``idle_time`` = kernel_time - length of the union of all events (idle_us);
* ``compute_time`` = length of the union of COMPUTATION kernels (compute_us);
* ``non_compute_time`` = kernel_time - compute_time - idle_time (non_compute_us):
  communication and copies that do not run under compute;
* ``comp_comm_overlap_ratio`` = time where the union of COMMUNICATION kernels and
  the union of COMPUTATION kernels are both active (overlap_us) / length of the
  union of COMMUNICATION kernels (comm_us).

Kernel kinds come from ``pardiag.analyzers.kernels`` (HTA's rows, plus names of NCCL
kernels HTA 0.5 misses, plus memcpy/memset categories); pass
``rules=kernels.HTA_RULES, memory_by_category=False`` for HTA's table alone.
pardiag adds memory_us (union of MEMORY events) and kernel_us (union of all events).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from pardiag.analyzers import intervals
from pardiag.analyzers.kernels import RULES, KernelKind, KernelRule, event_kinds
from pardiag.analyzers.trace import SYNC_EVENT_NAMES, Trace


@dataclass(frozen=True)
class GpuBreakdown:
    """One rank's GPU time, microseconds, over every GPU event in HTA's scope."""

    span_us: float  # first start to last end (HTA's kernel_time)
    kernel_us: float  # at least one event running (span_us - idle_us)
    idle_us: float  # no event running
    compute_us: float  # union of computation kernels
    comm_us: float  # union of communication kernels
    overlap_us: float  # communication running under computation
    memory_us: float  # union of memcpy/memset events
    events: int  # GPU events in scope
    events_dropped: int  # GPU events left out (last profiler step, no launch)

    @property
    def non_compute_us(self) -> float:
        """HTA's non_compute_time: busy time with no computation kernel running."""
        return self.span_us - self.compute_us - self.idle_us

    @property
    def overlap_ratio(self) -> float | None:
        """HTA's comp_comm_overlap_ratio; None without communication."""
        return self.overlap_us / self.comm_us if self.comm_us > 0 else None


def _hta_scope(trace: Trace, include_last_step: bool) -> npt.NDArray[np.intp]:
    """Rows of ``trace.gpu`` HTA keeps, in the order HTA holds them."""
    g = trace.gpu
    step_names = {s.name for s in trace.steps}
    if len(step_names) <= 1:
        return np.arange(len(g))
    sync_ids = [i for i, n in enumerate(trace.names) if n in SYNC_EVENT_NAMES]
    gpu_side = ((g.stream >= 0) & (g.correlation >= 0)) | np.isin(g.name_id, sync_ids)
    cpu_steps = [s for s in trace.steps if not s.hta_gpu]
    if not cpu_steps:
        return np.arange(0)
    origin = _origin(trace)
    step_start = np.array([s.ts_us for s in cpu_steps])
    step_end = step_start + np.array([s.dur_us for s in cpu_steps])
    if trace.ts_fractional:
        step_start, step_end = np.ceil(step_start), np.floor(step_end)
    if include_last_step:
        # HTA compares shifted starts with the last step's end taken before the
        # shift, so every host event stays; mirrored here.
        limit = float(step_end.max())
    else:
        limit = float(step_start.max() - origin)
    launched = _started_before(trace.launches.ts_us, trace, origin, limit, include_last_step)
    # whether any host operator is kept: its earliest start is (rounding keeps the order),
    # without a rounded copy of every start (8 MB of temporaries at 200 MB of trace)
    host = trace.cpu.ts_us
    first_host = _round_start(host[[int(np.argmin(host))]] if len(host) else host, trace) - origin
    cpu_gpu_rows = np.flatnonzero(~gpu_side)  # (few: the start of these alone)
    kept_cpu_gpu_rows = cpu_gpu_rows[_before(_aligned_times(trace, cpu_gpu_rows)[0], limit, include_last_step)]
    del cpu_gpu_rows
    # kept: a GPU event whose correlation is a kept launch's, a kept GPU-side host event's,
    # or -1 (HTA gives every host event without a correlation the correlation -1), each
    # pool searched alone (one copy of the largest at a time, sorted where it is)
    linked = _member(g.correlation, trace.launches.correlation[launched], sort_in_place=True)
    del launched
    linked |= _member(g.correlation, g.correlation[kept_cpu_gpu_rows], sort_in_place=True)
    if np.any(_before(first_host, limit, include_last_step)):
        linked |= g.correlation == -1
    gpu_side &= linked
    del linked
    kept_gpu_rows = np.flatnonzero(gpu_side)
    return np.concatenate([kept_gpu_rows, kept_cpu_gpu_rows])


def _member(values: npt.NDArray[np.integer[Any]], pool: npt.NDArray[np.integer[Any]],
            sort_in_place: bool = False) -> npt.NDArray[np.bool_]:
    """``np.isin(values, pool)`` by a sort of ``pool`` and a binary search: numpy's
    isin makes both arrays unique first (0.9 s of a 1 GB trace's 1.2 s breakdown).
    ``sort_in_place``: ``pool`` is the caller's temporary, sorted where it is."""
    if not len(pool) or not len(values):
        return np.zeros(len(values), dtype=bool)
    if sort_in_place:
        pool.sort()
    else:
        pool = np.sort(pool)
    at = np.searchsorted(pool, values)
    at[at == len(pool)] = 0
    found: npt.NDArray[np.bool_] = pool[at] == values
    return found


def _before(t: npt.NDArray[np.int64] | npt.NDArray[np.float64], limit: float,
            inclusive: bool) -> npt.NDArray[np.bool_]:
    """HTA keeps host events starting before the last step (or, with the last
    step included, not after its end)."""
    return t <= limit if inclusive else t < limit


def _started_before(ts: npt.NDArray[np.float64], trace: Trace, origin: int, limit: float,
                    inclusive: bool) -> npt.NDArray[np.bool_]:
    """``_before(_round_start(ts) - origin, ...)`` without the int64 copy of every start:
    rounded and shifted in float64, which is exact while the times are under 2**53 (a
    microsecond clock's are; else the int64 way)."""
    if not len(ts) or max(abs(float(ts.min())), abs(float(ts.max())), abs(origin)) >= 2.0 ** 52:
        return _before(_round_start(ts, trace) - origin, limit, inclusive)
    x = np.ceil(ts) if trace.ts_fractional else ts - 0.0  # (whole numbers already when not fractional)
    x -= origin
    return _before(x, limit, inclusive)


def _round_start(ts: npt.NDArray[np.float64], trace: Trace) -> npt.NDArray[np.int64]:
    return (np.ceil(ts) if trace.ts_fractional else ts).astype(np.int64)


def _origin(trace: Trace) -> int:
    return int(np.ceil(trace.min_ts_us) if trace.ts_fractional else trace.min_ts_us)


def _aligned_times(trace: Trace, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Start (int64) and end (float64) of the GPU events in ``rows``, rounded and shifted
    like HTA."""
    ts = trace.gpu.ts_us[rows]
    end = trace.gpu.dur_us[rows]
    origin = _origin(trace)
    # in place, the same arithmetic as start = ceil(ts); end = start - origin + (floor(ts + dur) - start)
    if trace.ts_fractional:
        end += ts
        np.floor(end, out=end)
        np.ceil(ts, out=ts)
        start = ts.astype(np.int64)
        end -= start
    else:
        start = ts.astype(np.int64)
    del ts
    start -= origin
    end += start
    return start, end


def gpu_breakdown(trace: Trace, *, rules: Sequence[KernelRule] = RULES,
                  memory_by_category: bool = True,
                  include_last_step: bool = False) -> GpuBreakdown | None:
    """GPU time breakdown of one rank's trace; None when no GPU event is in scope.

    ``include_last_step`` mirrors HTA's ``include_last_profiler_step``.
    """
    g = trace.gpu
    if len(g) == 0:
        return None
    rows = _hta_scope(trace, include_last_step)
    if rows.size == 0:
        return None
    # the events in scope alone (no column of every GPU event beside their copies), each
    # temporary let go once used: at 200 MB of trace (86,802 kernels) the breakdown itself
    # once peaked at 11.8 MB over the trace's columns
    s, e = _aligned_times(trace, rows)
    k = event_kinds(g.name_id[rows], g.cat_id[rows], trace.names, trace.cats, rules, memory_by_category)
    n_rows = int(rows.size)
    del rows

    # temporal breakdown: HTA sorts the frame by start in place first
    all_s, all_e = intervals.union(s, e)
    span = float(all_e[-1] - all_s[0])
    busy = float(all_e.sum() - all_s.sum())
    del all_s, all_e
    ordered = bool(np.all(e >= s))  # no negative duration: the union depends on no order
    order = np.argsort(s, kind="quicksort")
    comp_sorted = order[k[order] == KernelKind.COMPUTATION]
    del order
    comp_s, comp_e = intervals.union(s[comp_sorted], e[comp_sorted], presorted=ordered)
    compute = float(comp_e.sum() - comp_s.sum()) if comp_s.size else 0.0
    del comp_sorted

    # overlap: HTA's comm analysis works on the frame in its original order
    comm = k == KernelKind.COMMUNICATION
    comm_s, comm_e = intervals.union(s[comm], e[comm])
    comm_len = float(np.sum(comm_e - comm_s))
    if not ordered:  # a negative duration: the union depends on the order it is given
        del comp_s, comp_e
        comp = k == KernelKind.COMPUTATION
        comp_s, comp_e = intervals.union(s[comp], e[comp])
    # (merged already: the same intervals in any order merge to the same set, ends at or after starts)
    overlap = intervals.intersection_length((comm_s, comm_e), (comp_s, comp_e), merged=True)
    del comp_s, comp_e
    memory = k == KernelKind.MEMORY
    return GpuBreakdown(
        span_us=span,
        kernel_us=busy,
        idle_us=span - busy,
        compute_us=compute,
        comm_us=comm_len,
        overlap_us=overlap,
        memory_us=intervals.total_length(s[memory], e[memory]),
        events=n_rows,
        events_dropped=int(len(g) - n_rows),  # rows are distinct
    )
