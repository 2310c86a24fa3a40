"""The output formats of an Analysis: one row each, name -> renderer.

`pardiag report --format` offers exactly these, and tests/diag/test_renderers.py runs every
row over the same analyses. A renderer takes the Analysis and returns the whole
output as text; it imports its heavy library (rich, jinja2, plotly) only when called.
`quote` is how a string from the run (a finding's title, a host name) appears in that
output: escaped for markdown and HTML, as a JSON string body for JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from pardiag.analysis import Analysis

TEXT_WIDTH = 120  # columns of the terminal summary when it is written to a file or a pipe


@dataclass(frozen=True)
class OutputFormat:
    name: str
    help: str
    render: Callable[[Analysis], str]
    quote: Callable[[str], str]
    to_file: bool  # written to a file unless -o says otherwise; else to stdout


def _html(a: Analysis) -> str:
    from pardiag.report_html import render_html

    return render_html(a)


def _html_quote(s: str) -> str:
    from markupsafe import escape

    return str(escape(s))


def _markdown(a: Analysis) -> str:
    from pardiag.report_md import render_markdown

    return render_markdown(a)


def _md_quote(s: str) -> str:
    from pardiag.report_md import md_text

    return md_text(s)


def _json(a: Analysis) -> str:
    return a.to_json() + "\n"


def _json_quote(s: str) -> str:
    return json.dumps(s)[1:-1]


def _text(a: Analysis) -> str:
    from pardiag.render_text import summary_text

    return summary_text(a, width=TEXT_WIDTH)


FORMATS: dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("html", "one self-contained page that works offline (charts, tables, findings)", _html, _html_quote, True),
    OutputFormat("md", "a summary sized for a pull-request comment", _markdown, _md_quote, False),
    OutputFormat("json", "the Analysis", _json, _json_quote, False),
    OutputFormat("text", "the terminal summary, without colours", _text, lambda s: s, False),
)}


def render(a: Analysis, name: str) -> str:
    return FORMATS[name].render(a)
