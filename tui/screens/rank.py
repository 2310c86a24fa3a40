"""Rank detail (enter on a rank): step time, where the profiled time went, phases per
step, host phases over all steps, memory by category (when the analysis has it),
collectives, GPU timeline, operators, telemetry."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll

from pardiag import style
from pardiag.analysis import Analysis, RankResult
from pardiag.analysis_blocks import GpuTelemetry
from pardiag.display_memory import CATEGORIES, memory_of, peak_of, peak_words, rank_memory_rows, rank_sources, value
from pardiag.step_records import host_phases
from pardiag.tui import format as fmt
from pardiag.tui.screens.base import PardiagScreen
from pardiag.tui.widgets.section import Section

WIDE = 150  # from this terminal width on, two columns of sections


def _bars(rows: list[tuple[str, float, str]], width: int, unit: str = "ms") -> RenderableType:
    """One labelled bar per row, scaled to the largest row."""
    if not rows:
        return Text("none recorded", style="dim")
    top = max(v for _, v, _ in rows) or 1.0
    label_w = max(len(n) for n, _, _ in rows)
    bar_w = max(4, width - label_w - 14)
    out = []
    for name, v, colour in rows:
        bar = fmt.draw([(0.0, v, colour)], 0.0, top, bar_w)
        out.append(Text.assemble(f"{name:<{label_w}} ", bar, f" {v / 1000:>8.1f} {unit}", no_wrap=True))
    return Group(*out)


def _grid(rows: list[tuple[str, str]]) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim", no_wrap=True)
    t.add_column()
    for k, v in rows:
        t.add_row(Text(k), Text(v))  # op names, hosts, values come from traces and metas: never markup
    return t


def step_section(a: Analysis, r: RankResult) -> RenderableType:
    st = r.step_time_us
    rows = [
        ("host", r.host or "?"), ("device", r.device_type or "?"),
        ("step time", f"p50 {fmt.ms(st.p50)} · p90 {fmt.ms(st.p90)} · max {fmt.ms(st.max)} · mean {fmt.ms(st.mean)} ms"
                      f" over {st.n} step{'s' if st.n != 1 else ''}" if st.n else "no step timestamps (steps.jsonl)"),
    ]
    if st.steps_total:
        rows.append(("steps", f"{st.steps_total} in all, {st.disturbed} disturbed (profiler start/stop, first steps)"))
    rows.append(("profiled", f"{r.steps_profiled} step(s), {fmt.ms(r.window_us)} ms; trace "
                             + ("complete" if r.trace_complete else "partial" if r.trace else "missing")))
    for s in a.stragglers:
        if s.rank == r.rank:
            rows.append(("straggler", f"+{fmt.ms(s.excess_us_per_step)} ms per step ({s.cause})"))
            rows += [("", e) for e in s.evidence]
    return _grid(rows)


def breakdown_section(r: RankResult, width: int) -> RenderableType:
    t = Table(box=None, padding=(0, 1), expand=False, show_edge=False)
    for col in ("", "category", "ms", "ms/step", "share"):
        t.add_column(col, justify="left" if col in ("", "category") else "right")
    for k, label in style.CATEGORY_LABELS.items():
        us = r.breakdown_us.get(k, 0.0)
        t.add_row(Text("█", style=style.CATEGORY_COLOURS[k]), label, fmt.ms(us), fmt.ms(fmt.per_step_us(r, us)),
                  fmt.pct(fmt.share(r, k)))
    return Group(fmt.breakdown_bar(r, max(1, width)), t)


def phases_section(r: RankResult, width: int) -> RenderableType:
    per_step = r.phases_per_step_us or {k: v / r.steps_profiled for k, v in r.phases_us.items() if r.steps_profiled}
    rows = [(style.PHASE_LABELS.get(k, k), per_step.get(k, 0.0), style.PHASE_COLOURS.get(k, "#b0b6bf"))
            for k in style.PHASE_LABELS if k in per_step]
    return Group(Text("ms per profiled step, from the trace", style="dim"), _bars(rows, width))


def host_phases_section(r: RankResult, width: int) -> RenderableType:
    if not r.host_phases_us:
        return Text("no host phases (steps.jsonl had no phase timestamps)", style="dim")
    signals = host_phases()  # the signal table's order and colours
    order = {s.name: i for i, s in enumerate(signals)}
    colours = {s.name: s.colour for s in signals if s.colour}
    keys = sorted(r.host_phases_us, key=lambda k: (k == "step", order.get(k, len(order)), k))
    rows = [(k, r.host_phases_us[k], colours.get(k, "#7f8c8d")) for k in keys]
    return Group(Text("ms per step, median over all steps, measured on the host", style="dim"), _bars(rows, width))


def memory_section(r: RankResult, width: int) -> RenderableType:
    """The rank's peak, its known categories as a bar against it, then every figure
    (unknown ones with why) and where they come from."""
    mem = memory_of(r)
    if mem is None:
        return Text("no memory figures", style="dim")
    known = [(k, v) for k in CATEGORIES if (v := value(mem, k)) is not None and v > 0]
    whole = max([peak_of(mem)[0] or 0.0, sum(v for _, v in known)])
    parts: list[RenderableType] = [Text(peak_words(mem))]
    if known and whole > 0:
        parts.append(Text("the known categories against the peak:", style="dim"))
        parts.append(fmt.draw(fmt.stacked((v, style.MEMORY_COLOURS[k]) for k, v in known), 0.0, whole, max(1, width)))
        parts.append(fmt.legend(style.MEMORY_LABELS, style.MEMORY_COLOURS, [k for k, _ in known]))
    parts.append(_grid(rank_memory_rows(mem)))
    parts += [Text(f"{label}: {words}", style="dim") for label, words in rank_sources(mem)]
    return Group(*parts)


def collectives_section(a: Analysis, r: RankResult) -> RenderableType:
    rows = [("waiting", f"{fmt.ms(r.wait_us)} ms ({fmt.ms(fmt.per_step_us(r, r.wait_us))} per step)"),
            ("transfer", f"{fmt.ms(r.transfer_us)} ms ({fmt.ms(fmt.per_step_us(r, r.transfer_us))} per step)")]
    mine = sorted(((c.wait_by_rank_us.get(str(r.rank)), c) for c in a.collectives), key=lambda x: -(x[0] or 0.0))
    for wait, c in mine[:6]:
        if wait is not None:
            rows.append((f"{c.op} · {c.process_group}", f"waited {fmt.ms(wait, 2)} ms in {c.calls} calls"))
    if not a.collectives:
        rows.append(("", "no collectives in the profiled window"))
    return _grid(rows)


def gpu_section(r: RankResult, width: int) -> RenderableType:
    g = r.gpu
    if g is None:
        return Text("no GPU kernels in this rank's trace", style="dim")
    parts = fmt.gpu_split(g)
    bar = fmt.draw(fmt.stacked((max(0.0, parts[k]), style.GPU_COLOURS[k]) for k in style.GPU_LABELS), 0.0,
                   g.span_us or 1.0, max(1, width))
    rows = [(style.GPU_LABELS[k], f"{fmt.ms(max(0.0, v))} ms ({max(0.0, v) / g.span_us:.0%})" if g.span_us else "-")
            for k, v in parts.items()]
    return Group(Text(f"first to last kernel: {fmt.ms(g.span_us)} ms", style="dim"), bar,
                 fmt.legend(style.GPU_LABELS, style.GPU_COLOURS), _grid(rows))


def ops_section(r: RankResult) -> RenderableType:
    if not r.ops:
        return Text("no operator statistics", style="dim")
    return _grid([(k.removesuffix("_us").replace("_", " "), fmt.fact_text(k, v)) for k, v in sorted(r.ops.items())])


def rank_telemetry(a: Analysis, rank: int) -> list[GpuTelemetry]:
    """The telemetry summaries of this rank's GPU(s)."""
    return [g for g in a.telemetry.gpus if rank in g.ranks] if a.telemetry is not None else []


