"""Model and hardware FLOPs utilisation (MFU, HFU), achieved TFLOP/s and throughput,
per rank and for the job: the Analysis' `efficiency` block.

- FLOPs per step: each rank's profiled window (`pardiag.analyzers.flops`) over its
  profiled steps. Model FLOPs are forward + backward; hardware FLOPs add the forward
  passes recomputed inside backward.
- Time per step: the rank's p50 step over all its undisturbed steps (steps.jsonl), so
  that the profiler's own slowdown of the window does not lower MFU; without step
  records, its profiled window per step. The job's: `summary.step_p50_us`.
- Peak: the device's row in `pardiag.analyzers.peaks` (vendor datasheets, dense) for the
  precisions the FLOPs ran in; else, on a CPU or a GPU the table lacks, the square GEMM
  timed after the job (factors/gemm.json ``peak``). Float32 work is TF32 on a GPU that
  has it when its kernels' names say so, else when the job allowed it
  (``torch.backends.cuda.matmul.allow_tf32`` for matrix multiplies and attention,
  ``torch.backends.cudnn.allow_tf32`` for convolutions, from meta.json; torch's defaults,
  False and True, without one). Several precisions blend: FLOPs / sum(FLOPs_p / peak_p).
  Ranks on one device (several processes on one GPU) share its peak: the job counts
  each device once.
- Samples per step: the elements of the first tensor each DDP forward got (steps.jsonl
  ``in_elems``, median over the counted steps) over one sample's elements (its shape past
  the first dimension, meta.json ``inputs.first``); tokens when that tensor is 2-d
  integer. Without them, the DataLoader's batch size x backward passes per step.

Pure: plain inputs in, the typed block out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pardiag.analysis import RankResult
from pardiag.analysis_efficiency import (
    MAX_RANKS,
    MAX_TOP_OPS,
    Efficiency,
    Peak,
    RankEfficiency,
    precision_words,
    rate_text,
    ratio_text,
)
from pardiag.analyzers.factors import MeasuredPeak, Read
from pardiag.analyzers.flops import FlopCount
from pardiag.analyzers.peaks import peak_row
from pardiag.analyzers.steps import median
from pardiag.rank_meta import RankMeta
from pardiag.step_records import StepRecord, counted

INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "long", "int")


@dataclass(frozen=True)
class Inputs:
    ranks: Sequence[RankResult]
    flops: Mapping[int, FlopCount | None]  # ranks whose trace was read: their count, None without FLOP operators
    metas: Mapping[int, RankMeta] = field(default_factory=dict)
    step_records: Mapping[int, Sequence[StepRecord]] = field(default_factory=dict)
    job_step_us: float | None = None
    job_step_source: str = "none"
    device_name: str | None = None  # the run's (plain traces: their deviceProperties)
    measured: Read[MeasuredPeak] | None = None


@dataclass(frozen=True)
class _RankPeak:
    peak: Peak | None
    why_not: str | None
    tflops: dict[str, float]


def _device_name(r: RankResult, meta: RankMeta | None, run_name: str | None) -> str | None:
    if meta is not None and meta.device is not None and meta.device.name and meta.device.type == "cuda":
        return meta.device.name
    if r.device_type == "cuda" and run_name:
        return run_name.split(", ")[0]
    return None


def _rank_peak(r: RankResult, meta: RankMeta | None, inp: Inputs) -> _RankPeak:
    name = _device_name(r, meta, inp.device_name)
    row = peak_row(name)
    if row is not None:
        return _RankPeak(Peak(dict(row.tflops), "table", name, row.device, row.source), None, dict(row.tflops))
    m = inp.measured.value if inp.measured is not None else None
    device = r.device_type or "cpu"
    if m is not None and m.device == device:
        return _RankPeak(Peak(dict(m.tflops), "measured", m.device_name or name, f"square GEMM, {m.device}",
                              m.source), None, dict(m.tflops))
    why_measured = (inp.measured.reason if inp.measured is not None else None) or "no run directory"
    if device == "cuda" and not name:
        return _RankPeak(None, "the GPU is not named (a trace without deviceProperties, no meta.json), so no "
                               f"datasheet peak applies, and no GEMM was timed after the job ({why_measured})", {})
    if device == "cuda":
        return _RankPeak(None, f"{name} is not in pardiag's table of datasheet peaks, and no GEMM was timed after "
                               f"the job ({why_measured})", {})
    return _RankPeak(None, "a CPU's peak is measured after the job (a square GEMM, factors/gemm.json) and this "
                           f"run has none ({why_measured})", {})


def resolve_precision(p: str, device_type: str | None, peak: Mapping[str, float],
                      amp: Mapping[str, Any] | None) -> str:
    """A count's precision key as the peak table names it: ``float32:<kind>`` (no kernel
    said) becomes ``tf32`` where the device has TF32 and the job allowed it, else ``fp32``."""
    if not p.startswith("float32:"):
        return p
    if device_type != "cuda" or "tf32" not in peak:
        return "fp32"
    amp = amp or {}
    allowed = amp.get("cudnn_allow_tf32", True) if p.endswith(":conv") else amp.get("cuda_matmul_allow_tf32", False)
    return "tf32" if allowed else "fp32"


def blended_peak(flops: Mapping[str, float], peak: Mapping[str, float]) -> tuple[float | None, list[str]]:
    """(FLOPs / sum(FLOPs_p / peak_p) in TFLOP/s, the precisions without a peak)."""
    missing = [p for p, f in flops.items() if f > 0 and not peak.get(p)]
    total = sum(f for f in flops.values() if f > 0)
    if missing or total <= 0:
        return None, missing
    return total / sum(f / peak[p] for p, f in flops.items() if f > 0), []


def _resolved(by_prec: Mapping[str, float], device: str | None, peak: Mapping[str, float],
              amp: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for p, f in by_prec.items():
        k = resolve_precision(p, device, peak, amp)
        out[k] = out.get(k, 0.0) + f
    return out


def _step_us(r: RankResult) -> tuple[float | None, str]:
    if r.step_time_us.p50:
        return r.step_time_us.p50, "all steps"
    if r.steps_profiled and r.window_us > 0:
        return r.window_us / r.steps_profiled, "profiled window"
    return None, "none"


def _tflops(flops_per_step: float, step_us: float | None) -> float | None:
    return flops_per_step / step_us / 1e6 if step_us and step_us > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def throughput(meta: RankMeta | None, records: Sequence[StepRecord]) -> tuple[float | None, float | None, str | None]:
    """(samples per step, tokens per step, where from) of one rank."""
    first = ((meta.inputs or {}).get("first") if meta is not None else None) or {}
    shape = first.get("shape") if isinstance(first, Mapping) else None
    elems = [v for rec in records if counted(rec) and (v := rec.get("input_elements"))]
    if isinstance(shape, list) and shape and all(isinstance(x, int) and x > 0 for x in shape) and elems:
        per_step = median(elems) or 0.0
        per_sample = math.prod(shape[1:]) if len(shape) > 1 else 1
        tokens = per_step if len(shape) == 2 and str(first.get("dtype")) in INT_DTYPES else None
        what = f"the first input of each DDP forward ({'x'.join(map(str, shape))} {first.get('dtype')})"
        return per_step / per_sample, tokens, what
    batch = next((d.batch_sampler_batch_size or d.batch_size for d in (meta.dataloaders or ()) if
                  (d.batch_sampler_batch_size or d.batch_size)), None) if meta is not None else None
    if batch:
        bwd = median([v for rec in records if counted(rec) and (v := rec.get("backwards"))]) or 1.0
        return batch * bwd, None, f"the DataLoader's batch size ({batch}) x backward passes per step ({bwd:g})"
    return None, None, None


def _reason_no_flops(counts: Mapping[int, FlopCount | None]) -> str:
    no_shapes = sum(c.calls_without_shapes for c in counts.values() if c is not None)
    if no_shapes:
        return (f"the profiler recorded no input shapes for the {no_shapes} matrix multiply, convolution and "
                "attention calls of the window (pardiag run --no-shapes, or a trace recorded without "
                "record_shapes): their FLOPs cannot be counted")
    return ("no matrix multiply, convolution or attention operator with shapes in the profiled window (a model "
            "compiled into fused kernels records none)")


def _device_key(r: RankResult, meta: RankMeta | None) -> tuple[Any, ...]:
    """Ranks with one key share one device's peak: a GPU (host, uuid or index); every CPU
    rank has its own threads, measured as the job used them."""
    if r.device_type == "cuda" and meta is not None and meta.device is not None:
        d = meta.device
        return (meta.host, d.uuid or d.index)
    return ("rank", r.rank)


def analyze(inp: Inputs) -> Efficiency | None:
    """The efficiency block; None when no rank's trace was read."""
    if not inp.flops:
        return None
    counts = {r: c for r, c in inp.flops.items() if c is not None and c.model > 0}
    by_rank = {r.rank: r for r in inp.ranks}
    rows: list[RankEfficiency] = []
    notes: list[str] = []
    peaks: dict[int, _RankPeak] = {}
    prec_total: dict[str, float] = {}
    kind_total: dict[str, float] = {}
    device_peak: dict[tuple[Any, ...], tuple[float, float]] = {}
    for rank in sorted(counts):
        c, r, meta = counts[rank], by_rank.get(rank), inp.metas.get(rank)
        if r is None:
            continue
        rp = peaks[rank] = _rank_peak(r, meta, inp)
        amp = meta.amp if meta is not None else None
        model_p = _resolved(c.model_by_precision, r.device_type, rp.tflops, amp)
        hw_p = dict(model_p)
        for k, f in _resolved(c.recompute_by_precision, r.device_type, rp.tflops, amp).items():
            hw_p[k] = hw_p.get(k, 0.0) + f
        for k, f in model_p.items():
            prec_total[k] = prec_total.get(k, 0.0) + f / c.steps
        for k, f in c.by_kind.items():
            kind_total[k] = kind_total.get(k, 0.0) + f / c.steps
        peak_m, missing = blended_peak(model_p, rp.tflops)
        peak_h, _ = blended_peak(hw_p, rp.tflops)
        if missing and rp.peak is not None:
            notes.append(f"rank {rank}: no {rp.peak.source} peak for {', '.join(missing)} "
                         f"({rp.peak.row or rp.peak.device}); its MFU is not given")
        step, _src = _step_us(r)
        model_ps, hw_ps = c.model / c.steps, c.hardware / c.steps
        samples, tokens, _what = throughput(meta, inp.step_records.get(rank, ()))
        mt, ht = _tflops(model_ps, step), _tflops(hw_ps, step)
        rows.append(RankEfficiency(rank=rank, model_flops_per_step=model_ps, hardware_flops_per_step=hw_ps,
                                   step_us=step, model_tflops=mt, hardware_tflops=ht, peak_tflops=peak_m,
                                   mfu=_ratio(mt, peak_m), hfu=_ratio(ht, peak_h), samples_per_step=samples,
                                   tokens_per_step=tokens))
        if peak_m is not None and peak_h is not None:
            key = _device_key(r, meta)
            old = device_peak.get(key, (0.0, 0.0))
            device_peak[key] = (max(old[0], peak_m), max(old[1], peak_h))
    return _job(inp, counts, rows, peaks, prec_total, kind_total, device_peak, notes)


