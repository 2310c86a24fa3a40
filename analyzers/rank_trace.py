"""One rank's profiled window: where its time went, by category and by phase, and the
collectives it took part in. Pure: a Trace in, a small picklable result out.

Window: from the start of the first recorded `ProfilerStep#N` to the end of the last
(host annotations on the thread that ran the training loop).

`breakdown_us` (disjoint, sums to the window):
- CPU / gloo runs: compute = operators (`cpu_op`) on the training threads (the loop's
  thread and the autograd threads); comm = collective spans (`gloo:*`, `nccl:*`,
  `c10d::*`, `record_param_comms`, on any thread); dataloader = DataLoader
  `__next__` spans, which take precedence (collate work is input loading).
- GPU runs: compute / comm / memory kernels classified by name; dataloader = time the
  GPU is idle while the host waits on the DataLoader.
- comm_overlapped = comm under compute; comm_exposed = comm not under compute;
  memcpy = copies under neither; idle = the rest.

`phases_us`: the same window cut by what the host was doing: dataloader > optimizer
(`Optimizer.step#…`, `Optimizer.zero_grad#…`) > backward (autograd engine functions)
> forward (other operators before the step's last backward op) > other (operators
after it) > host. A gap on the training threads while a collective is in flight or
the thread is in a runtime call (a device sync) is the thread blocked: it inherits the
phase before it (the wait at the end of backward for DDP's all-reduce is backward).
Any other gap is host work outside torch operators (Python, I/O, sleeping, a noisy
neighbour): phase "host", and `host_gaps_us` says where in the step it happens
("between the DataLoader and forward", "between backward and the optimizer", ...).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from pardiag.analyzers.intervals import Intervals
from pardiag.analyzers.kernels import KernelKind, event_kinds
from pardiag.analyzers.memory import trace_memory
from pardiag.analyzers.timeline import Windowed, clip, coverage, coverage_cuts, forward_fill
from pardiag.analyzers.trace import CpuOps, Trace

STEP = re.compile(r"^ProfilerStep#(\d+)$")
DATALOADER = re.compile(r"^enumerate\(DataLoader\)#")
OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
BACKWARD = re.compile(r"^autograd::engine::evaluate_function")
COMM = re.compile(r"^(gloo:|nccl:|ucc:|mpi:|xccl:|c10d::|record_param_comms)")

PHASES = ("dataloader", "optimizer", "backward", "forward", "other", "host")
# the phases that hold operators, in layer order (what a host gap lies between)
_OP_PHASES = PHASES[:5]
_PHASE_WORDS = ("the DataLoader", "the optimizer", "backward", "forward", "the operators after backward")
DTYPE_BYTES = {  # keys lower-case, without "c10::"
    "float": 4, "float32": 4, "fp32": 4,
    "double": 8, "float64": 8,
    "half": 2, "float16": 2, "fp16": 2,
    "bfloat16": 2, "bf16": 2,
    "long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "int16": 2, "signed char": 1, "unsigned char": 1, "char": 1,
    "int8": 1, "uint8": 1, "byte": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}
# NCCL kernel names carry the op: ncclDevKernel_AllReduce_Sum_f32_RING_LL
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


@dataclass(frozen=True)
class StepSpan:
    step: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class CollectiveCall:
    """One collective on one rank, in issue order."""

    step: int | None
    op: str
    process_group: str
    group_size: int | None
    bytes: int | None
    start_us: float
    dur_us: float
    on_gpu: bool
    timing: str = "host"  # "device": kernel time; "host": the operation itself (gloo); "launch": enqueue only
    implementation: str | None = None  # the backend's own op when it differs from `op` (gloo runs reduce_scatter as all_reduce)


@dataclass(frozen=True)
class RankTrace:
    rank: int | None
    device_type: str  # "cpu" or "cuda"
    steps: tuple[StepSpan, ...]
    window_us: float
    breakdown_us: dict[str, float]
    phases_us: dict[str, float]
    phases_per_step_us: dict[int, dict[str, float]]
    collectives: tuple[CollectiveCall, ...]
    threads: dict[str, int] = field(default_factory=dict)
    notices: tuple[str, ...] = ()
    pg_config: tuple[dict[str, Any], ...] = ()
    world_size: int | None = None
    ops: dict[str, Any] = field(default_factory=dict)
    host_gaps_us: dict[str, float] = field(default_factory=dict)  # host work by where in the step, window total
    # per profiled step (its tile: to the next step's start), the breakdown's categories;
    # they sum to the step's length, and over the steps to `breakdown_us`
    breakdown_per_step_us: dict[int, dict[str, float]] = field(default_factory=dict)
    # per profiled step, its time in order: (start, end, category) runs on the rank's clock
    # that tile the step (`step_segments`), for a chart of the step
    segments_per_step_us: dict[int, tuple[tuple[float, float, str], ...]] = field(default_factory=dict)
    # the window's floating-point work (analyzers/flops.py `FlopCount.to_dict`); None when
    # no operator with a FLOP rule was recorded in it
    flops: dict[str, Any] | None = None
    # the allocator's events per profiled step (analyzers/memory.py `trace_memory`); None
    # without them (the profiler records allocations only with profile_memory)
    memory: dict[str, Any] | None = None


def profiled_steps(trace: Trace) -> tuple[tuple[StepSpan, ...], int | None]:
    """Recorded steps (host annotations) and the thread of the training loop."""
    cpu = trace.cpu
    names = trace.names
    step_ids = [i for i, n in enumerate(names) if STEP.match(n)]
    if not step_ids or len(cpu) == 0:
        return (), None
    sel = np.flatnonzero(np.isin(cpu.name_id, step_ids))
    if sel.size == 0:
        return (), None
    tids, counts = np.unique(cpu.tid[sel], return_counts=True)
    main_tid = int(tids[np.argmax(counts)])
    spans: dict[int, StepSpan] = {}
    for i in sel[cpu.tid[sel] == main_tid]:
        num = int(STEP.match(names[cpu.name_id[i]]).group(1))  # type: ignore[union-attr]
        s, d = float(cpu.ts_us[i]), float(cpu.dur_us[i])
        if not (math.isfinite(s) and math.isfinite(d)) or d <= 0:
            continue  # a broken step mark is no window
        if num not in spans or d > spans[num].end_us - spans[num].start_us:
            spans[num] = StepSpan(num, s, s + d)
    return tuple(spans[k] for k in sorted(spans)), main_tid


def _ids(names: tuple[str, ...], pattern: re.Pattern[str]) -> npt.NDArray[np.int64]:
    return np.array([i for i, n in enumerate(names) if pattern.match(n)], dtype=np.int64)


def _select(trace: Trace, mask: npt.NDArray[np.bool_]) -> Intervals:
    return trace.cpu.ts_us[mask], trace.cpu.ts_us[mask] + trace.cpu.dur_us[mask]


def profiled_window(trace: Trace, drop_last_step: bool = False
                    ) -> tuple[tuple[StepSpan, ...], int | None, tuple[float, float]]:
    """The recorded steps, the thread of the training loop and the window they span: from
    the first step's start to the last one's end (the whole trace when no step is marked).
    ``drop_last_step``: see ``analyze_rank_trace``."""
    steps, main_tid = profiled_steps(trace)
    if drop_last_step and len(steps) > 1:
        steps = steps[:-1]
    if steps:
        return steps, main_tid, (steps[0].start_us, max(steps[0].start_us, steps[-1].end_us))
    lo = float(trace.min_ts_us) if math.isfinite(trace.min_ts_us) else 0.0
    ends = [trace.cpu.ts_us + trace.cpu.dur_us, trace.gpu.ts_us + trace.gpu.dur_us]
    hi = max((float(np.nanmax(e)) for e in ends if e.size), default=lo)
    return steps, main_tid, (lo, max(lo, hi) if math.isfinite(hi) else lo)


def analyze_rank_trace(trace: Trace, drop_last_step: bool = False) -> RankTrace:
    """`drop_last_step` for a window cut short by the process exiting: its last
    `ProfilerStep` is the unfinished step (or the script's tail after the loop)."""
    steps, main_tid, window = profiled_window(trace, drop_last_step)
    notices: list[str] = []
    if not steps:
        notices.append("no ProfilerStep in the trace: the window is the whole trace")

    cpu = trace.cpu
    names = trace.names
    negative = int((cpu.dur_us < 0).sum() + (trace.gpu.dur_us < 0).sum())
    if negative:
        notices.append(f"{negative} events with a negative duration were left out")
    cat_cpu_op = [i for i, c in enumerate(trace.cats) if c == "cpu_op"]
    is_op = np.isin(cpu.cat_id, cat_cpu_op)
    is_comm = np.isin(cpu.name_id, _ids(names, COMM))
    is_dl = np.isin(cpu.name_id, _ids(names, DATALOADER))
    is_opt = np.isin(cpu.name_id, _ids(names, OPTIMIZER))
    is_bwd = np.isin(cpu.name_id, _ids(names, BACKWARD))
    bwd_tids = set(np.unique(cpu.tid[is_bwd]).tolist())
    train_tids = bwd_tids | ({main_tid} if main_tid is not None else set())
    on_train = np.isin(cpu.tid, list(train_tids)) if train_tids else np.ones(len(cpu), dtype=bool)

    dl = _select(trace, is_dl & on_train)
    comm_host = _select(trace, is_comm)
    compute_host = _select(trace, is_op & on_train & ~is_comm)

    use_gpu = len(trace.gpu) > 0
    if use_gpu:
        kinds = event_kinds(trace.gpu.name_id, trace.gpu.cat_id, names, trace.cats)
        g_s, g_e = trace.gpu.ts_us, trace.gpu.ts_us + trace.gpu.dur_us
        comp = (g_s[kinds == KernelKind.COMPUTATION], g_e[kinds == KernelKind.COMPUTATION])
        comm = (g_s[kinds == KernelKind.COMMUNICATION], g_e[kinds == KernelKind.COMMUNICATION])
        # gloo (and MPI) move CUDA tensors on host threads of their own: no kernel of theirs,
        # their operation's span is the transfer, and it counts as communication too
        on_host = [e for e in trace.collectives if not e.on_gpu and e.cat != "gpu_user_annotation"
                   and e.name.startswith(HOST_BACKENDS)]
        if on_host:
            comm = (np.concatenate([comm[0], [e.ts_us for e in on_host]]),
                    np.concatenate([comm[1], [e.ts_us + e.dur_us for e in on_host]]))
        mem = (g_s[kinds == KernelKind.MEMORY], g_e[kinds == KernelKind.MEMORY])
        layers: tuple[Intervals, Intervals, Intervals, Intervals, bool] = (comp, comm, mem, dl, False)
        breakdown = _breakdown(window, *layers)
        other = kinds == KernelKind.OTHER
        if other.any():
            odd = sorted({names[i] for i in np.unique(trace.gpu.name_id[other])})
            notices.append(
                f"{int(other.sum())} GPU events ({float(trace.gpu.dur_us[other].sum()):.0f} us) match no known "
                f"kernel class and are left out of compute: {', '.join(n[:60] for n in odd[:3])}"
            )
        # a process group of one rank has nothing to send: NCCL launches no communication kernel
        host_comm = [e for e in trace.collectives if not e.on_gpu and e.collective_name and e.group_size != 1]
        if host_comm and not (kinds == KernelKind.COMMUNICATION).any():
            notices.append(
                f"{len(host_comm)} collectives were issued (record_param_comms) but no GPU kernel is "
                "recognised as communication: kernel names of this library are not known"
            )
    else:
        empty = (np.empty(0), np.empty(0))
        layers = (compute_host, comm_host, empty, dl, True)
        breakdown = _breakdown(window, *layers)

    phases_per_step = {}
    breakdown_per_step: dict[int, dict[str, float]] = {}
    segments_per_step: dict[int, tuple[tuple[float, float, str], ...]] = {}
    op_mask = is_op & on_train & ~is_dl
    L = trace.launches
    on_train_l = np.isin(L.tid, list(train_tids)) if train_tids else np.ones(len(L), dtype=bool)
    blocked = (np.concatenate([comm_host[0], L.ts_us[on_train_l]]),
               np.concatenate([comm_host[1], L.ts_us[on_train_l] + L.dur_us[on_train_l]]))
    # per step, only the intervals that may overlap it (Windowed): one pass over the
    # trace per step made a trace of 1 GB and 339 steps take 14 s here
    base_w = (Windowed(dl), Windowed(_select(trace, is_opt & on_train)), Windowed(_select(trace, is_bwd)))
    ops_w = Windowed(_select(trace, op_mask & ~is_bwd))
    blocked_w = Windowed(blocked)
    layers_w = tuple(Windowed(iv) for iv in layers[:4])
    spans = steps or (StepSpan(-1, *window),)
    host_gaps: dict[str, float] = {}
    tiles: list[tuple[int, float, float]] = []  # (step, start, end) of the recorded steps
    for i, sp in enumerate(spans):
        # steps tile the window: a step lasts until the next one starts
        end = spans[i + 1].start_us if i + 1 < len(spans) else sp.end_us
        if sp.step >= 0:
            tiles.append((sp.step, sp.start_us, end))
        lo, hi = sp.start_us, end
        phases_per_step[sp.step], where = _phases(
            (lo, hi), tuple(w.within(lo, hi) for w in base_w), ops_w.within(lo, hi),  # type: ignore[arg-type]
            blocked_w.within(lo, hi))
        if sp.step >= 0:
            here = (*(w.within(lo, hi) for w in layers_w), layers[4])
            breakdown_per_step[sp.step] = _breakdown((lo, hi), *here)  # type: ignore[arg-type]
            segments_per_step[sp.step] = step_segments((lo, hi), *here)  # type: ignore[arg-type]
        for k, v in where.items():
            host_gaps[k] = host_gaps.get(k, 0.0) + v
    phases = {p: sum(d[p] for d in phases_per_step.values()) for p in PHASES}
    memory = trace_memory(trace.memory, tiles, np.sort(cpu.ts_us[is_bwd & on_train]))

    return RankTrace(
        rank=trace.rank,
        device_type="cuda" if use_gpu else "cpu",
        steps=steps,
        window_us=window[1] - window[0],
        breakdown_us=breakdown,
        phases_us=phases,
        phases_per_step_us={k: v for k, v in phases_per_step.items() if k >= 0},
        collectives=tuple(collective_calls(trace, steps, window)),
        host_gaps_us=host_gaps,
        breakdown_per_step_us=breakdown_per_step,
        segments_per_step_us=segments_per_step,
        threads={"main": main_tid if main_tid is not None else -1, "backward": len(bwd_tids)},
        notices=tuple(notices),
        world_size=trace.distributed.world_size if trace.distributed else None,
        ops=op_stats(trace, window),
        flops=_flops(trace, window, len(steps)),
        memory=memory,
        pg_config=tuple(
            {"name": p.name, "desc": p.desc, "size": p.size, "ranks": list(p.ranks)}
            for p in (trace.distributed.pg_config if trace.distributed else ())
        ),
    )


def _flops(trace: Trace, window: tuple[float, float], steps: int) -> dict[str, Any] | None:
    from pardiag.analyzers.flops import count_flops

    got = count_flops(trace, window, steps)
    return got.to_dict() if got is not None else None


# matrix-multiply and convolution kernels (the work mixed precision speeds up)
GEMM = re.compile(
    r"^(?!.*(elementwise|fbgemm|splitKreduce|scal_kernel|epilogue|reduce_kernel))"
    r".*(gemm|xmma|implicit_convolve|conv2d_|convolution|wgrad|dgrad|fprop)",
    re.I,
)
GEMM_DTYPES = (  # first match wins
    ("bf16", re.compile(r"bf16|bfloat16", re.I)),
    ("fp16", re.compile(r"h\d{3,5}gemm|hgemm|f16|fp16|half", re.I)),
    ("tf32", re.compile(r"tf32|s\d{4,5}gemm", re.I)),
    ("fp32", re.compile(r"sgemm|f32|fp32|float", re.I)),
)
# Runtime calls that make the host wait for the device by themselves.
SYNC_CALLS = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH|Memset)"
                        r"(_v\d+)?$")
