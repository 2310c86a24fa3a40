"""One profiled step of every rank, in time order: a lane per rank on one clock, each
cell coloured by the category covering most of the time it stands for. Zoom (+/-) down to
microseconds, scroll (←/→, home/end), the step ([ / ]), a collective (tab / shift+tab):
the same instance is marked on every rank, its wait and transfer told below."""

from __future__ import annotations

import math

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pardiag import style
from pardiag.tui import format as fmt
from pardiag.tui.messages import CollectiveChosen, TableViewChanged
from pardiag.tui.step_events import ProfiledStep, RankEvents, StepCollective
from pardiag.tui.widgets.lanes import nice_step

LABEL = 10
ZOOM_STEP = 2.0
PAN_SHARE = 0.25  # of the visible time, per ← / →
MIN_VISIBLE_US = 10.0
CELL = "█"
MARK = "━"  # a cell of the chosen collective
EMPTY_LANE = "no events recorded for this rank in this step"


def time_text(us: float) -> str:
    """A duration or time in the unit that suits it: 12.5 µs, 3.36 ms, 1.21 s."""
    a = abs(us)
    if a < 1000:
        return f"{us:.3g} µs"
    if a < 1_000_000:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1e6:.3g} s"


def axis_unit(tick_us: float) -> tuple[str, float]:
    """The axis' unit for ticks this far apart: (name, µs in one)."""
    if tick_us < 1000:
        return "µs", 1.0
    if tick_us < 1_000_000:
        return "ms", 1000.0
    return "s", 1e6


