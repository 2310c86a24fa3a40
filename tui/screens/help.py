"""`?`: every key, what each screen shows, and what the colours mean."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from pardiag import style
from pardiag.tui import format as fmt
from pardiag.tui.screen_table import help_rows, keys_help, screen_bindings

_NUMBER_KEYS, _SCREEN_NAMES = keys_help()

KEYS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("everywhere", (
        (_NUMBER_KEYS, f"{_SCREEN_NAMES} (or click the bar on top)"),
        ("?", "this help (esc closes it)"),
        ("/", "filter the rows of the screen's table by text; enter keeps, esc clears"),
        ("s / S", "sort by the next column / reverse the order (or click a column header)"),
        ("↑ ↓ pgup pgdn", "move; tab moves between the parts of a screen"),
        ("q", "quit"),
    )),
    ("overview", (("enter", "open the rank under the cursor"),)),
    ("rank", (("n / p", "next / previous rank"), ("esc", "back to the overview"))),
    ("collectives", (("tab", "move to the heatmap; arrows scroll it"),)),
    ("timeline", (("+ / -", "zoom in / out, to µs"),
                  ("← / →", "scroll a quarter of the view"), ("home / end", "start / end of the step"),
                  ("[ / ]", "previous / next profiled step"),
                  ("tab ⇧tab", "next / previous collective, marked on every rank"),
                  ("0", "fit the step"))),
    ("findings", (("enter", "open the finding"), ("c", "copy its change (code, environment) to the clipboard"),
                  ("n / p", "next / previous finding (when open)"), ("esc", "back to the list"))),
)


def help_text() -> RenderableType:
    keys = Table.grid(padding=(0, 2))
    keys.add_column(style="bold", no_wrap=True)
    keys.add_column(no_wrap=True, style="cyan")
    keys.add_column()
    for where, rows in KEYS:
        for i, (key, what) in enumerate(rows):
            keys.add_row(where if i == 0 else "", key, what)
    screens = Table.grid(padding=(0, 2))
    screens.add_column(style="bold", no_wrap=True)
    screens.add_column()
    for name, what in help_rows():
        screens.add_row(name, what)
    return Group(
        Text("keys", style="bold underline"), keys, Text(""),
        Text("screens", style="bold underline"), screens, Text(""),
        Text("colours (as in report.html)", style="bold underline"),
        fmt.legend(style.CATEGORY_LABELS, style.CATEGORY_COLOURS),
        fmt.legend(style.PHASE_LABELS, style.PHASE_COLOURS),
        Text.assemble(fmt.severity_badge("high"), " ", fmt.severity_badge("medium"), " ", fmt.severity_badge("low"),
                      "  finding severity"),
        Text.assemble(("█ ", style.TRANSFER_COLOUR), "transfer  ", ("█ ", style.WAIT_COLOUR), "waiting in collectives"),
    )


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%;
        max-width: 120;
        height: 90%;
        border: round $primary;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("question_mark", "close", "close", show=False),
        *screen_bindings("app."),
        Binding("q", "app.quit", "quit"),
    ]

    def compose(self) -> ComposeResult:
        body = VerticalScroll(Static(help_text(), id="help-text"))
        body.border_title = "pardiag tui · help"
        yield body
        yield Footer()

    def action_close(self) -> None:
        self.dismiss()
