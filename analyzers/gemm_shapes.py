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

Under autocast the operators autocast lowers (matrix multiplies, convolutions) return
their result in the lower precision, and the elementwise operators autocast leaves
alone run in the type of their input: an activation right after a matrix multiply (a
ReLU, a GELU, a dropout) then runs on half the bytes, and so does its backward (the
``threshold_backward`` its ``ReluBackward0`` runs). On a CPU these can hold as much time
as the matrix multiplies (a 1024x512 float32 ``threshold_backward`` took 987 us here,
in bf16 141 us). The *followers* of a trace are those calls: a forward call of an
operator in ``FOLLOWERS`` whose float32 input has the dims of the output of the matrix
multiply called just before it on its thread (or of a follower so fed: ``gelu`` then
``dropout``), and, inside the backward node autograd recorded for it (the same
``Sequence number``), the calls of an operator in ``BACKWARD_FOLLOWERS``. Only host
timing (a CPU trace): on a GPU these are kernels the replay does not scale.
"""

from __future__ import annotations

import gzip
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

GEMM_OPS = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv[123]d|convolution|_convolution|convolution_backward"
    r"|scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*_backward)$")
"""The operators whose time a lower precision changes at their shapes: matrix multiplies,
convolutions, and attention with its backward (autocast lowers it too; on a CPU with
bf16 units bf16's flash-attention backward ran 7.6x slower than fp32's, where the
matrix multiplies ran 3x faster: the bundled example got no faster from bf16)."""
GEMM_OPS_DEVICE = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv[123]d|convolution|_convolution|convolution_backward)$")
"""In a GPU trace: matrix multiplies and convolutions alone, since the replay scales the
GEMM kernels there (`rank_trace.GEMM`), not attention's: the factor is theirs."""
FOLLOWERS = re.compile(
    r"^aten::(relu|gelu|silu|sigmoid|tanh|hardtanh|leaky_relu|elu|mish|hardswish|hardsigmoid|softplus|dropout"
    r"|native_dropout)_?$")
"""Elementwise operators that autocast runs in their input's type (neither lowered nor kept in fp32)."""
BACKWARD_FOLLOWERS = re.compile(
    r"^aten::(threshold_backward|gelu_backward|silu_backward|sigmoid_backward|tanh_backward|hardtanh_backward"
    r"|leaky_relu_backward|elu_backward|mish_backward|hardswish_backward|hardsigmoid_backward|softplus_backward"
    r"|native_dropout_backward)$")
"""The operators the backward nodes of ``FOLLOWERS`` run."""
FOLLOWER_NAMES = re.compile(f"{FOLLOWERS.pattern}|{BACKWARD_FOLLOWERS.pattern}")
"""Every call of these names, followers or not: the time the replay can scale
(``replay.ScaleGemm.follower_speedup`` is a speed-up of all of it)."""
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
    seq: Any = msgspec.field(default=None, name="Sequence number")


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
    followers: tuple[GemmShape, ...] = ()  # the followers (module docstring), most time first; host timing only
    follower_names_us: float = 0.0  # every call of FOLLOWER_NAMES in the window, followers or not

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


def _load(path: str | Path) -> _Doc:
    """The trace's events as `_Doc`; ShapeError (one line) when the file cannot be read."""
    p = Path(path)
    try:
        return _DOC.decode(_read(p))
    except FileNotFoundError:
        raise ShapeError(f"{p}: no such file") from None
    except (OSError, EOFError, msgspec.MsgspecError, ValueError) as e:
        raise ShapeError(f"{p.name}: unreadable trace ({type(e).__name__}: {e})") from None


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
    doc = _load(path)
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
    gemm_ops = GEMM_OPS_DEVICE if device else GEMM_OPS

    per_thread: dict[tuple[Any, Any], list[_Op]] = {}
    for o in events:
        if o.cat == "cpu_op" and (device or gemm_ops.match(o.name) or o.name.startswith(BACKWARD_SPAN)):
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
            if not gemm_ops.match(o.name):
                continue
            gemm_end = end
            current = None
            if start < lo or start >= hi:
                continue
            a = _decode(o.args)
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
    followers: tuple[GemmShape, ...] = ()
    names_us = 0.0
    if not device:
        followers, names_us = _followers(events, lo, hi)
    return GemmShapes(tuple(shapes), total, float(window), with_shapes, "device" if device else "host",
                      followers, names_us)


