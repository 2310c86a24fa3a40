"""HolisticTraceAnalysis as a second engine for GPU traces (`pardiag analyze --hta`).

Folds three HTA analyses into the Analysis' `hta` block, as plain numbers:
- idle time per rank and stream, split into host wait (the CPU did not enqueue work
  fast enough), kernel wait (gaps under 30 us between kernels: launch overhead) and
  other (`get_idle_time_breakdown`);
- CUDA kernel launch statistics: CPU launch duration, GPU duration, launch delay,
  and the counts HTA flags: kernels shorter than their launch, launches over 50 us,
  launch delays over 100 us (`get_cuda_kernel_launch_stats`);
- time per kernel type and the most expensive kernels (`get_gpu_kernel_breakdown`).

HTA (and pandas) are imported here only, so `pardiag analyze` without `--hta` never
loads them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

RUNTIME_CUTOFF_US = 50
LAUNCH_DELAY_CUTOFF_US = 100
TOP_KERNELS = 20


def _quantile(series: Any, q: float) -> float | None:
    return float(series.quantile(q)) if len(series) else None


def hta_summary(traces: Mapping[int, Path]) -> dict[str, Any]:
    """Runs HTA on the given rank -> trace files; raises on HTA's own failures."""
    import hta
    from hta.trace_analysis import TraceAnalysis

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # HTA logs every step of its parsing
    try:
        first = next(iter(traces.values()))
        ta = TraceAnalysis(trace_files={int(r): str(p) for r, p in traces.items()}, trace_dir=str(first.parent))
        idle, _ = ta.get_idle_time_breakdown(visualize=False)
        launches = ta.get_cuda_kernel_launch_stats(
            runtime_cutoff=RUNTIME_CUTOFF_US, launch_delay_cutoff=LAUNCH_DELAY_CUTOFF_US, visualize=False
        )
        kinds, kernels = ta.get_gpu_kernel_breakdown(visualize=False)
    finally:
        logging.disable(previous)

    idle_by_rank: dict[str, Any] = {}
    for row in idle.itertuples(index=False):
        d = idle_by_rank.setdefault(str(int(row.rank)), {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0, "streams": {}})
        key = f"{row.idle_category}_us" if row.idle_category != "other" else "other_us"
        d[key] = d.get(key, 0.0) + float(row.idle_time)
        d["streams"].setdefault(str(int(row.stream)), {})[row.idle_category] = float(row.idle_time)

    launch_stats: dict[str, Any] = {}
    for rank, df in launches.items():
        launch_stats[str(rank)] = {
            "launches": int(len(df)),
            "cpu_duration_us_p50": _quantile(df["cpu_duration"], 0.5),
            "gpu_duration_us_p50": _quantile(df["gpu_duration"], 0.5),
            "launch_delay_us_p50": _quantile(df["launch_delay"], 0.5),
            "launch_delay_us_p90": _quantile(df["launch_delay"], 0.9),
            "kernels_shorter_than_launch": int((df["gpu_duration"] < df["cpu_duration"]).sum()),
            "launches_over_cutoff": int((df["cpu_duration"] > RUNTIME_CUTOFF_US).sum()),
            "launch_delays_over_cutoff": int((df["launch_delay"] > LAUNCH_DELAY_CUTOFF_US).sum()),
        }

    kernel_types = [
        {"kernel_type": str(r.kernel_type), "sum_us": float(r.sum), "percentage": float(r.percentage)}
        for r in kinds.itertuples(index=False)
    ]
    top = kernels.sort_values("sum (us)", ascending=False).head(TOP_KERNELS)
    top_kernels = [
        {
            "name": str(r["name"]),
            "kernel_type": str(r["kernel_type"]),
            "rank": int(r["rank"]) if str(r["rank"]).lstrip("-").isdigit() else None,
            "sum_us": float(r["sum (us)"]),
            "mean_us": float(r["mean (us)"]),
        }
        for _, r in top.iterrows()
    ]
    return {
        "version": getattr(hta, "__version__", None),
        "idle_by_rank": idle_by_rank,
        "launch_stats": launch_stats,
        "kernel_types": kernel_types,
        "top_kernels": top_kernels,
        "cutoffs_us": {"runtime": RUNTIME_CUTOFF_US, "launch_delay": LAUNCH_DELAY_CUTOFF_US},
    }
