"""The efficiency block from counts, steps and peaks given by hand: MFU, HFU, the peak
chosen and blended, ranks that share a device, throughput, what it says when it cannot
tell, and the evidence it adds to findings."""

from __future__ import annotations

from typing import Any

import pytest

from factories import rank
from pardiag.analysis_efficiency import MAX_RANKS, efficiency_from_dict
from pardiag.analyzers.efficiency import Inputs, analyze, blended_peak, mfu_evidence, resolve_precision
from pardiag.analyzers.factors import MeasuredPeak, Read
from pardiag.analyzers.flops import FlopCount
from pardiag.rank_meta import RankMeta
from pardiag.step_records import StepRecord

STEP_US = 100_000.0  # 100 ms


def count(model: float, steps: int = 2, recompute: float = 0.0, precision: str = "bf16",
          fwd_share: float = 1 / 3) -> FlopCount:
    """`model` and `recompute` FLOPs per step, over `steps` steps."""
    return FlopCount(steps=steps, forward=model * fwd_share * steps, backward=model * (1 - fwd_share) * steps,
                     recompute=recompute * steps, model_by_precision={precision: model * steps},
                     recompute_by_precision={precision: recompute * steps} if recompute else {},
                     by_kind={"matmul": model * steps}, calls=10)


def meta(rank: int, name: str | None = "NVIDIA H100 80GB HBM3", index: int | None = None, **kw: Any) -> RankMeta:
    doc: dict[str, Any] = {"rank": rank, "host": "n0",
                           "device": {"type": "cuda", "name": name, "index": rank if index is None else index}}
    doc.update(kw)
    return RankMeta.from_mapping(doc)


def test_mfu_and_hfu_against_the_datasheet() -> None:
    # 100 TFLOP per 100 ms step on an H100 SXM in bf16 (989.5 TFLOP/s dense): 1,000 TFLOP/s
    # would be 101%; 49.475 TFLOP per step is 50%
    model = 0.5 * 989.5e12 * 0.1
    e = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(model, recompute=model / 4)},
                       metas={0: meta(0)}, job_step_us=STEP_US, job_step_source="all steps"))
    assert e is not None and e.reason is None
    assert e.mfu == pytest.approx(0.5) and e.hfu == pytest.approx(0.625)
    assert e.model_tflops == pytest.approx(494.75) and e.peak_tflops == pytest.approx(989.5)
    assert e.peak is not None and e.peak.source == "table" and e.peak.row == "H100 SXM"
    assert "H100 Tensor Core GPU datasheet" in e.peak.reference
    assert e.ranks[0].mfu == pytest.approx(0.5) and e.precision_share == {"bf16": 1.0}
    assert e.recompute_flops_per_step == pytest.approx(model / 4)


def test_float32_is_tf32_only_where_the_job_allowed_it() -> None:
    peak = {"fp32": 19.5, "tf32": 156.0}
    assert resolve_precision("float32:matmul", "cuda", peak, {}) == "fp32"  # torch's default
    assert resolve_precision("float32:conv", "cuda", peak, {}) == "tf32"  # cuDNN's default
    assert resolve_precision("float32:matmul", "cuda", peak, {"cuda_matmul_allow_tf32": True}) == "tf32"
    assert resolve_precision("float32:conv", "cuda", peak, {"cudnn_allow_tf32": False}) == "fp32"
    assert resolve_precision("float32:matmul", "cpu", peak, {"cuda_matmul_allow_tf32": True}) == "fp32"
    assert resolve_precision("tf32", "cuda", peak, {}) == "tf32"  # the kernels said so


def test_precisions_blend_by_their_flops() -> None:
    # 3 units at 300/s and 1 unit at 100/s take 0.01 + 0.01: 4 units in 0.02 s, 200/s
    assert blended_peak({"bf16": 3.0, "fp32": 1.0}, {"bf16": 300.0, "fp32": 100.0}) == (pytest.approx(200.0), [])
    assert blended_peak({"fp8": 1.0}, {"bf16": 300.0}) == (None, ["fp8"])


