"""One rank's floating-point work in its profiled steps, from the operators the trace
recorded with their input shapes (`pardiag.analyzers.flop_rules`).

Which calls count: every operator with a FLOP rule inside the profiled steps, once per
nest (``aten::convolution`` calls ``aten::_convolution``: the outer one counts; a
``aten::linear`` or ``aten::matmul``, which have no rule, is counted through the
``aten::addmm``/``aten::mm`` it calls).

What each call is (`FlopCount`):
- backward: called inside autograd's engine (an ``autograd::engine::evaluate_function``
  span on its thread) without autograd recording: the gradients;
- recompute: called inside the engine *with* autograd recording (the dispatcher gave it a
  ``Sequence number``): a forward pass run again in backward, as activation
  checkpointing does. Such a call that did no work is left out: non-reentrant
  ``torch.utils.checkpoint`` stops the recomputation by raising inside the operator that
  saves the last tensor it needs, before that operator computes. On a GPU trace such a
  call launched no kernel; on a CPU trace it is the last call of a recomputation (the
  next FLOP call on its thread is a gradient's), outside reentrant checkpointing's
  ``CheckpointFunctionBackward``, and it called nothing but the ``detach`` of the saving
  hook where its forward twins (the same operator at the same shapes in the forward pass)
  called the operators of their work (``aten::resolve_conj``, ``aten::copy_``,
  ``aten::_convolution``, ...). A twin that called nothing leaves only time to go by: the
  call is left out when it lasted under `ABORTED_SHARE` of the fastest twin, and a stop that
  ran as long as a small product is then counted: the FLOPs it adds are small;
- forward: the rest (the forward pass; also anything else in the step, as evaluation).

Model FLOPs are forward + backward (what the model needs, whatever the implementation);
hardware FLOPs add the recomputation. A backward with ``create_graph=True`` records its
operators with autograd too and is then counted as recomputation.

Precision per call, from its operand's element type: ``bf16``, ``fp16``, ``fp8``,
``fp64``; a float32 call is ``tf32`` or ``fp32`` when its kernels' names say which (a GPU
trace: ``s1688gemm``, ``tf32`` against ``sgemm``), else ``float32:matmul`` /
``float32:conv`` / ``float32:attention``, which `pardiag.analyzers.efficiency` resolves
with the job's TF32 settings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pardiag.analyzers.flop_rules import Call, OpFlops, call_of, op_flops
from pardiag.analyzers.kernels import KernelKind, event_kinds
from pardiag.analyzers.trace import FlopOp, Trace

BACKWARD_PREFIX = "autograd::engine::evaluate_function"
REENTRANT = "CheckpointFunctionBackward"  # reentrant checkpointing recomputes its whole function, never stops early
# A CPU trace shows a stop by what the call called: the saving hook's ``detach`` and no more.
# Only for an operator whose forward twins call nothing is time the evidence: a recomputed
# call where a recomputation may stop, under this share of its fastest twin, did no work. A
# stop costs about 100 us of exception handling, a real 64x512x512 product 250-400 us; on a
# loaded 2-core host stops measured 0.26x of the twin but were seen at 0.5x and over 0.7x,
# which is why timing is the fallback and not the rule.
ABORTED_SHARE = 0.5
SAVING_HOOK = frozenset({"aten::detach", "detach", "aten::alias"})  # what checkpoint's pack hook calls
TOP_OPS = 12  # operators kept by FLOPs (by name and shape) per rank
DTYPES = {"float": "float32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
          "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
          "c10::Float8_e5m2fnuz": "fp8"}
_TF32_KERNEL = ("tf32", "1688gemm", "16816gemm", "s1688", "s16816")
_FP32_KERNEL = ("sgemm", "_f32f32_f32", "fp32")


@dataclass(frozen=True)
class FlopCount:
    """A rank's FLOPs over its profiled window (not per step: divide by `steps`)."""

    steps: int  # profiled steps the FLOPs were counted over
    forward: float
    backward: float
    recompute: float
    model_by_precision: dict[str, float] = field(default_factory=dict)  # forward + backward
    recompute_by_precision: dict[str, float] = field(default_factory=dict)
    by_kind: dict[str, float] = field(default_factory=dict)  # model FLOPs: matmul, conv, attention
    top: list[dict[str, Any]] = field(default_factory=list)  # {op, dims, phase, calls, flops}, most first
    calls: int = 0  # calls counted
    calls_without_shapes: int = 0  # calls of a FLOP operator recorded without input shapes
    calls_unreadable: dict[str, int] = field(default_factory=dict)  # operator -> calls whose shapes gave no count
    recompute_aborted: int = 0  # recomputed calls left out: they did no work

    @property
    def model(self) -> float:
        return self.forward + self.backward

    @property
    def hardware(self) -> float:
        return self.model + self.recompute

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FlopCount:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class _Acc:
    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    model_prec: dict[str, float] = field(default_factory=dict)
    recompute_prec: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, float] = field(default_factory=dict)
    top: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    calls: int = 0
    no_shapes: int = 0
    unreadable: dict[str, int] = field(default_factory=dict)
    aborted: int = 0


