"""Rank × collective heatmap of waiting time: one row per rank, one coloured cell per
collective (the ms that rank waited in it), a sticky header row and rank column."""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pardiag import style
from pardiag.tui import format as fmt

CELL = 8
LABEL = 12


@dataclass(frozen=True)
class HeatColumn:
    title: str  # short: "#3"
    values: dict[int, float]  # rank -> us


class WaitHeatmap(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    WaitHeatmap {
        height: 1fr;
        scrollbar-size: 1 1;
    }
    WaitHeatmap:focus {
        background-tint: $primary 5%;
    }
    """

    def __init__(self, ranks: list[int], stragglers: set[int], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.ranks = ranks
        self.stragglers = stragglers
        self.columns: list[HeatColumn] = []
        self.top = 0.0

    def set_columns(self, columns: list[HeatColumn]) -> None:
        self.columns = columns
        self.top = max((v for c in columns for v in c.values.values()), default=0.0)
        self.virtual_size = Size(LABEL + CELL * (len(columns) + 1), len(self.ranks) + 1)
        self.refresh()

    def _label(self, rank: int) -> list[Segment]:
        mark = " ▲" if rank in self.stragglers else ""
        text = f"rank {rank}{mark}"[: LABEL - 1].ljust(LABEL)
        st = Style(bold=True, color=style.SEVERITY_COLOURS["high"]) if mark else Style(bold=True)
        return [Segment(text, st)]

    def _cell(self, us: float | None) -> Segment:
        if us is None:
            return Segment("·".center(CELL), Style(dim=True))
        text = f"{us / 1000:.1f}" if us < 1e6 else f"{us / 1e6:.0f}s"
        return Segment(text.rjust(CELL - 1) + " ", fmt.heat_style(us / self.top if self.top > 0 else 0.0))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        body_w = max(0, width - LABEL)
        if y == 0:
            head = [Segment(c.title.center(CELL), Style(bold=True)) for c in self.columns]
            head.append(Segment("total".center(CELL), Style(bold=True, italic=True)))
            cells = Strip(head).crop(scroll_x, scroll_x + body_w)
            return Strip([Segment("".ljust(LABEL)), *cells]).adjust_cell_length(width)
        row = y + scroll_y - 1
        if row >= len(self.ranks):
            return Strip.blank(width)
        rank = self.ranks[row]
        values = [c.values.get(rank) for c in self.columns]
        known = [v for v in values if v is not None]
        segs = [self._cell(v) for v in values]
        total = sum(known) if known else None
        segs.append(Segment((fmt.ms(total) if total is not None else "-").rjust(CELL - 1) + " ", Style(italic=True)))
        cells = Strip(segs).crop(scroll_x, scroll_x + body_w)
        return Strip([*self._label(rank), *cells]).adjust_cell_length(width)

    def scale_text(self) -> Text:
        """The colour scale, for a caption under the map."""
        steps = [fmt.heat_style(i / 4) for i in range(5)]
        text = Text("wait: ")
        for i, st in enumerate(steps):
            text.append(f" {self.top * i / 4 / 1000:.1f} ", st)
        text.append(" ms in the profiled window; · not matched on that rank", style="dim")
        return text
