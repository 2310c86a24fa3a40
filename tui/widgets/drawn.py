"""A widget whose content is drawn for its current width (bars that fill the line)."""

from __future__ import annotations

from typing import Callable

from rich.console import RenderableType
from textual.geometry import Size
from textual.widget import Widget

Draw = Callable[[int], RenderableType]


class Drawn(Widget):
    """`draw(width)` is called with the content width each time the widget renders."""

    DEFAULT_CSS = """
    Drawn {
        height: auto;
        padding: 0 1;
    }
    """

    def __init__(self, draw: Draw, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._draw = draw

    def set_draw(self, draw: Draw) -> None:
        self._draw = draw
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        return self._draw(max(1, self.content_size.width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        console = self.app.console
        lines = console.render_lines(self._draw(max(1, width)), console.options.update_width(max(1, width)), pad=False)
        return len(lines)
