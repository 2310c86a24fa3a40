"""The HTML report: one self-contained file that works offline.

Figures are pure functions (Analysis -> plotly Figure or None), each embedded with a
stable div id; plotly.js is inlined once; the page is a Jinja2 template with autoescape
on. Same Analysis, same bytes. Text that came from a trace or a command line reaches
the page only through autoescaping (template) or `html.escape` + plotly's JSON escaping
(figures: plotly draws a subset of HTML in labels and decodes entities as text).
"""

from __future__ import annotations

import html
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jinja2
import plotly.graph_objects as go
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from pardiag import style
from pardiag.analysis import Analysis, Collective, Finding, RankResult
from pardiag.analysis_blocks import Hang, Telemetry
from pardiag.display_efficiency import (
    RANK_EFFICIENCY_HEADER,
    efficiency_lines,
    efficiency_words,
    rank_efficiency_cells,
    ratio_text,
)
from pardiag.display_memory import (
    GB,
    MB,
    memory_ranks,
    memory_table,
    memory_words,
    NOT_APPLICABLE,
    peak_of,
    shown_ranks,
    source_lines,
    unknown_lines,
    value,
)
from pardiag.display import (
    over_time_lines,
    critical_path_of,
    critical_path_rows,
    critical_path_words,
    estimate_of,
    estimate_words,
    what_if_method_words,
    op_text,
    WORST_N,
    action_env_text,
    clip,
    fact_text,
    gpu_split,
    hang_flight_lines,
    hang_late_words,
    hang_wait_words,
    headline,
    job_hang,
    job_step_words,
    ms,
    ordered_collectives,
    ordered_findings,
    ordered_notices,
    no_straggler_words,
    ordered_stragglers,
    pct,
    quantile,
    per_step_us,
    percentile_rows,
    rank_cells,
    rank_ranges,
    share,
    step_us,
    worst_ranks,
)

BAR_RANKS = 64  # past this many ranks: heatmaps and percentiles instead of one bar per rank
HEAT_MIN_SPAN = 1.0  # in the heatmap's unit (% or ms): the smallest spread across ranks drawn full scale
TOP_COLLECTIVES_CHART = 15
MAX_TABLE_ROWS = 50
MAX_NOTICES = 200
NOTICES_SHOWN = 8  # the rest folded
MAX_FACTS = 60
FONT = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
GRID = "#e6e9ee"
TEXT = "#1f2933"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}
TEMPLATES = Path(__file__).resolve().parent / "templates"


# -- figures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    label: str
    colour: str
    values: list[float | None]  # one per rank, in display units


def _label(s: object, limit: int = 48) -> str:
    """Untrusted text for a plotly label: clipped, and escaped so that plotly shows it as text."""
    return html.escape(clip(s, limit), quote=False)


def _layout(height: int, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "template": "none",
        "height": height,
        "margin": {"l": 80, "r": 24, "t": 36, "b": 44},
        "font": {"family": FONT, "size": 12, "color": TEXT},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
        "hoverlabel": {"font": {"family": FONT, "size": 12}},
        "xaxis": {"gridcolor": GRID, "zeroline": False, "automargin": True},
        "yaxis": {"gridcolor": GRID, "zeroline": False, "automargin": True},
    }
    for k, v in kw.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def _per_rank_figure(ranks: Sequence[RankResult], series: list[Series], unit: str, stacked_title: str,
                     digits: int = 2) -> go.Figure:
    """Stacked horizontal bars, one per rank, their values to `digits` decimals; past
    BAR_RANKS a heatmap rank x category."""
    if len(ranks) > BAR_RANKS:
        return _heatmap(ranks, series, unit)
    labels = [f"rank {r.rank}" for r in ranks]
    traces = [
        go.Bar(name=s.label, y=labels, x=[_round(v, digits) for v in s.values], orientation="h",
               marker={"color": s.colour, "line": {"width": 0}},
               hovertemplate="%{y}<br>" + s.label + ": %{x}" + f" {unit}<extra></extra>")
        for s in series
    ]
    height = 110 + max(2, len(ranks)) * 20
    x_range = {"range": [0, 100]} if unit == "%" else {}
    return go.Figure(traces, _layout(height, barmode="stack", bargap=0.25,
                                     xaxis={"title": {"text": stacked_title}, **x_range},
                                     yaxis={"autorange": "reversed", "type": "category"}))


