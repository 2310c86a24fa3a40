"""Terminal summary of an Analysis (rich). Reads only the Analysis; the job-level
figures are its `summary`, worded as in every report (`display.headline`)."""

from __future__ import annotations

import io
import shlex

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pardiag.analysis import Analysis, RankResult
from pardiag.display_efficiency import efficiency_lines, efficiency_words
from pardiag.display_memory import memory_lines, memory_words
from pardiag.display import (
    critical_path_of,
    critical_path_words,
    estimate_words,
    what_if_words,
    op_text,
    action_env_text,
    exposed_words,
    hang_flight_lines,
    hang_late_words,
    hang_wait_words,
    headline,
    job_hang,
    job_step_words,
    ms,
    ordered_collectives,
    ordered_findings,
    no_straggler_words,
    ordered_stragglers,
    worst_ranks,
    pct,
    per_step_us,
    share,
    step_words,
)

MAX_RANK_ROWS = 16
CATEGORY_LABELS = (
    ("compute", "compute"),
    ("comm_exposed", "comm exp"),
    ("comm_overlapped", "comm hid"),
    ("memcpy", "copy"),
    ("dataloader", "data"),
    ("idle", "idle"),
)


def _rows_to_show(a: Analysis, straggler_ranks: set[int]) -> list[RankResult]:
    ranks = a.ranks
    if len(ranks) <= MAX_RANK_ROWS:
        return list(ranks)
    keep = {r.rank for r in worst_ranks(a, MAX_RANK_ROWS // 2)} | straggler_ranks | {ranks[0].rank}
    return [r for r in ranks if r.rank in keep]


def rank_table(a: Analysis) -> Table:
    stragglers = {s.rank for s in a.stragglers}
    shown = _rows_to_show(a, stragglers)
    title = "where each rank's profiled time went"
    if len(shown) < len(a.ranks):
        title += f" ({len(shown)} of {len(a.ranks)} ranks: the slowest, the stragglers, rank {a.ranks[0].rank})"
    t = Table(title=title, title_justify="left", caption="step: p50 over all steps (ms); wait: ms per profiled step spent waiting in collectives", caption_justify="left")
    t.add_column("rank", justify="right")
    t.add_column("step", justify="right")
    for _, label in CATEGORY_LABELS:
        t.add_column(label, justify="right")
    t.add_column("wait", justify="right")
    for r in shown:
        cells = [pct(share(r, k)) for k, _ in CATEGORY_LABELS]
        mark = Text(str(r.rank), style="bold red" if r.rank in stragglers else "")
        t.add_row(mark, ms(r.step_time_us.p50), *cells, ms(per_step_us(r, r.wait_us)))
    return t


def collective_table(a: Analysis, limit: int = 10) -> Table:
    t = Table(title="collectives in the profiled window", title_justify="left", caption="transfer: shortest duration across ranks; wait: the rest (mean over ranks)", caption_justify="left")
    for col in ("op", "group", "calls", "MB", "transfer ms", "wait ms", "busbw GB/s"):
        t.add_column(col, justify="left" if col in ("op", "group") else "right", overflow="fold")
    for c in ordered_collectives(a)[:limit]:
        t.add_row(
            op_text(c),
            c.process_group,
            str(c.calls),
            f"{c.bytes / 1e6:.1f}" if c.bytes else "-",
            ms(c.transfer_us),
            ms(c.wait_us),
            f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "-",
        )
    return t


def print_nccl(a: Analysis, console: Console) -> None:
    n = a.nccl
    if n is None:
        return
    console.print(Text(f"NCCL: {n.files} log files, {n.nnodes or '?'} node(s)", style="bold"))
    for h in n.hosts:  # the parser's host records (their shape is the NCCL log parser's)
        versions = ", ".join(h.get("versions") or []) or "version ?"
        net = ", ".join(h.get("networks") or []) or "network ?"
        boot = ", ".join(h.get("bootstrap_interfaces") or []) or "?"
        via = ", ".join(f"{k} x{v}" for k, v in n.transports.get(str(h.get("host")), {}).items())
        console.print(Text(f"  {h.get('host')}: {versions}; {net}; bootstrap {boot}" + (f"; {via}" if via else "")))
    if n.init_s_max:
        console.print(Text(f"  slowest communicator init: {n.init_s_max:.1f} s"))
    for line in n.errors[:3]:
        console.print(Text(f"  error: {line}", style="red"))


def print_findings(a: Analysis, console: Console, limit: int = 8) -> None:
    shown = ordered_findings(a)[:limit]
    console.print(Text(f"what to change ({len(a.findings)} finding{'s' if len(a.findings) != 1 else ''})", style="bold"))
    if (what_if := what_if_words(a.what_if)) is not None:
        console.print(Text(f"  if all were applied: {what_if}"))
    for f in shown:
        style = {"high": "bold red", "medium": "yellow", "low": "dim"}.get(f.severity, "")
        saving = f", est. -{f.est_saving_pct:.0f}% step time" if f.est_saving_pct else ""
        console.print(Text.assemble((f"[{f.severity}] ", style), f"{f.lever}: {f.title}{saving}"))
        if (basis := estimate_words(f, factors=False)) is not None:
            console.print(Text(f"    estimate: {basis}"))
        for ev in f.evidence[:2]:
            console.print(Text(f"    {ev}", style="dim"))
        if f.action.get("env"):
            for line in action_env_text(f.action["env"]).splitlines():
                console.print(Text(f"    {line}", style="cyan"))
        if f.action.get("code"):
            for line in str(f.action["code"]).splitlines()[:6]:
                console.print(Text(f"    {line}", style="cyan"))


def print_headline(a: Analysis, console: Console) -> None:
    h = headline(a)
    console.print(Text(f"median step time: {step_words(h)}", style="bold"))
    if (job := job_step_words(h)) is not None:
        console.print(Text(f"job step: {job}"))
    if h.comm_exposed_share is not None:
        console.print(Text(f"exposed communication: {exposed_words(h)}"))
    if (cp := critical_path_of(a)) is not None:
        console.print(Text(f"critical path: {critical_path_words(cp)}"))
    if (eff := efficiency_words(a)) is not None:
        console.print(Text(f"efficiency: {eff}"))
        for line in efficiency_lines(a)[:3]:
            console.print(Text(f"  {line}", style="dim"))


def print_memory(a: Analysis, console: Console) -> None:
    """The job's memory line and one line per rank (at most MAX_RANK_LINES); nothing
    when no rank has a memory block."""
    if (words := memory_words(a)) is None:
        return
    console.print(Text.assemble(("memory: ", "bold"), words))
    for line in memory_lines(a):
        console.print(Text(f"  {line}", style="dim"))


def print_summary(a: Analysis, console: Console | None = None, next_for: str | None = None) -> None:
    console = console or Console(highlight=False)
    run = a.run
    head = (
        f"world size {run.world_size or '?'}  backend {run.backend or '?'}  "
        f"device {run.device_type or '?'}  hosts {', '.join(run.hosts or []) or '?'}"
    )
    console.print(Text(head))
    if a.ranks:
        print_headline(a, console)
        console.print(rank_table(a))
        print_memory(a, console)
    if a.stragglers:
        for s in ordered_stragglers(a):
            console.print(Text.assemble(("straggler: ", "bold red"), f"rank {s.rank} works "
                                        f"{s.excess_us_per_step / 1000:.1f} ms per step longer than the others; cause: {s.cause}"))
            for line in s.evidence:
                console.print(Text("  " + line, style="dim"))
    elif (words := no_straggler_words(a)) is not None:
        console.print(Text(f"straggler: {words}", style="green" if words.startswith("none;") else "yellow"))
    if a.collectives:
        console.print(collective_table(a))
    for g in a.process_groups:
        if len(a.process_groups) > 1:
            console.print(Text(f"group {g.name} ({g.desc or 'no description'}): {g.role}, size {g.size}, "
                               f"{ms(g.total_us)} ms in collectives, {ms(g.wait_us)} ms waiting"))
    hang = job_hang(a)
    if hang is not None:
        console.print(Text("hang: " + hang.summary, style="bold red"))
        for w in hang.waited:
            console.print(Text(f"  {hang_wait_words(w)}", style="red"))
        for x in hang.late:
            console.print(Text(f"  {hang_late_words(x)}", style="red"))
        for line in hang_flight_lines(hang):
            console.print(Text(f"  {line}", style="red"))
        for line in hang.collect_next[:3]:
            console.print(Text(f"  next: {line}", style="dim"))
    if a.nccl:
        print_nccl(a, console)
    if a.findings:
        print_findings(a, console)
    elif a.ranks:
        console.print(Text("what to change: no finding (no lever pardiag knows would make this run faster)",
                           style="green"))
    for n in a.notices:
        style = {"error": "red", "warning": "yellow"}.get(n.level, "dim")
        console.print(Text(f"{n.level}: {n.message}", style=style))
    if next_for:
        from pardiag.cli import COMMANDS

        p = shlex.quote(next_for)
        nxt = [f"pardiag {c} {p}" for c in ("report", "tui") if c in COMMANDS] + [f"pardiag analyze {p} --json"]
        console.print("next: " + "   ".join(nxt), markup=False)


def summary_text(a: Analysis, width: int = 120) -> str:
    """The terminal summary as plain text (no colours), `width` columns wide."""
    out = io.StringIO()
    print_summary(a, Console(file=out, width=width, color_system=None, highlight=False))
    return out.getvalue()
