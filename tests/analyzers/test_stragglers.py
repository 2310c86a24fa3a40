"""Straggler detection on evidence worked out by hand: per-step waits counted once,
figures bounded by the step, savings bounded by the work removed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pardiag.analysis import Straggler
from pardiag.analyzers.rank_trace import CollectiveCall, StepSpan
from pardiag.analyzers.rules import advise
from pardiag.analyzers.stragglers import RankEvidence, find_stragglers, step_waits
from pardiag.step_records import StepRecord
from pardiag.analyzers.pipeline import analyze_path
from factories import analysis, rank
from factories import jsonl_evidence as jsonl
from tracegen import write_trace, x

MS = 1000.0


def call(step: int, start_ms: float, dur_ms: float) -> CollectiveCall:
    return CollectiveCall(step=step, op="all_reduce", process_group="0:default_pg", group_size=2, bytes=4000,
                          start_us=start_ms * MS, dur_us=dur_ms * MS, on_gpu=False)


def test_overlapping_bucket_waits_count_once() -> None:
    # gloo runs DDP's two buckets concurrently: rank 0 issues both at 10 and 12 ms and
    # waits in both until rank 1 arrives at 50 ms; each transfer then takes 5 and 4 ms.
    # Waits: bucket 1 [10, 50] = 40 ms, bucket 2 [12, 52] = 40 ms; their sum (80 ms) counts
    # the same 40 ms twice, the union [10, 52] is 42 ms. Rank 1 waits 0.
    calls = {0: [call(1, 10, 45), call(1, 12, 44)], 1: [call(1, 50, 5), call(1, 52, 4)]}
    spans = {r: [StepSpan(1, 0.0, 60 * MS)] for r in (0, 1)}
    assert step_waits(calls, spans) == {0: {1: 42 * MS}, 1: {1: 0.0}}


def test_waits_are_cut_to_each_step() -> None:
    # one wait [90, 130] ms straddles steps 1 [0, 100) and 2 [100, 200): 10 + 30 ms
    calls = {0: [call(1, 90, 45)], 1: [call(1, 130, 5)]}
    spans = {r: [StepSpan(1, 0.0, 95 * MS), StepSpan(2, 100 * MS, 200 * MS)] for r in (0, 1)}
    assert step_waits(calls, spans)[0] == {1: 10 * MS, 2: 30 * MS}


def slow_window(steps: int = 5, sleep_ms: float = 40.0, summed: bool = True) -> dict[int, RankEvidence]:
    """Rank 1 works `sleep_ms` more per step before its forward pass; rank 0 waits for
    it at the all-reduce (in backward, by the phases). Steps of 66 ms on both ranks."""
    step = 66 * MS
    w = sleep_ms * MS
    ev = {}
    for r in (0, 1):
        wait = w if r == 0 else 0.0
        phases = {"dataloader": 1 * MS, "forward": (10 * MS + (w if r == 1 else 0.0)),
                  "backward": (15 * MS + wait), "optimizer": 5 * MS}
        phases["other"] = step - sum(phases.values())
        ev[r] = RankEvidence(
            rank=r, steps_in_window=steps,
            # the sum over two concurrent buckets counts the wait twice
            wait_us=(2 * wait if summed else wait) * steps,
            phases_us={k: v * steps for k, v in phases.items()},
            step_records=[],
            step_waits_us={s: wait for s in range(steps)},
            step_lengths_us={s: step for s in range(steps)},
        )
    return ev


def test_held_out_sleep_is_not_counted_twice() -> None:
    # the held-out run: rank 1 sleeps 40 ms per step; the others wait 40 ms, not the
    # 80 ms the summed bucket waits gave (121% of the step)
    (s,) = find_stragglers(slow_window())
    assert s.rank == 1 and s.cause == "forward"
    assert s.held_us_per_step == 40 * MS
    assert s.excess_us_per_step == 40 * MS  # forward +40 ms; backward less its wait: 15 ms on both
    assert "(61% of the 66.0 ms" in s.evidence[0]


def test_per_step_figures_never_exceed_the_step() -> None:
    ev = slow_window(sleep_ms=80.0)  # a wait longer than the 66 ms step: the inputs disagree
    (s,) = find_stragglers(ev)
    assert s.held_us_per_step is not None and s.held_us_per_step <= 66 * MS
    assert s.excess_us_per_step <= 66 * MS


def test_saving_never_exceeds_the_work_removed_nor_the_step() -> None:
    ranks = [rank(i, compute=0.8, step_p50=100 * MS) for i in range(2)]
    # the others wait 25 ms, but the straggler works only 10 ms more: removing its extra
    # work saves at most 10 ms of the 100 ms step
    s = Straggler(rank=1, excess_us_per_step=10 * MS, cause="forward", evidence=["e"], held_us_per_step=25 * MS)
    (f,) = [f for f in advise(analysis(ranks, stragglers=[s])).findings if f.lever == "straggler"]
    assert f.est_saving_pct == 10.0
    # figures beyond the step (an old analysis.json) still save at most the whole step
    s = Straggler(rank=1, excess_us_per_step=150 * MS, cause="forward", evidence=["e"], held_us_per_step=121 * MS)
    (f,) = [f for f in advise(analysis(ranks, stragglers=[s])).findings if f.lever == "straggler"]
    assert f.est_saving_pct is not None and f.est_saving_pct <= 100.0


# -- significance over the steps, and evidence that agrees with the tables ----------------


def records(r: int, steps: int, *, data: float, fwd: float, bwd: list[float] | float, opt: float,
            step: float = 66 * MS) -> list[StepRecord]:
    bwds = bwd if isinstance(bwd, list) else [bwd] * steps
    return [StepRecord(step=k, t_end_ns=k, dur_us=step, pardiag_us=0.0,
                       signals={"dataloader": data, "forward": fwd, "backward": bwds[k], "optimizer": opt,
                                "forwards": 1, "backwards": 1})
            for k in range(steps)]


def test_balanced_control_names_no_one() -> None:
    # the bf16 / no_sync control: rank 1's backward (DDP's wait included) is 1 ms shorter
    # in 18 of 20 counted steps (it "waits least in 90% of the steps"), and the profiled
    # window's collectives, summed over concurrent buckets, claimed 9 ms more waiting on
    # rank 0 per step (14% of the 66 ms step) while the union of its waits is 1 ms.
    # A 1 ms difference is under the floor (10% of the step): no straggler.
    bwd1 = [38 * MS] * 21
    bwd1[5] = bwd1[9] = 40 * MS
    recs = {0: records(0, 21, data=1 * MS, fwd=10 * MS, bwd=39 * MS, opt=5 * MS),
            1: records(1, 21, data=1 * MS, fwd=10 * MS, bwd=bwd1, opt=5 * MS)}
    ev = {r: RankEvidence(rank=r, steps_in_window=3, wait_us=(9 * MS if r == 0 else 0.0) * 3,
                          phases_us={"forward": 30 * MS, "backward": 117 * MS + (3 * MS if r == 0 else 0.0),
                                     "optimizer": 15 * MS, "dataloader": 3 * MS, "other": 33 * MS},
                          step_records=rs, step_waits_us={k: (1 * MS if r == 0 else 0.0) for k in range(3)},
                          step_lengths_us={k: 66 * MS for k in range(3)})
          for r, rs in recs.items()}
    assert find_stragglers(ev) == []


def test_jitter_without_a_slow_rank_names_no_one() -> None:
    # rank 1 waits less by 0 or 14 ms in alternate steps: the interval of the median
    # reaches down to 0, under the floor
    bwd1 = [39 * MS if k % 2 else 25 * MS for k in range(21)]
    ev = jsonl({0: records(0, 21, data=1 * MS, fwd=10 * MS, bwd=39 * MS, opt=5 * MS),
                1: records(1, 21, data=1 * MS, fwd=24 * MS, bwd=bwd1, opt=5 * MS)})
    assert find_stragglers(ev) == []


def test_planted_slow_forward_from_steps_jsonl_agrees_with_the_host_phases() -> None:
    from pardiag.analyzers.pipeline import _host_phases

    recs = {0: records(0, 21, data=1 * MS, fwd=10 * MS, bwd=45 * MS, opt=5 * MS),
            1: records(1, 21, data=1 * MS, fwd=50 * MS, bwd=5 * MS, opt=5 * MS)}
    (s,) = find_stragglers(jsonl(recs))
    # others' backward 45 ms vs 5 ms: they wait 40 ms; rank 1's forward is 40 ms longer
    assert (s.rank, s.cause, s.held_us_per_step, s.excess_us_per_step) == (1, "forward", 40 * MS, 40 * MS)
    # step 0 is warm-up: 20 counted steps, all of them 40 ms, so the interval is 40 to 40
    assert s.evidence[1] == "per step over 20 steps: 95% interval 40.0 to 40.0 ms, above the noise floor of 6.6 ms"
    # the phase line quotes the very medians the Analysis shows per rank
    fwd_line = next(e for e in s.evidence if e.startswith("forward:"))
    mine, theirs = _host_phases(recs[1])["forward"], _host_phases(recs[0])["forward"]
    assert fwd_line.startswith(f"forward: {mine / 1000:.1f} ms per step on rank 1 vs {theirs / 1000:.1f} ms")


def test_noise_floor_from_the_other_ranks() -> None:
    # four ranks; ranks 0, 2 and 3 differ among themselves by 30 ms per step (one of them
    # alternates 45 / 15 ms), rank 3's waits are 20 ms above rank 1's: 20 ms excess is
    # within what ranks that are not stragglers differ by, so no finding
    def rank_recs(r: int, bwd: list[float], fwd: float) -> list[StepRecord]:
        return records(r, 21, data=1 * MS, fwd=fwd, bwd=bwd, opt=5 * MS, step=100 * MS)

    ev = jsonl({0: rank_recs(0, [45 * MS] * 21, 10 * MS),
                1: rank_recs(1, [25 * MS] * 21, 30 * MS),
                2: rank_recs(2, [15 * MS if k % 2 else 45 * MS for k in range(21)], 10 * MS),
                3: rank_recs(3, [45 * MS if k % 2 else 15 * MS for k in range(21)], 10 * MS)})
    assert find_stragglers(ev) == []


def test_window_evidence_quotes_the_phase_table() -> None:
    ev = slow_window()
    (s,) = find_stragglers(ev)
    per_step = {r: {k: v / e.steps_in_window for k, v in e.phases_us.items()} for r, e in ev.items()}
    assert f"forward: {per_step[1]['forward'] / 1000:.1f} ms per step on rank 1 vs " \
           f"{per_step[0]['forward'] / 1000:.1f} ms on the others" in "\n".join(s.evidence)


# -- a plain trace folder: the window's steps are the per-step evidence --------------------


def slow_rank_trace(rank: int, steps: int = 3, extra_us: float = 40_000.0,
                    before_forward: str = "aten::mm") -> list[dict[str, Any]]:
    """Steps of 100 ms on thread 1 (gloo on 9). Rank 1 spends `extra_us` at each step's
    start before forward (in an operator, or as a host gap when `before_forward` is
    empty); rank 0 then waits in the all-reduce from 20 ms until rank 1 arrives at 60 ms,
    and the transfer takes 5 ms. The optimizer runs at 70-75 ms on both."""
    ev = []
    for k in range(steps):
        t0 = 1000.0 + k * 100_000
        late = extra_us if rank == 1 else 0.0
        ev.append(x(f"ProfilerStep#{k + 1}", t0, 100_000, cat="user_annotation"))
        if late and before_forward:
            ev.append(x(before_forward, t0, late))
        ev.append(x("aten::linear", t0 + late, 10_000))
        ev.append(x("autograd::engine::evaluate_function: AddmmBackward0", t0 + late + 10_000, 10_000))
        start = t0 + 60_000 if rank == 1 else t0 + 20_000
        ev.append(x("gloo:all_reduce", start, t0 + 65_000 - start, tid=9, cat="user_annotation",
                    **{"Input Dims": [[1000]], "Input type": ["float"]}))
        ev.append(x("Optimizer.step#SGD.step", t0 + 70_000, 5_000, cat="user_annotation"))
        ev.append(x("aten::add_", t0 + 70_000, 4_000))
    return ev


def test_plain_trace_folder_gets_its_straggler_from_the_profiled_steps(tmp_path: Path) -> None:
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", slow_rank_trace(r), rank=r)
    a = analyze_path(tmp_path, jobs=1)
    (s,) = a.stragglers
    # per step rank 0 waits 40 ms (20 to 60 ms), rank 1 0; rank 1's forward is 40 ms longer
    assert (s.rank, s.cause, s.held_us_per_step, s.excess_us_per_step) == (1, "forward", 40 * MS, 40 * MS)
    assert "profiled window" in s.evidence[0] and "(40% of the 100.0 ms median step" in s.evidence[0]
    assert s.evidence[1] == "per step over 3 steps: range 40.0 to 40.0 ms, above the noise floor of 10.0 ms"


def test_host_work_before_forward_is_named_host_work_and_where(tmp_path: Path) -> None:
    # the same job, rank 1 sleeping 40 ms at each step's start instead of computing:
    # no operator runs then, so it is host work, not forward
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", slow_rank_trace(r, before_forward=""), rank=r)
    a = analyze_path(tmp_path, jobs=1)
    (s,) = a.stragglers
    assert s.cause == "host work outside torch operators: at the step's start, before forward"
    assert (s.held_us_per_step, s.excess_us_per_step) == (40 * MS, 40 * MS)
    r1 = next(r for r in a.ranks if r.rank == 1)
    # host per step: rank 1 0-40 ms (the sleep), 65-70 (after the all-reduce, before the
    # optimizer) and 75-100 (after it) = 70 ms; rank 0 only the last two = 30 ms.
    # Rank 0's 20-65 ms is the all-reduce in flight: backward (blocked), not host work.
    r0 = next(r for r in a.ranks if r.rank == 0)
    assert (r1.phases_per_step_us["host"], r0.phases_per_step_us["host"]) == (70 * MS, 30 * MS)
    assert r1.phases_per_step_us["forward"] == r0.phases_per_step_us["forward"] == 10 * MS
    assert "host work outside torch operators: 70.0 ms per step on rank 1 vs 30.0 ms on the others" in s.evidence[2]
    (f,) = [f for f in a.findings if f.lever == "straggler"]
    assert "(at the step's start, before forward)" in f.action["text"]


def test_lever_action_follows_the_work_outside_the_timed_phases() -> None:
    ranks = [rank(i, compute=0.8, step_p50=100 * MS) for i in range(2)]
    s = Straggler(rank=1, excess_us_per_step=40 * MS, cause="work outside DataLoader, forward, backward and optimizer",
                  evidence=["e"], held_us_per_step=40 * MS)
    (f,) = [f for f in advise(analysis(ranks, stragglers=[s])).findings if f.lever == "straggler"]
    assert f.action["text"].startswith("rank 1 spends longer outside DataLoader, forward, backward and optimizer")
    assert f.est_saving_pct == 40.0


def test_slow_backward_shows_in_the_window_when_steps_jsonl_cannot_tell() -> None:
    # rank 1 computes backward 30 ms longer; rank 0 waits those 30 ms at the end of its
    # backward, so both ranks' backward (wait included) lasts 45 ms in steps.jsonl: no
    # difference there. The window measures the wait inside the collective: rank 0
    # waits 30 ms per step, and its backward less that wait is 15 ms against rank 1's 45.
    recs = {r: records(r, 21, data=1 * MS, fwd=10 * MS, bwd=45 * MS, opt=5 * MS) for r in (0, 1)}
    ev = {r: RankEvidence(rank=r, steps_in_window=3, wait_us=(30 * MS if r == 0 else 0.0) * 3,
                          phases_us={"dataloader": 3 * MS, "forward": 30 * MS, "backward": 135 * MS,
                                     "optimizer": 15 * MS, "other": 0.0, "host": 15 * MS},
                          step_records=rs, step_waits_us={k: (30 * MS if r == 0 else 0.0) for k in range(3)},
                          step_lengths_us={k: 66 * MS for k in range(3)})
          for r, rs in recs.items()}
    (s,) = find_stragglers(ev)
    assert (s.rank, s.cause, s.held_us_per_step, s.excess_us_per_step) == (1, "backward", 30 * MS, 30 * MS)
    assert "profiled window" in s.evidence[0] and s.held_from == "profiled window"
    assert "backward less its wait in collectives: 45.0 ms per step on rank 1 vs 15.0 ms on the others" in s.evidence[2]


def test_a_rank_slow_only_while_profiled_is_no_straggler() -> None:
    # the balanced control seen on a busy machine: over 20 counted steps steps.jsonl
    # shows both ranks alike, but in the 3 profiled steps rank 1's forward took 40 ms
    # longer and rank 0 waited for it. steps.jsonl times forward on every step: the
    # window's few steps do not outvote it.
    recs = {r: records(r, 21, data=1 * MS, fwd=10 * MS, bwd=45 * MS, opt=5 * MS) for r in (0, 1)}
    ev = {r: RankEvidence(rank=r, steps_in_window=3, wait_us=(40 * MS if r == 0 else 0.0) * 3,
                          phases_us={"dataloader": 3 * MS, "forward": (50 if r == 1 else 10) * 3 * MS,
                                     "backward": (55 if r == 0 else 15) * 3 * MS, "optimizer": 15 * MS,
                                     "other": 0.0, "host": 15 * MS},
                          step_records=rs, step_waits_us={k: (40 * MS if r == 0 else 0.0) for k in range(3)},
                          step_lengths_us={k: 76 * MS for k in range(3)})
          for r, rs in recs.items()}
    assert find_stragglers(ev) == []
    # the same window with no steps.jsonl (a plain trace folder) is all there is: named
    plain = {r: replace(e, step_records=[]) for r, e in ev.items()}
    (s,) = find_stragglers(plain)
    assert (s.rank, s.cause) == (1, "forward")


def _long_inputs(device: str | None, cpu1_ms: float = 30.5, runq1_ms: float = 0.7, bwd0_ms: float = 25.0,
                 step0_ms: float = 33.0) -> dict[int, RankEvidence]:
    """The long-inputs job's steps.jsonl (21 steps, the first warm-up): rank 1 has twice
    the tokens. Rank 0: forward 6 ms, backward ``bwd0_ms`` (its wait for rank 1 inside),
    step ``step0_ms``, 18.0 ms on its CPU and 0.2 waiting for one. Rank 1: forward 10 ms,
    backward 21 ms (twice rank 0's work, hardly any wait), step 32.6 ms, ``cpu1_ms`` on
    its CPU and ``runq1_ms`` waiting for one."""
    def recs(r: int, fwd: float, bwd: float, step: float, cpu: float, runq: float) -> list[StepRecord]:
        return [replace(x, signals={**x.signals, "cpu": cpu * MS, "run_queue": runq * MS})
                for x in records(r, 21, data=0.2 * MS, fwd=fwd * MS, bwd=bwd * MS, opt=1 * MS, step=step * MS)]
    rs = {0: recs(0, 6.0, bwd0_ms, step0_ms, 18.0, 0.2), 1: recs(1, 10.0, 21.0, 32.6, cpu1_ms, runq1_ms)}
    return {r: RankEvidence(rank=r, steps_in_window=0, wait_us=0.0, phases_us={}, step_records=x, device_type=device)
            for r, x in rs.items()}


def test_on_cpus_a_stragglers_extra_backward_work_shows_in_its_cpu_time() -> None:
    # backward's time holds the wait: 25 - 21 = 4 ms, and rank 1's forward is 4 ms longer.
    # But rank 1's backward also does twice the work: on CPUs its training thread is on its
    # CPU (or waiting for one) 30.5 + 0.7 - (18.0 + 0.2) = 13.0 ms longer per step, and rank
    # 0 is off its CPU 33.0 - 18.2 = 14.8 ms against rank 1's 32.6 - 31.2 = 1.4 (13.4 ms
    # longer). The others wait the lesser, 13.0 ms (40% of the 32.8 ms median step), and
    # that much is its extra work
    (s,) = find_stragglers(_long_inputs("cpu"))
    assert (s.rank, s.cause, s.held_from) == (1, "forward", "steps.jsonl")
    assert s.held_us_per_step == pytest.approx(13.0 * MS) and s.excess_us_per_step == pytest.approx(13.0 * MS)
    assert s.evidence[0].startswith("the other ranks wait 13.0 ms per step more than rank 1 (40% of the 32.8 ms")
    assert "from backward's time alone (4.0 ms median): 95% interval 4.0 to 4.0 ms" in s.evidence[1]
    assert any("on a CPU (or waiting for one) 13.0 ms per step longer" in e and "off it 13.4 ms longer" in e
               for e in s.evidence)
    # on GPUs the host thread's CPU time is not the rank's work: backward's 4 ms stand
    (s,) = find_stragglers(_long_inputs("cuda"))
    assert s.held_us_per_step == pytest.approx(4.0 * MS) and s.excess_us_per_step == pytest.approx(4.0 * MS)
    assert not any("on a CPU (or waiting for one)" in e for e in s.evidence)
    # a rank slow off its CPU (its extra time asleep: the same CPU time as rank 0's) shows
    # nothing more there: backward's 4 ms stand
    (s,) = find_stragglers(_long_inputs("cpu", cpu1_ms=18.0, runq1_ms=0.2))
    assert s.held_us_per_step == pytest.approx(4.0 * MS)


def test_on_cpus_a_straggler_hidden_by_its_own_backward_work_is_found_by_its_cpu_time() -> None:
    # backward's time puts the others' wait at 24.0 - 21.0 = 3.0 ms, under the floor (10%
    # of the 32.8 ms step): nothing there. Off their CPU, rank 0 is 33.0 - 18.2 = 14.8 ms
    # per step and rank 1 32.6 - 31.2 = 1.4: the others wait 13.4 ms, and rank 1 is on
    # its CPU 13.0 ms longer, its extra work
    (s,) = find_stragglers(_long_inputs("cpu", bwd0_ms=24.0))
    assert (s.rank, s.held_from) == (1, "steps.jsonl")
    assert s.held_us_per_step == pytest.approx(13.4 * MS) and s.excess_us_per_step == pytest.approx(13.0 * MS)
    assert s.evidence[0] == ("the other ranks wait 13.4 ms per step more than rank 1 (41% of the 32.8 ms median "
                             "step; both from steps.jsonl: the training threads' time off a CPU)")
    assert s.evidence[1] == "per step over 20 steps: 95% interval 13.4 to 13.4 ms, above the noise floor of 3.3 ms"
    # on GPUs there is no such measure: nothing is named
    assert find_stragglers(_long_inputs("cuda", bwd0_ms=24.0)) == []
    # control: rank 0's steps 13 ms longer (46.0 ms, its own timing), both ranks on their
    # CPU alike (18.2 ms): rank 0 is off it 27.8 ms against rank 1's 14.4, but rank 1
    # computes nothing more, so nobody waits for its work: no one is named
    assert find_stragglers(_long_inputs("cpu", cpu1_ms=18.0, runq1_ms=0.2, bwd0_ms=21.0, step0_ms=46.0)) == []


def _backward_window(cpu_ms: dict[int, float], device: str | None,
                     runq_ms: dict[int, float] | None = None) -> dict[int, RankEvidence]:
    """The window of the slow-backward test above (rank 1 30 ms longer in backward over
    its 3 profiled steps), with each rank's training-thread CPU time (and run-queue wait,
    when given) per step over 21 steps in steps.jsonl and the ranks' device."""
    recs = {r: [replace(x, signals={**x.signals, "cpu": cpu_ms[r] * MS,
                                    **({"run_queue": runq_ms[r] * MS} if runq_ms else {})})
                for x in records(r, 21, data=1 * MS, fwd=10 * MS, bwd=45 * MS, opt=5 * MS)] for r in (0, 1)}
    return {r: RankEvidence(rank=r, steps_in_window=3, wait_us=(30 * MS if r == 0 else 0.0) * 3,
                            phases_us={"dataloader": 3 * MS, "forward": 30 * MS, "backward": 135 * MS,
                                       "optimizer": 15 * MS, "other": 0.0, "host": 15 * MS},
                            step_records=rs, step_waits_us={k: (30 * MS if r == 0 else 0.0) for k in range(3)},
                            step_lengths_us={k: 66 * MS for k in range(3)}, device_type=device)
            for r, rs in recs.items()}