def _heatmap(ranks: Sequence[RankResult], series: list[Series], unit: str) -> go.Figure:
    """One row per category, one column per rank. Colour is relative within a row (the
    ranks that spend the most on that category are darkest), so that a rank that
    differs shows up in a small category too; the label gives the median, hover the value."""
    z, labels, values = [], [], []
    for s in series:
        known = [v for v in s.values if v is not None]
        lo, hi = min(known, default=0.0), max(known, default=0.0)
        span = max(hi - lo, HEAT_MIN_SPAN)  # spreads smaller than this stay pale: noise, not a difference
        z.append([None if v is None else round((v - lo) / span, 3) for v in s.values])
        values.append([_round(v, 1) for v in s.values])
        med = quantile(known, 0.5)
        labels.append(f"{s.label} · p50 {med:.1f} {unit}" if med is not None else s.label)
    trace = go.Heatmap(
        x=[r.rank for r in ranks], y=labels, z=z, customdata=values, zmin=0, zmax=1, showscale=False,
        colorscale=[[0.0, "#f1f5fb"], [0.5, "#7fa7d9"], [1.0, "#1f4e8c"]], xgap=0, ygap=2,
        hovertemplate="rank %{x}<br>%{y}<br>this rank: %{customdata}" + f" {unit}<extra></extra>",
    )
    return go.Figure(trace, _layout(80 + 40 * len(series), margin={"l": 190}, xaxis={"title": {"text": "rank"}},
                                    yaxis={"autorange": "reversed", "type": "category"}))


def breakdown_figure(a: Analysis) -> go.Figure | None:
    ranks = [r for r in a.ranks if r.window_us > 0]
    if not ranks:
        return None
    series = [Series(style.CATEGORY_LABELS[k], style.CATEGORY_COLOURS[k],
                     [100.0 * (share(r, k) or 0.0) for r in ranks]) for k in style.CATEGORY_LABELS]
    return _per_rank_figure(ranks, series, "%", "% of the profiled window")


def phases_figure(a: Analysis) -> go.Figure | None:
    ranks = [r for r in a.ranks if r.steps_profiled > 0 and any(r.phases_us.values())]
    if not ranks:
        return None
    series = [Series(style.PHASE_LABELS[k], style.PHASE_COLOURS[k],
                     [(per_step_us(r, r.phases_us.get(k, 0.0)) or 0.0) / 1000 for r in ranks]) for k in style.PHASE_LABELS]
    return _per_rank_figure(ranks, series, "ms", "ms per profiled step")


def gpu_figure(a: Analysis) -> go.Figure | None:
    ranks = [r for r in a.ranks if r.gpu is not None and r.gpu.span_us > 0]
    if not ranks:
        return None

    shares = [{k: 100.0 * max(0.0, v) / g.span_us for k, v in gpu_split(g).items()} for r in ranks if (g := r.gpu)]
    series = [Series(style.GPU_LABELS[k], style.GPU_COLOURS[k], [s[k] for s in shares]) for k in style.GPU_LABELS]
    return _per_rank_figure(ranks, series, "%", "% of the GPU timeline (first to last kernel)")


