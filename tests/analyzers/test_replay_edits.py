"""The replay's edits for the levers' changes and the replay-based estimate, on hand-built
gloo traces (tracegen.gloo_replay_rank) whose numbers are worked out by hand: per rank,
forward 1000 us, backward 1200 us, a 10 us c10d::allreduce_ call, the worker's
all-reduce (its transfer once both ranks are in), the loop waking 20 us after it, the
optimizer 100 us."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pardiag.analysis import Finding
from pardiag.analyzers import estimates, factors
from pardiag.analyzers.replay import (
    Accumulate, RegroupBuckets, RemoveInputWait, ScaleGemm, Straggler, UncontendedCollectives, build_model, replay)
from pardiag.analyzers.trace import load_trace
from pardiag.step_records import WARMUP_STEPS, StepRecord
from factories import analysis, rank
from tracegen import gloo_replay_rank, slow_forward, two_steps, write_trace, x


def _model(tmp_path: Path, rank0: list[dict[str, Any]], rank1: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    traces = {r: load_trace(write_trace(tmp_path / f"rank{r}.json", ev, rank=r)) for r, ev in ((0, rank0), (1, rank1))}
    return build_model(traces, hosts={0: "node", 1: "node"})


def test_gemm_time_inside_host_work_scaled(tmp_path: Path) -> None:
    # a 600 us aten::addmm inside each forward: at 3x it takes 200, forward 600 instead of
    # 1000. Rank 1 (300 us late) arrives at 300 + 600 + 1200 + 10 = 2110, both are done
    # at 2310, awake at 2330, optimizer to 2430 (measured: 2830)
    def rank_ev(sleep: float, arrive: float) -> list[dict[str, Any]]:
        return gloo_replay_rank(sleep, arrive, 2710) + [x("aten::addmm", sleep + 100, 600.0)]

    m = _model(tmp_path, rank_ev(0, 2210), rank_ev(300, 2510))
    assert sum(n.gemm for n in m.nodes if n.rank == 0) == pytest.approx(600.0)
    assert replay(m).replayed_steps[0][1] == pytest.approx(2830.0)
    r = replay(m, [ScaleGemm(3.0)])
    assert r.replayed_steps[0][1] == pytest.approx(2430.0)
    assert r.replayed_steps[1][1] == pytest.approx(2430.0)
    # only rank 0 faster: rank 1 still arrives at 2510, the step stays 2830
    assert replay(m, [ScaleGemm(3.0, ranks=(0,))]).replayed_steps[0][1] == pytest.approx(2830.0)


def test_elementwise_followers_inside_host_work_scaled_with_the_gemms(tmp_path: Path) -> None:
    # as above, and a 400 us aten::relu after each addmm, 200 us of aten::threshold_backward
    # later in the same forward (a follower's name anywhere counts: the factor is of all of
    # them). Followers at 2x: 300 us less, GEMMs at 3x: 400 less; rank 1 then arrives at
    # 300 + 300 + 1200 + 10 = 1810, both done at 2010, awake at 2030, optimizer to 2130
    def rank_ev(sleep: float, arrive: float) -> list[dict[str, Any]]:
        return gloo_replay_rank(sleep, arrive, 2710) + [
            x("aten::addmm", sleep + 100, 600.0), x("aten::relu", sleep + 700, 400.0),
            x("aten::clamp_min", sleep + 710, 380.0),  # nested in the relu: counted once
            x("aten::threshold_backward", sleep + 1200, 200.0)]

    m = _model(tmp_path, rank_ev(0, 2210), rank_ev(300, 2510))
    assert sum(n.ew for n in m.nodes if n.rank == 0) == pytest.approx(600.0)
    assert replay(m, [ScaleGemm(3.0)]).replayed_steps[0][1] == pytest.approx(2430.0)  # followers as they were
    r = replay(m, [ScaleGemm(3.0, follower_speedup=2.0)])
    assert r.replayed_steps[0][1] == pytest.approx(2130.0)
    assert r.replayed_steps[1][1] == pytest.approx(2130.0)


def test_accumulation_replays_a_synced_micro_batch_and_k_minus_1_without_sync(tmp_path: Path) -> None:
    # the micro-batch that syncs is the measured step: 2830 on both ranks. The k - 1 that do
    # not: the all-reduce (issued from backward) and the optimizer dropped, each loop wakes
    # 20 us after its own c10d call: rank 0 at 2210 + 20 = 2230, rank 1 (300 us of sleep)
    # at 2530, no longer held by the other. Per micro-batch (k = 4): rank 0
    # (2830 + 3 * 2230) / 4 = 2380, rank 1 (2830 + 3 * 2530) / 4 = 2605
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    r = replay(m, [Accumulate(4)])
    assert r.replayed_steps[0][1] == pytest.approx(2380.0)
    assert r.replayed_steps[1][1] == pytest.approx(2605.0)
    # k = 1 is the measured step
    assert replay(m, [Accumulate(1)]).replayed_steps[0][1] == pytest.approx(2830.0)


def test_micro_batches_that_do_not_sync_skip_ddps_reducer_work(tmp_path: Path) -> None:
    # as above, with 300 us of DDP's reducer (gradients into its buckets) inside each
    # backward. Under no_sync the reducer copies nothing: the k - 1 micro-batches lose it
    # too, rank 0's 2230 -> 1930 and rank 1's 2530 -> 2230. Per micro-batch (k = 4): rank 0
    # (2830 + 3 * 1930) / 4 = 2155, rank 1 (2830 + 3 * 2230) / 4 = 2380. (A recorded comm_bound
    # fix ran the reducer in its syncing micro-batch only: 24 calls in 12 micro-batches.)
    def rank_ev(sleep: float, arrive: float) -> list[dict[str, Any]]:
        return gloo_replay_rank(sleep, arrive, 2710) + [
            x("torch::distributed::reducer::mul_out", sleep + 1500, 200.0),
            x("torch.distributed.ddp.reducer::copy_bucket_to_grad", sleep + 1800, 100.0)]

    m = _model(tmp_path, rank_ev(0, 2210), rank_ev(300, 2510))
    assert sum(n.reducer for n in m.nodes if n.rank == 0) == pytest.approx(300.0)
    assert replay(m).replayed_steps[0][1] == pytest.approx(2830.0)  # the measured step
    r = replay(m, [Accumulate(4)])
    assert r.replayed_steps[0][1] == pytest.approx(2155.0)
    assert r.replayed_steps[1][1] == pytest.approx(2380.0)


def _buckets(sleep: float = 0.0) -> list[dict[str, Any]]:
    """Four 1000-byte all-reduces (250 floats) issued at the end of backward, 100 us each
    back to back on the worker from 2210; the loop wakes at 2630, optimizer to 2730."""
    ev = gloo_replay_rank(sleep, 2210, 2310, wake_us=2630)
    out = [e for e in ev if e["name"] not in ("c10d::allreduce_", "gloo:all_reduce")]
    for i in range(4):
        out.append(x("c10d::allreduce_", 2200 + 2 * i, 2.0, **{"External id": i + 1}))
        out.append(x("gloo:all_reduce", 2210 + 100 * i, 100.0, tid=9, cat="user_annotation",
                     **{"Input Dims": [[250]], "Input type": ["float"]}))
    return out


def test_buckets_regrouped_under_a_larger_cap(tmp_path: Path) -> None:
    m = _model(tmp_path, _buckets(), _buckets())
    assert replay(m).replayed_steps[0][1] == pytest.approx(2730.0)
    assert sorted(n.bytes for n in m.nodes if n.kind == "collective" and n.rank == 0) == [1000] * 4
    # one pack of 4000 bytes: the curve gives 60 + 0.01 * 4000 = 100 us, at the level of
    # the job's own calls (measured 4 x 100 us where the curve gives 4 x 70): 100 * 400 / 280.
    # It is issued with its last part (the 4th call, at 2206); the calls merged into it are
    # gone with their pick-up delay. Done at 2206 + 142.86; the loop wakes 20 us later,
    # optimizer 100 us
    r = replay(m, [RegroupBuckets(4000, 60.0, 0.01)])
    assert r.replayed_steps[0][1] == pytest.approx(2206 + 100 * 400 / 280 + 120)
    # a cap of 2000 bytes: two packs of 80 * 200 / 140 us on the worker, the first issued
    # with the 2nd call (2202), the second right after it
    r = replay(m, [RegroupBuckets(2000, 60.0, 0.01)])
    assert r.replayed_steps[0][1] == pytest.approx(2202 + 2 * 80 * 200 / 140 + 120)
    # DDP closes a bucket once it holds the cap or more: under 1500 bytes the first call
    # (1000) stays open and the second closes it at 2000, so 1500 packs as 2000 does
    r = replay(m, [RegroupBuckets(1500, 60.0, 0.01)])
    assert r.replayed_steps[0][1] == pytest.approx(2202 + 2 * 80 * 200 / 140 + 120)
    # a cap each call reaches alone: every call is its own bucket and keeps its measured time
    assert replay(m, [RegroupBuckets(1000, 60.0, 0.01)]).replayed_steps[0][1] == pytest.approx(2730.0)


def _waited_between_buckets() -> list[dict[str, Any]]:
    """Two 1000-byte all-reduces of one step with a host wait between their issues:
    forward 0-1000, backward 1000-1600, call 1 issued at 1600 (worker 1610-1795), the
    thread blocked 1602-1800 (it ends 5 us after call 1: a wait for it), backward on
    1800-2200, call 2 issued at 2200 (worker 2210-2310), the loop awake at 2330, optimizer
    to 2430. (A real recording of tiny DDP buckets had such a gap mid-backward.)"""
    ev = [x("aten::linear", 0.0, 1000.0),
          x("autograd::engine::evaluate_function: AddmmBackward0", 1000.0, 600.0),
          x("c10d::allreduce_", 1600.0, 2.0, **{"External id": 1}),
          x("autograd::engine::evaluate_function: AddmmBackward0", 1800.0, 400.0),
          x("c10d::allreduce_", 2200.0, 2.0, **{"External id": 2}),
          x("Optimizer.step#SGD.step", 2330.0, 100.0, cat="user_annotation"), x("aten::add_", 2330.0, 100.0)]
    for start, end in ((1610.0, 1795.0), (2210.0, 2310.0)):
        ev.append(x("gloo:all_reduce", start, end - start, tid=9, cat="user_annotation",
                    **{"Input Dims": [[250]], "Input type": ["float"]}))
    return [x("ProfilerStep#1", 0.0, 2430.0, cat="user_annotation"), *ev]


def test_calls_a_rank_waited_for_between_their_issues_stay_in_separate_buckets(tmp_path: Path) -> None:
    # Packing both under a 4000-byte cap would issue the merged call at 2200, after the wait
    # that now waits for it: the replay stuck on a cycle, and every estimate of that run
    # fell back to shares. DDP could not have bucketed them together either: each stays
    # alone and keeps its measured time, so the step replays as measured, 2430 us
    m = _model(tmp_path, _waited_between_buckets(), _waited_between_buckets())
    assert any(n.kind == "wait" and n.rank == 0 for n in m.nodes)
    assert replay(m).replayed_steps[0][1] == pytest.approx(2430.0)
    r = replay(m, [RegroupBuckets(4000, 60.0, 0.01)])
    assert r.replayed_steps[0][1] == pytest.approx(2430.0)
    assert r.replayed_steps[1][1] == pytest.approx(2430.0)


def test_loader_workers_hide_a_fetch_shorter_than_the_rest_of_the_step(tmp_path: Path) -> None:
    # a 400 us fetch (then a 10 us stack) before forward: the step is 2940 us, the rest of
    # it 2540. Two workers load a batch in 200 us while the 2540 run: no wait is left
    ev0 = gloo_replay_rank(0, 2620, 2820, dataloader_us=(400.0,))
    m = _model(tmp_path, ev0, gloo_replay_rank(0, 2620, 2820, dataloader_us=(400.0,)))
    assert replay(m).replayed_steps[0][1] == pytest.approx(2940.0)
    assert replay(m, [RemoveInputWait(workers=2)]).replayed_steps[0][1] == pytest.approx(2540.0)


def test_a_batch_handed_over_by_a_worker_costs_the_loop_its_measured_hand_over(tmp_path: Path) -> None:
    # as above, but with 2500 us of load: 2500 / 2 = 1250 of it in the workers, 2540 of the
    # rest of the step: ready in time, and the loop pays the 300 us hand-over: 2540 + 300
    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    assert replay(m).replayed_steps[0][1] == pytest.approx(5040.0)
    assert replay(m, [RemoveInputWait(workers=2)]).replayed_steps[0][1] == pytest.approx(2540.0)
    assert replay(m, [RemoveInputWait(workers=2, handover_us=300.0)]).replayed_steps[0][1] == pytest.approx(2840.0)
    # one worker: 2500 of load against 2540 of the rest, ready too; 6 workers the same
    assert replay(m, [RemoveInputWait(workers=1, handover_us=300.0)]).replayed_steps[0][1] == pytest.approx(2840.0)


def test_the_dataloader_plan_uses_the_measured_hand_over(tmp_path: Path) -> None:
    from pardiag.analyzers.factors import LoaderHandover

    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")])
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 4}}]})
    h = LoaderHandover(2500.0, (32, 256), "measured: a 32x256 float32 batch handed over")
    p = estimates.plan(f, a, estimates.Inputs(None, {}, loader=h))
    assert p is not None and p.edits == (RemoveInputWait(workers=4, handover_us=2500.0),)
    assert [(x.name, x.value, x.measured) for x in p.factors] == [("batch hand-over from a worker", 2500.0, True)]
    # what was timed; the renderers say "measured" (it read "measured: measured: ...")
    assert p.factors[0].source == "a 32x256 float32 batch handed over"
    assert "handed over in 2.50 ms" in p.words[0]
    # not measured: no hand-over in the edit, and the factor says it is an assumption
    q = estimates.plan(f, a, estimates.Inputs(None, {}))
    assert q is not None and q.edits == (RemoveInputWait(workers=4),)
    assert [(x.value, x.measured) for x in q.factors] == [(0.0, False)] and "assumed" in q.factors[0].source


def _records(rank: int, steps_us: list[float]) -> list[StepRecord]:
    assert WARMUP_STEPS == 1
    # step 0 is warm-up (not counted, step_records.WARMUP_STEPS); then one record per step
    # outside the profiler window
    return [StepRecord(step=i, t_end_ns=None, dur_us=d, pardiag_us=0.0) for i, d in enumerate([1.0] + steps_us)]


def _straggler_analysis() -> Any:
    from pardiag.analysis import Straggler

    # the straggler test named rank 1 over the whole run (a straggler that started after
    # the window has no replay form: the window cannot show it)
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")],
                 stragglers=[Straggler(rank=1, excess_us_per_step=300.0, cause="forward", evidence=[])])
    f = Finding(lever="straggler", severity="medium", title="rank 1 is slower", evidence=[], ranks=[1],
                est_saving_pct=11.0, action={})
    from dataclasses import replace
    return replace(a, findings=[f])


def test_the_saving_is_the_time_removed_taken_off_the_jobs_step(tmp_path: Path) -> None:
    # the straggler fixed, the window's step goes from 2830 to 2530 us: 300 us removed.
    # The job's median step over its counted steps is 3000 us: 10.0%
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    recs = {0: _records(0, [3000.0, 2900.0, 3100.0]), 1: _records(1, [3000.0, 2950.0, 3050.0])}
    out = estimates.apply(_straggler_analysis(), estimates.Inputs(m, recs))
    (f,) = out.findings
    assert f.est_saving_pct == pytest.approx(10.0)
    assert f.estimate is not None and f.estimate["method"] == "replay"
    assert f.estimate["share_saving_pct"] == 11.0 and f.estimate["replay_error_pct"] == 0.0
    # under 5% it would be low; at 10% it keeps its severity
    assert f.severity == "medium"
    assert out.critical_path is not None and out.critical_path["step"] == 1
    # without step records: relative to the replayed window's step, 300 / 2830
    out = estimates.apply(_straggler_analysis(), estimates.Inputs(m, {}))
    assert out.findings[0].est_saving_pct == pytest.approx(round(100 * 300 / 2830, 1))




def _cpu_records(window_cpu: float, job_cpu: float, runq: tuple[float, ...] = (0.0,)) -> dict[int, list[StepRecord]]:
    """The profiled window's steps 1.. (one per ``runq``) and three counted steps of 3000
    us, with the training threads' CPU time per step: rank 0 (the peer) ``job_cpu`` us in
    the counted steps and ``window_cpu`` in the window's, where it waited ``runq`` us for
    a core; rank 1 (the straggler) burns 2700 us everywhere and never waits for a core."""
    def recs(w: float, j: float, qs: tuple[float, ...]) -> list[StepRecord]:
        out = [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0, signals={"cpu": j, "run_queue": 0.0})]
        out += [StepRecord(step=i + 1, t_end_ns=None, dur_us=2830.0, pardiag_us=0.0, profiler="active",
                           signals={"cpu": w, "run_queue": q}) for i, q in enumerate(qs)]
        out += [StepRecord(step=len(qs) + i, t_end_ns=None, dur_us=3000.0, pardiag_us=0.0,
                           signals={"cpu": j, "run_queue": 0.0}) for i in (1, 2, 3)]
        return out

    return {0: recs(window_cpu, job_cpu, runq), 1: recs(2700.0, 2700.0, (0.0,) * len(runq))}


def test_a_stragglers_fix_leaves_its_peers_work_at_its_unprofiled_speed(tmp_path: Path) -> None:
    # the straggler fixed, the edited window steps 2530 us: the peers' work, which the
    # profiler lengthened, and the wait for the all-reduce, which it did not. Rank 0
    # burned 1600 us of CPU per counted step and 2000 in the window's: the profiler added
    # 400 us, and the job's step becomes 2530 - 400 = 2130 us of its 3000, a saving of
    # 29.0% (the time removed taken off the job's step would say 10.0%; the window's step
    # scaled by 0.8x, the rule before, 32.5%)
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    out = estimates.apply(_straggler_analysis(), estimates.Inputs(m, _cpu_records(2000.0, 1600.0)))
    (f,) = out.findings
    assert f.est_saving_pct == pytest.approx(29.0)
    assert f.estimate is not None and f.estimate["projected_window_step_us"] == pytest.approx(2530.0)
    fac = f.estimate["factors"][-1]
    assert fac["value"] == pytest.approx(0.4) and fac["unit"] == "ms" and fac["measured"]
    assert "rank 0 1.60 ms over the job's counted steps, 2.00 in the window" in fac["source"]
    assert any("less the CPU time per step the profiler added to the peers' work (0.40 ms, their 0.80x" in e
               for e in f.estimate["edits"])
    assert out.what_if is not None and out.what_if.all_saving_pct == pytest.approx(29.0)
    # a peer no slower in the window than outside it: the edited window's step as it is, 2530 of 3000
    (f,) = estimates.apply(_straggler_analysis(), estimates.Inputs(m, _cpu_records(1600.0, 1800.0))).findings
    assert f.est_saving_pct == pytest.approx(round(100 * (1 - 2530 / 3000), 1))
    # on GPUs the host's CPU time is not the step's work: the time removed, 300 of 3000 us
    a = _straggler_analysis()
    gpu = replace(a, ranks=[rank(0, device="cuda"), rank(1, device="cuda")])
    (f,) = estimates.apply(gpu, estimates.Inputs(m, _cpu_records(2000.0, 1600.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0)
    # a rank with bigger batches: its extra work is its own operators too, set to its
    # peers' by the edit, and what is left is their work as the profiler lengthened it
    imbalance = replace(a, findings=[replace(a.findings[0], lever="input_imbalance")])
    (f,) = estimates.apply(imbalance, estimates.Inputs(m, _cpu_records(2000.0, 1600.0))).findings
    assert f.est_saving_pct == pytest.approx(29.0)
    # other levers keep the time removed, even with the same records
    gc = replace(a, findings=[replace(a.findings[0], lever="garbage_collection")])
    (f,) = estimates.apply(gc, estimates.Inputs(m, _cpu_records(2000.0, 1600.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0)


def test_a_stragglers_fix_is_also_measured_over_the_jobs_own_steps(tmp_path: Path) -> None:
    # as above, the window's replay projects 2130 us of the job's 3000 (29.0%). Over the
    # job's counted steps (steps.jsonl) the others waited 1100 us per step more than rank 1,
    # whose extra work was 1200: 1100 of 3000 (36.7%). The estimate is the job's, 36.7%,
    # and so is the what-if of all findings at once (the straggler being the only one)
    from pardiag.analysis import Straggler

    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    a = _straggler_analysis()
    timed = Straggler(rank=1, excess_us_per_step=1200.0, cause="forward", evidence=[], held_us_per_step=1100.0,
                      held_from="steps.jsonl")
    out = estimates.apply(replace(a, stragglers=[timed]), estimates.Inputs(m, _cpu_records(2000.0, 1600.0)))
    (f,) = out.findings
    assert f.est_saving_pct == pytest.approx(36.7)
    assert out.what_if is not None and out.what_if.all_saving_pct == pytest.approx(f.est_saving_pct)
    assert f.estimate is not None and any("the estimate is the job's" in e and "29.0%" in e and "36.7%" in e
                                          for e in f.estimate["edits"])
    fac = f.estimate["factors"][-1]
    assert fac["value"] == pytest.approx(1.1) and fac["unit"] == "ms" and fac["measured"]
    # bounded by the straggler's extra work: 900 us of it, 30.0%
    less = replace(timed, excess_us_per_step=900.0)
    (f,) = estimates.apply(replace(a, stragglers=[less]), estimates.Inputs(m, _cpu_records(2000.0, 1600.0))).findings
    assert f.est_saving_pct == pytest.approx(30.0)
    # a wait timed in the profiled window only is no measure of the job: the replay's 29.0%
    window = replace(timed, held_from="profiled window")
    (f,) = estimates.apply(replace(a, stragglers=[window]), estimates.Inputs(m, _cpu_records(2000.0, 1600.0))).findings
    assert f.est_saving_pct == pytest.approx(29.0)


def _contended_records(window_runq: float, job_runq: float, process_cpu: float) -> dict[int, list[StepRecord]]:
    """One profiled step and three counted steps of 3000 us per rank; rank 1 (the contended
    one) waited ``window_runq`` us for its CPU in the profiled step and ``job_runq`` in each
    counted one; each rank's process burned ``process_cpu`` us of CPU per counted step."""
    def recs(r: int) -> list[StepRecord]:
        q = (window_runq, job_runq) if r == 1 else (0.0, 0.0)
        out = [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0),
               StepRecord(step=1, t_end_ns=None, dur_us=2830.0, pardiag_us=0.0, profiler="active",
                          signals={"run_queue": q[0], "process_cpu": process_cpu})]
        return out + [StepRecord(step=i, t_end_ns=None, dur_us=3000.0, pardiag_us=0.0,
                                 signals={"run_queue": q[1], "process_cpu": process_cpu}) for i in (2, 3, 4)]

    return {0: recs(0), 1: recs(1)}