# Operators that read a tensor's value on the host. `.item()` always reaches
# aten::_local_scalar_dense (nested inside aten::item), so aten::item is not counted again.
ITEM_OPS = re.compile(r"^aten::(_local_scalar_dense|nonzero)$")
# Runtime calls that copy from the device or wait for it. A value read is a host-device
# synchronisation only when one of them runs inside it on its thread: a read of a CPU
# tensor (an optimizer's step counter, DDP's map of used parameters) calls none.
DEVICE_READ_CALLS = re.compile(r"^(cuda|hip)(Memcpy\w*|DeviceSynchronize|StreamSynchronize|EventSynchronize)(_v\d+)?$")
CPU_GEMM = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_convolution|mkldnn_convolution|convolution_backward|conv\dd"
                      r"|scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*_backward)$")
"""Matrix multiplies, convolutions and attention (whose work is matrix multiplies, and
which autocast lowers as it does them) on a CPU."""


def gemm_dtype(name: str) -> str:
    for dtype, pattern in GEMM_DTYPES:
        if pattern.search(name):
            return dtype
    return "unknown"


def op_stats(trace: Trace, window: tuple[float, float]) -> dict[str, Any]:
    """Counts the levers need: GEMM time by precision, kernel sizes, host syncs.

    Host syncs: `sync_calls`, runtime calls that wait by themselves (outside a value read);
    `item_calls`, value reads (.item(), nonzero), of which `item_device_reads` copied
    from the device or waited for it and `item_host_reads` read host memory only."""
    lo, hi = window
    out: dict[str, Any] = {}
    g = trace.gpu
    if len(g):
        inside = (g.ts_us >= lo) & (g.ts_us < hi)
        kinds = event_kinds(g.name_id, g.cat_id, trace.names, trace.cats)
        comp = inside & (kinds == KernelKind.COMPUTATION)
        gemm_us: dict[str, float] = {}
        for nid in np.unique(g.name_id[comp]):
            name = trace.names[nid]
            if GEMM.search(name):
                sel = comp & (g.name_id == nid)
                key = gemm_dtype(name)
                gemm_us[key] = gemm_us.get(key, 0.0) + float(g.dur_us[sel].sum())
        out["gemm_us"] = gemm_us
        out["compute_kernels"] = int(comp.sum())
        out["compute_kernel_us"] = float(g.dur_us[comp].sum())
        out["compute_kernel_p50_us"] = float(np.median(g.dur_us[comp])) if comp.any() else None
    c = trace.cpu
    item_ids = [i for i, n in enumerate(trace.names) if ITEM_OPS.match(n)]
    items = np.zeros(0, dtype=np.int64)  # indices into trace.cpu of the value reads, outermost only
    if item_ids and len(c):
        items = _outermost(np.flatnonzero((c.ts_us >= lo) & (c.ts_us < hi) & np.isin(c.name_id, item_ids)),
                           c.tid, c.ts_us, c.dur_us)
    L = trace.launches
    device_reads: set[int] = set()
    if len(L):
        inside = (L.ts_us >= lo) & (L.ts_us < hi)
        copies = np.flatnonzero(np.isin(L.name_id, _ids(trace.names, DEVICE_READ_CALLS)))
        # a read with several copies or waits inside (copy, then stream sync) is one read
        in_read = _enclosing(L.tid[copies], L.ts_us[copies], c, items)
        device_reads = {int(k) for k in in_read if k >= 0}
        syncs = np.flatnonzero(inside & np.isin(L.name_id, _ids(trace.names, SYNC_CALLS)))
        # a runtime sync made by a value read (its copy back and wait) is that read
        out["sync_calls"] = int((_enclosing(L.tid[syncs], L.ts_us[syncs], c, items) < 0).sum())
        # the host's time inside those waits: every sync call, and the copies and waits of
        # the value reads that reached the device
        waits = np.union1d(syncs, copies[(in_read >= 0) & inside[copies]])
        out["sync_us"] = float(L.dur_us[waits].sum())
        out["launches"] = int(inside.sum())
    if item_ids and len(c):
        out["item_calls"] = len(items)
        out["item_device_reads"] = len(device_reads)
        out["item_host_reads"] = len(items) - len(device_reads)
    if not len(g) and len(c):
        gemm_ids = [i for i, n in enumerate(trace.names) if CPU_GEMM.match(n)]
        sel = np.isin(c.name_id, gemm_ids)
        out["cpu_gemm_us"] = _union_in(c.ts_us[sel], c.ts_us[sel] + c.dur_us[sel], lo, hi)
    return out


