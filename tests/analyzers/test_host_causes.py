"""Host causes of a straggler from the host signals of steps.jsonl
(analyzers/host_causes.py), on records built by hand: the numbers are worked out below."""

from __future__ import annotations

from typing import Any

import pytest

from pardiag.analysis import Straggler
from pardiag.analyzers import host_causes
from pardiag.analyzers.factors import FaultCost
from pardiag.step_records import parse

MS = 1000.0


def records(n: int = 10, **per_step: float) -> list:
    """n counted steps (1..n) of 100 ms with the given signals (in us or counts)."""
    out = []
    for i in range(1, n + 1):
        obj: dict[str, Any] = {"v": 2, "step": i, "dur_us": 100 * MS, "pardiag_us": 0.0, "source": "optimizer"}
        obj.update({k: (v(i) if callable(v) else v) for k, v in per_step.items()})
        out.append(parse(obj))
    return out


STRAGGLER = Straggler(rank=1, excess_us_per_step=30 * MS, cause="forward", evidence=["the others wait"],
                      held_us_per_step=25 * MS)


def test_waiting_for_a_cpu_that_explains_the_wait_is_named() -> None:
    # rank 1's thread waited 20 ms per step for a CPU, rank 0's 1 ms: 19 of the 25 ms the
    # others wait (76%, over half)
    recs = {0: records(runq_us=1 * MS, nivcsw=2), 1: records(runq_us=20 * MS, nivcsw=40)}
    s = host_causes.refine(STRAGGLER, recs)
    assert s.cause == "CPU contention (forward)"
    assert s.evidence[0] == "the others wait"
    assert s.evidence[-1] == ("rank 1 waited for a CPU (run queue) 20.0 ms per step, the others 1.0 ms (median over "
                              "10 steps, steps.jsonl): 76% of the 25.0 ms they wait for it; 40 involuntary context "
                              "switches per step, the others 2")
    assert host_causes.cause_kind(s.cause) == host_causes.CONTENTION


def test_a_signal_that_explains_under_half_of_the_wait_is_not_a_cause() -> None:
    # 10 - 1 = 9 ms of 25: 36%
    recs = {0: records(runq_us=1 * MS), 1: records(runq_us=10 * MS)}
    assert host_causes.refine(STRAGGLER, recs) == STRAGGLER
    # nor is a signal one rank did not record
    assert host_causes.refine(STRAGGLER, {0: records(), 1: records(runq_us=20 * MS)}) == STRAGGLER


def test_garbage_collection_every_step_is_named_with_its_rate() -> None:
    # rank 1: a 16 ms collection every step (100 per 100 steps), rank 0 none: 16 of 25 = 64%
    recs = {0: records(gc_us=0.0, gcs=0), 1: records(gc_us=16 * MS, gcs=1)}
    s = host_causes.refine(STRAGGLER, recs)
    assert s.cause == "garbage collection (forward)"
    assert s.evidence[-1].endswith("64% of the 25.0 ms they wait for it; 100 collections per 100 steps, the others 0")


def test_the_larger_of_two_host_causes_comes_first() -> None:
    recs = {0: records(gc_us=0.0, gcs=0, runq_us=0.0), 1: records(gc_us=14 * MS, gcs=1, runq_us=21 * MS)}
    s = host_causes.refine(STRAGGLER, recs)
    assert s.cause.startswith("CPU contention") and "garbage collection" in s.evidence[-1]


def test_bigger_batches_on_the_straggler_are_input_imbalance() -> None:
    # rank 1's first forward tensor: 1900 elements per step against 1000: 1.90x
    recs = {0: records(in_elems=1000, forwards=1), 1: records(in_elems=1900, forwards=1)}
    s = host_causes.refine(STRAGGLER, recs)
    assert s.cause == "input imbalance (forward)"
    assert "1.90x the elements of the others' (1,900 against 1,000 per step" in s.evidence[-1]
    # 1.1x is within the ratio; a straggler slow outside forward/backward is not explained by its inputs
    assert host_causes.refine(STRAGGLER, {0: records(in_elems=1000, forwards=1),
                                          1: records(in_elems=1100, forwards=1)}) == STRAGGLER
    host = Straggler(rank=1, excess_us_per_step=30 * MS, cause="dataloader", evidence=[], held_us_per_step=25 * MS)
    assert host_causes.refine(host, recs) == host


OUTSIDE = Straggler(rank=1, excess_us_per_step=19 * MS, cause="work outside DataLoader, forward, backward and optimizer",
                    evidence=[], held_us_per_step=17.7 * MS)


def test_page_faults_that_explain_the_wait_are_named_in_backward() -> None:
    # rank 1 faulted 8,160 pages per step, all inside backward, rank 0 none: at the 2.46 us
    # measured a fault, 8,160 x 2.46 = 20,073.6 us = 20.1 ms per step, over the 17.7 ms the
    # others wait (all of it). The phase table had put the extra time outside the phases
    # (backward's time holds the wait): the faults say backward
    recs = {0: records(faults=0, bwd_faults=0), 1: records(faults=8160, bwd_faults=8160)}
    cost = FaultCost(2.46, "measured: 16 MB written afresh")
    s = host_causes.refine(OUTSIDE, recs, cost)
    assert s.cause == "page faults (backward)" and host_causes.cause_kind(s.cause) == host_causes.FAULTS
    assert s.evidence[-1].startswith(
        "rank 1 page-faulted 8,160 times per step, the others 0, 8,160 of them inside backward (the others 0) "
        "(median over 10 steps, steps.jsonl): at 2.46 us a fault (measured after the job: 16 MB written afresh) "
        "20.1 ms per step, all of the 17.7 ms they wait for it.")
    # unmeasured, a fault is taken at FAULT_US (1.2 us): 9,792 us, 55% of 17.7 ms, over half
    s = host_causes.refine(OUTSIDE, recs)
    assert s.cause == "page faults (backward)"
    assert "at 1.20 us a fault (a typical cost: none was measured after the job) 9.8 ms per step, 55% of" in s.evidence[-1]


def test_page_faults_outside_backward_keep_the_phase_and_too_few_are_no_cause() -> None:
    # 8,000 extra faults, 1,000 of them in backward: the phase stays the table's
    recs = {0: records(faults=200, bwd_faults=100), 1: records(faults=8200, bwd_faults=1100)}
    s = host_causes.refine(OUTSIDE, recs, FaultCost(2.5, "measured"))
    assert s.cause == "page faults (work outside DataLoader, forward, backward and optimizer)"
    # 3,000 extra faults at 2.5 us: 7.5 ms, 42% of 17.7 ms: under half, not a cause
    recs = {0: records(faults=0, bwd_faults=0), 1: records(faults=3000, bwd_faults=3000)}
    assert host_causes.refine(OUTSIDE, recs, FaultCost(2.5, "measured")) == OUTSIDE


def test_medians_skip_uncounted_steps() -> None:
    # step 0 is warm-up and not counted: its 500 ms run-queue wait does not move the median
    recs = records(runq_us=lambda i: 2 * MS)
    recs.insert(0, parse({"v": 2, "step": 0, "dur_us": 600 * MS, "pardiag_us": 0.0, "runq_us": 500 * MS}))
    m = host_causes.host_medians(recs)
    assert m.run_queue_us == pytest.approx(2 * MS) and m.steps == 10
