"""What every screen of the app shares: the screen bar on top, the footer with the key
bindings, `/` to filter and `s` to sort the screen's main table (or lanes)."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from pardiag.analysis import Analysis
from pardiag.tui.messages import FilterChanged, FilterDone, TableViewChanged
from pardiag.tui.widgets.filter_bar import FilterBar
from pardiag.tui.widgets.labels import Caption
from pardiag.tui.widgets.navbar import NavBar
from pardiag.tui.widgets.table import SortableTable


@runtime_checkable
class Sortable(Protocol):
    def cycle_sort(self) -> None: ...

    def reverse_sort(self) -> None: ...

    def set_filter(self, text: str) -> None: ...

    def flush_filter(self) -> None: ...


class PardiagScreen(Screen[None]):
    NAV: ClassVar[str] = "overview"  # which entry of the screen bar is lit
    DEFAULT_CSS = """
    PardiagScreen {
        background: $surface;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("s", "sort", "sort"),
        Binding("S", "reverse", "reverse sort", show=False),
    ]

    def __init__(self, analysis: Analysis) -> None:
        super().__init__()
        self.analysis = analysis

    def compose(self) -> ComposeResult:
        yield NavBar(self.NAV, self.crumb())
        yield from self.compose_body()
        yield FilterBar()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def crumb(self) -> str:
        path = str(self.analysis.run.path or "")
        return path if len(path) <= 60 else "…" + path[-59:]

    def on_resize(self) -> None:
        self.call_after_refresh(self.fit_tables)

    def fit_tables(self) -> None:
        """A `-fit` table is as tall as its rows, at most what the screen's other
        widgets leave: short tables keep what follows them close, long ones scroll."""
        for table in self.query(".-fit"):
            parent = table.parent
            if not isinstance(parent, Widget):
                continue
            others = sum(w.outer_size.height for w in parent.children if w is not table and w.display
                         and not w.styles.dock)
            docked = sum(w.outer_size.height for w in parent.children if w.display and w.styles.dock)
            room = max(3, parent.size.height - others - (docked if parent is self else 0))
            current = table.styles.max_height
            if current is None or current.value != room:
                table.styles.max_height = room

    def sort_target(self) -> Sortable | None:
        """What `s`, `S` and `/` act on: by default the first table on the screen."""
        tables = self.query(SortableTable)
        return tables.first() if tables else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("sort", "reverse", "filter"):
            return self.sort_target() is not None
        return True

    def action_sort(self) -> None:
        if (target := self.sort_target()) is not None:
            target.cycle_sort()

    def action_reverse(self) -> None:
        if (target := self.sort_target()) is not None:
            target.reverse_sort()

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()
        self.call_after_refresh(self.fit_tables)

    def on_filter_changed(self, message: FilterChanged) -> None:
        if (target := self.sort_target()) is not None:
            target.set_filter(message.text)

    def on_filter_done(self, message: FilterDone) -> None:
        target: Any = self.sort_target()
        if target is not None:
            target.flush_filter()
        if isinstance(target, Widget):
            target.focus()
        self.call_after_refresh(self.fit_tables)

    def on_table_view_changed(self, message: TableViewChanged) -> None:
        for caption in self.query("#table-caption").results(Caption):
            caption.update(message.caption)
