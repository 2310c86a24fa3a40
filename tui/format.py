"""Numbers, bars and badges as rich Text for the TUI.

Colours and labels come from `pardiag.style`, the same table the HTML report uses; the
numbers, rows and fact formatting come from `pardiag.display`, as in every report, so
that the TUI, the markdown and the HTML agree. Pure functions: no textual import here.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from rich.style import Style
from rich.text import Text

from pardiag import style
from pardiag.analysis import RankResult
from pardiag.display import clip, fact_text, gpu_split, ms, pct, per_step_us, rank_ranges, share, step_us

__all__ = [
    "clip", "ms", "pct", "per_step_us", "rank_ranges", "share", "step_us", "gpu_split",
    "Segment", "stacked", "draw", "breakdown_bar", "legend", "severity_badge", "heat_style",
    "mb", "fact_text", "numeric_series", "sparkline_text", "spread", "over_time_text",
]

Segment = tuple[float, float, str]  # start, end, colour (hex)
HEAT_LOW = "#2b3139"  # a cell that waits nothing: close to the background
SPARK = "▁▂▃▄▅▆▇█"


def stacked(parts: Iterable[tuple[float, str]]) -> list[Segment]:
    """Values laid end to end: [(value, colour)] -> [(start, end, colour)]; zeros dropped."""
    out: list[Segment] = []
    t = 0.0
    for value, colour in parts:
        if value > 0:
            out.append((t, t + value, colour))
            t += value
    return out


@lru_cache(maxsize=512)
def _style(fg: str | None, bg: str | None) -> Style:
    return Style(color=fg, bgcolor=bg)


def _cell(a: str | None, b: str | None) -> tuple[str, Style | None]:
    """One terminal cell from its left and right half: two colours per cell."""
    if a == b:
        return (" ", None) if a is None else ("█", _style(a, None))
    if a is not None and b is not None:
        return "▌", _style(a, b)
    return ("▌", _style(a, None)) if a is not None else ("▐", _style(b, None))


def draw(segs: Sequence[Segment], start: float, end: float, width: int) -> Text:
    """The part [start, end) of contiguous segments in `width` cells, at half-cell
    resolution (each half takes the colour under its midpoint)."""
    text = Text(no_wrap=True, overflow="crop")
    if width <= 0 or end <= start:
        return text
    starts = [s[0] for s in segs]
    half = (end - start) / (2 * width)

    def colour(i: int) -> str | None:
        x = start + (i + 0.5) * half
        j = bisect_right(starts, x) - 1
        return segs[j][2] if j >= 0 and x < segs[j][1] else None

    run: list[str] = []
    run_style: Style | None = None
    for c in range(width):
        ch, st = _cell(colour(2 * c), colour(2 * c + 1))
        if st is not run_style and run:
            text.append("".join(run), run_style)
            run = []
        run_style = st
        run.append(ch)
    if run:
        text.append("".join(run), run_style)
    return text


def breakdown_bar(r: RankResult, width: int) -> Text:
    """The rank's profiled window split by category, as one bar `width` cells long."""
    parts = [(r.breakdown_us.get(k, 0.0), style.CATEGORY_COLOURS[k]) for k in style.CATEGORY_LABELS]
    total = r.window_us if r.window_us > 0 else sum(v for v, _ in parts)
    return draw(stacked(parts), 0.0, total, width)


def legend(labels: Mapping[str, str], colours: Mapping[str, str], keys: Iterable[str] | None = None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, k in enumerate(keys if keys is not None else labels):
        if i:
            text.append("  ")
        text.append("█ ", Style(color=colours[k]))
        text.append(labels[k])
    return text


def severity_badge(severity: str) -> Text:
    colour = style.SEVERITY_COLOURS.get(severity, "#7f8c8d")
    return Text(f"{severity:^8}", style=Style(color="#ffffff", bgcolor=colour, bold=True))


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i : i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb))


@lru_cache(maxsize=64)
def _heat(step: int) -> Style:
    t = step / 20
    return Style(bgcolor=_mix(HEAT_LOW, style.WAIT_COLOUR, t), color="#ffffff" if t > 0.45 else "#c9ced6")


def heat_style(ratio: float) -> Style:
    """Background from near-background (0) to the report's waiting colour (1)."""
    r = 0.0 if not math.isfinite(ratio) else min(1.0, max(0.0, ratio))
    return _heat(round(r * 20))


