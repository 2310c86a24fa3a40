"""Interval arithmetic, on cases worked out by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pardiag.analyzers.intervals import (
    intersection_length,
    subtract_length,
    total_length,
    union,
)


def _pairs(starts: list[float], ends: list[float]) -> list[tuple[float, float]]:
    s, e = union(starts, ends)
    return list(zip(s.tolist(), e.tolist()))


@pytest.mark.parametrize(
    ("starts", "ends", "merged"),
    [
        ([], [], []),
        ([3], [7], [(3, 7)]),
        ([5, 0], [8, 3], [(0, 3), (5, 8)]),  # disjoint, given out of order
        ([0, 2], [3, 4], [(0, 4)]),  # overlapping
        ([0, 5], [5, 8], [(0, 8)]),  # touching intervals merge (HTA)
        ([0, 2], [10, 3], [(0, 10)]),  # nested
        ([0, 1, 2, 20], [10, 11, 12, 25], [(0, 12), (20, 25)]),  # chain
        ([4, 4, 4], [5, 9, 6], [(4, 9)]),  # same start
        ([0.5, 1.25], [1.0, 2.0], [(0.5, 1.0), (1.25, 2.0)]),  # floats
    ],
)
def test_union(starts: list[float], ends: list[float], merged: list[tuple[float, float]]) -> None:
    assert _pairs(starts, ends) == merged


def test_total_length() -> None:
    assert total_length([], []) == 0.0
    assert total_length([5, 0, 2], [8, 3, 4]) == 7  # [0,4] + [5,8]
    assert total_length([0, 0], [10, 10]) == 10  # duplicates count once


def test_degenerate_interval_is_kept_like_hta() -> None:
    # [5, 4] has end < start (HTA's ns rounding of a sub-microsecond kernel); on its
    # own it forms a group of length -1, as in HTA's merge_kernel_intervals.
    assert _pairs([0, 5], [3, 4]) == [(0, 3), (5, 4)]
    assert total_length([0, 5], [3, 4]) == 2
    # inside another interval it disappears
    assert total_length([0, 5], [10, 4]) == 10


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        (([0], [10]), ([5], [15]), 5),
        (([0, 4], [2, 6]), ([1], [5]), 2),  # [1,2] + [4,5]
        (([0], [5]), ([5], [10]), 0),  # touching only
        (([0], [10]), ([2, 3], [4, 8]), 6),  # b merges to [2,8] first
        (([0], [10]), ([], []), 0),
        (([0, 0], [4, 4]), ([2], [3]), 1),  # duplicates in a
        (([20], [30]), ([0], [10]), 0),
    ],
)
def test_intersection_length(a: tuple[list[float], list[float]],
                             b: tuple[list[float], list[float]], both: float) -> None:
    a_arr = (np.array(a[0]), np.array(a[1]))
    b_arr = (np.array(b[0]), np.array(b[1]))
    assert intersection_length(a_arr, b_arr) == both
    assert intersection_length(b_arr, a_arr) == both


def test_subtract_length() -> None:
    a = (np.array([0]), np.array([10]))
    b = (np.array([2, 5]), np.array([3, 7]))
    assert subtract_length(a, b) == 10 - 1 - 2
    assert subtract_length(b, a) == 0
    assert subtract_length(a, (np.array([]), np.array([]))) == 10


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError):
        union([1, 2], [3])


def test_against_unit_cells() -> None:
    """Random integer intervals against a brute-force count of covered unit cells."""
    rng = random.Random(7)
    for _ in range(200):
        n, m = rng.randint(0, 8), rng.randint(0, 8)
        a = [(s, s + rng.randint(1, 6)) for s in (rng.randint(0, 30) for _ in range(n))]
        b = [(s, s + rng.randint(1, 6)) for s in (rng.randint(0, 30) for _ in range(m))]
        cells_a = {t for s, e in a for t in range(s, e)}
        cells_b = {t for s, e in b for t in range(s, e)}
        arr_a = (np.array([s for s, _ in a], dtype=np.int64), np.array([e for _, e in a]))
        arr_b = (np.array([s for s, _ in b], dtype=np.int64), np.array([e for _, e in b]))
        assert total_length(*arr_a) == len(cells_a)
        assert intersection_length(arr_a, arr_b) == len(cells_a & cells_b)
        assert subtract_length(arr_a, arr_b) == len(cells_a - cells_b)


def test_whole_number_overlaps_are_the_sweeps_to_the_last_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole-number boundaries take the cumulative-coverage way; it must give the sweep's
    result exactly (forced here by offsetting one set by half a unit and back: the sweep
    runs on the fractional copy)."""
    from pardiag.analyzers import intervals as iv

    calls: list[int] = []
    real = iv._covered_by
    monkeypatch.setattr(iv, "_covered_by", lambda b_s, b_e: (calls.append(1), real(b_s, b_e))[1])
    rng = np.random.default_rng(5)
    for trial in range(200):
        n, m = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        a_s = rng.integers(0, 10_000, n)
        a_e = a_s + rng.integers(0, 200, n)
        b_s = rng.integers(0, 10_000, m).astype(np.float64)
        b_e = b_s + rng.integers(0, 200, m)
        fast = iv.intersection_length((a_s, a_e), (b_s, b_e))
        # the sweep on the same sets scaled by 0.5 (exact), made fractional, then scaled back
        sweep = 2 * iv.intersection_length((a_s / 2 + 0.25, a_e / 2 + 0.25), (b_s / 2 + 0.25, b_e / 2 + 0.25))
        brute = sum(max(0, min(ae, be) - max(as_, bs)) for as_, ae in zip(*iv.union(a_s, a_e))
                    for bs, be in zip(*iv.union(b_s, b_e)))
        assert fast == sweep == brute, trial
        merged = iv.intersection_length(iv.union(a_s, a_e), iv.union(b_s, b_e), merged=True)
        assert merged == fast
    assert len(calls) == 400  # whole numbers took the coverage way every time, fractions never
