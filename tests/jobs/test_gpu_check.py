"""benchmarks/gpu_check.py without a GPU: the no-GPU answer, and every check it makes on a
GPU machine, run on real GPU traces, real NCCL logs and hand-made step and NVML records."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, REPO, SHARED
from tracegen import launch, launched_kernel as kernel, meta_events, step, write_kineto_trace as write_trace

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
GPU_TRACES = FIXTURES / "gpu-traces"
NCCL_LOGS = SHARED / "reference" / "nccl" / "logs"
needs_gpu_fixtures = pytest.mark.skipif(not GPU_TRACES.is_dir(), reason=f"no GPU traces in {GPU_TRACES}")
needs_nccl_logs = pytest.mark.skipif(not NCCL_LOGS.is_dir(), reason=f"no NCCL logs in {NCCL_LOGS}")


# --------------------------------------------------------------------------- no GPU


def test_no_gpu_is_one_line_and_exit_3() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == gpu_check.EXIT_NO_GPU == 3, proc.stdout + proc.stderr
    assert len(out) == 1 and out[0].startswith("gpu-check: no NVIDIA GPU"), out
    assert "Traceback" not in proc.stderr


def test_bad_arguments_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--steps" in proc.stderr


# --------------------------------------------------------------------------- gpu block vs HTA


def _analysis_of(folder: Path) -> tuple[dict[int, Path], dict[int, Any]]:
    from pardiag.analyzers.pipeline import analyze_path

    doc = analyze_path(folder).to_dict()
    ranks = doc["ranks"]
    return {r["rank"]: folder / r["trace"] for r in ranks}, {r["rank"]: r["gpu"] for r in ranks}


@pytest.fixture(scope="module")
def sampled_job() -> tuple[dict[int, Path], dict[int, Any]]:
    return _analysis_of(GPU_TRACES / "sampled-128rank-job")


@needs_gpu_fixtures
@pytest.mark.parametrize("group", ["a100-2rank-rank0", "sampled-128rank-job"])
def test_analysis_gpu_block_equals_hta(group: str, tmp_path: Path) -> None:
    traces, blocks = _analysis_of(GPU_TRACES / group)
    figures, problems = gpu_check.compare_with_hta(traces, blocks, tmp_path / "hta")
    assert problems == []
    assert sorted(figures) == sorted(traces) and len(traces) >= 1
    for fig in figures.values():
        assert fig["analysis"]["kernel_time_us"] == pytest.approx(fig["hta"]["kernel_time_us"], rel=1e-12)
        assert fig["analysis"]["compute_us"] > 0 and not math.isnan(fig["hta"]["overlap_pct"])


@needs_gpu_fixtures
@pytest.mark.parametrize("key", ["compute_us", "idle_us", "overlap_us"])
def test_a_block_that_differs_from_hta_fails(key: str, sampled_job: Any, tmp_path: Path) -> None:
    traces, blocks = sampled_job
    blocks = copy.deepcopy(blocks)
    blocks[1][key] += 7.0
    _, problems = gpu_check.compare_with_hta(traces, blocks, tmp_path / "hta")
    assert len(problems) == 2, problems  # against HTA and against gpu_breakdown of the trace
    assert all(p.startswith("rank 1: ") for p in problems)
    hta_key = {"overlap_us": "overlap_pct"}.get(key, key)
    assert "Analysis vs HTA" in problems[0] and hta_key in problems[0]


@needs_gpu_fixtures
def test_a_rank_without_gpu_block_fails(sampled_job: Any, tmp_path: Path) -> None:
    traces, blocks = sampled_job
    figures, problems = gpu_check.compare_with_hta(traces, {**blocks, 0: None}, tmp_path / "hta")
    assert problems == ["rank 0: the Analysis has no gpu block"] and list(figures) == [1]


def test_gpu_block_numbers_by_hand() -> None:
    block = {"span_us": 70, "compute_us": 40, "comm_us": 25, "overlap_us": 5, "memory_us": 5, "idle_us": 10}
    assert gpu_check.gpu_block_numbers(block) == {"idle_us": 10, "compute_us": 40, "non_compute_us": 20,
                                                  "kernel_time_us": 70, "overlap_pct": 20.0}
    assert math.isnan(gpu_check.gpu_block_numbers({**block, "comm_us": 0, "overlap_us": 0})["overlap_pct"])


# --------------------------------------------------------------------------- kernels


@needs_gpu_fixtures
def test_kernel_census_of_a_real_trace() -> None:
    c = gpu_check.kernel_census(GPU_TRACES / "a100-2rank-rank0" / "nccl_data.json.gz")
    assert c["events"] == 2700 + 960 + 114 == sum(c["by_class"].values())
    assert c["by_class"] == {"communication": 21, "memory": 1074, "computation": 2679, "other": 0}
    assert all(per == {"communication": n} for per, n in zip(c["nccl_kernels"].values(), (15, 6)))
    assert c["nccl_dev_kernels"] == 0  # NCCL < 2.19 names them ncclKernel_*
    problems = gpu_check.kernel_problems({"nccl": {0: c}}, {"nccl": []})
    assert problems == ["no ncclDevKernel_* kernel in any trace: their classification is unverified"]


H200_PROBE = REPO / "tests" / "data" / "h200" / "probe" / "rank0.json.gz"


def test_one_gpu_asks_for_nccl_s_one_rank_reduce_instead() -> None:
    """The H200 probe's trace: NCCL 2.28.9 ran no ncclDevKernel_* with one rank, but its
    one-rank reduce three times (one per averaging all_reduce of the 3 profiled steps)."""
    c = gpu_check.kernel_census(H200_PROBE)
    assert c["nccl_dev_kernels"] == 0 and c["one_rank_reduce"] == 3 and c["nccl_kernels"] == {}
    assert c["by_class"] == {"computation": 33, "communication": 0, "memory": 9, "other": 0}
    assert gpu_check.kernel_problems({"probe": {0: c}}, {"probe": []}, gpus=1) == []
    several = gpu_check.kernel_problems({"probe": {0: c}}, {"probe": []}, gpus=2)
    assert several == ["no ncclDevKernel_* kernel in any trace: their classification is unverified"]
    nothing = dict(c, one_rank_reduce=0)
    assert gpu_check.kernel_problems({"probe": {0: nothing}}, {"probe": []}, gpus=1) == [
        "no NCCL kernel in any trace: neither ncclDevKernel_* nor, as one GPU gives, NCCL's one-rank reduce"]


def _synthetic(tmp_path: Path, names: list[str]) -> Path:
    events = [*meta_events(), step(1, 0, 100), *(launch(i + 1, i) for i in range(len(names))),
              *(kernel(n, 10 + 10 * i, 5, i + 1, stream=7 + i) for i, n in enumerate(names))]
    return write_trace(tmp_path / "r0.json", events)


def test_current_nccl_kernels_pass(tmp_path: Path) -> None:
    c = gpu_check.kernel_census(_synthetic(tmp_path, [
        "ampere_sgemm_128x64_tn", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"]))
    assert c["nccl_dev_kernels"] == 1 and c["by_class"]["communication"] == 1
    assert gpu_check.kernel_problems({"probe": {0: c}}, {"probe": []}) == []


def test_nccl_kernel_counted_as_compute_fails(tmp_path: Path) -> None:
    c = gpu_check.kernel_census(_synthetic(tmp_path, [
        "ampere_sgemm_128x64_tn", "ncclDevKernel_SendRecv(x)", "ncclSymmetricCopy(x)"]))
    problems = gpu_check.kernel_problems({"probe": {0: c}}, {"probe": []})
    assert problems == ["probe rank 0: NCCL kernel not counted as communication: ncclSymmetricCopy(x)"]


def test_no_compute_kernel_and_unknown_class_notice_fail(tmp_path: Path) -> None:
    c = gpu_check.kernel_census(_synthetic(tmp_path, ["ncclDevKernel_AllReduce(x)"]))
    notice = "rank 0: 3 GPU events (12 us) match no known kernel class and are left out of compute: Stream Sync"
    problems = gpu_check.kernel_problems({"nccl": {0: c}}, {"nccl": ["other", notice]})
    assert problems == ["nccl rank 0: no CUDA compute kernel in the trace", f"nccl: {notice}"]


# --------------------------------------------------------------------------- NCCL


def _nccl_block(name: str) -> dict[str, Any]:
    from pardiag.analyzers.nccl.summary import nccl_block

    return nccl_block([NCCL_LOGS / name], None)[0].to_dict()  # as analysis.json holds it, which gpu_check reads


@needs_nccl_logs
def test_nccl_block_of_a_real_log() -> None:
    block = _nccl_block("08-chimera2-v2193-shm-p2p-level-loc-loopback-bootstrap.log")
    assert gpu_check.nccl_problems(block, "2.19.3") == []
    f = gpu_check.nccl_figures(block)
    assert f["versions"] == ["2.19.3+cuda12.2"] and f["transports"] == ["SHM/direct/direct"]
    assert gpu_check.nccl_problems(block, "2.21.5") == ["log says NCCL 2.19.3+cuda12.2, torch loaded 2.21.5"]


@needs_nccl_logs
def test_one_rank_log_names_a_network_not_a_transport() -> None:
    block = _nccl_block("05-nccl857-v2103-single-node-socket-no-ibverbs.log")
    assert gpu_check.nccl_figures(block)["transports"] == []
    assert gpu_check.nccl_problems(block, "2.10.3") == []


@needs_nccl_logs
def test_logs_without_version_or_transport_fail() -> None:
    assert gpu_check.nccl_problems(_nccl_block("01-nccl278-v256-socket-two-nics-ring.log"), None) == [
        "no NCCL version found in the log"]
    assert gpu_check.nccl_problems(_nccl_block("16-nccl1193-coll-allreduce-opcount-128ranks-ray-prefix.log"),
                                   None) == ["no NCCL version found in the log",
                                             "no transport, network or bootstrap interface parsed from the log"]
    assert gpu_check.nccl_problems({}, "2.21.5") == ["the Analysis has no nccl block (no NCCL log was read)"]


def test_nccl_version_text() -> None:
    assert gpu_check.nccl_version_text((2, 21, 5)) == "2.21.5"
    assert gpu_check.nccl_version_text(21905) == "2.19.5"
    assert gpu_check.nccl_version_text(2708) == "2.7.8"
    assert gpu_check.nccl_version_text(0) is None


# --------------------------------------------------------------------------- NVML


def _telemetry_run(tmp_path: Path, samples: int) -> Path:
    rank_dir = tmp_path / "ranks" / "0"
    rank_dir.mkdir(parents=True)
    lines = [{"format": "pardiag.telemetry", "format_version": 1, "host": "h", "t_ns": 1, "interval_s": 0.1,
              "driver": "580", "gpus": [{"gpu": 0, "uuid": "GPU-1", "name": "NVIDIA H200"}]}]
    lines += [{"t_ns": 1000 + i, "gpu": 0, "uuid": "GPU-1", "util_gpu_pct": 90} for i in range(samples)]
    (rank_dir / "telemetry.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"t_ns": 5, "gp')
    return tmp_path


def test_nvml_samples_counted(tmp_path: Path) -> None:
    run = _telemetry_run(tmp_path, 12)
    samples = gpu_check.telemetry_samples(run, [0, 1])
    assert samples == {0: 12, 1: 0}
    problems = gpu_check.telemetry_problems("nccl", samples, {"status": "ok"})
    assert problems == ["nccl rank 1: 0 NVML samples in telemetry.jsonl (fewer than 5)"]
    assert gpu_check.telemetry_problems("nccl", {0: 12}, {"status": "ok"}) == []
    absent = gpu_check.telemetry_problems("nccl", {0: 12}, {"status": "absent", "reason": "no NVML"})
    assert absent == ["nccl: telemetry block 'absent': no NVML"]


# --------------------------------------------------------------------------- step times


def _steps(durations: list[float], window: dict[int, str] | None = None) -> list[dict[str, Any]]:
    window = window or {}
    return [{"step": i, "dur_us": d, **({"profiler": window[i]} if i in window else {})}
            for i, d in enumerate(durations)]


def test_step_time_ratio_by_hand() -> None:
    # pardiag run: steps 0-2 skipped, 5-6 warm-up, 7-9 profiled, 10 exports the trace
    durations = [9e3, 9e3, 9e3, 10.5e3, 10.5e3, 20e3, 20e3, 30e3, 30e3, 30e3, 90e3, 10.5e3, 10.5e3]
    window = {5: "warmup", 6: "warmup", 7: "active", 8: "active", 9: "active"}
    script = _steps([d - 100 for d in durations])
    plain = _steps([50e3, 50e3, 50e3, 10e3, 10e3, 10e3])
    fig = gpu_check.step_time_figures(_steps(durations, window), script, plain)
    assert fig["plain_ms"] == 10.0 and fig["outside_ms"] == 10.5 and fig["active_ms"] == 30.0
    assert fig["ratio"] == pytest.approx(1.05) and fig["ratio_script_timer"] == pytest.approx(1.04)
    assert fig["steps"] == {"plain": 6, "outside": 4, "active": 3}
    assert gpu_check.overhead_problems(fig, 1.10) == []
    assert gpu_check.overhead_problems(fig, 1.01) == [
        "steps outside the profiler window take 1.050 x the plain run's (10.50 vs 10.00 ms; limit 1.01)"]
    empty = gpu_check.step_time_figures(_steps(durations, window), script, [])
    assert empty["ratio"] is None and gpu_check.overhead_problems(empty, 1.1)[0].startswith("no step times")


def test_two_pairs_are_pooled_and_each_is_shown() -> None:
    # pair 1 on a slow stretch of the machine (everything 20% slower), pair 2 on a fast one
    window = {5: "warmup", 6: "active"}
    first = [9e3] * 3 + [12e3, 12e3] + [30e3, 30e3] + [90e3] + [12e3] * 4  # outside: 12 x 6
    second = [9e3] * 3 + [10.5e3, 10.5e3] + [30e3, 30e3] + [90e3] + [10.5e3] * 4  # outside: 10.5 x 6
    plain1, plain2 = _steps([50e3] * 3 + [11e3] * 5), _steps([50e3] * 3 + [10e3] * 5)
    fig = gpu_check.pooled_step_time_figures(
        [(_steps(first, window), _steps(first)), (_steps(second, window), _steps(second))], [plain1, plain2])
    # pooled: outside 6 x 12 and 6 x 10.5 -> median 11.25; plain 5 x 11 and 5 x 10 -> 10.5
    assert fig["outside_ms"] == 11.25 and fig["plain_ms"] == 10.5
    assert fig["ratio"] == pytest.approx(11.25 / 10.5)
    assert [p["ratio"] for p in fig["pairs"]] == pytest.approx([12 / 11, 1.05])
    assert fig["steps"] == {"plain": 16, "outside": 12, "active": 2}
    one = gpu_check.pooled_step_time_figures([(_steps(first, window), _steps(first))], [plain1])
    assert "pairs" not in one and one["ratio"] == pytest.approx(12 / 11)


def test_the_estimate_check_by_hand() -> None:
    fp32 = _steps([90e3] * 3 + [200e3, 210e3, 190e3])  # median 200 ms after the 3 warm-up steps
    bf16 = _steps([90e3] * 3 + [30e3, 30e3, 31e3])  # 30 ms: 85% saved
    f = {"lever": "mixed_precision", "est_saving_pct": 80.0,
         "estimate": {"method": "replay", "factors": [{"name": "GEMM speed-up", "value": 11.0}], "refused": None}}
    fig = gpu_check.estimate_figures({"findings": [f]}, fp32, bf16)
    assert fig["fp32_ms"] == 200.0 and fig["bf16_ms"] == 30.0 and fig["measured_pct"] == pytest.approx(85.0)
    assert fig["error_pp"] == pytest.approx(-5.0) and fig["method"] == "replay"
    assert gpu_check.estimate_problems(fig, 5.0) == []
    assert gpu_check.estimate_problems(fig, 4.0) == [
        "mixed_precision estimated 80.0%, measured 85.0% (-5.0 pp; limit 4; replay)"]
    none = gpu_check.estimate_figures({"findings": [{"lever": "host_overhead"}]}, fp32, bf16)
    assert gpu_check.estimate_problems(none, 5.0) == [
        "bf16 saved 85.0% of the fp32 step, but the fp32 run has no mixed_precision finding (findings: host_overhead)"]
    missing = gpu_check.estimate_figures({"findings": [f]}, fp32, [])
    assert gpu_check.estimate_problems(missing, 5.0)[0].startswith("no step times")


# --------------------------------------------------------------------------- set-up and output


def test_the_hta_reference_imports_outside_the_suite(tmp_path: Path) -> None:
    """On the GPU machine the check runs outside pytest: the suite's HTA comparison must
    import from the check's own path setting."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_check; "
            "m = gpu_check._hta_reference(); print(m.hta_numbers.__name__, m.ours.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["hta_numbers", "ours"]


