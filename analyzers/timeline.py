"""Disjoint attribution of a time window to labelled layers of intervals.

Several kinds of activity overlap in time (compute, communication, input loading);
a breakdown must give every microsecond of the window to exactly one of them. The
window is cut at every interval boundary into elementary segments; each segment goes
to the first layer (in priority order) that covers it, or is a gap. Gaps can instead
inherit the label of the segment before them (a host thread blocked after a phase
still belongs to that phase).

All of it is vectorised: sort, searchsorted, no loop over intervals.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt

from pardiag.analyzers.intervals import Intervals, union

F64 = npt.NDArray[np.float64]


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """Intervals cut to [lo, hi]; empty ones dropped."""
    s = np.clip(np.asarray(iv[0], dtype=np.float64), lo, hi)
    e = np.clip(np.asarray(iv[1], dtype=np.float64), lo, hi)
    keep = e > s
    return s[keep], e[keep]


class Windowed:
    """An interval set sorted by start, from which the intervals that may overlap a
    window are taken by two binary searches instead of a pass over all of them (a
    per-step loop over a trace of N events and S steps costs N log N, not S x N)."""

    def __init__(self, iv: Intervals) -> None:
        starts = np.asarray(iv[0], dtype=np.float64)
        order = np.argsort(starts, kind="stable")
        self.starts = starts[order]
        self.ends = np.asarray(iv[1], dtype=np.float64)[order]
        # the largest end so far (NaN ignored): every interval before the first one whose
        # running end passes a window's start ends before it
        self.reach = np.fmax.accumulate(self.ends) if self.ends.size else self.ends

    def within(self, lo: float, hi: float) -> Intervals:
        """The intervals that start before ``hi`` from the first whose running end
        passes ``lo``: every one that overlaps [lo, hi], and some that `clip` drops."""
        a = int(np.searchsorted(self.reach, lo, side="right"))
        b = int(np.searchsorted(self.starts, hi, side="left"))
        b = max(a, b)
        return self.starts[a:b], self.ends[a:b]


def _covered(merged: Intervals, points: F64) -> npt.NDArray[np.bool_]:
    starts, ends = merged
    if starts.size == 0:
        return np.zeros(points.size, dtype=bool)
    idx = np.searchsorted(starts, points, side="right") - 1
    ok = idx >= 0
    out = np.zeros(points.size, dtype=bool)
    out[ok] = ends[idx[ok]] > points[ok]
    return out


def coverage(window: tuple[float, float], layers: Sequence[Intervals]) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Lengths of the window's elementary segments, and which layers cover each
    (a K x N boolean matrix for K layers)."""
    cuts, cov = coverage_cuts(window, layers)
    return (np.diff(cuts) if cuts.size else np.empty(0)), cov


def coverage_cuts(window: tuple[float, float], layers: Sequence[Intervals]) -> tuple[F64, npt.NDArray[np.bool_]]:
    """``coverage`` with the segments' bounds instead of their lengths: N + 1 cuts for N
    segments (none for an empty window)."""
    lo, hi = window
    merged = [union(*clip(iv, lo, hi)) for iv in layers]
    bounds = [np.array([lo, hi], dtype=np.float64)]
    for s, e in merged:
        bounds += [s.astype(np.float64), e.astype(np.float64)]
    cuts = np.unique(np.concatenate(bounds))
    if cuts.size < 2 or hi <= lo:
        return np.empty(0), np.zeros((len(layers), 0), dtype=bool)
    mid = (cuts[:-1] + cuts[1:]) / 2
    cov = np.array([_covered(m, mid) for m in merged], dtype=bool).reshape(len(layers), mid.size)
    return cuts, cov


def segments(window: tuple[float, float], layers: Sequence[Intervals]) -> tuple[F64, npt.NDArray[np.int64]]:
    """Elementary segment lengths and the label of each: the index of the first layer
    in `layers` covering it, -1 for a gap."""
    length, cov = coverage(window, layers)
    label = np.full(length.size, -1, dtype=np.int64)
    for k in range(len(layers) - 1, -1, -1):  # lowest priority first, overwritten by higher
        label[cov[k]] = k
    return length, label


def attribute(
    window: tuple[float, float], layers: Sequence[Intervals], fill_gaps: bool = False
) -> tuple[list[float], float]:
    """Time of the window given to each layer, and the time left as gaps.

    With `fill_gaps`, a gap goes to the label of the segment before it (a gap at the
    very start of the window stays a gap). The results sum to the window's length.
    """
    length, label = segments(window, layers)
    if label.size == 0:
        return [0.0] * len(layers), max(window[1] - window[0], 0.0)
    if fill_gaps:
        label = forward_fill(label)
    totals = np.bincount(label[label >= 0], weights=length[label >= 0], minlength=len(layers))
    gap = float(length[label < 0].sum())
    return [float(x) for x in totals[: len(layers)]], gap


def forward_fill(label: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Replace -1 by the last label before it (leading -1 stay)."""
    idx = np.where(label >= 0, np.arange(label.size), -1)
    np.maximum.accumulate(idx, out=idx)
    out = np.where(idx >= 0, label[np.maximum(idx, 0)], -1)
    return out.astype(np.int64)
