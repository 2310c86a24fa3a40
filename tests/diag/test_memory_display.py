"""Memory by category (`ranks[].memory`) in every output: the same words in the terminal
summary, the markdown, the HTML and the TUI, worked out by hand from blocks built here
and read from a real run (tests/data/memory-hog.json: examples/scenarios/memory_hog.py on
2 CPU ranks, rank 1 keeps 320 MiB more); its JSON round trip; unknown figures said as
unknown with why, never as 0; an analysis without the block renders as before."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from factories import rank, screen_text, settle, small
from pardiag.analysis import Analysis, from_dict, load
from pardiag.display_memory import (
    CATEGORIES,
    MAX_RANK_LINES,
    memory_cells,
    memory_lines,
    memory_table,
    memory_words,
    rank_memory_words,
    size_text,
    source_lines,
    unknown_lines,
)
from pardiag.render_text import summary_text
from pardiag.report_html import figures, memory_figure, render_html
from pardiag.report_md import render_markdown

DATA = Path(__file__).resolve().parents[1] / "data"
GiB = 2**30

# rank 0: a GPU rank whose every category is known; rank 1: one with no sampled step (no
# activations, so no other) and no reserved figure
GPU0: dict[str, Any] = {
    "device": "cuda",
    "peak": {"parameters": 4_223_016.0, "gradients": 8_446_032.0, "optimizer_state": 8_446_072.0,
             "activations": 1.5 * GiB, "other": 2 * GiB - 4_223_016 - 8_446_032 - 8_446_072 - 1.5 * GiB,
             "total": 2.0 * GiB},
    "steady": {"parameters": 4_223_016.0, "gradients": 0.0, "optimizer_state": 8_446_072.0, "activations": 0.0,
               "other": 1_000_000.0, "total": 13_669_088.0},
    "reserved": 3.0 * GiB, "allocated": 2.0 * GiB, "rss_peak": None, "rss_steady": 2.25 * GiB,
    "capacity": 80.0 * GiB,
    "sources": {"parameters": "the optimizers' parameters (meta.json)",
                "gradients": "one per trainable parameter + DDP's bucket buffers",
                "optimizer_state": "the optimizers' state tensors (meta.json)",
                "activations": "the allocator before the first backward, less at the first forward (4 sampled steps)",
                "other": "the peak allocated less the four categories"},
}
GPU1: dict[str, Any] = {
    **GPU0,
    "peak": {**GPU0["peak"], "activations": None, "other": None, "total": 2.5 * GiB},
    "reserved": None, "allocated": 2.5 * GiB,
    "sources": {k: v for k, v in GPU0["sources"].items() if k not in ("activations", "other")},
}

# worked by hand: 4,223,016 B / 2**20 = 4.03 MB; 8,446,032 / 2**20 = 8.05 MB; the other of rank 0:
# 2 GiB less the four = 515,755,792 B = 0.48 GB; rank 1's 2.5 GB of 80 GB = 3%, 0.5 GB over rank 0's 2 GB = +25%
RANK0 = ("rank 0: peak 2.00 GB allocated, 3.00 GB reserved; parameters 4.0 MB, gradients 8.1 MB, "
         "optimizer state 8.1 MB, activations 1.50 GB, other 0.48 GB")
RANK1 = ("rank 1: peak 2.50 GB allocated; parameters 4.0 MB, gradients 8.1 MB, optimizer state 8.1 MB, "
         "activations unknown (no sampled step reached backward, no --profile-memory), "
         "other unknown (needs the four categories)")
JOB = ("largest rank 1, peak 2.50 GB allocated of 80.00 GB (3%); "
       "across 2 ranks 2.00 GB to 2.50 GB (spread 0.50 GB, +25%)")

# the real run: rank 1's peak RSS 981,037,056 B = 0.91 GB, rank 0's 632,971,264 B = 0.59 GB, of
# 12,638,029,824 B = 11.77 GB each (the host's memory / 2 ranks)
HOG_JOB = "largest rank 1, peak 0.91 GB RSS of 11.77 GB (8%); across 2 ranks 0.59 GB to 0.91 GB (spread 0.32 GB, +55%)"
HOG_RANK1 = ("rank 1: peak 0.91 GB RSS; parameters 4.0 MB, gradients 8.1 MB, optimizer state 8.1 MB, "
             "activations unknown (no --profile-memory on a CPU)")


def with_memory(*blocks: dict[str, Any] | None) -> Analysis:
    a = small()
    return replace(a, ranks=[replace(r, memory=m) for r, m in zip(a.ranks, blocks)])


def hog() -> Analysis:
    return load(DATA / "memory-hog.json")


def without_memory(a: Analysis) -> Analysis:
    return replace(a, ranks=[replace(r, memory=None) for r in a.ranks])


def test_sizes_read_as_the_memory_findings_write_them() -> None:
    assert size_text(4_223_016) == "4.0 MB" and size_text(8_446_032) == "8.1 MB"
    assert size_text(981_037_056) == "0.91 GB" and size_text(12_638_029_824) == "11.77 GB"
    assert size_text(0.25 * GiB) == "0.25 GB" and size_text(100 * 2**20) == "100.0 MB"
    assert size_text(512 * 1024) == "512 kB" and size_text(0) == "0 B" and size_text(None) == "unknown"
    # the memory_imbalance finding of the real run says the same sizes as the memory line
    a = hog()
    evidence = " ".join(a.findings[0].evidence) + a.findings[0].title
    assert a.findings[0].lever == "memory_imbalance"
    for size in ("0.91 GB", "0.59 GB", "0.32 GB", "11.77 GB"):
        assert size in evidence and size in (memory_words(a) or "")


def test_the_same_words_in_every_output() -> None:
    a = with_memory(GPU0, GPU1)
    assert memory_words(a) == JOB
    assert memory_lines(a) == [RANK0, RANK1]
    text = summary_text(a, width=400)
    assert f"memory: {JOB}\n  {RANK0}\n  {RANK1}\n" in text
    md = render_markdown(a)
    assert f"### Memory\n\n{JOB}\n\n- {RANK0}\n- {RANK1}\n" in md
    html = render_html(a)
    assert f"<strong>{JOB}</strong>" in html and 'href="#memory"' in html and 'id="fig-memory"' in html
    row0 = "".join(f'<td class="num">{c}</td>' for c in
                   ("0", "4.0 MB", "8.1 MB", "8.1 MB", "1.50 GB", "0.48 GB", "2.00 GB", "3.00 GB", "13.0 MB",
                    "unknown", "2.25 GB", "80.00 GB"))
    row1 = "".join(f'<td class="num">{c}</td>' for c in
                   ("1", "4.0 MB", "8.1 MB", "8.1 MB", "unknown", "unknown", "2.50 GB", "unknown", "13.0 MB",
                    "unknown", "2.25 GB", "80.00 GB"))
    assert f"<tr>{row0}</tr>" in html and f"<tr>{row1}</tr>" in html
    assert "activations unknown on rank 1: no sampled step reached backward, no --profile-memory." in html
    assert "reserved unknown on rank 1: not recorded at the job&#39;s end." in html
    assert "RSS peak unknown: recorded on CPU ranks only." in html


def test_the_chart_stacks_the_categories_against_the_peak() -> None:
    fig = memory_figure(with_memory(GPU0, GPU1))
    assert fig is not None
    traces = {t.name: list(t.x) for t in fig.data}
    assert list(traces) == ["parameters", "gradients", "optimizer state", "activations", "other", "peak allocated"]
    assert traces["parameters"] == [0.004, 0.004] and traces["activations"] == [1.5, None]  # GB
    assert traces["other"] == [0.48, None] and traces["peak allocated"] == [2.0, 2.5]
    assert fig.layout.barmode == "stack" and fig.layout.xaxis.title.text == "GB at the rank's peak"
    cpu = {t.name: list(t.x) for t in memory_figure(hog()).data}  # type: ignore[union-attr]
    assert list(cpu) == ["parameters", "gradients", "optimizer state", "peak RSS"]  # activations unknown everywhere
    assert cpu["peak RSS"] == [603.648, 935.59]  # MB: 632,971,264 and 981,037,056 B / 2**20


def test_a_real_run_in_every_output() -> None:
    a = hog()
    text = summary_text(a, width=400)
    assert f"memory: {HOG_JOB}\n" in text and f"  {HOG_RANK1}\n" in text
    assert f"- {HOG_RANK1}\n" in render_markdown(a)
    html = render_html(a)
    assert f"<strong>{HOG_JOB}</strong>" in html
    assert "activations unknown: no --profile-memory on a CPU." in html
    assert "parameters: the optimizers&#39; parameters (meta.json)" in html
    header, rows = memory_table([(r.rank, r.memory) for r in a.ranks if r.memory])
    # a CPU-only run: the allocator's columns, n/a on every rank, are left out
    assert header == ["rank", "parameters", "gradients", "optimizer state", "activations", "RSS peak", "RSS steady",
                      "capacity"]
    assert rows[1] == ["1", "4.0 MB", "8.1 MB", "8.1 MB", "unknown", "0.91 GB", "0.91 GB", "11.77 GB"]
    assert "n/a" in memory_cells(1, a.ranks[1].memory or {})
    from pardiag.analyzers.memory import MEMORY_DEFINITIONS

    for text in MEMORY_DEFINITIONS.values():
        assert text.replace("'", "&#39;") in html


def test_the_block_reads_back_from_json() -> None:
    a = with_memory(GPU0, GPU1)
    back = from_dict(json.loads(a.to_json()))
    assert [r.memory for r in back.ranks] == [GPU0, GPU1]
    assert render_markdown(back) == render_markdown(a) and summary_text(back) == summary_text(a)
    real = hog()
    again = from_dict(json.loads(real.to_json()))
    assert [r.memory for r in again.ranks] == [r.memory for r in real.ranks] and real.ranks[1].memory is not None
    assert memory_words(again) == HOG_JOB


TEXT_PART = r"memory: [^\n]*\n(  rank [^\n]*\n)+"
MD_PART = r"### Memory\n\n.*?\n\n(- [^\n]*\n)+\n"
HTML_PART = r'<section id="memory">.*?</section>\n\n'


def memory_parts(a: Analysis) -> list[str]:
    """The memory part of the terminal summary, the markdown and the HTML."""
    out = []
    for pattern, text in ((TEXT_PART, summary_text(a, width=400)), (MD_PART, render_markdown(a)),
                          (HTML_PART, render_html(a))):
        m = re.search(pattern, text, flags=re.S)
        assert m is not None, pattern
        out.append(m[0])
    return out


def _drop(pattern: str, text: str) -> str:
    out, n = re.subn(pattern, "", text, flags=re.S)
    assert n == 1, pattern  # the memory part was there, once
    return out


def test_without_the_block_nothing_changes() -> None:
    """The outputs of an analysis with memory blocks, less their memory part, are the
    outputs of the same analysis without them; and without them nothing says memory."""
    a = hog()
    b = without_memory(a)
    assert memory_words(b) is None and memory_lines(b) == [] and unknown_lines(b) == [] and source_lines(b) == []
    text, plain = summary_text(a, width=400), summary_text(b, width=400)
    assert _drop(TEXT_PART, text) == plain and "memory:" not in plain
    md, plain_md = render_markdown(a), render_markdown(b)
    assert _drop(MD_PART, md) == plain_md and "### Memory" not in plain_md
    html, plain_html = render_html(a), render_html(b)
    assert "fig-memory" in figures(a) and "fig-memory" not in figures(b)
    html = _drop(HTML_PART, html)
    html = _drop(r'      <a href="#memory">Memory</a>\n', html)
    charts = len(figures(b))
    for one_more, as_many in ((f"{charts + 1} charts · works", f"{charts} charts · works"),
                              (f'data-expected="{charts + 1}"', f'data-expected="{charts}"')):
        assert html.count(one_more) == 1  # the footer counts the memory chart
        html = html.replace(one_more, as_many)
    assert html == plain_html and 'id="memory"' not in render_html(b)
    # an analysis written before the block existed (no "memory" key) reads as none
    old = json.loads(b.to_json())
    for r in old["ranks"]:
        del r["memory"]
    assert render_markdown(from_dict(old)) == plain_md


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_unknown_is_said_as_unknown_never_as_zero(device: str) -> None:
    nothing = {"device": device, "peak": {k: None for k in (*CATEGORIES, "total")}, "steady": {}, "reserved": None,
               "allocated": None, "rss_peak": None, "rss_steady": None, "capacity": None, "sources": {}}
    a = with_memory(nothing, {**nothing, "sources": {"activations": "the profiler stopped before backward"}})
    line = rank_memory_words(0, nothing)
    assert "parameters unknown (no optimizer parameters in meta.json)" in line
    assert "gradients unknown (no trainable parameters in meta.json)" in line
    assert "optimizer state unknown (no optimizer state in meta.json)" in line
    said = memory_lines(a)[1]
    assert "activations unknown (the profiler stopped before backward)" in said  # the block's own reason
    if device == "cpu":
        assert line.startswith("rank 0: peak unknown (not recorded); ")
        assert "activations unknown (no --profile-memory on a CPU)" in line
        assert "other" not in line and memory_cells(0, nothing)[5:9] == ["n/a"] * 4
    else:
        assert line.startswith("rank 0: peak unknown (not recorded at the job's end); ")
        assert "other unknown (no peak allocated)" in line and memory_cells(0, nothing)[5:9] == ["unknown"] * 4
    assert memory_cells(0, nothing)[1:5] == ["unknown"] * 4
    assert (memory_words(a) or "").startswith("peak unknown on every rank (")
    for part in memory_parts(a):
        assert "unknown" in part and not re.search(r"\b0(\.0+)? ?(B|kB|MB|GB)\b", part), part
    assert memory_figure(a) is None  # nothing to draw


def test_a_broken_block_is_read_as_far_as_it_goes() -> None:
    a = with_memory({"device": "cuda", "peak": "junk", "allocated": "2 GB", "sources": ["no"]}, {"rss_peak": True})
    assert memory_lines(a)[0].startswith("rank 0: peak unknown (not recorded at the job's end); parameters unknown")
    assert render_html(a) and render_markdown(a) and summary_text(a)
    b = replace(a, ranks=[replace(r, memory="junk") for r in a.ranks])  # type: ignore[arg-type]
    assert memory_words(b) is None and render_markdown(b) == render_markdown(without_memory(a))


def test_past_eight_ranks_the_largest_peaks_then_how_many_more() -> None:
    ranks = [replace(rank(i), memory={**GPU0, "allocated": (1 + i / 10) * GiB, "capacity": 40.0 * GiB})
             for i in range(MAX_RANK_LINES + 3)]
    a = replace(small(), ranks=ranks)
    lines = memory_lines(a)
    assert len(lines) == MAX_RANK_LINES + 1 and lines[-1] == "… 3 more ranks"
    assert [int(x.split(":")[0].removeprefix("rank ")) for x in lines[:-1]] == list(range(3, MAX_RANK_LINES + 3))
    assert lines[0].startswith("rank 3: peak 1.30 GB allocated, 3.00 GB reserved; ")
    assert "- … 3 more ranks\n" in render_markdown(a) and "  … 3 more ranks\n" in summary_text(a, width=400)
    assert memory_words(a) == ("largest rank 10, peak 2.00 GB allocated of 40.00 GB (5%); "
                               "across 11 ranks 1.00 GB to 2.00 GB (spread 1.00 GB, +100%)")


def test_ranks_measured_differently_have_no_spread() -> None:
    cpu = {"device": "cpu", "peak": {}, "rss_peak": 3.0 * GiB, "capacity": 8.0 * GiB}
    a = with_memory(GPU0, cpu)
    assert memory_words(a) == ("largest rank 1, peak 3.00 GB RSS of 8.00 GB (38%); the ranks' peaks are measured "
                               "differently (allocated on a GPU, RSS elsewhere): no spread")
    one = with_memory(None, GPU1)
    assert memory_words(one) == "largest rank 1, peak 2.50 GB allocated of 80.00 GB (3%); 1 rank without a known peak"


def test_the_categories_are_the_analysis_ones() -> None:
    from pardiag.analyzers.memory import CATEGORIES as ANALYSED

    assert CATEGORIES == ANALYSED


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_tui_says_the_same() -> None:
    from pardiag.tui.app import make_app
    from pardiag.tui.screens.rank import RankScreen
    from pardiag.tui.widgets.section import Section

    async with make_app(with_memory(GPU0, GPU1)).run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        assert f"memory: {JOB}" in screen_text(pilot.app)
        await pilot.press("down", "enter")
        await settle(pilot)
        assert isinstance(pilot.app.screen, RankScreen) and pilot.app.screen.rank.rank == 1
        assert "memory at the peak" in [s.title for s in pilot.app.screen.query(Section)]
        text = screen_text(pilot.app)
        assert "peak 2.50 GB allocated" in text
        words = " ".join(text.split())  # the grid's label and value, one space apart
        for row in ("parameters 4.0 MB", "activations unknown (no sampled step reached backward, no --profile-memory)",
                    "other unknown (needs the four categories)", "reserved unknown (not recorded at the job's end)",
                    "peak allocated 2.50 GB", "capacity 80.00 GB"):
            assert row in words, row
    async with make_app(without_memory(with_memory(GPU0, GPU1))).run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        assert "memory:" not in screen_text(pilot.app)
        await pilot.press("down", "enter")
        await settle(pilot)
        assert "memory at the peak" not in [s.title for s in pilot.app.screen.query(Section)]