def test_cpu_contentions_fix_is_the_jobs_step_less_the_wait_for_the_contended_rank(tmp_path: Path) -> None:
    # rank 1 waits for its CPU; the window's replay takes 300 us off the job's 3000 (10.0%).
    # Over the job's counted steps the others waited 1100 us per step more than rank 1 (its
    # extra time 1200): 1100 of 3000, 36.7%, the estimate, as for a straggler of its own work
    from pardiag.analysis import Straggler

    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    base = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    timed = Straggler(rank=1, excess_us_per_step=1200.0, cause="CPU contention (forward)", evidence=[],
                      held_us_per_step=1100.0, held_from="steps.jsonl")
    busy = Finding(lever="host_contention", severity="high", title="rank 1 waits for its CPU", evidence=[], ranks=[1],
                   est_saving_pct=36.0, action={})
    a = replace(base, stragglers=[timed], findings=[busy])
    # rank 1 waited 900 us for its CPU in the profiled step, 600 in the job's; 1000 us of CPU
    # per rank and step on 2 cores: a floor of 1000 us, far below
    (f,) = estimates.apply(a, estimates.Inputs(m, _contended_records(900.0, 600.0, 1000.0))).findings
    assert f.est_saving_pct == pytest.approx(36.7)
    assert f.estimate is not None and f.estimate["bound"] is None
    (said,) = [e for e in f.estimate["edits"] if "the estimate is the job's" in e]
    assert "10.0% over the window's 1 profiled steps" in said and "(1.1 ms) is 36.7% shorter" in said
    assert ("the profiled steps were contended more than the job's: rank 1 waited for a CPU 0.9 ms per profiled "
            "step, 0.6 over the job's steps (steps.jsonl runq_us)") in said
    # no more contended in the window than over the job: the same figure, said plainly
    (f,) = estimates.apply(a, estimates.Inputs(m, _contended_records(600.0, 600.0, 1000.0))).findings
    assert f.est_saving_pct == pytest.approx(36.7)
    assert f.estimate is not None and any("timed over every counted step" in e for e in f.estimate["edits"])
    # 2200 us of CPU per rank and step on 2 cores: no step under 2200 us, 800 of 3000 (26.7%)
    (f,) = estimates.apply(a, estimates.Inputs(m, _contended_records(900.0, 600.0, 2200.0))).findings
    assert f.est_saving_pct == pytest.approx(26.7)
    assert f.estimate is not None and f.estimate["bound"] is not None
    assert "raised from 1.9 to 2.2 ms per step" in f.estimate["bound"]
    # on GPUs the window's replay stands: 300 of 3000 us
    gpu = replace(a, ranks=[rank(0, device="cuda"), rank(1, device="cuda")])
    (f,) = estimates.apply(gpu, estimates.Inputs(m, _contended_records(900.0, 600.0, 1000.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0)
    # a wait timed in the profiled window only: the replay's 10.0% too
    window = replace(a, stragglers=[replace(timed, held_from="profiled window")])
    (f,) = estimates.apply(window, estimates.Inputs(m, _contended_records(900.0, 600.0, 1000.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0)


def test_the_peers_preemption_in_the_window_is_not_part_of_the_step_a_stragglers_fix_leaves(tmp_path: Path) -> None:
    # two profiled steps; rank 1 sleeps 300 us in each. In step 2 rank 0's forward took
    # 1400 us, 400 of them on the run queue: it arrived at 2830 + 2610 = 5440, after rank
    # 1 (5340), both done 5640, steps 2830 and 2930. With the straggler's sleep gone, step
    # 2 would still wait for rank 0's 1400 us forward: 2530 and 2930 us, median 2730,
    # less the 400 us of CPU the profiler added to rank 0's step: 2330 of 3000 (22.3%).
    # Without the 400 us that rank 0 waited for a core, both steps replay at 2530: 2130
    # of 3000, 29.0%
    rank0 = two_steps(gloo_replay_rank(0, 2210, 2710), slow_forward(gloo_replay_rank(0, 2210, 2410), 400.0), 2830.0)
    rank1 = two_steps(gloo_replay_rank(300, 2510, 2710), gloo_replay_rank(300, 2510, 2810, wake_us=2830), 2830.0)
    m = _model(tmp_path, rank0, rank1)
    assert replay(m).replayed_steps[0] == pytest.approx({1: 2830.0, 2: 2930.0})
    (f,) = estimates.apply(_straggler_analysis(), estimates.Inputs(m, _cpu_records(2000.0, 1600.0, (0.0, 400.0)))).findings
    assert f.estimate is not None and f.estimate["projected_window_step_us"] == pytest.approx(2530.0)
    assert f.est_saving_pct == pytest.approx(29.0)
    (f,) = estimates.apply(_straggler_analysis(), estimates.Inputs(m, _cpu_records(2000.0, 1600.0, (0.0, 0.0)))).findings
    assert f.estimate is not None and f.estimate["projected_window_step_us"] == pytest.approx(2730.0)
    assert f.est_saving_pct == pytest.approx(22.3)

def _gc_records(window_gc: float, job_gc: float) -> dict[int, list[StepRecord]]:
    """Rank 1 pauses for garbage collection (rank 0 never does): ``window_gc`` us in the
    profiled window's step, ``job_gc`` in each of the 3 counted steps, all 3000 us long."""
    def recs(gc_w: float, gc_j: float) -> list[StepRecord]:
        out = [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0, signals={"gc": 0.0})]
        out += [StepRecord(step=i, t_end_ns=None, dur_us=3000.0, pardiag_us=0.0, signals={"gc": gc_j})
                for i in (1, 2, 3)]
        out.append(StepRecord(step=4, t_end_ns=None, dur_us=2830.0, pardiag_us=0.0, profiler="active",
                              signals={"gc": gc_w}))
        return out

    return {0: recs(0.0, 0.0), 1: recs(window_gc, job_gc)}


def test_a_cause_timed_on_every_step_scales_what_the_window_removes(tmp_path: Path) -> None:
    # rank 1's 300 us host gap in the window is its garbage collection (gc_us 300 there);
    # over the job's counted steps it paused 450 us per step: the 300 us the replay
    # removes from the window are 450 of the job's 3000 us step, 15.0% (10.0% unscaled)
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    a = _straggler_analysis()
    gc = replace(a, findings=[replace(a.findings[0], lever="garbage_collection")])
    out = estimates.apply(gc, estimates.Inputs(m, _gc_records(300.0, 450.0)))
    (f,) = out.findings
    assert f.est_saving_pct == pytest.approx(15.0)
    assert f.estimate is not None and f.estimate["projected_window_step_us"] == pytest.approx(2530.0)
    fac = f.estimate["factors"][-1]
    assert fac["value"] == pytest.approx(1.5) and fac["measured"]
    assert "median 0.5 ms over 3 counted steps, 0.3 ms over the window's 1" in fac["source"]
    assert out.what_if is not None and out.what_if.all_saving_pct == pytest.approx(15.0)
    # at most 2x: 1500 us per counted step (5x the window's) scales the 300 us to 600, 20.0%
    (f,) = estimates.apply(gc, estimates.Inputs(m, _gc_records(300.0, 1500.0))).findings
    assert f.est_saving_pct == pytest.approx(20.0)
    # a straggler whose cause no signal times is not scaled (the records are the same)
    (f,) = estimates.apply(a, estimates.Inputs(m, _gc_records(300.0, 450.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0) and f.estimate["factors"] == []
    # no pause measured in the window: nothing to scale from
    (f,) = estimates.apply(gc, estimates.Inputs(m, _gc_records(0.0, 450.0))).findings
    assert f.est_saving_pct == pytest.approx(10.0)


def test_without_a_model_the_estimate_stays_share_based_and_says_why() -> None:
    out = estimates.apply(_straggler_analysis(), estimates.Inputs(None, {}, why="no profiler trace"))
    (f,) = out.findings
    assert f.est_saving_pct == 11.0
    assert f.estimate == {"method": "share", "saving_pct": 11.0, "share_saving_pct": 11.0, "replay_error_pct": None,
                          "refused": "no profiler trace", "edits": [], "factors": []}


def test_straggler_plan_and_mixed_precision_factor_labels() -> None:
    a = _straggler_analysis()
    p = estimates.plan(a.findings[0], a, estimates.Inputs(None, {}))
    assert p is not None and p.edits == (Straggler(1),)
    # CPU contention slows every phase of the rank: all of them are edited
    busy = replace(a.findings[0], lever="host_contention")
    p = estimates.plan(busy, a, estimates.Inputs(None, {}))
    assert p is not None and p.edits == (Straggler(1, every_phase=True),) and "every phase" in p.words[0]
    mp = Finding(lever="mixed_precision", severity="high", title="t", evidence=[], ranks=[0, 1], est_saving_pct=30.0,
                 action={})
    assumed = estimates.plan(mp, a, estimates.Inputs(None, {}))
    assert assumed is not None and [f.measured for f in assumed.factors] == [False]
    measured = estimates.plan(mp, a, estimates.Inputs(None, {}, gemm=estimates.GemmSpeedup(5.5, "timed")))
    assert measured is not None and measured.edits == (ScaleGemm(5.5),)
    assert measured.factors[0].measured and measured.factors[0].value == 5.5
    # with followers (gemm.json's): 30 of the 50 ms of relu/threshold_backward at the byte
    # ratio, 2x: 15 ms less of 50, a speed-up of 50 / 35 of all of it, labelled assumed
    fol = factors.Followers(30e3, 50e3, 2.0, "assumed: relu ... run in bf16 on 50% of the bytes")
    both = estimates.plan(mp, a, estimates.Inputs(None, {}, gemm=estimates.GemmSpeedup(5.5, "timed", "bf16", fol)))
    assert both is not None and both.edits == (ScaleGemm(5.5, follower_speedup=pytest.approx(50 / 35)),)
    assert [(f.value, f.measured) for f in both.factors] == [(5.5, True), (2.0, False)]
    assert both.factors[1].source.startswith("assumed: ") and "30.0 ms of the window" in both.words[1]


def test_a_window_unlike_the_job_takes_the_saving_as_a_share_of_the_window(tmp_path: Path) -> None:
    # the job's steps outside the window are 1200 us, the window's 2830 us (2.4x): the 300 us
    # removed would be 25% of the job's step; as a share of the window's it is 300 / 2830
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    recs = {0: _records(0, [1200.0] * 3), 1: _records(1, [1200.0] * 3)}
    (f,) = estimates.apply(_straggler_analysis(), estimates.Inputs(m, recs)).findings
    assert f.est_saving_pct == pytest.approx(round(100 * 300 / 2830, 1))
    assert f.estimate is not None and "not like the rest of the job" in f.estimate["edits"][-1]
    assert f.estimate["job_step_us"] == pytest.approx(2830.0)


def _bucket_finding(cap_mb: float) -> Finding:
    return Finding(lever="ddp_bucket_size", severity="high", title="t", evidence=[], ranks=[0, 1], est_saving_pct=10.0,
                   action={"settings": [{"call": "torch.nn.parallel.DistributedDataParallel",
                                         "kwargs": {"bucket_cap_mb": cap_mb}}]})


def test_bucket_plan_merges_under_a_larger_cap_only() -> None:
    from pardiag.analyzers.factors import CommCurve

    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"ddp": [{"bucket_cap_mb": 0.05}]})
    curve = CommCurve(250.0, 0.0005, (), "sweep", "sweep after the job", 0.99, 0.05)
    inputs = estimates.Inputs(None, {}, comm=curve)
    p = estimates.plan(_bucket_finding(1.0), a, inputs)
    assert p is not None and p.edits == (RegroupBuckets(2**20, 250.0, 0.0005),)
    assert [(f.name, f.value, f.measured) for f in p.factors] == [
        ("all-reduce latency", 250.0, True), ("all-reduce time per MB", 0.0005 * 2**20, True)]
    # a smaller cap splits the bucket: when its parts are ready is not in the trace
    assert estimates.plan(_bucket_finding(0.01), a, inputs) is None
    # without a measured curve there is nothing to time the merged calls with
    assert estimates.plan(_bucket_finding(1.0), a, estimates.Inputs(None, {})) is None


def test_a_finding_whose_edits_cannot_be_replayed_alone_stays_share_based(tmp_path: Path, monkeypatch: Any) -> None:
    # one finding's edits failing (a cycle) no longer sends every finding back to shares:
    # the straggler keeps its replayed 10.0% (as above), the other its share estimate with
    # the reason, and the replayed what-if total holds the edits that replay (the straggler's)
    from dataclasses import replace

    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))
    recs = {0: _records(0, [3000.0, 2900.0, 3100.0]), 1: _records(1, [3000.0, 2950.0, 3050.0])}
    a = _straggler_analysis()
    other = Finding(lever="ddp_bucket_size", severity="medium", title="buckets", evidence=[], ranks=[0, 1],
                    est_saving_pct=7.0, action={})
    a = replace(a, findings=[*a.findings, other])
    real_plan, real_replay = estimates.plan, estimates.rp.replay
    monkeypatch.setattr(estimates, "plan", lambda f, *args: (
        estimates.Plan((RegroupBuckets(4000, 60.0, 0.01),), ("packed",), ()) if f.lever == "ddp_bucket_size"
        else real_plan(f, *args)))

    def stuck(model: Any, edits: Any = ()) -> Any:
        if any(isinstance(e, RegroupBuckets) for e in edits):
            raise ValueError("the replay is stuck: a dependency cycle in the model")
        return real_replay(model, edits)

    monkeypatch.setattr(estimates.rp, "replay", stuck)
    out = estimates.apply(a, estimates.Inputs(m, recs))
    by = {f.lever: f for f in out.findings}
    assert by["straggler"].estimate["method"] == "replay" and by["straggler"].est_saving_pct == pytest.approx(10.0)
    assert by["ddp_bucket_size"].estimate["method"] == "share" and by["ddp_bucket_size"].est_saving_pct == 7.0
    assert "could not be replayed: the replay is stuck" in by["ddp_bucket_size"].estimate["refused"]
    assert out.what_if is not None and out.what_if.method == "replay"
    assert out.what_if.all_saving_pct == pytest.approx(10.0)


def _shared(m: Any, cores: int) -> Any:
    from dataclasses import replace

    from pardiag.analyzers.replay import CpuSharing

    return replace(m, sharing=CpuSharing({0: "node", 1: "node"}, {0: 1, 1: 1}, {"node": cores}))


def test_a_straggler_that_slept_shares_the_cores_once_it_computes_with_the_others(tmp_path: Path) -> None:
    # rank 1 sleeps 2200 us, then computes: 2200 + 2200 of work, its all-reduce call to
    # 4410, both workers' transfer 4410-4910 (rank 0's worker waited from 2210), the loops
    # wake at 4930, optimizer to 5030. Rank 0 computed alone while rank 1 slept, so each
    # rank had a core to itself.
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 4910), gloo_replay_rank(2200, 4410, 4910))
    assert replay(m).replayed_steps[0][1] == pytest.approx(5030.0)
    # without the sleep both compute at once. On 2 cores nothing changes for them: the
    # call at 2200-2210, transfer 500 (its two workers had the 2 cores to themselves
    # when measured, and do again), 20 + 100: 2830
    assert replay(_shared(m, 2), [Straggler(1)]).replayed_steps[0][1] == pytest.approx(2830.0)
    assert replay(m, [Straggler(1)]).replayed_steps[0][1] == pytest.approx(2830.0)
    # on 1 core the two ranks' 2200 us of work each take 4400 side by side, then the
    # measured 500 us transfer (two workers on 1 core then as now), wake and optimizer
    # (both at once then as now): 5030 again, no saving on one core
    one = _shared(m, 1)
    assert replay(one).replayed_steps[0][1] == pytest.approx(5030.0)  # unedited: as measured
    assert replay(one, [Straggler(1)]).replayed_steps[0][1] == pytest.approx(5030.0)


