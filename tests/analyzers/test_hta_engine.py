"""`pardiag analyze --hta`: HTA's idle-time breakdown, launch statistics and kernel
breakdown folded into the Analysis, equal to what HTA itself returns."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from conftest import FIXTURES, run_pardiag
from tracegen import cpu_rank, write_trace

A100 = FIXTURES / "gpu-traces" / "a100-2rank-rank0"
pytestmark = pytest.mark.skipif(not A100.is_dir(), reason="GPU fixture traces not present")


def test_hta_block_matches_hta() -> None:
    from hta.trace_analysis import TraceAnalysis

    res = run_pardiag("analyze", str(A100), "--hta", "--json")
    assert res.returncode == 0, res.stderr
    block = json.loads(res.stdout)["hta"]

    logging.disable(logging.WARNING)
    trace = next(A100.glob("*.json.gz"))
    ta = TraceAnalysis(trace_files={0: str(trace)}, trace_dir=str(A100))
    idle, _ = ta.get_idle_time_breakdown(visualize=False)
    launches = ta.get_cuda_kernel_launch_stats(visualize=False)[0]
    logging.disable(logging.NOTSET)

    mine = block["idle_by_rank"]["0"]
    for cat in ("host_wait", "kernel_wait", "other"):
        assert mine[f"{cat}_us"] == pytest.approx(float(idle[idle.idle_category == cat].idle_time.sum()))
    ls = block["launch_stats"]["0"]
    assert ls["launches"] == len(launches)
    assert ls["launch_delays_over_cutoff"] == int((launches.launch_delay > 100).sum())
    assert ls["kernels_shorter_than_launch"] == int((launches.gpu_duration < launches.cpu_duration).sum())
    assert {k["kernel_type"] for k in block["kernel_types"]} >= {"COMPUTATION", "COMMUNICATION"}


def test_hta_on_cpu_traces_says_why_not(tmp_path: Path) -> None:
    write_trace(tmp_path / "r0.json", cpu_rank(1600, 250), rank=0)
    res = run_pardiag("analyze", str(tmp_path), "--hta", "--json")
    doc = json.loads(res.stdout)
    assert doc["hta"] is None
    assert any("--hta" in n["message"] and "GPU" in n["message"] for n in doc["notices"])
