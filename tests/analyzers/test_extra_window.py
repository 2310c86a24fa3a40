"""The extra window against the first (analyzers/extra_window.py), on ranks built by
hand: the numbers are worked out below."""

from __future__ import annotations

import pytest

from factories import rank
from pardiag.analyzers import extra_window

MS = 1000.0


def test_what_grew_per_step_and_the_sentence() -> None:
    # first window: 3 steps of 20 ms (60 ms): compute 50%, exposed comm 10%, idle the rest;
    # second: 3 steps of 50 ms (150 ms), rank 1 idle 78% (39 ms per step), rank 0 exposed
    # comm 64% (32 ms per step)
    first = [rank(0, window=60 * MS, steps=3, compute=0.5, comm_exposed=0.1),
             rank(1, window=60 * MS, steps=3, compute=0.5, comm_exposed=0.1)]
    second = [rank(0, window=150 * MS, steps=3, compute=0.2, comm_exposed=0.64),
              rank(1, window=150 * MS, steps=3, compute=0.2, comm_exposed=0.02)]
    meta = {0: {"first_step": 47, "steps_recorded": [49, 50, 51],
                "trigger": {"step": 22, "step_us": 40 * MS, "median_us": 10 * MS, "ratio": 4.0}}, 1: {}}
    b = extra_window.compare(first, second, meta)
    assert b is not None and b["steps"] == [49, 50, 51] and b["trigger"]["step"] == 22
    r1 = b["ranks"]["1"]
    assert r1["step_us"] == [20 * MS, 50 * MS]
    # idle: 60 * 0.4 / 3 = 8 ms, 150 * 0.78 / 3 = 39 ms; rank 0's exposed comm 2 -> 32 ms
    assert r1["breakdown_us"]["idle"] == pytest.approx([8 * MS, 39 * MS])
    assert b["grew"][:2] == [{"rank": 1, "kind": "category", "what": "idle", "us": pytest.approx(31 * MS)},
                             {"rank": 0, "kind": "category", "what": "comm_exposed", "us": pytest.approx(30 * MS)}]
    words = extra_window.words(b)
    assert words is not None and words.startswith(
        "a second profiler window (steps 49-51, after a rank's step rose to 4.0x its median (40.0 against 10.0 ms) "
        "at step 22): the profiled step 20.0 → 50.0 ms (median over ranks); per step, idle +31.0 ms on rank 1")


def test_no_second_window_no_block() -> None:
    first = [rank(0, window=60 * MS, steps=3, compute=0.5)]
    assert extra_window.compare(first, [], {}) is None
    assert extra_window.compare(first, [rank(0, window=0.0, steps=0)], {}) is None
