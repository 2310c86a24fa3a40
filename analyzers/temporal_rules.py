"""Findings that say when (from the Analysis's `temporal` block, analyzers/temporal.py):
a rank that became a straggler part-way through the run, and garbage-collection pauses
that come back every K steps. Other changes and periodic pauses (on all ranks, outside
the timed phases: checkpoints, evaluation) are notices, with their steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pardiag.analysis import Finding, Notice
from pardiag.analyzers.levers import _pct, _severity

if TYPE_CHECKING:  # the registry imports this module
    from pardiag.analyzers.rules import RuleContext

LATE_MIN = 0.10  # a change of at least this share of the new step
LATE_HIGH = 0.25


def _temporal(ctx: RuleContext) -> dict[str, Any]:
    return ctx.analysis.temporal or {}


def late_straggler(ctx: RuleContext) -> list[Finding]:
    """A persistent change point that one rank's lateness explains (a median over all
    steps hides a straggler that started late: the whole-run straggler test leaves its
    steps out, analyzers/pipeline.py `_outside`): persistent when no later level comes
    back halfway to the one before it. A change of at least 10% of the new step, high at
    25%. Saving: the steps after it back at the level before, 1 - before / after (after:
    the lower of its own level and the run's last one). A rank the profiled window named
    for at least half the change is that finding's (the window may lie in the stretch)."""
    named = {s.rank: s.held_us_per_step or 0.0 for s in ctx.analysis.stragglers if s.held_from != "steps.jsonl"}
    out = []
    changes = list(_temporal(ctx).get("change_points", []))
    for i, c in enumerate(changes):
        rank, before, after = c.get("rank"), c.get("before_us") or 0.0, c.get("after_us") or 0.0
        if rank is None or after <= before or before <= 0 or named.get(rank, 0.0) >= 0.5 * (after - before):
            continue
        # persistent: no later level comes back halfway to the one before (a later split of
        # the slow stretch, noise or another change on top, is still it); the saving is
        # taken against the run's last level
        later = changes[i + 1:]
        if any((x.get("after_us") or 0.0) < before + 0.5 * (after - before) for x in later):
            continue
        after = min([after, *((x.get("after_us") or after) for x in later[-1:])])
        share = 1 - before / after
        if share < LATE_MIN:
            continue
        cause = c.get("cause")
        out.append(Finding(
            lever="straggler", severity=_severity(share, LATE_MIN, LATE_HIGH, share),
            title=(f"from step {c['step']} on, rank {rank} holds the others back: the step went from "
                   f"{before / 1000:.1f} to {after / 1000:.1f} ms (+{after / before - 1:.0%}, to the run's end)"
                   + (f"; what grew: {cause}" if cause else "")),
            evidence=[f"the job's median step: {before / 1000:.1f} ms before step {c['step']}, {after / 1000:.1f} ms "
                      "from it to the run's end (change point of steps.jsonl; analyzers/temporal.py)",
                      f"the others' wait for rank {rank} grew by at least half the change from that step on"],
            ranks=[rank], est_saving_pct=_pct(share),
            action={"text": f"rank {rank} slowed down part-way through the run (at step {c['step']}): look for what "
                            "started then on its host (another job, thermal throttling, a data shard, memory "
                            "growth); pardiag's profiled window may predate it (--profile-steps can move it).",
                    "assumption": "the steps after the change back at the level before it",
                    # the saving is a share of these steps, not of the job's median step: the
                    # what-if, which works on the median step, leaves it out (levers.what_if)
                    "basis_step_us": round(after, 1)}))
    return out[:1]


def gc_pauses(ctx: RuleContext) -> list[Finding]:
    """Garbage-collection pauses every K steps (periodic spikes whose cause is garbage
    collection on a rank). Saving: the pauses' excess spread over their period, as a
    share of the median step."""
    step = ctx.step_us
    if step <= 0 or any(f.lever == "garbage_collection" for f in ctx.earlier):
        return []
    for p in _temporal(ctx).get("periodic", []):
        cause = p.get("cause") or ""
        if not cause.startswith("garbage collection"):
            continue
        every, excess = p.get("every") or 0, p.get("excess_us") or 0.0
        if every <= 0 or excess <= 0:
            continue
        share = min(excess / every / step, 1.0)
        steps = p.get("steps") or []
        rank = p.get("rank")
        return [Finding(
            lever="garbage_collection", severity=_severity(share, 0.05, 0.20, share),
            title=(f"every {every} steps a {excess / 1000:.0f} ms pause for garbage collection"
                   + (f" on rank {rank}" if rank is not None else "") + " holds the job"),
            evidence=[f"{len(steps)} spikes at steps {', '.join(map(str, steps[:8]))}{', ...' if len(steps) > 8 else ''}:"
                      f" {excess / 1000:.1f} ms over their steps' median (steps.jsonl)",
                      f"{cause} covers at least half of each (gc.callbacks)",
                      f"{excess / every / 1000:.1f} ms per step on average, {share:.1%} of the {step / 1000:.1f} ms "
                      "median step"],
            ranks=[rank] if rank is not None else [], est_saving_pct=_pct(share),
            action={"text": "collect on every rank at the same step, or scan less: gc.freeze() after building the "
                            "model and loaders (long-lived objects are then never scanned again), or gc.disable() "
                            "and gc.collect() every N steps on all ranks at once.",
                    "code": "import gc\ngc.freeze()   # after setup\n",
                    "assumption": "the pauses removed"})]
    return []


def notices(temporal: dict[str, Any]) -> list[Notice]:
    """What the temporal block shows that no finding says: changes on all ranks, periodic
    pauses outside garbage collection, the warm-up."""
    out = []
    for c in temporal.get("change_points", []):
        if c.get("rank") is not None and c.get("until") is None:
            continue  # a late straggler's finding says it
        until = f" to step {c['until']}" if c.get("until") is not None else " to the run's end"
        who = f"with rank {c['rank']} holding the others back" if c.get("rank") is not None else "on all ranks"
        out.append(Notice("info", f"from step {c['step']}{until} the job's step was {c['after_us'] / 1000:.1f} ms "
                                  f"(before: {c['before_us'] / 1000:.1f} ms) {who}"
                                  + (f"; what grew: {c['cause']}" if c.get("cause") else "")))
    for p in temporal.get("periodic", []):
        if (p.get("cause") or "").startswith("garbage collection"):
            continue
        who = f"rank {p['rank']}" if p.get("rank") is not None else "all ranks"
        out.append(Notice("info", f"every {p['every']} steps a {p['excess_us'] / 1000:.0f} ms pause ({who}; "
                                  f"{p.get('cause') or 'cause not timed'}), {len(p.get('steps') or [])} times"))
    w = temporal.get("warmup") or {}
    if w.get("steps"):
        out.append(Notice("info", f"warm-up: the first {w['steps']} steps took {w['extra_us'] / 1e6:.2f} s more than "
                                  "steady steps"))
    return out
