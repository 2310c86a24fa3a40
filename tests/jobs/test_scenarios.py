"""One real job per lever with its problem planted (examples/scenarios/, 2 ranks, gloo
on the CPU): the expected lever must be the top finding; the healthy control gets none."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timed]
# SECOND_RUN: two ranks, their gloo threads and the launcher share 2 cores, and a
# scheduling hiccup during the 3 profiled steps can make one rank a real straggler or
# leave communication exposed (seen: comm_bound with straggler on top, the healthy control
# at 11% exposed transfer, in 2 of 6 full-suite runs). Each job gets one second run; the
# assertion is on that run. The share rules now test their share step by step
# (analyzers/shares.py: no false communication finding in 22 healthy recordings); the
# straggler test still names a rank in about 1 healthy recording of 5 on 2 cores.
SCENARIOS = REPO / "examples" / "scenarios"


def cpu_has_bf16_matmul() -> bool:
    try:
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


# cpu_contention's rank 1 shares its CPU with the burner, and its training thread sleeps
# 1.5-7 ms in most of pardiag's step boundaries (waits that are not pardiag's work): while
# a step whose boundary lasted 1 ms was left uncounted, a clean-clone run of 20 steps kept
# 6 job steps in both attempts, too few for the straggler test to name rank 1, and gave no
# host_contention finding. Steps now count by pardiag's CPU time at the boundary (21 of 21
# counted in 30-step recordings); 30 steps keep the margin the accuracy benchmark has.
STEPS = {"cpu_contention": 30}


def _glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


# page_faults' cause is its faults at their cost: measured after the job (as a user's run
# does); unmeasured, the typical 1.2 us a fault explains about half of what they cost here
# (2.5-3.2 us measured on this host), on the edge of the rule. tiny_buckets' bucket
# finding is replayed with the all-reduce curve measured after the job (a user's default);
# without it the estimate is share-based, and in one suite run both attempts (steps of 48
# and 45 ms) gave it 3.5 and 4.6%, low, with accumulation on top, where the same kind of
# recording measured with the curve gives 26.4% and the advised cap has measured a median
# of 19.9% (README, "How good are the estimates")
MEASURED = {"page_faults", "tiny_buckets"}


def findings_of(tmp_path: Path, script: str, *pardiag_args: str, attempt: int = 0) -> list[dict]:
    out = tmp_path / f"{script}-{attempt}"
    res = run_pardiag("run", "-q", "--out", str(out), *pardiag_args, "--",
                      *torchrun(2, SCENARIOS / f"{script}.py", "--steps", str(STEPS.get(script, 20))),
                      measure=script in MEASURED)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    return doc["findings"]


@pytest.mark.parametrize(
    "script, lever, extra",
    [
        ("tiny_buckets", "ddp_bucket_size", ()),
        ("slow_input", "dataloader", ()),
        pytest.param("fp32_matmul", "mixed_precision", (), marks=pytest.mark.skipif(
            not cpu_has_bf16_matmul(), reason="this CPU has no bf16 matrix units: fp32 is the right choice here")),
        ("slow_rank", "straggler", ()),
        ("comm_bound", "gradient_accumulation", ()),
        ("too_large", "sharding", ("--memory-per-rank", "400MiB")),
        pytest.param("cpu_contention", "host_contention", (), marks=pytest.mark.skipif(
            not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
            reason="pins each rank to its own CPU: needs Linux and two CPUs")),
        ("gc_pauses", "garbage_collection", ()),
        ("long_inputs", "input_imbalance", ()),
        pytest.param("page_faults", "straggler", (), marks=pytest.mark.skipif(
            not _glibc(), reason="plants the problem with glibc's mallopt")),
    ],
)
def test_planted_problem_is_the_top_finding(tmp_path: Path, script: str, lever: str, extra: tuple[str, ...]) -> None:
    findings = findings_of(tmp_path, script, *extra)
    if not findings or findings[0]["lever"] != lever:
        findings = findings_of(tmp_path, script, *extra, attempt=1)  # see SECOND_RUN
    assert findings, f"{script}: no finding"
    if script == "tiny_buckets" and findings[0]["lever"] != lever:
        _buckets_that_cost_nothing_here(findings)
        return
    assert findings[0]["lever"] == lever, [(f["lever"], f["severity"], f["est_saving_pct"]) for f in findings]
    top = findings[0]
    assert top["evidence"] and (top["action"].get("code") or top["action"].get("env") or top["action"].get("text"))
    if script == "slow_input":
        _loading_is_counted_on_the_ranks_cores(tmp_path, top)
    if script == "page_faults":
        # rank 1's allocator maps its blocks afresh: the cause is its faults, not a phase's work
        assert top["ranks"] == [1] and "page faults" in top["title"], top["title"]
        assert "MALLOC_TRIM_THRESHOLD_" in top["action"]["code"], top["action"]
        # at the cost measured after the job (factors/faults.json), not the typical one
        assert any("a fault (measured after the job:" in e for e in top["evidence"]), top["evidence"]


def _buckets_that_cost_nothing_here(findings: list[dict]) -> None:
    """On 2 cores tiny_buckets runs in one of two ways. In about half of its recordings
    the ranks' processes keep the cores 80-90% busy (steps of 26-36 ms); there
    the bucket finding's estimate is held at the job's step by the busy cores (0.0%,
    severity low) and gradient accumulation, with a larger saving, comes first. Measured
    with the change applied in such recordings: bucket_cap_mb=1 saved -5.6 and -0.4%
    (and -12.0 to +14.0, median +1.5, in 6 earlier pairs), 4 micro-batches per step 56.2
    and 54.3% (estimated 56.5 and 56.1). So there the right top finding is accumulation,
    and the bucket finding must say why it saves nothing."""
    tops = [(f["lever"], f["severity"], f["est_saving_pct"]) for f in findings]
    (buckets,) = [f for f in findings if f["lever"] == "ddp_bucket_size"] or [None]
    assert buckets is not None, tops
    assert findings[0]["lever"] == "gradient_accumulation", tops
    assert buckets["severity"] == "low" and buckets["est_saving_pct"] < 5, tops
    bound = (buckets.get("estimate") or {}).get("bound") or ""
    assert "cores" in bound and "busy" in bound and "leave them as busy" in bound, bound


def _loading_is_counted_on_the_ranks_cores(tmp_path: Path, top: dict) -> None:
    """slow_input loads each batch in the loop: 32 samples, each a 1.5 ms sleep. Every step
    records one fetch and the loop's CPU time in it, a sliver of the 48 ms of sleeps (1.05
    to 1.08 ms here); the estimate puts what the workers would burn, that loading and what
    they add per batch (measured after the job, not in this run), on the ranks' cores."""
    runs = sorted(tmp_path.glob("slow_input-*"))
    steps = [json.loads(line) for line in (runs[-1] / "ranks" / "0" / "steps.jsonl").read_text().splitlines()][1:]
    assert steps and all(s["data_calls"] == 1 for s in steps), [s.get("data_calls") for s in steps]
    assert all(0 < s["data_cpu_us"] < 0.25 * s["data_us"] for s in steps), [(s["data_cpu_us"], s["data_us"]) for s in steps]
    if top["estimate"]["method"] != "replay":  # a refused replay says why; no edits to read
        assert top["estimate"]["refused"]
        return
    assert any("DataLoader workers' " in e for e in top["estimate"]["edits"]), top["estimate"]["edits"]
    by_name = {f["name"]: f for f in top["estimate"]["factors"]}
    loading = by_name["loading CPU per step"]
    assert loading["measured"] and loading["value"] == pytest.approx(
        sum(s["data_cpu_us"] for s in steps) / len(steps), rel=0.5), loading
    # the run skipped the factors measured after the job (run_pardiag): what workers add is
    # not counted, and says so
    added = by_name["CPU a worker adds per batch"]
    assert not added["measured"] and added["value"] == 0 and added["source"].startswith("assumed"), added