def gemm_output_dims(op: str, dims: Any) -> tuple[int, ...] | None:
    """The dims of a matrix multiply's result from its inputs' (None when not known:
    a convolution, a broadcast it does not work out)."""
    d = [_dims(x) for x in dims] if isinstance(dims, list) else []
    name = op.removeprefix("aten::")
    try:
        if name == "linear" and d[0] and d[1] and len(d[1]) == 2:
            return d[0][:-1] + (d[1][0],)
        if name == "addmm" and d[1] and d[2] and len(d[1]) == len(d[2]) == 2:
            return (d[1][0], d[2][1])
        if name == "mm" and d[0] and d[1] and len(d[0]) == len(d[1]) == 2:
            return (d[0][0], d[1][1])
        if name == "bmm" and d[0] and d[1] and len(d[0]) == len(d[1]) == 3:
            return (d[0][0], d[0][1], d[1][2])
        if name == "baddbmm" and d[1] and d[2] and len(d[1]) == len(d[2]) == 3:
            return (d[1][0], d[1][1], d[2][2])
        if name == "matmul" and d[0] and d[1] and len(d[0]) >= 2 and len(d[1]) >= 2 \
                and (len(d[1]) == 2 or d[0][:-2] == d[1][:-2]):
            return d[0][:-1] + (d[1][-1],)
    except IndexError:
        return None
    return None


def _decode(args: msgspec.Raw) -> _Args:
    try:
        return _ARGS.decode(args) if len(args) else _Args()
    except (msgspec.MsgspecError, ValueError):
        return _Args()


def _followers(events: list[_Op], lo: float, hi: float) -> tuple[tuple[GemmShape, ...], float]:
    """The followers inside the window [lo, hi) grouped by shape, and the time of every
    call of ``FOLLOWER_NAMES`` there (the union per thread: a ``dropout`` that calls
    ``native_dropout`` counts once)."""
    per_thread: dict[tuple[Any, Any], list[_Op]] = {}
    for o in events:
        if o.cat == "cpu_op":
            per_thread.setdefault((o.pid, o.tid), []).append(o)
    groups: dict[tuple[Any, ...], list[float]] = {}
    names_us = 0.0
    for ops in per_thread.values():
        ops.sort(key=lambda o: (o.ts, -o.dur))
        # every call of the names: their union inside the window
        ivs = sorted((o.ts, o.ts + o.dur, o.dur) for o in ops
                     if FOLLOWER_NAMES.match(o.name) and o.ts + o.dur > lo and o.ts < hi)
        end = float("-inf")
        for t0, t1, d in ivs:
            if t0 >= end and t0 >= lo and t1 <= hi:
                names_us += d  # (its duration: a difference of timestamps loses digits)
            elif t1 > end:
                names_us += min(t1, hi) - max(t0, end, lo)
            end = max(end, t1)
        # forward: outermost calls in order; a follower fed by the matrix multiply just before it
        seqs: set[int] = set()
        outer_end = float("-inf")
        fed: tuple[int, ...] | None = None  # the dims the last outermost call left in the lower precision
        in_bwd_end = float("-inf")
        for o in ops:
            start, stop = o.ts, o.ts + o.dur
            if o.name.startswith(BACKWARD_SPAN):
                in_bwd_end = max(in_bwd_end, stop)
            if start < outer_end:
                continue  # nested in an outer call
            outer_end = stop
            if start < in_bwd_end:
                fed = None
                continue
            if GEMM_OPS.match(o.name):
                a = _decode(o.args)
                fed = gemm_output_dims(o.name, a.dims)
                continue
            if FOLLOWERS.match(o.name) and fed is not None:
                a = _decode(o.args)
                key = _key_of(a)
                if key is not None and key[0] and key[0][0] == fed and key[1][0] == "float":
                    if lo <= start < hi:
                        groups.setdefault((o.name, *key, False), []).append(o.dur)
                    if isinstance(a.seq, int):
                        seqs.add(a.seq)
                    continue  # its output: the same dims, still in the lower precision
            fed = None
        if not seqs:
            continue
        # backward: the calls of BACKWARD_FOLLOWERS inside the node autograd made for a follower
        node_end = float("-inf")
        for o in ops:
            start, stop = o.ts, o.ts + o.dur
            if start < node_end and BACKWARD_FOLLOWERS.match(o.name) and lo <= start < hi:
                a = _decode(o.args)
                key = _key_of(a)
                if key is not None and key[1][0] == "float":
                    groups.setdefault((o.name, *key, True), []).append(o.dur)
                continue
            if start >= node_end and not o.name.startswith(("aten::", BACKWARD_SPAN)) and "Backward" in o.name:
                a = _decode(o.args)
                if isinstance(a.seq, int) and a.seq in seqs:
                    node_end = stop
    out = [GemmShape(op=k[0], dims=k[1], dtypes=k[2], strides=k[3], concrete=k[4], backward=k[5],
                     calls=len(d), trace_us=float(sum(d))) for k, d in groups.items()]
    out.sort(key=lambda s: (-s.trace_us, s.op, str(s.dims)))
    return tuple(out), names_us


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


