"""Shown while the analysis runs in a worker thread: what is read, how far along, and
the keys that still work (help, quit)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Center, Middle, Vertical
from textual.screen import Screen
from textual.widgets import Footer, LoadingIndicator, ProgressBar, Static


class LoadingScreen(Screen[None]):
    DEFAULT_CSS = """
    LoadingScreen { background: $surface; }
    LoadingScreen #loading-box { width: 64; height: auto; border: round $primary; padding: 1 2; }
    LoadingScreen #loading-title { text-style: bold; width: 100%; }
    LoadingScreen #loading-source { color: $text-muted; width: 100%; text-wrap: nowrap; text-overflow: ellipsis; }
    LoadingScreen LoadingIndicator { height: 1; margin: 1 0 0 0; }
    LoadingScreen ProgressBar { margin: 1 0 0 0; }
    LoadingScreen #loading-status { width: 100%; color: $text-muted; }
    LoadingScreen #loading-status.-error { color: $error; text-style: bold; }
    """

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source
        self.started = time.monotonic()
        self.failed = False

    def compose(self) -> ComposeResult:
        with Middle(), Center(), Vertical(id="loading-box"):
            yield Static("pardiag · analysing", id="loading-title")
            yield Static(self.source, id="loading-source", markup=False)
            yield LoadingIndicator()
            yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Static("reading traces…", id="loading-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(0.5, self._tick)

    def _tick(self) -> None:
        if not self.failed:
            bar = self.query_one(ProgressBar)
            done = f"{int(bar.progress)}/{int(bar.total)} traces" if bar.total else "looking for traces"
            self.query_one("#loading-status", Static).update(f"{done} · {time.monotonic() - self.started:.0f} s")

    def progress(self, done: int, total: int | None) -> None:
        self.query_one(ProgressBar).update(total=total, progress=done)
        self._tick()

    def fail(self, error: str) -> None:
        self.failed = True
        self.query_one(LoadingIndicator).display = False
        self.query_one(ProgressBar).display = False
        status = self.query_one("#loading-status", Static)
        status.update(Text(f"{error}\n\nq quits"))
        status.add_class("-error")