def step_time_figure(a: Analysis) -> go.Figure | None:
    ranks = [r for r in a.ranks if r.step_time_us.p50 is not None]
    if not ranks:
        return None

    def col(get: Callable[[RankResult], float | None]) -> list[float | None]:
        return [_round(None if (v := get(r)) is None else v / 1000) for r in ranks]

    p50, p90, mx = col(lambda r: r.step_time_us.p50), col(lambda r: r.step_time_us.p90), col(lambda r: r.step_time_us.max)
    marker = {"p50": ("#2f5f9e", "circle"), "p90": ("#e0903a", "diamond"), "max": ("#c0392b", "line-ns-open")}
    if len(ranks) > BAR_RANKS:
        x = [r.rank for r in ranks]
        traces = [go.Scatter(x=x, y=v, mode="markers", name=name,
                             marker={"color": marker[name][0], "size": 4 if name != "p50" else 5},
                             hovertemplate="rank %{x}<br>" + name + ": %{y} ms<extra></extra>")
                  for name, v in (("max", mx), ("p90", p90), ("p50", p50))]
        return go.Figure(traces, _layout(360, xaxis={"title": {"text": "rank"}}, yaxis={"title": {"text": "step time (ms)"}}))
    labels = [f"rank {r.rank}" for r in ranks]
    span = [None if lo is None or hi is None else _round(hi - lo) for lo, hi in zip(p50, mx)]
    traces = [go.Bar(y=labels, x=span, base=p50, orientation="h", name="p50 to max", width=0.3,
                     marker={"color": "#d5dbe3", "line": {"width": 0}}, hoverinfo="skip")]
    for name, v in (("p50", p50), ("p90", p90), ("max", mx)):
        colour, symbol = marker[name]
        traces.append(go.Scatter(y=labels, x=v, mode="markers", name=name,
                                 marker={"color": colour, "symbol": symbol, "size": 10 if name != "max" else 14,
                                         "line": {"width": 2, "color": colour}},
                                 hovertemplate="%{y}<br>" + name + ": %{x} ms<extra></extra>"))
    height = 110 + max(2, len(ranks)) * 22
    return go.Figure(traces, _layout(height, xaxis={"title": {"text": "step time (ms), all steps"}, "rangemode": "tozero"},
                                     yaxis={"autorange": "reversed", "type": "category"}))


def _collective_labels(cs: Sequence[Collective]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in cs:
        base = _label(f"{op_text(c)} · {c.process_group}", 56)
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base} ({seen[base]})")
    return out


def collectives_figure(a: Analysis) -> go.Figure | None:
    top = ordered_collectives(a)[:TOP_COLLECTIVES_CHART]
    if not top:
        return None
    labels = _collective_labels(top)
    traces = [
        go.Bar(y=labels, x=[_round(c.transfer_us / 1000, 3) for c in top], orientation="h", name="transfer",
               marker={"color": style.TRANSFER_COLOUR}, hovertemplate="%{y}<br>transfer: %{x} ms<extra></extra>"),
        go.Bar(y=labels, x=[_round(c.wait_us / 1000, 3) for c in top], orientation="h", name="wait",
               marker={"color": style.WAIT_COLOUR}, hovertemplate="%{y}<br>wait: %{x} ms<extra></extra>"),
    ]
    return go.Figure(traces, _layout(110 + max(2, len(top)) * 26, barmode="stack", bargap=0.3,
                                     xaxis={"title": {"text": "ms in the profiled window (mean over ranks)"}},
                                     yaxis={"autorange": "reversed", "type": "category"}))


MAX_POINTS = 4000  # steps drawn one by one; a longer run is drawn in buckets of steps (their maximum)