def test_mixed_precision_is_not_advised_where_the_lower_precision_measured_slower() -> None:
    # a CPU without bf16 units: bf16 matrix multiplies at the job's shapes ran at 0.11x
    # of fp32 after the job; the finding goes, a notice says why, the other findings stay
    a = _straggler_analysis()
    mp = Finding(lever="mixed_precision", severity="high", title="t", evidence=[], ranks=[0, 1], est_saving_pct=30.0,
                 action={})
    a = replace(a, findings=list(a.findings) + [mp])
    slow = estimates.Inputs(None, {}, gemm=estimates.GemmSpeedup(0.11, "timed: aten::linear 1024x512"))
    out = estimates.apply(a, slow)
    assert [f.lever for f in out.findings] == [f.lever for f in a.findings if f.lever != "mixed_precision"]
    assert any("mixed precision not advised" in n.message and "0.11x" in n.message for n in out.notices)
    # measured faster (1.8x): it stays
    fast = estimates.apply(a, estimates.Inputs(None, {}, gemm=estimates.GemmSpeedup(1.8, "timed")))
    assert "mixed_precision" in [f.lever for f in fast.findings]


def test_micro_batches_that_do_not_sync_skip_the_loops_work_after_the_optimizer(tmp_path: Path) -> None:
    # as the accumulation test, with 500 us of host gap after the optimizer (the loop's own
    # per-step work: a scheduler, logging, a sleep) before the step ends: the measured step
    # is 3330 on both ranks. A loop that accumulates does it once per optimizer step, so the
    # k - 1 micro-batches lose it with the optimizer: rank 0 2230, rank 1 2530 as before.
    # Per micro-batch (k = 4): rank 0 (3330 + 3 * 2230) / 4 = 2505, rank 1
    # (3330 + 3 * 2530) / 4 = 2730 (with the gap kept in every micro-batch: 2880 and 3105)
    def rank_ev(sleep: float, arrive: float) -> list[dict[str, Any]]:
        ev = gloo_replay_rank(sleep, arrive, 2710)
        step = ev[0]
        assert step["name"] == "ProfilerStep#1"
        return [dict(step, dur=step["dur"] + 500.0), *ev[1:]]

    m = _model(tmp_path, rank_ev(0, 2210), rank_ev(300, 2510))
    assert replay(m).replayed_steps[0][1] == pytest.approx(3330.0)
    r = replay(m, [Accumulate(4)])
    assert r.replayed_steps[0][1] == pytest.approx(2505.0)
    assert r.replayed_steps[1][1] == pytest.approx(2730.0)