# -- in-place adds -------------------------------------------------------------------------------

INPLACE_ADD = frozenset({"aten::add_", "aten::lerp_"})
"""In-place operators that read two same-shaped tensors and write one: plain SGD's
``param.add_(update)``, Adam's ``exp_avg.lerp_(grad, 1 - beta1)``; on a CPU each moves
the bytes a gradient accumulated by ``grad += new`` does (memory-bound)."""
INPLACE_ADD_MIN_BYTES = 1 << 20  # smaller adds are calls more than bytes
_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2}


@dataclass(frozen=True)
class InplaceAddRate:
    """How long the job's own in-place adds of two same-shaped tensors took per byte of
    the tensor added into, in the profiled window (host timing: a CPU trace): what
    adding a micro-batch's gradients into the gradients already there costs."""

    us_per_byte: float  # median over the calls
    calls: int
    bytes: int  # of the largest call
    source: str  # in words


def inplace_add_rate(path: str | Path) -> InplaceAddRate | None:
    """The rate of the window's ``INPLACE_ADD`` calls whose first two inputs are tensors
    of the same dims and float type of at least INPLACE_ADD_MIN_BYTES (memory-bound: the
    optimizer's, a gradient accumulated). None for a GPU trace, a trace without recorded
    shapes, or no such call. Raises ShapeError when the file cannot be read."""
    events = _load(path).traceEvents or ()
    if any(ev.cat == "kernel" for ev in events):
        return None  # on a GPU the host's add_ only launches a kernel
    spans = [(float(ev.ts), float(ev.ts) + float(ev.dur)) for ev in events
             if ev.name and ev.name.startswith(STEP_PREFIX) and ev.ts is not None and ev.dur is not None]
    lo = min((a for a, _ in spans), default=float("-inf"))
    hi = max((b for _, b in spans), default=float("inf"))
    rates: list[float] = []
    largest = 0
    for ev in events:
        if ev.name not in INPLACE_ADD or ev.cat != "cpu_op" or ev.ts is None or ev.dur is None \
                or not lo <= ev.ts < hi or ev.dur <= 0:
            continue
        args = _decode(ev.args)
        dims, types = args.dims, args.types
        if not (isinstance(dims, list) and isinstance(types, list) and len(dims) >= 2 and len(types) >= 2):
            continue
        d0, d1 = _dims(dims[0]), _dims(dims[1])
        size = _ELEMENT_BYTES.get(str(types[0]))
        if d0 is None or d0 != d1 or size is None or types[0] != types[1]:
            continue
        n = size
        for d in d0:
            n *= d
        if n < INPLACE_ADD_MIN_BYTES:
            continue
        rates.append(float(ev.dur) / n)
        largest = max(largest, n)
    if not rates:
        return None
    return InplaceAddRate(statistics.median(rates), len(rates), largest,
                          f"{len(rates)} in-place adds (add_, lerp_) of {INPLACE_ADD_MIN_BYTES >> 20} MiB or more "
                          f"in the window (the largest {largest / 2**20:.0f} MiB), median")
