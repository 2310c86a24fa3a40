"""The extra profiler window a slowdown triggered (collectors/slowdown.py), against the
first: per rank, each category of the time breakdown and each phase per profiled
step in both windows, and what grew most.

Both windows are cut and measured as the first always is (analyzers/rank_trace.py,
the same disjoint categories: compute, communication exposed or hidden, copies,
input, idle; the phases), so their difference per step says where the slower steps
spent their extra time: "rank 1: idle +28.4 ms per step" is a rank that waits (for
another, or on its host), "compute +12 ms" one whose work grew.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pardiag.analysis import RankResult
from pardiag.style import CATEGORY_LABELS

TOP = 3  # the largest growths named
NAMED = 0.05  # ... each at least this share of the second window's step


def _per_step(r: RankResult, d: Mapping[str, float]) -> dict[str, float]:
    n = r.steps_profiled
    return {k: v / n for k, v in d.items()} if n else {}


def compare(first: Sequence[RankResult], second: Sequence[RankResult], meta: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The `extra_window` block: None without a second window with profiled steps."""
    by_rank = {r.rank: r for r in first}
    ranks: dict[str, Any] = {}
    grew: list[tuple[float, int, str, str]] = []
    for r2 in second:
        r1 = by_rank.get(r2.rank)
        if r1 is None or not r1.steps_profiled or not r2.steps_profiled:
            continue
        b1, b2 = _per_step(r1, r1.breakdown_us), _per_step(r2, r2.breakdown_us)
        p1, p2 = _per_step(r1, r1.phases_us), _per_step(r2, r2.phases_us)
        ranks[str(r2.rank)] = {
            "step_us": [round(r1.window_us / r1.steps_profiled, 1), round(r2.window_us / r2.steps_profiled, 1)],
            "breakdown_us": {k: [round(b1.get(k, 0.0), 1), round(v, 1)] for k, v in b2.items()},
            "phases_us": {k: [round(p1.get(k, 0.0), 1), round(v, 1)] for k, v in p2.items()},
        }
        for k, v in b2.items():
            grew.append((v - b1.get(k, 0.0), r2.rank, "category", k))
        for k, v in p2.items():
            grew.append((v - p1.get(k, 0.0), r2.rank, "phase", k))
    if not ranks:
        return None
    info = next((m for m in meta.values() if m), {})
    steps2 = sorted(v["step_us"][1] for v in ranks.values())
    floor = NAMED * steps2[len(steps2) // 2]
    top = [{"rank": r, "kind": kind, "what": k, "us": round(d, 1)}
           for d, r, kind, k in sorted(grew, key=lambda g: (-g[0], g[1], g[3]))
           if d > 0 and d >= floor and kind == "category"][:TOP]
    return {"steps": list(info.get("steps_recorded") or []), "first_step": info.get("first_step"),
            "trigger": next((m.get("trigger") for m in meta.values() if m and m.get("trigger")), None),
            "ranks": ranks, "grew": top}


def words(block: Mapping[str, Any]) -> str | None:
    """One sentence: when the window was recorded, why, and what grew most per step."""
    ranks = block.get("ranks") or {}
    if not ranks:
        return None
    steps = block.get("steps") or []
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "a second window"
    t = block.get("trigger") or {}
    why = (f", after a rank's step rose to {t['ratio']:.1f}x its median ({t['step_us'] / 1000:.1f} against "
           f"{t['median_us'] / 1000:.1f} ms) at step {t['step']}") if t.get("ratio") else ""
    s1 = sorted(v["step_us"][0] for v in ranks.values())
    s2 = sorted(v["step_us"][1] for v in ranks.values())
    grew = ", ".join(f"{CATEGORY_LABELS.get(g['what'], g['what'])} +{g['us'] / 1000:.1f} ms on rank {g['rank']}"
                     for g in block.get("grew") or [])
    return (f"a second profiler window ({span}{why}): the profiled step {s1[len(s1) // 2] / 1000:.1f} → "
            f"{s2[len(s2) // 2] / 1000:.1f} ms (median over ranks)" + (f"; per step, {grew}" if grew else ""))
