"""Each lever rule on Analyses built by hand: it fires on its symptom with the saving
worked out below, and stays quiet on a healthy run or one that already uses the lever."""

from __future__ import annotations

from typing import Any

import pytest

from pardiag.analysis import Analysis, Straggler
from pardiag.analyzers.levers import what_if
from pardiag.analyzers.rules import advise
from factories import DDP_ONE_BUCKET, GB, analysis, rank


def levers(a: Analysis) -> dict[str, Any]:
    return {f.lever: f for f in advise(a).findings}


def test_exposed_communication_with_ddp() -> None:
    a = analysis([rank(0, compute=0.6, comm_exposed=0.2), rank(1, compute=0.6, comm_exposed=0.2)], DDP_ONE_BUCKET)
    f = levers(a)
    # accumulate 4: exposed 20% paid once per 4 -> 20% x 3/4 = 15%
    assert f["gradient_accumulation"].est_saving_pct == 15.0 and f["gradient_accumulation"].severity == "high"
    assert "no_sync" in f["gradient_accumulation"].action["code"]
    # one 40 MB bucket -> cap 10 MB; half of the exposed 20% overlaps backward -> 10%
    b = f["ddp_bucket_size"]
    assert b.est_saving_pct == 10.0 and "bucket_cap_mb=10" in b.action["code"]
    assert "gradient_as_bucket_view=True" in b.action["code"] and "static_graph=True" in b.action["code"]
    assert "comm_overlap" not in f  # DDP's overlap is its buckets


def test_a_cpu_job_that_takes_fresh_memory_every_step_is_told_accumulation_may_save_more() -> None:
    from dataclasses import replace

    def with_faults(a: Analysis, plain: float) -> Analysis:
        inf = replace(a.job_summary.profiled_step_inflation, page_faults={"profiled": 8192.0, "plain": plain})
        return replace(a, summary=replace(a.job_summary, profiled_step_inflation=inf))

    cpu = analysis([rank(r, compute=0.6, comm_exposed=0.2, device="cpu") for r in (0, 1)], DDP_ONE_BUCKET)
    # comm_bound's count: 8,160 faults of 4 KiB = 32 MB per step
    (line,) = [e for e in levers(with_faults(cpu, 8160.0))["gradient_accumulation"].evidence if "page-faults" in e]
    assert line.startswith("each step page-faults 8,160 times (32 MB touched fresh, steps.jsonl)")
    assert levers(with_faults(cpu, 8160.0))["gradient_accumulation"].est_saving_pct == 15.0  # not counted
    # under 1,000 faults per step, or on a GPU (its gradients are not host pages): nothing said
    assert not [e for e in levers(with_faults(cpu, 999.0))["gradient_accumulation"].evidence if "page-faults" in e]
    gpu = analysis([rank(r, compute=0.6, comm_exposed=0.2, device="cuda") for r in (0, 1)], DDP_ONE_BUCKET)
    assert not [e for e in levers(with_faults(gpu, 8160.0))["gradient_accumulation"].evidence if "page-faults" in e]


def test_no_communication_finding_when_hidden_or_already_accumulating() -> None:
    healthy = analysis([rank(0, compute=0.8, comm_overlapped=0.15, comm_exposed=0.02)], DDP_ONE_BUCKET)
    assert not {"gradient_accumulation", "ddp_bucket_size", "comm_overlap"} & set(levers(healthy))
    fw = dict(DDP_ONE_BUCKET, grad_accumulation={"backwards_per_step": 4.0})
    accumulating = analysis([rank(0, compute=0.6, comm_exposed=0.2)], fw)
    assert "gradient_accumulation" not in levers(accumulating)


def test_dataloader_from_all_steps() -> None:
    host = {"step": 100_000.0, "dataloader": 30_000.0}
    fw = {"dataloaders": [{"num_workers": 0, "pin_memory": False, "persistent_workers": False, "batch_size": 32}],
          "threads": {"sched_affinity": 16}}
    f = levers(analysis([rank(0, compute=0.7, host=host)], fw))["dataloader"]
    # 30% wait: 90% of it hidden -> 27%; workers: ceil(0.3 / 0.7) + 1 = 2
    assert f.est_saving_pct == 27.0 and f.severity == "high"
    assert "num_workers=2" in f.action["code"] and "pin_memory=True" in f.action["code"]
    quiet = analysis([rank(0, compute=0.9, host={"step": 100_000.0, "dataloader": 2_000.0})], fw)
    assert "dataloader" not in levers(quiet)


