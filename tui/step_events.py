"""The profiled steps of the Analysis' ``step_timeline`` block as the timeline screen
draws them: per step, each rank's runs of the breakdown's categories on one clock and the
step's collectives matched across ranks. An Analysis written before the block held
``steps`` gives its one (middle) step, without collectives; what a newer or broken writer
put in the block that is not numbers where numbers belong is left out, never raised."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Sequence

from pardiag import style


@dataclass(frozen=True)
class RankEvents:
    rank: int
    segments: tuple[tuple[float, float, str], ...]  # (start_us, end_us, category) in time order

    @property
    def end_us(self) -> float:
        return self.segments[-1][1] if self.segments else 0.0


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


def majority(segments: Sequence[tuple[float, float, str]], starts: Sequence[float],
             t0: float, t1: float) -> str | None:
    """The category covering most of [t0, t1) (of two covering as much: the earlier);
    None where more of it is uncovered than any category covers."""
    cover: dict[str, float] = {}
    i = max(0, bisect_right(starts, t0) - 1)
    while i < len(segments) and segments[i][0] < t1:
        s, e, c = segments[i]
        d = min(e, t1) - max(s, t0)
        if d > 0:
            cover[c] = cover.get(c, 0.0) + d
        i += 1
    if not cover:
        return None
    best = max(cover, key=lambda c: cover[c])
    return best if cover[best] >= (t1 - t0) - sum(cover.values()) else None