def _buckets(steps: Sequence[int], values: Sequence[float]) -> tuple[list[int], list[float]]:
    """At most MAX_POINTS points: consecutive steps in equal buckets, each at its first
    step with its largest value (a spike stays visible)."""
    if len(steps) <= MAX_POINTS:
        return list(steps), list(values)
    k = -(-len(steps) // MAX_POINTS)
    return ([steps[i] for i in range(0, len(steps), k)],
            [max(values[i:i + k]) for i in range(0, len(steps), k)])


def over_time_figure(a: Analysis) -> go.Figure | None:
    """The job's step time over the run (steps.jsonl, the steps that count), with the
    profiled windows shaded, change points as dashed lines and spikes marked."""
    t = a.temporal or {}
    steps, vals = t.get("steps") or [], t.get("job_step_us") or []
    if len(steps) < 2 or len(steps) != len(vals):
        return None
    x, y = _buckets(steps, [v / 1000 for v in vals])
    traces = [go.Scatter(x=x, y=[_round(v) for v in y], mode="lines", name="job step (slowest rank)",
                         line={"color": "#2f5f9e", "width": 1.5},
                         hovertemplate="step %{x}<br>%{y} ms<extra></extra>")]
    spikes = t.get("spikes") or []
    if spikes:
        traces.append(go.Scatter(
            x=[s["step"] for s in spikes], y=[_round(s["step_us"] / 1000) for s in spikes], mode="markers",
            name="spike", marker={"color": "#c0392b", "size": 7},
            text=[(f"rank {s['rank']}" if s.get("rank") is not None else "all ranks") + (f"; {s['cause']}" if s.get("cause") else "")
                  for s in spikes],
            hovertemplate="step %{x}<br>%{y} ms<br>%{text}<extra></extra>"))
    fig = go.Figure(traces, _layout(320, xaxis={"title": {"text": "step"}},
                                    yaxis={"title": {"text": "step time (ms)"}, "rangemode": "tozero"}))
    for lo, hi in t.get("windows") or []:
        fig.add_vrect(x0=lo - 0.5, x1=hi + 0.5, fillcolor="#e0903a", opacity=0.18, line_width=0,
                      annotation_text="profiled", annotation_position="top left")
    for c in t.get("change_points") or []:
        who = f"rank {c['rank']}" if c.get("rank") is not None else "all ranks"
        fig.add_vline(x=c["step"] - 0.5, line_dash="dash", line_color="#c0392b",
                      annotation_text=f"{c['before_us'] / 1000:.0f} → {c['after_us'] / 1000:.0f} ms ({who})")
    return fig


def late_figure(a: Analysis) -> go.Figure | None:
    """Per step and rank, how long the others waited for it (rank x step heatmap)."""
    t = a.temporal or {}
    late = t.get("late_us") or {}
    if len(late) < 2:
        return None
    ranks = sorted(late, key=int)
    steps = sorted({int(s) for d in late.values() for s in d})
    if not steps:
        return None
    z = []
    xs: list[int] = []
    for r in ranks:
        xs, row = _buckets(steps, [max((late[r].get(str(s)) or 0.0) / 1000, 0.0) for s in steps])
        z.append([_round(v) for v in row])
    trace = go.Heatmap(z=z, x=xs, y=[f"rank {r}" for r in ranks], colorscale="Reds", zmin=0,
                       colorbar={"title": {"text": "ms"}},
                       hovertemplate="%{y}, step %{x}<br>the others waited %{z} ms for it<extra></extra>")
    return go.Figure(trace, _layout(90 + 24 * len(ranks), xaxis={"title": {"text": "step"}},
                                    yaxis={"autorange": "reversed", "type": "category"}))


def _step_rows(block: Any) -> list[tuple[int, list[tuple[float, float, str]]]]:
    """The step chart's rows from the Analysis' ``step_timeline`` (as a newer or broken
    writer may give it: what is not a rank with numeric, known segments is left out)."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    ranks = block.get("ranks") if isinstance(block, dict) else None
    rows = []
    for row in ranks if isinstance(ranks, list) else ():
        if not isinstance(row, dict) or type(row.get("rank")) is not int or not isinstance(row.get("segments"), list):
            continue
        segs = [(float(seg[0]), float(seg[1]), seg[2]) for seg in row["segments"]
                if isinstance(seg, list) and len(seg) == 3 and number(seg[0]) and number(seg[1])
                and seg[2] in style.CATEGORY_LABELS]
        if segs:
            rows.append((row["rank"], segs))
    return rows


def step_timeline_figure(a: Analysis) -> go.Figure | None:
    """One step of every rank on one clock, coloured by the breakdown's categories."""
    rows = _step_rows(a.step_timeline)
    if not rows:
        return None
    late = {s.rank for s in a.stragglers}
    label = {r: f"rank {r}" + (" (straggler)" if r in late else "") for r, _ in rows}
    traces = []
    for k, name in style.CATEGORY_LABELS.items():
        mine = [(r, s, e) for r, segs in rows for s, e, c in segs if c == k]
        if mine:
            traces.append(go.Bar(name=name, orientation="h", y=[label[r] for r, _, _ in mine],
                                 base=[round(s / 1e3, 3) for _, s, _ in mine],
                                 x=[round((e - s) / 1e3, 3) for _, s, e in mine],
                                 marker={"color": style.CATEGORY_COLOURS[k], "line": {"width": 0}},
                                 hovertemplate="%{y}<br>" + name + ": %{x} ms from %{base} ms<extra></extra>"))
    step = a.step_timeline.get("step") if a.step_timeline else None
    title = f"ms since the first rank started step {step}" if isinstance(step, int) else "ms"
    return go.Figure(traces, _layout(110 + max(2, len(rows)) * 22, barmode="overlay", bargap=0.3,
                                     xaxis={"title": {"text": title}},
                                     yaxis={"autorange": "reversed", "type": "category"}))


def memory_figure(a: Analysis) -> go.Figure | None:
    """Per rank, its memory by category at its peak (parameters, gradients, optimizer
    state, activations, other) stacked, and the peak they are part of (allocated on a
    GPU, RSS elsewhere) as a mark; an unknown category draws nothing, and one unknown on
    every rank is left out of the legend (the section's table and notes say why). In GB
    when a figure reaches 1 GB, else MB."""
    rows = memory_ranks(a)
    by_rank = {r.rank: r for r in a.ranks}
    ranks = [by_rank[rank] for rank, _ in rows]
    cats = [[value(m, k) for _, m in rows] for k in style.MEMORY_LABELS]
    peaks = [peak_of(m) for _, m in rows]
    known = [v for vs in cats for v in vs if v is not None] + [v for v, _ in peaks if v is not None]
    if not any(v is not None for vs in cats for v in vs):
        return None
    unit, scale = ("GB", GB) if max(known) >= GB else ("MB", MB)
    series = [Series(label, style.MEMORY_COLOURS[k], [None if v is None else v / scale for v in vs])
              for (k, label), vs in zip(style.MEMORY_LABELS.items(), cats) if any(v is not None for v in vs)]
    fig = _per_rank_figure(ranks, series, unit, f"{unit} at the rank's peak", digits=3)
    if len(ranks) <= BAR_RANKS and any(v is not None for v, _ in peaks):
        whats = {w for v, w in peaks if v is not None}
        name = f"peak {whats.pop()}" if len(whats) == 1 else "peak (allocated on a GPU, RSS elsewhere)"
        fig.add_trace(go.Scatter(
            y=[f"rank {r.rank}" for r in ranks], x=[_round(None if v is None else v / scale, 3) for v, _ in peaks],
            mode="markers", name=name, text=[w for _, w in peaks],
            marker={"color": style.MEMORY_PEAK_COLOUR, "symbol": "line-ns-open", "size": 16, "line": {"width": 3}},
            hovertemplate="%{y}<br>peak %{text}: %{x}" + f" {unit}<extra></extra>"))
    return fig


FIGURES: tuple[tuple[str, Callable[[Analysis], go.Figure | None]], ...] = (
    ("fig-breakdown", breakdown_figure),
    ("fig-phases", phases_figure),
    ("fig-step-time", step_time_figure),
    ("fig-over-time", over_time_figure),
    ("fig-late", late_figure),
    ("fig-gpu", gpu_figure),
    ("fig-collectives", collectives_figure),
    ("fig-step-timeline", step_timeline_figure),
    ("fig-memory", memory_figure),
)


def _embed(fig: go.Figure, div_id: str) -> Markup:
    """A figure as a div + script. plotly's JSON writer escapes <, > and / as \\u003c...,
    so no string in the data can close the <script>; checked here all the same."""
    fragment = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={**PLOTLY_CONFIG, "toImageButtonOptions": {"filename": div_id}})
    if fragment.lower().count("</script") != 1:
        raise AssertionError(f"{div_id}: figure JSON would break out of its <script>")
    return Markup(fragment)  # plotly's output, JSON-escaped, checked above


