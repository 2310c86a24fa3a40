"""Straggler detection on evidence worked out by hand: per-step waits counted once,
figures bounded by the step, savings bounded by the work removed."""

from __future__ import annotations

from pardiag.analysis import Straggler
from pardiag.analyzers.rank_trace import CollectiveCall, StepSpan
from pardiag.analyzers.rules import advise
from pardiag.analyzers.stragglers import RankEvidence, find_stragglers, step_waits
from factories import analysis, rank

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