def test_healthy_control_gets_no_finding(tmp_path: Path) -> None:
    findings = findings_of(tmp_path, "healthy")
    if findings:
        findings = findings_of(tmp_path, "healthy", attempt=1)  # see SECOND_RUN
    assert findings == [], [(f["lever"], f["title"]) for f in findings]


def test_a_straggler_that_starts_after_the_window_is_found_with_its_step(tmp_path: Path) -> None:
    # rank 1 slows down from optimizer step 25 of 40 (30 ms of extra work per step); the
    # profiled window (7-9) is before it
    out = tmp_path / "late"
    res = run_pardiag("run", "-q", "--out", str(out), "--",
                      *torchrun(2, SCENARIOS / "late_straggler.py", "--steps", "40"))
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    changes = doc["temporal"]["change_points"]
    change = min((c for c in changes if c["rank"] == 1), key=lambda c: c["step"])
    assert change["step"] == 25, changes
    # 30 ms more per step: the level after is 30 ms over the level before, within 10 ms, and
    # no later level (a split of the slow stretch) comes back below +15 ms
    assert abs((change["after_us"] - change["before_us"]) / 1000 - 30) < 10, change
    assert all(c["after_us"] > change["before_us"] + 15_000 for c in changes if c["step"] > 25), changes
    late = [f for f in doc["findings"] if f["lever"] == "straggler" and f["title"].startswith("from step 25 on, rank 1")]
    assert late, [(f["lever"], f["title"]) for f in doc["findings"]]
    # a whole-run straggler, if the steps before show one, is timed without the late stretch
    # (a median over both levels named rank 1 for "3.7 ms per step" once)
    for s in doc["stragglers"]:
        assert s.get("held_from") != "steps.jsonl" or \
            any(e.startswith("left out of these medians: steps 25 on (rank 1 late from step 25)") for e in s["evidence"]), s
    assert doc["temporal"]["windows"] == [[5, 9]]  # the default window: warm-up 5-6, recorded 7-9