def _add(d: dict[str, float], k: str, v: float) -> None:
    d[k] = d.get(k, 0.0) + v


def _spans(trace: Trace, prefix: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per thread, the spans of the events whose name starts with `prefix`, merged:
    (starts, ends) sorted."""
    cpu = trace.cpu
    ids = [i for i, n in enumerate(trace.names) if n.startswith(prefix)]
    sel = np.flatnonzero(np.isin(cpu.name_id, ids))
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for t in np.unique(cpu.tid[sel]):
        mine = sel[cpu.tid[sel] == t]
        s = cpu.ts_us[mine]
        e = s + cpu.dur_us[mine]
        order = np.argsort(s)
        s, e = s[order], np.maximum.accumulate(e[order])
        new = np.ones(s.size, dtype=bool)
        new[1:] = s[1:] > e[:-1]
        last = np.append(np.flatnonzero(new)[1:] - 1, s.size - 1)
        out[int(t)] = (s[new], e[last])
    return out


def _inside(spans: tuple[np.ndarray, np.ndarray] | None, ts: float) -> bool:
    if spans is None:
        return False
    starts, ends = spans
    k = int(np.searchsorted(starts, ts, side="right")) - 1
    return k >= 0 and ts < ends[k]


class _Kernels:
    """The kernels each host operator launched, found by time: a kernel's launch (the
    runtime call with its correlation id) lies inside the nest of the operator that
    launched it, on the same thread; and what the kernels' names say of TF32."""

    def __init__(self, trace: Trace) -> None:
        g, L = trace.gpu, trace.launches
        self.any_gpu = bool(len(g))
        self.by_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        if not self.any_gpu or not len(L):
            return
        kinds = event_kinds(g.name_id, g.cat_id, trace.names, trace.cats)
        comp = np.flatnonzero((kinds == KernelKind.COMPUTATION) & (g.correlation >= 0))
        lower = [n.lower() for n in trace.names]
        tf32_ids = np.array([any(k in n for k in _TF32_KERNEL) for n in lower], dtype=bool)
        fp32_ids = np.array([any(k in n for k in _FP32_KERNEL) for n in lower], dtype=bool) & ~tf32_ids
        corr = g.correlation[comp]
        is_tf32 = tf32_ids[g.name_id[comp]]
        is_fp32 = fp32_ids[g.name_id[comp]]
        # per launch (row of `L`): its kernels, of which TF32 and FP32 GEMMs
        order = np.argsort(L.correlation, kind="stable")
        pos = np.searchsorted(L.correlation[order], corr)
        pos = np.clip(pos, 0, max(len(L) - 1, 0))
        hit = L.correlation[order][pos] == corr
        row = order[pos[hit]]
        n_any = np.bincount(row, minlength=len(L))
        n_tf32 = np.bincount(row, weights=is_tf32[hit], minlength=len(L))
        n_fp32 = np.bincount(row, weights=is_fp32[hit], minlength=len(L))
        launched = np.flatnonzero(n_any > 0)
        for t in np.unique(L.tid[launched]):
            mine = launched[L.tid[launched] == t]
            mine = mine[np.argsort(L.ts_us[mine])]
            zero = np.zeros(1)
            self.by_tid[int(t)] = (L.ts_us[mine], np.concatenate([zero, np.cumsum(n_any[mine])]),
                                   np.concatenate([zero, np.cumsum(n_tf32[mine])]),
                                   np.concatenate([zero, np.cumsum(n_fp32[mine])]))

    def launched(self, tid: int, lo: float, hi: float) -> tuple[int, int, int]:
        """(kernels, TF32 GEMM kernels, FP32 GEMM kernels) launched from thread `tid`
        within [lo, hi]."""
        got = self.by_tid.get(tid)
        if got is None:
            return 0, 0, 0
        ts, count, tf32, fp32 = got
        a = int(np.searchsorted(ts, lo, side="left"))
        b = int(np.searchsorted(ts, hi, side="right"))
        return int(count[b] - count[a]), int(tf32[b] - tf32[a]), int(fp32[b] - fp32[a])


