"""1 Overview: the headline (with the median step's critical path), one row per rank (step-time spread, where the profiled time
went as a stacked bar, waiting), stragglers marked, and the top findings."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from pardiag import style
from pardiag.analysis import Analysis, RankResult
from pardiag.display import (
    PERCENTILES,
    critical_path_of,
    critical_path_words,
    headline,
    job_hang,
    job_step_words,
    no_straggler_words,
    ordered_findings,
    quantile,
)
from pardiag.display_efficiency import efficiency_words
from pardiag.display_memory import memory_words
from pardiag.tui import format as fmt
from pardiag.tui.messages import OpenRank
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.widgets.drawn import Drawn
from pardiag.tui.widgets.labels import Caption
from pardiag.tui.widgets.table import Column, SortableTable

TOP_FINDINGS = 3
TALL = 36  # from this terminal height on, the top findings show their evidence
BAR_MIN, BAR_MAX = 12, 48
FIXED_COLUMNS_WIDTH = 58  # rank, p50, p90, max, spread, wait + cell padding


def bar_width(terminal_width: int) -> int:
    return max(BAR_MIN, min(BAR_MAX, terminal_width - FIXED_COLUMNS_WIDTH))


def rank_columns(stragglers: set[int], bar: int) -> list[Column[RankResult]]:
    def rank_cell(r: RankResult) -> Text:
        mark = (" ▲", f"bold {style.SEVERITY_COLOURS['high']}") if r.rank in stragglers else ("  ", "")
        return Text.assemble((str(r.rank), "bold" if r.rank in stragglers else ""), mark, justify="right")

    def spread_cell(r: RankResult) -> str:
        s = fmt.spread(r)
        return "-" if s is None else f"+{s:.0%}"

    cols: list[Column[RankResult]] = [
        Column("rank", rank_cell, key=lambda r: r.rank, descending=False),
        Column("step p50", lambda r: fmt.ms(r.step_time_us.p50), key=lambda r: r.step_time_us.p50),
        Column("p90", lambda r: fmt.ms(r.step_time_us.p90), key=lambda r: r.step_time_us.p90),
        Column("max", lambda r: fmt.ms(r.step_time_us.max), key=lambda r: r.step_time_us.max),
        Column("spread", spread_cell, key=fmt.spread),
        Column("profiled window", lambda r: fmt.breakdown_bar(r, bar),
               key=lambda r: fmt.share(r, "compute"), width=bar, right=False),
        Column("wait/step", lambda r: fmt.ms(fmt.per_step_us(r, r.wait_us)), key=lambda r: fmt.per_step_us(r, r.wait_us)),
        Column("prof/step", lambda r: fmt.ms(fmt.per_step_us(r, r.window_us)),
               key=lambda r: fmt.per_step_us(r, r.window_us)),
    ]
    for k, label in style.CATEGORY_LABELS.items():
        cols.append(Column(label, lambda r, k=k: fmt.pct(fmt.share(r, k)), key=lambda r, k=k: fmt.share(r, k)))
    cols.append(Column("host", lambda r: r.host or "?", key=lambda r: r.host or "", descending=False, right=False))
    cols.append(Column("trace", lambda r: "complete" if r.trace_complete else ("partial" if r.trace else "none"),
                       key=lambda r: (r.trace_complete, bool(r.trace)), descending=False, right=False))
    return cols


def rank_text(r: RankResult, stragglers: set[int]) -> str:
    tags = ["straggler"] if r.rank in stragglers else []
    return " ".join([f"rank {r.rank}", f"r{r.rank}", r.host or "", r.device_type or "", *tags])


def summary(a: Analysis) -> RenderableType:
    h = headline(a)
    run = a.run
    lines = []
    world = h.world_size or h.ranks
    bits = [f"median step {fmt.ms(h.step_us)} ms ({h.step_source})" if h.step_us is not None else "step time unknown",
            f"{h.ranks} of {world} ranks", f"{h.hosts} host{'s' if h.hosts != 1 else ''}" if h.hosts else "",
            str(run.backend or ""), str(run.device_type or "")]
    if h.comm_exposed_share is not None:
        without = (f" ({fmt.pct(h.comm_exposed_transfer_share)} without waiting)"
                   if h.comm_exposed_transfer_share is not None else "")
        bits.append(f"exposed comm {fmt.pct(h.comm_exposed_share)}{without}")
    lines.append(Text(" · ".join(b for b in bits if b), style="bold"))
    hang = job_hang(a)  # the one screen 4 shows: pardiag's merged verdict, else the NCCL logs'
    if hang is not None:
        red = style.SEVERITY_COLOURS["high"]
        lines.append(Text.assemble(("HANG", f"bold #ffffff on {red}"), " ",
                                   (fmt.clip(hang.summary or "the job hung", 100), f"bold {red}"),
                                   (" (4 has the diagnosis)", "dim")))
    p50s = [v for r in a.ranks if (v := r.step_time_us.p50) is not None]
    if len(p50s) > 1:
        qs = " · ".join(f"{n} {fmt.ms(quantile(p50s, q))}" for n, q in PERCENTILES)
        lines.append(Text(f"step p50 across ranks: {qs} ms", style="dim"))
    if (job := job_step_words(h)) is not None:
        lines.append(Text(f"job step: {job}", style="dim"))
    if h.straggler is not None:
        s = h.straggler
        held = f"; the others wait {fmt.ms(s.held_us_per_step)} ms per step" if s.held_us_per_step else ""
        lines.append(Text.assemble(("▲ straggler: ", f"bold {style.SEVERITY_COLOURS['high']}"),
                                   f"rank {s.rank} +{fmt.ms(s.excess_us_per_step)} ms per step ({s.cause}){held}"))
    elif (words := no_straggler_words(a)) is not None:
        lines.append(Text(f"straggler: {words}", style="green" if words.startswith("none;") else "yellow"))
    if (cp := critical_path_of(a)) is not None:
        lines.append(Text.assemble(("critical path: ", "bold"), critical_path_words(cp)))
    if (eff := efficiency_words(a)) is not None:
        lines.append(Text.assemble(("efficiency: ", "bold"), eff))
    if (mem := memory_words(a)) is not None:
        lines.append(Text.assemble(("memory: ", "bold"), mem))
    return Group(*lines)


def top_findings(a: Analysis, width: int, detail: bool = False) -> RenderableType:
    """The most important findings, one line each; with `detail`, their first evidence too."""
    findings = ordered_findings(a)
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=8)
    grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
    grid.add_column(justify="right", width=12)
    for f in findings[:TOP_FINDINGS]:
        saving = f"est. -{f.est_saving_pct:.0f}%" if f.est_saving_pct else ""
        grid.add_row(fmt.severity_badge(f.severity), Text(f"{f.lever}: {f.title}"), saving)
        if detail:
            for e in f.evidence[:2]:
                grid.add_row("", Text(e, style="dim"), "")
    more = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    head = Text.assemble(("top findings ", "bold"), (f"({more}; 5 lists them with the change to make)", "dim"))
    parts: list[RenderableType] = [head, grid] if findings else [Text("no findings: no lever pardiag knows would help", style="green")]
    if a.notices:
        first = a.notices[0]
        colour = style.NOTICE_COLOURS.get(first.level, "")
        parts.append(Text.assemble((f"{len(a.notices)} notice{'s' if len(a.notices) != 1 else ''}: ", f"bold {colour}"),
                                   fmt.clip(first.message, max(20, width - 30)), (" (5 lists all)", "dim"),
                                   no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


class OverviewScreen(PardiagScreen):
    NAV = "overview"
    DEFAULT_CSS = """
    OverviewScreen #summary { height: auto; padding: 0 1; }
    OverviewScreen #legend { height: 1; padding: 0 1; }
    OverviewScreen #ranks { height: auto; }
    OverviewScreen #top-findings { height: auto; max-height: 40%; border-top: solid $panel-lighten-2; }
    OverviewScreen #empty { padding: 1 2; }
    """

    def __init__(self, analysis: Analysis) -> None:
        super().__init__(analysis)
        self.stragglers = {s.rank for s in analysis.stragglers}
        self.bar_width = BAR_MIN

    def compose_body(self) -> ComposeResult:
        a = self.analysis
        self.bar_width = bar_width(self.app.size.width)
        yield Static(summary(a), id="summary")
        if not a.ranks:
            notices = "\n".join(f"{n.level}: {n.message}" for n in a.notices) or "no notices"
            yield Static(f"No rank produced data: nothing to analyse.\n\n{notices}", id="empty", markup=False)
            return
        yield Static(fmt.legend(style.CATEGORY_LABELS, style.CATEGORY_COLOURS), id="legend")
        yield SortableTable(rank_columns(self.stragglers, self.bar_width), a.ranks,
                            lambda r: rank_text(r, self.stragglers), sort=0, noun="ranks", id="ranks", classes="-fit")
        yield Caption("", id="table-caption")
        yield Drawn(lambda w: top_findings(a, w, detail=self.size.height >= TALL), id="top-findings")

    def on_resize(self, event: events.Resize) -> None:
        bar = bar_width(event.size.width)
        tables = self.query("#ranks").results(SortableTable)
        for table in tables:
            if bar != self.bar_width:
                self.bar_width = bar
                table.set_columns(rank_columns(self.stragglers, bar))

    @on(DataTable.RowSelected, "#ranks")
    def open_rank(self, event: DataTable.RowSelected) -> None:
        table = self.query_one("#ranks", SortableTable)
        r = table.current_item()
        if isinstance(r, RankResult):
            self.post_message(OpenRank(r.rank))
