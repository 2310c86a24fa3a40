"""4 Comm setup: what NCCL reported per host (versions, network, bootstrap, transports),
its errors and warnings, the environment problems found, and the diagnosis of a hang
(first and prominent when there is one)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from pardiag import style
from pardiag.analysis import Analysis
from pardiag.analysis_blocks import Hang, HangWait, NcclSummary, StuckRank
from pardiag.display import action_env_text, hang_flight_lines, job_hang, ordered_findings
from pardiag.tui import format as fmt
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.widgets.drawn import Drawn
from pardiag.tui.widgets.labels import Caption, Heading
from pardiag.tui.widgets.table import Column, SortableTable

MAX_LINES = 30


def _join(xs: Any) -> str:
    return ", ".join(str(x) for x in xs) if isinstance(xs, (list, tuple)) and xs else "-"


def host_columns(transports: Mapping[str, Mapping[str, int]]) -> list[Column[Mapping[str, Any]]]:
    def via(h: Mapping[str, Any]) -> str:
        t = transports.get(str(h.get("host"))) or {}
        return ", ".join(f"{k} ×{v}" for k, v in t.items()) or "-"

    def env(h: Mapping[str, Any]) -> str:
        e = h.get("env") or {}
        return ", ".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in sorted(e.items())) or "-"

    return [
        Column("host", lambda h: str(h.get("host") or "?"), key=lambda h: str(h.get("host") or ""), descending=False, right=False),
        Column("ranks", lambda h: fmt.rank_ranges(h.get("ranks") or []) or "-", key=lambda h: len(h.get("ranks") or [])),
        Column("NCCL", lambda h: _join(h.get("versions")), key=lambda h: _join(h.get("versions")), right=False),
        Column("network", lambda h: _join(h.get("networks")), key=lambda h: _join(h.get("networks")), right=False),
        Column("bootstrap", lambda h: _join(h.get("bootstrap_interfaces")), key=lambda h: _join(h.get("bootstrap_interfaces")), right=False),
        Column("transports", via, key=via, right=False),
        Column("env set", env, key=env, right=False),
        Column("plugins", lambda h: _join(h.get("plugins")), key=lambda h: _join(h.get("plugins")), right=False),
    ]


def facts(n: NcclSummary) -> RenderableType:
    bits = [f"{n.files} log file{'s' if n.files != 1 else ''}",
            f"{n.processes} process{'es' if n.processes != 1 else ''}",
            f"{n.nnodes or '?'} node(s)" + (" (multi-node)" if n.multi_node else "")]
    if n.world_size:
        bits.append(f"world size {n.world_size}")
    if n.init_s_max:
        bits.append(f"slowest communicator init {n.init_s_max:.1f} s")
    return Text(" · ".join(bits))


def _ranks_table(rows: list[StuckRank]) -> Table:
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    cols = ("rank", "process_group", "op_type", "seq", "last_completed", "last_enqueued", "ran_for_ms")
    for c in cols:
        text = c in ("process_group", "op_type")
        longest = max((len(str(getattr(row, c) or "")) for row in rows), default=4)
        t.add_column(c.replace("_", " "), justify="left" if text else "right",
                     min_width=min(24, longest) if text else None)
    for row in rows[:MAX_LINES]:
        t.add_row(*(Text(fmt.fact_text(c, getattr(row, c))) for c in cols))
    return t


def _waited_table(rows: list[HangWait]) -> Table:
    """pardiag's own records: each rank that waited, in which step and op, and its message."""
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for c in ("rank", "step", "op", "timeout ms", "message"):
        t.add_column(c, justify="left" if c in ("op", "message") else "right")
    for w in rows[:MAX_LINES]:
        cells = (("rank", w.rank), ("step", w.step), ("op", w.op), ("timeout_ms", w.timeout_ms))
        t.add_row(*(Text(fmt.fact_text(k, v)) for k, v in cells), Text(fmt.clip(w.message, 200)))
    return t


