"""The row of screen names at the top of every screen: the current one highlighted,
each clickable, its number the key that opens it. The screens are the rows of
`pardiag.tui.screen_table`."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from pardiag.tui.messages import Navigate


class NavTab(Static):
    DEFAULT_CSS = """
    NavTab {
        width: auto;
        padding: 0 1;
        color: $text-muted;
    }
    NavTab:hover {
        background: $boost;
        color: $text;
    }
    NavTab.-active {
        background: $primary;
        color: $text;
        text-style: bold;
    }
    """

    def __init__(self, screen: str, key: str, label: str, active: bool) -> None:
        super().__init__(f"{key} {label}", classes="-active" if active else "", id=f"nav-{screen}")
        self.target = screen

    def on_click(self) -> None:
        self.post_message(Navigate(self.target))


class NavBar(Horizontal):
    DEFAULT_CSS = """
    NavBar {
        height: 1;
        dock: top;
        background: $panel;
    }
    NavBar > #nav-crumb {
        width: 1fr;
        padding: 0 1;
        color: $text-muted;
        text-align: right;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, current: str, crumb: str = "") -> None:
        super().__init__()
        self.current = current
        self.crumb = crumb

    def compose(self) -> ComposeResult:
        # imported here: the table imports the screens, and every screen imports this bar
        from pardiag.tui.screen_table import SCREENS

        for row in SCREENS:
            yield NavTab(row.mode, row.key, row.label, row.mode == self.current)
        yield Static(self.crumb, id="nav-crumb", markup=False)
