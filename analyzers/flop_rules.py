"""Floating-point operations of one operator call, from the input shapes the profiler
recorded (``record_shapes``: ``Input Dims``, ``Input type``, ``Concrete Inputs``).

The rules are those of ``torch.utils.flop_counter`` (its ``flop_registry``), applied to
the operators as the trace names them: a multiply-add is 2 FLOPs; ``mm``/``addmm``
2·M·K·N (a bias add is not counted); ``bmm``/``baddbmm`` 2·B·M·K·N; a convolution
2·N·C_out·(C_in/groups)·prod(kernel)·prod(output positions), its backward the same per
gradient it computes (``output_mask``; the weight gradient as torch counts it, which
leaves groups out); scaled dot-product attention 2·B·H·S_q·S_kv·(D_qk + D_v) forward and
the five batched products of its backward (the scores recomputed included), causal or
not. Elementwise operators, norms and softmax count nothing, as in torch.

Beyond torch's registry: ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its
backward, the attention torch runs on CPUs (``FlopCounterMode`` counts nothing there).

`OP_NAMES` is the set of names that count; an operator nested in another one of the set
(``aten::convolution`` calls ``aten::_convolution``) belongs to the outer one, which
`pardiag.analyzers.flops` applies. Pure: no torch, no trace.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Kind = str  # "matmul" | "conv" | "attention"


@dataclass(frozen=True)
class OpFlops:
    flops: float
    kind: Kind
    dtype: str  # the operand's element type as the trace names it ("float", "c10::BFloat16")


@dataclass(frozen=True)
class Call:
    """One call's recorded inputs, per argument: sizes (None for a non-tensor), element
    type ("Scalar", "" for an absent optional tensor), and the value of a non-tensor
    argument as text ("[1, 1]", "True", "")."""

    dims: tuple[tuple[int, ...] | None, ...]
    types: tuple[str, ...]
    concrete: tuple[str, ...]

    def shape(self, i: int, rank: int | None = None) -> tuple[int, ...]:
        d = self.dims[i] if i < len(self.dims) else None
        if d is None or (rank is not None and len(d) != rank):
            raise ValueError(f"argument {i} has no {rank or ''}-d shape")
        return d

    def value(self, i: int) -> Any:
        text = self.concrete[i] if i < len(self.concrete) else ""
        if text == "":
            raise ValueError(f"argument {i}'s value was not recorded")
        return ast.literal_eval(text)

    def dtype(self, i: int) -> str:
        return self.types[i] if i < len(self.types) else ""


def _mm(m: int, k: int, n: int, batch: int = 1) -> float:
    return 2.0 * batch * m * k * n


def mm(c: Call) -> OpFlops:
    (m, k), (_, n) = c.shape(0, 2), c.shape(1, 2)
    return OpFlops(_mm(m, k, n), "matmul", c.dtype(0))


def addmm(c: Call) -> OpFlops:  # (bias, mat1, mat2, beta, alpha)
    (m, k), (_, n) = c.shape(1, 2), c.shape(2, 2)
    return OpFlops(_mm(m, k, n), "matmul", c.dtype(1))


def bmm(c: Call) -> OpFlops:
    (b, m, k), (_, _, n) = c.shape(0, 3), c.shape(1, 3)
    return OpFlops(_mm(m, k, n, b), "matmul", c.dtype(0))


def baddbmm(c: Call) -> OpFlops:  # (bias, batch1, batch2, beta, alpha)
    (b, m, k), (_, _, n) = c.shape(1, 3), c.shape(2, 3)
    return OpFlops(_mm(m, k, n, b), "matmul", c.dtype(1))


def conv_flops(x: Sequence[int], w: Sequence[int], out: Sequence[int], transposed: bool) -> float:
    """torch's conv_flop_count: batch x positions x filter x C_out x C_in(of w) x 2; the
    positions are the output's, or the input's for a transposed convolution."""
    positions = x[2:] if transposed else out[2:]
    c_out, c_in, *kernel = w
    return 2.0 * x[0] * math.prod(positions) * math.prod(kernel) * c_out * c_in


def _ints(v: Any, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    out = [int(x) for x in v]
    return out * n if len(out) == 1 else out


def conv_output(x: Sequence[int], w: Sequence[int], stride: Any, padding: Any, dilation: Any,
                transposed: bool, output_padding: Any, groups: int) -> list[int]:
    """The output's sizes of a convolution (N, C_out, *positions)."""
    n = len(x) - 2
    s, p, d = _ints(stride, n), _ints(padding, n), _ints(dilation, n)
    k = w[2:]
    if transposed:
        op = _ints(output_padding, n)
        pos = [(x[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1 for i in range(n)]
        return [x[0], w[1] * groups, *pos]
    pos = [(x[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(n)]
    return [x[0], w[0], *pos]


def convolution(c: Call) -> OpFlops:
    """aten::convolution / _convolution / convolution_overrideable: (input, weight, bias,
    stride, padding, dilation, transposed, output_padding, groups, ...)."""
    x, w = c.shape(0), c.shape(1)
    transposed = bool(c.value(6))
    padding = c.value(4)
    if isinstance(padding, str):
        raise ValueError(f"padding {padding!r} is not a size")
    out = conv_output(x, w, c.value(3), padding, c.value(5), transposed, c.value(7), int(c.value(8)))
    return OpFlops(conv_flops(x, w, out, transposed), "conv", c.dtype(0))


def cudnn_convolution(c: Call) -> OpFlops:
    """aten::cudnn_convolution: (input, weight, padding, stride, dilation, groups, ...)."""
    x, w = c.shape(0), c.shape(1)
    out = conv_output(x, w, c.value(3), c.value(2), c.value(4), False, 0, int(c.value(5)))
    return OpFlops(conv_flops(x, w, out, False), "conv", c.dtype(0))


def slow_conv2d(c: Call) -> OpFlops:
    """aten::_slow_conv2d_forward: (input, weight, kernel_size, bias, stride, padding)."""
    x, w = c.shape(0), c.shape(1)
    out = conv_output(x, w, c.value(4), c.value(5), 1, False, 0, 1)
    return OpFlops(conv_flops(x, w, out, False), "conv", c.dtype(0))


def _swap01(s: Sequence[int]) -> list[int]:
    return [s[1], s[0], *s[2:]]


def convolution_backward(c: Call) -> OpFlops:
    """(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): torch's conv_backward_flop."""
    g, x, w = c.shape(0), c.shape(1), c.shape(2)
    transposed = bool(c.value(7))
    mask = c.value(10)
    flops = 0.0
    if mask[0]:  # the input's gradient: a convolution of grad_output with the weight
        flops += conv_flops(g, w, x, not transposed)
    if mask[1]:  # the weight's gradient
        if transposed:
            flops += conv_flops(_swap01(g), _swap01(x), _swap01(w), False)
        else:
            flops += conv_flops(_swap01(x), _swap01(g), _swap01(w), False)
    return OpFlops(flops, "conv", c.dtype(0))


def sdpa_forward(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> float:
    """[B, H, S, D] shapes: scores q·kᵀ and their product with v."""
    b, h, s_q, d_q = q
    s_k, d_v = k[2], v[3]
    return _mm(s_q, d_q, s_k, b * h) + _mm(s_q, s_k, d_v, b * h)


def sdpa_backward(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> float:
    """The scores recomputed, the gradients of scores, v, q and k: five batched products."""
    b, h, s_q, d_q = q
    s_k, d_v = k[2], v[3]
    bh = b * h
    return (_mm(s_q, d_q, s_k, bh) + _mm(s_q, d_v, s_k, bh) + _mm(s_k, s_q, d_v, bh)
            + _mm(s_q, s_k, d_q, bh) + _mm(d_q, s_q, s_k, bh))


def _bhsd(s: tuple[int, ...]) -> tuple[int, ...]:
    """[B, S, H, D] (the _flash/_efficient attention kernels' layout) as [B, H, S, D]."""
    return (s[0], s[2], s[1], s[3])


def _attention(first: int, backward: bool, bshd: bool = False) -> Callable[[Call], OpFlops]:
    """q, k, v at arguments first, first+1, first+2 (after grad_output in a backward)."""
    def rule(c: Call) -> OpFlops:
        q, k, v = (c.shape(first + i, 4) for i in range(3))
        if bshd:
            q, k, v = _bhsd(q), _bhsd(k), _bhsd(v)
        f = sdpa_backward(q, k, v) if backward else sdpa_forward(q, k, v)
        return OpFlops(f, "attention", c.dtype(first))
    return rule


def _dense_only(rule: Callable[[Call], OpFlops], cum_seq_arg: int) -> Callable[[Call], OpFlops]:
    """Variable-length (packed) attention gives cumulative sequence lengths: its shapes
    say nothing of the sequences, so it is not counted."""
    def checked(c: Call) -> OpFlops:
        if cum_seq_arg < len(c.types) and c.types[cum_seq_arg] not in ("", "Scalar"):
            raise ValueError("variable-length attention (cumulative sequence lengths)")
        return rule(c)
    return checked


RULES: dict[str, Callable[[Call], OpFlops]] = {
    "aten::mm": mm,
    "aten::addmm": addmm,
    "aten::bmm": bmm,
    "aten::baddbmm": baddbmm,
    "aten::_scaled_mm": mm,
    "aten::convolution": convolution,
    "aten::_convolution": convolution,
    "aten::convolution_overrideable": convolution,
    "aten::cudnn_convolution": cudnn_convolution,
    "aten::_slow_conv2d_forward": slow_conv2d,
    "aten::convolution_backward": convolution_backward,
    "aten::_scaled_dot_product_flash_attention": _attention(0, False),
    "aten::_scaled_dot_product_flash_attention_backward": _attention(1, True),
    "aten::_scaled_dot_product_efficient_attention": _attention(0, False),
    "aten::_scaled_dot_product_efficient_attention_backward": _attention(1, True),
    "aten::_scaled_dot_product_cudnn_attention": _attention(0, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": _attention(1, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention(0, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attention(1, True),
    "aten::_flash_attention_forward": _dense_only(_attention(0, False, bshd=True), 3),
    "aten::_flash_attention_backward": _dense_only(_attention(1, True, bshd=True), 6),
    "aten::_efficient_attention_forward": _dense_only(_attention(0, False, bshd=True), 4),
    "aten::_efficient_attention_backward": _dense_only(_attention(1, True, bshd=True), 6),
}
OP_NAMES = re.compile("^(" + "|".join(re.escape(n) for n in RULES) + ")$")


def op_flops(name: str, call: Call) -> OpFlops:
    """The FLOPs of one call of `name` (one of `RULES`). Raises ValueError when the
    recorded inputs do not give them (no shapes, a value not recorded, another overload)."""
    rule = RULES.get(name)
    if rule is None:
        raise ValueError(f"{name} has no FLOP rule")
    try:
        return rule(call)
    except (IndexError, TypeError, ValueError, SyntaxError, KeyError) as e:
        raise ValueError(f"{name}: {e}") from None


def call_of(dims: Any, types: Any, concrete: Any) -> Call | None:
    """A Call from the trace's ``Input Dims``, ``Input type`` and ``Concrete Inputs``; None
    when the operator was recorded without shapes."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    t = tuple(str(x) for x in types)
    d = tuple(tuple(x) if isinstance(x, list) and all(isinstance(i, int) for i in x) and t[j] not in ("Scalar", "ScalarList", "")
              else None for j, x in enumerate(dims))
    conc = concrete if isinstance(concrete, list) and len(concrete) == len(d) else [""] * len(d)
    return Call(d, t, tuple(str(x) if x is not None else "" for x in conc))
