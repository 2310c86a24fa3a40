"""`pardiag scaling`: efficiency and the Amdahl fit on numbers worked out by hand,
and on real runs of the example at 1 and 2 ranks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun
from pardiag.analyzers.scaling import amdahl_speedup, fit_serial_fraction, scaling
from factories import analysis, rank


def run_at(n: int, step_us: float, batch: int, exposed: float = 0.0):
    fw = {"dataloaders": [{"batch_size": batch}], "grad_accumulation": {"backwards_per_step": 1.0}}
    return analysis([rank(i, step_p50=step_us, compute=0.5, comm_exposed=exposed) for i in range(n)], fw)


def test_strong_scaling_recovers_the_serial_fraction() -> None:
    f = 0.1
    # global batch 64 at every size; the step follows Amdahl: T(N) = T1 (f + (1 - f)/N)
    runs = [(f"n{n}", run_at(n, 100_000.0 * (f + (1 - f) / n), 64 // n)) for n in (1, 2, 4, 8)]
    res = scaling(runs)
    assert res.mode == "strong"
    assert res.serial_fraction == pytest.approx(0.1)
    eff8 = amdahl_speedup(0.1, 8) / 8
    assert res.points[-1].efficiency == pytest.approx(eff8)  # 1 / (0.1 + 0.9/8) / 8 = 0.588
    assert res.projected[0]["world_size"] == 16
    assert res.projected[1]["efficiency"] == pytest.approx(amdahl_speedup(0.1, 32) / 32)


def test_weak_scaling_efficiency() -> None:
    # per-rank batch 32 everywhere; the step grows 100 -> 125 ms from 2 to 8 ranks
    res = scaling([("a", run_at(2, 100_000.0, 32, 0.05)), ("b", run_at(8, 125_000.0, 32, 0.25))])
    assert res.mode == "weak"
    assert res.points[1].efficiency == pytest.approx(0.8)  # (8*32/0.125) / (2*32/0.1) / 4
    assert [p.comm_exposed_share for p in res.points] == pytest.approx([0.05, 0.25])


def test_fit_ignores_the_base_point() -> None:
    assert fit_serial_fraction([1.0], [1.0]) is None
    assert fit_serial_fraction([2.0, 4.0], [2.0, 4.0]) == 0.0


@pytest.mark.slow
@pytest.mark.timed
def test_scaling_command_on_real_runs(tmp_path: Path) -> None:
    example = REPO / "examples" / "train_ddp.py"
    one = run_pardiag("run", "-q", "--out", str(tmp_path / "n1"), "--", sys.executable, str(example), "--steps", "12")
    two = run_pardiag("run", "-q", "--out", str(tmp_path / "n2"), "--", *torchrun(2, example, "--steps", "12"))
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-1500:] + two.stderr[-1500:]
    res = run_pardiag("scaling", str(tmp_path / "n1"), str(tmp_path / "n2"), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["mode"] == "weak" and [p["world_size"] for p in doc["points"]] == [1, 2]
    assert [p["batch_per_rank"] for p in doc["points"]] == [16, 16]
    # two ranks share two cores and add an all-reduce: some speed-up, well below linear
    assert 0.2 < doc["points"][1]["efficiency"] < 1.2
    text = run_pardiag("scaling", str(tmp_path / "n1"), str(tmp_path / "n2"))
    assert "efficiency" in text.stdout and "Amdahl serial fraction" in text.stdout
    assert run_pardiag("scaling", str(tmp_path / "n1")).returncode == 2
