"""Contract test: every output format of `pardiag report --format` (the terminal
summary included), run over the same analyses, shows the job-level figures of the
Analysis' `summary` as the display layer formats them, each finding's lever and
title, and each rank."""

from __future__ import annotations

import subprocess
import sys
import re
from pathlib import Path

import pytest

from pardiag.analysis import Analysis, load
from pardiag.display import headline, ms, pct
from pardiag.renderers import FORMATS
from factories import SHAPES

DATA = Path(__file__).parents[1] / "data"
FIXTURES = sorted(DATA.glob("*.analysis.json"))


@pytest.fixture(scope="module")
def cpu_2rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analysis of the two-rank CPU traces, as `pardiag analyze --json` writes it."""
    out = tmp_path_factory.mktemp("cpu-2rank") / "cpu-2rank.analysis.json"
    res = subprocess.run([sys.executable, "-m", "pardiag", "analyze", str(DATA / "cpu-2rank"), "--json"],
                         capture_output=True, text=True, check=True)
    out.write_text(res.stdout)
    return out


@pytest.fixture(params=[*(p.name for p in FIXTURES), "cpu-2rank"])
def analysis(request: pytest.FixtureRequest, cpu_2rank: Path) -> Analysis:
    return load(cpu_2rank if request.param == "cpu-2rank" else DATA / request.param)


def test_the_analyses_cover_what_the_contract_checks() -> None:
    analyses = [load(p) for p in FIXTURES]
    assert len(FIXTURES) == 3
    assert any(a.findings for a in analyses) and any(len(a.ranks) > 1 for a in analyses)
    assert all(a.job_summary.step_p50_us is not None and a.job_summary.comm_exposed_ratio is not None for a in analyses)


# A rank's row: the rank alone in a cell (bold when a straggler, in markdown), then its median step.
RANK_ROW = {
    "text": r"│\s*{rank}\s*│\s*{p50}\s*│",
    "md": r"\|\s*(\*\*)?{rank}(\*\*)?\s*\|[^|]*\|\s*{p50}\s*\|",
    "html": r'<td class="num">{rank}</td><td class="host"[^>]*>[^<]*</td><td class="num">{p50}</td>',
    "json": r'"rank": {rank},',
}


def test_report_offers_every_format() -> None:
    from pardiag.cli import build_parser

    parser, _ = build_parser()
    for name in FORMATS:
        assert parser.parse_args(["report", "RUN", "--format", name]).format == name
    assert set(FORMATS) == set(RANK_ROW)


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_renderer_shows_the_summary_findings_and_ranks(name: str, analysis: Analysis) -> None:
    fmt = FORMATS[name]
    out = fmt.render(analysis)
    words = " ".join(out.split())  # the terminal summary wraps long lines
    s = analysis.job_summary
    h = headline(analysis)
    if name == "json":  # the figures themselves, unrounded
        assert f'"step_p50_us": {s.step_p50_us!r}' in out and f'"comm_exposed_ratio": {s.comm_exposed_ratio!r}' in out
    else:
        assert f"{ms(h.step_us)} ms" in out and h.step_us == s.step_p50_us
        assert pct(h.comm_exposed_share) in out and h.comm_exposed_share == s.comm_exposed_ratio
    for f in analysis.findings:
        assert f.lever in out, f.lever
        assert " ".join(fmt.quote(f.title).split()) in words, f.title
    for r in analysis.ranks:
        row = RANK_ROW[name].format(rank=r.rank, p50=re.escape(ms(r.step_time_us.p50)))
        assert re.search(row, out), f"rank {r.rank}"


@pytest.mark.parametrize("case", ["empty", "single", "crashed", "cpu", "gpu", "512", "estimated"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_every_renderer_survives_every_shape_of_run(name: str, case: str) -> None:
    a = SHAPES[case]()  # an empty run, one rank, a crashed rank, no GPU, a GPU run, 512 ranks, estimates' basis
    out = FORMATS[name].render(a)
    assert out.strip() and out == FORMATS[name].render(a)
    for r in a.ranks if len(a.ranks) <= 16 else []:
        assert re.search(RANK_ROW[name].format(rank=r.rank, p50=re.escape(ms(r.step_time_us.p50))), out), f"rank {r.rank}"


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_renderer_names_the_op_asked_for_and_how_the_backend_ran_it(name: str) -> None:
    from dataclasses import replace

    from factories import analysis as build, collective, rank

    rs = replace(collective("reduce_scatter"), implementation="gloo:all_reduce")
    out = FORMATS[name].render(build([rank(0), rank(1)], collectives=[rs]))
    if name == "json":
        assert '"op": "reduce_scatter"' in out and '"implementation": "gloo:all_reduce"' in out
    else:
        assert FORMATS[name].quote("reduce_scatter (as gloo:all_reduce)") in out