def _outermost(idx: npt.NDArray[np.int64], tid: npt.NDArray[np.int64], ts: npt.NDArray[np.float64],
               dur: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The operators `idx` less those nested in another of them on their thread, so that
    a read that calls another read counts once."""
    keep: list[int] = []
    for t in np.unique(tid[idx]):
        mine = idx[tid[idx] == t]
        mine = mine[np.lexsort((-dur[mine], ts[mine]))]  # by start, the longer first
        end = -np.inf
        for i in mine:
            if ts[i] >= end:
                keep.append(int(i))
                end = float(ts[i] + dur[i])
    return np.array(sorted(keep), dtype=np.int64)


def _enclosing(tid: npt.NDArray[np.int64], ts: npt.NDArray[np.float64], ops: CpuOps,
               idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each call (thread, time), the operator of `idx` (indices into `ops`, not
    nested in one another) it falls inside on its thread, or -1."""
    out = np.full(len(ts), -1, dtype=np.int64)
    for t in np.unique(tid):
        mine = idx[ops.tid[idx] == t]
        if not len(mine):
            continue
        mine = mine[np.argsort(ops.ts_us[mine])]
        starts, ends = ops.ts_us[mine], ops.ts_us[mine] + ops.dur_us[mine]
        calls = np.flatnonzero(tid == t)
        k = np.searchsorted(starts, ts[calls], side="right") - 1
        ok = k >= 0
        ok[ok] = ts[calls][ok] <= ends[k[ok]]
        out[calls[ok]] = mine[k[ok]]
    return out


def _union_in(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64], lo: float, hi: float) -> float:
    from pardiag.analyzers.intervals import total_length

    s, e = clip((starts, ends), lo, hi)
    return total_length(s, e)