def test_ranks_on_one_gpu_share_its_peak() -> None:
    model = 0.1 * 312e12 * 0.1  # 10% of an A100's bf16 peak per rank
    ranks = [rank(r, step_p50=STEP_US) for r in (0, 1)]
    e = analyze(Inputs(ranks=ranks, flops={0: count(model), 1: count(model)},
                       metas={r: meta(r, "NVIDIA A100-SXM4-80GB", index=0) for r in (0, 1)},
                       job_step_us=STEP_US))
    assert e is not None
    assert [x.mfu for x in e.ranks] == [pytest.approx(0.1)] * 2  # each against the whole GPU
    assert e.peak_tflops == pytest.approx(312.0) and e.mfu == pytest.approx(0.2)  # the job: one GPU
    assert any("share a device" in n for n in e.notes)


def test_a_cpu_is_measured_and_says_so() -> None:
    measured = MeasuredPeak({"fp32": 0.06, "bf16": 0.005}, {"fp32": 1024, "bf16": 256}, "cpu", "AMD EPYC", 1,
                            "measured: a square matrix multiply timed on this host's CPU after the job")
    e = analyze(Inputs(ranks=[rank(0, device="cpu", step_p50=STEP_US)], flops={0: count(1.5e9, precision="float32:matmul")},
                       job_step_us=STEP_US, measured=Read(measured)))
    assert e is not None and e.peak is not None and e.peak.source == "measured"
    assert e.mfu == pytest.approx(15e9 / 0.06e12) and e.precision_share == {"fp32": 1.0}


def test_without_a_peak_it_says_why_and_keeps_the_rate() -> None:
    e = analyze(Inputs(ranks=[rank(0, device="cpu", step_p50=STEP_US)], flops={0: count(1.5e9)}, job_step_us=STEP_US,
                       measured=Read(None, "gemm.json: not recorded")))
    assert e is not None and e.mfu is None and e.model_tflops == pytest.approx(0.015)
    assert e.reason is not None and "gemm.json: not recorded" in e.reason
    unknown = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(1e12)},
                             metas={0: meta(0, "NVIDIA GeForce RTX 4090")}, job_step_us=STEP_US))
    assert unknown is not None and unknown.mfu is None and "RTX 4090 is not in pardiag's table" in (unknown.reason or "")


def test_without_shapes_it_says_so() -> None:
    e = analyze(Inputs(ranks=[rank(0)], flops={0: FlopCount(3, 0.0, 0.0, 0.0, calls_without_shapes=42)}))
    assert e is not None and e.mfu is None and e.ranks_counted == 0 and "no input shapes" in (e.reason or "")
    assert analyze(Inputs(ranks=[rank(0)], flops={})) is None  # no trace read: no block


def _steps(elems: float, backwards: float = 1.0, n: int = 12) -> list[StepRecord]:
    return [StepRecord(step=s, t_end_ns=None, dur_us=STEP_US, pardiag_us=0.0,
                       signals={"input_elements": elems, "backwards": backwards}) for s in range(n)]


def test_tokens_from_the_first_input_and_samples_from_the_dataloader() -> None:
    tokens = meta(0, inputs={"first": {"shape": [16, 64], "dtype": "int64"}})
    e = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(1e12)}, metas={0: tokens},
                       step_records={0: _steps(2 * 16 * 64)}, job_step_us=STEP_US))  # two micro-batches a step
    assert e is not None and e.ranks[0].samples_per_step == 32 and e.ranks[0].tokens_per_step == 2048
    assert e.samples_per_s == pytest.approx(320.0) and e.tokens_per_s == pytest.approx(20480.0)
    floats = meta(0, inputs={"first": {"shape": [32, 3, 8, 8], "dtype": "float32"}})
    e = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(1e12)}, metas={0: floats},
                       step_records={0: _steps(32 * 3 * 8 * 8)}, job_step_us=STEP_US))
    assert e is not None and e.samples_per_s == pytest.approx(320.0) and e.tokens_per_s is None
    loader = meta(0, dataloaders=[{"batch_size": 8}])
    e = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(1e12)}, metas={0: loader},
                       step_records={0: _steps(0, backwards=4)}, job_step_us=STEP_US))
    assert e is not None and e.samples_per_s == pytest.approx(320.0) and "batch size (8)" in (e.throughput_source or "")


