"""The straggler's estimated saving against the speed-up measured on a real 2-rank job
(gloo, CPU): one rank sleeps 40 ms before each forward pass; the same job runs again
without the sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timed]
SCRIPT = REPO / "tests" / "scripts" / "sleepy_ddp.py"
# the estimate may miss the measured speed-up by this much of the step (percentage
# points): both runs share the machine's cores with whatever else runs on it
TOLERANCE_PTS = 10.0


def analysed(out: Path, *args: str) -> dict:
    res = run_pardiag("run", "-q", "--out", str(out), "--", *torchrun(2, SCRIPT, "--steps", "40", *args))
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_pardiag("analyze", str(out), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_estimated_saving_matches_the_measured_speed_up(tmp_path: Path) -> None:
    # the job without the sleep runs before and after the one with it, and the measured
    # step is the mean of the two: this host's speed drifts within a minute (the fast job
    # stepped in 8.9 to 12.2 ms on one afternoon, 6 points of the slow job's 53 ms step),
    # and a drift that is slow next to the three runs cancels
    before = analysed(tmp_path / "fast-before")
    slow = analysed(tmp_path / "slow", "--sleep-ms", "40")
    fast = analysed(tmp_path / "fast")
    t_slow = slow["summary"]["step_p50_us"]
    t_fast = (before["summary"]["step_p50_us"] + fast["summary"]["step_p50_us"]) / 2
    measured = 100.0 * (t_slow - t_fast) / t_slow  # % of the slow step the fix removes

    (s,) = slow["stragglers"]
    assert s["rank"] == 1 and s["cause"].startswith(("host work", "work outside"))
    assert s["held_us_per_step"] <= t_slow and s["excess_us_per_step"] <= t_slow
    (f,) = [f for f in slow["findings"] if f["lever"] == "straggler"]
    print(f"step with the sleep {t_slow / 1000:.1f} ms, without {t_fast / 1000:.1f} ms (before "
          f"{before['summary']['step_p50_us'] / 1000:.1f}, after {fast['summary']['step_p50_us'] / 1000:.1f}): measured "
          f"{measured:.1f}% faster, estimated {f['est_saving_pct']:.1f}%; held {s['held_us_per_step'] / 1000:.1f} ms, "
          f"excess {s['excess_us_per_step'] / 1000:.1f} ms, cause {s['cause']}")
    assert abs(f["est_saving_pct"] - measured) <= TOLERANCE_PTS
    # the control: the same job without the sleep names no one
    assert fast["stragglers"] == [] and before["stragglers"] == []