def _loader_advice(workers: int, cpus: int, local_ranks: int, name: str | None = None, device: str = "cuda") -> Any:
    host = {"step": 100_000.0, "dataloader": 30_000.0}
    fw: dict[str, Any] = {"dataloaders": [{"num_workers": workers, "pin_memory": True, "persistent_workers": True,
                                           "batch_size": 32}], "threads": {"sched_affinity": cpus}}
    if name:
        fw.update(name=name, loaded={})
    return levers(analysis([rank(i, compute=0.7, host=host, device=device) for i in range(local_ranks)], fw))["dataloader"]


@pytest.mark.parametrize("name, key", [(None, "num_workers"), ("transformers", "dataloader_num_workers")])
def test_dataloader_advice_never_lowers_the_workers(name: str | None, key: str) -> None:
    """Whatever the job has and whatever CPUs each rank gets, no setting proposes fewer
    workers than the job already runs."""
    for workers in (0, 1, 2, 4, 8, 16, 32):
        for cpus in (1, 4, 16, 64):
            for local in (1, 4, 8):
                f = _loader_advice(workers, cpus, local, name)
                proposed = [st["kwargs"][key] for st in f.action["settings"] if key in st["kwargs"]]
                assert proposed and min(proposed) >= workers, (workers, cpus, local, proposed)


def test_dataloader_with_every_cpu_already_a_worker() -> None:
    # 16 workers, 16 CPUs shared by 4 ranks on the host: 4 per rank, no room for more. The
    # advice keeps 16 (it used to say 4) and claims no saving; 30% wait is medium, not high
    f = _loader_advice(16, 16, 4)
    assert "num_workers=16" in f.action["code"] and f.est_saving_pct is None and f.severity == "medium"
    assert "4 CPUs already run 16 workers" in f.action["text"]
    # 2 workers with 16 CPUs for one rank: twice as many, 90% of the 30% wait hidden
    f = _loader_advice(2, 16, 1)
    assert "num_workers=4" in f.action["code"] and f.est_saving_pct == 27.0 and f.severity == "high"


def test_more_workers_than_a_ranks_cpus_are_said_to_share_them() -> None:
    # 30% wait: ceil(0.3 / 0.7) + 1 = 2 workers. With 2 CPUs per rank they fit: nothing
    # said; with 1 CPU per rank (2 ranks on 2 CPUs) the 2 workers share it with the rank
    def shared(f: Any) -> list[str]:
        return [e for e in f.evidence if "they load on the CPUs the rank computes on" in e]

    assert shared(_loader_advice(0, 4, 2, device="cpu")) == []
    f = _loader_advice(0, 2, 2, device="cpu")
    (line,) = shared(f)
    assert line.startswith("2 workers per rank on 1 CPU per rank: ")
    assert f.est_saving_pct == 27.0  # said, not estimated
    # no saving claimed (every CPU already a worker), or a GPU job: nothing said
    assert shared(_loader_advice(16, 16, 4, device="cpu")) == []
    assert shared(_loader_advice(0, 2, 2)) == []


def test_mixed_precision_on_gpu_only_without_autocast() -> None:
    ops = {"gemm_us": {"fp32": 20_000.0, "tf32": 30_000.0, "bf16": 5_000.0}}
    fw = {"amp": {"autocast": {}}, "device": {"capability": "8.0"}}
    f = levers(analysis([rank(0, compute=0.8, ops=ops)], fw))["mixed_precision"]
    # fp32 20% x (1 - 1/4) + tf32 30% x (1 - 1/1.5) = 15% + 10% = 25%
    assert f.est_saving_pct == 25.0 and "torch.bfloat16" in f.action["code"]
    with_amp = {"amp": {"autocast": {"cuda": ["torch.bfloat16"]}}, "device": {"capability": "8.0"}}
    assert "mixed_precision" not in levers(analysis([rank(0, compute=0.8, ops=ops)], with_amp))
    assert "mixed_precision" not in levers(analysis([rank(0, device="cpu", compute=0.8, ops=ops)], fw))
    volta = {"amp": {"autocast": {}}, "device": {"capability": "7.0"}}
    assert "GradScaler" in levers(analysis([rank(0, compute=0.8, ops=ops)], volta))["mixed_precision"].action["code"]


