"""The efficiency block (MFU, HFU, achieved TFLOP/s, the peak and where it comes from,
throughput) worded once for every renderer: the terminal summary, markdown, HTML,
`diff` and `scaling` take their lines and cells from here, so they agree. Reads only the
Analysis.
"""

from __future__ import annotations

from pardiag.analysis import Analysis
from pardiag.analysis_efficiency import (  # noqa: F401  (the numbers' words, used by every renderer)
    Efficiency,
    RankEfficiency,
    flops_text,
    precision_words,
    rate_text,
    ratio_text,
)

PHASE_WORDS = (("forward", "forward_flops_per_step"), ("backward", "backward_flops_per_step"),
               ("recomputed", "recompute_flops_per_step"))
MAX_NOTES = 4


def peak_words(e: Efficiency) -> str:
    """'peak 989 TFLOP/s per rank: NVIDIA H100 80GB HBM3 is the table's H100 SXM (NVIDIA H100
    ... datasheet)', or 'peak 38 GFLOP/s per rank, measured: a square matrix multiply ...'."""
    p = e.peak
    if p is None:
        return "no peak"
    first = next((x.peak_tflops for x in e.ranks if x.peak_tflops), None)
    per = f"peak {rate_text(first)} per rank" if first else "peak"
    if p.source == "table":
        return f"{per}: {p.device or 'the device'} is the table's {p.row} ({p.reference}; dense, no sparsity)"
    return f"{per}, {p.reference}"


def throughput_words(e: Efficiency) -> str | None:
    """'165 samples/s, 10,577 tokens/s'; None when the batch shape was not told."""
    parts = []
    if e.samples_per_s is not None:
        parts.append(f"{e.samples_per_s:,.0f} samples/s" if e.samples_per_s >= 100 else f"{e.samples_per_s:.3g} samples/s")
    if e.tokens_per_s is not None:
        parts.append(f"{e.tokens_per_s:,.0f} tokens/s")
    return ", ".join(parts) or None


def efficiency_words(a: Analysis) -> str | None:
    """The one line every output shows: 'MFU 36% · HFU 36% · 27.4 GFLOP/s of 75.9 GFLOP/s
    (fp32 100%, measured peak) · 165 samples/s, 10,577 tokens/s'; why MFU is not known
    when it is not; None without the block."""
    e = a.efficiency
    if e is None:
        return None
    if e.mfu is None:
        # no FLOPs counted is not a rate of 0: say only why
        counted = e.model_tflops is not None and e.model_flops_per_step > 0
        achieved = f"; model {rate_text(e.model_tflops)} achieved" if counted else ""
        return f"MFU not known: {e.reason or 'no peak'}{achieved}"
    hfu = f" · HFU {ratio_text(e.hfu)}" if e.hfu is not None and e.recompute_flops_per_step > 0 else ""
    kind = "datasheet" if e.peak is not None and e.peak.source == "table" else "measured"
    text = (f"MFU {ratio_text(e.mfu)}{hfu} · {rate_text(e.model_tflops)} of {rate_text(e.peak_tflops)} "
            f"({precision_words(e)}, {kind} peak)")
    if (tp := throughput_words(e)) is not None:
        text += f" · {tp}"
    return text


def efficiency_lines(a: Analysis) -> list[str]:
    """The detail under the line: FLOPs per step and their split, the peak and its
    source, what the throughput was read from, the notes; [] without the block."""
    e = a.efficiency
    if e is None or not e.ranks_counted:
        return []
    split = " · ".join(f"{w} {flops_text(getattr(e, k))}" for w, k in PHASE_WORDS if getattr(e, k) > 0)
    over = f"{e.ranks_counted} rank{'s' if e.ranks_counted != 1 else ''}"
    out = [f"model FLOPs per step: {flops_text(e.model_flops_per_step)} over {over} ({split}); "
           f"step {e.step_us / 1000:.1f} ms ({e.step_source})" if e.step_us else
           f"model FLOPs per step: {flops_text(e.model_flops_per_step)} over {over} ({split})"]
    if e.recompute_flops_per_step > 0:
        out.append(f"hardware FLOPs per step: {flops_text(e.hardware_flops_per_step)} (the recomputed forward "
                   f"passes of activation checkpointing included): HFU {ratio_text(e.hfu)} against MFU "
                   f"{ratio_text(e.mfu)}")
    if e.peak is not None:
        out.append(peak_words(e))
    if e.throughput_source:
        out.append(f"throughput from {e.throughput_source}")
    out += e.notes[:MAX_NOTES]
    return out


def rank_efficiency_cells(x: RankEfficiency) -> list[str]:
    """rank, model FLOPs per step, achieved, MFU, HFU."""
    return [str(x.rank), flops_text(x.model_flops_per_step), rate_text(x.model_tflops), ratio_text(x.mfu),
            ratio_text(x.hfu)]


RANK_EFFICIENCY_HEADER = ("rank", "model FLOPs/step", "achieved", "MFU", "HFU")
