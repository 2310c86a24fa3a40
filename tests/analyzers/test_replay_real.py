"""The replay's accuracy on real torchrun jobs (gloo, CPU, 2 ranks): replayed with the
measured durations, the job's step must come out as measured (target: median error
<= 3%, each run <= 8%)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun
from pardiag.analyzers.replay import MAX_ERROR, TARGET_MEDIAN_ERROR, Straggler, load_run, replay

pytestmark = [pytest.mark.slow, pytest.mark.timed]
SCENARIOS = REPO / "examples" / "scenarios"


def record(out: Path, script: Path) -> None:
    res = run_pardiag("run", "-q", "--no-report", "--out", str(out), "--",
                      *torchrun(2, script, "--steps", "20"))
    assert res.returncode == 0, res.stderr[-2000:]


def test_replay_reproduces_real_runs(tmp_path: Path) -> None:
    # a balanced job, a planted slow rank (the others wait at the all-reduce) and tiny
    # DDP buckets (25 all-reduces a step in flight two at a time on gloo's threads)
    errors = {}
    for name in ("healthy", "slow_rank", "tiny_buckets"):
        record(tmp_path / name, SCENARIOS / f"{name}.py")
        r = replay(load_run(str(tmp_path / name)))
        assert r.refusal() is None, (name, r.refusal())
        errors[name] = r.error
    assert max(errors.values()) <= MAX_ERROR, errors
    assert statistics.median(errors.values()) <= TARGET_MEDIAN_ERROR, errors

    # the slow rank is on the critical path, and fixing it removes the other's wait
    model = load_run(str(tmp_path / "slow_rank"))
    base = replay(model)
    cp = base.median_path()
    assert cp is not None and cp.top_rank == 1
    fixed = replay(model, [Straggler(1)])
    assert fixed.replayed_step_us < 0.9 * base.replayed_step_us
    assert sum(fixed.replayed_steps[0].values()) < 0.9 * sum(base.replayed_steps[0].values())