def _breakdown(
    window: tuple[float, float],
    compute: Intervals,
    comm: Intervals,
    memory: Intervals,
    dataloader: Intervals,
    dataloader_first: bool,
) -> dict[str, float]:
    length, cov = coverage(window, [compute, comm, memory, dataloader])
    if length.size == 0:
        return {k: 0.0 for k in ("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle")}
    return {k: float(length[mask].sum()) for k, mask in _category_masks(cov, dataloader_first).items()}


def _category_masks(cov: npt.NDArray[np.bool_], dataloader_first: bool) -> dict[str, npt.NDArray[np.bool_]]:
    """Which elementary segments go to which category of the breakdown (a partition),
    from the coverage of compute, communication, copies and input loading."""
    c, m, mem, d = cov
    busy = c | m | mem
    dl = d if dataloader_first else d & ~busy
    rest = ~dl
    return {
        "compute": c & ~m & rest,
        "comm_overlapped": c & m & rest,
        "comm_exposed": m & ~c & rest,
        "memcpy": mem & ~c & ~m & rest,
        "dataloader": dl,
        "idle": ~busy & ~dl,
    }


SEGMENTS_PER_STEP = 500
"""A step's timeline keeps segments of at least 1/500 of the step (less than a pixel of a
chart): shorter ones join the one before them."""