def _job(inp: Inputs, counts: Mapping[int, FlopCount], rows: list[RankEfficiency], peaks: Mapping[int, _RankPeak],
         prec_total: Mapping[str, float], kind_total: Mapping[str, float],
         device_peak: Mapping[tuple[Any, ...], tuple[float, float]], notes: list[str]) -> Efficiency:
    model = sum(x.model_flops_per_step for x in rows)
    hardware = sum(x.hardware_flops_per_step for x in rows)
    step = inp.job_step_us
    source = inp.job_step_source
    if not step:
        step = median([x.step_us for x in rows if x.step_us])
        source = "median of the ranks' steps"
    mt, ht = _tflops(model, step), _tflops(hardware, step)
    complete = bool(rows) and all(x.peak_tflops is not None for x in rows)
    peak_m = sum(p for p, _ in device_peak.values()) if complete else None
    peak_h = sum(p for _, p in device_peak.values()) if complete else None
    if len(device_peak) < len(rows) and complete:
        notes.append(f"{len(rows)} ranks ran on {len(device_peak)} device(s): ranks that share a device share "
                     "its peak (each rank's MFU is against the whole device)")
    first_peak = next((peaks[x.rank] for x in rows if x.rank in peaks), None)
    reason = None
    if not rows:
        reason = _reason_no_flops(inp.flops)
    elif not complete:
        reason = next((p.why_not for p in peaks.values() if p.why_not), None) or "no peak for the FLOPs' precisions"
    _coverage_notes(inp, counts, rows, notes)
    total_p = sum(prec_total.values())
    total_k = sum(kind_total.values())
    samples = [x.samples_per_step for x in rows if x.samples_per_step is not None]
    tokens = [x.tokens_per_step for x in rows if x.tokens_per_step is not None]
    lowest = min(counts) if counts else None
    _s, _t, what = throughput(inp.metas.get(lowest) if lowest is not None else None,
                              inp.step_records.get(lowest, ()) if lowest is not None else ())
    def split(attr: str) -> float:
        return float(sum(getattr(c, attr) / c.steps for c in counts.values()))
    return Efficiency(
        mfu=_ratio(mt, peak_m), hfu=_ratio(ht, peak_h), model_tflops=mt, hardware_tflops=ht, peak_tflops=peak_m,
        model_flops_per_step=model, hardware_flops_per_step=hardware, forward_flops_per_step=split("forward"),
        backward_flops_per_step=split("backward"), recompute_flops_per_step=split("recompute"),
        step_us=step, step_source=source,
        precision_share={k: v / total_p for k, v in sorted(prec_total.items())} if total_p else {},
        kind_share={k: v / total_k for k, v in sorted(kind_total.items())} if total_k else {},
        peak=first_peak.peak if first_peak is not None else None,
        samples_per_s=sum(samples) / step * 1e6 if samples and step and len(samples) == len(rows) else None,
        tokens_per_s=sum(tokens) / step * 1e6 if tokens and step and len(tokens) == len(rows) else None,
        throughput_source=what if samples and len(samples) == len(rows) else None,
        ranks=_bounded(rows), ranks_total=len(inp.ranks), ranks_counted=len(rows),
        top_ops=_top_ops(counts.get(lowest)) if lowest is not None else [],
        reason=reason, notes=notes)


