"""3 Timeline: a profiled step of every rank, in time order, one lane per rank on one
clock (the Analysis' ``step_timeline``). An Analysis without it (a run without traces, or
one written before the block) shows each rank's profiled step split in proportion by
category instead: a share of a step, not the order of events in it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from pardiag import style
from pardiag.display import over_time_lines
from pardiag.tui import format as fmt
from pardiag.tui.messages import CollectiveChosen
from pardiag.tui.screens.base import PardiagScreen, Sortable
from pardiag.tui.step_events import profiled_steps
from pardiag.tui.widgets.labels import Caption, Heading
from pardiag.tui.widgets.lanes import Lanes
from pardiag.tui.widgets.step_lanes import StepLanes

OVER_TIME_WIDTH = 96
NOTE = ("share of a profiled step: each lane is the rank's profiled time per step, split in proportion by category "
        "(the order of events inside the step is not kept); longer lanes are slower ranks")
NO_EVENTS = "no step timeline in this analysis (no rank's trace has a step every rank recorded): shares shown instead"
KEYS = "+/- zoom · ←/→ home/end scroll · [ ] step · tab/shift+tab collective · 0 fit"


class TimelineScreen(PardiagScreen):
    NAV = "timeline"
    DEFAULT_CSS = """
    TimelineScreen #legend { height: 1; padding: 0 1; }
    TimelineScreen #note { height: auto; padding: 0 1; color: $text-muted; }
    TimelineScreen #empty { padding: 1 2; color: $text-muted; }
    TimelineScreen #detail { height: auto; padding: 0 1; }
    TimelineScreen #over-time { height: auto; padding: 0 1; }
    TimelineScreen .over-time-line { height: auto; padding: 0 1; }
    """

    def compose_body(self) -> ComposeResult:
        a = self.analysis
        steps = profiled_steps(a.step_timeline)
        if steps:
            total = a.step_timeline.get("ranks_total") if a.step_timeline else None
            yield Heading("a profiled step of every rank, in time order, on one clock", markup=False)
            yield Static(fmt.legend(style.CATEGORY_LABELS, style.CATEGORY_COLOURS), id="legend")
            yield StepLanes(steps, total if type(total) is int else len(steps[0].ranks), id="lanes")
            yield Caption("", id="table-caption")
            yield Static("", id="detail", markup=False)
            yield Static(KEYS, id="note", markup=False)
            return
        ranks = [r for r in a.ranks if r.window_us > 0]
        if not ranks:
            yield Static("no rank has a profiled window: nothing to draw", id="empty")
            return
        yield Heading("one profiled step across ranks (share of a profiled step)", markup=False)
        yield Static(fmt.legend(style.CATEGORY_LABELS, style.CATEGORY_COLOURS), id="legend")
        yield Static(f"{NO_EVENTS}; {NOTE}", id="note", markup=False)
        yield Lanes(ranks, {s.rank for s in a.stragglers}, id="lanes")
        yield Caption("", id="table-caption")
        if a.temporal and len(a.temporal.get("steps") or []) >= 2:
            yield Heading("the whole run, step by step (P profiled, | change of level, * spike)", markup=False)
            yield Static(fmt.over_time_text(a.temporal, OVER_TIME_WIDTH), id="over-time")
            for line in over_time_lines(a):
                yield Static(line, classes="over-time-line", markup=False)

    def on_mount(self) -> None:
        for lanes in self.query("#lanes"):
            lanes.focus()

    def on_collective_chosen(self, message: CollectiveChosen) -> None:
        for detail in self.query("#detail").results(Static):
            detail.update(message.detail)

    def sort_target(self) -> Sortable | None:
        found = self.query(Lanes)
        return found.first() if found else None