@pytest.mark.parametrize("cap, half", [
    ("7.0", "fp16"), ("7.5", "fp16"), ("8.0", "bf16"), ("8.9", "bf16"), ("9.0", "bf16"),
    ("10.0", "bf16"), ("12.0", "bf16"), ("12.1", "bf16"), (None, "fp16"), ("", "fp16"), ("sm_x", "fp16"),
])
def test_mixed_precision_compares_the_capability_as_numbers(cap: str | None, half: str) -> None:
    """bf16 from compute capability 8.0 on: Blackwell's "10.0" and "12.0" sort below "8" as
    text and used to get fp16 with a GradScaler; unreadable or missing stays fp16."""
    from pardiag.analyzers.levers import capability

    ops = {"gemm_us": {"fp32": 20_000.0}}
    fw = {"amp": {"autocast": {}}, "device": {"capability": cap}}
    code = levers(analysis([rank(0, compute=0.8, ops=ops)], fw))["mixed_precision"].action["code"]
    assert ("torch.bfloat16" in code) == (half == "bf16") and ("GradScaler" in code) == (half == "fp16")
    assert capability("10.0") == (10, 0) > capability("8.6") == (8, 6) > capability("7") == (7,)


def test_straggler_saving_is_the_others_wait() -> None:
    s = Straggler(rank=3, excess_us_per_step=40_000.0, cause="dataloader", evidence=["e"], held_us_per_step=25_000.0)
    f = levers(analysis([rank(i, compute=0.8) for i in range(4)], stragglers=[s]))["straggler"]
    assert f.est_saving_pct == 25.0 and f.severity == "high" and f.ranks == [3]
    assert "DataLoader" in f.action["text"]


def test_sharding_decision_tree() -> None:
    def fw(params: float, opt: float, peak: float, fsdp: Any = None) -> dict[str, Any]:
        return {"parameters": {"local_bytes": params}, "optimizers": [{"state_bytes": opt}], "fsdp": fsdp,
                "device": {"total_memory_bytes": 80 * GB}, "peak_memory_reserved_bytes_max": peak}

    ranks8 = [rank(i, compute=0.8) for i in range(8)]
    # small model, plenty of room: DDP is right, no finding
    assert "sharding" not in levers(analysis(ranks8, fw(1 * GB, 2 * GB, 20 * GB)))
    # 10 GB of parameters with Adam (20 GB state), 76 GB peak: shard the optimizer state
    f = levers(analysis(ranks8, fw(10 * GB, 20 * GB, 76 * GB)))["sharding"]
    assert "ZeRO-1" in f.title and f.severity == "high"
    # 30 GB parameters: 2P + S/8 = 67.5 GB too much; P + (P+S)/8 = 41.25 GB fits -> ZeRO-2
    assert "ZeRO-2" in levers(analysis(ranks8, fw(30 * GB, 60 * GB, 79 * GB)))["sharding"].title
    # 90 GB parameters: only full sharding fits (360/8 = 45 GB, under 60% of 80) -> FSDP
    assert "FSDP" in levers(analysis(ranks8, fw(90 * GB, 180 * GB, 79 * GB)))["sharding"].title
    # 1 TB of parameters: even fully sharded 500 GB per rank -> tensor/pipeline parallel
    assert "tensor or pipeline" in levers(analysis(ranks8, fw(1024 * GB, 2048 * GB, 79 * GB)))["sharding"].title
    # a tiny FSDP model with exposed all-gathers: DDP would do
    tiny = analysis([rank(i, compute=0.5, comm_exposed=0.3) for i in range(2)], fw(0.1 * GB, 0.2 * GB, 2 * GB, {"fsdp2": {}}))
    assert "DDP would avoid" in levers(tiny)["sharding"].title


def test_what_if_multiplies_independent_savings() -> None:
    from pardiag.analysis import Finding

    fs = [Finding("dataloader", "high", "t", [], [], 20.0, {}), Finding("straggler", "high", "t", [], [], 50.0, {}),
          Finding("nccl_env", "low", "t", [], [], None, {})]
    w = what_if(200_000.0, fs)
    assert w is not None and [p.step_us for p in w.findings] == [160_000.0, 100_000.0]
    assert w.all_step_us == pytest.approx(200_000.0 * 0.8 * 0.5) and w.all_saving_pct == 60.0
    assert what_if(0.0, fs) is None


def test_sync_points_and_host_overhead() -> None:
    ops = {"sync_calls": 30, "item_calls": 10, "item_device_reads": 10, "item_host_reads": 0,
           "compute_kernel_p50_us": 8.0}
    f = levers(analysis([rank(0, steps=4, compute=0.5, ops=ops)]))
    assert f["sync_points"].title.startswith("10 host-GPU synchronisations per step")  # (30 + 10) / 4
    # idle 50% with 8 us kernels: half of the idle time -> 25%
    assert f["host_overhead"].est_saving_pct == 25.0 and f["host_overhead"].severity == "high"
    calm = {"sync_calls": 1, "compute_kernel_p50_us": 200.0}
    assert not {"sync_points", "host_overhead"} & set(levers(analysis([rank(0, steps=4, compute=0.5, ops=calm)])))


