"""What `pardiag run` prints when the job ends: where the run is, what was collected,
the analysis summary, and the next commands to type."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console

from pardiag import rundir

STATUS_STYLE = {"ok": "green", "partial": "yellow", "skipped": "dim", "failed": "red"}


def print_run_summary(
    run: rundir.RunDir, doc: dict[str, Any], console: Console | None = None, write_report: bool = True
) -> None:
    console = console or Console(stderr=True, highlight=False)
    code = doc.get("exit_code")
    console.rule("[bold]pardiag")
    console.print(
        f"run directory: [bold]{run.root}[/]   world size: {doc.get('world_size') or '?'}   "
        f"hosts: {', '.join(doc.get('hosts') or []) or '?'}   exit code: {code}",
        markup=True,
    )
    col = doc.get("collectors") or {}
    parts = []
    for name in ("steps", "meta", "profiler", "nccl", "telemetry", "flight_recorder", "factors", "bootstrap"):
        if name in col:
            st = col[name].get("status", "?")
            parts.append(f"{name} [{STATUS_STYLE.get(st, '')}]{st}[/]")
    console.print("collectors: " + ", ".join(parts))
    for name in ("steps", "profiler", "nccl", "telemetry", "factors", "bootstrap"):
        reason = (col.get(name) or {}).get("reason")
        if reason and (col.get(name) or {}).get("status") != "ok":
            console.print(f"  {name}: {reason}", markup=False, style="dim")
    if col.get("missing_ranks"):
        console.print(f"[yellow]missing ranks:[/] {col['missing_ranks']}")
    analysis = _analyse(run, console)
    if analysis is not None:
        from pardiag.render_text import print_summary

        print_summary(analysis, console, next_for=str(run.root))  # failed ranks are among its notices
        if write_report:
            _write_report(run, analysis, console)
        return
    for f in doc.get("failed_ranks") or []:
        console.print(f"[red]rank {f['rank']} failed[/] at step {f.get('step')}: ", end="")
        console.print(str(f.get("reason")), markup=False)


def _write_report(run: rundir.RunDir, analysis: Any, console: Console) -> None:
    from pardiag.report_html import render_html

    try:
        rundir.atomic_write_text(run.report, render_html(analysis), durable=False)
    except Exception as e:  # the report is a convenience; the run's data is what matters
        console.print(f"report not written: {type(e).__name__}: {e}", markup=False, style="red")
        return
    console.print(f"report: {run.report}", markup=False)


def _analyse(run: rundir.RunDir, console: Console) -> Any:
    """The Analysis of the run just recorded; a failure here never fails the run."""
    from pardiag.analysis_cache import load_or_analyze

    if not run.ranks():
        return None
    try:
        return load_or_analyze(run.root, quiet=True)
    except Exception as e:  # report it, keep the run's exit code
        console.print(f"analysis failed: {type(e).__name__}: {e}", markup=False, style="red")
        console.print(f"  the data is kept; try: pardiag --debug analyze {shlex.quote(str(run.root))}", markup=False)
        return None