def hang(h: Hang) -> RenderableType:
    """The diagnosis, from either source: NCCL's with its process groups and where each
    rank stopped; pardiag's with the step and op each rank waited in."""
    red = style.SEVERITY_COLOURS["high"]
    parts: list[RenderableType] = [
        Text.assemble(("HANG", f"bold #ffffff on {red}"), " ", ((h.kind or "").replace("_", " "), f"bold {red}")),
        Text(h.summary or "the job hung", style="bold"),
    ]
    if h.first_error:
        parts.append(Text.assemble(("first error: ", "bold"), h.first_error))
    if h.source == "nccl":
        if h.never_arrived:
            parts.append(Text.assemble(("ranks never arrived: ", "bold"), fmt.fact_text("never_arrived", h.never_arrived)))
        if h.coll_laggards:
            parts.append(Text.assemble(("ranks behind: ", "bold"),
                                       fmt.fact_text("coll_laggards", [asdict(c) for c in h.coll_laggards])))
    elif h.late:
        parts.append(Text.assemble(("ranks never arrived: ", "bold"), ", ".join(str(x.rank) for x in h.late)))
    if h.ranks_stuck:
        parts += [Text("where each rank stopped", style="bold"), _ranks_table(h.ranks_stuck)]
    elif h.waited:
        parts += [Text("where each rank stopped", style="bold"), _waited_table(h.waited)]
    if h.flight is not None:
        parts += [Text("flight recorder", style="bold"), *(Text(line) for line in hang_flight_lines(h))]
    if h.collect_next:
        parts.append(Text("collect next", style="bold"))
        bullets = Table.grid(padding=(0, 1))
        bullets.add_column(width=2, justify="right")
        bullets.add_column()
        for line in h.collect_next[:MAX_LINES]:
            bullets.add_row("•", Text(str(line)))
        parts.append(bullets)
    if h.env:
        parts.append(Text(action_env_text(dict(h.env)), style="cyan"))
    if h.doc:
        parts.append(Text(h.doc, style="underline dim"))
    return Group(*parts)


def problems(a: Analysis) -> RenderableType:
    n = a.nccl
    lines: list[RenderableType] = []
    for level, lines_of in (("error", n.errors if n else []), ("warning", n.warnings if n else [])):
        for line in lines_of[:MAX_LINES]:
            lines.append(Text.assemble((f"{level}: ", f"bold {style.NOTICE_COLOURS[level]}"), fmt.clip(line, 400)))
    for f in ordered_findings(a):
        if f.lever == "nccl_env":
            change = action_env_text(f.action["env"]) if isinstance(f.action.get("env"), dict) else ""
            lines.append(Text.assemble(fmt.severity_badge(f.severity), " ", (f.title, "bold")))
            lines += [Text(f"    {e}", style="dim") for e in f.evidence[:3]]
            if change:
                lines.append(Text("    " + change.replace("\n", "\n    "), style="cyan"))
    if lines:
        return Group(*lines)
    other = " other" if n is not None and n.hang is not None else ""
    return Text(f"no{other} NCCL errors, warnings or environment problems", style="dim" if other else "green")


def no_logs(a: Analysis) -> str:
    status = ((a.run.collectors or {}).get("nccl") or {})
    reason = status.get("reason") if isinstance(status, Mapping) else None
    return "no NCCL logs" + (f": {reason}" if reason else " (give them with `pardiag tui PATH --nccl-log FILE`)")


class NcclScreen(PardiagScreen):
    NAV = "nccl"
    DEFAULT_CSS = """
    NcclScreen #nccl-body { height: 1fr; }
    NcclScreen #hang { border: heavy $error; padding: 0 1; margin: 0 0 1 0; height: auto; }
    NcclScreen #hosts { height: auto; max-height: 14; }
    NcclScreen #facts, NcclScreen #problems { margin: 0 0 1 0; }
    NcclScreen #empty { padding: 1 2; color: $text-muted; }
    NcclScreen #no-hosts { padding: 0 1 1 1; color: $text-muted; }
    """

    def compose_body(self) -> ComposeResult:
        a = self.analysis
        n = a.nccl
        with VerticalScroll(id="nccl-body"):
            if (h := job_hang(a)) is not None:
                yield Drawn(lambda w: hang(h), id="hang")
            yield Heading("NCCL communication setup", markup=False)
            if n is None:
                yield Static(no_logs(a), id="empty", markup=False)
                return
            yield Drawn(lambda w: facts(n), id="facts")
            hosts = n.hosts
            if hosts:
                yield SortableTable(host_columns(n.transports), hosts,
                                    lambda h: " ".join(str(v) for v in h.values()), sort=0, noun="hosts", id="hosts")
                yield Caption("", id="table-caption")
            else:
                yield Static("no host facts in the NCCL logs", id="no-hosts")
            yield Heading("problems", markup=False)
            yield Drawn(lambda w: problems(a), id="problems")

    def on_mount(self) -> None:
        self.query_one("#nccl-body").focus()
