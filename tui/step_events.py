"""The profiled steps of the Analysis' ``step_timeline`` block as the timeline screen
draws them: per step, each rank's runs of the breakdown's categories on one clock and the
step's collectives matched across ranks. An Analysis written before the block held
``steps`` gives its one (middle) step, without collectives; what a newer or broken writer
put in the block that is not numbers where numbers belong is left out, never raised."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pardiag import style

CATEGORIES = tuple(style.CATEGORY_LABELS)


@dataclass(frozen=True)
class RankEvents:
    rank: int
    segments: tuple[tuple[float, float, str], ...]  # (start_us, end_us, category) in time order

    @property
    def end_us(self) -> float:
        return self.segments[-1][1] if self.segments else 0.0

    @cached_property
    def _covered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """starts, ends, category index of each run, and per category the time its runs
        before each run cover (one row per category, one column per run and one more)."""
        starts = np.array([s for s, _, _ in self.segments], dtype=float)
        ends = np.array([e for _, e, _ in self.segments], dtype=float)
        kinds = np.array([CATEGORIES.index(c) for _, _, c in self.segments], dtype=int)
        cum = np.zeros((len(CATEGORIES), len(self.segments) + 1))
        for k in range(len(CATEGORIES)):
            cum[k, 1:] = np.cumsum(np.where(kinds == k, ends - starts, 0.0))
        return starts, ends, kinds, cum

    def covered_until(self, t: np.ndarray) -> np.ndarray:
        """Per category (rows), the time its runs cover from the first run to each ``t``."""
        starts, ends, kinds, cum = self._covered
        i = np.searchsorted(starts, t, side="right") - 1  # the run starting at or before t
        inside = i >= 0
        j = np.where(inside, i, 0)
        part = np.where(inside, np.clip(np.minimum(t, ends[j]) - starts[j], 0.0, None), 0.0)
        out = np.where(inside, cum[:, j], 0.0)
        for k in range(len(CATEGORIES)):
            out[k] += np.where(inside & (kinds[j] == k), part, 0.0)
        return out

    def cells(self, start_us: float, cell_us: float, n: int) -> list[str | None]:
        """The category of each of ``n`` cells from ``start_us``, ``cell_us`` each: the one
        covering most of the cell (of two covering as much: the first in the legend);
        None where more of the cell is uncovered than any category covers."""
        if not self.segments or n <= 0:
            return [None] * max(n, 0)
        edges = start_us + cell_us * np.arange(n + 1)
        cover = np.diff(self.covered_until(edges), axis=1)  # categories x cells
        best = cover.argmax(axis=0)
        most = cover.max(axis=0)
        uncovered = cell_us - cover.sum(axis=0)
        return [CATEGORIES[b] if m > 0 and m >= u else None for b, m, u in zip(best.tolist(), most.tolist(),
                                                                                 uncovered.tolist())]


@dataclass(frozen=True)
class Part:
    """One rank's part in a collective: it arrived at ``start_us``, waited ``wait_us``,
    moved data for ``transfer_us``, ended at ``end_us``."""

    rank: int
    start_us: float
    end_us: float
    wait_us: float
    transfer_us: float


@dataclass(frozen=True)
class StepCollective:
    op: str
    process_group: str
    bytes: int | None
    parts: tuple[Part, ...]  # in rank order


@dataclass(frozen=True)
class ProfiledStep:
    step: int
    ranks: tuple[RankEvents, ...]
    collectives: tuple[StepCollective, ...]

    @property
    def span_us(self) -> float:
        """To the last rank's end of the step, or a collective's end past it (one issued
        in the step may end in the next)."""
        ends = [r.end_us for r in self.ranks] + [p.end_us for c in self.collectives for p in c.parts]
        return max(ends, default=0.0)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _rank(row: Any) -> RankEvents | None:
    if not isinstance(row, dict) or type(row.get("rank")) is not int or not isinstance(row.get("segments"), list):
        return None
    segs = tuple((float(s[0]), float(s[1]), s[2]) for s in row["segments"]
                 if isinstance(s, list) and len(s) == 3 and _number(s[0]) and _number(s[1])
                 and s[2] in style.CATEGORY_LABELS and s[1] > s[0])
    return RankEvents(row["rank"], segs)


def _collective(c: Any) -> StepCollective | None:
    if not isinstance(c, dict) or not isinstance(c.get("members"), list):
        return None
    keys = ("start_us", "end_us", "wait_us", "transfer_us")
    parts = tuple(Part(m["rank"], *(float(m[k]) for k in keys)) for m in c["members"]
                  if isinstance(m, dict) and type(m.get("rank")) is int and all(_number(m.get(k)) for k in keys))
    if not parts:
        return None
    size = c.get("bytes")
    return StepCollective(str(c.get("op", "?")), str(c.get("process_group", "?")),
                          size if type(size) is int else None, parts)


def _step(entry: Any) -> ProfiledStep | None:
    if not isinstance(entry, dict) or type(entry.get("step")) is not int or not isinstance(entry.get("ranks"), list):
        return None
    ranks = tuple(r for r in map(_rank, entry["ranks"]) if r is not None)
    colls = entry.get("collectives")
    collectives = tuple(c for c in map(_collective, colls if isinstance(colls, list) else ()) if c is not None)
    return ProfiledStep(entry["step"], ranks, collectives) if ranks else None


def profiled_steps(block: Any) -> list[ProfiledStep]:
    """Every profiled step the block holds, in step order ([] without a block)."""
    if not isinstance(block, dict):
        return []
    entries = block.get("steps") if isinstance(block.get("steps"), list) else [block]
    return sorted((s for s in map(_step, entries) if s is not None), key=lambda s: s.step)
