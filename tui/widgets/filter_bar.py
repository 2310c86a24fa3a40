"""`/`: a one-line filter above the footer; the screen filters its table as you type."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input

from pardiag.tui.messages import FilterChanged, FilterDone


class FilterBar(Input):
    DEFAULT_CSS = """
    FilterBar {
        dock: bottom;
        display: none;
        height: 1;
        border: none;
        padding: 0 1;
        background: $boost;
    }
    FilterBar:focus {
        border: none;
        background-tint: $primary 20%;
    }
    FilterBar.-open {
        display: block;
    }
    """
    BINDINGS = [Binding("escape", "clear", "clear filter")]

    def __init__(self) -> None:
        super().__init__(placeholder="filter rows (all words must match) · enter keeps · esc clears", id="filter")
        self.can_focus = False  # only while open: a hidden input must not take the keys

    def open(self) -> None:
        self.add_class("-open")
        self.can_focus = True
        self.focus()

    def _close(self) -> None:
        self.remove_class("-open")
        self.can_focus = False

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(FilterChanged(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.value.strip():
            self._close()
        self.post_message(FilterDone(cleared=False))

    def action_clear(self) -> None:
        self.value = ""
        self._close()
        self.post_message(FilterChanged(""))
        self.post_message(FilterDone(cleared=True))