def test_the_block_is_bounded_and_reads_back() -> None:
    n = MAX_RANKS + 36
    ranks = [rank(r, step_p50=STEP_US) for r in range(n)]
    flops = {r: count(1e13 * (1 + r % 7)) for r in range(n)}
    e = analyze(Inputs(ranks=ranks, flops=flops, metas={r: meta(r) for r in range(n)}, job_step_us=STEP_US))
    assert e is not None and len(e.ranks) == MAX_RANKS and e.ranks_counted == n
    kept = {x.rank for x in e.ranks}
    assert max(flops[r].model for r in kept) <= min(flops[r].model for r in range(n) if r not in kept)  # the lowest MFU
    assert [x.rank for x in e.ranks] == sorted(kept)
    from dataclasses import asdict

    back = efficiency_from_dict(asdict(e))
    assert back == e


def test_mfu_is_evidence_for_host_and_communication_levers() -> None:
    model = 0.05 * 494.5e12 * 0.1  # 5% of an H100 SXM's TF32 peak
    e = analyze(Inputs(ranks=[rank(0, step_p50=STEP_US)], flops={0: count(model, precision="tf32")},
                       metas={0: meta(0)}, job_step_us=STEP_US))
    host = mfu_evidence("dataloader", e, 0.02)
    assert host is not None and host.startswith("MFU 5.0%") and "input or host work" in host
    assert mfu_evidence("dataloader", e, 0.2) is None  # much exposed communication: MFU does not point at the host
    comm = mfu_evidence("comm_overlap", e, 0.2)
    assert comm is not None and "20.0% of the profiled time" in comm
    mp = mfu_evidence("mixed_precision", e, 0.0)
    assert mp is not None and "tf32 100%" in mp and "bf16 peak (990 TFLOP/s) is 2x the tf32 peak" in mp
    assert mfu_evidence("batch_size", e, 0.0) is None and mfu_evidence("dataloader", None, 0.0) is None


# -- the GPU fixtures, through the whole analysis ----------------------------------------------------

def test_the_a100_fixture_names_its_device_but_recorded_no_shapes() -> None:
    from conftest import FIXTURES
    from pardiag.analyzers.pipeline import analyze_path

    a = analyze_path(FIXTURES / "gpu-traces" / "a100-2rank-rank0", jobs=1)
    e = a.efficiency
    assert a.run.device_name == "NVIDIA A100-PG509-200"
    assert e is not None and e.mfu is None and e.ranks_counted == 0 and "no input shapes" in (e.reason or "")
    assert a.job_summary.mfu is None and a.ranks[0].mfu is None


def test_the_sampled_a100_job_against_the_a100_datasheet() -> None:
    """The sampled job's traces name no device (no deviceProperties); their GEMM kernels are
    sm80 cutlass kernels, an A100's. Its MFU against the A100 row: the model FLOPs per step
    of each rank (torch's flop_counter on the recorded shapes: tracegen.matmul_flops_by_torch) over
    its profiled step, against 156 TFLOP/s for the TF32 products and 19.5 for the FP32 ones."""
    from conftest import FIXTURES
    from pardiag.analyzers.pipeline import analyze_path
    from tracegen import matmul_flops_by_torch

    folder = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    a = analyze_path(folder, jobs=1)
    e = a.efficiency
    assert e is not None and e.mfu is None and "the GPU is not named" in (e.reason or "")
    from pardiag.analyzers.rank_trace import analyze_rank_trace
    from pardiag.analyzers.trace import load_trace

    flops = {}
    for r in a.ranks:
        c = FlopCount.from_dict(analyze_rank_trace(load_trace(folder / f"sampled_rank-{r.rank}.json.gz")).flops or {})
        hand, steps = matmul_flops_by_torch(folder / f"sampled_rank-{r.rank}.json.gz")
        assert c.model == hand and e.ranks[r.rank].model_flops_per_step == hand / steps
        flops[r.rank] = c
    with_name = analyze(Inputs(ranks=a.ranks, flops=flops, device_name="NVIDIA A100-SXM4-40GB",
                               job_step_us=a.job_summary.step_p50_us))
    assert with_name is not None and with_name.peak is not None and with_name.peak.row == "A100"
    for x in with_name.ranks:
        c = flops[x.rank]
        r = a.ranks[x.rank]
        step_us = r.window_us / r.steps_profiled
        tf32 = c.model_by_precision.get("tf32", 0.0)
        fp32 = c.model - tf32  # kernels that said FP32, and products whose kernels said nothing (torch's default)
        peak = c.model / (tf32 / 156e12 + fp32 / 19.5e12)
        assert x.mfu == pytest.approx(c.model / c.steps / (step_us * 1e-6) / peak)
        assert 0.001 < x.mfu < 0.05  # a sampled trace: part of its products were left out
