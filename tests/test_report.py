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
from pardiag.analysis import (
    Analysis,
    Collective,
    Finding,
    GpuTime,
    Notice,
    ProcessGroup,
    RankResult,
    StepTime,
    Straggler,
    from_dict,
)
from pardiag.report_html import BAR_RANKS, figures, generic_facts, render_html
from pardiag.report_md import md_code_block, md_text, render_markdown

GOLDEN = Path(__file__).resolve().parent / "golden" / "report_small.md"
EVIL = "</script><img src=x onerror=alert(1)>"
MD_LIMIT = 60_000
HTML_LIMIT = 8 * 1024 * 1024

RENDERERS: dict[str, Callable[[Analysis], str]] = {"html": render_html, "md": render_markdown}


# -- Analyses built from the dataclasses --------------------------------------------------------


def rank_result(rank: int, *, host: str = "node0", step_ms: float | None = 200.0, window_ms: float = 600.0,
                steps: int = 3, comm: float = 0.1, gpu: bool = False, device: str = "cpu") -> RankResult:
    w = window_ms * 1000
    shares = {"compute": 0.7 - comm, "comm_exposed": comm, "comm_overlapped": 0.05, "memcpy": 0.02 if gpu else 0.0,
              "dataloader": 0.03, "idle": 0.0}
    shares["idle"] = 1.0 - sum(shares.values())
    phases = {"dataloader": 0.03 * w, "forward": 0.3 * w, "backward": 0.5 * w, "optimizer": 0.1 * w, "other": 0.07 * w}
    st = StepTime(p50=None, mean=None, max=None, n=0)
    if step_ms is not None:
        st = StepTime(p50=step_ms * 1000, mean=step_ms * 1010, max=step_ms * 1500, n=20, p90=step_ms * 1100,
                      steps_total=25, disturbed=1)
    g = GpuTime(span_us=0.9 * w, compute_us=0.5 * w, comm_us=0.3 * w, overlap_us=0.1 * w, memory_us=0.02 * w,
                idle_us=0.15 * w, kernel_us=0.75 * w) if gpu else None
    return RankResult(rank=rank, host=host, steps_profiled=steps, window_us=w,
                      breakdown_us={k: v * w for k, v in shares.items()}, phases_us=phases, step_time_us=st,
                      gpu=g, trace="trace.json.gz", trace_complete=True, device_type=device,
                      wait_us=comm * w * 0.5 * (rank % 3), phases_per_step_us={k: v / steps for k, v in phases.items()})


def crashed_rank(rank: int, host: str = "node0") -> RankResult:
    zero_b = dict.fromkeys(("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle"), 0.0)
    zero_p = dict.fromkeys(("dataloader", "forward", "backward", "optimizer", "other"), 0.0)
    return RankResult(rank=rank, host=host, steps_profiled=0, window_us=0.0, breakdown_us=zero_b, phases_us=zero_p,
                      step_time_us=StepTime(p50=None, mean=None, max=None, n=0), trace=None, trace_complete=False)


def collective(op: str = "all_reduce", group: str = "0:default_pg", size: int = 2, calls: int = 3) -> Collective:
    return Collective(op=op, process_group=group, calls=calls, bytes=6_408_312, total_us=69_885.0,
                      transfer_us=23_350.0, wait_us=46_535.0, algbw_gbps=0.27, busbw_gbps=0.27,
                      group_size=size, ranks_matched=size, wait_by_rank_us={"0": 0.0, "1": 93_070.0})


def run_info(world: int, *, hosts: list[str] | None = None, backend: str = "gloo", device: str = "cpu",
             command: list[str] | None = None) -> dict[str, object]:
    return {
        "path": "runs/exp1", "world_size": world, "ranks_analyzed": world, "backend": backend,
        "device_type": device, "command": command or ["torchrun", "--nproc-per-node", str(world), "train.py"],
        "launcher": "torchrun", "hosts": hosts if hosts is not None else ["node0"], "exit_code": 0,
        "versions": {"python": "3.11.7", "torch": "2.13.0", "cuda": None},
        "profiler": {"enabled": True, "record_shapes": True, "schedule": {"wait": 5, "warmup": 2, "active": 3}},
    }


FINDING = Finding(lever="ddp_bucket_size", severity="medium", title="DDP buckets are too small for this model",
                  evidence=["47 buckets of 25 MB for 1.2 GB of gradients", "all_reduce: 61% of its time waiting"],
                  ranks=[0, 1], est_saving_pct=7.5,
                  action={"code": "model = DDP(model, bucket_cap_mb=100)", "doc": "https://pytorch.org/docs/stable/ddp.html"})


def empty_run() -> Analysis:
    return Analysis(run={}, ranks=[], collectives=[], stragglers=[],
                    notices=[Notice("warning", "no usable manifest (missing); the run may still be going or was killed")])


def single_rank() -> Analysis:
    return Analysis(run=run_info(1), ranks=[rank_result(0, comm=0.0)], collectives=[], stragglers=[])


def crashed() -> Analysis:
    ranks = [rank_result(r) for r in range(3)] + [crashed_rank(3)]
    return Analysis(run=run_info(4), ranks=ranks, collectives=[collective(size=4)], stragglers=[],
                    notices=[Notice("warning", "rank 3: no profiler trace (the process exited before the window)"),
                             Notice("error", "rank 3 failed at step 7: RuntimeError: CUDA error: an illegal memory access")])