def figures(a: Analysis) -> dict[str, Markup]:
    out = {}
    for div_id, build in FIGURES:
        fig = build(a)
        if fig is not None:
            out[div_id] = _embed(fig, div_id)
    return out


# -- tables and facts for the template ----------------------------------------------------------


def _rank_row(r: RankResult, stragglers: set[int]) -> dict[str, Any]:
    p50, p90, mx, prof, *shares, wait = rank_cells(r)
    return {
        "rank": r.rank, "host": r.host or "?", "straggler": r.rank in stragglers,
        "p50": p50, "p90": p90, "max": mx, "n": r.step_time_us.n,
        "prof": prof, "steps": r.steps_profiled, "shares": shares, "wait": wait,
        "trace": "complete" if r.trace_complete else ("partial" if r.trace else "none"),
    }


def _fact_table(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    columns = sorted({str(k) for row in rows[:20] for k in row})[:8]
    body = [[clip(fact_text(c, row.get(c), 300), 80) for c in columns] for row in rows[:20]]
    return {"columns": columns, "rows": body, "more": max(0, len(rows) - 20)}


def generic_facts(d: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[dict[str, Any]]:
    """Key facts of a free-form dict (nccl, telemetry, scaling): nested keys flattened
    two levels deep, lists of records as small tables; bounded in size."""
    out: list[dict[str, Any]] = []
    for k in sorted(d, key=str):
        v, key = d[k], f"{prefix}{k}"
        if v is None or (isinstance(v, (list, dict, str)) and not v):
            continue  # nothing to say
        if isinstance(v, Mapping) and depth < 2:
            out += generic_facts(v, key + ".", depth + 1)
        elif isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
            out.append({"key": key, "text": None, "lines": None, "table": _fact_table(v)})
        elif isinstance(v, list) and len(v) > 1 and all(isinstance(x, str) for x in v) and max(map(len, v)) > 40:
            lines = [clip(x, 300) for x in v[:20]] + ([f"… {len(v) - 20} more"] if len(v) > 20 else [])
            out.append({"key": key, "text": None, "lines": lines, "table": None})
        else:
            out.append({"key": key, "text": fact_text(str(k), v, 300), "lines": None, "table": None})
    return out[:MAX_FACTS]


def _run_facts(a: Analysis) -> list[tuple[str, str]]:
    run = a.run
    hosts = list(run.hosts or [])
    prof = run.profiler or {}
    sched = prof.get("schedule") or {}
    window = ", ".join(f"{k} {sched[k]}" for k in ("skip_first", "wait", "warmup", "active", "repeat") if k in sched)
    options = [k for k in ("record_shapes", "profile_memory", "with_stack") if prof.get(k)]
    versions = run.versions or {}
    steps = sorted({r.steps_profiled for r in a.ranks})
    rows = [
        ("world size", str(run.world_size if run.world_size is not None else "?")),
        ("ranks analysed", f"{len(a.ranks)}" + (f" ({rank_ranges(r.rank for r in a.ranks)})" if a.ranks else "")),
        ("hosts", clip(", ".join(hosts[:16]) + (f", … ({len(hosts)} in all)" if len(hosts) > 16 else ""), 400) or "?"),
        ("backend", str(run.backend or "?")),
        ("device", str(run.device_type or "?")),
        ("launcher", str(run.launcher or "?")),
        ("exit code", "-" if run.exit_code is None else str(run.exit_code)),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v) or "?"),
        ("profiler window", (f"schedule {window}" if window else "?") + (f"; {', '.join(options)}" if options else "")),
        ("steps profiled", ", ".join(str(s) for s in steps) + " per rank" if steps else "-"),
        ("source", str(run.path or "?")),
    ]
    keep = {"world size", "ranks analysed", "source"}
    return [(k, clip(v, 400)) for k, v in rows if k in keep or v not in ("?", "-", "")]


