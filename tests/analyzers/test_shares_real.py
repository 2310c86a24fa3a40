"""The share rules' step test on real torchrun jobs (2 ranks, gloo, CPU): the healthy
control's exposed communication wanders from step to step around 10% and must make no
communication finding, in one recording (no second try); the planted comm_bound job's
must, with the step test in its evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timed]
SCENARIOS = REPO / "examples" / "scenarios"
COMM_LEVERS = {"gradient_accumulation", "ddp_bucket_size", "comm_overlap"}


def findings(tmp_path: Path, script: str) -> list[dict]:
    out = tmp_path / script
    res = run_pardiag("run", "-q", "--out", str(out), "--", *torchrun(2, SCENARIOS / f"{script}.py", "--steps", "30"))
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_pardiag("analyze", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)["findings"]


def test_healthy_control_gets_no_communication_finding(tmp_path: Path) -> None:
    found = [(f["lever"], f["evidence"]) for f in findings(tmp_path, "healthy") if f["lever"] in COMM_LEVERS]
    assert found == []


def test_comm_bound_clears_the_step_test(tmp_path: Path) -> None:
    (f,) = [f for f in findings(tmp_path, "comm_bound") if f["lever"] == "gradient_accumulation"]
    assert any("step by step" in e and "above the 10% threshold" in e for e in f["evidence"]), f["evidence"]