class _Callees:
    """Whether a host operator called anything that is not a saving hook's ``detach``: the
    other host operators that lie inside it on its thread."""

    def __init__(self, trace: Trace) -> None:
        cpu = trace.cpu
        hook_ids = [i for i, n in enumerate(trace.names) if n in SAVING_HOOK]
        sel = np.flatnonzero(~np.isin(cpu.name_id, hook_ids)) if hook_ids else np.arange(len(cpu))
        self.by_tid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t in np.unique(cpu.tid[sel]):
            mine = sel[cpu.tid[sel] == t]
            mine = mine[np.argsort(cpu.ts_us[mine], kind="stable")]
            self.by_tid[int(t)] = (cpu.ts_us[mine], cpu.ts_us[mine] + cpu.dur_us[mine])

    def any_work(self, o: FlopOp) -> bool:
        """`o` called some operator other than ``detach``: one that starts and ends inside
        it, other than `o` itself."""
        got = self.by_tid.get(o.tid)
        if got is None:
            return False
        ts, end = got
        hi = o.ts_us + o.dur_us
        a = int(np.searchsorted(ts, o.ts_us, side="left"))
        b = int(np.searchsorted(ts, hi, side="right"))
        inner = int(np.count_nonzero(end[a:b] <= hi))
        return inner > 1  # `o` is one of them


def _outermost(ops: Sequence[FlopOp]) -> list[FlopOp]:
    """The calls not nested in another FLOP call on their thread."""
    by_thread: dict[tuple[int, int], list[FlopOp]] = {}
    for o in ops:
        by_thread.setdefault((o.pid, o.tid), []).append(o)
    keep = []
    for mine in by_thread.values():
        mine.sort(key=lambda o: (o.ts_us, -o.dur_us))
        end = -math.inf
        for o in mine:
            if o.ts_us >= end:
                keep.append(o)
                end = o.ts_us + o.dur_us
    keep.sort(key=lambda o: o.ts_us)
    return keep


def _precision(dtype: str, kind: str, kernels: tuple[int, int, int]) -> str:
    p = DTYPES.get(dtype, dtype or "unknown")
    if p != "float32":
        return p
    _, tf32, fp32 = kernels
    if tf32 and not fp32:
        return "tf32"
    if fp32 and not tf32:
        return "fp32"
    return f"float32:{kind}"


