"""The efficiency block in every output: the same MFU words in the terminal summary,
the markdown, the HTML and the TUI overview's line; its JSON round trip; `diff`'s rows;
an analysis without the block shows nothing new."""

from __future__ import annotations

import json
from dataclasses import replace

from factories import small
from pardiag.analysis import Analysis, from_dict
from pardiag.analysis_efficiency import Efficiency, Peak, RankEfficiency
from pardiag.display_efficiency import efficiency_lines, efficiency_words, rate_text, ratio_text
from pardiag.render_text import summary_text
from pardiag.report_html import render_html
from pardiag.report_md import render_markdown

PEAK = Peak(tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, source="table",
            device="NVIDIA A100-SXM4-80GB", row="A100", reference="NVIDIA A100 Tensor Core GPU datasheet")


def with_efficiency(recompute: float = 0.0, peak: Peak | None = PEAK, mfu: float | None = 0.42) -> Analysis:
    model = 0.42 * 312e12 * 0.2  # per rank: 42% of an A100's bf16 peak over a 200 ms step
    ranks = [RankEfficiency(rank=r, model_flops_per_step=model, hardware_flops_per_step=model + recompute,
                            step_us=200_000.0, model_tflops=131.04, hardware_tflops=131.04 + recompute / 0.2e12,
                            peak_tflops=312.0, mfu=mfu, hfu=mfu and (model + recompute) / model * mfu,
                            samples_per_step=32.0, tokens_per_step=32 * 2048.0) for r in (0, 1)]
    e = Efficiency(mfu=mfu, hfu=mfu and (model + recompute) / model * mfu, model_tflops=262.08,
                   hardware_tflops=262.08 + 2 * recompute / 0.2e12, peak_tflops=624.0 if mfu else None,
                   model_flops_per_step=2 * model, hardware_flops_per_step=2 * (model + recompute),
                   forward_flops_per_step=2 * model / 3, backward_flops_per_step=4 * model / 3,
                   recompute_flops_per_step=2 * recompute, step_us=200_000.0, step_source="all steps",
                   precision_share={"bf16": 0.97, "fp32": 0.03}, kind_share={"matmul": 1.0}, peak=peak,
                   samples_per_s=320.0, tokens_per_s=655_360.0,
                   throughput_source="the first input of each DDP forward (32x2048 int64)", ranks=ranks,
                   ranks_total=2, ranks_counted=2, reason=None if mfu else "no peak for this GPU")
    a = small()
    return replace(a, efficiency=e, ranks=[replace(r, mfu=mfu) for r in a.ranks],
                   summary=replace(a.job_summary, mfu=e.mfu, hfu=e.hfu))


def test_one_line_for_every_output() -> None:
    a = with_efficiency()
    words = efficiency_words(a)
    assert words == ("MFU 42% · 262 TFLOP/s of 624 TFLOP/s (bf16 97%, fp32 3%, datasheet peak) · "
                     "320 samples/s, 655,360 tokens/s")
    assert f"efficiency: {words}" in summary_text(a, width=400)
    assert f"- **Efficiency:** {words}" in render_markdown(a)
    html = render_html(a)
    assert words in html and 'id="kpi-mfu"' in html and 'href="#efficiency"' in html


def test_the_detail_names_the_peak_and_its_source() -> None:
    lines = efficiency_lines(with_efficiency())
    assert lines[0].startswith("model FLOPs per step: 52.4 TFLOP over 2 ranks (forward 17.5 TFLOP · backward 34.9 TFLOP)")
    assert ("peak 312 TFLOP/s per rank: NVIDIA A100-SXM4-80GB is the table's A100 (NVIDIA A100 Tensor Core GPU "
            "datasheet; dense, no sparsity)") in lines
    md = render_markdown(with_efficiency())
    assert "### Efficiency (MFU)" in md and "| 0 | 26.2 TFLOP | 131 TFLOP/s | 42% | 42% |" in md


def test_hfu_shows_only_with_recomputation() -> None:
    a = with_efficiency(recompute=0.25 * 0.42 * 312e12 * 0.2)
    words = efficiency_words(a)
    assert words is not None and words.startswith("MFU 42% · HFU 52%")
    assert any(line.startswith("hardware FLOPs per step:") for line in efficiency_lines(a))
    assert "HFU" not in (efficiency_words(with_efficiency()) or "").split("·")[1]


def test_mfu_not_known_says_why() -> None:
    a = with_efficiency(peak=None, mfu=None)
    assert efficiency_words(a) == "MFU not known: no peak for this GPU; model 262 TFLOP/s achieved"
    assert "not known" in render_html(a)


def test_no_flops_counted_is_not_a_rate_of_zero() -> None:
    """A trace recorded without shapes counts no FLOPs: the line says why, and no '0 FLOP/s'."""
    a = with_efficiency(peak=None, mfu=None)
    e = replace(a.efficiency, model_flops_per_step=0, model_tflops=0.0, ranks=[], ranks_counted=0,
                reason="the profiler recorded no input shapes")
    assert efficiency_words(replace(a, efficiency=e)) == "MFU not known: the profiler recorded no input shapes"


def test_the_block_reads_back_from_json() -> None:
    a = with_efficiency(recompute=1e12)
    back = from_dict(json.loads(a.to_json()))
    assert back.efficiency == a.efficiency
    assert back.job_summary.mfu == a.job_summary.mfu and [r.mfu for r in back.ranks] == [0.42, 0.42]
    assert render_markdown(back) == render_markdown(a)


def test_without_the_block_nothing_changes() -> None:
    a = small()
    assert a.efficiency is None and efficiency_words(a) is None and efficiency_lines(a) == []
    assert "Efficiency" not in render_markdown(a) and "efficiency:" not in summary_text(a)
    assert "kpi-mfu" not in render_html(a)


def test_numbers_read_at_their_scale() -> None:
    assert rate_text(0.0274) == "27.4 GFLOP/s" and rate_text(989.5) == "990 TFLOP/s" and rate_text(None) == "-"
    assert ratio_text(0.3605) == "36%" and ratio_text(0.0123) == "1.2%" and ratio_text(None) == "-"


def test_diff_compares_mfu_and_flops() -> None:
    from pardiag.analyzers.diff import RunInput, diff_runs
    from pardiag.report_diff import render_markdown as diff_markdown

    base, head = with_efficiency(), with_efficiency(mfu=0.30)
    head = replace(head, efficiency=replace(head.efficiency, model_flops_per_step=2 * 0.42 * 312e12 * 0.2 * 1.5))
    d = diff_runs(RunInput("base", base, None), RunInput("head", head, None))
    assert d.efficiency is not None and (d.efficiency.base_mfu, d.efficiency.head_mfu) == (0.42, 0.30)
    md = diff_markdown(d)
    assert "| MFU | 42% | 30% | -12.0 pt |" in md and "| model FLOPs per step | 52.4 TFLOP | 78.6 TFLOP | +50.0% |" in md
    assert any("FLOPs per step changed +50.0%" in n for n in d.notes)
    plain = diff_runs(RunInput("base", small(), None), RunInput("head", small(), None))
    assert plain.efficiency is None and "Efficiency" not in diff_markdown(plain)


def test_scaling_gives_each_runs_mfu() -> None:
    from pardiag.analyzers.scaling import scaling

    two = with_efficiency()
    four = replace(with_efficiency(mfu=0.35), run=replace(two.run, world_size=4))
    result = scaling([("n2", two), ("n4", four)])
    assert [(p.world_size, p.mfu) for p in result.points] == [(2, 0.42), (4, 0.35)]