def _command(a: Analysis) -> str:
    cmd = a.run.command
    if isinstance(cmd, list):
        return clip(shlex.join(str(x) for x in cmd), 4000)
    return clip(cmd, 4000) if cmd else ""


def _doc_link(doc: Any) -> str | None:
    return doc if isinstance(doc, str) and re.match(r"https?://[^\s\"'<>]+$", doc) else None


def _finding_view(n: int, f: Finding) -> dict[str, Any]:
    basis = estimate_of(f)
    code = f.action.get("code") if isinstance(f.action.get("code"), str) else None
    env = f.action.get("env") if isinstance(f.action.get("env"), dict) else None
    return {
        "id": f"finding-{n}", "severity": f.severity, "lever": f.lever, "title": f.title,
        "evidence": f.evidence,
        "ranks": f"rank{'s' if len(set(f.ranks)) > 1 else ''} {clip(rank_ranges(f.ranks), 200)}" if f.ranks else "",
        "saving": f"{f.est_saving_pct:.0f}%" if f.est_saving_pct else None,
        "code": code, "env": action_env_text(env) if env else None, "doc": _doc_link(f.action.get("doc")),
        "assumption": clip(f.action["assumption"], 300) if isinstance(f.action.get("assumption"), str) else None,
        "estimate": estimate_words(f, bound=False),  # the bound is among the edits listed under it
        "edits": [clip(edit, 300) for edit in basis.edits[:20]] if basis is not None else [],
    }


