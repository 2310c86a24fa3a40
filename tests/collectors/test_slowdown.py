"""The extra profiler window on a slowdown: the watch (collectors/slowdown.py) with a
store kept in a dict, and a real two-rank job that slows down part-way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, read_json, run_pardiag, torchrun
from pardiag.collectors import slowdown
from pardiag.collectors.slowdown import LEAD, MIN_BASELINE, POLL, SLOW_RATIO, SLOW_STEPS, SlowdownWatch

MS = 1000.0


class Store:
    """What the watch uses of a c10d store: compare_set, check, get."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}
        self.checks = 0

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if self.d.get(key, b"").decode() == expected:
            self.d[key] = desired.encode()
        return self.d[key]

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        return all(k in self.d for k in keys)

    def get(self, key: str) -> bytes:
        return self.d[key]


def watch(store: Store | None) -> SlowdownWatch:
    w = SlowdownWatch(lambda where, e: (_ for _ in ()).throw(e))
    w._store, w._store_tried = store, True
    return w


def test_three_slow_steps_propose_a_window_lead_steps_later_and_every_rank_agrees() -> None:
    store = Store()
    a, b = watch(store), watch(store)
    # both ranks: steps 0-29 at 10 ms; from step 30 rank a sees 14 ms (1.4x > 1.3x)
    for step in range(30):
        assert a.on_step(step, 10 * MS, True) is None and b.on_step(step, 10 * MS, True) is None
    starts = {}
    for step in range(30, 80):
        got_a = a.on_step(step, 14 * MS, True)
        got_b = b.on_step(step, 10 * MS, True)
        if got_a is not None and "a" not in starts:
            starts["a"] = (step, got_a)
        if got_b is not None and "b" not in starts:
            starts["b"] = (step, got_b)
    # the fifth slow step (34) proposes 34 + LEAD; b reads it at its next poll (step 40)
    assert starts["a"] == (30 + SLOW_STEPS - 1, 30 + SLOW_STEPS - 1 + LEAD)
    assert starts["b"] == (40, 34 + LEAD) and 40 < 34 + LEAD
    assert a.trigger == {"step": 34, "step_us": 14 * MS, "median_us": 10 * MS, "ratio": 1.4}
    assert b.trigger is None  # b saw no slowdown itself


def test_the_first_proposal_wins() -> None:
    store = Store()
    a, b = watch(store), watch(store)
    for step in range(20):
        a.on_step(step, 10 * MS, True)
        b.on_step(step, 10 * MS, True)
    for step in range(20, 20 + SLOW_STEPS):
        a.on_step(step, 20 * MS, True)
    assert a.start == 19 + SLOW_STEPS + LEAD
    for step in range(20, 30):  # b slows down later and proposes another start: the store keeps a's
        b.on_step(step, 20 * MS if step >= 25 else 10 * MS, True)
    assert b.start == 19 + SLOW_STEPS + LEAD


def test_no_window_below_the_ratio_nor_before_the_baseline() -> None:
    store = Store()
    w = watch(store)
    # 1.29x for ever: never
    for step in range(100):
        assert w.on_step(step, (12.9 if step >= 40 else 10) * MS, True) is None
    assert SLOW_RATIO == 1.3 and store.d == {}
    # slow from the start: no baseline of MIN_BASELINE steps yet, then the slow level is the baseline
    w2 = watch(Store())
    for step in range(MIN_BASELINE + SLOW_STEPS - 1):
        assert w2.on_step(step, (30 if step >= 2 else 10) * MS, True) is None
    # steps that do not count (disturbed, profiled) are not observed
    w3 = watch(Store())
    for step in range(60):
        w3.on_step(step, (50 if step >= 30 else 10) * MS, False)
    assert w3.start is None


def test_the_store_is_read_once_every_poll_steps() -> None:
    store = Store()
    w = watch(store)
    for step in range(200):
        w.on_step(step, 10 * MS, True)
    assert store.checks == 200 // POLL


def test_one_process_without_a_store_starts_its_own_window() -> None:
    w = watch(None)
    for step in range(20):
        w.on_step(step, 10 * MS, True)
    got = [w.on_step(step, 20 * MS, True) for step in range(20, 20 + SLOW_STEPS)]
    assert got == [None] * (SLOW_STEPS - 1) + [19 + SLOW_STEPS + LEAD]


