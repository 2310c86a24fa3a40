"""Straggler detection on real torchrun jobs (gloo, CPU): the example with a planted
slow rank, and the same job balanced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timed]
EXAMPLE = REPO / "examples" / "train_ddp.py"


def analyse(out: Path) -> dict:
    res = run_pardiag("analyze", str(out), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def record(out: Path, *args: str) -> None:
    res = run_pardiag("run", "-q", "--out", str(out), "--", *torchrun(2, EXAMPLE, "--steps", "20", *args))
    assert res.returncode == 0, res.stderr[-2000:]


def test_planted_straggler_is_named_with_its_cause(tmp_path: Path) -> None:
    record(tmp_path / "slow", "--straggler-rank", "1", "--straggler-ms", "60")
    doc = analyse(tmp_path / "slow")
    (s,) = doc["stragglers"]
    # the planted work (matrix products) runs before the model's forward, outside DDP's
    # forward that steps.jsonl times: the step less its timed signals holds it. It runs
    # torch operators, so it is not host work either (the window cuts it into forward,
    # as any operator before backward)
    assert s["rank"] == 1 and s["cause"] == "work outside DataLoader, forward, backward and optimizer"
    # 60 ms of extra work before the forward pass on a 2-core machine: most of it shows
    assert 30_000 <= s["excess_us_per_step"] <= 90_000
    r0, r1 = doc["ranks"]
    assert r0["wait_us"] > r1["wait_us"]  # the others wait for the straggler
    assert r1["phases_us"]["forward"] - r0["phases_us"]["forward"] > 3 * 30_000  # 3 profiled steps


def test_balanced_run_names_no_straggler(tmp_path: Path) -> None:
    record(tmp_path / "even")
    doc = analyse(tmp_path / "even")
    assert doc["stragglers"] == []
    assert len(doc["collectives"]) == 1 and doc["collectives"][0]["op"] == "all_reduce"
    assert doc["collectives"][0]["calls"] == 3  # one bucket per step, 3 profiled steps
    assert doc["process_groups"][0]["role"] == "data-parallel"
