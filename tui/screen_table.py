"""The app's top-level screens, one row each: the number key that opens it, the label on
the screen bar, the class, and its line in the help. The app's modes and bindings, the
screen bar and the help screen are all built from this table, so a new screen is one row
here and one module in `screens/`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from textual.binding import Binding
from textual.screen import Screen

from pardiag.analysis import Analysis
from pardiag.tui.screens.collectives import CollectivesScreen
from pardiag.tui.screens.findings import FindingsScreen
from pardiag.tui.screens.nccl import NcclScreen
from pardiag.tui.screens.overview import OverviewScreen
from pardiag.tui.screens.timeline import TimelineScreen


@dataclass(frozen=True)
class ScreenRow:
    mode: str  # the app's mode name; the screen's NAV; the screen bar's tab id is nav-<mode>
    key: str
    label: str
    screen: Callable[[Analysis], Screen[None]]
    help: str
    # screens this one opens (pushed over it, no key of their own): (label, help), listed under it in the help
    opens: tuple[tuple[str, str], ...] = ()


SCREENS: tuple[ScreenRow, ...] = (
    ScreenRow("overview", "1", "Overview", OverviewScreen,
              "per rank: step time over all steps (p50, p90, max), where the profiled time went, waiting per step; "
              "stragglers marked ▲; the top findings",
              opens=(("Rank", "phases per step, breakdown, GPU timeline, operator statistics, host phases, telemetry"),)),
    ScreenRow("collectives", "2", "Collectives", CollectivesScreen,
              "per operation and process group: transfer versus waiting, bandwidth; which rank waits "
              "in which collective (heatmap)"),
    ScreenRow("timeline", "3", "Timeline", TimelineScreen,
              "a profiled step of every rank in time order, one lane per rank on one clock, each cell coloured "
              "by the category covering most of it; any profiled step; a collective marked on every rank with "
              "its wait and transfer (without a step timeline: each rank's step split in proportion)"),
    ScreenRow("nccl", "4", "Comm setup", NcclScreen,
              "NCCL per host: versions, network, transports; errors, warnings and environment problems; "
              "the diagnosis of a hang"),
    ScreenRow("findings", "5", "Findings", FindingsScreen,
              "what to change, with evidence, estimated saving, assumption and the code or environment"),
)

BY_MODE: dict[str, ScreenRow] = {row.mode: row for row in SCREENS}

_GROUP = Binding.Group("screens", compact=True)


def screen_bindings(prefix: str = "") -> list[Binding]:
    """The number keys: `prefix` "app." where a screen (a modal) binds them for the app."""
    return [Binding(row.key, f"{prefix}show('{row.mode}')", row.label.lower(), group=_GROUP) for row in SCREENS]


def help_rows() -> list[tuple[str, str]]:
    """(label, help) of every screen, each followed by the screens it opens."""
    return [entry for row in SCREENS for entry in ((row.label, row.help), *row.opens)]


def keys_help() -> tuple[str, str]:
    """The help's line for the number keys: ("1 … 5", "overview · collectives · …")."""
    return f"{SCREENS[0].key} … {SCREENS[-1].key}", " · ".join(row.label.lower() for row in SCREENS)
