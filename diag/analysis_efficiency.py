"""The Analysis' `efficiency` block: how much of the hardware's floating-point peak the
job used (MFU, HFU), computed by `pardiag.analyzers.efficiency`.

Keys are only added, never renamed. The block is None for an analysis without a trace
(or one written before it existed); it is present, with `reason` set and the ratios
None, when the traces say why MFU cannot be told (no input shapes, no peak for the
device). Its size is bounded: `ranks` holds at most `MAX_RANKS` entries (the ranks with
the lowest MFU when there are more; every rank's MFU is also in `ranks[].mfu`), `top_ops`
at most `MAX_TOP_OPS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

MAX_RANKS = 64
MAX_TOP_OPS = 8

EFFICIENCY_DEFINITIONS = {
    "model_flops_per_step": "floating-point operations of the model per training step: the forward and backward "
                            "matrix multiplies, convolutions and attention the profiler recorded with their input "
                            "shapes, counted by torch.utils.flop_counter's rules, over the profiled steps / their "
                            "number; the job's is the sum over ranks",
    "hardware_flops_per_step": "model FLOPs plus the forward passes recomputed inside backward (activation "
                               "checkpointing)",
    "mfu": "model FLOPs utilisation: model FLOPs per step / step time / peak. Per rank, its p50 step over all "
           "steps (steps.jsonl; else its profiled window per step) and its device's peak; for the job, the sum "
           "over ranks / the median step time (summary.step_p50_us) / the sum of the ranks' peaks",
    "hfu": "hardware FLOPs utilisation: as mfu with the recomputed forward passes counted",
    "peak_tflops": "the device's dense peak for the precisions the FLOPs ran in (no sparsity), blended by "
                   "the FLOPs in each: FLOPs / sum(FLOPs_p / peak_p). From the vendor's datasheet (source "
                   "'table'), else a square matrix multiply timed on the job's host after the job (source "
                   "'measured': a CPU, or a GPU the table does not list)",
    "samples_per_s": "per step, the elements of the first tensor each DDP forward got (steps.jsonl in_elems) / "
                     "the elements of one sample (that tensor's shape past its first dimension, meta.json "
                     "inputs.first); else the DataLoader's batch size x backward passes per step; / step time, "
                     "summed over ranks (data parallelism: every rank its own samples)",
    "tokens_per_s": "as samples_per_s when the first input is a 2-d integer tensor [batch, tokens]: its elements",
}


@dataclass(frozen=True)
class Peak:
    """The peak MFU is measured against, per rank (device)."""

    tflops: dict[str, float]  # precision -> dense TFLOP/s
    source: str  # "table" (a datasheet) or "measured" (a square GEMM after the job)
    device: str | None  # the device's name as recorded
    row: str | None  # the table's row ("H100 SXM"), or what was timed
    reference: str  # the datasheet, or the measurement in words


@dataclass(frozen=True)
class RankEfficiency:
    rank: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    step_us: float | None
    model_tflops: float | None  # achieved, model FLOPs / step time
    hardware_tflops: float | None
    peak_tflops: float | None  # blended over the rank's precisions
    mfu: float | None
    hfu: float | None
    samples_per_step: float | None = None
    tokens_per_step: float | None = None


@dataclass(frozen=True)
class Efficiency:
    mfu: float | None
    hfu: float | None
    model_tflops: float | None  # the job's: sum over ranks / job step
    hardware_tflops: float | None
    peak_tflops: float | None  # the job's: sum of the ranks' peaks
    model_flops_per_step: float
    hardware_flops_per_step: float
    forward_flops_per_step: float
    backward_flops_per_step: float
    recompute_flops_per_step: float
    step_us: float | None
    step_source: str  # "all steps" (steps.jsonl) or "profiled window"
    precision_share: dict[str, float]  # model FLOPs by precision (resolved: fp32, tf32, bf16, ...)
    kind_share: dict[str, float]  # model FLOPs by kind: matmul, conv, attention
    peak: Peak | None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    throughput_source: str | None = None
    ranks: list[RankEfficiency] = field(default_factory=list)
    ranks_total: int = 0  # ranks analysed
    ranks_counted: int = 0  # ranks whose FLOPs were counted
    top_ops: list[dict[str, Any]] = field(default_factory=list)  # the lowest counted rank's: op, dims, phase, calls, flops_per_step
    reason: str | None = None  # why mfu is None
    notes: list[str] = field(default_factory=list)
    definitions: dict[str, str] = field(default_factory=lambda: dict(EFFICIENCY_DEFINITIONS))


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def efficiency_from_dict(d: Mapping[str, Any] | None) -> Efficiency | None:
    """The block as analysis.json holds it; None when absent (an older analysis)."""
    if not isinstance(d, Mapping) or not d:
        return None
    e = _known(Efficiency, d)
    e["peak"] = Peak(**_known(Peak, d["peak"])) if isinstance(d.get("peak"), Mapping) else None
    e["ranks"] = [RankEfficiency(**_known(RankEfficiency, r)) for r in d.get("ranks") or () if isinstance(r, Mapping)]
    e["top_ops"] = [dict(o) for o in d.get("top_ops") or () if isinstance(o, Mapping)]
    e["notes"] = [str(n) for n in d.get("notes") or ()]
    e["definitions"] = dict(EFFICIENCY_DEFINITIONS)  # this pardiag's words for the same figures
    return Efficiency(**e)


# -- the figures in words: the same for the renderers and the findings' evidence ---------------------


def flops_text(v: float | None) -> str:
    """FLOPs with an SI prefix, three digits: '5.3 GFLOP', '1.65 TFLOP'."""
    if v is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}FLOP"
    return f"{v:.3g} FLOP"


def rate_text(tflops: float | None) -> str:
    """A rate given in TFLOP/s, with the prefix that reads best: '27.4 GFLOP/s', '312 TFLOP/s'."""
    if tflops is None:
        return "-"
    return flops_text(tflops * 1e12) + "/s"


def ratio_text(r: float | None) -> str:
    """MFU as a percentage, one decimal under 10%: '36%', '0.9%'."""
    if r is None:
        return "-"
    return f"{r:.1%}" if r < 0.1 else f"{r:.0%}"


def precision_words(e: Efficiency) -> str:
    """'bf16 97%, fp32 3%' (model FLOPs by precision)."""
    parts = sorted(e.precision_share.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.0%}" for k, v in parts) or "unknown precision"