def test_on_cpus_a_window_backward_straggler_must_show_in_the_cpu_time_of_every_step() -> None:
    # on CPUs backward runs on the training thread: 30 ms more of it per step would be
    # 30 ms more CPU time in steps.jsonl. Rank 1's is 3 ms above rank 0's (under half of
    # 30): the window's 3 steps alone slowed it, no straggler
    assert find_stragglers(_backward_window({0: 30.0, 1: 33.0}, "cpu")) == []
    # 20 ms more (at least half of the 30): it is one
    (s,) = find_stragglers(_backward_window({0: 30.0, 1: 50.0}, "cpu"))
    assert (s.rank, s.cause) == (1, "backward")
    # timed over every step (rank 0 off its CPU 36 ms per step, rank 1 16): 20 ms, not the
    # window's 30; the cause from the window's phases (steps.jsonl's backward holds both
    # rank 1's extra work and rank 0's wait: 45 ms each)
    assert s.held_from == "steps.jsonl" and s.held_us_per_step == pytest.approx(20 * MS)
    assert s.excess_us_per_step == pytest.approx(20 * MS)
    assert any(e.startswith("backward less its wait in collectives: ") for e in s.evidence)
    # on a GPU the host's CPU time does not hold backward's kernels: the window stands
    (s,) = find_stragglers(_backward_window({0: 30.0, 1: 33.0}, "cuda"))
    assert (s.rank, s.cause) == (1, "backward")


def test_on_cpus_a_window_backward_straggler_may_show_in_the_run_queue_instead() -> None:
    # another process spins on rank 1's CPU: its backward takes 30 ms longer per step at
    # the same CPU time as rank 0's (30 ms), the rest of it spent waiting to run. 20 ms
    # more in the run queue than rank 0 on every step (at least half of the 30): named
    (s,) = find_stragglers(_backward_window({0: 30.0, 1: 30.0}, "cpu", {0: 0.5, 1: 20.5}))
    assert s.rank == 1
    # 10 ms more (under half of the window's 30): not the window's 30 ms. But over every
    # step rank 1 is then on its CPU or waiting for one 10 ms longer than rank 0, and rank
    # 0 off its CPU 10 ms longer (steps of 66 ms alike): a 10 ms straggler over the job
    (s,) = find_stragglers(_backward_window({0: 30.0, 1: 30.0}, "cpu", {0: 0.5, 1: 10.5}))
    assert (s.rank, s.held_from) == (1, "steps.jsonl")
    assert s.held_us_per_step == pytest.approx(10 * MS) and s.excess_us_per_step == pytest.approx(10 * MS)
