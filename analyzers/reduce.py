"""Per-node reduction: each rank's trace turned into a compact summary (breakdown,
phases, collective records with their timestamps) on the node that wrote it, right
after the job. Central analysis of a large job then reads summaries, so it scales
with ranks x steps rather than with trace bytes; the traces stay for deep dives.

A summary names the trace it came from (file, size, modification time); one that no
longer matches its trace is ignored and the trace is read again.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from pardiag import rundir
from pardiag.analysis import GpuTime
from pardiag.analyzers.rank_trace import CollectiveCall, RankTrace, StepSpan

FORMAT = "pardiag.rank-summary"
VERSION = 1
Progress = Callable[[int, int], None]


def _source(trace: Path) -> dict[str, Any]:
    st = trace.stat()
    return {"trace": trace.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def to_dict(rank: int, trace: Path, result: RankTrace, gpu: GpuTime | None, base_time_ns: int | None) -> dict[str, Any]:
    d = asdict(result)
    d["phases_per_step_us"] = {str(k): v for k, v in result.phases_per_step_us.items()}
    return {
        "format": FORMAT,
        "format_version": VERSION,
        "rank": rank,
        "source": _source(trace),
        "result": d,
        "gpu": asdict(gpu) if gpu else None,
        "base_time_ns": base_time_ns,
    }


def from_dict(doc: dict[str, Any]) -> tuple[RankTrace, GpuTime | None, int | None]:
    r = dict(doc["result"])
    r["steps"] = tuple(StepSpan(**s) for s in r["steps"])
    r["collectives"] = tuple(CollectiveCall(**c) for c in r["collectives"])
    r["phases_per_step_us"] = {int(k): v for k, v in r["phases_per_step_us"].items()}
    r["notices"] = tuple(r.get("notices") or ())
    r["pg_config"] = tuple(r.get("pg_config") or ())
    gpu = GpuTime(**doc["gpu"]) if doc.get("gpu") else None
    return RankTrace(**r), gpu, doc.get("base_time_ns")


def load(run: rundir.RunDir, rank: int, trace: Path) -> tuple[RankTrace, GpuTime | None, int | None] | None:
    """The rank's summary if it exists, is readable and matches `trace`; else None."""
    try:
        doc = json.loads(run.summary(rank).read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT or doc.get("format_version", 99) > VERSION:
            return None
        if doc.get("source") != _source(trace):
            return None
        return from_dict(doc)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _reduce_one(run_root: str, rank: int, trace: str, complete: bool) -> tuple[int, str | None]:
    from pardiag.analyzers.analyze import RankInput, _summarise

    s = _summarise(RankInput(rank, Path(trace), complete))
    if s.result is None:
        return rank, s.error
    run = rundir.RunDir(Path(run_root))
    rundir.atomic_write_text(
        run.summary(rank), json.dumps(to_dict(rank, Path(trace), s.result, s.gpu, s.base_time_ns)) + "\n", durable=False
    )
    return rank, None


def reduce_ranks(run: rundir.RunDir, ranks: Sequence[int], jobs: int | None = None,
                 progress: Progress | None = None) -> dict[int, str | None]:
    """Write summary.json for each of `ranks` that has a trace; rank -> error or None."""
    todo = []
    for r in ranks:
        trace, complete = run.find_trace(r)
        if trace is not None and load(run, r, trace) is None:
            todo.append((r, trace, complete))
    out: dict[int, str | None] = {}
    if not todo:
        return out
    workers = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_reduce_one, str(run.root), r, str(t), c) for r, t, c in todo]
        for n, fut in enumerate(as_completed(futures), 1):
            try:
                rank, err = fut.result()
                out[rank] = err
            except Exception as e:  # a worker died; the trace stays for the central analysis
                out[-n] = f"{type(e).__name__}: {e}"
            if progress:
                progress(n, len(todo))
    return out
