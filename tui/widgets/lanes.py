"""Timeline lanes: one lane per rank, the rank's profiled time per step split in
proportion by category. Zoom (+/-) and scroll (←/→) along the step; up/down through the
ranks; a sticky axis in ms."""

from __future__ import annotations

import math
from typing import Callable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pardiag import style
from pardiag.analysis import RankResult
from pardiag.tui import format as fmt
from pardiag.tui.messages import TableViewChanged

LABEL = 12
ZOOM_STEP = 1.5
MAX_ZOOM = 256.0

# lane orders that `s` cycles through: name, key (largest first unless noted)
ORDERS: tuple[tuple[str, Callable[[RankResult], float], bool], ...] = (
    ("rank", lambda r: float(r.rank), False),
    ("profiled step", lambda r: r.window_us / r.steps_profiled if r.steps_profiled else 0.0, True),
    ("comm exposed", lambda r: fmt.share(r, "comm_exposed") or 0.0, True),
    ("idle", lambda r: fmt.share(r, "idle") or 0.0, True),
)


def nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 × 10^k not below raw."""
    if raw <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def step_of(r: RankResult) -> float:
    return r.window_us / r.steps_profiled if r.steps_profiled else r.window_us


def lane_segments(r: RankResult) -> list[fmt.Segment]:
    scale = step_of(r) / r.window_us if r.window_us > 0 else 0.0
    return fmt.stacked((r.breakdown_us.get(k, 0.0) * scale, style.CATEGORY_COLOURS[k]) for k in style.CATEGORY_LABELS)


class Lanes(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    Lanes {
        height: 1fr;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [
        Binding("plus,equals_sign", "zoom(1)", "zoom in"),
        Binding("minus", "zoom(-1)", "zoom out"),
        Binding("left", "pan(-1)", "scroll", show=False),
        Binding("right", "pan(1)", "scroll", show=False),
        Binding("0", "fit", "fit"),
    ]

    def __init__(self, ranks: list[RankResult], stragglers: set[int], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.all = ranks
        self.stragglers = stragglers
        self.lanes = list(ranks)
        self.segments = {r.rank: lane_segments(r) for r in ranks}
        self.longest = max((step_of(r) for r in ranks), default=0.0) or 1.0
        self.zoom = 1.0
        self.offset_us = 0.0
        self.order = 0
        self.descending = False
        self.filter_text = ""

    def on_mount(self) -> None:
        self._relayout()

    # -- view ------------------------------------------------------------------------------------

    def visible_us(self) -> float:
        return self.longest / self.zoom

    def action_zoom(self, direction: int) -> None:
        centre = self.offset_us + self.visible_us() / 2
        self.zoom = min(MAX_ZOOM, max(1.0, self.zoom * (ZOOM_STEP if direction > 0 else 1 / ZOOM_STEP)))
        self.offset_us = centre - self.visible_us() / 2
        self._clamp()

    def action_pan(self, direction: int) -> None:
        self.offset_us += direction * self.visible_us() / 4
        self._clamp()

    def action_fit(self) -> None:
        self.zoom, self.offset_us = 1.0, 0.0
        self._clamp()

    def _clamp(self) -> None:
        self.offset_us = min(max(0.0, self.offset_us), max(0.0, self.longest - self.visible_us()))
        self.refresh()
        self._announce()

    def view_caption(self) -> str:
        start, end = self.offset_us, self.offset_us + self.visible_us()
        return (f"zoom {self.zoom:.3g}× · {fmt.ms(start, 2)}–{fmt.ms(end, 2)} of {fmt.ms(self.longest, 2)} ms · "
                f"{len(self.lanes)} of {len(self.all)} ranks, by {ORDERS[self.order][0]}"
                + (f" · filter “{self.filter_text}”" if self.filter_text else ""))

    def _announce(self) -> None:
        self.post_message(TableViewChanged(self, self.view_caption(), len(self.lanes), len(self.all)))

    # -- order and filter (the screen's `s`, `S`, `/`) ----------------------------------------------

    def cycle_sort(self) -> None:
        self.order = (self.order + 1) % len(ORDERS)
        self.descending = ORDERS[self.order][2]
        self._relayout()

    def reverse_sort(self) -> None:
        self.descending = not self.descending
        self._relayout()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._relayout()

    def flush_filter(self) -> None:
        """Filtering lanes is immediate: nothing waits."""

    def _relayout(self) -> None:
        terms = self.filter_text.lower().split()
        lanes = [r for r in self.all if all(t in f"rank {r.rank} r{r.rank} {r.host or ''}".lower() for t in terms)]
        lanes.sort(key=ORDERS[self.order][1], reverse=self.descending)
        self.lanes = lanes
        self.virtual_size = Size(self.size.width, len(lanes) + 1)
        self.refresh()
        self._announce()

    # -- drawing ----------------------------------------------------------------------------------

    def _axis(self, width: int) -> Strip:
        body = max(0, width - LABEL)
        cells = [" "] * body
        start, span = self.offset_us, self.visible_us()
        step = nice_step(span * 12 / max(1, body))
        t = math.ceil(start / step) * step
        while t <= start + span and body:
            x = round((t - start) / span * body)
            label = f"|{t / 1000:.6g}"
            if x + len(label) <= body:
                cells[x : x + len(label)] = label
            t += step
        return Strip([Segment("ms".ljust(LABEL), Style(dim=True)), Segment("".join(cells), Style(dim=True))])

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return self._axis(width).adjust_cell_length(width)
        row = y - 1 + self.scroll_offset.y
        if row >= len(self.lanes):
            return Strip.blank(width)
        r = self.lanes[row]
        mark = " ▲" if r.rank in self.stragglers else ""
        label = Text(f"rank {r.rank}{mark}"[: LABEL - 1].ljust(LABEL),
                     style=Style(bold=True, color=style.SEVERITY_COLOURS["high"]) if mark else Style(bold=True))
        bar = fmt.draw(self.segments[r.rank], self.offset_us, self.offset_us + self.visible_us(), max(0, width - LABEL))
        segs = list(label.render(self.app.console)) + list(bar.render(self.app.console))
        return Strip(segs).adjust_cell_length(width)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.lanes) + 1)