def mb(n: float | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e6:,.1f}" if n >= 1e5 else f"{n / 1e6:.3f}"


def spread(r: RankResult) -> float | None:
    """How much longer the slowest step is than the median step, as a ratio."""
    st = r.step_time_us
    if st.p50 is None or st.max is None or st.p50 <= 0:
        return None
    return st.max / st.p50 - 1.0


def numeric_series(d: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, list[float]]:
    """Every list of at least two numbers inside a free-form dict, by dotted key."""
    out: dict[str, list[float]] = {}
    for k in sorted(d, key=str):
        v, key = d[k], f"{prefix}{k}"
        if isinstance(v, Mapping) and depth < 3:
            out.update(numeric_series(v, key + ".", depth + 1))
        elif isinstance(v, list) and len(v) >= 2 and all(_is_number(x) for x in v):
            out[key] = [float(x) for x in v]
        elif isinstance(v, list) and len(v) >= 2 and all(isinstance(x, Mapping) for x in v):
            for field in sorted({f for x in v for f in x if _is_number(x.get(f))}):
                values = [float(x[field]) for x in v if _is_number(x.get(field))]
                if len(values) >= 2 and field not in ("t_ns", "t_us", "t", "time", "ts"):
                    out[f"{key}.{field}"] = values
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sparkline_text(values: Sequence[float], width: int, colour: str = style.CATEGORY_COLOURS["compute"]) -> Text:
    """Values resampled to `width` cells (mean per cell), drawn with block glyphs."""
    if not values or width <= 0:
        return Text("")
    n = len(values)
    cells = []
    for c in range(min(width, n)):
        lo, hi = c * n // min(width, n), max(c * n // min(width, n) + 1, (c + 1) * n // min(width, n))
        chunk = values[lo:hi]
        cells.append(sum(chunk) / len(chunk))
    vmin, vmax = min(cells), max(cells)
    span = vmax - vmin
    glyphs = "".join(SPARK[0 if span <= 0 else min(7, int((x - vmin) / span * 7.999))] for x in cells)
    return Text(glyphs, style=Style(color=colour), no_wrap=True)


def over_time_text(temporal: Mapping[str, Any], width: int) -> Text:
    """The job's step over the run in `width` cells (the largest step of each cell, so a
    spike stays visible) and, below, what happened where: ``P`` profiled window, ``|`` a
    change of level, ``*`` a spike. Empty without a series."""
    steps, vals = list(temporal.get("steps") or []), list(temporal.get("job_step_us") or [])
    if len(steps) < 2 or len(steps) != len(vals) or width <= 0:
        return Text("")
    n = min(width, len(steps))
    bounds = [(c * len(steps) // n, max(c * len(steps) // n + 1, (c + 1) * len(steps) // n)) for c in range(n)]
    cells = [max(vals[lo:hi]) for lo, hi in bounds]
    vmin, vmax = min(cells), max(cells)
    span = vmax - vmin
    bar = "".join(SPARK[0 if span <= 0 else min(7, int((x - vmin) / span * 7.999))] for x in cells)
    first = [steps[lo] for lo, _ in bounds]
    last = [steps[hi - 1] for _, hi in bounds]

    def cell_of(step: int) -> int:
        return max(0, min(n - 1, bisect_right(first, step) - 1))

    marks = [" "] * n
    for lo_s, hi_s in temporal.get("windows") or []:
        for c in range(n):
            if first[c] <= hi_s and last[c] >= lo_s:
                marks[c] = "P"
    # a window's steps are not counted: the window sits between two cells
    for lo_s, _hi in temporal.get("windows") or []:
        c = cell_of(lo_s)
        if marks[c] == " ":
            marks[c] = "P"
    for sp in temporal.get("spikes") or []:
        marks[cell_of(int(sp.get("step", 0)))] = "*"
    for ch in temporal.get("change_points") or []:
        marks[cell_of(int(ch.get("step", 0)))] = "|"
    out = Text(no_wrap=True)
    out.append(bar, style=Style(color=style.CATEGORY_COLOURS["compute"]))
    out.append(f"  {vmin / 1000:.1f}-{vmax / 1000:.1f} ms\n")
    out.append("".join(marks), style=Style(color="#c0392b"))
    out.append(f"  steps {steps[0]}-{steps[-1]}")
    return out
