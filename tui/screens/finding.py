"""One finding, opened: evidence, estimated saving and where it comes from (replay or
share, the factors measured or assumed), assumption, and the change to make (code,
environment) with `c` to copy it to the clipboard."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll

from pardiag.analysis import Analysis, Finding
from pardiag.display import action_env_text, estimate_of, estimate_words, factor_words, ordered_findings
from pardiag.tui import format as fmt
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.widgets.section import Section


def change_text(f: Finding) -> str:
    """The change as text to paste: the code, then the environment as shell lines."""
    parts = []
    code, env = f.action.get("code"), f.action.get("env")
    if isinstance(code, str) and code.strip():
        parts.append(code.rstrip("\n"))
    if isinstance(env, dict) and env:
        parts.append(action_env_text(env))
    return "\n".join(parts)


def copy_change(app: App[Any], f: Finding) -> None:
    text = change_text(f)
    if not text:
        app.notify("this finding has no code or environment change to copy", severity="warning")
        return
    app.copy_to_clipboard(text)
    lines = text.count("\n") + 1
    app.notify(f"copied the change ({lines} line{'s' if lines != 1 else ''}) to the clipboard", title="copied")


def head(f: Finding) -> RenderableType:
    ranks = f"rank{'s' if len(set(f.ranks)) > 1 else ''} {fmt.rank_ranges(f.ranks)}" if f.ranks else "all ranks"
    saving = (f"estimated saving: {f.est_saving_pct:.0f}% of the step time" if f.est_saving_pct
              else "no estimate of the saving")
    return Group(
        Text.assemble(fmt.severity_badge(f.severity), " ", (f.title, "bold")),
        Text(f"lever {f.lever} · {ranks}", style="dim"),
        Text(saving, style="bold" if f.est_saving_pct else "dim"),
    )


def evidence(f: Finding) -> RenderableType:
    lines = [Text(f"• {e}") for e in f.evidence] or [Text("no evidence recorded", style="dim")]
    assumption = f.action.get("assumption")
    if isinstance(assumption, str) and assumption:
        lines.append(Text.assemble(("assumption: ", "bold"), assumption))
    return Group(*lines)


def estimate(f: Finding) -> RenderableType | None:
    """Where the saving comes from: the method with its figure, each factor measured
    (where) or assumed, and the replay's edits; None when the analysis does not say."""
    e = estimate_of(f)
    basis = estimate_words(f, factors=False, bound=False)  # the bound is among the edits below
    if e is None or basis is None:
        return None
    lines = [Text(basis)]
    if e.method == "replay" and e.share_saving_pct is not None:
        lines.append(Text(f"share-based estimate: -{e.share_saving_pct:.0f}%", style="dim"))
    if e.factors:
        lines.append(Text("factors:", style="bold"))
    for x in e.factors:
        lines.append(Text.assemble(("• ", "dim"), (factor_words(x, 300), "" if x.measured else "yellow")))
    if e.edits:
        lines.append(Text("replayed with:", style="bold"))
        lines += [Text(f"  {edit}", style="dim") for edit in e.edits]
    return Group(*lines)


def _code(code: str, kind: str) -> RenderableType:
    """Code as it will be pasted, in the terminal summary's cyan, behind a gutter."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(style="cyan")
    for i, line in enumerate(code.rstrip("\n").splitlines()):
        grid.add_row(kind if i == 0 else "", Text(line))  # code from a finding: never markup
    return grid


def change(f: Finding) -> RenderableType:
    parts: list[RenderableType] = []
    code, env, doc, text = (f.action.get(k) for k in ("code", "env", "doc", "text"))
    if isinstance(text, str) and text:
        parts.append(Text(text))
    if isinstance(code, str) and code.strip():
        parts.append(_code(code, "python"))
    if isinstance(env, dict) and env:
        parts.append(_code(action_env_text(env), "shell"))
    if isinstance(doc, str) and doc:
        parts.append(Text(f"see {doc}", style="dim underline"))
    if change_text(f):
        parts.append(Text("c copies the change to the clipboard", style="dim italic"))
    return Group(*parts) if parts else Text("no concrete change recorded", style="dim")


class FindingScreen(PardiagScreen):
    NAV = "findings"
    DEFAULT_CSS = """
    FindingScreen #finding-body { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("c", "copy", "copy change"),
        Binding("escape", "back", "back"),
        Binding("n", "step(1)", "next"),
        Binding("p", "step(-1)", "previous"),
    ]

    def __init__(self, analysis: Analysis, index: int) -> None:
        super().__init__(analysis)
        self.findings = ordered_findings(analysis)
        self.index = index
        self.finding = self.findings[index]

    def crumb(self) -> str:
        return f"› finding {self.index + 1} of {len(self.findings)} · esc back"

    def compose_body(self) -> ComposeResult:
        f = self.finding
        with VerticalScroll(id="finding-body"):
            yield Section(f"finding {self.index + 1}: {f.lever}", lambda w: head(f))
            yield Section("evidence", lambda w: evidence(f))
            if (basis := estimate(f)) is not None:
                yield Section("estimate", lambda w: basis, id="estimate")
            yield Section("the change", lambda w: change(f), id="change")

    def on_mount(self) -> None:
        self.query_one("#finding-body").focus()

    def sort_target(self) -> None:
        return None

    def action_copy(self) -> None:
        copy_change(self.app, self.finding)

    def action_back(self) -> None:
        self.dismiss()

    def action_step(self, delta: int) -> None:
        nxt = (self.index + delta) % len(self.findings)
        self.app.pop_screen()
        self.app.push_screen(FindingScreen(self.analysis, nxt))
