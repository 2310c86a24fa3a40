"""MFU and HFU of real two-rank DDP jobs (gloo, CPU) whose FLOPs are counted by hand
(tests/scripts/mfu_linears.py), recorded by `pardiag run` with the measurement after
the job: the FLOPs pardiag counts from the profiled window equal the hand count and
torch.utils.flop_counter's count of the same model, the peak is the square GEMM measured
on this host, and checkpointing shows as HFU over MFU by the recomputed forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, read_json, run_pardiag, torchrun

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

LINEAR = 2 * 64 * 512 * 512  # one Linear(512, 512) on a batch of 64
FORWARD = 4 * LINEAR  # 134,217,728
BACKWARD = 7 * LINEAR  # weight and input gradients, no input gradient for the first layer: 234,881,024


def record(tmp_path: Path, *script_args: str) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "run"
    res = run_pardiag("run", "--out", str(out), "--no-report", "--",
                      *torchrun(2, SCRIPTS / "mfu_linears.py", *script_args), measure=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    return doc, out


def flop_counter(checkpointed: bool) -> tuple[int, int]:
    """(FLOPs of one step, of its forward alone) by torch's FlopCounterMode, on the
    job's model."""
    from torch.utils.flop_counter import FlopCounterMode

    sys.path.insert(0, str(SCRIPTS))
    try:
        from mfu_linears import BATCH, DIM, Linears
    finally:
        sys.path.remove(str(SCRIPTS))
    model, x = Linears(checkpointed), torch.randn(BATCH, DIM)
    with FlopCounterMode(display=False) as step:
        model(x).pow(2).mean().backward()
    with FlopCounterMode(display=False) as fwd, torch.no_grad():
        model(x)
    return step.get_total_flops(), fwd.get_total_flops()


def test_model_flops_equal_the_hand_count_and_mfu_uses_the_measured_peak(tmp_path: Path) -> None:
    doc, out = record(tmp_path)
    e = doc["efficiency"]
    total, forward = flop_counter(False)
    assert total == FORWARD + BACKWARD == 369_098_752 and forward == FORWARD
    assert [r["model_flops_per_step"] for r in e["ranks"]] == [FORWARD + BACKWARD] * 2
    assert e["forward_flops_per_step"] == 2 * FORWARD and e["backward_flops_per_step"] == 2 * BACKWARD
    assert e["recompute_flops_per_step"] == 0 and e["model_flops_per_step"] == 2 * total
    assert e["precision_share"] == {"fp32": 1.0} and e["kind_share"] == {"matmul": 1.0}

    # the peak: the square GEMM timed after the job, in fp32, with the job's one thread
    gemm = read_json(out / "factors" / "gemm.json")
    fp32 = gemm["peak"]["float32"]["tflops"]
    assert e["peak"]["source"] == "measured" and e["peak"]["tflops"]["fp32"] == fp32
    assert "square matrix multiply" in e["peak"]["reference"] and "1 thread" in e["peak"]["reference"]
    assert e["reason"] is None and e["mfu"] > 0
    for r, rank in zip(e["ranks"], doc["ranks"]):
        assert r["peak_tflops"] == pytest.approx(fp32)
        assert r["model_tflops"] == pytest.approx(r["model_flops_per_step"] / rank["step_time_us"]["p50"] / 1e6)
        assert r["mfu"] == pytest.approx(r["model_tflops"] / fp32) == rank["mfu"] and r["hfu"] == r["mfu"]
    step = doc["summary"]["step_p50_us"]
    assert e["step_us"] == step and e["mfu"] == pytest.approx(2 * total / step / 1e6 / (2 * fp32))
    assert doc["summary"]["mfu"] == e["mfu"]

    # samples per second: 64 feature vectors per rank and step
    meta = read_json(out / "ranks" / "0" / "meta.json")
    assert meta["inputs"]["first"] == {"shape": [64, 512], "dtype": "float32", "seen_in": "DistributedDataParallel.forward"}
    assert [r["samples_per_step"] for r in e["ranks"]] == [64.0, 64.0] and e["tokens_per_s"] is None
    assert e["samples_per_s"] == pytest.approx(128 / step * 1e6)

    text = run_pardiag("analyze", str(out)).stdout
    assert "efficiency: MFU " in text and "measured peak" in text


def test_checkpointing_shows_as_hfu_over_mfu(tmp_path: Path) -> None:
    doc, _ = record(tmp_path, "--checkpoint")
    e = doc["efficiency"]
    total, _forward = flop_counter(True)
    # non-reentrant checkpointing of layers 1-2 recomputes layer 1's forward product in
    # backward (it stops inside layer 2's, before it computes: it has every tensor then)
    assert total == FORWARD + BACKWARD + LINEAR
    for r in e["ranks"]:
        assert r["model_flops_per_step"] == FORWARD + BACKWARD  # the model's FLOPs do not change
        assert r["hardware_flops_per_step"] == total
        assert r["hfu"] > r["mfu"] and r["hfu"] / r["mfu"] == pytest.approx(total / (FORWARD + BACKWARD))
    assert e["recompute_flops_per_step"] == 2 * LINEAR and e["hfu"] > e["mfu"]
    assert any("did no work" in n for n in e["notes"])
