"""Turn a path (run directory, folder of traces, trace file, analysis.json) into the
Analysis, reporting progress; runs in the TUI's worker thread."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from pardiag.analysis import Analysis

Progress = Callable[[int, int], None]
Loader = Callable[[Progress], Analysis]


def path_loader(path: Path, nccl_logs: Sequence[Path] = ()) -> Loader:
    """A loader for `path`: the analysis `pardiag analyze` would give, through the same
    cache (a cached analysis comes back at once, traces are parsed with progress).

    Call it before the app runs: trace parsing uses a process pool, and a pool's
    helper process started under the running app would be handed the app's stderr
    stand-in (no file descriptor), so it is started here, on the real stderr."""
    if not path.name.endswith("analysis.json"):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()

    def load(progress: Progress) -> Analysis:
        from pardiag.analysis_cache import load_or_analyze

        return load_or_analyze(path, force=bool(nccl_logs), quiet=True, nccl_logs=nccl_logs, progress=progress,
                               warn=_unwritable_cache)

    return load


def _unwritable_cache(message: str) -> None:
    """A read-only run directory: the analysis is shown all the same."""
