"""What `pardiag run` prints when the job ends: where the run is, what was collected,
step times per rank, and the next commands to type."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from pardiag import rundir
from pardiag.analyzers.steps import step_stats

STATUS_STYLE = {"ok": "green", "partial": "yellow", "skipped": "dim", "failed": "red"}


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def _exit_text(ex: dict[str, Any]) -> str:
    status = ex.get("status")
    if status == "exited":
        return "ok"
    if status == "exception":
        return f"[red]{ex.get('type')}[/]"
    if status == "running":
        return "[red]killed?[/]"
    return "?"


def print_run_summary(run: rundir.RunDir, doc: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(stderr=True, highlight=False)
    code = doc.get("exit_code")
    console.rule("[bold]pardiag")
    console.print(
        f"run directory: [bold]{run.root}[/]   world size: {doc.get('world_size') or '?'}   "
        f"hosts: {', '.join(doc.get('hosts') or []) or '?'}   exit code: {code}",
        markup=True,
    )
    table = Table(
        title="step time in ms (steps outside the profiler window, step 0 left out)",
        title_justify="left",
        caption="data: share of step time waiting on the DataLoader; prof: p50 inside the window",
        caption_justify="left",
    )
    for col in ("rank", "host", "steps", "p50", "p90", "max", "data", "prof", "trace", "exit"):
        table.add_column(col, justify="left" if col in ("host", "trace", "exit") else "right", overflow="fold")
    for info in doc.get("ranks") or []:
        r = info["rank"]
        st = step_stats(rundir.iter_steps(run.steps(r)))
        ex = info.get("exit") or {}
        table.add_row(
            str(r),
            str(info.get("host") or "?"),
            str((st.last_step + 1) if st.last_step is not None else 0),
            _ms(st.p50_us),
            _ms(st.p90_us),
            _ms(st.max_us),
            "-" if st.data_share is None else f"{st.data_share:.0%}",
            _ms(st.profiled_p50_us),
            {"trace.json.gz": "yes", "trace.partial.json.gz": "partial"}.get(info.get("trace") or "", "-"),
            _exit_text(ex),
        )
    console.print(table)
    col = doc.get("collectors") or {}
    parts = []
    for name in ("steps", "meta", "profiler", "nccl", "telemetry", "flight_recorder", "bootstrap"):
        if name in col:
            st = col[name].get("status", "?")
            parts.append(f"{name} [{STATUS_STYLE.get(st, '')}]{st}[/]")
    console.print("collectors: " + ", ".join(parts))
    for name in ("steps", "profiler", "nccl", "telemetry", "bootstrap"):
        reason = (col.get(name) or {}).get("reason")
        if reason and (col.get(name) or {}).get("status") != "ok":
            console.print(f"  {name}: {reason}", markup=False, style="dim")
    if col.get("missing_ranks"):
        console.print(f"[yellow]missing ranks:[/] {col['missing_ranks']}")
    for f in doc.get("failed_ranks") or []:
        console.print(f"[red]rank {f['rank']} failed[/] at step {f.get('step')}: ", end="")
        console.print(str(f.get("reason")), markup=False)
    from pardiag.cli import COMMANDS

    path = shlex.quote(str(run.root))
    nxt = [f"pardiag {c} {path}" for c in ("analyze", "report", "tui") if c in COMMANDS]
    if nxt:
        console.print("next:")
        for line in nxt:
            console.print(f"  {line}", markup=False)
