"""5 Findings: what to change, most important first, with the projected step time if
all were applied; the highlighted finding previewed; the notices (what is missing)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from pardiag import style
from pardiag.analysis import Analysis, Finding
from pardiag.display import SEVERITY_ORDER, ordered_findings, ordered_notices, what_if_method_words
from pardiag.tui import format as fmt
from pardiag.tui.messages import OpenFinding
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.screens.finding import change, copy_change, evidence
from pardiag.tui.widgets.drawn import Drawn
from pardiag.tui.widgets.labels import Caption, Heading
from pardiag.tui.widgets.table import Column, SortableTable

TALL = 36  # from this terminal height on, the highlighted finding is shown whole


def finding_columns(number: dict[int, int]) -> list[Column[Finding]]:
    return [
        Column("#", lambda f: str(number[id(f)]), key=lambda f: number[id(f)], descending=False),
        Column("severity", lambda f: fmt.severity_badge(f.severity), key=lambda f: SEVERITY_ORDER.get(f.severity, len(SEVERITY_ORDER)),
               descending=False, width=8, right=False),
        Column("saving", lambda f: f"-{f.est_saving_pct:.0f}%" if f.est_saving_pct else "-", key=lambda f: f.est_saving_pct),
        Column("lever", lambda f: f.lever, key=lambda f: f.lever, descending=False, right=False),
        Column("ranks", lambda f: fmt.clip(fmt.rank_ranges(f.ranks), 12) or "-", key=lambda f: len(f.ranks), right=False),
        Column("title", lambda f: f.title, key=lambda f: f.title, descending=False, right=False, fill=True),
    ]


def what_if(a: Analysis) -> RenderableType:
    w = a.what_if
    if w is None or not w.step_us or not w.all_step_us:
        return Text("")
    return Text.assemble(("if all were applied: ", "bold"),
                         f"step {fmt.ms(w.step_us)} → {fmt.ms(w.all_step_us)} ms",
                         (f" (-{w.all_saving_pct or 0:.0f}%)", "bold green"),
                         (f"; {w.assumption}" if w.assumption else "", "dim"),
                         (f"; {method}" if (method := what_if_method_words(w)) else "", "dim"))


def preview(f: Finding | None, full: bool) -> RenderableType:
    """The highlighted finding: its first evidence; on a tall terminal, all of it and the change."""
    if f is None:
        return Text("")
    if full:
        return Group(Text(f.title, style="bold"), evidence(f), Text(""), change(f))
    lines = [Text(f"• {e}", no_wrap=True, overflow="ellipsis") for e in f.evidence[:3]]
    lines.append(Text("enter opens it with the change to make; c copies the change", style="dim italic"))
    return Group(*lines)


def notices(a: Analysis) -> RenderableType:
    if not a.notices:
        return Text("no notices: every expected input was there", style="green")
    return Group(*(Text.assemble((f"{n.level}: ", f"bold {style.NOTICE_COLOURS.get(n.level, '')}"), n.message)
                   for n in ordered_notices(a)))


class FindingsScreen(PardiagScreen):
    NAV = "findings"
    DEFAULT_CSS = """
    FindingsScreen #what-if { height: auto; padding: 0 1; }
    FindingsScreen #findings { height: auto; max-height: 50%; }
    FindingsScreen #preview { height: auto; max-height: 50%; border-top: solid $panel-lighten-2; margin-bottom: 1; }
    FindingsScreen #notices { height: auto; max-height: 30%; }
    FindingsScreen #empty { padding: 1 2; color: $success; }
    """
    BINDINGS = [Binding("c", "copy", "copy change")]

    def __init__(self, analysis: Analysis) -> None:
        super().__init__(analysis)
        self.findings = ordered_findings(analysis)
        self.number = {id(f): i + 1 for i, f in enumerate(self.findings)}

    def compose_body(self) -> ComposeResult:
        a = self.analysis
        yield Heading(f"what to change ({len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}, "
                      "most important first)", markup=False)
        if not self.findings:
            yield Static("no findings: no lever pardiag knows would make this run faster", id="empty")
        else:
            yield Static(what_if(a), id="what-if")
            yield SortableTable(finding_columns(self.number), self.findings,
                                lambda f: f"{f.severity} {f.lever} {f.title} {' '.join(f.evidence)}",
                                sort=0, noun="findings", id="findings")
            yield Caption("", id="table-caption")
            yield Drawn(lambda w: preview(self.findings[0], self.size.height >= TALL), id="preview")
        yield Heading(f"notices ({len(a.notices)})", markup=False)
        yield Drawn(lambda w: notices(a), id="notices")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "copy":
            return bool(self.findings)
        return super().check_action(action, parameters)

    def _current(self) -> Finding | None:
        tables = self.query("#findings").results(SortableTable)
        for table in tables:
            item = table.current_item()
            return item if isinstance(item, Finding) else None
        return None

    @on(DataTable.RowHighlighted, "#findings")
    def show_preview(self) -> None:
        f = self._current()
        self.query_one("#preview", Drawn).set_draw(lambda w: preview(f, self.size.height >= TALL))

    @on(DataTable.RowSelected, "#findings")
    def open_finding(self) -> None:
        f = self._current()
        if f is not None:
            self.post_message(OpenFinding(self.number[id(f)] - 1))

    def action_copy(self) -> None:
        f = self._current()
        if f is not None:
            copy_change(self.app, f)
