"""The timeline screen through Textual's pilot, on real runs' Analyses (2 ranks, gloo on
CPU, three profiled steps with one all_reduce each: tests/data/cpu-2rank; the sampled GPU
job: two steps, all_to_all, all_reduce and all_gather): zoom down to microseconds, scroll
by the time expected, a step and a collective chosen, and the lanes' colours checked
against the Analysis' `step_timeline`, worked out here cell by cell."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from textual.strip import Strip

from factories import screen_text, settle
from pardiag import analysis as model
from pardiag import style
from pardiag.analysis import Analysis
from pardiag.tui.app import make_app
from pardiag.tui.widgets.step_lanes import EMPTY_LANE, LABEL, MARK, MIN_VISIBLE_US, StepLanes

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
pytestmark = pytest.mark.anyio
COLOUR_OF = {v: k for k, v in style.CATEGORY_COLOURS.items()}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def cpu_run() -> Analysis:
    """tests/data/cpu-2rank analysed, kept as tui-timeline.json (not an *.analysis.json: the
    renderers' contract analyses cpu-2rank itself)."""
    return model.load(DATA / "tui-timeline.json")


@functools.cache
def gpu_run() -> Analysis:
    folder = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    if not folder.is_dir():
        pytest.skip("GPU trace fixture sampled-128rank-job not present")
    from pardiag.analyzers.pipeline import analyze_path

    return analyze_path(folder, jobs=1)


def block_step(a: Analysis, step: int) -> dict[str, Any]:
    assert a.step_timeline is not None
    return next(e for e in a.step_timeline["steps"] if e["step"] == step)


def span_of(entry: dict[str, Any]) -> float:
    """The last rank's end of the step, or a collective's end after it (step 8's all_reduce
    ends on rank 1 at 83.7 ms, 3.2 ms after rank 1's step)."""
    ends = [r["end_us"] for r in entry["ranks"]]
    return max(ends + [m["end_us"] for c in entry["collectives"] for m in c["members"]])


def cells(strip: Strip) -> list[tuple[str, Style | None]]:
    out: list[tuple[str, Style | None]] = []
    for seg in strip:
        out.extend((ch, seg.style) for ch in seg.text)
    return out


def lane_cells(lanes: StepLanes, rank: int) -> list[tuple[str, Style | None]]:
    row = [r.rank for r in lanes.step.ranks].index(rank)
    return cells(lanes.render_line(row + 1))[LABEL:]


def covering(segments: list[list[Any]], t0: float, t1: float) -> str | None:
    """The category covering most of [t0, t1), by a plain sum over every run (of a tie,
    the first in the legend); none where the part no run covers is larger."""
    cover: dict[str, float] = {}
    for s, e, c in segments:
        d = min(e, t1) - max(s, t0)
        if d > 0:
            cover[c] = cover.get(c, 0.0) + d
    if not cover:
        return None
    best = max(cover.values())
    first = next(c for c in style.CATEGORY_LABELS if cover.get(c) == best)
    return first if best >= (t1 - t0) - sum(cover.values()) else None


async def open_timeline(pilot) -> StepLanes:
    await settle(pilot)
    await pilot.press("3")
    await settle(pilot)
    return pilot.app.screen.query_one(StepLanes)


async def test_every_profiled_step_and_the_middle_one_first() -> None:
    a = cpu_run()
    async with make_app(a).run_test(size=(80, 24)) as pilot:
        lanes = await open_timeline(pilot)
        assert [s.step for s in lanes.steps] == [7, 8, 9] and lanes.step.step == 8
        assert "step 8 (2 of 3)" in screen_text(pilot.app)
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert lanes.step.step == 9
        assert lanes.span_us == span_of(block_step(a, 9))
        await pilot.press("left_square_bracket", "left_square_bracket", "left_square_bracket")
        await settle(pilot)
        assert lanes.step.step == 7 and "step 7 (1 of 3)" in screen_text(pilot.app)


async def test_zoom_reaches_microseconds() -> None:
    async with make_app(cpu_run()).run_test(size=(80, 24)) as pilot:
        lanes = await open_timeline(pilot)
        axis = "".join(ch for ch, _ in cells(lanes.render_line(0)))
        assert axis.startswith("ms") and lanes.visible_us() == pytest.approx(lanes.span_us)
        # 81.2 ms / 2^13 = 9.9 µs < 10 µs: the 13th press stops at 10 µs
        await pilot.press(*["plus"] * 14)
        await settle(pilot)
        assert lanes.visible_us() == pytest.approx(MIN_VISIBLE_US)
        axis = "".join(ch for ch, _ in cells(lanes.render_line(0)))
        assert axis.startswith("µs")
        width = pilot.app.screen.query_one(StepLanes).scrollable_content_region.width - LABEL
        assert f"1 cell = {MIN_VISIBLE_US / width:.3g} µs" in screen_text(pilot.app)
        await pilot.press("0")
        assert lanes.zoom == 1.0 and lanes.offset_us == 0.0


async def test_scrolling_moves_by_a_quarter_of_the_view() -> None:
    a = cpu_run()
    span = span_of(block_step(a, 8))
    async with make_app(a).run_test(size=(80, 24)) as pilot:
        lanes = await open_timeline(pilot)
        await pilot.press("plus", "plus", "plus")  # 1/8 of the step, about its middle
        assert lanes.visible_us() == pytest.approx(span / 8)
        assert lanes.offset_us == pytest.approx(span / 2 - span / 16)
        await pilot.press("right")  # a quarter of 1/8 of the step later
        assert lanes.offset_us == pytest.approx(span * 15 / 32)
        await pilot.press("left", "left")
        assert lanes.offset_us == pytest.approx(span * 13 / 32)
        await pilot.press("end")
        assert lanes.offset_us == pytest.approx(span * 7 / 8)
        await pilot.press("right")  # nothing after the end
        assert lanes.offset_us == pytest.approx(span * 7 / 8)
        await pilot.press("home")
        assert lanes.offset_us == 0.0
        await settle(pilot)
        assert f"0 µs–{span / 8 / 1000:.3g} ms of {span / 1000:.3g} ms" in screen_text(pilot.app)


@pytest.mark.parametrize("which", ["cpu", "gpu"])
async def test_a_chosen_collective_is_marked_on_every_rank(which: str) -> None:
    a = cpu_run() if which == "cpu" else gpu_run()
    async with make_app(a).run_test(size=(120, 30)) as pilot:
        lanes = await open_timeline(pilot)
        entry = block_step(a, lanes.step.step)
        assert entry["collectives"]
        for c in entry["collectives"]:
            await pilot.press("plus", "plus", "plus", "tab")  # zoomed in: choosing brings it into view
            await settle(pilot)
            lo, hi = min(m["start_us"] for m in c["members"]), max(m["end_us"] for m in c["members"])
            assert lanes.offset_us <= lo and hi <= lanes.offset_us + lanes.visible_us()
            assert lanes.chosen_spans() == {m["rank"]: (m["start_us"], m["end_us"]) for m in c["members"]}
            cell = lanes.visible_us() / lanes.body_width()
            for m in c["members"]:
                marked = [x for x, (ch, _) in enumerate(lane_cells(lanes, m["rank"])) if ch == MARK]
                first = int((max(m["start_us"], lanes.offset_us) - lanes.offset_us) // cell)
                last = int((min(m["end_us"], lanes.offset_us + lanes.visible_us()) - lanes.offset_us) / cell - 1e-9)
                assert marked == list(range(first, last + 1)), m["rank"]
            text = screen_text(pilot.app)
            assert c["op"] in text and "transfer" in text
            worst = max(c["members"], key=lambda m: m["wait_us"])
            assert f"rank {worst['rank']} " in text.split("waited:")[1]
        await pilot.press("tab")  # past the last: none chosen
        assert lanes.chosen_spans() == {}


async def test_the_cpu_runs_all_reduce_detail_line() -> None:
    async with make_app(cpu_run()).run_test(size=(120, 30)) as pilot:
        await open_timeline(pilot)
        await pilot.press("tab")
        await settle(pilot)
        # step 8: rank 1 waited 2677 us of its 9128 us; 6451 us of transfer; 2136104 bytes
        assert ("1 of 1: all_reduce 2.1 MB (group 0:default_pg) · transfer 6.45 ms · waited: rank 1 2.68 ms, "
                "rank 0 0 µs") in screen_text(pilot.app)


@pytest.mark.parametrize("keys", [[], ["plus", "plus", "end"], ["plus"] * 6 + ["home"]])
async def test_lane_colours_are_the_category_covering_each_cell(keys: list[str]) -> None:
    a = cpu_run()
    entry = block_step(a, 8)
    async with make_app(a).run_test(size=(100, 30)) as pilot:
        lanes = await open_timeline(pilot)
        if keys:
            await pilot.press(*keys)
        cell = lanes.visible_us() / lanes.body_width()
        seen: set[str | None] = set()
        for row in entry["ranks"]:
            drawn = lane_cells(lanes, row["rank"])
            assert len(drawn) == lanes.body_width()
            for x, (ch, st) in enumerate(drawn):
                t0 = lanes.offset_us + x * cell
                want = covering(row["segments"], t0, t0 + cell)
                got = None if ch == " " else COLOUR_OF[st.color.get_truecolor().hex]
                assert got == want, (row["rank"], x)
                seen.add(want)
        assert len(seen - {None}) >= 2  # not one colour all along


async def test_a_rank_without_events_says_so_and_no_block_falls_back() -> None:
    a = cpu_run()
    block = dict(a.step_timeline or {})
    block["steps"] = [dict(e, ranks=[dict(r, segments=[]) if r["rank"] == 1 else r for r in e["ranks"]])
                      for e in block["steps"]]
    async with make_app(dataclasses.replace(a, step_timeline=block)).run_test(size=(100, 24)) as pilot:
        lanes = await open_timeline(pilot)
        assert EMPTY_LANE in screen_text(pilot.app)
        await pilot.press("tab", "plus", "right", "end")  # rank 1 has no events but its collective part is kept
        assert EMPTY_LANE in screen_text(pilot.app) and lanes.chosen_spans()
    async with make_app(dataclasses.replace(a, step_timeline=None)).run_test(size=(100, 24)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        assert not pilot.app.screen.query(StepLanes)
        assert "no step timeline in this analysis" in screen_text(pilot.app)


def test_the_help_lists_the_timeline_keys() -> None:
    from pardiag.tui.screens.help import KEYS

    keys = dict(KEYS)["timeline"]
    assert [k for k, _ in keys] == ["+ / -", "← / →", "home / end", "[ / ]", "tab ⇧tab", "0"]
    bound = {b.key for b in StepLanes.BINDINGS if hasattr(b, "key")}
    assert {"plus,equals_sign", "minus", "left", "right", "home", "end", "left_square_bracket",
            "right_square_bracket", "tab,enter", "shift+tab", "0"} == bound


@pytest.mark.parametrize("block", [None, [], {"steps": "x"}, {"steps": [{"step": "8"}]},
                                   {"steps": [{"step": 8, "ranks": [{"rank": 0, "segments": [[0, "a", "compute"]]}],
                                               "collectives": [{"members": [{"rank": 0}]}, 3]}]}])
def test_a_broken_block_gives_what_it_can(block: Any) -> None:
    from pardiag.tui.step_events import profiled_steps

    steps = profiled_steps(block)
    assert all(s.collectives == () for s in steps)
    assert [(s.step, [r.segments for r in s.ranks]) for s in steps] in ([], [(8, [()])])


@pytest.mark.parametrize(("segments", "start", "cell", "n", "want"), [
    # 10 us of compute, 2 of idle, 18 of exposed communication: 10 us cells
    ([(0, 10, "compute"), (10, 12, "idle"), (12, 30, "comm_exposed")], 0.0, 10.0, 4,
     ["compute", "comm_exposed", "comm_exposed", None]),
    ([(0, 5, "idle"), (5, 10, "compute")], 0.0, 10.0, 1, ["compute"]),  # a tie: the legend's first
    ([(0, 4, "compute")], 0.0, 10.0, 1, [None]),  # 6 us of the cell uncovered
    ([(0, 5, "compute")], 0.0, 10.0, 1, ["compute"]),  # half: it counts
    ([(100, 101, "memcpy"), (101, 103, "dataloader")], 100.5, 0.5, 6,  # half-µs cells
     ["memcpy", "dataloader", "dataloader", "dataloader", "dataloader", None]),
    ([], 0.0, 1.0, 2, [None, None]),
])
def test_cells_by_hand(segments: list[tuple[float, float, str]], start: float, cell: float, n: int,
                       want: list[str | None]) -> None:
    from pardiag.tui.step_events import RankEvents

    assert RankEvents(0, tuple(segments)).cells(start, cell, n) == want