def test_a_failing_store_stops_the_watch_and_says_why() -> None:
    class Broken(Store):
        def check(self, keys: list[str]) -> bool:
            raise ConnectionError("store gone")

    errors: list[str] = []
    w = SlowdownWatch(lambda where, e: errors.append(where))
    w._store, w._store_tried = Broken(), True
    for step in range(50):
        assert w.on_step(step, 10 * MS, True) is None
    assert w.off == "ConnectionError: store gone" and errors == ["slowdown"]


def replayed_trigger(steps_jsonl: Path) -> int | None:
    """The step at which a watch fed the rank's recorded steps after its first window
    (as the collector feeds it: profiled or disturbed steps do not count) proposes."""
    from pardiag.step_records import DISTURBED_US

    w = SlowdownWatch(lambda where, e: None)
    w._store, w._store_tried = None, True  # one process: its own proposal is the start
    for line in steps_jsonl.read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] < 10 or rec.get("window") == 2:  # the first window is steps 7-9
            continue
        counts = "profiler" not in rec and rec["pardiag_us"] < DISTURBED_US
        if w.on_step(rec["step"], rec.get("dur_us"), counts) is not None:
            return w.trigger["step"] if w.trigger else None
    return None


@pytest.mark.slow
@pytest.mark.timed
@pytest.mark.parametrize("slow_from", [20, 1000])
def test_a_job_that_slows_down_records_a_second_window_on_every_rank(tmp_path: Path, slow_from: int) -> None:
    out = tmp_path / "run"
    # the control's steps are 40 ms of sleep: the scheduler's noise on a busy machine (a few
    # ms) stays well under the 1.3x that proposes a window, as it may not on 10 ms steps
    res = run_pardiag("run", "-q", "--out", str(out), "--", *torchrun(2, SCRIPTS / "slows_down.py"),
                      env={"STEPS": "90", "SLOW_FROM": str(slow_from), "BASE_MS": "10" if slow_from < 90 else "40"})
    assert res.returncode == 0, res.stderr[-2000:]
    metas = {r: read_json(out / "ranks" / str(r) / "meta.json") for r in (0, 1)}
    # the first window's record is its own, whatever the extra one did
    assert all(m["profiler"]["status"] == "ok" and m["profiler"]["steps_recorded"] == [7, 8, 9] for m in metas.values())
    extra = {r: m.get("profiler_extra") for r, m in metas.items()}
    if slow_from == 1000:  # never slows: watched, nothing recorded
        assert all(e and e[0]["status"] == "not needed" for e in extra.values()), extra
        assert not list(out.glob("ranks/*/trace-2*"))
        return
    first = {r: e[0]["first_step"] for r, e in extra.items()}
    # rank 1 slows from step 20 (10 -> 40 ms, both ranks' steps): the fifth slow step, 24, is
    # the earliest that can propose. Which one does depends on how many steps after the first
    # window pardiag disturbed (writing its trace: 1 to 3 on a busy machine), each a step
    # short of MIN_BASELINE: the rule replayed on the rank's own steps.jsonl says which
    triggers = [e[0]["trigger"] for e in extra.values() if e[0].get("trigger")]
    assert triggers and all(19 + SLOW_STEPS <= t["step"] <= 19 + SLOW_STEPS + 3 and t["ratio"] > 2
                            for t in triggers), triggers
    for r, e in extra.items():
        if e[0].get("trigger"):
            assert e[0]["trigger"]["step"] == replayed_trigger(out / "ranks" / str(r) / "steps.jsonl"), (r, e)
    assert first[0] == first[1] == min(t["step"] for t in triggers) + LEAD, extra
    assert all(e[0]["status"] == "ok" and e[0]["steps_recorded"] == [first[0] + 2, first[0] + 3, first[0] + 4]
               for e in extra.values()), extra
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    xw = doc["extra_window"]
    assert xw["steps"] == [first[0] + 2, first[0] + 3, first[0] + 4]
    # the 30 ms rank 1 sleeps: idle on rank 1 (no operator runs), waiting in its collective on rank 0
    top = {(g["rank"], g["what"]): g["us"] for g in xw["grew"]}
    assert top.get((1, "idle"), 0) > 20 * MS and top.get((0, "comm_exposed"), 0) > 20 * MS, xw["grew"]
    assert any(n["message"].startswith("a second profiler window (steps") for n in doc["notices"])
    assert doc["temporal"]["windows"] == [[5, 9], [first[0], first[0] + 4]]