def step_segments(
    window: tuple[float, float],
    compute: Intervals,
    comm: Intervals,
    memory: Intervals,
    dataloader: Intervals,
    dataloader_first: bool,
) -> tuple[tuple[float, float, str], ...]:
    """A step's time in order, as (start, end, breakdown category) runs that tile it: the
    breakdown's categories where they happen. Runs shorter than the step's
    1/``SEGMENTS_PER_STEP`` join the run before them (a chart could not show them)."""
    cuts, cov = coverage_cuts(window, [compute, comm, memory, dataloader])
    if cuts.size == 0:
        return ()
    names = list(_category_masks(cov, dataloader_first))
    label = np.zeros(cov.shape[1], dtype=np.int64)
    for k, mask in enumerate(_category_masks(cov, dataloader_first).values()):
        label[mask] = k
    change = np.flatnonzero(np.diff(label)) + 1
    firsts = np.concatenate([[0], change]).tolist()
    lasts = np.concatenate([change, [label.size]]).tolist()
    shortest = (window[1] - window[0]) / SEGMENTS_PER_STEP
    out: list[list[Any]] = []
    for a, b in zip(firsts, lasts):
        s, e, name = float(cuts[a]), float(cuts[b]), names[int(label[a])]
        if out and (e - s < shortest or out[-1][2] == name):
            out[-1][1] = e
        else:
            out.append([s, e, name])
    return tuple((s, e, name) for s, e, name in out)


