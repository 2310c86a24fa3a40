"""The suite's reference comparison with HolisticTraceAnalysis: HTA's own temporal
breakdown and comm/compute overlap of a folder of rank traces, pardiag's gpu_breakdown
of one trace in HTA's names, and the comparison. Used by the tests and by
benchmarks/gpu_check.py (which runs outside pytest, on the GPU machine)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pardiag.analyzers.gpu_breakdown import gpu_breakdown
from pardiag.analyzers.trace import load_trace

HtaNumbers = dict[str, float]


def hta_numbers(trace_dir: Path) -> dict[str, HtaNumbers]:
    """HTA's temporal breakdown and overlap for every rank file in a folder."""
    import warnings

    from hta.trace_analysis import TraceAnalysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = TraceAnalysis(trace_dir=str(trace_dir))
        temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    out = {}
    for rank, file in analysis.t.trace_files.items():
        row = temporal.loc[rank]
        out[Path(file).name] = {
            "idle_us": float(row["idle_time(us)"]),
            "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]),
            "kernel_time_us": float(row["kernel_time(us)"]),
            "overlap_pct": float(overlap.loc[rank, "comp_comm_overlap_pctg"]),
        }
    return out


def ours(path: Path) -> HtaNumbers:
    b = gpu_breakdown(load_trace(path))
    assert b is not None
    ratio = b.overlap_ratio
    return {"idle_us": b.idle_us, "compute_us": b.compute_us,
            "non_compute_us": b.non_compute_us, "kernel_time_us": b.span_us,
            "overlap_pct": round(100 * ratio, 2) if ratio is not None else math.nan}


def compare(mine: HtaNumbers, hta: HtaNumbers, rel: float) -> None:
    for key, expected in hta.items():
        if math.isnan(expected):
            assert math.isnan(mine[key]), key
        else:
            assert mine[key] == pytest.approx(expected, rel=rel, abs=1e-9), key
