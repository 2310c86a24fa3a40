"""GPU kernel classification as data: a table of compiled name patterns.

Kinds follow HTA 0.5 (``hta/utils/utils.py: get_kernel_type``), checked in this order:

1. COMMUNICATION: the name matches ``^nccl.*Kernel``. That covers current NCCL
   (``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)``), NCCL before 2.19
   (``ncclKernel_AllReduce_RING_LL_Sum_float(...)``) and RCCL
   (``ncclDevKernel_Generic(...)``). pardiag adds rows HTA 0.5 misses: names with a
   return type in front or in other letter case (``void ncclDevKernel_...<...>``,
   ``nccldevkernel_...``), Habana's ``hccl`` kernels, and expert-parallel libraries
   that move data in kernels of their own (DeepEP, NVSHMEM, MORI).
2. MEMORY: ``^Memcpy|^Memset|^dma``; pardiag also counts every event of category
   ``gpu_memcpy`` / ``gpu_memset`` as memory, whatever its name (AMD names copies
   ``CopyHostToDevice``).
3. OTHER: HTA does not count as compute anything matching
   ``(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)``: names containing ``Memcpy`` or
   ``Sync`` that the rows above did not take (``Stream Sync``, ``Event Sync``, ...).
4. COMPUTATION: the rest.

Only unique names are classified; events map to kinds through a name-id lookup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

import numpy as np
import numpy.typing as npt


class KernelKind(IntEnum):
    """Kind codes, stored as ``int8`` in arrays. Values match HTA's ``KernelType``."""

    COMMUNICATION = 0
    MEMORY = 1
    COMPUTATION = 2
    OTHER = 3


@dataclass(frozen=True)
class KernelRule:
    """One row of the classification table; the first row whose pattern matches
    the start of a name (``re.match``) wins."""

    kind: KernelKind
    pattern: re.Pattern[str]
    source: str  # where the rule comes from
    examples: tuple[str, ...]  # real names the rule is meant for (each is tested)
    hta: bool  # True when HTA 0.5 has the same row


RULES: tuple[KernelRule, ...] = (
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r"^nccl.*Kernel"),
        "HTA 0.5 NCCL_KERNEL_RE: current NCCL, NCCL < 2.19, RCCL",
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
         "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"),
        hta=True),
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r".*\bnccl\w*kernel", re.IGNORECASE),
        "nccl kernels behind a return type or in other letter case "
        "(HTA issues #208, #247, #360)",
        ("void ncclDevKernel_AllGather_RING_LL<float>(ncclDevKernelArgsStorage<4096ul>)",
         "nccldevkernel_reducescatter_sum_bf16_ring_ll"),
        hta=False),
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r"^hccl"),
        "Habana HCCL kernels (HTA after 0.5)", ("hcclAllReduce",), hta=False),
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r".*\bdeep_ep::(intranode|internode|internode_ll)::"),
        "DeepEP expert-parallel kernels (csrc/kernels/intranode.cu, internode.cu, internode_ll.cu): "
        "dispatch, combine and their notify/clean steps move tokens between ranks over NVLink "
        "and RDMA; deep_ep::layout:: computes, and stays compute",
        ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*)",
         "void deep_ep::internode_ll::combine<false, 7168, 9>(void*, void*, int*, void const*)",
         "void deep_ep::internode::notify_dispatch<false, 8>(int const*, int*, int, int const*)"),
        hta=False),
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r".*\bnvshmemi?_"),
        "NVSHMEM's own kernels (one-sided puts, gets, barriers between GPUs)",
        ("nvshmemi_barrier_all_kernel", "void nvshmemi_transfer_rma_kernel<float>(void*, void const*, unsigned long)"),
        hta=False),
    KernelRule(
        KernelKind.COMMUNICATION, re.compile(r".*\bmori::moe::Ep(Dispatch|Combine)"),
        "MORI expert-parallel dispatch/combine kernels (ROCm)",
        ("void mori::moe::EpDispatchIntraNodeKernel<__hip_bfloat16>(mori::moe::EpDispatchCombineArgs<__hip_bfloat16>)",),
        hta=False),
    KernelRule(
        KernelKind.MEMORY, re.compile(r"(^Memcpy)|(^Memset)|(^dma)"),
        "HTA 0.5 MEMORY_KERNEL_RE",
        ("Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "dma_copy"),
        hta=True),
    KernelRule(
        KernelKind.OTHER, re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)"),
        "HTA 0.5 NCCL_COMPUTE_KERNEL_RE: not counted as compute",
        ("Stream Sync", "Event Sync", "void at::native::unrolled_Memcpy_kernel"),
        hta=True),
)
"""pardiag's table: HTA 0.5's rows plus the extra communication rows."""

HTA_RULES: tuple[KernelRule, ...] = tuple(r for r in RULES if r.hta)
"""Exactly HTA 0.5's classification."""

MEMORY_CATEGORIES: frozenset[str] = frozenset({"gpu_memcpy", "gpu_memset"})


def classify(name: str, rules: Sequence[KernelRule] = RULES) -> KernelKind:
    """Kind of one kernel name: the first matching row, else COMPUTATION."""
    for rule in rules:
        if rule.pattern.match(name):
            return rule.kind
    return KernelKind.COMPUTATION


_CLASSIFIED: dict[int, dict[str, int]] = {}  # id of a rules table -> name -> kind


def classify_names(names: Sequence[str],
                   rules: Sequence[KernelRule] = RULES) -> npt.NDArray[np.int8]:
    """Kind code (``KernelKind`` value) for each of a list of unique names; each name
    is classified once per process and table (a job's ranks share their kernels)."""
    known = _CLASSIFIED.setdefault(id(rules), {}) if rules is RULES or rules is HTA_RULES else {}
    out = np.empty(len(names), dtype=np.int8)
    for i, n in enumerate(names):
        kind = known.get(n)
        if kind is None:
            kind = known[n] = int(classify(n, rules))
        out[i] = kind
    return out


def event_kinds(name_ids: npt.NDArray[np.integer], cat_ids: npt.NDArray[np.integer],
                names: Sequence[str], cats: Sequence[str],
                rules: Sequence[KernelRule] = RULES,
                memory_by_category: bool = True) -> npt.NDArray[np.int8]:
    """Kind code per event, classifying each distinct name once.

    ``name_ids``/``cat_ids`` index ``names``/``cats``. With ``memory_by_category``,
    events of category ``gpu_memcpy``/``gpu_memset`` are MEMORY whatever their name.
    """
    used = np.flatnonzero(np.bincount(name_ids, minlength=len(names)))
    table = np.full(len(names), KernelKind.COMPUTATION, dtype=np.int8)
    table[used] = classify_names([names[i] for i in used.tolist()], rules)
    kinds: npt.NDArray[np.int8] = table[name_ids]
    if memory_by_category:
        memory_cats = [i for i, c in enumerate(cats) if c in MEMORY_CATEGORIES]
        if memory_cats:
            kinds[np.isin(cat_ids, memory_cats)] = KernelKind.MEMORY
    return kinds
