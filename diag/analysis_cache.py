"""The analysis of a path, through the run directory's cache (`analysis.json`).

Every reader of a run (analyze, report, diff, scaling, the summary after `pardiag run`,
the TUI) gets its Analysis from `load_or_analyze`, the one place that decides whether
the cached analysis.json serves, and that writes it.

The cache serves when it is newer than everything it was computed from and it was
written by this pardiag (the same version, hence the same schema and the same analysis
code: a fix in a newer pardiag must reach runs analysed before it). A cache of an older
schema or of another pardiag version is analysed again from the run's raw data (traces,
summaries, steps) when the run still has them, since an upgraded document lacks what only
the raw data holds (the job's step percentiles); without raw data it is read as it is,
upgraded when its schema is older (`pardiag.analysis.from_dict`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from pardiag import __version__
from pardiag import analysis as model
from pardiag import rundir
from pardiag.errors import UserError

Progress = Callable[[int, int], None]
Warn = Callable[[str], None]

HTA_MISSING = ("--hta needs HolisticTraceAnalysis, which is not installed: "
               "pip install 'pardiag[hta]' (or pip install HolisticTraceAnalysis)")


def load_or_analyze(
    path: Path,
    jobs: int | None = None,
    force: bool = False,
    quiet: bool = False,
    use_hta: bool = False,
    nccl_logs: Sequence[Path] = (),
    progress: Progress | None = None,
    warn: Warn | None = None,
) -> model.Analysis:
    """The Analysis of a run directory, a folder of traces, a trace or an analysis.json.

    `force`: ignore the cache. `quiet`: no progress bar on a terminal. `progress`: called
    with (done, total) while traces are parsed, instead of the bar. `warn`: told when the
    cache cannot be written (default: one line on stderr)."""
    if is_analysis_file(path):
        run = rundir.RunDir(path.parent)
        if not _stale(path) or not has_raw_data(run):
            return model.load(path)
        path = run.root  # an analysis by another pardiag of a run that still has its data: analyse it again
    run = rundir.RunDir(path) if path.is_dir() and rundir.is_run_dir(path) else None
    if run is not None and not force:
        cached = _cached(run, use_hta)
        if cached is not None:
            return cached
    if use_hta:
        require_hta()  # only now: a cached analysis with HTA's numbers needs no HTA
    a = _analyze(path, jobs, quiet, use_hta, list(nccl_logs), progress)
    if run is not None:
        _write_cache(run, a, warn or _warn_on_stderr)
    return a


def is_analysis_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith("analysis.json")


def cache_is_fresh(run: rundir.RunDir) -> bool:
    """analysis.json newer than everything it was computed from."""
    try:
        cached = run.analysis.stat().st_mtime
    except FileNotFoundError:
        return False
    for p in [run.manifest, *run.ranks_dir.glob("*/*")]:
        try:
            if p.stat().st_mtime > cached:
                return False
        except FileNotFoundError:
            continue
    return True


def has_raw_data(run: rundir.RunDir) -> bool:
    """Whether any rank left what an analysis is computed from: a trace, its summary, steps."""
    if not run.root.is_dir() or not rundir.is_run_dir(run.root):
        return False
    return any(run.find_trace(r)[0] is not None or run.summary(r).is_file() or run.steps(r).is_file()
               for r in run.ranks())


def require_hta() -> None:
    """HTA is an optional extra: say how to get it before any trace is read."""
    import importlib.util

    if importlib.util.find_spec("hta") is None:
        raise UserError(HTA_MISSING)


def nccl_log_paths(given: Sequence[str]) -> list[Path]:
    """The --nccl-log arguments as paths; one that does not exist is a user error."""
    logs = [Path(p) for p in given]
    for p in logs:
        if not p.exists():
            raise UserError(f"--nccl-log {p}: no such file or directory")
    return logs


def _cached(run: rundir.RunDir, use_hta: bool) -> model.Analysis | None:
    """The cached analysis when it serves; None when the run is to be analysed again."""
    if not cache_is_fresh(run):
        return None
    try:
        doc = json.loads(run.analysis.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            return None
        if _written_elsewhere(doc) and has_raw_data(run):
            return None
        cached = model.from_dict(doc, str(run.analysis))
    except (OSError, ValueError, UnicodeDecodeError, UserError):
        return None  # an unreadable, broken or newer cache: analyse again
    return cached if cached.hta is not None or not use_hta else None


def _stale(path: Path) -> bool:
    """An analysis.json of an older schema or written by another pardiag version."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False  # model.load says what is wrong with it
    return isinstance(doc, dict) and doc.get("schema") == model.SCHEMA and _written_elsewhere(doc)


def _written_elsewhere(doc: dict[str, object]) -> bool:
    """Whether the document comes from an older schema or another pardiag version (a file
    without the version predates it being recorded)."""
    return _schema_version(doc) < model.SCHEMA_VERSION or doc.get("pardiag_version") != __version__


def _schema_version(doc: dict[str, object]) -> int:
    v = doc.get("schema_version")
    return v if isinstance(v, int) else model.SCHEMA_VERSION


def _write_cache(run: rundir.RunDir, a: model.Analysis, warn: Warn) -> None:
    try:
        rundir.atomic_write_text(run.analysis, a.to_json() + "\n")
    except OSError as e:
        warn(f"could not cache the analysis in {run.analysis}: {e.strerror}")


def _warn_on_stderr(message: str) -> None:
    print(f"pardiag: warning: {message}", file=sys.stderr)


def _analyze(path: Path, jobs: int | None, quiet: bool, use_hta: bool, nccl_logs: list[Path],
             progress: Progress | None) -> model.Analysis:
    """Parse the traces, with a progress bar on a terminal unless quiet or given `progress`."""
    from pardiag.analyzers.pipeline import analyze_path

    if progress is not None or quiet:
        return analyze_path(path, jobs=jobs, progress=progress, use_hta=use_hta, nccl_logs=nccl_logs)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        return analyze_path(path, jobs=jobs, use_hta=use_hta, nccl_logs=nccl_logs)
    with Bar(TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             console=console, transient=True) as bar:
        task = bar.add_task("traces", total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze_path(path, jobs=jobs, progress=on_progress, use_hta=use_hta, nccl_logs=nccl_logs)