class StepLanes(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    StepLanes {
        height: auto;
        max-height: 1fr;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("plus,equals_sign", "zoom(1)", "zoom in"),
        Binding("minus", "zoom(-1)", "zoom out"),
        Binding("left", "pan(-1)", "scroll", show=False),
        Binding("right", "pan(1)", "scroll", show=False),
        Binding("home", "edge(0)", "start", show=False),
        Binding("end", "edge(1)", "end", show=False),
        Binding("0", "fit", "fit", show=False),
        Binding("left_square_bracket", "step(-1)", "step"),
        Binding("right_square_bracket", "step(1)", "step", show=False),
        Binding("tab,enter", "collective(1)", "collective"),
        Binding("shift+tab", "collective(-1)", "collective", show=False),
    ]

    def __init__(self, steps: list[ProfiledStep], ranks_total: int, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steps = steps
        self.ranks_total = ranks_total
        self.index = (len(steps) - 1) // 2
        self.zoom = 1.0
        self.offset_us = 0.0
        self.chosen: int | None = None  # index into the step's collectives

    @property
    def step(self) -> ProfiledStep:
        return self.steps[self.index]

    @property
    def span_us(self) -> float:
        return self.step.span_us or 1.0

    def on_mount(self) -> None:
        self._relayout()

    # -- view ------------------------------------------------------------------------------------

    def body_width(self) -> int:
        return max(1, self.scrollable_content_region.width - LABEL)

    def visible_us(self) -> float:
        return self.span_us / self.zoom

    def max_zoom(self) -> float:
        return max(1.0, self.span_us / MIN_VISIBLE_US)

    def action_zoom(self, direction: int) -> None:
        centre = self.offset_us + self.visible_us() / 2
        self.zoom = min(self.max_zoom(), max(1.0, self.zoom * (ZOOM_STEP if direction > 0 else 1 / ZOOM_STEP)))
        self.offset_us = centre - self.visible_us() / 2
        self._changed()

    def action_pan(self, direction: int) -> None:
        self.offset_us += direction * self.visible_us() * PAN_SHARE
        self._changed()

    def action_edge(self, end: int) -> None:
        self.offset_us = self.span_us if end else 0.0
        self._changed()

    def action_fit(self) -> None:
        self.zoom, self.offset_us = 1.0, 0.0
        self._changed()

    def action_step(self, direction: int) -> None:
        self.index = min(len(self.steps) - 1, max(0, self.index + direction))
        self.chosen = None
        self.zoom = min(self.zoom, self.max_zoom())
        self._relayout()

    def action_collective(self, direction: int) -> None:
        n = len(self.step.collectives)
        if not n:
            self.chosen = None
        elif self.chosen is None:
            self.chosen = 0 if direction > 0 else n - 1
        else:
            nxt = self.chosen + direction
            self.chosen = nxt if 0 <= nxt < n else None
        if (c := self.collective()) is not None:
            self._bring_into_view(c)
        self._changed()

    def collective(self) -> StepCollective | None:
        return self.step.collectives[self.chosen] if self.chosen is not None else None

    def _bring_into_view(self, c: StepCollective) -> None:
        lo, hi = min(p.start_us for p in c.parts), max(p.end_us for p in c.parts)
        while hi - lo > self.visible_us() and self.zoom > 1.0:  # zoomed out until it fits
            self.zoom = max(1.0, self.zoom / ZOOM_STEP)
        if lo < self.offset_us or hi > self.offset_us + self.visible_us():
            self.offset_us = (lo + hi - self.visible_us()) / 2

    def _changed(self) -> None:
        self.offset_us = min(max(0.0, self.offset_us), max(0.0, self.span_us - self.visible_us()))
        self.refresh()
        self.post_message(TableViewChanged(self, self.view_caption(), len(self.step.ranks), self.ranks_total))
        self.post_message(CollectiveChosen(self, self.detail()))

    def _relayout(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.step.ranks) + 1)
        self._changed()

    def view_caption(self) -> str:
        s, v = self.step, self.visible_us()
        return (f"step {s.step} ({self.index + 1} of {len(self.steps)}) · 1 cell = {time_text(v / self.body_width())}"
                f" · {time_text(self.offset_us)}–{time_text(self.offset_us + v)} of {time_text(self.span_us)}"
                f" · ×{self.zoom:.4g} · {len(s.ranks)} of {self.ranks_total} ranks")

    def detail(self) -> str:
        c = self.collective()
        if c is None:
            n = len(self.step.collectives)
            return (f"{n} collectives matched across ranks in this step: tab / shift+tab chooses one" if n
                    else "no collective of this step is matched across ranks")
        size = f" {fmt.mb(c.bytes)} MB" if c.bytes is not None else ""
        waits = sorted(c.parts, key=lambda p: -p.wait_us)
        shown = waits if len(waits) <= 4 else [waits[0], waits[-1]]
        wait = ", ".join(f"rank {p.rank} {time_text(p.wait_us)}" for p in shown)
        return (f"{self.chosen + 1 if self.chosen is not None else 0} of {len(self.step.collectives)}: "
                f"{c.op}{size} (group {c.process_group}) · transfer {time_text(c.parts[0].transfer_us)} · "
                f"waited: {wait}{' (most, least)' if len(waits) > 4 else ''}")

    def chosen_spans(self) -> dict[int, tuple[float, float]]:
        """The chosen collective on each rank: (start_us, end_us)."""
        c = self.collective()
        return {p.rank: (p.start_us, p.end_us) for p in c.parts} if c is not None else {}

    # -- drawing ----------------------------------------------------------------------------------

    def cell_time(self, x: int) -> tuple[float, float]:
        """The time column ``x`` of the lanes (0: the first after the label) stands for."""
        cell = self.visible_us() / self.body_width()
        return self.offset_us + x * cell, self.offset_us + (x + 1) * cell

    def categories(self, lane: RankEvents) -> list[str | None]:
        return lane.cells(self.offset_us, self.visible_us() / self.body_width(), self.body_width())

    def marks(self, rank: int) -> list[str | None]:
        """Per column: "wait" or "transfer" where the chosen collective is on ``rank``."""
        c = self.collective()
        part = next((p for p in c.parts if p.rank == rank), None) if c is not None else None
        if part is None:
            return [None] * self.body_width()
        split = part.start_us + part.wait_us
        out: list[str | None] = []
        for x in range(self.body_width()):
            t0, t1 = self.cell_time(x)
            wait = max(0.0, min(t1, split) - max(t0, part.start_us))
            transfer = max(0.0, min(t1, part.end_us) - max(t0, split))
            out.append(None if wait + transfer <= 0 and not (t0 <= part.start_us < t1)
                       else "wait" if wait > transfer else "transfer")
        return out

    def _axis(self, width: int) -> Strip:
        body = max(0, width - LABEL)
        cells = [" "] * body
        start, span = self.offset_us, self.visible_us()
        tick = nice_step(span * 12 / max(1, body))
        unit, per = axis_unit(tick)
        t = math.ceil(start / tick) * tick
        while t <= start + span and body:
            x = round((t - start) / span * body)
            label = f"|{t / per:.10g}"
            if x + len(label) <= body:
                cells[x : x + len(label)] = label
            t += tick
        return Strip([Segment(unit.ljust(LABEL), Style(dim=True)), Segment("".join(cells), Style(dim=True))])

    def _lane(self, lane: RankEvents, width: int) -> Strip:
        label = Segment(f"rank {lane.rank}"[: LABEL - 1].ljust(LABEL), Style(bold=True))
        if not lane.segments:
            return Strip([label, Segment(EMPTY_LANE, Style(dim=True, italic=True))]).adjust_cell_length(width)
        cells: list[Segment] = [label]
        for cat, mark in zip(self.categories(lane), self.marks(lane.rank)):
            if mark is not None:
                colour = style.WAIT_COLOUR if mark == "wait" else style.TRANSFER_COLOUR
                cells.append(Segment(MARK, Style(color="#ffffff", bgcolor=colour, bold=True)))
            elif cat is None:
                cells.append(Segment(" "))
            else:
                cells.append(Segment(CELL, Style(color=style.CATEGORY_COLOURS[cat])))
        return Strip(Segment.simplify(cells)).adjust_cell_length(width)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return self._axis(width).adjust_cell_length(width)
        row = y - 1 + self.scroll_offset.y
        if row >= len(self.step.ranks):
            return Strip.blank(width)
        return self._lane(self.step.ranks[row], width)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.step.ranks) + 1)
        self._changed()
