"""One table of screens: the app's number keys and modes, the screen bar on top of every
screen and the help's list of screens all come from `pardiag.tui.screen_table`, so a
screen added there shows up in all three."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.binding import Binding

from pardiag import analysis as model
from pardiag.tui.app import PardiagApp
from pardiag.tui.screen_table import SCREENS, help_rows
from pardiag.tui.screens.help import KEYS, HelpScreen, help_text
from pardiag.tui.widgets.navbar import NavTab

DATA = Path(__file__).resolve().parents[1] / "data"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_rows_are_distinct_and_name_their_screen() -> None:
    assert len({row.key for row in SCREENS}) == len({row.mode for row in SCREENS}) == len(SCREENS)
    for row in SCREENS:
        assert getattr(row.screen, "NAV") == row.mode, row


def test_app_bindings_are_the_table() -> None:
    shows = [(b.key, b.action, b.description) for b in PardiagApp.BINDINGS
             if isinstance(b, Binding) and b.action.startswith("show(")]
    assert shows == [(row.key, f"show('{row.mode}')", row.label.lower()) for row in SCREENS]


def help_screens_listed() -> list[str]:
    """The lines under "screens" in the help, as the help screen prints them."""
    console = Console(width=400, file=io.StringIO(), record=True)
    console.print(help_text())
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    start = lines.index("screens") + 1
    return lines[start:lines.index("", start)]


def test_help_lists_the_table() -> None:
    listed = help_screens_listed()
    assert len(listed) == len(help_rows())
    for line, (label, what) in zip(listed, help_rows()):
        assert line.startswith(label + "  ") and line.endswith(what), line
    table_entries = [(row.label, row.help) for row in SCREENS]
    assert [entry for entry in help_rows() if entry in table_entries] == table_entries
    number_keys = dict(KEYS)["everywhere"][0]
    assert number_keys[0] == f"{SCREENS[0].key} … {SCREENS[-1].key}"
    assert number_keys[1].startswith(" · ".join(row.label.lower() for row in SCREENS))
    modal_keys = [(b.key, b.action) for b in HelpScreen.BINDINGS if isinstance(b, Binding) and "show(" in b.action]
    assert modal_keys == [(row.key, f"app.show('{row.mode}')") for row in SCREENS]


async def test_navbar_and_modes_are_the_table() -> None:
    app = PardiagApp(model.load(DATA / "tui-demo.analysis.json"))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        for row in SCREENS:
            await pilot.press(row.key)
            await pilot.pause()
            assert app.current_mode == row.mode
            assert isinstance(app.screen, row.screen)
            tabs = list(app.screen.query(NavTab))
            assert [(tab.id, str(tab.content)) for tab in tabs] == [
                (f"nav-{r.mode}", f"{r.key} {r.label}") for r in SCREENS]
            assert [tab.has_class("-active") for tab in tabs] == [r is row for r in SCREENS]