def small() -> Analysis:
    """Two CPU ranks on one host, a straggler, a finding: the golden markdown."""
    return Analysis(
        run=run_info(2, hosts=["node0"]),
        ranks=[rank_result(0, comm=0.3), rank_result(1, step_ms=230.0, comm=0.1)],
        collectives=[collective()],
        stragglers=[Straggler(rank=1, excess_us_per_step=83_050.0, cause="forward",
                              evidence=["the other ranks wait 71.8 ms per step more than rank 1",
                                        "forward: +78.4 ms per step vs the median of the other ranks"])],
        process_groups=[ProcessGroup(name="0", desc="default_pg", role="data-parallel", size=2, ranks=[0, 1],
                                     ops={"all_reduce": 3}, total_us=69_885.0, wait_us=46_535.0)],
        findings=[FINDING],
        notices=[Notice("info", "rank 0: 2 steps outside the profiled window were disturbed")],
    )


def gpu_run(n: int = 8) -> Analysis:
    return Analysis(
        run=run_info(n, hosts=["gpu-a", "gpu-b"], backend="nccl", device="cuda"),
        ranks=[rank_result(r, host=("gpu-a", "gpu-b")[r // 4 % 2], gpu=True, device="cuda", comm=0.05 + 0.02 * r)
               for r in range(n)],
        collectives=[collective(size=n), collective("_allgather_base", "1:tp", size=4, calls=12)],
        stragglers=[],
        findings=[FINDING, Finding(lever="nccl_env", severity="high", title="NCCL_P2P_DISABLE=1 forces copies through the host",
                                   evidence=["gpu-a:4242 NCCL INFO NCCL_P2P_DISABLE set by environment to 1"], ranks=list(range(n)),
                                   est_saving_pct=None, action={"env": {"NCCL_P2P_DISABLE": None, "NCCL_IB_HCA": "mlx5"}})],
        nccl={"version": "2.21.5", "hosts": ["gpu-a", "gpu-b"], "init_s": 3.2, "channels": 16,
              "processes": [{"host": "gpu-a", "pid": 4242, "ranks": [0, 1, 2, 3], "network": "IB"}]},
        telemetry={"samples": 1200, "sm_util": {"p50": 0.81, "min": 0.42}, "throttle": ["HW_SLOWDOWN"]},
    )


def big(n: int = 512) -> Analysis:
    hosts = [f"node{h:03d}.cluster.example.org" for h in range(n // 8)]
    ranks = [rank_result(r, host=hosts[r // 8], gpu=True, device="cuda", step_ms=200.0 + (r % 17), comm=0.05 + (r % 7) / 100)
             for r in range(n)]
    groups = [ProcessGroup(name=str(g), desc=f"tp{g}", role="tensor-parallel", size=8, ranks=list(range(8 * g, 8 * g + 8)),
                           ops={"all_reduce": 40}, total_us=1e5, wait_us=2e4) for g in range(n // 8)]
    evidence = [f"rank {r} waits least in {50 + r % 50}% of all steps" for r in range(40)]
    return Analysis(
        run=run_info(n, hosts=hosts, backend="nccl", device="cuda"),
        ranks=ranks,
        collectives=[collective(op, f"{g}:tp{g}", size=8) for g in range(n // 8) for op in ("all_reduce", "all_gather")],
        stragglers=[Straggler(rank=r, excess_us_per_step=5e3 * (r % 5 + 1), cause="dataloader", evidence=evidence)
                    for r in range(0, n, 16)],
        process_groups=groups,
        findings=[FINDING] * 40,
        notices=[Notice("warning", f"rank {r}: trace has {r} dropped events " + "x" * 300) for r in range(300)],
        nccl={"processes": [{"host": h, "pid": i, "ranks": list(range(8 * i, 8 * i + 8))} for i, h in enumerate(hosts)]},
    )


def hostile() -> Analysis:
    """Untrusted text everywhere a trace, a log or a command line can put it."""
    a = small()
    r0 = rank_result(0, host=EVIL)
    return Analysis(
        run={**a.run, "command": ["python", EVIL, "--name", "a|b`c`"], "hosts": [EVIL], "backend": EVIL, "path": EVIL,
             "versions": {"torch": EVIL}},
        ranks=[r0, *a.ranks[1:]],
        collectives=[collective(op=EVIL, group=EVIL)],
        stragglers=[Straggler(rank=1, excess_us_per_step=1e4, cause=EVIL, evidence=[EVIL])],
        process_groups=[ProcessGroup(name=EVIL, desc=EVIL, role="data-parallel", size=2, ranks=[0, 1],
                                     ops={EVIL: 1}, total_us=1.0, wait_us=0.0)],
        findings=[Finding(lever="nccl_env", severity="high", title=EVIL, evidence=[EVIL], ranks=[0],
                          est_saving_pct=None, action={"code": EVIL, "env": {"NCCL_X": EVIL}, "doc": "javascript:alert(1)"})],
        notices=[Notice("error", EVIL)],
        nccl={EVIL: EVIL, "procs": [{EVIL: EVIL}]},
        telemetry={"gpu": EVIL},
    )


CASES: dict[str, Callable[[], Analysis]] = {
    "empty": empty_run, "single": single_rank, "crashed": crashed, "cpu": small, "gpu": gpu_run, "512": big,
}


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
