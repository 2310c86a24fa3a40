"""Each lever rule's docstring states its real thresholds: they are named constants
(`<RULE>_...` in levers.py), the docstring names every one, the rule's code writes no
threshold inline, and the rule fires at each threshold and not just below it."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace
from typing import Any, Callable

import pytest

from pardiag.analysis import Analysis, Finding
from pardiag.analyzers import levers, memory_rules
from pardiag.analyzers.rules import RULES, advise
from factories import DDP_ONE_BUCKET, GB, analysis, rank

# straggler's rule belongs with stragglers.py (its thresholds are documented there), and so
# do the host levers' (a straggler whose host signals say why: host_causes.py documents
# theirs); ddp_find_unused has no numeric threshold (DDP's own record decides)
STRAGGLER_ROWS = {"straggler", "host_contention", "garbage_collection", "input_imbalance"}
RULE_ROWS = [row for row in RULES if row.family == "lever" and row.name not in STRAGGLER_ROWS]
NO_NUMBERS = {"ddp_find_unused"}


def constants(rule: str) -> dict[str, float]:
    """The rule's thresholds: `<RULE>_...` constants of the module it is written in."""
    row = next(r for r in RULES if r.name == rule)
    prefix = rule.upper() + "_"
    return {k: v for k, v in vars(inspect.getmodule(row.check)).items()
            if k.startswith(prefix) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def written(name: str, value: float) -> str:
    """How a docstring writes a constant: shares as percentages, sizes in MB."""
    if name.endswith("_BYTES"):
        return f"{value / 2**20:g} MB"
    if isinstance(value, float) and 0 < value < 1:
        return f"{value * 100:g}%"
    return f"{value:g}"


@pytest.mark.parametrize("row", RULE_ROWS, ids=lambda r: r.name)
def test_every_rule_docstring_names_its_thresholds(row: Any) -> None:
    doc = inspect.getdoc(row.check) or ""
    assert doc, f"{row.name} has no docstring"
    found = constants(row.name)
    if row.name in NO_NUMBERS:
        assert not found
        return
    assert found, f"{row.name} has no named threshold"
    words = " ".join(doc.split())
    missing = [f"{k} ({written(k, v)})" for k, v in found.items()
               if not re.search(rf"(?<![\d.]){re.escape(written(k, v))}(?![\d])", words)]
    assert not missing, f"{row.name}'s docstring does not state {', '.join(missing)}"


@pytest.mark.parametrize("row", RULE_ROWS, ids=lambda r: r.name)
def test_no_rule_writes_a_threshold_inline(row: Any) -> None:
    """A share written as a literal in the rule (0.05, 0.25) is a threshold the docstring
    test cannot see; 0.0 (a default) is not one."""
    source = inspect.getsource(row.check)
    body = source.split('"""')[2] if source.count('"""') >= 2 else source
    literals = re.findall(r"(?<![\w.])0\.\d*[1-9]\d*", body)
    assert not literals, f"{row.name} writes {literals} inline"


def test_mixed_precision_docstring_states_its_speed_ups() -> None:
    doc = " ".join((inspect.getdoc(levers.mixed_precision) or "").split())
    for k in ("fp32", "tf32"):
        assert f"{levers.PRECISION_SPEEDUP[k]:g}x" in doc
    assert f"{levers.CPU_BF16_SPEEDUP:g}x" in doc
    assert ".".join(str(n) for n in levers.BF16_CAPABILITY) in doc


# -- each rule at its thresholds -------------------------------------------------------------

def _found(a: Analysis, lever: str) -> Finding | None:
    return next((f for f in advise(a).findings if f.lever == lever), None)


LOADER = {"dataloaders": [{"num_workers": 0, "pin_memory": True, "persistent_workers": False, "batch_size": 8}],
          "threads": {"sched_affinity": 16}}
NO_DDP: dict[str, Any] = {"grad_accumulation": {"backwards_per_step": 1.0}}
# a device of 10 GB whose model state (2 x parameters, no optimizer state) is small
DEVICE = {"total_memory_bytes": 10 * GB}


def _dataloader(x: float) -> Analysis:
    return analysis([rank(0, compute=0.5, host={"step": 100_000.0, "dataloader": x * 100_000.0})], LOADER)


def _exposed(fw: dict[str, Any]) -> Callable[[float], Analysis]:
    return lambda x: analysis([rank(0, compute=0.6, comm_exposed=x)], fw)


def _gemm(x: float) -> Analysis:
    return analysis([rank(0, compute=0.8, ops={"gemm_us": {"fp32": x * 100_000.0}})],
                    {"amp": {"autocast": {}}, "device": {"capability": "8.0"}})


def _idle(x: float) -> Analysis:
    return analysis([rank(0, compute=1 - x, ops={"compute_kernel_p50_us": 8.0})])


def _syncs(x: float) -> Analysis:
    return analysis([rank(0, steps=10, compute=0.9, ops={"sync_calls": int(x * 10), "compute_kernel_p50_us": 200.0})])


def _peak(x: float) -> Analysis:
    fw = {"device": DEVICE, "parameters": {"local_bytes": int(0.01 * GB)},
          "peak_memory_reserved_bytes_max": int(x * 10 * GB)}
    return analysis([rank(0, compute=0.9)], fw)


def _busy(x: float) -> Analysis:
    fw = {"device": DEVICE, "peak_memory_reserved_bytes_max": int(0.2 * 10 * GB)}
    return analysis([rank(0, compute=x)], fw)


def _imbalance(x: float) -> Analysis:
    """Two CPU ranks of 10 GB: rank 1's peak RSS over rank 0's 5 GB by the share x (5 GB:
    0.2 x 5 GB is 1 GB exactly in floating point)."""
    others = 5 * GB

    def mem(peak: float) -> dict[str, Any]:
        return {"rss_peak": peak, "capacity": 10 * GB, "peak": {}}

    return analysis([replace(rank(0, device="cpu", compute=0.9), memory=mem(others)),
                     replace(rank(1, device="cpu", compute=0.9), memory=mem(others + x * others))])


def _fragmented(x: float) -> Analysis:
    """A GPU of 10 GB whose allocator reserved 8 GB, a share x of it never allocated."""
    res = 8 * GB
    return analysis([replace(rank(0, compute=0.9), memory={"reserved": res, "allocated": res - x * res,
                                                            "capacity": 10 * GB, "peak": {}})])


# (rule, the Analysis at share x, threshold, a value just past it on the quiet side)
FIRES = [
    ("dataloader", _dataloader, levers.DATALOADER_MIN, levers.DATALOADER_MIN - 1e-4),
    ("gradient_accumulation", _exposed(DDP_ONE_BUCKET), levers.GRADIENT_ACCUMULATION_MIN,
     levers.GRADIENT_ACCUMULATION_MIN - 1e-4),
    ("ddp_bucket_size", _exposed(DDP_ONE_BUCKET), levers.DDP_BUCKET_SIZE_MIN, levers.DDP_BUCKET_SIZE_MIN - 1e-4),
    ("comm_overlap", _exposed(NO_DDP), levers.COMM_OVERLAP_MIN, levers.COMM_OVERLAP_MIN - 1e-4),
    ("mixed_precision", _gemm, levers.MIXED_PRECISION_MIN, levers.MIXED_PRECISION_MIN - 1e-4),
    ("host_overhead", _idle, levers.HOST_OVERHEAD_IDLE, levers.HOST_OVERHEAD_IDLE - 1e-4),
    ("sync_points", _syncs, levers.SYNC_POINTS_MIN, levers.SYNC_POINTS_MIN - 0.1),
    ("sharding", _peak, levers.SHARDING_PEAK, levers.SHARDING_PEAK - 1e-3),
    ("batch_size", _busy, levers.BATCH_SIZE_BUSY - 1e-4, levers.BATCH_SIZE_BUSY),
    ("memory_imbalance", _imbalance, memory_rules.MEMORY_IMBALANCE_SHARE, memory_rules.MEMORY_IMBALANCE_SHARE - 1e-4),
    ("allocator_fragmentation", _fragmented, memory_rules.ALLOCATOR_FRAGMENTATION_SHARE,
     memory_rules.ALLOCATOR_FRAGMENTATION_SHARE - 1e-4),
]


@pytest.mark.parametrize("lever, build, at, quiet", FIRES, ids=[f[0] for f in FIRES])
def test_each_rule_fires_at_its_threshold(lever: str, build: Callable[[float], Analysis], at: float,
                                          quiet: float) -> None:
    assert _found(build(at), lever) is not None
    assert _found(build(quiet), lever) is None


# (rule, the Analysis at share x, where it turns medium, where it turns high, the severity
# at the medium threshold: a 5% input wait saves 90% of it, 4.5% of the step, under
# SAVING_LOW, so it is low; the others save 5% or more there: 10% exposed with DDP
# accumulating 4 saves 7.5%, bucket and overlap 50% of 10%, fp32 GEMMs 75% of 10%, half
# of 20% idle)
SEVERITIES = [
    ("dataloader", _dataloader, levers.DATALOADER_MIN, levers.DATALOADER_HIGH, "low"),
    ("gradient_accumulation", _exposed(DDP_ONE_BUCKET), levers.GRADIENT_ACCUMULATION_MIN,
     levers.GRADIENT_ACCUMULATION_HIGH, "medium"),
    ("ddp_bucket_size", _exposed(DDP_ONE_BUCKET), levers.DDP_BUCKET_SIZE_MEDIUM, levers.DDP_BUCKET_SIZE_HIGH, "medium"),
    ("comm_overlap", _exposed(NO_DDP), levers.COMM_OVERLAP_MIN, levers.COMM_OVERLAP_HIGH, "medium"),
    ("mixed_precision", _gemm, levers.MIXED_PRECISION_MIN, levers.MIXED_PRECISION_HIGH, "medium"),
    ("host_overhead", _idle, levers.HOST_OVERHEAD_IDLE, levers.HOST_OVERHEAD_HIGH, "medium"),
]


@pytest.mark.parametrize("lever, build, medium, high, at_medium", SEVERITIES, ids=[f[0] for f in SEVERITIES])
def test_each_rule_turns_high_at_its_threshold(lever: str, build: Callable[[float], Analysis], medium: float,
                                               high: float, at_medium: str) -> None:
    at_high, below = _found(build(high), lever), _found(build(high - 1e-4), lever)
    assert at_high is not None and below is not None
    assert (at_high.severity, below.severity) == ("high", "medium")
    f = _found(build(medium), lever)
    assert f is not None and f.severity == at_medium
