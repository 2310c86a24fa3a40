"""Messages between the TUI's widgets, screens and app, as dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widget import Widget

from pardiag.analysis import Analysis


@dataclass
class LoadProgress(Message):
    """The loader read `done` of `total` traces (total None: not known yet)."""

    done: int
    total: int | None


@dataclass
class AnalysisLoaded(Message):
    analysis: Analysis


@dataclass
class LoadFailed(Message):
    error: str  # one line, for the user


@dataclass
class Navigate(Message):
    """Show one of the top-level screens (a mode of the app)."""

    screen: str


@dataclass
class OpenRank(Message):
    rank: int


@dataclass
class OpenFinding(Message):
    index: int  # in ordered_findings(analysis)


@dataclass
class FilterChanged(Message):
    text: str


@dataclass
class FilterDone(Message):
    cleared: bool  # escape: the filter was cleared; enter: kept


@dataclass
class TableViewChanged(Message):
    """A table's sort or filter changed; `caption` says how, `shown`/`total` rows."""

    source: Widget
    caption: str
    shown: int
    total: int

    @property
    def control(self) -> Widget:
        return self.source


@dataclass
class CollectiveChosen(Message):
    """The timeline's chosen collective changed; `detail` tells its wait, transfer and size."""

    source: Widget
    detail: str

    @property
    def control(self) -> Widget:
        return self.source
