"""The whole run over time (analyzers/temporal.py) on step records built by hand: two
ranks of DDP, 100 ms steps (forward 20, backward 50 with its wait, optimizer 10, the
rest untimed), and the planted changes below."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pardiag.analyzers import temporal
from pardiag.step_records import parse

MS = 1000.0


def job(n: int = 60, extra: Any = None, noise: float = 0.0, seed: int = 0, window: tuple[int, int] | None = None,
        warmup: dict[int, float] | None = None) -> dict[int, list]:
    """Per rank n steps. `extra(step, rank)` -> dict of ms added to that rank's phases
    ("fwd", "untimed", "gc"): the others' backward waits for the slowest rank's extra."""
    rng = random.Random(seed)
    out: dict[int, list] = {0: [], 1: []}
    for s in range(n):
        jitter = 1 + rng.uniform(-noise, noise)
        add = {r: (extra(s, r) if extra else {}) or {} for r in (0, 1)}
        own = {r: add[r].get("fwd", 0) + add[r].get("untimed", 0) + add[r].get("gc", 0) for r in (0, 1)}
        slowest = max(own.values())
        for r in (0, 1):
            wait = slowest - own[r]  # it waits in backward for the other's extra work
            base = (warmup or {}).get(s, 0.0)
            obj = {"v": 2, "step": s, "dur_us": (100 * jitter + slowest + base) * MS, "pardiag_us": 0.0,
                   "data_us": 1 * MS, "fwd_us": (20 + add[r].get("fwd", 0)) * MS,
                   "bwd_us": (50 * jitter + wait + base) * MS, "opt_us": 10 * MS, "backwards": 1,
                   "gc_us": add[r].get("gc", 0) * MS, "gcs": 1 if add[r].get("gc") else 0}
            if window and window[0] <= s <= window[1]:
                obj["profiler"] = "active"
            out[r].append(parse(obj))
    return out


def test_a_straggler_that_starts_late_is_a_persistent_change_on_its_rank() -> None:
    # from step 40 on, rank 1 computes 30 ms more in forward: the job's step 100 -> 130 ms
    t = temporal.analyze(job(extra=lambda s, r: {"fwd": 30} if s >= 40 and r == 1 else None, noise=0.02))
    assert t is not None and len(t.changes) == 1
    c = t.changes[0]
    assert c.step == 40 and c.until is None and c.rank == 1 and c.cause == "forward"
    assert c.before_us == pytest.approx(100 * MS, rel=0.03) and c.after_us == pytest.approx(130 * MS, rel=0.03)
    assert t.last_rank[45] == 1 and t.late_us[1][45] == pytest.approx(30 * MS, rel=0.1)
    assert not t.spikes


def test_noise_alone_makes_no_change_and_no_spike() -> None:
    # +-5% uniform jitter on every step, 200 steps, several seeds: the control
    for seed in range(5):
        t = temporal.analyze(job(n=200, noise=0.05, seed=seed))
        assert t is not None and t.changes == [] and t.spikes == [], seed


def test_a_pause_every_10_steps_on_all_ranks_is_periodic_outside_the_phases() -> None:
    # a 500 ms checkpoint on both ranks after steps 10, 20, ..., 50 (untimed, the same on both)
    t = temporal.analyze(job(extra=lambda s, r: {"untimed": 500} if s and s % 10 == 0 else None, noise=0.02))
    assert t is not None and t.changes == []
    assert [s.step for s in t.spikes] == [10, 20, 30, 40, 50]
    assert all(s.rank is None and s.cause and s.cause.startswith("outside the timed phases") for s in t.spikes)
    (p,) = t.periodic
    assert p.every == 10 and p.rank is None and p.excess_us == pytest.approx(500 * MS, rel=0.05)


def test_garbage_collection_pauses_on_one_rank_are_named() -> None:
    # rank 1 collects for 200 ms at steps 15, 30 and 45: rank 0 waits for it
    t = temporal.analyze(job(extra=lambda s, r: {"gc": 200} if r == 1 and s in (15, 30, 45) else None, noise=0.02))
    assert t is not None
    assert [(s.step, s.rank, s.cause) for s in t.spikes] == [(s, 1, "garbage collection on rank 1")
                                                              for s in (15, 30, 45)]
    assert t.periodic and t.periodic[0].every == 15 and t.periodic[0].rank == 1


def test_warmup_and_the_profiler_window_are_counted_apart() -> None:
    # steps 0-2 at 400 ms (compilation, allocator), steps 7-9 profiled at +80 ms
    t = temporal.analyze(job(warmup={0: 300, 1: 300, 2: 300},
                             extra=lambda s, r: {"untimed": 80} if 7 <= s <= 9 else None, window=(7, 9)))
    assert t is not None and t.windows == [(7, 9)]
    assert t.warmup_steps == 3 and t.warmup_us == pytest.approx(3 * 300 * MS, rel=0.01)
    # the window's steps are not counted, so they are neither spikes nor a change
    assert 8 not in t.steps and t.spikes == [] and t.changes == []
    d = t.to_dict()
    assert d["windows"] == [[7, 9]] and d["warmup"]["steps"] == 3


def test_a_slowdown_that_ends_says_until_when() -> None:
    # steps 20-39 at 160 ms (a neighbour's job on both ranks' machine), then back to 100
    t = temporal.analyze(job(extra=lambda s, r: {"untimed": 60} if 20 <= s < 40 else None, noise=0.02))
    assert t is not None
    assert [(c.step, c.until) for c in t.changes] == [(20, 39), (40, None)]
    assert t.changes[0].rank is None and t.changes[0].cause.startswith("outside the timed phases")


# -- the findings and notices of the temporal block ----------------------------------------

def _advised(t: temporal.Temporal, stragglers: list | None = None):  # type: ignore[no-untyped-def]
    from factories import analysis, rank
    from pardiag.analyzers.rules import advise

    # the job's median step: 100 ms (step_p50 of each rank)
    return advise(analysis([rank(0, device="cpu"), rank(1, device="cpu")], stragglers=stragglers or [],
                           temporal=t.to_dict()))


def test_a_late_straggler_is_a_finding_with_its_step_and_saving() -> None:
    t = temporal.analyze(job(extra=lambda s, r: {"fwd": 30} if s >= 40 and r == 1 else None, noise=0.02))
    assert t is not None
    a = _advised(t)
    (f,) = [f for f in a.findings if f.lever == "straggler"]
    c = t.changes[0]
    assert f.ranks == [1] and f.title.startswith("from step 40 on, rank 1 holds the others back")
    # back to the level before: 1 - before / after, about 1 - 100/130 = 23%
    assert f.est_saving_pct == pytest.approx(round(100 * (1 - c.before_us / c.after_us), 1))
    assert 20 < f.est_saving_pct < 26 and f.severity == "medium"
    # the whole-run straggler test named that rank already: no second finding
    from pardiag.analysis import Straggler

    named = _advised(t, [Straggler(rank=1, excess_us_per_step=30 * MS, cause="forward", evidence=["x"],
                                   held_us_per_step=30 * MS)])
    assert [f.title.startswith("from step") for f in named.findings if f.lever == "straggler"] == [False]


def test_periodic_garbage_collection_is_a_finding_and_a_checkpoint_a_notice() -> None:
    gc_run = temporal.analyze(job(extra=lambda s, r: {"gc": 200} if r == 1 and s in (15, 30, 45) else None,
                                  noise=0.02))
    assert gc_run is not None
    (f,) = [f for f in _advised(gc_run).findings if f.lever == "garbage_collection"]
    # 200 ms every 15 steps: 13.3 ms per step of a 100 ms median step
    assert f.est_saving_pct == pytest.approx(100 * gc_run.periodic[0].excess_us / 15 / (100 * MS), abs=0.05)
    assert 12.5 < f.est_saving_pct < 14.5 and f.ranks == [1]
    assert f.title == "every 15 steps a 200 ms pause for garbage collection on rank 1 holds the job"
    ckpt = temporal.analyze(job(extra=lambda s, r: {"untimed": 500} if s and s % 10 == 0 else None, noise=0.02))
    assert ckpt is not None
    assert not [f for f in _advised(ckpt).findings if f.lever in ("garbage_collection", "straggler")]
    from pardiag.analyzers.temporal_rules import notices

    (n,) = notices(ckpt.to_dict())
    assert n.message.startswith("every 10 steps a 500 ms pause (all ranks; outside the timed phases") and \
        n.message.endswith("5 times")


def test_a_late_straggler_split_in_two_levels_is_still_persistent() -> None:
    # rank 1: +30 ms from step 40, +45 ms from step 50 (100 -> 130 -> 145 ms): two changes;
    # the first is persistent (no later level back halfway to 100), the saving against
    # the lower of its level and the last: 1 - 100 / 130
    t = temporal.analyze(job(n=80, extra=lambda s, r: ({"fwd": 45} if s >= 50 else {"fwd": 30}) if s >= 40 and r == 1
                             else None, noise=0.02))
    assert t is not None and [c.step for c in t.changes] == [40, 50]
    (f,) = [f for f in _advised(t).findings if f.lever == "straggler"]
    c = t.changes[0]
    assert f.title.startswith("from step 40 on, rank 1") and c.until == 49
    assert f.est_saving_pct == pytest.approx(round(100 * (1 - c.before_us / c.after_us), 1))
    # a slowdown that ends (back to 100 ms at step 60) is not a late straggler
    ended = temporal.analyze(job(n=80, extra=lambda s, r: {"fwd": 30} if 40 <= s < 60 and r == 1 else None,
                                 noise=0.02))
    assert ended is not None and not [f for f in _advised(ended).findings if f.lever == "straggler"]
    from pardiag.analyzers.temporal_rules import notices

    said = [n.message for n in notices(ended.to_dict())]
    assert said[0].startswith("from step 40 to step 59 the job's step was") and \
        "with rank 1 holding the others back; what grew: forward" in said[0], said


def test_lateness_is_the_others_median_less_its_own() -> None:
    # one step, three ranks waiting 50, 60 and 80 ms in backward: rank 0's others' median
    # is 70 (late 20), rank 1's 65 (5), rank 2's 55 (-25: it waited for the others)
    recs = {r: [parse({"v": 2, "step": 3, "dur_us": 100 * MS, "pardiag_us": 0.0, "bwd_us": w * MS})]
            for r, w in ((0, 50), (1, 60), (2, 80))}
    late = temporal._lateness(recs)
    assert {r: late[r][3] for r in late} == pytest.approx({0: 20 * MS, 1: 5 * MS, 2: -25 * MS})


def test_a_long_wide_run_is_stored_bounded() -> None:
    # 40 ranks x 12,000 steps, a 15% slowdown on all ranks from step 6,000: found, and the
    # block stays within its bounds (4,000 points per series, 32 ranks of lateness)
    rng = random.Random(1)
    recs = {r: [parse({"v": 2, "step": s, "pardiag_us": 0.0, "dur_us": (100 if s < 6000 else 115) * MS * (1 + rng.uniform(-.02, .02)),
                       "bwd_us": 50 * MS * (1 + rng.uniform(-.1, .1))}) for s in range(12_000)] for r in range(40)}
    t = temporal.analyze(recs)
    assert t is not None and [c.step for c in t.changes] == [6000]
    d = t.to_dict()
    assert len(d["steps"]) == len(d["job_step_us"]) <= temporal.STORED_STEPS
    assert len(d["late_us"]) == temporal.STORED_RANKS and all(len(v) <= temporal.STORED_STEPS for v in d["late_us"].values())


def test_late_stretches_run_until_a_level_comes_back_halfway() -> None:
    # persistent from step 40; split in two levels (130 then 145 ms): one stretch to the end;
    # a slowdown that ends at step 60: the stretch 40-59
    persistent = temporal.analyze(job(extra=lambda s, r: {"fwd": 30} if s >= 40 and r == 1 else None, noise=0.02))
    split = temporal.analyze(job(n=80, extra=lambda s, r: ({"fwd": 45} if s >= 50 else {"fwd": 30})
                                 if s >= 40 and r == 1 else None, noise=0.02))
    ended = temporal.analyze(job(n=80, extra=lambda s, r: {"fwd": 30} if 40 <= s < 60 and r == 1 else None,
                                 noise=0.02))
    assert persistent is not None and split is not None and ended is not None
    assert persistent.late_stretches() == [(1, 40, None)]
    assert split.late_stretches() == [(1, 40, None), (1, 50, None)]
    assert ended.late_stretches() == [(1, 40, 59)]
    # no rank's: no stretch (the pause on all ranks of the checkpoint test, a slowdown on all)
    both = temporal.analyze(job(extra=lambda s, r: {"fwd": 30} if s >= 40 else None, noise=0.02))
    assert both is not None and len(both.changes) == 1 and both.late_stretches() == []


# rank 1's lateness (ms; negative: rank 0 was the later) in the steps before a late
# straggler of 30 ms, as in a recording of examples/scenarios/late_straggler.py: rank 1
# a little later in most steps, not by a steady amount
BEFORE_MS = [0.4, 3.6, -0.5, 1.2, 3.9, 0.3, 2.8, 0.9, 3.7, -0.4, 1.5, 3.8, 0.6, 2.2, 4.0, 0.2, 1.0]
AFTER_MS = [30.7, 30.4, 30.5, 30.4, 30.5, 30.2, 29.9, 30.5, 27.2, 28.9, 30.5, 32.3, 32.3, 30.3, 30.2]


def _late_run(before: list[float], after: list[float]) -> dict[int, list]:
    """Two ranks of 5 ms steps (forward 1, backward 2 with its wait, optimizer 0.5): per
    step the later rank does its lateness as work outside the timed phases."""
    out: dict[int, list] = {0: [], 1: []}
    for s, d in enumerate(before + after):
        own = {0: max(-d, 0.0), 1: max(d, 0.0)}
        slowest = max(own.values())
        for r in (0, 1):
            out[r].append(parse({"v": 2, "step": s, "dur_us": (5 + slowest) * MS, "pardiag_us": 0.0,
                                 "data_us": 0.1 * MS, "fwd_us": 1 * MS, "bwd_us": (2 + slowest - own[r]) * MS,
                                 "opt_us": 0.5 * MS, "backwards": 1}))
    return out


def test_the_whole_run_straggler_test_leaves_a_late_stretch_out() -> None:
    """17 steps before the change, 15 after; step 0 does not count (`counted`). A median
    over the 31 counted steps is their 16th value, on the edge between the two levels:
    4.0 ms, the largest before, and its 95% interval spans both (2.8 to 30.2 ms). Over the
    16 counted steps before, rank 1's median lateness is 1.35 ms, under the noise the run
    shows (its steps wander by more): no whole-run straggler. The late stretch is the
    late finding's, with the saving back at the level before."""
    from pardiag.analysis import Straggler
    from pardiag.analyzers.pipeline import _left_out_said, _outside
    from pardiag.analyzers.stragglers import find_stragglers
    from factories import jsonl_evidence as jsonl

    recs = _late_run(BEFORE_MS, AFTER_MS)
    t = temporal.analyze(recs)
    assert t is not None and [(c.step, c.rank, c.until) for c in t.changes] == [(17, 1, None)]
    late = t.late_stretches()
    assert late == [(1, 17, None)]
    (mixed,) = find_stragglers(jsonl(recs))  # what the whole-run test said with every step
    assert mixed.rank == 1 and mixed.held_us_per_step == pytest.approx(4.0 * MS)
    kept = {r: _outside(v, late) for r, v in recs.items()}
    assert [rec.step for rec in kept[0]] == list(range(17))
    assert find_stragglers(jsonl(kept)) == []
    (f,) = [f for f in _advised(t).findings if f.lever == "straggler"]
    assert f.title.startswith("from step 17 on, rank 1 holds the others back")
    # the job's step is 5 ms + the lateness of the later rank: medians 5 + (1.2 + 1.5) / 2 =
    # 6.35 ms before (steps 1-16) and 5 + 30.4 after: 1 - 6.35 / 35.4 = 82.1%
    assert t.changes[0].before_us == pytest.approx(6.35 * MS) and t.changes[0].after_us == pytest.approx(35.4 * MS)
    assert f.est_saving_pct == pytest.approx(82.1)
    # a straggler timed over steps.jsonl was timed outside the stretch: both findings; one
    # the profiled window named for at least half the change says the same: one
    jsonl_named = Straggler(rank=1, excess_us_per_step=2 * MS, cause="forward", evidence=["x"],
                            held_us_per_step=2 * MS, held_from="steps.jsonl")
    assert sorted(f.title[:9] for f in _advised(t, [jsonl_named]).findings if f.lever == "straggler") == \
        ["from step", "rank 1 is"]
    window_named = Straggler(rank=1, excess_us_per_step=29 * MS, cause="forward", evidence=["x"],
                             held_us_per_step=29 * MS, held_from="profiled window")
    assert [f.title[:9] for f in _advised(t, [window_named]).findings if f.lever == "straggler"] == ["rank 1 is"]
    # the straggler's evidence says which steps it left out
    said = _left_out_said(jsonl_named, late).evidence[-1]
    assert said == "left out of these medians: steps 17 on (rank 1 late from step 17), said on their own"


def test_a_late_stragglers_saving_is_left_out_of_the_what_if() -> None:
    """Its saving, 1 - 100 / 130, is of the steps after step 40, not of the job's median
    step: the what-if (a projection of the median step) leaves it out; with a finding on
    the median step beside it, only that one counts."""
    from pardiag.analysis import Finding
    from pardiag.analyzers.levers import what_if

    t = temporal.analyze(job(extra=lambda s, r: {"fwd": 30} if s >= 40 and r == 1 else None, noise=0.02))
    assert t is not None
    a = _advised(t)
    (late,) = [f for f in a.findings if f.lever == "straggler"]
    assert late.action["basis_step_us"] == pytest.approx(t.changes[0].after_us, abs=0.1)
    assert a.what_if is None
    other = Finding(lever="dataloader", severity="medium", title="input", evidence=["x"], ranks=[0],
                    est_saving_pct=20.0, action={"text": "more workers"})
    w = what_if(100 * MS, [late, other])
    assert w is not None and [r.lever for r in w.findings] == ["dataloader"]
    assert w.all_step_us == pytest.approx(80 * MS) and w.all_saving_pct == 20.0
