"""A titled block of a detail screen: a heading line over drawn content."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from pardiag.tui.widgets.labels import Heading
from pardiag.tui.widgets.drawn import Draw, Drawn


class Section(Vertical):
    DEFAULT_CSS = """
    Section {
        height: auto;
        margin: 0 0 1 0;
    }
    """

    def __init__(self, title: str, draw: Draw, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.draw = draw

    def compose(self) -> ComposeResult:
        yield Heading(self.title, markup=False)
        yield Drawn(self.draw)
