"""Per-node reduction: each rank's trace turned into a compact summary (breakdown,
phases, collective records with their timestamps) on the node that wrote it, right
after the job. Central analysis of a large job then reads summaries, so it scales
with ranks x steps rather than with trace bytes; the traces stay for deep dives.

This module makes a summary's body from a trace (`summarise`) and reads one back
(`load`). The file, its format and its check against the trace are
:mod:`pardiag.rundir`'s: a summary names the trace it came from (file, size,
modification time), and one that no longer matches its trace is ignored and the trace
is read again. `pardiag run` writes the summaries (:mod:`pardiag.node_summaries`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pardiag import rundir
from pardiag.analysis import GpuTime
from pardiag.analyzers.rank_trace import CollectiveCall, RankTrace, StepSpan


def to_body(result: RankTrace, gpu: GpuTime | None, base_time_ns: int | None) -> dict[str, Any]:
    d = asdict(result)
    d["phases_per_step_us"] = {str(k): v for k, v in result.phases_per_step_us.items()}
    d["breakdown_per_step_us"] = {str(k): v for k, v in result.breakdown_per_step_us.items()}
    d["segments_per_step_us"] = {str(k): v for k, v in result.segments_per_step_us.items()}
    return {"result": d, "gpu": asdict(gpu) if gpu else None, "base_time_ns": base_time_ns}


def from_body(doc: dict[str, Any]) -> tuple[RankTrace, GpuTime | None, int | None]:
    r = dict(doc["result"])
    r["steps"] = tuple(StepSpan(**s) for s in r["steps"])
    r["collectives"] = tuple(CollectiveCall(**c) for c in r["collectives"])
    r["phases_per_step_us"] = {int(k): v for k, v in r["phases_per_step_us"].items()}
    # a summary written before the per-step breakdown existed raises KeyError: `load`
    # then reads the trace again, so that the share tests have their steps
    r["breakdown_per_step_us"] = {int(k): v for k, v in r["breakdown_per_step_us"].items()}
    # likewise for the steps' segments (the report's chart of a step)
    r["segments_per_step_us"] = {int(k): tuple((float(a), float(b), str(c)) for a, b, c in v)
                                 for k, v in r["segments_per_step_us"].items()}
    if "flops" not in r:  # written before FLOPs were counted: `load` reads the trace again
        raise KeyError("flops")
    if "memory" not in r:  # likewise before the allocator's events were read
        raise KeyError("memory")
    r["notices"] = tuple(r.get("notices") or ())
    r["pg_config"] = tuple(r.get("pg_config") or ())
    gpu = GpuTime(**doc["gpu"]) if doc.get("gpu") else None
    return RankTrace(**r), gpu, doc.get("base_time_ns")


def summarise(rank: int, trace: Path, complete: bool,
              decoders: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(the summary body of `trace`, None) or (None, why the trace could not be read);
    ``decoders``: processes that decode the trace (None: every core)."""
    from pardiag.analyzers.pipeline import RankInput, _summarise

    s = _summarise(RankInput(rank, trace, complete), decoders)
    if s.result is None:
        return None, s.error
    return to_body(s.result, s.gpu, s.base_time_ns), None


def load(run: rundir.RunDir, rank: int, trace: Path) -> tuple[RankTrace, GpuTime | None, int | None] | None:
    """The rank's summary if it exists, is readable and matches `trace`; else None."""
    doc = rundir.read_summary(run, rank, trace)
    if doc is None:
        return None
    try:
        return from_body(doc)
    except (ValueError, KeyError, TypeError):
        return None