def test_staged_source_imports_without_install(tmp_path: Path) -> None:
    site = gpu_check.stage_source(tmp_path / "src")
    assert (site / "pardiag" / "templates").is_dir()
    assert (site / "pardiag" / "collectors" / "_inject" / "sitecustomize.py").is_file()
    code = ("import pardiag, pardiag.cli, pardiag.analyzers.kernels, pardiag.collectors.nvml, pardiag.examples.train_ddp;"
            "print(pardiag.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(site)


def test_requirements_checked_against_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    assert gpu_check.requirement_problems() == []
    assert gpu_check.import_problems() == []
    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "0.1" if name == "msgspec" else real(name))
    problems = gpu_check.requirement_problems()
    assert len(problems) == 1 and problems[0].startswith("msgspec 0.1 (pardiag asks >=")


def test_wheels_are_the_tested_versions(tmp_path: Path) -> None:
    import importlib.metadata as md

    reqs = gpu_check.wheel_requirements()
    assert f"HolisticTraceAnalysis=={md.version('HolisticTraceAnalysis')}" in reqs
    assert f"msgspec=={md.version('msgspec')}" in reqs and not any(r.startswith("torch") for r in reqs)
    cmd = gpu_check.download_command(reqs, tmp_path, "3.12")
    assert {"--no-deps", "--only-binary=:all:", "manylinux_2_17_x86_64"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and cmd[-len(reqs):] == reqs
    with pytest.raises(gpu_check.SetupError, match="no-such-package"):
        gpu_check.wheel_requirements(["no-such-package"])


def test_results_go_to_out_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    assert gpu_check.results_path(tmp_path / "run") == tmp_path / "run" / "gpu_check.json"
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    path = gpu_check.results_path(tmp_path / "run")
    assert path == tmp_path / "out" / "gpu_check.json"
    checks = [gpu_check.Check("nccl"), gpu_check.Check("kernels", ["probe rank 0: x"])]
    gpu_check.write_results(path, checks, {"gpu_vs_hta": {"nccl": {0: {"hta": {"overlap_pct": math.nan}}}}}, 1)
    doc = json.loads(path.read_text())
    assert doc["exit_code"] == 1 and [c["ok"] for c in doc["checks"]] == [True, False]
    assert doc["figures"]["gpu_vs_hta"]["nccl"]["0"]["hta"]["overlap_pct"] is None
    assert [c.line() for c in checks] == ["ok    nccl", "FAIL  kernels: probe rank 0: x"]


def test_memory_check_wants_the_allocator_s_categories() -> None:
    gb = 2**30
    good = {"rank": 0, "memory": {"device": "cuda", "allocated": 10 * gb, "reserved": 12 * gb,
                                  "peak": {"parameters": gb, "gradients": 2 * gb, "optimizer_state": 2 * gb,
                                           "activations": 3 * gb, "other": 2 * gb},
                                  "steady": {"total": 5 * gb},
                                  "sources": {"activations": "the allocator before the first backward (7 sampled steps)"}}}
    assert gpu_check.memory_problems("nccl", [good]) == []
    over = {"rank": 1, "memory": dict(good["memory"], allocated=7 * gb)}  # 8 GB of categories in a 7 GB peak
    cpu = {"rank": 2, "memory": {"device": "cpu"}}
    no_model = {"rank": 0, "memory": dict(good["memory"], peak=dict(good["memory"]["peak"], activations=0), sources={})}
    assert gpu_check.memory_problems("probe", [no_model], activations=False) == []
    assert gpu_check.memory_problems("probe", [no_model]) == ["probe rank 0: no activations from the allocator's sampled steps"]
    assert gpu_check.memory_problems("nccl", [over, cpu]) == [
        "nccl rank 1: categories 8589934592 over the peak allocated 7516192768 (other 2147483648)",
        "nccl rank 2: memory device 'cpu', not cuda"]


# --------------------------------------------------------------------------- the whole check, on a CPU


@pytest.mark.slow
def test_cpu_dry_run_end_to_end(tmp_path: Path) -> None:
    """The runs, analyses and figures of the real check, with gloo on the CPU: the
    plumbing works, and the GPU checks fail as they must without a GPU."""
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run", "--out", str(tmp_path / "work"),
                           "--steps", "20"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == gpu_check.EXIT_FAILED, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    status = {c["name"]: c["ok"] for c in doc["checks"]}
    runs = {f"run {n}": True for n in ("nccl", "plain", "gloo2", "probe", "plain2", "nccl2",
                                       "mp_fp32", "mp_fp32_plain", "mp_bf16_plain")}
    assert status == {"requirements": True, **runs,
                      "nccl": False, "kernels": False, "nvml": False, "memory": False, "gpu vs HTA": False,
                      "overhead": status["overhead"], "estimate": status["estimate"]}
    assert doc["figures"]["estimate"]["fp32_ms"] > 0 and doc["figures"]["estimate"]["bf16_ms"] > 0
    steps = doc["figures"]["step_time"]
    assert steps["ratio"] > 0 and steps["steps"]["plain"] == 40 and len(steps["pairs"]) == 2
    assert sorted(doc["figures"]["kernels"]) == ["gloo2", "mp_fp32", "nccl", "nccl2", "probe"]
    assert sorted(doc["figures"]["kernels"]["gloo2"]) == ["0", "1"]
    assert (tmp_path / "out" / "gpu_check_runs.tar.gz").is_file()
    fails = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == sum(not ok for ok in status.values())
    # the same checks again from the run folders alone, analysed afresh (--evaluate)
    again = subprocess.run([sys.executable, str(SCRIPT), "--evaluate", str(tmp_path / "work")],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == gpu_check.EXIT_FAILED, again.stdout + again.stderr
    redo = json.loads((tmp_path / "work" / "gpu_check.evaluated.json").read_text())
    assert {c["name"]: c["ok"] for c in redo["checks"]} == {k: v for k, v in status.items() if k != "requirements"}
    assert redo["figures"]["step_time"]["ratio"] == steps["ratio"] and redo["figures"]["evaluated"] is True
