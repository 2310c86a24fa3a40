"""`pardiag run` measures the factors after the job, on this host, with the job's own
Python: a real two-rank DDP job of the fp32_matmul scenario; and when it must not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import REPO, read_json, run_pardiag, torchrun

from pardiag.analyzers import factors

SCENARIO = REPO / "examples" / "scenarios" / "fp32_matmul.py"


@pytest.mark.slow
@pytest.mark.timed
def test_a_torchrun_job_gets_its_gemm_speedup_and_allreduce_curve(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_pardiag("run", "--out", str(out), "--no-report", "--", *torchrun(2, SCENARIO, "--steps", "12"),
                      measure=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "timing the job's top matrix-multiply shapes" in res.stderr

    gemm = read_json(out / "factors" / "gemm.json")
    assert gemm["status"] == "ok", gemm["reason"]
    # mlp(512, 512, 3, 10) on batches of 1024: the hidden layers' linear and their gradients' mm
    ops = {(r["op"], tuple(map(tuple, r["dims"][:2])), r["backward"]) for r in gemm["shapes"]}
    assert ("aten::linear", ((1024, 512), (512, 512)), False) in ops
    assert ("aten::mm", ((512, 1024), (1024, 512)), True) in ops
    assert all(r["speedup"] and r["speedup"] > 0 for r in gemm["shapes"])
    assert gemm["covered_share"] == pytest.approx(1.0)  # 6 shapes in all: every one is timed
    assert gemm["seconds"] <= 20.0
    g = factors.gemm_factor(out)
    assert g is not None and g.speedup == pytest.approx(gemm["speedup"]) and g.half_dtype == "bfloat16"

    curve = read_json(out / "factors" / "allreduce.json")
    assert curve["status"] == "ok", curve["reason"]
    # one bucket of 3172392 bytes: one size, no fit of the run's calls; a sweep around it
    assert curve["source"] == "sweep" and curve["world_size"] == 2 and curve["backend"] == "gloo"
    assert "span 1.0x" in curve["fit_reason"]
    sizes = [p["bytes"] for p in curve["points"]]
    assert 3172392 in sizes and min(sizes) == 3172392 // 4 // 4 * 4 and len(sizes) >= 4  # whole float32 elements
    assert curve["alpha_us"] >= 0 and curve["beta_us_per_byte"] >= 0 and curve["seconds"] <= 30.0
    c = factors.comm_curve(out)
    assert c is not None and c.kind == "sweep" and c.predict_us(0) == pytest.approx(curve["alpha_us"])

    m = read_json(out / "manifest.json")
    assert m["exit_code"] == 0 and m["collectors"]["factors"]["status"] == "ok"
    assert m["collectors"]["factors"]["gemm"]["status"] == "ok"


def test_a_failed_job_keeps_its_exit_code_and_is_not_measured(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_pardiag("run", "--out", str(out), "--no-report", "--", sys.executable, "-c", "import sys; sys.exit(3)",
                      measure=True)
    assert res.returncode == 3, res.stderr[-2000:]
    assert not (out / "factors").exists()
    assert read_json(out / "manifest.json")["collectors"]["factors"] == {
        "status": "skipped", "reason": "the job exited with code 3"}


def test_no_measure_skips_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_pardiag("run", "--no-measure", "--out", str(out), "--no-report", "--", sys.executable, "-c", "pass",
                      measure=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (out / "factors").exists()
    assert read_json(out / "manifest.json")["collectors"]["factors"]["reason"] == "--no-measure"
