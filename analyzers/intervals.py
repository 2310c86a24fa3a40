"""Vectorised interval arithmetic on numpy arrays (sort + cumulative-max merge).

An interval set is a pair of equal-length arrays ``(starts, ends)``; the intervals
may overlap and come in any order. Every function here works on whole arrays at once
(no Python loop over intervals), so a million kernels cost milliseconds.

The merge follows HTA's ``merge_kernel_intervals`` exactly, so that numbers computed
here agree with HTA to the microsecond:

* sort by start (numpy's default ``quicksort``, as pandas' ``sort_values`` uses);
* an interval opens a new group when its start is *strictly* greater than the
  largest end seen so far, so touching intervals (``[0, 5]`` and ``[5, 8]``) merge;
* a group spans from its first start to the largest end inside it.

Degenerate intervals (``end < start``, which HTA's nanosecond rounding produces for
sub-microsecond kernels) are kept as they are, as HTA keeps them; callers that want
them gone filter before calling.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import numpy.typing as npt

# Integer or float timestamps: the arithmetic works on either, so the dtype stays open
Array = npt.NDArray[Any]
Intervals = tuple[Array, Array]


def union(starts: npt.ArrayLike, ends: npt.ArrayLike, presorted: bool = False) -> Intervals:
    """Merge overlapping or touching intervals; the result is sorted by start
    (``presorted``: the starts are sorted already, and no sorted copy is made).

    >>> union([5, 0, 2], [8, 3, 4])
    (array([0, 5]), array([4, 8]))
    """
    s = np.asarray(starts)
    e = np.asarray(ends)
    if s.shape != e.shape or s.ndim != 1:
        raise ValueError("starts and ends must be 1-d arrays of the same length")
    if s.size == 0:
        return s.copy(), e.copy()
    if presorted:
        end = e.copy()
    else:
        order = np.argsort(s, kind="quicksort")
        s = s[order]
        end = e[order]
        del order  # (each temporary let go once used: these run on every kernel of a trace)
    # the running maximum of the ends, in place: a group's end is its value at the group's
    # last interval (the groups before end before the group starts)
    np.maximum.accumulate(end, out=end)
    opens = np.empty(s.size, dtype=bool)
    opens[0] = True
    np.greater(s[1:], end[:-1], out=opens[1:])
    closes = np.empty(s.size, dtype=bool)  # the last interval of each group
    closes[:-1] = opens[1:]
    closes[-1] = True
    return s[opens], end[closes]


def total_length(starts: npt.ArrayLike, ends: npt.ArrayLike) -> float:
    """Length of the union of the intervals (time covered at least once).

    Computed as ``sum(ends) - sum(starts)`` over the merged groups, like HTA.
    """
    us, ue = union(starts, ends)
    if us.size == 0:
        return 0.0
    return float(ue.sum() - us.sum())


def intersection_length(a: Intervals, b: Intervals, merged: bool = False) -> float:
    """Time covered by both interval sets (each set is merged first; ``merged``: they are
    `union` results already).

    A sweep over the merged boundaries: entering/leaving ``a`` adds ±1, entering/
    leaving ``b`` adds ±2; time spent at level 3 is covered by both (HTA's
    ``get_comm_comp_overlap``). The order of equal timestamps does not change the
    result: only the level after the last of equal timestamps spans any time. Where
    every boundary is a whole number (microsecond traces) the same sum is taken without
    the sweep's sorted copy of all boundaries (`_covered_by`): whole numbers add up
    exactly in any order, so the result is the sweep's to the last bit.
    """
    a_s, a_e = (np.asarray(a[0]), np.asarray(a[1])) if merged else union(*a)
    b_s, b_e = (np.asarray(b[0]), np.asarray(b[1])) if merged else union(*b)
    if a_s.size == 0 or b_s.size == 0:
        return 0.0
    if all(_whole(x) for x in (a_s, a_e, b_s, b_e)):
        covered = _covered_by(b_s, b_e)
        return float(np.sum(covered(a_e) - covered(a_s)))
    times = np.concatenate([a_s, a_e, b_s, b_e])
    steps = np.concatenate(
        [
            np.full(a_s.size, 1, dtype=np.int8),
            np.full(a_e.size, -1, dtype=np.int8),
            np.full(b_s.size, 2, dtype=np.int8),
            np.full(b_e.size, -2, dtype=np.int8),
        ]
    )
    del a_s, a_e, b_s, b_e
    order = np.argsort(times, kind="stable")
    times = times[order]
    # the level is 0 to 3 at every point: int8 holds its running sum
    level = np.cumsum(steps[order], dtype=np.int8)
    del order, steps
    both = level[:-1] == 3
    del level
    return float(np.sum(times[1:][both] - times[:-1][both]))


def _whole(x: npt.NDArray[Any]) -> bool:
    """Whether every value is a whole number under 2**52 (exact in float64 sums)."""
    if x.dtype.kind in "iu":
        return bool(x.size == 0 or (int(np.abs(x).max()) < 2**52))
    return bool(np.all(np.isfinite(x)) and np.abs(x).max() < 2.0**52 and np.array_equal(x, np.floor(x)))


def _covered_by(b_s: npt.NDArray[Any], b_e: npt.NDArray[Any]) -> Callable[[npt.NDArray[Any]], npt.NDArray[np.float64]]:
    """``t -> `` the time before ``t`` covered by the merged, sorted intervals ``b``."""
    before = np.zeros(b_s.size + 1, dtype=np.float64)  # covered before each interval starts
    np.cumsum(b_e - b_s, out=before[1:])

    def covered(t: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        i = np.searchsorted(b_s, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        inside = np.minimum(t, b_e[j]) - b_s[j]
        return np.where(i > 0, before[j] + inside, 0.0)

    return covered


def subtract_length(a: Intervals, b: Intervals) -> float:
    """Time covered by ``a`` and not by ``b``."""
    return total_length(*a) - intersection_length(a, b)
