"""Contract tests for the report renderers (HTML, markdown) and `pardiag report`.

Every renderer survives an empty run, a single rank, a crashed rank, a run without a
GPU, a GPU run with NCCL facts and a 512-rank job; untrusted text stays text; the
output is deterministic; the markdown of a fixed small Analysis is golden.
Set PARDIAG_REGEN_GOLDEN=1 to rewrite tests/golden/report_small.md on purpose.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

import pytest
from plotly.offline import get_plotlyjs

from conftest import FIXTURES, SHARED
from pardiag import cli
from pardiag.analysis import Analysis, Finding, from_dict
from pardiag.report_html import BAR_RANKS, figures, generic_facts, render_html
from pardiag.report_md import md_code_block, md_text, render_markdown
from factories import SHAPES as CASES
from factories import EVIL, collective, crashed, hostile, rank_result, run_info, small

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "report_small.md"
MD_LIMIT = 60_000
HTML_LIMIT = 8 * 1024 * 1024

RENDERERS: dict[str, Callable[[Analysis], str]] = {"html": render_html, "md": render_markdown}


# -- contract: every renderer, every shape of run --------------------------------------------


@pytest.fixture(scope="module")
def analyses() -> dict[str, Analysis]:
    return {name: make() for name, make in CASES.items()}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", RENDERERS)
def test_every_renderer_survives(fmt: str, case: str, analyses: dict[str, Analysis]) -> None:
    out = RENDERERS[fmt](analyses[case])
    assert out.strip()
    if fmt == "md":
        assert len(out) < MD_LIMIT
        assert "pardiag report" in out
    else:
        assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
        assert len(out.encode()) < HTML_LIMIT


@pytest.mark.parametrize("fmt", RENDERERS)
def test_empty_run_says_there_is_no_data(fmt: str, analyses: dict[str, Analysis]) -> None:
    out = RENDERERS[fmt](analyses["empty"])
    assert "No rank produced data" in out
    assert "no usable manifest" in out


@pytest.mark.parametrize("fmt", RENDERERS)
def test_crashed_rank_is_reported(fmt: str, analyses: dict[str, Analysis]) -> None:
    out = RENDERERS[fmt](analyses["crashed"])
    assert "rank 3 failed at step 7" in out
    assert "no profiler trace" in out


def test_crashed_rank_has_a_row_but_no_bar(analyses: dict[str, Analysis]) -> None:
    a = analyses["crashed"]
    html = render_html(a)
    assert re.search(r'<td class="num">3</td><td class="host" title="node0">node0</td><td class="num">-</td>', html)
    breakdown = json.loads(_figure_json(html, "fig-breakdown"))
    assert breakdown[0]["y"] == ["rank 0", "rank 1", "rank 2"]


def test_single_rank_has_no_straggler_section(analyses: dict[str, Analysis]) -> None:
    html = render_html(analyses["single"])
    assert 'id="stragglers"' not in html
    assert "Straggler:" not in render_markdown(analyses["single"])


def test_cpu_run_has_no_gpu_section(analyses: dict[str, Analysis]) -> None:
    html = render_html(analyses["cpu"])
    assert 'id="gpu"' not in html and "fig-gpu" not in html
    assert 'id="nccl"' not in html and 'id="telemetry"' not in html


def test_gpu_run_shows_gpu_nccl_and_telemetry(analyses: dict[str, Analysis]) -> None:
    html = render_html(analyses["gpu"])
    for section in ('id="gpu"', 'id="nccl"', 'id="telemetry"', 'id="fig-gpu"'):
        assert section in html
    assert "HW_SLOWDOWN" in html and "4242" in html
    assert "export NCCL_IB_HCA=mlx5\nunset NCCL_P2P_DISABLE" in html  # the env change, copyable
    md = render_markdown(analyses["gpu"])
    assert "[high] NCCL\\_P2P\\_DISABLE=1" in md.replace("**", "")


def test_512_ranks_use_heatmaps_and_percentiles(analyses: dict[str, Analysis]) -> None:
    a = analyses["512"]
    html = render_html(a)
    assert len(a.ranks) > BAR_RANKS
    assert len(html.encode()) < HTML_LIMIT
    for fig_id in ("fig-breakdown", "fig-phases", "fig-gpu"):
        assert json.loads(_figure_json(html, fig_id))[0]["type"] == "heatmap"
    assert "Across 512 ranks" in html and "The 8 slowest ranks" in html
    assert html.count("<tr") < 400  # no row per rank
    md = render_markdown(a)
    assert len(md) < MD_LIMIT
    assert "Across 512 ranks" in md
    assert md.count("\n| ") < 40


def test_markdown_honours_max_chars(analyses: dict[str, Analysis]) -> None:
    for limit in (500, 3000, 20_000):
        assert len(render_markdown(analyses["512"], max_chars=limit)) < limit
    cut = render_markdown(analyses["512"], max_chars=3000)
    assert "did not fit" in cut and "pardiag report" in cut


# -- untrusted text -----------------------------------------------------------------------------


def test_untrusted_text_stays_text_in_html() -> None:
    html = render_html(hostile())
    assert EVIL not in html
    assert "<img" not in html.replace(get_plotlyjs(), "")
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html  # shown, as text
    assert 'href="javascript:' not in html
    # every <script> in the page is plotly.js, a figure or ours: none opened by data
    opened = len(re.findall(r"<script\b", html))
    assert opened == html.count("</script>") == 3 + len(figures(hostile()))


def test_timeline_command_quotes_the_path_and_needs_traces() -> None:
    from dataclasses import replace

    a = small()
    odd = replace(a, run=replace(a.run, path="~/runs/it's <b>"))
    html = render_html(odd)
    assert "pardiag export ~/&#39;runs/it&#39;&#34;&#39;&#34;&#39;s &lt;b&gt;&#39; --perfetto -o job.json.gz" in html
    no_trace = replace(a, ranks=[replace(r, trace=None) for r in a.ranks])
    assert 'id="timeline"' not in render_html(no_trace) and 'id="timeline"' in html


@pytest.mark.parametrize("block", [{"ranks": 5}, {"ranks": [{"rank": "x", "segments": [[0, 1, "compute"]]}]},
                                   {"ranks": [{"rank": 0, "segments": [[0, "1", "compute"], [1, 2, "<b>"], 7]}]},
                                   {"step": "<i>", "ranks": [{"rank": 0, "segments": [[0, 1, "compute"]]}]}])
def test_a_broken_step_timeline_block_draws_what_it_can(block: dict[str, object]) -> None:
    from dataclasses import replace

    from pardiag.report_html import step_timeline_figure

    a = replace(small(), step_timeline=block)
    fig = step_timeline_figure(a)
    drawn = [seg for t in fig.data for seg in zip(t.y, t.base, t.x)] if fig is not None else []
    assert drawn == ([("rank 0", 0.0, 0.001)] if block.get("step") == "<i>" else [])
    html = render_html(a)
    assert ("fig-step-timeline" in html) == bool(drawn) and "<i>" not in html.replace(get_plotlyjs(), "")


def test_untrusted_text_stays_text_in_markdown() -> None:
    md = render_markdown(hostile())
    # fenced code (a finding's change) is shown literally by every markdown renderer
    prose = re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", md, flags=re.S | re.M)
    assert prose.count("```") == 0 and len(prose) < len(md)
    assert "<img" not in prose and "</script" not in prose and "<" not in prose.replace("<sub>", "").replace("</sub>", "")
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in prose
    assert "javascript:" not in md


def test_markdown_escaping() -> None:
    assert md_text("a|b") == "a\\|b"
    assert md_text("`x` *y* _z_ [l](u)") == "\\`x\\` \\*y\\* \\_z\\_ \\[l\\](u)"
    assert md_text("<b>&</b>") == "&lt;b&gt;&amp;&lt;/b&gt;"
    assert md_text("@team #12") == "&#64;team &#35;12"
    assert md_text("two\nlines") == "two lines"
    assert len(md_text("x" * 1000)) == 200
    assert md_code_block("a ``` b") == ["````", "a ``` b", "````"]


def test_markdown_table_cells_cannot_split_columns() -> None:
    a = hostile()
    a = Analysis(run=a.run, ranks=a.ranks, collectives=[collective(op="x|y|z", group="g|h")], stragglers=[])
    md = render_markdown(a)
    row = next(line for line in md.splitlines() if line.startswith("| x"))
    assert row.count("|") - row.count("\\|") == 8  # 7 columns


# -- determinism and the golden markdown ---------------------------------------------------------


@pytest.mark.parametrize("case", ["empty", "crashed", "gpu", "512"])
@pytest.mark.parametrize("fmt", RENDERERS)
def test_deterministic(fmt: str, case: str, analyses: dict[str, Analysis]) -> None:
    a = analyses[case]
    again = from_dict(json.loads(a.to_json()))  # through JSON, as `pardiag report` reads it
    assert RENDERERS[fmt](a) == RENDERERS[fmt](a) == RENDERERS[fmt](again)


def test_markdown_golden() -> None:
    out = render_markdown(small())
    if os.environ.get("PARDIAG_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(out, encoding="utf-8")
    assert out == GOLDEN.read_text(encoding="utf-8")


def test_html_is_offline_and_self_contained(analyses: dict[str, Analysis]) -> None:
    html = render_html(analyses["gpu"])
    for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", html):
        assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", tag), tag
    assert html.count("<script>") == 3 + len(figures(analyses["gpu"]))  # plotly.js once, error hook, page script
    assert html.count("Plotly.newPlot(") == len(figures(analyses["gpu"]))
    for fig_id in figures(analyses["gpu"]):
        assert html.count(f'id="{fig_id}"') == 1


def test_findings_are_cards_with_copyable_code(analyses: dict[str, Analysis]) -> None:
    html = render_html(analyses["cpu"])
    assert '<button class="copy" type="button" data-target="finding-0-code">copy</button>' in html
    assert '<pre><code id="finding-0-code">model = DDP(model, bucket_cap_mb=100)</code></pre>' in html
    assert 'href="https://pytorch.org/docs/stable/ddp.html"' in html
    assert "est. 8% faster steps" in html


def test_free_form_blocks_render_their_key_facts() -> None:
    facts = {f["key"]: f for f in generic_facts({
        "hang": {"never_arrived": [3, 4, 5, 9], "kind": "collective_stuck", "first_error": None,
                 "collect_next": ["rerun with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and read the dumps", "py-spy dump --native"]},
        "warnings": [], "init_s_max": 55.17, "pids": [7, 3], "slow_us": 2500.0,
        "procs": [{"host": "a", "ranks": [0, 1, 2]}, {"host": "b", "ranks": [3]}],
    })}
    assert facts["hang.never_arrived"]["text"] == "3-5,9"
    assert facts["pids"]["text"] == "7, 3"  # not increasing: not ranges
    assert facts["hang.kind"]["text"] == "collective_stuck" and facts["init_s_max"]["text"] == "55.17"
    assert facts["slow_us"]["text"] == "2.50 ms"
    assert facts["hang.collect_next"]["lines"][1] == "py-spy dump --native"
    assert facts["procs"]["table"] == {"columns": ["host", "ranks"], "rows": [["a", "0-2"], ["b", "3"]], "more": 0}
    assert "warnings" not in facts and "hang.first_error" not in facts


def test_finding_assumption_and_unsafe_doc_link() -> None:
    f = Finding(lever="comm_overlap", severity="high", title="t", evidence=["e"], ranks=[0], est_saving_pct=7.0,
                action={"assumption": "half of the exposed communication hidden", "doc": "javascript:alert(1)"})
    html = render_html(Analysis(run=run_info(1), ranks=[rank_result(0)], collectives=[], stragglers=[], findings=[f]))
    assert "Estimate assumes half of the exposed communication hidden." in html
    assert "javascript:alert" not in html


def _figure_json(html: str, div_id: str) -> str:
    m = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*(\[.*?\]),\s*\{', html, re.S)
    assert m, div_id
    return m.group(1)


# -- the command ----------------------------------------------------------------------------------


def _analysis_file(tmp_path: Path, a: Analysis) -> Path:
    p = tmp_path / "analysis.json"
    p.write_text(a.to_json() + "\n")
    return p


def test_report_command_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    src = _analysis_file(tmp_path, small())
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(src), "--format", "md"]) == 0
    assert capsys.readouterr().out == render_markdown(small())
    assert cli.main(["report", str(src), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(small().to_json())
    assert cli.main(["report", str(src)]) == 0  # not a run directory: ./report.html
    assert (tmp_path / "report.html").read_text() == render_html(small())
    assert "report.html" in capsys.readouterr().out
    out = tmp_path / "sub" / "r.md"
    assert cli.main(["report", str(src), "--format", "md", "-o", str(out)]) == 0
    assert out.read_text() == render_markdown(small())
    assert str(out) in capsys.readouterr().out


def test_report_of_a_run_directory_goes_into_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    os.utime(run / "manifest.json", (1_000_000, 1_000_000))
    _analysis_file(run, crashed())  # a fresh cache: the report reads it instead of analysing again
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report.html").read_text() == render_html(crashed())
    assert not (tmp_path / "report.html").exists()


def test_report_of_plain_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    traces = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    if not traces.is_dir():
        pytest.skip(f"fixture traces not found: {traces}")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(traces), "-j", "1"]) == 0
    html = (tmp_path / "report.html").read_text()
    assert 'id="fig-gpu"' in html and "all_to_all" in html
    # the ranks' steps on one timeline: a chart of one step, and the command that exports them all
    assert 'href="#timeline"' in html and f"pardiag export {traces} --perfetto -o job.json.gz" in html
    assert 'id="fig-step-timeline"' in html and "Step 551 of the profiled window on every rank" in html
    assert cli.main(["report", str(traces), "--format", "md", "-j", "1"]) == 0
    assert "all\\_to\\_all" in capsys.readouterr().out


def test_report_with_nccl_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    log = SHARED / "reference" / "nccl" / "logs" / "13-nccl1646-v2251-b200-init-timings-slow-kernels.log"
    if not traces.is_dir() or not log.is_file():
        pytest.skip("fixture traces or NCCL logs not found")
    out = tmp_path / "r.html"
    assert cli.main(["report", str(traces), "--nccl-log", str(log), "-j", "1", "-o", str(out)]) == 0
    html = out.read_text()
    assert 'id="nccl"' in html and "Communicator init" in html
    assert cli.main(["report", str(traces), "--nccl-log", str(tmp_path / "none.log")]) == 2
    assert "--nccl-log" in capsys.readouterr().err


def test_report_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "analysis.json"
    bad.write_text('{"schema": "pardiag.analysis", "schema_version": 99}')
    assert cli.main(["report", str(bad)]) == 2
    assert "newer" in capsys.readouterr().err