def _bucket_records(step_us: float, cpu_us: float) -> dict[int, list[StepRecord]]:
    """Three counted steps of ``step_us`` per rank, each rank's process burning ``cpu_us``
    of CPU in each (steps.jsonl ``pcpu_us``)."""
    return {r: [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0)] + [
        StepRecord(step=i, t_end_ns=None, dur_us=step_us, pardiag_us=0.0, signals={"process_cpu": cpu_us})
        for i in (1, 2, 3)] for r in (0, 1)}


@pytest.mark.parametrize("step_us, cpu_us, expected, words", [
    # the job's step is the window's (2730 us): the pack removes 2730 - 2468.86 = 261.14 us,
    # 9.57%, where the cores are idle enough: 2 x 1000 or 2 x 2150 us of CPU per step on 2
    # cores (36.6% and 78.8% busy: under BUSY_CORES, and the floor of 1000 or 2150 us below)
    (2730.0, 1000.0, 100 * (2730 - (2206 + 100 * 400 / 280 + 120)) / 2730, None),
    (2730.0, 2150.0, 100 * (2730 - (2206 + 100 * 400 / 280 + 120)) / 2730, None),
    # 2 x 2600 us: 95.2% busy; regrouped buckets take none of that CPU away and leave the
    # cores as busy: the step stays 2 x 2600 / (2 x 0.952) = 2730 us, nothing saved
    (2730.0, 2600.0, 0.0, "leave them as busy"),
    # a job step of 1500 us (the window 1.8x it): a share of the window's step, 9.57%, but
    # its cores are 93.3% busy (2 x 1400 us per 1500): nothing saved either
    (1500.0, 1400.0, 0.0, "leave them as busy"),
])
def test_regrouped_buckets_save_no_more_than_the_cores_leave_idle(tmp_path: Path, step_us: float, cpu_us: float,
                                                                  expected: float, words: str | None) -> None:
    """Regrouping takes no CPU work with it (gloo reduces the same bytes): on a host whose
    cores its ranks keep BUSY_CORES busy, they stay as busy and the step as long (the
    tiny-bucket job: 87.5% busy with its buckets regrouped, against 87.8-90.8%, its step
    no shorter, where the floor at full cores estimated 15.2 and 11.7%)."""
    from pardiag.analyzers.factors import CommCurve

    m = _model(tmp_path, _buckets(), _buckets())
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")],
                 framework={"ddp": [{"bucket_cap_mb": 0.05}], "threads": {"cpu_count": 2}})  # no core sharing in the replay
    a = replace(a, findings=[_bucket_finding(1.0)])
    curve = CommCurve(60.0, 0.01, (), "sweep", "sweep after the job", 0.99, 0.05)
    (f,) = estimates.apply(a, estimates.Inputs(m, _bucket_records(step_us, cpu_us), comm=curve)).findings
    assert f.estimate is not None and f.estimate["method"] == "replay"
    assert f.est_saving_pct == pytest.approx(round(expected, 1))
    capped = [e for e in f.estimate["edits"] if e.startswith("raised from")]
    assert bool(capped) is (words is not None)
    assert all(words in e for e in capped)
    assert f.estimate["bound"] == (capped[0] if capped else None)  # what the reports show beside the figure