def count_flops(trace: Trace, window: tuple[float, float], steps: int) -> FlopCount | None:
    """The rank's FLOPs in [window) over `steps` profiled steps; None when the trace has no
    operator with a FLOP rule in the window."""
    lo, hi = window
    inside = trace.flop_ops.within(lo, hi)
    if not inside:
        return None
    spans = _spans(trace, BACKWARD_PREFIX)
    reentrant = _spans(trace, REENTRANT)
    kernels = _Kernels(trace)
    callees: _Callees | None = None  # built at the first recomputed call that may have stopped
    acc = _Acc()
    twins: dict[tuple[str, str], list[FlopOp]] = {}  # forward calls by (op, dims): the recompute's reference
    calls: list[tuple[FlopOp, Call, OpFlops, str, str]] = []  # (call, inputs, FLOPs, phase, precision), in time order
    for o in _outermost(inside):
        call = call_of(o.input_dims, o.input_type, o.concrete)
        if call is None:
            acc.no_shapes += 1
            continue
        try:
            f = op_flops(o.name, call)
        except ValueError:
            acc.unreadable[o.name] = acc.unreadable.get(o.name, 0) + 1
            continue
        in_bwd = _inside(spans.get(o.tid), o.ts_us)
        phase = "forward" if not in_bwd else ("recompute" if o.grad_mode else "backward")
        prec = _precision(f.dtype, f.kind, kernels.launched(o.tid, o.ts_us, o.ts_us + o.dur_us))
        if phase == "forward":
            twins.setdefault((o.name, str(call.dims)), []).append(o)
        calls.append((o, call, f, phase, prec))
    for i, (o, call, f, phase, prec) in enumerate(calls):
        if phase == "recompute":
            after = next((c[3] for c in calls[i + 1:] if c[0].tid == o.tid), None)
            may_stop = after != "recompute" and not _inside(reentrant.get(o.tid), o.ts_us)
            if may_stop and callees is None and not kernels.any_gpu:
                callees = _Callees(trace)
            if _did_no_work(o, str(call.dims), twins, kernels, callees, may_stop):
                acc.aborted += 1
                continue
        _count(acc, o, call, f.flops, f.kind, prec, phase)
    ranked = sorted(acc.top.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_OPS]
    top: list[dict[str, Any]] = [{"op": k[0], "dims": k[1], "phase": k[2], "calls": int(v[1]), "flops": v[0]}
                                 for k, v in ranked]
    return FlopCount(steps=max(steps, 1), forward=acc.forward, backward=acc.backward, recompute=acc.recompute,
                     model_by_precision=acc.model_prec, recompute_by_precision=acc.recompute_prec,
                     by_kind=acc.kinds, top=top, calls=acc.calls, calls_without_shapes=acc.no_shapes,
                     calls_unreadable=acc.unreadable, recompute_aborted=acc.aborted)


def _did_no_work(o: FlopOp, dims: str, twins: Mapping[tuple[str, str], list[FlopOp]], kernels: _Kernels,
                 callees: _Callees | None, may_stop: bool) -> bool:
    """A recomputed call that did no work: on a GPU it launched no kernel; on a CPU it is
    where a recomputation may stop (`may_stop`) and, where its forward twins called the
    operators of their work, it called none; where they called nothing, it was far shorter
    than the fastest of them."""
    if kernels.any_gpu:
        return kernels.launched(o.tid, o.ts_us, o.ts_us + o.dur_us)[0] == 0
    ref = twins.get((o.name, dims))
    if not may_stop or not ref or callees is None:
        return False
    if all(callees.any_work(t) for t in ref):
        return not callees.any_work(o)
    return o.dur_us < ABORTED_SHARE * min(t.dur_us for t in ref)


def _count(acc: _Acc, o: FlopOp, call: Any, flops: float, kind: str, prec: str, phase: str) -> None:
    acc.calls += 1
    setattr(acc, phase, getattr(acc, phase) + flops)
    if phase == "recompute":
        _add(acc.recompute_prec, prec, flops)
    else:
        _add(acc.model_prec, prec, flops)
        _add(acc.kinds, kind, flops)
    dims = ", ".join("x".join(map(str, d)) for d in call.dims if d is not None)
    t = acc.top.setdefault((o.name, dims, phase), [0.0, 0])
    t[0] += flops
    t[1] += 1