def _coverage_notes(inp: Inputs, counts: Mapping[int, FlopCount], rows: Sequence[RankEfficiency],
                    notes: list[str]) -> None:
    if rows and len(rows) < len(inp.ranks):
        notes.append(f"FLOPs counted on {len(rows)} of {len(inp.ranks)} ranks (the others left no trace or no "
                     "shapes): the job's figures are over those ranks")
    no_shapes = sum(c.calls_without_shapes for c in counts.values())
    if no_shapes:
        notes.append(f"{no_shapes} calls recorded without input shapes were not counted")
    unreadable: dict[str, int] = {}
    for c in counts.values():
        for k, v in c.calls_unreadable.items():
            unreadable[k] = unreadable.get(k, 0) + v
    if unreadable:
        notes.append("not counted, their shapes give no FLOPs: " + ", ".join(f"{k} x{v}" for k, v in
                                                                              sorted(unreadable.items())))
    aborted = sum(c.recompute_aborted for c in counts.values())
    if aborted:
        notes.append(f"{aborted} recomputed calls did no work (checkpointing stops its recomputation inside the "
                     "operator that saves the last tensor it needs) and were left out of the hardware FLOPs")


def _bounded(rows: list[RankEfficiency]) -> list[RankEfficiency]:
    if len(rows) <= MAX_RANKS:
        return rows
    keep = sorted(rows, key=lambda x: (x.mfu if x.mfu is not None else math.inf, x.rank))[:MAX_RANKS]
    return sorted(keep, key=lambda x: x.rank)


def _top_ops(c: FlopCount | None) -> list[dict[str, Any]]:
    if c is None:
        return []
    return [{"op": o["op"], "dims": o["dims"], "phase": o["phase"], "calls_per_step": o["calls"] / c.steps,
             "flops_per_step": o["flops"] / c.steps} for o in c.top[:MAX_TOP_OPS]]


# -- evidence for the findings -------------------------------------------------------------------

# levers whose cause keeps the devices waiting for the host (input, Python, syncs, a busy CPU)
HOST_LEVERS = frozenset({"dataloader", "host_overhead", "sync_points", "host_contention", "garbage_collection",
                         "input_imbalance", "straggler"})
# levers whose cause is communication the compute does not hide
COMM_LEVERS = frozenset({"gradient_accumulation", "comm_overlap", "ddp_bucket_size", "nccl_env", "sharding"})
LITTLE_COMM = 0.10  # exposed communication (waiting left out) under this share: not what keeps MFU down
EVIDENCE_PREFIX = "MFU "


def mfu_evidence(lever: str, e: Efficiency | None, exposed_transfer: float | None) -> str | None:
    """One line of evidence that puts a finding beside the job's MFU: for a host-side
    cause, that the devices did not wait for the network (when exposed communication is
    small); for a communication cause, the time without model FLOPs; for mixed
    precision, the precisions the FLOPs ran in and the peaks of the lower one. None when
    MFU is not known or says nothing about the lever."""
    if e is None or e.mfu is None:
        return None
    mfu = f"{EVIDENCE_PREFIX}{ratio_text(e.mfu)} ({rate_text(e.model_tflops)} of {rate_text(e.peak_tflops)})"
    comm = exposed_transfer if exposed_transfer is not None else 0.0
    if lever in HOST_LEVERS:
        if comm >= LITTLE_COMM:
            return None
        return (f"{mfu} with exposed communication at {comm:.1%} of the profiled time: the devices are not "
                "waiting for the network but for input or host work")
    if lever in COMM_LEVERS:
        return f"{mfu}; exposed communication, {comm:.1%} of the profiled time, is time without model FLOPs"
    if lever == "mixed_precision" and e.peak is not None:
        low = [p for p in ("bf16", "fp16") if e.peak.tflops.get(p)]
        used = max(e.precision_share, key=lambda p: e.precision_share[p]) if e.precision_share else None
        if not low or used not in ("fp32", "tf32") or not e.peak.tflops.get(used):
            return None
        gain = e.peak.tflops[low[0]] / e.peak.tflops[used]
        return (f"{mfu}: the model's FLOPs run in {precision_words(e)}; the {low[0]} peak "
                f"({rate_text(e.peak.tflops[low[0]])}) is {gain:.2g}x the {used} peak ({rate_text(e.peak.tflops[used])})"
                f" ({'datasheet' if e.peak.source == 'table' else 'measured'})")
    return None
