"""FLOPs of one operator call from its recorded inputs: each rule against a count worked
out by hand, and against torch.utils.flop_counter run on the same call (meta tensors,
so no arithmetic is done)."""

from __future__ import annotations

import pytest

from pardiag.analyzers.flop_rules import OP_NAMES, RULES, Call, call_of, conv_output, op_flops

torch = pytest.importorskip("torch")


def call(dims: list, types: list[str] | None = None, concrete: list[str] | None = None) -> Call:
    types = types or ["float" if d else "Scalar" for d in dims]
    got = call_of(dims, types, concrete or [""] * len(dims))
    assert got is not None
    return got


def torch_count(fn) -> int:  # type: ignore[no-untyped-def]
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def meta(*shape: int) -> "torch.Tensor":
    return torch.empty(*shape, device="meta")


def test_matrix_products_by_hand() -> None:
    assert op_flops("aten::mm", call([[64, 512], [512, 256]])).flops == 2 * 64 * 512 * 256
    assert op_flops("aten::addmm", call([[256], [64, 512], [512, 256], [], []])).flops == 2 * 64 * 512 * 256
    assert op_flops("aten::bmm", call([[8, 16, 32], [8, 32, 4]])).flops == 2 * 8 * 16 * 32 * 4
    assert op_flops("aten::baddbmm", call([[8, 16, 4], [8, 16, 32], [8, 32, 4], [], []])).flops == 2 * 8 * 16 * 32 * 4


def test_the_operand_names_the_precision_and_kind() -> None:
    f = op_flops("aten::addmm", call([[8], [4, 8], [8, 8], [], []],
                                     ["float", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]))
    assert (f.kind, f.dtype) == ("matmul", "c10::BFloat16")


CONVS = [  # input, weight, stride, padding, dilation, transposed, output_padding, groups
    ([2, 3, 17, 17], [8, 3, 3, 3], [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
    ([2, 8, 9, 9], [16, 4, 3, 5], [1, 1], [1, 2], [1, 1], False, [0, 0], 2),
    ([2, 16, 9, 9], [16, 4, 2, 2], [2, 2], [0, 0], [1, 1], True, [0, 0], 1),
    ([1, 4, 10], [6, 4, 3], [1], [0], [2], False, [0], 1),
]


def _conv_call(x, w, s, p, d, t, op, g) -> Call:  # type: ignore[no-untyped-def]
    return call([x, w, [w[1] * g if t else w[0]], [], [], [], [], [], []],
                ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
                ["", "", "", str(s), str(p), str(d), str(t), str(op), str(g)])


def test_a_convolution_by_hand() -> None:
    # 8 filters of 3x3x3 over a 2x3x17x17 batch, stride 2, padding 1: a 9x9 output
    f = op_flops("aten::convolution", _conv_call(*CONVS[0]))
    assert f.flops == 2 * 2 * 8 * 3 * 3 * 3 * 9 * 9 and f.kind == "conv"
    assert conv_output([2, 3, 17, 17], [8, 3, 3, 3], [2, 2], [1, 1], [1, 1], False, [0, 0], 1) == [2, 8, 9, 9]


@pytest.mark.parametrize("x, w, s, p, d, t, op, g", CONVS)
def test_convolutions_agree_with_torch(x, w, s, p, d, t, op, g) -> None:  # type: ignore[no-untyped-def]
    bias = w[1] * g if t else w[0]
    expect = torch_count(lambda: torch.ops.aten.convolution(meta(*x), meta(*w), meta(bias), s, p, d, t, op, g))
    assert op_flops("aten::convolution", _conv_call(x, w, s, p, d, t, op, g)).flops == expect


@pytest.mark.parametrize("x, w, s, p, d, t, op, g", CONVS)
@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [True, False, False]])
def test_convolution_backward_agrees_with_torch(x, w, s, p, d, t, op, g, mask) -> None:  # type: ignore[no-untyped-def]
    out = conv_output(x, w, s, p, d, t, op, g)
    bias = [w[1] * g if t else w[0]]
    expect = torch_count(lambda: torch.ops.aten.convolution_backward(
        meta(*out), meta(*x), meta(*w), bias, s, p, d, t, op, g, mask))
    c = call([out, x, w, [], [], [], [], [], [], [], []],
             ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList",
              "Scalar", "ScalarList"],
             ["", "", "", str(bias), str(s), str(p), str(d), str(t), str(op), str(g), str(mask)])
    assert op_flops("aten::convolution_backward", c).flops == expect


def test_attention_by_hand_and_as_torch_counts_it_on_a_gpu() -> None:
    q = [2, 4, 16, 8]
    fwd = 2 * (2 * 4) * 16 * 16 * 8 * 2  # scores q·kᵀ, then their product with v
    c = call([q, q, q, [], [], [], []], ["float", "float", "float", "Scalar", "Scalar", "", ""])
    assert op_flops("aten::_scaled_dot_product_flash_attention_for_cpu", c).flops == fwd
    assert op_flops("aten::_scaled_dot_product_flash_attention", c).flops == fwd
    # torch's rule for the backward: the scores recomputed and four gradient products
    bwd = call([q, q, q, q, q, [2, 4, 16], [], [], [], []],
               ["float"] * 6 + ["Scalar", "Scalar", "", ""])
    assert op_flops("aten::_scaled_dot_product_flash_attention_for_cpu_backward", bwd).flops == 5 * fwd // 2
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    assert sdpa_flop_count(q, q, q) == fwd and sdpa_backward_flop_count(q, q, q, q) == 5 * fwd // 2


def test_the_bshd_kernels_read_their_layout_and_refuse_packed_sequences() -> None:
    q = [2, 16, 4, 8]  # [B, S, H, D]
    dense = call([q, q, q, [], [], [], []], ["c10::BFloat16"] * 3 + ["", "", "Scalar", "Scalar"])
    assert op_flops("aten::_flash_attention_forward", dense).flops == 2 * (2 * 4) * 16 * 16 * 8 * 2
    packed = call([q, q, q, [3], [3], [], []], ["c10::BFloat16"] * 3 + ["int", "int", "Scalar", "Scalar"])
    with pytest.raises(ValueError, match="variable-length"):
        op_flops("aten::_flash_attention_forward", packed)


def test_no_shapes_no_call_and_unreadable_inputs_raise() -> None:
    assert call_of(None, None, None) is None
    assert call_of([[2, 2]], ["float", "float"], None) is None
    with pytest.raises(ValueError):
        op_flops("aten::convolution", call([[1, 1, 4, 4], [1, 1, 3, 3], [], [], [], [], [], [], []],
                                           ["float", "float", ""] + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"]))
    with pytest.raises(ValueError):
        op_flops("aten::relu", call([[2, 2]]))


def test_the_name_pattern_is_the_rules() -> None:
    assert all(OP_NAMES.match(n) for n in RULES)
    assert not OP_NAMES.match("aten::linear") and not OP_NAMES.match("aten::mm_out")