TELEMETRY_FACTS = ("name", "util_gpu_ratio_mean", "sm_clock_mean_mhz", "sm_clock_ratio", "power_mean_w",
                   "temperature_max_c", "memory_used_max_bytes", "slowdown_share")


def telemetry_section(a: Analysis, r: RankResult, width: int) -> RenderableType:
    records = rank_telemetry(a, r.rank)
    series: dict[str, list[float]] = {}
    for rec in records:
        series.update(fmt.numeric_series({"series": rec.series}))
    facts = [(k.replace("_", " "), fmt.fact_text(k, getattr(rec, k))) for rec in records for k in TELEMETRY_FACTS
             if getattr(rec, k) is not None]
    if not series and not facts:
        reason = a.telemetry.reason if a.telemetry is not None else None
        return Text("no telemetry" + (f": {reason}" if reason else ""), style="dim")
    parts: list[RenderableType] = [_grid(facts)] if facts else []
    label_w = min(28, max((len(k) for k in series), default=0))
    for key, values in series.items():
        line = fmt.sparkline_text(values, max(4, width - label_w - 24))
        parts.append(Text.assemble(f"{fmt.clip(key, label_w):<{label_w}} ", line,
                                   (f" {min(values):,.4g}…{max(values):,.4g}", "dim"), no_wrap=True))
    return Group(*parts)


