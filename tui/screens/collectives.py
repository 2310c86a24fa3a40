"""2 Collectives: one row per operation and process group (transfer versus waiting,
bandwidth), and a rank × collective heatmap of the time each rank waited."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import Static

from pardiag import style
from pardiag.analysis import Analysis, Collective
from pardiag.display import op_text, ordered_collectives
from pardiag.tui import format as fmt
from pardiag.tui.messages import TableViewChanged
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.widgets.heatmap import HeatColumn, WaitHeatmap
from pardiag.tui.widgets.labels import Caption, Heading
from pardiag.tui.widgets.table import Column, SortableTable

SPLIT_BAR = 13
HEAT_COLUMNS = 60
GROUP_LINES = 4


def split_bar(c: Collective) -> Text:
    segs = fmt.stacked([(c.transfer_us, style.TRANSFER_COLOUR), (c.wait_us, style.WAIT_COLOUR)])
    return fmt.draw(segs, 0.0, max(c.transfer_us + c.wait_us, 1e-9), SPLIT_BAR)


def groups_text(a: Analysis) -> Text:
    """One line per process group: what it is for, its size, time in it and waiting."""
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, g in enumerate(a.process_groups[:GROUP_LINES]):
        if i:
            text.append("\n")
        text.append(f"group {g.name}", style="bold")
        text.append(f" {g.desc}" if g.desc else "")
        text.append(f" · {g.role}, size {g.size or '?'}"
                    + (f", ranks {fmt.clip(fmt.rank_ranges(g.ranks), 40)}" if g.ranks else "")
                    + f" · {fmt.ms(g.total_us)} ms in collectives, ")
        text.append(f"{fmt.ms(g.wait_us)} ms waiting", style=style.WAIT_COLOUR)
    if len(a.process_groups) > GROUP_LINES:
        text.append(f"\n… {len(a.process_groups) - GROUP_LINES} more groups", style="dim")
    return text


def collective_columns(number: dict[int, int]) -> list[Column[Collective]]:
    def gbps(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    return [
        Column("#", lambda c: f"#{number[id(c)]}", key=lambda c: number[id(c)], descending=False),
        Column("op", op_text, key=lambda c: c.op, descending=False, right=False),
        Column("group", lambda c: c.process_group, key=lambda c: c.process_group, descending=False, right=False),
        Column("calls", lambda c: str(c.calls), key=lambda c: c.calls),
        Column("MB", lambda c: fmt.mb(c.bytes), key=lambda c: c.bytes),
        Column("transfer ms", lambda c: fmt.ms(c.transfer_us, 2), key=lambda c: c.transfer_us),
        Column("wait ms", lambda c: fmt.ms(c.wait_us, 2), key=lambda c: c.wait_us),
        Column("transfer·wait", split_bar, key=lambda c: c.wait_us / c.total_us if c.total_us else 0.0,
               width=SPLIT_BAR, right=False),
        Column("busbw GB/s", lambda c: gbps(c.busbw_gbps), key=lambda c: c.busbw_gbps),
        Column("algbw GB/s", lambda c: gbps(c.algbw_gbps), key=lambda c: c.algbw_gbps),
        Column("ranks", lambda c: f"{c.ranks_matched}/{c.group_size or '?'}", key=lambda c: c.ranks_matched),
    ]


class CollectivesScreen(PardiagScreen):
    NAV = "collectives"
    DEFAULT_CSS = """
    CollectivesScreen #collectives { height: auto; max-height: 40%; }
    CollectivesScreen #heatmap { height: 1fr; }
    CollectivesScreen #heat-scale { height: 1; padding: 0 1; }
    CollectivesScreen #groups { height: auto; padding: 0 1; }
    CollectivesScreen #empty { padding: 1 2; color: $text-muted; }
    """

    def __init__(self, analysis: Analysis) -> None:
        super().__init__(analysis)
        self.collectives = ordered_collectives(analysis)  # the position is the collective's number (#1, #2 …)
        self.number = {id(c): i + 1 for i, c in enumerate(self.collectives)}

    def compose_body(self) -> ComposeResult:
        a = self.analysis
        yield Heading("collectives in the profiled window · transfer: shortest duration across ranks; "
                      "wait: the rest (mean over ranks)", markup=False)
        if not self.collectives:
            yield Static("no collectives in the profiled window", id="empty")
            return
        yield SortableTable(collective_columns(self.number), self.collectives,
                            lambda c: f"#{self.number[id(c)]} {c.op} {c.process_group}", sort=0,
                            noun="collectives", id="collectives")
        yield Caption("", id="table-caption")
        if a.process_groups:
            yield Static(groups_text(a), id="groups")
        yield Heading("waiting per rank and collective (ms; columns as in the table, by #)", markup=False)
        ranks = sorted({r.rank for r in a.ranks} | {int(k) for c in self.collectives for k in c.wait_by_rank_us
                                                    if str(k).lstrip("-").isdigit()})
        yield WaitHeatmap(ranks, {s.rank for s in a.stragglers}, id="heatmap")
        yield Static("", id="heat-scale")

    @on(TableViewChanged, "#collectives")
    def follow_table(self, message: TableViewChanged) -> None:
        """The heatmap shows the table's rows, in the table's order."""
        table = self.query_one("#collectives", SortableTable)
        shown = [table.items[i] for i in table.shown][:HEAT_COLUMNS]
        heat = self.query_one(WaitHeatmap)
        heat.set_columns([HeatColumn(f"#{self.number[id(c)]}", {int(k): v for k, v in c.wait_by_rank_us.items()
                                                                 if str(k).lstrip("-").isdigit()}) for c in shown])
        self.query_one("#heat-scale", Static).update(heat.scale_text())
        for caption in self.query("#table-caption").results(Caption):
            caption.update(message.caption)
        message.stop()