def test_a_contended_ranks_collectives_and_wake_ups_at_the_curve_and_its_peers(tmp_path: Path) -> None:
    # rank 1 shares its CPU with another process: its worker picks the all-reduce (4000
    # bytes, 1000 floats) up at 2260, 50 us after the call, where rank 0's does at once;
    # both finish at 2710 (450 us after the last arrival), rank 0 wakes 20 us later, rank 1
    # 300 us later. Steps 2830 and 3110
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(0, 2260, 2710, wake_us=3010))
    assert {r: s[1] for r, s in replay(m).replayed_steps.items()} == pytest.approx({0: 2830.0, 1: 3110.0})
    # the curve gives 60 + 0.01 * 4000 = 100 us; rank 1's pick-up at rank 0's (0), its
    # wake-up at rank 0's 20 us: both arrive at 2210, done 2310, awake 2330, steps 2430
    r = replay(m, [UncontendedCollectives((1,), 60.0, 0.01)])
    assert {k: s[1] for k, s in r.replayed_steps.items()} == pytest.approx({0: 2430.0, 1: 2430.0})
    # only ever shorter: a curve slower than the measured transfer leaves it at 450 us
    # (arrivals 2210, done 2660, wakes 2680, steps 2780)
    r = replay(m, [UncontendedCollectives((1,), 1000.0, 0.01)])
    assert {k: s[1] for k, s in r.replayed_steps.items()} == pytest.approx({0: 2780.0, 1: 2780.0})