class RankScreen(PardiagScreen):
    NAV = "overview"
    DEFAULT_CSS = """
    RankScreen #rank-body { height: 1fr; padding: 0 1; }
    RankScreen #rank-columns { height: auto; }
    RankScreen #rank-columns > Vertical { height: auto; width: 1fr; }
    RankScreen #rank-columns.-narrow { layout: vertical; }
    RankScreen #rank-columns.-narrow > Vertical { width: 100%; }
    RankScreen #rank-col-a { margin-right: 2; }
    RankScreen #rank-columns.-narrow > #rank-col-a { margin-right: 0; }
    """
    BINDINGS = [
        Binding("escape", "back", "back"),
        Binding("n", "step(1)", "next rank"),
        Binding("p", "step(-1)", "previous rank"),
    ]

    def __init__(self, analysis: Analysis, rank: int) -> None:
        super().__init__(analysis)
        self.rank = next(r for r in analysis.ranks if r.rank == rank)

    def crumb(self) -> str:
        return f"› rank {self.rank.rank}" + (f" on {self.rank.host}" if self.rank.host else "") + " · esc back"

    def compose_body(self) -> ComposeResult:
        a, r = self.analysis, self.rank
        straggler = any(s.rank == r.rank for s in a.stragglers)
        with VerticalScroll(id="rank-body"):
            with Horizontal(id="rank-columns"):
                with Vertical(id="rank-col-a"):
                    yield Section(f"rank {r.rank}" + ("  ▲ straggler" if straggler else ""), lambda w: step_section(a, r))
                    yield Section("where the profiled time went", lambda w: breakdown_section(r, w))
                    yield Section("phases per step", lambda w: phases_section(r, w))
                    yield Section("host phases (all steps)", lambda w: host_phases_section(r, w))
                    if memory_of(r) is not None:
                        yield Section("memory at the peak", lambda w: memory_section(r, w))
                with Vertical(id="rank-col-b"):
                    yield Section("collectives", lambda w: collectives_section(a, r))
                    yield Section("GPU timeline", lambda w: gpu_section(r, w))
                    yield Section("operators", lambda w: ops_section(r))
                    yield Section("telemetry", lambda w: telemetry_section(a, r, w))

    def on_mount(self) -> None:
        self.query_one("#rank-body").focus()

    def on_resize(self, event: events.Resize) -> None:
        self.query_one("#rank-columns").set_class(event.size.width < WIDE, "-narrow")

    def sort_target(self) -> None:
        return None  # nothing to sort or filter here

    def action_back(self) -> None:
        self.dismiss()

    def action_step(self, delta: int) -> None:
        ranks = self.analysis.ranks
        i = next(i for i, r in enumerate(ranks) if r.rank == self.rank.rank)
        nxt = ranks[(i + delta) % len(ranks)]
        self.app.pop_screen()
        self.app.push_screen(RankScreen(self.analysis, nxt.rank))