@pytest.mark.parametrize("sync_us, expected", [
    (999.0, None),  # 40 syncs in a 100 ms window that return at once: the queue was empty
    (1_000.0, "low"),  # 1% of the window
    (4_999.0, "low"),  # 10 per step, but the host waits under 5%
    (5_000.0, "medium"),
])
def test_sync_points_weigh_the_time_the_host_waits(sync_us: float, expected: str | None) -> None:
    ops = {"sync_calls": 30, "item_device_reads": 10, "sync_us": sync_us, "compute_kernel_p50_us": 200.0}
    f = levers(analysis([rank(0, steps=4, compute=0.9, ops=ops)])).get("sync_points")
    assert (f.severity if f else None) == expected
    if f:
        assert f"the host waits inside them {sync_us / 1e3:.1f} ms, {sync_us / 1e5:.1%} of the profiled time" in f.evidence


def test_bucket_finding_offers_gradient_compression_only_without_a_hook() -> None:
    a = analysis([rank(0, compute=0.6, comm_exposed=0.2)], DDP_ONE_BUCKET)
    assert "bf16_compress_hook" in levers(a)["ddp_bucket_size"].action["code"]
    fw = {**DDP_ONE_BUCKET, "ddp": [dict(DDP_ONE_BUCKET["ddp"][0], comm_hook="bf16_compress_hook")]}
    assert "bf16_compress_hook" not in levers(analysis([rank(0, compute=0.6, comm_exposed=0.2)], fw))["ddp_bucket_size"].action["code"]


def _window_runs(step_p50: float) -> dict[str, Analysis]:
    """One run per rule whose saving takes a share of the profiled window (100 ms per
    profiled step), with the median step `step_p50`."""
    def one(fw: dict[str, Any] | None = None, device: str = "cuda", **shares: Any) -> Analysis:
        return analysis([rank(0, step_p50=step_p50, device=device, **shares)], fw)

    return {
        "dataloader": one({"dataloaders": [{"num_workers": 0}]}, compute=0.5, dataloader=0.3),
        "gradient_accumulation": one(DDP_ONE_BUCKET, compute=0.6, comm_exposed=0.2),
        "ddp_bucket_size": one(DDP_ONE_BUCKET, compute=0.6, comm_exposed=0.2),
        "comm_overlap": one(None, compute=0.6, comm_exposed=0.2),
        "mixed_precision": one({"amp": {"autocast": {}}, "device": {"capability": "8.0"}}, compute=0.8,
                               ops={"gemm_us": {"fp32": 40_000.0}}),
        "host_overhead": one(None, compute=0.5, ops={"compute_kernel_p50_us": 8.0}),
    }


def test_savings_on_window_shares_say_when_profiled_steps_were_slower() -> None:
    """Profiled steps of 100 ms against a 50 ms median step: inflation 2. Each saving that
    takes a window share as a share of the median step says so, in its evidence and its
    assumption; with steps as long inside the window as outside, nothing is said. The
    savings themselves are the window's: 27% (90% of 30%), 15%, 10%, 10% (half of 20%),
    30% (fp32 40% x 3/4), 25% (half of 50% idle)."""
    savings = {"dataloader": 27.0, "gradient_accumulation": 15.0, "ddp_bucket_size": 10.0, "comm_overlap": 10.0,
               "mixed_precision": 30.0, "host_overhead": 25.0}
    for lever, a in _window_runs(50_000.0).items():
        assert a.job_summary.profiled_step_inflation.job == 2.0
        f = levers(a)[lever]
        assert f.est_saving_pct == savings[lever], lever
        assert any("profiled steps took 2x the median step" in e for e in f.evidence), lever
        assert "(steps there 2x the median step) applied to the median step" in f.action["assumption"], lever
    for lever, a in _window_runs(100_000.0).items():
        f = levers(a)[lever]
        assert f.est_saving_pct == savings[lever], lever
        assert not any("median step" in e for e in f.evidence) and "median step" not in f.action["assumption"]
    # a dataloader share over all steps (steps.jsonl) is already of the median step
    a = analysis([rank(0, step_p50=50_000.0, compute=0.5, host={"step": 50_000.0, "dataloader": 15_000.0})],
                 {"dataloaders": [{"num_workers": 0}]})
    f = levers(a)["dataloader"]
    assert f.est_saving_pct == 27.0 and not any("median step" in e for e in f.evidence)


