"""A rank's FLOPs from a real torch.profiler trace, recorded here in this process with
the profiler's step schedule and record_shapes (as pardiag records), against counts
worked out by hand and torch.utils.flop_counter's on the same model; and the GPU
fixtures (real A100 traces) against a count from their own recorded shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from conftest import FIXTURES
from tracegen import matmul_flops_by_torch
from pardiag.analyzers.flops import FlopCount
from pardiag.analyzers.rank_trace import analyze_rank_trace
from pardiag.analyzers.trace import load_trace

torch = pytest.importorskip("torch")

ACTIVE = 2
B, D, LAYERS = 64, 512, 4
LINEAR = 2 * B * D * D  # one Linear(512, 512) on a batch of 64: 33,554,432
GPU = FIXTURES / "gpu-traces"


def linears() -> "torch.nn.Module":
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(D, D) for _ in range(LAYERS)])


def record(path: Path, step: Callable[[], None]) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
                 schedule=schedule(wait=0, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + ACTIVE):
            step()
            p.step()


def counted(path: Path) -> FlopCount:
    r = analyze_rank_trace(load_trace(path))
    assert r.flops is not None and len(r.steps) == ACTIVE
    return FlopCount.from_dict(r.flops)


def flop_counter(step: Callable[[], None]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        step()
    return fc.get_total_flops()


def test_four_linears_by_hand_and_as_flop_counter_counts_them(tmp_path: Path) -> None:
    model, x = linears(), torch.randn(B, D)  # the input needs no gradient

    def step() -> None:
        model(x).sum().backward()

    path = tmp_path / "linears.json"
    record(path, step)
    c = counted(path)
    forward = LAYERS * LINEAR
    backward = 2 * forward - LINEAR  # weight and input gradients, but no input gradient for the first layer
    assert c.steps == ACTIVE
    assert c.forward / c.steps == forward == 134_217_728
    assert c.backward / c.steps == backward == 234_881_024
    assert c.recompute == 0 and c.model / c.steps == flop_counter(step) == 369_098_752
    assert c.model_by_precision == {"float32:matmul": c.model} and c.by_kind == {"matmul": c.model}
    assert c.calls == ACTIVE * (LAYERS + 2 * LAYERS - 1) and c.calls_without_shapes == 0


def checkpointed(reentrant: bool) -> Callable[[], None]:
    """A step of the four linears with layers 1 and 2 under torch.utils.checkpoint."""
    from torch.utils.checkpoint import checkpoint

    model, x = linears(), torch.randn(B, D)

    def step() -> None:
        h = model[0](x)
        h = checkpoint(lambda t: model[2](model[1](t)), h, use_reentrant=reentrant)
        model[3](h).sum().backward()

    return step


@pytest.mark.parametrize("reentrant, recomputed", [(True, 2), (False, 1)])
def test_checkpointing_is_counted_as_recomputation(tmp_path: Path, reentrant: bool, recomputed: int) -> None:
    """Layers 1 and 2 under torch.utils.checkpoint run forward again in backward. The
    non-reentrant form stops as soon as it has the tensors backward needs: inside layer
    2's addmm, before it computes, so one layer's FLOPs are recomputed, not two."""
    step = checkpointed(reentrant)
    path = tmp_path / "checkpoint.json"
    record(path, step)
    c = counted(path)
    assert c.model / c.steps == 369_098_752  # the model's FLOPs do not change
    assert c.recompute / c.steps == recomputed * LINEAR
    assert c.hardware / c.steps == flop_counter(step)
    assert c.recompute_aborted == (0 if reentrant else ACTIVE)


def test_a_stopped_recomputation_is_told_by_what_it_called_not_by_its_time(tmp_path: Path) -> None:
    """On a loaded host a stop can last as long as the product and a product can be quick.
    The recorded checkpoint trace is rewritten so that every recomputed addmm lasts the same
    as its fastest forward twin, children kept inside: the stopped ones (only detach inside)
    stay left out and the computed one stays counted; shrunk to a tenth, likewise."""
    import json

    path = tmp_path / "checkpoint.json"
    record(path, checkpointed(False))
    doc = json.loads(path.read_text())
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    bwd = [e for e in ev if e["name"].startswith("autograd::engine::evaluate_function")]
    addmm = [e for e in ev if e["name"] == "aten::addmm" and "Sequence number" in e.get("args", {})]

    def in_bwd(e: dict) -> bool:
        return any(b["tid"] == e["tid"] and b["ts"] <= e["ts"] < b["ts"] + b["dur"] for b in bwd)

    fastest = min(e["dur"] for e in addmm if not in_bwd(e))
    recomputed = [e for e in addmm if in_bwd(e)]
    assert len(recomputed) == 2 * ACTIVE  # layer 1 computed, layer 2 stopped, each step
    for scale in (1.0, 0.1):
        for e in sorted(recomputed, key=lambda e: -e["ts"]):
            end = e["ts"] + e["dur"]
            kids = [k for k in ev if k is not e and k["tid"] == e["tid"] and e["ts"] <= k["ts"] and k["ts"] + k["dur"] <= end]
            delta = scale * fastest - e["dur"]
            for k in ev:  # the thread's later events move by the change; the calls around it stretch
                if k["tid"] != e["tid"] or k is e or k in kids:
                    continue
                if k["ts"] >= end:
                    k["ts"] += delta
                elif k["ts"] <= e["ts"] and k["ts"] + k["dur"] >= end:
                    k["dur"] += delta
            e["dur"] += delta
            for i, k in enumerate(sorted(kids, key=lambda k: k["ts"])):  # the callees stay inside, in order
                k["dur"] = min(k["dur"], e["dur"] / (2 * len(kids)))
                k["ts"] = e["ts"] + e["dur"] * (i + 0.5) / (len(kids) + 1)
        path.write_text(json.dumps(doc))
        c = counted(path)
        assert c.recompute / c.steps == LINEAR and c.recompute_aborted == ACTIVE, scale


def test_a_convolution_and_attention_by_hand(tmp_path: Path) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    img = torch.randn(2, 3, 17, 17)
    q = torch.randn(2, 4, 16, 8, requires_grad=True)

    def step() -> None:
        y = conv(img).sum() + torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()
        y.backward()

    path = tmp_path / "conv.json"
    record(path, step)
    c = counted(path)
    conv_fwd = 2 * 2 * 8 * 3 * 3 * 3 * 9 * 9  # output 2x8x9x9, each a 3x3x3 filter
    attn_fwd = 2 * 8 * 16 * 16 * 8 * 2
    assert c.forward / c.steps == conv_fwd + attn_fwd
    # the image needs no gradient: the convolution's weight gradient only; attention's
    # backward is torch's five products
    assert c.backward / c.steps == conv_fwd + 5 * attn_fwd // 2
    assert c.by_kind == {"conv": 2 * ACTIVE * conv_fwd, "attention": ACTIVE * 7 * attn_fwd // 2}


def test_a_trace_without_shapes_counts_calls_but_no_flops(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    model, x = linears(), torch.randn(B, D)
    path = tmp_path / "noshapes.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
                 schedule=schedule(wait=0, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + ACTIVE):
            model(x).sum().backward()
            p.step()
    c = counted(path)
    assert c.model == 0 and c.calls == 0 and c.calls_without_shapes == ACTIVE * (LAYERS + 2 * LAYERS - 1)


# -- the GPU fixtures ------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_the_sampled_gpu_job_against_its_recorded_shapes(rank: int) -> None:
    path = GPU / "sampled-128rank-job" / f"sampled_rank-{rank}.json.gz"
    r = analyze_rank_trace(load_trace(path))
    c = FlopCount.from_dict(r.flops)  # type: ignore[arg-type]
    flops, steps = matmul_flops_by_torch(path)
    assert c.steps == steps == 2
    assert c.model == flops and c.recompute == 0
    # float32 products whose kernels are TF32 tensor-core GEMMs (cutlass s1688) are TF32;
    # those whose kernels are sgemm are FP32
    assert c.model_by_precision["tf32"] > 0.9 * c.model and c.model_by_precision["fp32"] > 0


def test_the_a100_trace_without_shapes_has_calls_but_no_flops() -> None:
    r = analyze_rank_trace(load_trace(GPU / "a100-2rank-rank0" / "nccl_data.json.gz"))
    c = FlopCount.from_dict(r.flops)  # type: ignore[arg-type]
    assert c.model == 0 and c.calls_without_shapes > 300  # conv, batch-norm ResNet: recorded without shapes