def _critical_path_view(a: Analysis) -> dict[str, Any] | None:
    """The critical path section: one sentence, then every rank, phase and collective on
    the path with its time and share (a bar)."""
    cp = critical_path_of(a)
    if cp is None:
        return None
    rows = [{"by": by, "name": clip(name, 80), "ms": ms(us), "share": pct(share), "width": round(100 * min(1.0, share), 1)}
            for by, name, us, share in critical_path_rows(cp)]
    return {"words": critical_path_words(cp), "rows": rows[:MAX_TABLE_ROWS]}


def _timeline_view(a: Analysis) -> dict[str, Any] | None:
    """How to see the ranks' steps on one timeline: the command that exports the job as
    one Chrome/Perfetto trace (when the analysis read traces)."""
    if not any(r.trace for r in a.ranks):
        return None
    path = a.run.path or "RUN"
    arg = "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)  # ~ stays unquoted
    st = a.step_timeline or {}
    shown, total = len(_step_rows(st)), st.get("ranks_total")
    return {"command": clip(f"pardiag export {arg} --perfetto -o job.json.gz", 4000),
            "step": st.get("step") if isinstance(st.get("step"), int) else None,
            "of": f"{shown} of {total} ranks" if isinstance(total, int) and total > shown else None}


def _efficiency_view(a: Analysis) -> dict[str, Any] | None:
    """The efficiency section: MFU and HFU in one sentence, the detail lines, per rank
    (at most MAX_TABLE_ROWS, the lowest MFU kept past that)."""
    e = a.efficiency
    words = efficiency_words(a)
    if e is None or words is None:
        return None
    rows = sorted(e.ranks, key=lambda x: (x.mfu if x.mfu is not None else 2.0, x.rank))[:MAX_TABLE_ROWS]
    return {"words": words, "lines": efficiency_lines(a), "mfu": ratio_text(e.mfu), "known": e.mfu is not None,
            "hfu": ratio_text(e.hfu) if e.recompute_flops_per_step > 0 else None,
            "header": RANK_EFFICIENCY_HEADER,
            "rows": [rank_efficiency_cells(x) for x in sorted(rows, key=lambda x: x.rank)]}


def _memory_view(a: Analysis) -> dict[str, Any] | None:
    """The memory section: the job's line, per rank its categories and totals (at most
    MAX_TABLE_ROWS, the largest peaks past that), what is unknown and why, where the
    figures come from and what each means."""
    words = memory_words(a)
    if words is None:
        return None
    from pardiag.analyzers.memory import MEMORY_DEFINITIONS  # pulls numpy in: only for a run with memory figures

    shown = shown_ranks(a, MAX_TABLE_ROWS)
    header, rows = memory_table(shown)
    return {"words": words, "header": header, "rows": rows, "na": any(NOT_APPLICABLE in row for row in rows),
            "more": len(memory_ranks(a)) - len(shown), "unknown": unknown_lines(a), "sources": source_lines(a),
            "definitions": [(k.replace("_", " "), v) for k, v in MEMORY_DEFINITIONS.items()]}


