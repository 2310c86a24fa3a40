"""Findings from the ranks' memory by category (`ranks[].memory`, analyzers/memory.py).

- `memory_imbalance`: one rank's peak is well above the others' (its peak allocated on
  a GPU, its peak RSS on a CPU): work only that rank does holds memory (an evaluation
  set loaded on rank 0, metrics or outputs kept as tensors, a model copy), and the
  batch every rank can take is the one that rank can.
- `allocator_fragmentation` (GPU): the caching allocator reserved far more than it ever
  had allocated, on a device that is filling up: fragments it cannot reuse for the
  shapes asked (PyTorch's own out-of-memory message gives the same advice).

Neither estimates a saving: memory is freed, not time.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from pardiag.analysis import Finding

if TYPE_CHECKING:
    from pardiag.analyzers.rules import RuleContext

MEMORY_IMBALANCE_SHARE = 0.20  # a rank's peak over the others' median by this share ...
MEMORY_IMBALANCE_MIN_BYTES = 256 * 2**20  # ... and by at least this much
MEMORY_IMBALANCE_MEDIUM = 0.50  # medium when that rank's peak fills this share of its memory
MEMORY_IMBALANCE_SAME = 0.05  # categories within this share of each other are the same on every rank
ALLOCATOR_FRAGMENTATION_SHARE = 0.25  # reserved less allocated, share of reserved ...
ALLOCATOR_FRAGMENTATION_MIN_BYTES = 2 * 2**30  # ... and at least this much ...
ALLOCATOR_FRAGMENTATION_FILL = 0.50  # ... with reserved over this share of the device
ALLOCATOR_FRAGMENTATION_MEDIUM = 0.90

GB = 2**30


def _gb(b: float) -> str:
    return f"{b / GB:.2f} GB"


def _peak_of(mem: dict[str, Any]) -> tuple[float | None, str]:
    """The rank's peak to compare: allocated on a GPU, RSS elsewhere."""
    if mem.get("allocated"):
        return float(mem["allocated"]), "peak allocated"
    if mem.get("rss_peak"):
        return float(mem["rss_peak"]), "peak resident memory (RSS)"
    return None, ""


def memory_imbalance(ctx: RuleContext) -> list[Finding]:
    """The rank with the highest peak (allocated on a GPU, RSS on a CPU), against the
    median of the others' peaks: over it by 20% of it and by 256 MB. Medium when that
    rank's peak fills 50% of its memory or more, low below. The evidence says when the
    categories (parameters, gradients, optimizer state, activations) agree within 5% on
    every rank: the extra is then held outside the step's tensors."""
    peaks: dict[int, float] = {}
    kinds: set[str] = set()
    for r in ctx.analysis.ranks:
        if r.memory:
            v, what = _peak_of(r.memory)
            kinds.add(what)
            if v is not None:
                peaks[r.rank] = v
    if len(peaks) < 2 or len(kinds) > 1:
        # fewer than two ranks to compare, or ranks measured differently (a GPU and a CPU rank)
        return []
    top = max(peaks, key=lambda k: peaks[k])
    others = statistics.median(v for k, v in peaks.items() if k != top)
    excess = peaks[top] - others
    if excess < MEMORY_IMBALANCE_SHARE * others or excess < MEMORY_IMBALANCE_MIN_BYTES:
        return []
    mem = next(r.memory for r in ctx.analysis.ranks if r.rank == top and r.memory)
    cap = mem.get("capacity")
    fill = peaks[top] / cap if cap else None
    evidence = [f"rank {top}: {what} {_gb(peaks[top])}, the other ranks' median {_gb(others)} "
                f"(+{_gb(excess)}, +{excess / others:.0%})"]
    if cap and fill is not None:
        evidence.append(f"rank {top} fills {fill:.0%} of its {_gb(cap)}: a batch or model that fits the others "
                        "stops fitting there first")
    cats = mem.get("peak") or {}
    known = {k: v for k, v in cats.items() if k != "total" and v is not None}
    if known:
        others_cats = [(r.memory or {}).get("peak") or {} for r in ctx.analysis.ranks if r.memory and r.rank != top]
        same = all(abs((o.get(k) or 0) - v) <= MEMORY_IMBALANCE_SAME * max(v, 1)
                   for o in others_cats for k, v in known.items() if k != "other")
        if same:
            evidence.append("parameters, gradients, optimizer state and activations are the same on every rank: "
                            "the extra is held outside the training step's tensors")
    return [Finding(
        lever="memory_imbalance",
        severity="medium" if fill is not None and fill >= MEMORY_IMBALANCE_MEDIUM else "low",
        title=f"rank {top} holds {_gb(excess)} more memory than the others",
        evidence=evidence, ranks=[top], est_saving_pct=None,
        action={"text": f"find what only rank {top} keeps (an evaluation set or a model copy loaded on one rank, "
                        "losses or outputs kept as tensors instead of .item() / .detach().cpu()) and move it off "
                        "the training processes or free it",
                "code": f"if rank == {top}:\n    torch.cuda.memory._record_memory_history()  # then "
                        "torch.cuda.memory._dump_snapshot('rank.pickle'): pytorch.org/memory_viz shows who holds it",
                "doc": "https://pytorch.org/docs/stable/torch_cuda_memory.html"},
    )]


def allocator_fragmentation(ctx: RuleContext) -> list[Finding]:
    """A GPU rank whose peak reserved exceeds its peak allocated by 25% of the reserved
    and by 2048 MB, with the reserved at 50% of the device or more: medium from 90% of
    the device, low below."""
    worst: tuple[float, int, dict[str, Any]] | None = None
    for r in ctx.analysis.ranks:
        m = r.memory or {}
        res, alloc, cap = m.get("reserved"), m.get("allocated"), m.get("capacity")
        if not (res and alloc and cap):
            continue
        gap = res - alloc
        if gap >= ALLOCATOR_FRAGMENTATION_SHARE * res and gap >= ALLOCATOR_FRAGMENTATION_MIN_BYTES and res >= ALLOCATOR_FRAGMENTATION_FILL * cap:
            if worst is None or gap > worst[0]:
                worst = (gap, r.rank, m)
    if worst is None:
        return []
    gap, rank, m = worst
    return [Finding(
        lever="allocator_fragmentation",
        severity="medium" if m["reserved"] >= ALLOCATOR_FRAGMENTATION_MEDIUM * m["capacity"] else "low",
        title=f"the CUDA allocator holds {_gb(gap)} it never had allocated at once on rank {rank}",
        evidence=[f"rank {rank}: peak reserved {_gb(m['reserved'])}, peak allocated {_gb(m['allocated'])} of "
                  f"{_gb(m['capacity'])}: {gap / m['reserved']:.0%} of what it reserved was never in use together"],
        ranks=[rank], est_saving_pct=None,
        action={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                "text": "segments that grow in place instead of new blocks per shape: fewer fragments",
                "doc": "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"},
    )]
