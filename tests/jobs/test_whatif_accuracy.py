"""benchmarks/whatif_accuracy.py: the scenarios' --fix switch, the benchmark's arithmetic,
and (slow) one real pair of jobs: the straggler scenario with its problem and with the
fix, whose estimated saving must match the measured one.

The tolerances come from the noise measured on the machine the suite runs on (2 CPU
cores, shared with other jobs; gloo; 30 steps), with `whatif_accuracy.py --scenarios
slow_rank` run 5 times (8 problem/fixed pairs): the measured saving ranged from 88.5 to
96.1% (median job step 43-46 ms with the slow rank, 1.7-5.3 ms without: the spread is
the fixed step under contention), a range of 7.6 points; two pairs of one invocation
differed by up to 6.2. On 2026-12-02, on another 2-CPU host (AMD EPYC), the two pairs of
one full-suite run differed by 9.1 (measured 81.5 and 90.6%, fixed steps up to 8.2 ms;
the estimate's two-pair median missed by -0.8) and those of another invocation by 5.5:
REPRODUCIBLE_PP is the largest range of two pairs measured. The estimate, which moves with the problem run it
comes from, missed the median of two pairs by -1.9 to +1.1 points (one pair: -4.4 to
+2.8) in those 5 invocations, and by -0.8, -0.8, -2.5, -3.8 and -5.9 in 5 more (one
pair: down to -7.0; the last one in a clean-clone CI run, whose fixed steps ran at 1.8
and 2.7 ms). With the estimate the mean of the window's replay and the job's own steps
(analyzers/estimates.py ``job_held``), one invocation on 2026-12-05 missed by -2.1 (pairs
-2.8 and -1.5); with the job's own figure alone where it is timed (2026-12-06), the 13
slow_rank pairs of 7 benchmark invocations missed by -3.3 to +6.1, median +1.0. So the test bounds the two-pair median by TEST_BOUND_PP, not by the
5-point target (the benchmark's TARGET_PP): above every miss measured, far below
what a broken estimate gives (the straggler kept: 90 points).

Both pairs' problem runs record the same job. On 2026-12-07 a clean-clone CI run recorded
it at 56.7 and 48.3 ms per step, 17% apart: during the slower one, processes outside the
job (the hypervisor's steal counts among them) took 0.10 cores, 0.02-0.03 during the
other three runs; rank 1's training thread got as little as 29.0 ms of CPU in a step
whose busy loop alone runs 40 ms of wall time, with 3.9 ms of it waiting for a CPU, and
it waited inside backward 9.6 ms per step (median) against 3.2 in the other recording.
That recording's step held 8 ms that the other did not and its fixed run did not (8.4
ms, 6.1 for the other pair's): its measured saving (85.1%) exceeded what removing the
planted work (40.6 ms of the 56.7) can give (71.6%). Its estimate missed it by -20.1
points, the other pair's by -3.5. With another process keeping 0.1 core busy throughout
3 pairs here (both runs of each disturbed alike), the problem recordings lay 3.5% apart
(48.5-50.2 ms) and the estimate missed by -4.3, -2.9 and +4.6; 3 quiet pairs, 7.5%
apart (47.9-51.4 ms), by +1.3, -6.8 and -3.7; the 5 invocations above, 43-46 ms (7%).
So a set whose two problem recordings lie more than PROBLEM_SPREAD apart is recorded
once more, and the set whose two agree best is kept: the pairs compare the fix with a
recording of the problem as undisturbed as the fixed run's.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

import pytest

from conftest import REPO, steadier

sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "examples" / "scenarios"))

import harness  # noqa: E402
import whatif_accuracy as wa  # noqa: E402

TEST_BOUND_PP = 7.5  # the two-pair median of the real pair below: above the misses measured (see the docstring)
REPRODUCIBLE_PP = 9.1  # the largest range of two straggler pairs' measured savings (docstring)
PROBLEM_SPREAD = 0.12  # two recordings of the problem job further apart: one was disturbed (docstring)


# -- the --fix switch -------------------------------------------------------------------


def ns(fix: bool, *sets: str) -> argparse.Namespace:
    return argparse.Namespace(fix=fix, set=list(sets), steps=7)


def test_without_fix_the_problem_runs_unchanged() -> None:
    assert harness.settings(ns(False), {"batch": 32, "workers": 0}, {"workers": 4}) == {
        "batch": 32, "workers": 0, "steps": 7}


def test_fix_lays_the_scenarios_fix_then_the_given_values_over_the_problem() -> None:
    got = harness.settings(ns(True, "workers=15", "persistent_workers=true", "note=abc"),
                           {"batch": 32, "workers": 0}, {"workers": 4, "persistent_workers": True})
    assert got == {"batch": 32, "workers": 15, "persistent_workers": True, "note": "abc", "steps": 7}


@pytest.mark.parametrize("sets", [("workers",), ("=3",)])
def test_a_bad_set_is_a_one_line_error(sets: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        harness.settings(ns(True, *sets), {}, {})


def test_set_without_fix_is_an_error() -> None:
    with pytest.raises(SystemExit, match="needs --fix"):
        harness.settings(ns(False, "workers=2"), {}, {})


@pytest.mark.parametrize("scenario", sorted(wa.SCENARIOS))
def test_every_scenario_names_a_fix_train_understands(scenario: str) -> None:
    module = wa.importlib.import_module(f"pardiag.examples.scenarios.{scenario}")
    fix = module.FIX
    # train()'s parameters, or the scenario's own data settings it takes out first
    known = set(inspect.signature(harness._train).parameters) | set(getattr(module, "DATA_KEYS", ()))
    assert set(fix) <= known, set(fix) - known
    assert bool(fix) == (wa.SCENARIOS[scenario][0] is not None)  # only the control has nothing to fix


def test_accumulation_is_compared_per_micro_batch() -> None:
    assert wa.micro_batches("comm_bound", fixed=True) == 4  # the finding's 4 micro-batches per sync
    assert wa.micro_batches("comm_bound", fixed=False) == 1
    assert wa.micro_batches("slow_rank", fixed=True) == 1


# -- the arithmetic -----------------------------------------------------------------------


def write_steps(root: Path, rank: int, durs_ms: list[float], active: set[int]) -> None:
    d = root / "ranks" / str(rank)
    d.mkdir(parents=True)
    lines = [{"v": 2, "step": i, "t_end_ns": (i + 1) * 10**9, "dur_us": ms * 1000, "pardiag_us": 0.0,
              "source": "optimizer", **({"profiler": "active"} if i in active else {})}
             for i, ms in enumerate(durs_ms)]
    (d / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_step_time_is_the_median_over_all_counted_steps_of_the_slowest_rank(tmp_path: Path) -> None:
    # step 0 is warm-up and step 4 profiled: left out; steps 1-3 take the slower rank's
    # 14, 12 and 13 ms; their median is 13 ms
    write_steps(tmp_path, 0, [900, 10, 12, 11, 50], {4})
    write_steps(tmp_path, 1, [900, 14, 9, 13, 50], {4})
    assert wa.median_step_us(tmp_path) == (13000.0, 3)


def test_a_run_without_counted_steps_is_an_error(tmp_path: Path) -> None:
    write_steps(tmp_path, 0, [900], set())
    with pytest.raises(wa.BenchError, match="no counted steps"):
        wa.median_step_us(tmp_path)


def run(per_micro_ms: float, fixed: bool) -> wa.Run:
    return wa.Run("x", fixed, per_micro_ms * 1000, 20, per_micro_ms * 1000, 1.0)


def test_summary_of_two_pairs() -> None:
    # pairs 100 -> 50 ms and 110 -> 45 ms: savings 50.0 and 59.1%, median 54.5; only the
    # first problem run gave an estimate, 40%: it misses its own pair's 50.0 by -10.0
    # points (found in 1 of 2); what_if's 40% came from both: -14.5 against 54.5. The
    # problem runs differ by 10 ms, the fixed by 5: noise 10 points of the first problem
    # step (100 ms); the savings differ by 9.1
    r = wa.Result("s", "straggler", [run(100, False), run(110, False)], [run(50, True), run(45, True)],
                  [40.0, None], what_if_all_pct=[40.0, 40.0])
    s = r.summary()
    assert (s["estimated_pct"], s["measured_pct"], s["measured_estimated_pct"], s["error_pp"]) == (40.0, 54.5, 50.0, -10.0)
    assert (s["found"], s["pairs"], s["what_if_all_pct"], s["what_if_error_pp"]) == (1, 2, 40.0, -14.5)
    assert (s["noise_pp"], s["spread_pp"], s["measured_each_pct"]) == (10.0, 9.1, [50.0, 59.1])
    # both estimated, 40 and 60: median 50 against 54.5, -4.5 points off
    r = wa.Result("s", "straggler", r.problem, r.fixed, [40.0, 60.0])
    assert (r.summary()["error_pp"], r.summary()["found"]) == (-4.5, 2)
    # found in neither: no error, and the table says 0/2
    r = wa.Result("s", "straggler", r.problem, r.fixed, [None, None])
    assert r.summary()["error_pp"] is None and "0/2" in wa.table([r.summary()])
    # the fixed runs' 5 ms is 5 points of the problem step, not 10% of their own
    r = wa.Result("s", "straggler", [run(100, False), run(100, False)], [run(10, True), run(5, True)], [90.0], [90.0])
    assert r.summary()["noise_pp"] == 5.0


def test_the_host_probe_line_gives_the_slowdown_and_the_drift() -> None:
    import host_probe

    start = {"cpus": [0, 1], "matmul_us": 160.0, "beside_us": 336.0, "slowdown": 2.1}
    end = dict(start, matmul_us=176.0)  # 10% slower at the end
    assert host_probe.words(start, end) == (
        "host: a 256x256 float32 matmul on CPU 0 took 160 us alone, 336 us while CPU 1 multiplied matrices "
        "(2.10x); alone it took 160 us at the start, 176 at the end (+10%)")
    assert host_probe.words(start, None).endswith("(2.10x)")
    assert host_probe.words(None, end) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="the probe pins two CPUs")
def test_the_host_probe_times_what_a_pinned_multiply_takes_here() -> None:
    # the probe's alone figure against the same multiply timed here, pinned to the same
    # CPU (best of 5 rounds of 200): the same operation, so within 2x either way
    import statistics
    import time

    import host_probe
    import torch

    got = host_probe.probe()
    assert got is not None and got["cpus"][0] != got["cpus"][1]
    before = os.sched_getaffinity(0)
    threads = torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {got["cpus"][0]})
        torch.set_num_threads(1)
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                a @ b
            rounds.append((time.perf_counter() - t0) / 200 * 1e6)
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    here = statistics.median(rounds)
    assert 0.5 < got["matmul_us"] / here < 2.0, (got, here)
    assert got["slowdown"] == pytest.approx(got["beside_us"] / got["matmul_us"], abs=0.01)


def test_the_control_estimates_nothing_and_measures_noise() -> None:
    r = wa.Result("healthy", None, [run(40, False)], [run(42, True)], [None], [0.0])
    s = r.summary()
    assert (s["estimated_pct"], s["measured_pct"], s["error_pp"]) == (0.0, -5.0, 5.0)
    assert s["noise_pp"] is None and s["spread_pp"] is None  # one pair: no repetition to compare


def test_the_advised_values_come_from_the_findings_settings() -> None:
    finding = {"action": {"settings": [
        {"call": "torch.utils.data.DataLoader",
         "kwargs": {"num_workers": 15, "persistent_workers": True, "prefetch_factor": 2}},
        {"call": "torch.nn.parallel.DistributedDataParallel", "kwargs": {"bucket_cap_mb": 0.2}}]}}
    assert wa.advised_values("dataloader", finding) == {"workers": 15, "persistent_workers": True}
    assert wa.advised_values("ddp_bucket_size", finding) == {"bucket_cap_mb": 0.2}
    assert wa.advised_values("straggler", finding) == {}


def _doc(*rows: tuple[str, str | None, list[float | None], list[float]], error_pp: dict[str, float] | None = None) -> dict:
    return {"results": [{"scenario": s, "lever": lever, "estimated_each_pct": est, "measured_each_pct": meas,
                         "error_pp": (error_pp or {}).get(s)} for s, lever, est, meas in rows]}


def test_pooled_invocations_give_each_scenario_the_median_of_all_its_pairs() -> None:
    # invocation A: straggler pairs measured 80 and 85, estimated 84 and 82 (errors +4.0, -3.0);
    # B: 90 estimated 83 (-7.0) and a problem run without the finding. Pooled: +4.0, -3.0,
    # -7.0: median -3.0, |error| 4.0, 2 of 3 within 5; the measured savings 70-90: 20 points
    a = _doc(("slow_rank", "straggler", [84.0, 82.0], [80.0, 85.0]), ("healthy", None, [None, None], [1.0, -2.0]),
             error_pp={"slow_rank": 0.5})
    b = _doc(("slow_rank", "straggler", [83.0, None], [90.0, 70.0]), ("healthy", None, [0.0, None], [3.0, 0.5]),
             error_pp={"slow_rank": -7.0})
    rows = {r["scenario"]: r for r in wa.pool([("A", a), ("B", b)])}
    s = rows["slow_rank"]
    assert s["errors"] == [4.0, -3.0, -7.0] and (s["error_pp"], s["abs_error_pp"], s["within"]) == (-3.0, 4.0, 2)
    assert (s["found"], s["pairs"], s["measured_range_pp"]) == (3, 4, 20.0)
    assert rows["healthy"]["found"] == 1  # B's first control recording had a finding
    text = wa.pool_table(list(rows.values()), ["A", "B"])
    # one scenario, its pooled median 3.0: within both targets; B alone (7.0) is not
    assert "all 3 pairs of 2 invocations (A, B): median |error| 4.0 pp, 2 within 5" in text
    assert "max 3.0 pp (slow_rank); targets (each <= 5, median <= 3) met" in text
    assert "A met (median 0.5, max 0.5); B not met (median 7.0, max 7.0)" in text
    assert "healthy (the control): a finding in 1 of 4 recordings" in text
    # a scenario only the second invocation recorded counts in its line, not the first's
    c = _doc(("gc_pauses", "garbage_collection", [90.0, 91.0], [80.0, 81.0]), error_pp={"gc_pauses": 10.0})
    text = wa.pool_table(wa.pool([("A", a), ("C", c)]), ["A", "C"])
    assert "A met (median 0.5, max 0.5); C not met (median 10.0, max 10.0)" in text


def test_reuse_keeps_the_recording_the_benchmark_kept(tmp_path: Path) -> None:
    # a job recorded three times (the first two disturbed): the least disturbed is kept,
    # the second here (0.05 cores); without the loads written (older recordings), the last
    first, again1, again2 = (tmp_path / n for n in ("j-fix-1", "j-fix-1-again1", "j-fix-1-again2"))
    for d, load in ((first, 0.9), (again1, 0.05), (again2, 0.3)):
        d.mkdir()
        (d / wa.KEPT_FILE).write_text(json.dumps({"others_cores": load}))
    (tmp_path / "j-fix-10").mkdir()  # another job whose name starts alike
    assert wa.kept(first) == again1
    (again2 / wa.KEPT_FILE).unlink()
    assert wa.kept(first) == again2
    assert wa.kept(tmp_path / "j-fix-10") == tmp_path / "j-fix-10"  # recorded once


def test_pool_reads_results_files_and_refuses_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "O.json"
    good.write_text(json.dumps(_doc(("gc_pauses", "garbage_collection", [96.0, 97.0], [95.5, 96.2]))))
    assert wa.main(["--pool", str(good)]) == 0
    assert "+0.5 +0.8" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert wa.main(["--pool", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a result of --json") and err.count("\n") == 1
    assert wa.main(["--pool", str(tmp_path / "missing.json")]) == 2
    assert "not a result of --json (FileNotFoundError" in capsys.readouterr().err


def test_an_unknown_scenario_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert wa.main(["--scenarios", "slow_rank,nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown scenario(s) nope;") and err.count("\n") == 1


# -- one real pair --------------------------------------------------------------------------


def problem_spread(res: wa.Result) -> float:
    """How far apart the two recordings of the same problem job are: their median steps'
    range over the shorter one."""
    steps = [r.per_micro_us for r in res.problem]
    return max(steps) / min(steps) - 1


@pytest.fixture(scope="module")
def straggler_pairs(tmp_path_factory: pytest.TempPathFactory) -> wa.Result:
    """Two pairs; recorded once more when the two problem recordings disagree past
    PROBLEM_SPREAD (one of them was disturbed), keeping the set whose two agree best."""
    # (the host's speed is not timed around the pairs: 6 probes of about 3 s each)
    return steadier(lambda _: wa.measure("slow_rank", repeat=2, steps=30, workdir=tmp_path_factory.mktemp("accuracy"),
                                         retries=1, probe=False),
                    lambda res: problem_spread(res) / PROBLEM_SPREAD,
                    "the straggler pairs (their problem recordings' spread over PROBLEM_SPREAD)")


@pytest.mark.slow
@pytest.mark.timed
def test_the_straggler_estimate_matches_the_measured_saving(straggler_pairs: wa.Result) -> None:
    s = straggler_pairs.summary()
    assert s["top_lever"] == ["straggler", "straggler"], s
    assert s["still_reported_after_fix"] == [False, False], s
    # the estimate is the replay's (its edits say where the job's own steps set the figure),
    # and the replay reproduces the measured step
    assert s["method"] == ["replay", "replay"], s
    errors = [e for e in s["replay_error_pct"] if e is not None]
    assert len(errors) == 4 and max(errors) <= 8.0, s
    assert abs(s["error_pp"]) <= TEST_BOUND_PP, s


@pytest.mark.slow
@pytest.mark.timed
def test_the_measured_saving_is_reproducible(straggler_pairs: wa.Result) -> None:
    spread = straggler_pairs.spread_pp()
    assert spread is not None and spread <= REPRODUCIBLE_PP, straggler_pairs.summary()


# -- every change at once (--combined) ----------------------------------------------------


def test_every_change_the_what_if_replayed_is_applied_at_once() -> None:
    # the contended scenario's problem run: its own cause (the scenario's FIX), 2 workers
    # and 4 micro-batches replayed; the bucket cap was share-based, so the what-if left it out
    doc = {"findings": [
        {"lever": "host_contention", "estimate": {"method": "replay"}},
        {"lever": "dataloader", "estimate": {"method": "replay"}, "action": {"settings": [
            {"call": "torch.utils.data.DataLoader", "kwargs": {"num_workers": 2, "persistent_workers": True}}]}},
        {"lever": "ddp_bucket_size", "estimate": {"method": "share"}, "action": {"settings": [
            {"call": "torch.nn.parallel.DistributedDataParallel", "kwargs": {"bucket_cap_mb": 1.0}}]}},
        {"lever": "gradient_accumulation", "estimate": {"method": "replay"}}]}
    assert wa.all_changes(doc) == {"workers": 2, "persistent_workers": True, "accum": 4}
    # a replayed change the harness cannot make: nothing to compare with
    doc["findings"].append({"lever": "comm_overlap", "estimate": {"method": "replay"}})
    assert wa.all_changes(doc) is None


def test_the_combined_saving_is_compared_with_the_what_if() -> None:
    # problems 100 and 110 ms; every change at once 40 ms per micro-batch and 55: 60.0 and
    # 50.0%, median 55.0; what_if said 70 and 66: median 68.0, +13.0 points
    r = wa.Result("s", "host_contention", [run(100, False), run(110, False)], [run(50, True), run(45, True)],
                  [55.0, 52.0], what_if_all_pct=[70.0, 66.0], combined=[run(40, True), run(55, True)])
    s = r.summary()
    assert (s["combined_each_pct"], s["combined_pct"], s["combined_error_pp"]) == ([60.0, 50.0], 55.0, 13.0)
    assert "every change at once measured 60.0, 50.0% per pair; what_if 68.0%, error +13.0 pp" in wa.table([s])
    # without --combined the summary has no such keys and the table no such line
    assert "combined_pct" not in wa.Result("s", "x", r.problem, r.fixed, [1.0, 1.0]).summary()


def test_with_steady_a_pair_over_which_the_host_sped_up_or_slowed_is_recorded_again(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # probes before, between and after the two jobs: 400, 410, 500 us (the host 25% slower
    # by the end: 500 / 400 - 1) -> the pair again; 400, 404, 410 (2.5%) is kept. A pair
    # whose every attempt moved keeps the steadiest: 12%, 8% and 33% -> the second
    speeds = iter([400.0, 410.0, 500.0, 400.0, 404.0, 410.0])
    monkeypatch.setattr(wa.host_probe, "speed_us", lambda: next(speeds))
    recorded_dirs: list[str] = []

    def fake_record(scenario: str, fixed: bool, out: Path, steps: int, retries: int = 0,
                    values: dict | None = None, k: int | None = None) -> wa.Run:
        recorded_dirs.append(out.name)
        return wa.Run(str(out), fixed, 50.0 if not fixed else 30.0, 20, 50.0 if not fixed else 30.0, 1.0, 0.0)

    monkeypatch.setattr(wa, "record", fake_record)
    monkeypatch.setattr(wa, "analyze", lambda path: {"findings": []})
    p, f, drift = wa._pair("slow_rank", "straggler", 0, 30, tmp_path, 2, None, wa.HOST_DRIFT)
    assert recorded_dirs == ["slow_rank-0", "slow_rank-fix-0", "slow_rank-0-host1", "slow_rank-fix-0-host1"]
    assert (Path(p.run.path).name, Path(f.run.path).name) == ("slow_rank-0-host1", "slow_rank-fix-0-host1")
    assert drift == pytest.approx(0.025)
    assert wa.kept_pair(tmp_path, "slow_rank", 0) == (("slow_rank-0-host1", "slow_rank-fix-0-host1"),
                                                      pytest.approx(0.025))

    speeds = iter([400.0, 448.0, 420.0, 400.0, 410.0, 432.0, 500.0, 450.0, 600.0])
    recorded_dirs.clear()
    p, f, drift = wa._pair("slow_rank", "straggler", 1, 30, tmp_path, 2, None, wa.HOST_DRIFT)
    assert len(recorded_dirs) == 6 and Path(p.run.path).name == "slow_rank-1-host1"
    assert drift == pytest.approx(0.08)
    doc = json.loads((tmp_path / wa.PAIRS_FILE).read_text())
    assert doc["slow_rank-1"]["speed_us"] == [400.0, 410.0, 432.0] and doc["slow_rank-1"]["attempts"] == 3
    assert "slow_rank-0" in doc  # the first pair's line is kept
    # --reuse of a directory an older benchmark kept (no PAIRS_FILE): the first attempt's names
    assert wa.kept_pair(tmp_path / "older", "slow_rank", 0) == (("slow_rank-0", "slow_rank-fix-0"), None)
    # without --steady the pair is recorded once, whatever the probes say, and its drift given
    speeds = iter([400.0, 600.0, 400.0])
    recorded_dirs.clear()
    _, _, drift = wa._pair("slow_rank", "straggler", 2, 30, tmp_path, 2, None)
    assert recorded_dirs == ["slow_rank-2", "slow_rank-fix-2"] and drift == pytest.approx(0.5)


def test_the_drift_line_counts_the_pairs_left_over_the_bound() -> None:
    assert wa.host_drift([400.0, None, 500.0]) == pytest.approx(0.25)
    assert wa.host_drift([None, 400.0]) is None
    rows = [{"host_drift_pct": [1.0, 7.5]}, {"host_drift_pct": [2.0, None]}, {}]
    assert wa.drift_words(rows, 0.05) == ("the host's speed over each pair kept: moved 2.0% (median), at most 7.5%; "
                                          "1 of 3 pairs over 5% after every attempt")
    assert wa.drift_words(rows) == "the host's speed over each pair kept: moved 2.0% (median), at most 7.5%"
    assert wa.drift_words([{"host_drift_pct": [None]}]) is None