# the per-GPU figures the report's telemetry table shows (the table has room for eight)
TELEMETRY_GPU_COLUMNS = ("host", "gpu", "ranks", "util_gpu_ratio_mean", "sm_clock_busy_mean_mhz", "temperature_max_c",
                         "slowdown_share", "throttle_share")


def _telemetry_facts(t: Telemetry) -> dict[str, Any]:
    """The telemetry block for the facts table: per GPU the figures that say whether it
    ran at speed (the rest stay in analysis.json)."""
    d = t.to_dict()
    d["gpus"] = [{k: g[k] for k in TELEMETRY_GPU_COLUMNS} for g in d["gpus"]]
    return d


def _context(a: Analysis) -> dict[str, Any]:
    h = headline(a)
    straggler_ranks = {s.rank for s in a.stragglers}
    many = len(a.ranks) > BAR_RANKS
    findings = ordered_findings(a)
    collectives = ordered_collectives(a)
    extra = [(name, title, d) for name, title, d in (
        ("hang", "Hang", a.hang.to_dict() if a.hang else {}),
        ("nccl", "NCCL", a.nccl.to_dict() if a.nccl else {}),
        ("telemetry", "GPU telemetry", _telemetry_facts(a.telemetry) if a.telemetry else {}),
        ("scaling", "Scaling", a.scaling or {}), ("hta", "HTA cross-check", a.hta or {}),
        ("what-if", "What if", a.what_if.to_dict() if a.what_if else {})) if d]
    return {
        "a": a, "h": h, "job_steps": job_step_words(h), "ms": ms, "pct": pct, "command": _command(a), "run_facts": _run_facts(a),
        "setup": " · ".join(x for x in (f"{h.hosts} host{'' if h.hosts == 1 else 's'}" if h.hosts else "",
                                         str(a.run.backend or ""), str(a.run.device_type or "")) if x),
        "colours": style, "many": many,
        "rank_rows": [_rank_row(r, straggler_ranks) for r in (worst_ranks(a, WORST_N) if many else a.ranks)],
        "percentile_rows": [{"name": n, "cells": c} for n, c in percentile_rows(a.ranks)] if many else [],
        "untimed": sum(1 for r in a.ranks if step_us(r) is None),
        "stragglers": ordered_stragglers(a)[:MAX_TABLE_ROWS],
        "no_straggler": no_straggler_words(a),
        "findings": [_finding_view(n, f) for n, f in enumerate(findings)],
        "what_if_method": what_if_method_words(a.what_if),
        "critical_path": _critical_path_view(a),
        "timeline": _timeline_view(a),
        "efficiency": _efficiency_view(a),
        "memory": _memory_view(a),
        "collectives": collectives[:MAX_TABLE_ROWS], "collectives_total": len(collectives),
        "groups": [(g, rank_ranges(g.ranks)) for g in a.process_groups[:MAX_TABLE_ROWS]],
        "notices": ordered_notices(a)[:MAX_NOTICES],
        "notices_shown": NOTICES_SHOWN,
        "extra": [(name, title, facts) for name, title, d in extra if (facts := generic_facts(d))],
        "charts": figures(a),
        "over_time": over_time_lines(a),
        "hang": job_hang(a), "hang_lines": _hang_lines(job_hang(a)),
    }


def _hang_lines(h: Hang | None) -> list[str]:
    """The ranks that waited, the ones that never arrived, and what the flight recorder adds."""
    if h is None:
        return []
    return ([hang_wait_words(w) for w in h.waited[:8]] + [hang_late_words(x) for x in h.late[:8]]
            + hang_flight_lines(h))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals["plotlyjs"] = Markup(get_plotlyjs())  # the library itself, not data
    return env


def render_html(a: Analysis) -> str:
    """The report as one HTML document (a few MB, mostly plotly.js)."""
    return _environment().get_template("report.html.j2").render(**_context(a))
