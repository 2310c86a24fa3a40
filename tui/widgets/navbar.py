"""The row of screen names at the top of every screen: the current one highlighted,
each clickable, its number the key that opens it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from pardiag.tui.messages import Navigate

# mode name, key, label: the app's top-level screens, in key order
SCREENS: tuple[tuple[str, str, str], ...] = (
    ("overview", "1", "Overview"),
    ("collectives", "2", "Collectives"),
    ("timeline", "3", "Timeline"),
    ("nccl", "4", "Comm setup"),
    ("findings", "5", "Findings"),
)

_GROUP = Binding.Group("screens", compact=True)


def screen_bindings(prefix: str = "") -> list[Binding]:
    """The number keys: `prefix` "app." where a screen (a modal) binds them for the app."""
    return [Binding(key, f"{prefix}show('{name}')", label.lower(), group=_GROUP) for name, key, label in SCREENS]


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
        for screen, key, label in SCREENS:
            yield NavTab(screen, key, label, screen == self.current)
        yield Static(self.crumb, id="nav-crumb", markup=False)