def test_the_host_contention_plan_retimes_the_collectives_on_cpus_with_a_curve() -> None:
    from pardiag.analyzers.factors import CommCurve

    a = _straggler_analysis()
    busy = replace(a.findings[0], lever="host_contention")
    curve = CommCurve(250.0, 0.0005, (), "sweep", "sweep after the job", 0.99, 0.05)
    p = estimates.plan(busy, a, estimates.Inputs(None, {}, comm=curve))
    assert p is not None and p.edits == (Straggler(1, every_phase=True), UncontendedCollectives((1,), 250.0, 0.0005))
    assert [(f.name, f.value, f.measured) for f in p.factors] == [
        ("all-reduce latency", 250.0, True), ("all-reduce time per MB", 0.0005 * 2**20, True)]
    # a straggler slow of its own work (not contention) keeps its collectives as measured
    slow = estimates.plan(a.findings[0], a, estimates.Inputs(None, {}, comm=curve))
    assert slow is not None and slow.edits == (Straggler(1),)
    # on GPUs a collective's transfer is the network's, not the contended CPU's
    gpu = replace(a, ranks=[rank(0, device="cuda"), rank(1, device="cuda")])
    p = estimates.plan(busy, gpu, estimates.Inputs(None, {}, comm=curve))
    assert p is not None and p.edits == (Straggler(1, every_phase=True),)


@pytest.mark.parametrize("cpu_us, expected", [
    # 2500 us of loading and 2540 of the rest: with 2 workers and a 300 us hand-over the
    # window's step goes from 5040 to 2840 us, 2200 removed from the job's 5040 (43.65%);
    # the ranks' processes burn 4000 us of CPU per step each on 2 cores: no faster than
    # 4000 us, 1 - 4000 / 5040 = 20.63%
    (4000.0, 100 * (1 - 4000 / 5040)),
    (1000.0, 100 * 2200 / 5040),  # the floor far below
])
def test_loader_workers_save_no_more_than_the_cores_leave_idle(tmp_path: Path, cpu_us: float, expected: float) -> None:
    """The loading moves to worker processes on the same cores, not away: the CPU the ranks
    burned per step (their loading included) fills the cores as before. On 2 busy cores,
    2 workers per rank left the contended job at 36.0 ms per step, against 35.8 and 39.7
    with the problem, where the estimate said 16.5 and 15.0%."""
    from pardiag.analyzers.factors import LoaderHandover

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    h = LoaderHandover(300.0, (32, 256), "measured: a 32x256 float32 batch handed over")
    out = estimates.apply(replace(a, findings=[f]), estimates.Inputs(m, _bucket_records(5040.0, cpu_us), loader=h))
    (g,) = out.findings
    assert g.estimate is not None and g.estimate["method"] == "replay"
    assert g.est_saving_pct == pytest.approx(round(expected, 1))
    capped = [e for e in g.estimate["edits"] if "no faster than that" in e]
    assert bool(capped) is (cpu_us == 4000.0)
    assert all("none of it removed by the change" in e for e in capped)


def _loading_records(step_us: float, data_us: float, loading_cpu_us: float,
                     cpu_us: float = 1000.0) -> dict[int, list[StepRecord]]:
    """Three counted steps of ``step_us`` per rank, ``data_us`` of it in the DataLoader's
    __next__, where the loop burned ``loading_cpu_us`` of CPU (one batch per step); the
    rank's process ``cpu_us`` per step."""
    sig = {"process_cpu": cpu_us, "dataloader": data_us, "dataloader_cpu": loading_cpu_us, "dataloader_calls": 1.0}
    return {r: [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0)] + [
        StepRecord(step=i, t_end_ns=None, dur_us=step_us, pardiag_us=0.0, signals=sig) for i in (1, 2, 3)]
        for r in (0, 1)}


@pytest.mark.parametrize("step_us, data_us, loading_cpu_us, cpu_us, expected_step, said", [
    # 2500 us of loading, 2540 of the rest: 2 workers and a 300 us hand-over take the
    # window's step from 5040 to 2840 (2200 removed from the job's 5040). The workers burn
    # 600 us per batch loading (the loop's, steps.jsonl) and 400 more handing it over
    # (loader.json): 2 x 1000 us per step on 2 cores, 1000 us each: 3840 us
    (5040.0, 2500.0, 600.0, 1000.0, 3840.0, "from 2.8 to 3.8 ms per step: the DataLoader workers' 2.0 ms"),
    # the loading burns 1000 us per batch: 2 x 1400 on 2 cores, 2840 + 1400
    (5040.0, 2500.0, 1000.0, 1000.0, 4240.0, "run on host h's 2 cores, which the ranks' work then waits for: 1.4 ms"),
    # the job's own steps (4500 us, 2400 of them waiting for input) leave 2100 + 300 of
    # hand-over: more than the replay's 4500 - 2200 = 2300, which took away more loading
    # than the job had; then 1000 us for the workers
    (4500.0, 2400.0, 600.0, 1000.0, 3400.0, "the job's step less its wait for input, with the hand-over, is 2.4 ms"),
    # the ranks' processes burn 4000 us per step, and the workers 400 more per batch: on 2
    # cores no faster than (2 x 4400) / 2
    (5040.0, 2500.0, 600.0, 4000.0, 4400.0, "no faster than that"),
])
def test_loader_workers_on_the_ranks_cores_lengthen_the_step_by_their_cpu_time(
        tmp_path: Path, step_us: float, data_us: float, loading_cpu_us: float, cpu_us: float, expected_step: float,
        said: str) -> None:
    """On a CPU host the workers run on the cores the ranks compute on: the slow_input
    scenario's fixed steps ran 6.4-8.1 ms where the replay, taking the workers as having
    cores of their own, had 4.8-5.9."""
    from pardiag.analyzers.factors import LoaderHandover
    from pardiag.analyzers.levers import WORKERS_SHARE_SAID

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    caveat = f"14 workers per rank on 1 CPU per rank: {WORKERS_SHARE_SAID}, where the estimate ..."
    f = Finding(lever="dataloader", severity="high", title="input", evidence=["wait 50%", caveat], ranks=[0, 1],
                est_saving_pct=40.0, action={"settings": [{"kwargs": {"num_workers": 2}}]})
    h = LoaderHandover(300.0, (32, 256), "measured: a 32x256 float32 batch handed over", 400.0,
                       "measured: 2 DataLoader workers collating 32x256 batches")
    recs = _loading_records(step_us, data_us, loading_cpu_us, cpu_us)
    out = estimates.apply(replace(a, findings=[f]), estimates.Inputs(m, recs, loader=h))
    (g,) = out.findings
    assert g.est_saving_pct == pytest.approx(round(100 * (1 - expected_step / step_us), 1))
    assert g.estimate is not None and any(said in e for e in g.estimate["edits"]), g.estimate["edits"]
    assert g.evidence == ["wait 50%"]  # the caveat is counted now
    names = [x["name"] for x in g.estimate["factors"]]
    assert names[:3] == ["batch hand-over from a worker", "loading CPU per step", "CPU a worker adds per batch"]
    assert g.estimate["factors"][1]["value"] == loading_cpu_us and g.estimate["factors"][2]["value"] == 400.0
    # the same without the loop's loading CPU in steps.jsonl (recorded since 0.5.5): the
    # workers taken as having cores of their own, and the caveat stays
    old = {r: [replace(x, signals={k: v for k, v in x.signals.items() if k != "dataloader_cpu"}) for x in rs]
           for r, rs in recs.items()}
    out = estimates.apply(replace(a, findings=[f]), estimates.Inputs(m, old, loader=h))
    (g,) = out.findings
    assert caveat in g.evidence and not any("DataLoader workers' " in e for e in g.estimate["edits"])


def test_a_rank_that_does_not_wait_for_input_does_not_hold_the_step_after_the_fix(tmp_path: Path) -> None:
    """Only rank 1 loads slowly (2500 us of its 5040 us steps, 600 us of CPU); rank 0
    waits 100 us for its input (50 us of CPU) and the rest of its step for rank 1, in the
    all-reduce. Rank 1 has 2540 + 300 us left after the fix; rank 0's 4940 + 300 hold its
    wait for rank 1, which goes. The workers burn (50 + 400) + (600 + 400) us per step on 2
    cores: 2840 + 725 = 3565 us, 29.27% (rank 0's bound would have left nothing)."""
    from pardiag.analyzers.factors import LoaderHandover

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=25.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    h = LoaderHandover(300.0, (32, 256), "measured: a batch", 400.0, "measured: 2 workers")

    def recs(data_us: float, cpu_us: float) -> list[StepRecord]:
        sig = {"process_cpu": 1000.0, "dataloader": data_us, "dataloader_cpu": cpu_us, "dataloader_calls": 1.0}
        return [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0)] + [
            StepRecord(step=i, t_end_ns=None, dur_us=5040.0, pardiag_us=0.0, signals=sig) for i in (1, 2, 3)]

    out = estimates.apply(replace(a, findings=[f]),
                          estimates.Inputs(m, {0: recs(100.0, 50.0), 1: recs(2500.0, 600.0)}, loader=h))
    (g,) = out.findings
    assert g.est_saving_pct == pytest.approx(round(100 * (1 - 3565 / 5040), 1))


