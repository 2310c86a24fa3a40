"""Per-node summaries: after the job, `pardiag run` reduces the traces of its node's
ranks to ``ranks/<rank>/summary.json``, in parallel, so that the central analysis of
a large job reads summaries instead of every trace. The summary itself is made by
:mod:`pardiag.analyzers.reduce` and written through :mod:`pardiag.rundir`.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Sequence

from pardiag import rundir
from pardiag.analyzers import trace_parallel

Progress = Callable[[int, int], None]


def _write_one(run_root: str, rank: int, trace: str, complete: bool, decoders: int) -> tuple[int, str | None]:
    from pardiag.analyzers.reduce import summarise

    body, error = summarise(rank, Path(trace), complete, decoders)
    if body is None:
        return rank, error
    rundir.write_summary(rundir.RunDir(Path(run_root)), rank, Path(trace), body)
    return rank, None


def write_node_summaries(run: rundir.RunDir, ranks: Sequence[int], jobs: int | None = None,
                         progress: Progress | None = None) -> dict[int, str | None]:
    """Write summary.json for each of `ranks` that has a trace and no up-to-date
    summary; rank -> error or None (a negative key: a worker that died)."""
    from pardiag.analyzers.reduce import load

    todo = []
    for r in ranks:
        trace, complete = run.find_trace(r)
        if trace is not None and load(run, r, trace) is None:
            todo.append((r, trace, complete))
    out: dict[int, str | None] = {}
    if not todo:
        return out
    cores = jobs or trace_parallel.cores()
    workers = max(1, min(cores, len(todo)))
    decoders = max(1, cores // len(todo))  # the node's cores, all of them: idle ones decode blocks
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_write_one, str(run.root), r, str(t), c, decoders) for r, t, c in todo]
        for n, fut in enumerate(as_completed(futures), 1):
            try:
                rank, err = fut.result()
                out[rank] = err
            except Exception as e:  # a worker died; the trace stays for the central analysis
                out[-n] = f"{type(e).__name__}: {e}"
            if progress:
                progress(n, len(todo))
    return out
