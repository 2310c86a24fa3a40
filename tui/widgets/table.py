"""A DataTable of items that sorts by any column (`s` cycles, a header click picks one)
and filters its rows by text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text
from textual.timer import Timer
from textual.widgets import DataTable

from pardiag.tui.messages import TableViewChanged

T = TypeVar("T")
DEBOUNCE_ROWS = 200  # past this many rows, filtering waits for a pause in the typing
DEBOUNCE_S = 0.15


@dataclass(frozen=True)
class Column(Generic[T]):
    label: str
    cell: Callable[[T], RenderableType]
    key: Callable[[T], Any] | None = None  # sort key; None: the column does not sort
    width: int | None = None
    descending: bool = True  # the first sort on this column puts the largest first
    right: bool = True  # numbers right-aligned
    fill: bool = False  # takes the width the other columns leave (text that may be clipped)


class _Cell:
    """A cell the table does not measure: the widths are computed once per column set
    (measuring every cell on every re-sort is what makes a 512-row table slow)."""

    __slots__ = ("renderable", "index")

    def __init__(self, renderable: RenderableType, index: int) -> None:
        self.renderable = renderable
        self.index = index  # of the item in the table's items

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.renderable


def _sort_key(get: Callable[[Any], Any]) -> Callable[[Any], tuple[bool, Any]]:
    def key(item: Any) -> tuple[bool, Any]:
        v = get(item)
        return (v is None, v if v is not None else 0)

    return key


class SortableTable(DataTable[RenderableType], Generic[T]):
    DEFAULT_CSS = """
    SortableTable {
        height: 1fr;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 1;
        scrollbar-background: $panel;
        scrollbar-color: $panel-lighten-3;
        scrollbar-color-hover: $primary 60%;
    }
    SortableTable > .datatable--header {
        text-style: bold;
    }
    """

    def __init__(
        self,
        columns: Sequence[Column[T]],
        items: Sequence[T],
        text_of: Callable[[T], str],
        *,
        sort: int | None = None,
        noun: str = "rows",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id, classes=classes,
                         cursor_foreground_priority="renderable")
        self.columns_spec: list[Column[T]] = list(columns)
        self.items: list[T] = list(items)
        self._text = [text_of(i).lower() for i in self.items]
        self.sort_column: int | None = sort
        self.sort_descending = columns[sort].descending if sort is not None else False
        self.filter_text = ""
        self.noun = noun
        self.shown: list[int] = []  # indices into items, in display order
        self._cells: list[list[RenderableType]] = []  # per item, per column
        self._widths: list[int] = []
        self._filter_timer: Timer | None = None

    def on_mount(self) -> None:
        self.rebuild(columns=True)

    # -- what the screens call ---------------------------------------------------------------

    def set_columns(self, columns: Sequence[Column[T]]) -> None:
        """New columns (e.g. a bar that changes width with the terminal); sort kept."""
        self.columns_spec = list(columns)
        self._cells = []
        self.rebuild(columns=True)

    def cycle_sort(self) -> None:
        sortable = [i for i, c in enumerate(self.columns_spec) if c.key is not None]
        if not sortable:
            return
        nxt = sortable[0] if self.sort_column not in sortable else sortable[(sortable.index(self.sort_column) + 1) % len(sortable)]
        self.sort_by(nxt)

    def sort_by(self, index: int, descending: bool | None = None) -> None:
        if self.columns_spec[index].key is None:
            return
        if descending is None:
            descending = (not self.sort_descending) if index == self.sort_column else self.columns_spec[index].descending
        self.sort_column, self.sort_descending = index, descending
        if not self._cells:
            self.rebuild(columns=True)
            return
        keep = self.current_item()
        self.shown = self._order()  # same rows, new order: moved in place, not added again
        position = {i: n for n, i in enumerate(self.shown)}
        self.sort(key=lambda cells: position[cells[0].index])
        for i, (spec, column) in enumerate(zip(self.columns_spec, self.ordered_columns)):
            column.label = self._header(i, spec)
        self._restore(keep)

    def reverse_sort(self) -> None:
        if self.sort_column is not None:
            self.sort_by(self.sort_column, not self.sort_descending)

    def set_filter(self, text: str) -> None:
        """Keep the rows that contain every word; a long table waits for a pause in the
        typing, so that each key stays instant."""
        self.filter_text = text.strip()
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
        if len(self.items) > DEBOUNCE_ROWS:
            self._filter_timer = self.set_timer(DEBOUNCE_S, self.rebuild)
        else:
            self.rebuild()

    def flush_filter(self) -> None:
        """Apply a filter still waiting for a pause in the typing, now."""
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
            self.rebuild()

    def current_item(self) -> T | None:
        if not self.shown or self.cursor_row < 0 or self.cursor_row >= len(self.shown):
            return None
        return self.items[self.shown[self.cursor_row]]

    def caption(self) -> str:
        parts = []
        if self.sort_column is not None:
            parts.append(f"sorted by {self.columns_spec[self.sort_column].label} {'▼' if self.sort_descending else '▲'}")
        if self.filter_text:
            parts.append(f"filter “{self.filter_text}”: {len(self.shown)} of {len(self.items)} {self.noun}")
            if not self.shown:
                parts.append(f"no {self.noun} match")
        else:
            parts.append(f"{len(self.items)} {self.noun[:-1] if len(self.items) == 1 and self.noun.endswith('s') else self.noun}")
        return " · ".join(parts)

    # -- building ----------------------------------------------------------------------------

    def _order(self) -> list[int]:
        terms = self.filter_text.lower().split()
        idx = [i for i, t in enumerate(self._text) if all(term in t for term in terms)]
        if self.sort_column is not None:
            get = self.columns_spec[self.sort_column].key
            assert get is not None
            key = _sort_key(get)
            known = [i for i in idx if key(self.items[i])[0] is False]
            unknown = [i for i in idx if key(self.items[i])[0] is True]
            known.sort(key=lambda i: key(self.items[i])[1], reverse=self.sort_descending)
            idx = known + unknown  # missing values last, whichever the direction
        return idx

    def _header(self, i: int, c: Column[T]) -> Text:
        label = c.label
        if i == self.sort_column:
            label += " ▼" if self.sort_descending else " ▲"
        return Text(label, justify="right" if c.right else "left")

    def _render_cells(self) -> None:
        self._cells = [[self._cell(c, item) for c in self.columns_spec] for item in self.items]
        self._widths = []
        for i, c in enumerate(self.columns_spec):
            if c.width is not None:
                self._widths.append(c.width)
                continue
            header = len(c.label) + 2  # room for the sort arrow
            self._widths.append(max([header, *(self._measure(row[i]) for row in self._cells)]))
        self._fill()

    def _measure(self, cell: RenderableType) -> int:
        if isinstance(cell, Text):
            return cell.cell_len  # one line, no wrapping: its length (cheap, unlike Measurement)
        console = self.app.console
        return Measurement.get(console, console.options, cell).maximum

    def _fill(self) -> bool:
        """Give a `fill` column what the others leave of the table's width; True if changed."""
        changed = False
        for i, c in enumerate(self.columns_spec):
            if not c.fill or not self.size.width:
                continue
            others = sum(w for j, w in enumerate(self._widths) if j != i) + 2 * len(self._widths)
            natural = max([len(c.label) + 2, *(self._measure(row[i]) for row in self._cells)])
            width = max(len(c.label) + 2, min(natural, self.size.width - others - 1))
            changed |= self._widths[i] != width
            self._widths[i] = width
        return changed

    def on_resize(self) -> None:
        if self._cells and self._fill():
            self.rebuild(columns=True)

    def rebuild(self, columns: bool = False) -> None:
        keep = self.current_item()
        self.clear(columns=columns)
        if not self._cells or not self._widths:
            self._render_cells()
            if not columns:
                self.clear(columns=True)
                columns = True
        if columns:
            for i, c in enumerate(self.columns_spec):
                self.add_column(self._header(i, c), width=self._widths[i], key=f"c{i}")
        self.shown = self._order()
        for i in self.shown:
            self.add_row(*(_Cell(cell, i) for cell in self._cells[i]), key=str(i))
        self._restore(keep)

    def _restore(self, keep: T | None) -> None:
        """The cursor back on the item it was on; tell the screen what is shown."""
        if keep is not None and self.shown:
            pos = next((n for n, i in enumerate(self.shown) if self.items[i] is keep), 0)
            self.move_cursor(row=pos, animate=False)
        self.refresh()
        self.post_message(TableViewChanged(self, self.caption(), len(self.shown), len(self.items)))

    @staticmethod
    def _cell(c: Column[T], item: T) -> RenderableType:
        v = c.cell(item)
        if isinstance(v, str):
            return Text(v, justify="right" if c.right else "left", no_wrap=True, overflow="ellipsis")
        return v

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(event.column_index)