def test_workers_whose_cpu_time_would_not_fit_on_the_cores_are_not_advised(tmp_path: Path) -> None:
    """The loop burns 2600 us of CPU loading each batch: with the 400 us workers add, 2 x
    3000 us per step on 2 cores, 2840 + 3000 = 5840 us against the job's 5040: no faster.
    On the cpu_contention scenario (its loop 8% of the step waiting for input, the
    loading CPU work) 2 workers per rank made the steps 44.4 and 48.2 ms against 36.0
    and 40.0 without; the estimate had been positive."""
    from pardiag.analysis_blocks import WhatIf, WhatIfRow
    from pardiag.analyzers.factors import LoaderHandover

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    what = WhatIf(step_us=5040.0, findings=[WhatIfRow(lever="dataloader", title="input", step_us=3024.0,
                                                      saving_pct=40.0)], all_step_us=3024.0, all_saving_pct=40.0,
                  assumption="a share")
    h = LoaderHandover(300.0, (32, 256), "measured: a batch", 400.0, "measured: 2 workers")
    out = estimates.apply(replace(a, findings=[f], what_if=what),
                          estimates.Inputs(m, _loading_records(5040.0, 2500.0, 2600.0), loader=h))
    assert out.findings == []
    (note,) = [n.message for n in out.notices if "DataLoader workers not advised" in n.message]
    assert note.startswith("more DataLoader workers not advised: with them a step would take 5.8 ms against 5.0 now")
    assert out.what_if is not None and out.what_if.findings == []
    # 1600 us of loading: 4840 us, 3.97% faster: under SAVING_LOW too
    out = estimates.apply(replace(a, findings=[f], what_if=what),
                          estimates.Inputs(m, _loading_records(5040.0, 2500.0, 1600.0), loader=h))
    assert out.findings == [] and any("a step would take 4.8 ms against 5.0" in n.message for n in out.notices)


def _pinned_records(step_us: float, loading_cpu_us: float, runq1_us: float) -> dict[int, list[StepRecord]]:
    """Three counted steps of ``step_us`` per rank, 2500 us of each in the DataLoader's
    __next__ burning ``loading_cpu_us``; each training thread 1500 us on its CPU per step,
    rank 1's also ``runq1_us`` waiting for it."""
    def sig(r: int) -> dict[str, float]:
        return {"process_cpu": 1000.0, "dataloader": 2500.0, "dataloader_cpu": loading_cpu_us,
                "dataloader_calls": 1.0, "cpu": 1500.0, "run_queue": runq1_us if r == 1 else 0.0}
    return {r: [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0)] + [
        StepRecord(step=i, t_end_ns=None, dur_us=step_us, pardiag_us=0.0, signals=sig(r)) for i in (1, 2, 3)]
        for r in (0, 1)}


@pytest.mark.parametrize("affinity, loading_cpu_us, expected_step, said", [
    # each rank may run on 1 of 2 cores, and so may its workers; rank 1's thread waits as
    # long for its core as it runs on it (another process there): its workers' 300 + 400
    # us per step take it 2 x 700 / 1 core: 2840 + 1400 = 4240 us, 15.87%
    (1, 300.0, 4240.0, "run on rank 1's 1 core (each rank may run on 1 of its host's cores, and its DataLoader "
                       "workers inherit that), where its thread gets a core 50% of the time it is ready to run"),
    # the same ranks free to run on both cores: the host's 2 x 700 us on 2 cores, 3540 us
    (2, 300.0, 3540.0, "run on host h's 2 cores, which the ranks' work then waits for: 0.7 ms per step"),
    # 600 us of loading pinned: 2840 + 2 x 1000 = 4840 us, 3.97%: not advised
    (1, 600.0, 4840.0, None),
])
def test_pinned_ranks_workers_load_their_own_cores(tmp_path: Path, affinity: int, loading_cpu_us: float,
                                                  expected_step: float, said: str | None) -> None:
    """The cpu_contention scenario pins each rank to one of 2 cores and spins another
    process on rank 1's: 2 workers per rank, advised at 7-20% faster over the host's cores,
    made its steps -23 to +3% faster in 6 pairs (estimates.WorkerLoad)."""
    from pardiag.analyzers.factors import LoaderHandover

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")],
                 framework={"threads": {"cpu_count": 2, "sched_affinity": affinity}})
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    h = LoaderHandover(300.0, (32, 256), "measured: a batch", 400.0, "measured: 2 workers")
    out = estimates.apply(replace(a, findings=[f]),
                          estimates.Inputs(m, _pinned_records(5040.0, loading_cpu_us, 1500.0), loader=h))
    if said is None:
        assert out.findings == []
        (note,) = [n.message for n in out.notices if "DataLoader workers not advised" in n.message]
        assert note.startswith(f"more DataLoader workers not advised: with them a step would take "
                               f"{expected_step / 1e3:.1f} ms against 5.0 now")
        return
    (g,) = out.findings
    assert g.est_saving_pct == pytest.approx(round(100 * (1 - expected_step / 5040.0), 1))
    assert g.estimate is not None and any(said in e for e in g.estimate["edits"]), g.estimate["edits"]


def test_workers_share_the_cores_when_the_window_is_unlike_the_job_too(tmp_path: Path) -> None:
    """The job's steps (10080 us, 2500 waiting for input) are twice the window's (5040):
    the saving is a share of the window's step, 2200 / 5040 = 43.65%, the job's step
    after it 10080 x (1 - 0.4365) = 5680, at least its own step less its wait with the
    hand-over, 7880, and the workers' 2 x (600 + 400) us on 2 cores: 8880 us, 11.9%."""
    from pardiag.analyzers.factors import LoaderHandover

    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    a = analysis([rank(0, device="cpu"), rank(1, device="cpu")], framework={"threads": {"cpu_count": 2}})
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    h = LoaderHandover(300.0, (32, 256), "measured: a batch", 400.0, "measured: 2 workers")
    out = estimates.apply(replace(a, findings=[f]),
                          estimates.Inputs(m, _loading_records(10080.0, 2500.0, 600.0), loader=h))
    (g,) = out.findings
    assert g.est_saving_pct == pytest.approx(round(100 * (1 - 8880 / 10080), 1))
    assert g.estimate is not None and any(e.endswith("(the job's step of 10.1 ms)") for e in g.estimate["edits"])


def test_workers_that_would_keep_the_cores_half_busy_say_the_step_can_be_longer_still() -> None:
    w = estimates.WorkerLoad({0: 2600.0, 1: 2600.0}, {0: 1.0, 1: 1.0}, {0: 2840.0, 1: 2700.0}, {"h": ((0, 1), 2)}, 400.0)
    # 2 x 3000 us of CPU on 2 cores: 2840 + 3000 = 5840, the cores 6000 / 11680 = 51% busy
    t, words = w.slowed(2840.0) or (0.0, "")
    assert t == pytest.approx(5840.0) and "keep those cores 51% busy" in words
    assert estimates.WORKERS_BUSY_SAID == 0.5
    # 2 x 2000: 4840, 41%: not said
    t, words = replace(w, loading_us={0: 1600.0, 1: 1600.0}).slowed(2840.0) or (0.0, "")
    assert t == pytest.approx(4840.0) and "busy" not in words
    # nothing loaded in workers and the replay's step already the job's rest: nothing changes
    assert replace(w, loading_us={0: 0.0, 1: 0.0}, added_us=0.0).slowed(2840.0) is None


@pytest.mark.parametrize("cpu_us, kept", [(4000.0, True), (4100.0, False)])
def test_no_more_loader_workers_where_the_ranks_keep_the_cores_busy(tmp_path: Path, cpu_us: float, kept: bool) -> None:
    # two ranks on 2 cores, 5040 us steps: 2 x 4000 us of CPU per step is 79.4% of the cores
    # (under BUSY_CORES: the finding stays, with its estimate), 2 x 4100 is 81.3%: dropped,
    # and a notice says why; the same records on GPUs keep it (the host's CPU time there
    # holds spin-waits)
    assert estimates.BUSY_CORES == 0.8
    ev = gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,))
    m = _model(tmp_path, ev, gloo_replay_rank(0, 4720, 4920, dataloader_us=(2500.0,)))
    f = Finding(lever="dataloader", severity="high", title="input", evidence=[], ranks=[0, 1], est_saving_pct=40.0,
                action={"settings": [{"kwargs": {"num_workers": 2}}]})
    for device in ("cpu", "cuda"):
        a = analysis([rank(0, device=device), rank(1, device=device)], framework={"threads": {"cpu_count": 2}})
        out = estimates.apply(replace(a, findings=[f]), estimates.Inputs(m, _bucket_records(5040.0, cpu_us)))
        notes = [n.message for n in out.notices if "DataLoader workers not advised" in n.message]
        if kept or device == "cuda":
            assert [g.lever for g in out.findings] == ["dataloader"] and not notes
        else:
            assert out.findings == [] and len(notes) == 1
            assert f"2 cores 81% busy (rank 0 4.1 ms, rank 1 4.1 ms of CPU per 5.0 ms step)" in notes[0]
            assert out.what_if is None or all(r.lever != "dataloader" for r in out.what_if.findings)


def _stolen(add: bool = False):  # type: ignore[no-untyped-def]
    """``gloo_replay_rank`` with autograd's AccumulateGrad inside backward (1000-2200 us),
    and an aten::add_ inside it when ``add`` (a gradient already there, added into)."""
    def rank_ev(sleep: float, arrive: float) -> list[dict[str, Any]]:
        ev = gloo_replay_rank(sleep, arrive, 2710)
        ev.append(x("torch::autograd::AccumulateGrad", sleep + 2100, 50.0))
        if add:
            ev.append(x("aten::add_", sleep + 2110, 20.0))
        return ev
    return rank_ev


def test_the_model_tells_whether_backward_added_into_gradients_already_there(tmp_path: Path) -> None:
    # rank 0's AccumulateGrad took the gradient as it came (it was None); rank 1's added
    # into one. The optimizer's aten::add_ (outside any AccumulateGrad) does not count
    m = _model(tmp_path, _stolen()(0, 2210), _stolen(add=True)(300, 2510))
    assert m.grad_adds == {0: (1, 0), 1: (1, 1)}


