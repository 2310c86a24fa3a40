"""Turn a path (run directory, folder of traces, trace file, analysis.json) into the
Analysis, reporting progress; runs in the TUI's worker thread."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from pardiag import rundir
from pardiag.analysis import Analysis

Progress = Callable[[int, int], None]
Loader = Callable[[Progress], Analysis]


def path_loader(path: Path, nccl_logs: Sequence[Path] = ()) -> Loader:
    """A loader for `path`: a cached analysis comes back at once, traces are parsed with
    progress, and a run directory's result is cached the way `pardiag analyze` does.

    Call it before the app runs: trace parsing uses a process pool, and a pool's
    helper process started under the running app would be handed the app's stderr
    stand-in (no file descriptor), so it is started here, on the real stderr."""
    if not path.name.endswith("analysis.json"):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()

    def load(progress: Progress) -> Analysis:
        from pardiag.commands.analyze import cache_is_fresh, load_or_analyze

        is_run = path.is_dir() and rundir.is_run_dir(path)
        if not nccl_logs and (path.is_file() and path.name.endswith("analysis.json")
                              or is_run and cache_is_fresh(rundir.RunDir(path))):
            return load_or_analyze(path, quiet=True)
        from pardiag.analyzers.analyze import analyze_path

        a = analyze_path(path, progress=progress, nccl_logs=list(nccl_logs))
        if is_run:
            try:
                rundir.atomic_write_text(rundir.RunDir(path).analysis, a.to_json() + "\n")
            except OSError:
                pass  # a read-only run directory: the analysis is shown all the same
        return a

    return load
