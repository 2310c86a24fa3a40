"""The `ddp_find_unused` lever on real runs (tests/scripts/find_unused.py: 2 ranks, gloo
on the CPU, a deep narrow model whose every parameter is used).

Ground truth: one job steps two copies of the model in turn, one with
find_unused_parameters=False (even steps) and one with True (odd steps), so that both
are timed under the same load; pardiag's steps.jsonl gives every step's duration. The
finding claims no saving (`est_saving_pct` is None: one run cannot separate the search's
cost), so what is checked against the measurement is that its advice is sound: turning
the search off does not make the step slower beyond the noise of the measurement. The
measured cost is printed (`pytest -s`) for the record.

Separate runs with True and False measure the same cost, but on a shared machine their
medians differ from run to run by more than the setting costs; the paired job does not.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, read_steps, run_pardiag, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timed]
SCRIPT = SCRIPTS / "find_unused.py"
WARMUP_STEPS = 20  # bucket rebuilding, allocator warm-up, the profiler window is within them or marked


def pardiag_run(tmp_path: Path, name: str, *args: str) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / name
    res = run_pardiag("run", "-q", "--no-report", "--out", str(out), "--", *torchrun(2, SCRIPT, *args))
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    return out, doc


def paired_cost(run: Path) -> tuple[float, float, list[float]]:
    """(median False step, median True step, per-pair cost) in microseconds of the job's
    step (the mean over both ranks of each step's duration: a rank that waits for the
    other at one step's end is ahead at the next, which on a single rank reads as noise),
    each True step against the mean of the False steps either side of it."""
    per_rank = []
    for rank in (0, 1):
        recs = [r for r in read_steps(run / "ranks" / str(rank) / "steps.jsonl")
                if r["step"] >= WARMUP_STEPS and not r.get("profiler") and r.get("dur_us")]
        per_rank.append({r["step"]: float(r["dur_us"]) for r in recs})
    dur = {s: (per_rank[0][s] + per_rank[1][s]) / 2 for s in per_rank[0].keys() & per_rank[1].keys()}
    false = [v for s, v in dur.items() if s % 2 == 0]
    true = [v for s, v in dur.items() if s % 2 == 1]
    pairs = [dur[s] - (dur[s - 1] + dur[s + 1]) / 2 for s in dur if s % 2 == 1 and s - 1 in dur and s + 1 in dur]
    return statistics.median(false), statistics.median(true), pairs


def bootstrap_median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n)]


def test_finding_on_a_model_that_uses_every_parameter_and_the_measured_cost(tmp_path: Path) -> None:
    run, doc = pardiag_run(tmp_path, "both", "--find-unused", "both", "--steps", "400")
    mods = doc["run"]["framework"]["ddp"]
    assert [m["find_unused_parameters"] for m in mods] == [False, True]
    # every rank's DDP recorded the model's parameters all used
    assert mods[1]["across_ranks"]["ranks"] == 2 and mods[1]["across_ranks"]["unused_parameter_size_max"] == 0
    found = [f for f in doc["findings"] if f["lever"] == "ddp_find_unused"]
    assert len(found) == 1, [(f["lever"], f["title"]) for f in doc["findings"]]
    f = found[0]
    assert f["severity"] == "low" and f["est_saving_pct"] is None and f["ranks"] == [0, 1]
    assert "256 parameter tensors" in f["evidence"][0] and "on all 2 ranks" in f["evidence"][1]
    assert f["action"]["framework"] == "torch" and "find_unused_parameters=False" in f["action"]["code"]

    # ground truth: the False copy against the True copy under the same load, as job steps
    med_false, med_true, pairs = paired_cost(run)
    lo, hi = bootstrap_median_ci(pairs)
    rel = statistics.median(pairs) / med_false
    print(f"job step with find_unused_parameters=False {med_false:.0f} us, True {med_true:.0f} us; "
          f"paired cost {rel:+.1%} of the step (95% CI {lo / med_false:+.1%} .. {hi / med_false:+.1%}, "
          f"{len(pairs)} pairs)")
    # the advice is sound: with the search off a step is not slower beyond the noise (5%)
    assert lo / med_false > -0.05, (lo / med_false, hi / med_false)


def test_no_finding_without_the_search(tmp_path: Path) -> None:
    _run, doc = pardiag_run(tmp_path, "off", "--find-unused", "0", "--steps", "24")
    assert [m["find_unused_parameters"] for m in doc["run"]["framework"]["ddp"]] == [False]
    assert "ddp_find_unused" not in [f["lever"] for f in doc["findings"]]


def test_no_finding_when_a_parameter_is_unused(tmp_path: Path) -> None:
    # the spare Linear(64, 64) never gets a gradient: (64 x 64 + 64) x 4 bytes = 16,640 bytes unused
    _run, doc = pardiag_run(tmp_path, "unused", "--find-unused", "1", "--unused-layer", "--steps", "24")
    acr = doc["run"]["framework"]["ddp"][0]["across_ranks"]
    assert acr["unused_parameter_size_max"] == 16_640 and acr["ranks"] == 2
    assert "ddp_find_unused" not in [f["lever"] for f in doc["findings"]]


def test_the_caveat_names_the_error_ddp_raises(tmp_path: Path) -> None:
    """The finding warns that a model which leaves a parameter unused stops with DDP's
    error once the search is off: this is that error."""
    res = subprocess.run(torchrun(2, SCRIPT, "--find-unused", "0", "--unused-layer", "--steps", "4"),
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert res.returncode != 0
    assert "Expected to have finished reduction in the prior iteration" in res.stdout + res.stderr
