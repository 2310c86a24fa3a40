"""The matrix-multiply and convolution calls of a trace, grouped by shape: which shapes
hold most of the job's GEMM time, and the arguments to run each again.

`torch.profiler` with ``record_shapes`` (pardiag's default) writes, for every operator,
its inputs' sizes (``Input Dims``), element types (``Input type``), strides (``Input
Strides``) and the values of its non-tensor arguments (``Concrete Inputs``). That is
enough to call the operator again, alone, at the same shapes: `pardiag run` does so
after the job to measure what a lower precision gains on the job's own shapes
(`pardiag.collectors.gemm_bench`).

Operators nest (``aten::linear`` calls ``aten::addmm``; ``aten::conv2d`` calls
``aten::convolution``, which calls ``aten::_convolution``): only the outermost GEMM
operator of a nest counts, so no time is counted twice. A call inside autograd's
``evaluate_function`` belongs to the backward pass. On a CPU an operator's time is its
own duration; in a GPU trace it is the time of the kernels its nest launched (matched
by the ``External id`` a kernel shares with the operator that launched it), since the
host only enqueues them.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

GEMM_OPS = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv[123]d|convolution|_convolution|convolution_backward)$")
BACKWARD_SPAN = "autograd::engine::evaluate_function"
STEP_PREFIX = "ProfilerStep#"
_CATEGORIES = frozenset({"cpu_op", "kernel", "user_annotation"})  # operators, kernels, steps
MAX_TRACE_BYTES = 4 << 30  # decompressed; larger traces are not read for shapes


class _Event(msgspec.Struct, gc=False):
    name: str | None = None
    cat: str | None = None
    ph: str | None = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _Doc(msgspec.Struct):
    traceEvents: list[_Event] | None = None


class _Args(msgspec.Struct):
    ext: Any = msgspec.field(default=None, name="External id")
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    strides: Any = msgspec.field(default=None, name="Input Strides")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_DOC = msgspec.json.Decoder(_Doc)
_ARGS = msgspec.json.Decoder(_Args)


class ShapeError(Exception):
    """The trace cannot be read for shapes; the message is one line."""


@dataclass(frozen=True)
class GemmShape:
    """One operator at one set of input shapes, as the job called it in the window."""

    op: str  # "aten::addmm"
    dims: tuple[tuple[int, ...] | None, ...]  # per input; None for a non-tensor argument
    dtypes: tuple[str, ...]  # per input, as the trace names them ("float", "c10::BFloat16", "Scalar", "")
    strides: tuple[tuple[int, ...] | None, ...]
    concrete: tuple[str, ...]  # per input, the value of a non-tensor argument ("[1, 1]", "False", "1"), else ""
    backward: bool  # called by autograd's engine (gradients), not by the forward pass
    calls: int
    trace_us: float  # total duration of these calls in the window

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "dims": [list(d) if d is not None else None for d in self.dims],
                "dtypes": list(self.dtypes), "strides": [list(s) if s is not None else None for s in self.strides],
                "concrete": list(self.concrete), "backward": self.backward, "calls": self.calls,
                "trace_us": self.trace_us}


@dataclass(frozen=True)
class GemmShapes:
    shapes: tuple[GemmShape, ...]  # every shape, most time first
    total_us: float  # all GEMM time in the window (outermost operators)
    window_us: float  # the profiled steps' span, 0 when the trace marks no step
    with_shapes: bool  # whether the trace recorded input shapes at all
    timing: str = "host"  # "device": the kernels the operators launched (GPU traces); "host": the operators

    def top(self, n: int) -> tuple[GemmShape, ...]:
        return self.shapes[:n]


def _read(path: Path) -> bytes:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read(MAX_TRACE_BYTES + 1)
    if len(data) > MAX_TRACE_BYTES:
        raise ShapeError(f"{path.name}: larger than {MAX_TRACE_BYTES >> 30} GB decompressed; shapes not read")
    return data


def _dims(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return tuple(v)
    return None


def _key_of(a: _Args) -> tuple[tuple[tuple[int, ...] | None, ...], tuple[str, ...],
                                        tuple[tuple[int, ...] | None, ...], tuple[str, ...]] | None:
    if not isinstance(a.dims, list) or not isinstance(a.types, list) or len(a.dims) != len(a.types):
        return None
    types = tuple(str(t) for t in a.types)
    dims = tuple(_dims(d) if types[i] not in ("Scalar", "ScalarList", "") else None for i, d in enumerate(a.dims))
    strides_in = a.strides if isinstance(a.strides, list) and len(a.strides) == len(dims) else [None] * len(dims)
    strides = tuple(_dims(s) if dims[i] is not None else None for i, s in enumerate(strides_in))
    conc_in = a.concrete if isinstance(a.concrete, list) and len(a.concrete) == len(dims) else [""] * len(dims)
    concrete = tuple(str(c) if c is not None else "" for c in conc_in)
    return dims, types, strides, concrete


def gemm_shapes(path: str | Path) -> GemmShapes:
    """The GEMM operators of one rank's trace inside its profiled steps, grouped by
    (operator, input shapes, types, strides, non-tensor arguments, forward/backward).
    Raises ShapeError when the file cannot be read as a trace."""
    p = Path(path)
    try:
        doc = _DOC.decode(_read(p))
    except FileNotFoundError:
        raise ShapeError(f"{p}: no such file") from None
    except (OSError, EOFError, msgspec.MsgspecError, ValueError) as e:
        raise ShapeError(f"{p.name}: unreadable trace ({type(e).__name__}: {e})") from None
    events = [_Op(e.name, e.cat or "", e.pid, e.tid, float(e.ts), float(e.dur), e.args)
              for e in doc.traceEvents or ()
              if e.dur is not None and e.ts is not None and e.name and e.cat in _CATEGORIES]
    steps = [e for e in events if e.name.startswith(STEP_PREFIX) and e.cat != "gpu_user_annotation"]
    lo = min((e.ts for e in steps), default=float("-inf"))
    hi = max((e.ts + e.dur for e in steps), default=float("inf"))
    window = (hi - lo) if steps else 0.0

    # GPU traces: an operator's time is its kernels' (the host only launches them), found
    # through the External id each kernel shares with the operator that launched it
    kernel_us: dict[int, float] = {}
    for k in events:
        if k.cat == "kernel":
            ext = _ext(k.args)
            if ext is not None:
                kernel_us[ext] = kernel_us.get(ext, 0.0) + k.dur
    device = bool(kernel_us)

    per_thread: dict[tuple[Any, Any], list[_Op]] = {}
    for o in events:
        if o.cat == "cpu_op" and (device or GEMM_OPS.match(o.name) or o.name.startswith(BACKWARD_SPAN)):
            per_thread.setdefault((o.pid, o.tid), []).append(o)
    nests: dict[tuple[Any, ...], list[list[float]]] = {}
    with_shapes = False
    for ops in per_thread.values():
        ops.sort(key=lambda o: (o.ts, -o.dur))
        gemm_end = float("-inf")
        bwd_end = float("-inf")
        current: list[float] | None = None  # the time of the GEMM nest being read
        for o in ops:
            start, end = o.ts, o.ts + o.dur
            if o.name.startswith(BACKWARD_SPAN):
                bwd_end = max(bwd_end, end)
                continue
            if start < gemm_end:  # nested in a GEMM operator already counted: its kernels are the nest's
                if device and current is not None:
                    current[0] += kernel_us.get(_ext(o.args) or -1, 0.0)
                continue
            if not GEMM_OPS.match(o.name):
                continue
            gemm_end = end
            current = None
            if start < lo or start >= hi:
                continue
            try:
                a = _ARGS.decode(o.args) if len(o.args) else _Args()
            except (msgspec.MsgspecError, ValueError):
                a = _Args()
            current = [kernel_us.get(a.ext, 0.0) if device and isinstance(a.ext, int) else (end - start)]
            key = _key_of(a)
            group = (o.name, *key, start < bwd_end) if key is not None else ("", None, None, None, None, False)
            with_shapes = with_shapes or key is not None
            nests.setdefault(group, []).append(current)
    timed = {k: [c[0] for c in v] for k, v in nests.items()}
    total = sum(sum(v) for v in timed.values())
    groups = {k: v for k, v in timed.items() if k[0]}  # calls without recorded inputs count in the total only
    shapes = [GemmShape(op=k[0], dims=k[1], dtypes=k[2], strides=k[3], concrete=k[4], backward=k[5],
                        calls=len(d), trace_us=float(sum(d))) for k, d in groups.items()]
    shapes.sort(key=lambda s: (-s.trace_us, s.op, str(s.dims)))
    return GemmShapes(tuple(shapes), total, float(window), with_shapes, "device" if device else "host")


@dataclass(frozen=True)
class _Op:
    name: str
    cat: str
    pid: Any
    tid: Any
    ts: float
    dur: float
    args: msgspec.Raw


def _ext(args: msgspec.Raw) -> int | None:
    if not len(args):
        return None
    try:
        v = _ARGS.decode(args).ext
    except (msgspec.MsgspecError, ValueError):
        return None
    return v if isinstance(v, int) else None
