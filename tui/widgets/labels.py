"""One-line labels: a section heading and a dim caption."""

from __future__ import annotations

from textual.widgets import Static


class Caption(Static):
    """One dim line under a table: how it is sorted and filtered."""

    DEFAULT_CSS = """
    Caption {
        height: 1;
        color: $text-muted;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """


class Heading(Static):
    DEFAULT_CSS = """
    Heading {
        height: 1;
        padding: 0 1;
        text-style: bold;
        color: $text;
        background: $boost;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """
