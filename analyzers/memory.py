"""Memory by category, per rank: parameters, gradients, optimizer state, activations
and the rest, at the peak and at the step boundary (the Analysis' `ranks[].memory`).

Where each figure comes from (`sources` says, per figure, for each rank):

* parameters, gradients, optimizer state: the tensors themselves, from meta.json
  (`parameters.local_bytes`: the parameters the optimizers hold, this rank's shard of a
  sharded one; `parameters.trainable_bytes`: one gradient of each trainable
  parameter's size at the end of backward, plus DDP's bucket buffers, a second copy,
  unless `gradient_as_bucket_view`; `optimizers[].state_bytes`).
* activations: what a step's forward left allocated for its backward. On a GPU, the
  caching allocator's count just before the first backward less the count at the
  step's first DDP/FSDP forward (steps.jsonl `act_bytes`, sampled steps, median). Else,
  with `--profile-memory`, the profiler's allocation events: inside each profiled step,
  the allocator's total just before the first autograd function less its total at the
  step's start (median over the steps). Without either, unknown.
* peak and reserved (GPU): `torch.cuda.max_memory_allocated` / `max_memory_reserved`
  at the job's end; other = peak less the four categories (temporaries of backward,
  communication buffers, workspaces, fragments the allocator could not reuse).
* steady (GPU): the allocator's count at the step's end (steps.jsonl
  `dev_alloc_bytes`, sampled steps, median): parameters, the gradients still held,
  optimizer state and other.
* RSS (any run): the process's resident memory, peak (getrusage's maxrss) and at the
  step's end (steps.jsonl `rss_mb`, median). On a CPU it is the only measured total:
  it also holds the interpreter, libraries and the allocator's free pools, so the
  categories are not taken out of it.

The step-level part from a trace (`trace_memory`) runs where traces are reduced; the
rest (`rank_memory`) joins it with meta.json and steps.jsonl.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

import numpy as np

from pardiag.analyzers.trace import MemoryEvents

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
CPU, CUDA = 0, 1  # c10::DeviceType in the profiler's `Device Type`

MEMORY_DEFINITIONS = {
    "peak": "bytes by category when the rank's allocations peak: parameters, gradients (one per trainable "
            "parameter, plus DDP's bucket copy unless gradient_as_bucket_view), optimizer state, activations "
            "(what forward leaves for backward) and other (the peak allocated less the four; GPU only); total: "
            "the peak allocated (torch.cuda.max_memory_allocated)",
    "steady": "bytes allocated at the step's end (after the optimizer step): parameters, the gradients held then, "
              "optimizer state and other; total: the allocator's count there (GPU only, sampled steps)",
    "reserved": "the caching allocator's peak reserved bytes (torch.cuda.max_memory_reserved); reserved less "
                "allocated is memory held but unused",
    "allocated": "the peak allocated bytes (torch.cuda.max_memory_allocated)",
    "rss_peak": "the process's peak resident memory (getrusage maxrss)",
    "rss_steady": "the process's resident memory at the step's end (steps.jsonl rss_mb), median over counted steps",
    "capacity": "the device's memory (a CPU rank: the host's memory / its ranks; --memory-per-rank: the planned)",
}


def trace_memory(mem: MemoryEvents, steps: Sequence[tuple[int, float, float]],
                 backward_starts: np.ndarray) -> dict[str, Any] | None:
    """Per profiled step (number, start, end), from the allocator's events: the bytes
    held at its first backward above the lowest total before it (activations: what
    forward left for backward, after the step's first frees such as a zero_grad), the
    most allocated above that low point at any time (peak), and what it ended with
    above its start (growth; a block allocated before the profiler started is never
    subtracted when freed, so the median over steps is what to read). None without
    events of the device. `backward_starts`: sorted start times of the autograd
    functions on the training threads."""
    if len(mem) == 0 or not steps:
        return None
    dev = CUDA if bool((mem.device_type == CUDA).any()) else CPU
    sel = mem.device_type == dev
    ts, total = mem.ts_us[sel], mem.total_allocated[sel]
    before = total - mem.nbytes[sel]  # the total just before each event
    order = np.argsort(ts, kind="stable")
    ts, total, before = ts[order], total[order], before[order]
    if ts.size == 0:
        return None

    def at(t: float) -> int:
        """The allocator's total at time t (before an event at exactly t)."""
        i = int(np.searchsorted(ts, t, side="left"))
        return int(total[i - 1]) if i > 0 else int(before[0])

    per_step: dict[str, dict[str, int]] = {}
    for step, start, end in steps:
        lo, hi = (int(i) for i in np.searchsorted(ts, [start, end], side="left"))
        b = int(np.searchsorted(backward_starts, start, side="left"))
        bwd = float(backward_starts[b]) if b < backward_starts.size and backward_starts[b] < end else None
        # the base: the lowest total before forward allocates, after what the step freed first
        # (a zero_grad that drops the last step's gradients, the last batch)
        upto = int(np.searchsorted(ts, bwd, side="left")) if bwd is not None else hi
        base = min([at(start)] + ([int(total[lo:upto].min())] if upto > lo else []))
        peak = int(total[lo:hi].max()) if hi > lo else base
        row = {"peak": max(0, peak - base), "growth": at(end) - at(start)}
        if bwd is not None:
            row["activations"] = max(0, at(bwd) - base)
        per_step[str(step)] = row
    acts = [r["activations"] for r in per_step.values() if "activations" in r]
    return {
        "device": "cuda" if dev == CUDA else "cpu",
        "events": int(ts.size),
        "steps": per_step,
        "activations_bytes": int(statistics.median(acts)) if acts else None,
        "peak_above_start_bytes": max(r["peak"] for r in per_step.values()),
        "growth_per_step_bytes": int(statistics.median(r["growth"] for r in per_step.values())),
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def rank_memory(meta: Any, trace_mem: Mapping[str, Any] | None,
                acts: Sequence[float], dev_alloc: Sequence[float], rss_mb: Sequence[float]) -> dict[str, Any] | None:
    """The rank's `memory` block; None when nothing about its memory is known. `meta`: its
    RankMeta (or None); `trace_mem`: `trace_memory`'s result; `acts`, `dev_alloc`,
    `rss_mb`: the steps.jsonl signals of its counted steps."""
    params = meta.parameters if meta is not None and meta.parameters else {}
    device = meta.device if meta is not None else None
    p = _num(params.get("local_bytes"))
    trainable = _num(params.get("trainable_bytes"))
    opt_state = None
    if meta is not None and meta.optimizers:
        vals = [_num(o.get("state_bytes")) for o in meta.optimizers if isinstance(o, Mapping)]
        opt_state = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
    buckets = 0.0
    for m in (meta.ddp or ()) if meta is not None else ():
        if m.gradient_as_bucket_view is False and isinstance(m.bucket_sizes_bytes, list):
            buckets += sum(b for b in m.bucket_sizes_bytes if isinstance(b, (int, float)))
    grads = (trainable + buckets) if trainable is not None else None
    sources: dict[str, str] = {}
    if p is not None:
        sources["parameters"] = "the optimizers' parameters (meta.json)"
    if grads is not None:
        sources["gradients"] = "one per trainable parameter" + (" + DDP's bucket buffers" if buckets else "")
    if opt_state is not None:
        sources["optimizer_state"] = "the optimizers' state tensors (meta.json)"

    act: float | None = None
    if acts:
        act = _median(acts)
        sources["activations"] = f"the allocator before the first backward, less at the first forward ({len(acts)} sampled steps)"
    elif trace_mem and trace_mem.get("activations_bytes") is not None:
        act = float(trace_mem["activations_bytes"])
        n = sum(1 for r in (trace_mem.get("steps") or {}).values() if "activations" in r)
        sources["activations"] = f"the profiler's allocation events, first backward less step start ({n} profiled steps)"

    on_gpu = device is not None and device.type == "cuda"
    allocated = _num(device.max_memory_allocated_bytes) if on_gpu and device else None
    reserved = _num(device.max_memory_reserved_bytes) if on_gpu and device else None
    rss_peak = None
    if device is not None:  # a CPU's meta.json also keeps maxrss as its "reserved"
        rss_peak = _num(device.extra.get("host_max_rss_bytes")) or (
            None if on_gpu else _num(device.max_memory_reserved_bytes))
    capacity = None
    if device is not None:
        capacity = _num(device.extra.get("memory_budget_bytes")) or _num(device.total_memory_bytes)

    known = [v for v in (p, grads, opt_state, act) if v is not None]
    peak: dict[str, float | None] = {"parameters": p, "gradients": grads, "optimizer_state": opt_state,
                                     "activations": act, "other": None, "total": allocated}
    if allocated is not None and len(known) == 4:
        peak["other"] = max(0.0, allocated - sum(known))
        sources["other"] = "the peak allocated less the four categories"
    steady_total = _median(dev_alloc)
    held = _num(params.get("grad_bytes"))
    steady: dict[str, float | None] = {"parameters": p, "gradients": (held + buckets) if held is not None else None,
                                       "optimizer_state": opt_state, "activations": 0.0 if steady_total else None,
                                       "other": None, "total": steady_total}
    if steady_total is not None and None not in (p, steady["gradients"], opt_state):
        steady["other"] = max(0.0, steady_total - p - steady["gradients"] - opt_state)  # type: ignore[operator]
    rss_steady = _median([v * 2**20 for v in rss_mb])
    if not known and allocated is None and rss_peak is None and rss_steady is None:
        return None
    out: dict[str, Any] = {
        "device": "cuda" if on_gpu else (device.type if device is not None and device.type else None),
        "peak": peak, "steady": steady, "reserved": reserved, "allocated": allocated,
        "rss_peak": rss_peak, "rss_steady": rss_steady, "capacity": capacity,
        "sources": sources,
    }
    if trace_mem:
        out["profiled"] = {k: trace_mem.get(k) for k in ("device", "events", "activations_bytes",
                                                          "peak_above_start_bytes", "growth_per_step_bytes")}
    return out