CPU_BF16 = {"amp": {"autocast": {}}, "device": {"bf16_matmul": True, "amx": True},
            "parameters": {"bytes_by_dtype": {"torch.float32": 1000}}}
GPU_NO_AMP = {"amp": {"autocast": {}}, "device": {"capability": "8.0"}}

# (lever, run, the share of the step the change works on (%), the saving worked out by hand (%))
BOUNDS = [
    # an input wait recorded longer than its step (150 of 100 ms) is the whole step: 90% of
    # 100%, not of 150%
    ("dataloader", analysis([rank(0, compute=0.5, host={"step": 100_000.0, "dataloader": 150_000.0})],
                            {"dataloaders": [{"num_workers": 0}]}), 100.0, 90.0),
    # fp32 GEMMs on concurrent streams add up to 150 ms in a 100 ms window with 80% compute:
    # the GEMM time is at most the compute, 80%, of which 3/4 saved (not 150% x 3/4 = 112.5%)
    ("mixed_precision", analysis([rank(0, compute=0.8, ops={"gemm_us": {"fp32": 150_000.0}})], GPU_NO_AMP),
     80.0, 60.0),
    # 60 + 60 ms of fp32 and TF32 in 60% compute: each scaled by 60/120, saved 3/4 and 1/3:
    # (60% x 3/4 + 60% x 1/3) / 2 = 32.5%
    ("mixed_precision", analysis([rank(0, compute=0.6, ops={"gemm_us": {"fp32": 60_000.0, "tf32": 60_000.0}})],
                                 GPU_NO_AMP), 60.0, 32.5),
    # 90 ms of CPU matmuls in 50% compute: 50% at most, half of it saved
    ("mixed_precision", analysis([rank(0, device="cpu", compute=0.5, ops={"cpu_gemm_us": 90_000.0})], CPU_BF16),
     50.0, 25.0),
    ("gradient_accumulation", analysis([rank(0, compute=0.0, comm_exposed=0.6)], DDP_ONE_BUCKET), 60.0, 45.0),
    # one bucket with 10% compute to overlap: half of min(60%, 10%)
    ("ddp_bucket_size", analysis([rank(0, compute=0.1, comm_exposed=0.6)], DDP_ONE_BUCKET), 60.0, 5.0),
    ("comm_overlap", analysis([rank(0, compute=0.1, comm_exposed=0.6)]), 60.0, 5.0),
    ("host_overhead", analysis([rank(0, compute=0.0, ops={"compute_kernel_p50_us": 8.0})]), 100.0, 50.0),
]


@pytest.mark.parametrize("lever, a, removes, saving", BOUNDS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BOUNDS)])
def test_a_saving_never_exceeds_the_time_it_removes(lever: str, a: Analysis, removes: float, saving: float) -> None:
    f = levers(a)[lever]
    assert f.est_saving_pct == saving and saving <= removes


def test_the_advised_bucket_cap_changes_the_buckets() -> None:
    """The tiny_buckets scenario: 24 weights of 256x256 fp32 (256 KB, with their bias) at
    bucket_cap_mb=0.05, each in a bucket of its own. 4x the cap (0.2 MB) leaves every bucket
    as it is (measured: no change); the cap must be 4x the bucket (1 MB), which packs them
    4 by 4: 6 buckets of four layers and the head's, 7."""
    from dataclasses import replace

    from factories import collective, ddp
    from pardiag.analyzers.levers import fewer_buckets, packed_buckets

    layer = 256 * 256 * 4 + 256 * 4
    sizes = [layer] * 24 + [256 * 10 * 4 + 40]
    assert packed_buckets(sizes, 0.05) == packed_buckets(sizes, 0.2) == 25
    assert fewer_buckets(sizes, 0.05) == (1.0, 7)
    assert fewer_buckets([200 * 2**20] * 12, 25.0) == (100, None)  # no cap offered merges them: no advice
    tiny = dict(ddp(), bucket_cap_mb=0.05, bucket_sizes_bytes=sizes)
    ar = replace(collective(calls=75), bytes=75 * layer)
    f = levers(analysis([rank(0, compute=0.6, comm_exposed=0.2), rank(1, compute=0.6, comm_exposed=0.2)],
                        {"ddp": [tiny]}, collectives=[ar]))["ddp_bucket_size"]
    assert "bucket_cap_mb=1," in f.action["code"] and f.title.endswith("try bucket_cap_mb=1")
    assert "bucket_cap_mb=1 packs these 25 buckets into 7 (DDP closes a bucket once it reaches the cap)" in f.evidence