def _phases(
    window: tuple[float, float],
    base: tuple[Intervals, Intervals, Intervals],
    ops: Intervals,
    blocked: Intervals,
) -> tuple[dict[str, float], dict[str, float]]:
    """One step's phases (summing to its length), and its host work by where it lies.
    ``base``: the input fetches, optimizer steps and backward operators; ``ops``: the
    other operators of the training threads; ``blocked``: where a thread waits (host
    collectives, runtime calls); each may hold intervals outside the window."""
    dl, opt, bwd = base
    bwd_in = clip(bwd, *window)
    last_bwd_end = float(bwd_in[1].max()) if bwd_in[1].size else window[0]
    before, after = ops[0] < last_bwd_end, ops[0] >= last_bwd_end
    layers = [dl, opt, bwd, (ops[0][before], ops[1][before]), (ops[0][after], ops[1][after])]
    length, cov = coverage(window, [*layers, blocked])
    out = dict.fromkeys(PHASES, 0.0)
    if length.size == 0:
        out["host"] = max(window[1] - window[0], 0.0)
        return out, ({_gap_words(-1, -1): out["host"]} if out["host"] > 0 else {})
    label = np.full(length.size, -1, dtype=np.int64)
    for k in range(len(layers) - 1, -1, -1):  # the first layer that covers a segment wins
        label[cov[k]] = k
    prev = forward_fill(label)
    nxt = forward_fill(label[::-1])[::-1]
    gap = label < 0
    # a thread blocked (a collective in flight, a runtime call) stays in the phase before
    held = gap & cov[len(layers)] & (prev >= 0)
    label[held] = prev[held]
    host = label < 0
    totals = np.bincount(label[~host], weights=length[~host], minlength=len(layers))
    for k, name in enumerate(_OP_PHASES):
        out[name] = float(totals[k])
    out["host"] = float(length[host].sum())
    where: dict[str, float] = {}
    codes = (prev[host] + 1) * 8 + (nxt[host] + 1)  # one code per (before, after) pair
    pairs, inv = np.unique(codes, return_inverse=True)
    for code, us in zip(pairs.tolist(), np.bincount(inv, weights=length[host]).tolist()):
        key = _gap_words(code // 8 - 1, code % 8 - 1)
        where[key] = where.get(key, 0.0) + float(us)
    return out, where


def _gap_words(prev: int, nxt: int) -> str:
    """Where a host gap lies, from the phases of the operators around it."""
    if prev < 0 and nxt < 0:
        return "with no torch operator in the step"
    if prev < 0:
        return f"at the step's start, before {_PHASE_WORDS[nxt]}"
    if nxt < 0:
        return f"at the step's end, after {_PHASE_WORDS[prev]}"
    if prev == nxt:
        return f"among {_PHASE_WORDS[prev]}" if _PHASE_WORDS[prev].startswith("the operators") \
            else f"between the operators of {_PHASE_WORDS[prev]}"
    return f"between {_PHASE_WORDS[prev]} and {_PHASE_WORDS[nxt]}"


def _dtype_bytes(dtype: Any) -> int | None:
    if isinstance(dtype, list):
        dtype = dtype[0] if dtype else None
    if not isinstance(dtype, str):
        return None
    return DTYPE_BYTES.get(dtype.replace("c10::", "").strip().lower())


def _numel(dims: Any) -> int | None:
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    if isinstance(dims, list) and all(isinstance(x, int) for x in dims):
        return int(np.prod(dims)) if dims else 1
    return None


OP_ALIASES = (
    (re.compile(r"all_?reduce|allreduce"), "all_reduce"),
    (re.compile(r"all_?gather|allgather"), "all_gather"),
    (re.compile(r"reduce_?scatter"), "reduce_scatter"),
    (re.compile(r"all_?to_?all|alltoall"), "all_to_all"),
    (re.compile(r"broadcast"), "broadcast"),
    (re.compile(r"^_?reduce"), "reduce"),
    (re.compile(r"barrier"), "barrier"),
    (re.compile(r"send_?recv|sendrecv"), "send_recv"),
    (re.compile(r"send"), "send"),
    (re.compile(r"recv"), "recv"),
    (re.compile(r"gather"), "gather"),
    (re.compile(r"scatter"), "scatter"),
)


def normalise_op(name: str) -> str:
    """'_all_gather_base', 'allgather_into_tensor_coalesced', 'AllGather' -> 'all_gather'."""
    snake = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()
    for pattern, op in OP_ALIASES:
        if pattern.search(snake):
            return op
    return snake.strip("_")


def _op_name(ev: Any) -> str:
    if ev.collective_name:
        return normalise_op(str(ev.collective_name))
    name = ev.name
    for prefix in ("gloo:", "nccl:", "ucc:", "mpi:", "xccl:"):
        if name.startswith(prefix):
            return normalise_op(name[len(prefix):])
    m = _KERNEL_OP.search(name)
    return normalise_op(m.group(1) if m else name)


BACKEND_PREFIXES = ("gloo:", "nccl:", "ucc:", "mpi:", "xccl:")
# Ops a backend may run in place of the one the program asked for, beyond the op itself:
# gloo has no reduce-scatter of its own and runs `_reduce_scatter_base` as an all_reduce
# of the whole input (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp).
RUN_AS = {"reduce_scatter": frozenset({"all_reduce"})}


def requested_ops(annotations: Sequence[Any], calls: Sequence[Any]) -> list[str | None]:
    """For each backend annotation (`gloo:all_reduce`), the op of the program's call that
    it carries out, or None when no call explains it. A process group's backend runs its
    work in the order the calls were issued, so each annotation, in time order, takes the
    oldest call issued before it that it can carry out and that no earlier annotation
    took (`c10d::_reduce_scatter_base_` -> reduce_scatter)."""
    pending = sorted(((c.ts_us, normalise_op(c.name[len("c10d::"):])) for c in calls), key=lambda t: t[0])
    taken = [False] * len(pending)
    first = 0  # every call before it is taken
    out: list[str | None] = [None] * len(annotations)
    for i in sorted(range(len(annotations)), key=lambda i: annotations[i].ts_us):
        ann = annotations[i]
        runs = _op_name(ann)
        for j in range(first, len(pending)):
            ts, op = pending[j]
            if ts > ann.ts_us:
                break
            if not taken[j] and (op == runs or runs in RUN_AS.get(op, ())):
                taken[j] = True
                out[i] = op
                break
        while first < len(pending) and taken[first]:
            first += 1
    return out


def _device_spans(trace: Trace, host: list[Any]) -> list[tuple[float, float] | None]:
    """For each host collective annotation, the span of the communication kernels it
    launched (matched through the launch's correlation id), or None."""
    g = trace.gpu
    L = trace.launches
    if len(g) == 0 or len(L) == 0 or not host:
        return [None] * len(host)
    kinds = event_kinds(g.name_id, g.cat_id, trace.names, trace.cats)
    comm = kinds == KernelKind.COMMUNICATION
    by_corr: dict[int, tuple[float, float]] = {}
    for c, s, d in zip(g.correlation[comm].tolist(), g.ts_us[comm].tolist(), g.dur_us[comm].tolist()):
        lo, hi = by_corr.get(c, (s, s + d))
        by_corr[c] = (min(lo, s), max(hi, s + d))
    order = np.lexsort((L.ts_us, L.tid))
    l_tid, l_ts, l_corr = L.tid[order], L.ts_us[order], L.correlation[order]
    out: list[tuple[float, float] | None] = []
    for e in host:
        lo = np.searchsorted(l_tid, e.tid, side="left")
        hi = np.searchsorted(l_tid, e.tid, side="right")
        i = lo + np.searchsorted(l_ts[lo:hi], e.ts_us, side="left")
        j = lo + np.searchsorted(l_ts[lo:hi], e.ts_us + e.dur_us, side="right")
        spans = [by_corr[c] for c in l_corr[i:j].tolist() if c in by_corr]
        out.append((min(s for s, _ in spans), max(e for _, e in spans)) if spans else None)
    return out


def _timed_events(trace: Trace) -> list[tuple[Any, float, float, str]]:
    """(event, start, end, timing) for each collective, in issue order."""
    evs = list(trace.collectives)
    on_gpu = [e for e in evs if e.on_gpu and e.collective_name]
    if on_gpu:
        return sorted(((e, e.ts_us, e.ts_us + e.dur_us, "device") for e in on_gpu), key=lambda t: t[1])
    # the host's annotations; their gpu_user_annotation copies on a stream mirror them
    host = [e for e in evs if not e.on_gpu and e.name.startswith(BACKEND_PREFIXES) and e.cat != "gpu_user_annotation"]
    if not host:
        host = [e for e in evs if not e.on_gpu and e.collective_name]
    host.sort(key=lambda e: e.ts_us)
    gpu_run = len(trace.gpu) > 0
    out = []
    for e, span in zip(host, _device_spans(trace, host)):
        if span is not None:
            out.append((e, span[0], span[1], "device"))
        else:
            out.append((e, e.ts_us, e.ts_us + e.dur_us, _host_timing(e.name, gpu_run)))
    return out


# Backends that move the data on host threads of their own, also for CUDA tensors (gloo
# copies them to the host, reduces there, copies back): their operation's span is the
# collective. NCCL's (and XCCL's) host side only enqueues kernels.
HOST_BACKENDS = ("gloo:", "mpi:")


def _host_timing(name: str, gpu_run: bool) -> str:
    """How a collective with no kernel of its own in the trace is timed: "host" (the
    operation is the collective), or "launch" (an enqueue whose work is not traced)."""
    if name.startswith(HOST_BACKENDS):
        return "host"
    return "launch" if gpu_run or name.startswith("nccl:") else "host"


def _group_size(e: Any, pgs: Sequence[Any], default_pg: Any) -> int | None:
    """The size of the collective's process group as the trace records it: the op's own
    `Group size` or `Process Group Ranks`, else its group's entry in `pg_config`, else the
    only group there is; None when the trace does not say (never the number of ranks
    that happen to be analysed: a sampled job would get its bandwidth wrong)."""
    if e.group_size:
        return int(e.group_size)
    if e.pg_ranks:
        return len(e.pg_ranks)
    named = next((p.size for p in pgs if e.pg_name is not None and p.name == e.pg_name and p.size), None)
    if named:
        return int(named)
    return default_pg.size if default_pg is not None else None


def collective_calls(trace: Trace, steps: tuple[StepSpan, ...],
                     window: tuple[float, float] | None = None) -> list[CollectiveCall]:
    """Collectives in issue order, each timed where its data moves:
    - NCCL kernels that carry their collective's arguments (recent PyTorch): as they are;
    - otherwise the host annotation (`nccl:*`, `gloo:*`) with its size; for NCCL the
      time is that of the kernels it launched (found through the correlation ids); a
      host annotation whose kernels are not in the trace has no transfer time
      (`timing="launch"`): NCCL's host side only enqueues the work;
    - gloo runs the collective on its own threads: the span is the operation.
    With a `window` (the profiled steps), each call is clipped to it and a call wholly
    outside it is left out: only the window's time is compared with the window."""
    pgs = trace.distributed.pg_config if trace.distributed else ()
    default_pg = pgs[0] if len(pgs) == 1 else None
    starts = np.array([s.start_us for s in steps])
    timed = _timed_events(trace)
    annotations = [e for e, *_ in timed if e.name.startswith(BACKEND_PREFIXES)]
    calls = [e for e in trace.collectives if e.name.startswith("c10d::") and not e.on_gpu]
    asked = dict(zip(map(id, annotations), requested_ops(annotations, calls)))
    out = []
    for e, t0, t1, timing in timed:
        if window is not None:
            if t1 <= window[0] or t0 >= window[1]:
                continue
            t0, t1 = max(t0, window[0]), min(t1, window[1])
        step = None
        if steps:
            i = int(np.searchsorted(starts, max(e.ts_us, t0), side="right")) - 1
            step = steps[i].step if i >= 0 else None
        size = _dtype_bytes(e.dtype) or _dtype_bytes(e.input_type)
        n = max(e.in_msg_nelems or 0, e.out_msg_nelems or 0) or _numel(e.input_dims)
        runs = _op_name(e)
        op = asked.get(id(e)) or runs
        group = _group_size(e, pgs, default_pg)
        if not e.out_msg_nelems and n and op == "all_gather" and group:
            n *= group  # the host records the input shard; the message is the gathered size
        pg = e.pg_name or (default_pg.name if default_pg else "?")
        pg_desc = e.pg_desc or (default_pg.desc if default_pg else "")
        out.append(
            CollectiveCall(
                step=step,
                op=op,
                process_group=f"{pg}:{pg_desc}" if pg_desc else str(pg),
                group_size=group,
                bytes=n * size if n and size else None,
                start_us=t0,
                dur_us=t1 - t0,
                on_gpu=timing == "device",
                timing=timing,
                implementation=e.name if runs != op else None,
            )
        )
    return out