def test_micro_batches_that_accumulate_do_not_fault_the_gradients_in_again(tmp_path: Path) -> None:
    # as the accumulation test (rank 0 2380, rank 1 2605 per micro-batch), with rank 0's
    # backward spending 400 us per step faulting in its gradients: its k - 1 micro-batches
    # that accumulate do not, 2230 - 400 = 1830 each: (2830 + 3 * 1830) / 4 = 2080
    m = _model(tmp_path, _stolen()(0, 2210), _stolen()(300, 2510))
    r = replay(m, [Accumulate(4, refault_us=((0, 400.0),))])
    assert r.replayed_steps[0][1] == pytest.approx(2080.0)
    assert r.replayed_steps[1][1] == pytest.approx(2605.0)
    # at most REFAULT_MAX_SHARE (0.9) of the 1200 us backward: 1080 off, 1150 each:
    # (2830 + 3 * 1150) / 4 = 1570
    r = replay(m, [Accumulate(4, refault_us=((0, 5000.0),))])
    assert r.replayed_steps[0][1] == pytest.approx(1570.0)
    # the micro-batch that syncs is the measured step, faults and all
    assert replay(m, [Accumulate(1, refault_us=((0, 400.0),))]).replayed_steps[0][1] == pytest.approx(2830.0)
    # adding each new gradient into the one there costs rank 1 250 us in each of them:
    # (2830 + 3 * 2780) / 4 = 2792.5; with rank 0's 400 us less, 2080 as above
    r = replay(m, [Accumulate(4, refault_us=((0, 400.0),), add_us=((1, 250.0),))])
    assert r.replayed_steps[0][1] == pytest.approx(2080.0)
    assert r.replayed_steps[1][1] == pytest.approx(2792.5)


def _fault_records(faults: list[float], step_us: float = 2830.0,
                   window: float | None = None) -> dict[int, list[StepRecord]]:
    """Per rank a warm-up step, then one counted step of ``step_us`` per entry of
    ``faults`` (steps.jsonl ``bwd_faults``); with ``window``, three profiled steps after
    them that faulted that often."""
    def rec(step: int, f: float, profiler: str | None = None) -> StepRecord:
        return StepRecord(step=step, t_end_ns=None, dur_us=step_us, pardiag_us=0.0, profiler=profiler,
                          signals={"backward_page_faults": f})

    return {r: [StepRecord(step=0, t_end_ns=None, dur_us=1.0, pardiag_us=0.0)]
            + [rec(i + 1, f) for i, f in enumerate(faults)]
            + ([rec(len(faults) + 1 + i, window, "active") for i in range(3)] if window is not None else [])
            for r in (0, 1)}


def _accumulation_analysis(trainable: int = 300 * 4096, device: str = "cpu") -> Any:
    a = analysis([rank(0, device=device), rank(1, device=device)],
                 framework={"parameters": {"trainable_bytes": trainable}})
    f = Finding(lever="gradient_accumulation", severity="high", title="exposed communication",
                evidence=["exposed", "each step page-faults 500 times (2 MB touched fresh, steps.jsonl): ..."],
                ranks=[0, 1], est_saving_pct=6.0, action={})
    return replace(a, findings=[f])


def test_the_accumulation_estimate_counts_the_gradients_faulted_in_once_and_added_into_after(tmp_path: Path) -> None:
    """Each rank's backward faulted 500 times in every counted step, its gradients every one
    of them taken afresh in the window (no AccumulateGrad added into one); the trainable
    parameters are 300 pages (1,228,800 bytes), so 300 of the faults are the gradients',
    at the measured 2.0 us: 600 us per step that the 3 micro-batches which accumulate do
    not spend. They add each new gradient into the one there instead, at the job's own
    in-place add rate (150 us for the 1,228,800 bytes). Rank 0 (2830 + 3 * (2230 - 600 +
    150)) / 4 = 2042.5, rank 1 (2830 + 3 * (2530 - 600 + 150)) / 4 = 2267.5: the job's step
    goes from 2830 to 2267.5, 562.5 us of the job's 2830 us step, 19.9% (without either,
    2830 - 2605 = 225 us, 8.0%)."""
    from pardiag.analyzers.factors import FaultCost
    from pardiag.analyzers.gemm_shapes import InplaceAddRate

    m = _model(tmp_path, _stolen()(0, 2210), _stolen()(300, 2510))
    cost = FaultCost(2.0, "measured: 64 MB of fresh memory written")
    rate = InplaceAddRate(150.0 / 1_228_800, 9, 16 << 20, "9 in-place adds")
    recs = _fault_records([500.0] * 6)

    def est(analysis: Any = None, model: Any = m, records: Any = recs, **kw: Any) -> Any:
        (f,) = estimates.apply(analysis or _accumulation_analysis(), estimates.Inputs(model, records, **kw)).findings
        assert f.estimate is not None and f.estimate["method"] == "replay"
        return f

    f = est(faults=cost, add_rate=rate)
    assert f.est_saving_pct == pytest.approx(round(100 * 562.5 / 2830, 1))
    assert any("1 MB of trainable parameters at 128 us/MB (0.1 ms" in e and "rank 0 300, rank 1 300 page faults"
               in e and "at 2.00 us each" in e for e in f.estimate["edits"])
    assert [(x["name"], round(x["value"], 1), x["measured"]) for x in f.estimate["factors"]] == [
        ("in-place add", 128.0, True), ("page fault of fresh memory", 2.0, True)]
    # the caveat that said the faults were not counted is gone; the rest of the evidence stays
    assert f.evidence == ["exposed"]
    # the fault not measured: the assumed 1.2 us (summary.FAULT_US), labelled: 360 us per
    # step, rank 1 (2830 + 3 * (2530 - 360 + 150)) / 4 = 2447.5, 382.5 us, 13.5%
    g = est(add_rate=rate)
    assert g.est_saving_pct == pytest.approx(round(100 * 382.5 / 2830, 1))
    assert g.estimate["factors"][1]["measured"] is False
    # faults in some steps and not others: their median over the counted steps, 500, as
    # above; in no counted step but in the profiled ones (what the replayed backward holds),
    # theirs: the same 19.9%
    for faults, window in (([0.0, 0.0, 500.0, 500.0, 500.0, 500.0], None), ([0.0] * 6, 500.0)):
        h = est(records=_fault_records(faults, window=window), faults=cost, add_rate=rate)
        assert h.est_saving_pct == pytest.approx(round(100 * 562.5 / 2830, 1))
    # too few counted steps to tell (4 of the 5 needed), none in the window, or none at
    # all: the add alone, rank 1 (2830 + 3 * 2680) / 4 = 2717.5, 112.5 us, 4.0%
    for faults, window in (([500.0] * 4, None), ([0.0] * 6, 0.0), ([0.0, 0.0, 0.0, 0.0, 500.0, 500.0], None)):
        h = est(records=_fault_records(faults, window=window), faults=cost, add_rate=rate)
        assert h.est_saving_pct == pytest.approx(round(100 * 112.5 / 2830, 1))
        assert [x["name"] for x in h.estimate["factors"]] == ["in-place add"] and len(h.evidence) == 2

    def plain(h: Any) -> None:
        assert h.est_saving_pct == pytest.approx(round(100 * 225 / 2830, 1))
        assert h.estimate["factors"] == [] and len(h.evidence) == 2

    # the all-reduces the micro-batches leave out, which backward's time holds, longer
    # outside the window than in it: backward (with DDP's wait) 1500 us over the job's 6
    # counted steps against 1200 in the window's 3, 1.25x: the 225 us removed from the
    # window's step become 281.25, 9.9% of the job's 2830 us step
    def with_backward(job_us: float, window_us: float) -> dict[int, list[StepRecord]]:
        return {r: [StepRecord(step=i, t_end_ns=None, dur_us=2830.0, pardiag_us=0.0,
                               profiler="active" if i > 6 else None, signals={"backward": job_us if i <= 6 else window_us})
                    for i in range(1, 10)] for r in (0, 1)}

    scaled = est(records=with_backward(1500.0, 1200.0))
    assert scaled.est_saving_pct == pytest.approx(round(100 * 281.25 / 2830, 1))
    (factor,) = scaled.estimate["factors"]
    assert factor["value"] == pytest.approx(1.25) and "bwd_us of the slowest rank per step: median 1.5 ms over 6" in \
        factor["source"]
    alike = est(records=with_backward(1200.0, 1200.0))  # alike: the same 225 us, the factor 1x
    assert alike.est_saving_pct == pytest.approx(round(100 * 225 / 2830, 1))
    assert [x["value"] for x in alike.estimate["factors"]] == [pytest.approx(1.0)]

    # neither where: the add rate is not known (no large in-place add in the trace),
    plain(est(faults=cost))
    # backward added into gradients already there (they were not freed: nothing changes),
    m3 = _model(tmp_path, _stolen(add=True)(0, 2210), _stolen(add=True)(300, 2510))
    plain(est(model=m3, faults=cost, add_rate=rate))
    # the parameters' size unknown, or the ranks not on CPUs
    plain(est(_accumulation_analysis(trainable=0), faults=cost, add_rate=rate))
    plain(est(_accumulation_analysis(device="cuda"), faults=cost, add_rate=rate))
