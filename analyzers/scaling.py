"""Scaling across runs of the same job at different world sizes.

Throughput (samples per second = global batch / median step time) is compared with
the smallest run; the median step and the exposed communication of each run are its
Analysis' `summary` (`step_p50_us`, `comm_exposed_ratio`), the figures its reports show: efficiency = (X_N / X_0) / (N / N_0). That covers both modes:
- strong scaling (the global batch stays the same): the step should shrink as 1/N;
- weak scaling (the per-rank batch stays the same): the step should stay the same.
Which one the runs are is said from their batch sizes.

Each point carries the run's MFU (`summary.mfu`): the share of the devices' peak the
model's FLOPs used, which falls as ranks are added by the same loss as the efficiency
when the work per rank stays the same.

Amdahl's law on the throughput speed-up S at r = N / N_0 times the ranks:
1/S = f + (1 - f)/r, linear in the serial fraction f, fitted by least squares through
1/S - 1/r = f (1 - 1/r). The projection at 2x and 4x the largest world size uses it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from pardiag.analysis import Analysis


@dataclass(frozen=True)
class ScalingPoint:
    label: str
    world_size: int
    step_us: float
    batch_per_rank: int | None
    global_batch: int | None
    throughput: float | None  # samples/s, or steps/s x ranks when the batch is unknown
    efficiency: float | None
    comm_exposed_share: float  # the run's summary.comm_exposed_ratio (waiting included, pooled)
    speedup: float | None
    mfu: float | None = None  # the run's summary.mfu: a falling MFU with growing ranks is the time scaling lost


@dataclass(frozen=True)
class ScalingResult:
    mode: str  # strong | weak | mixed
    points: list[ScalingPoint]
    serial_fraction: float | None
    projected: list[dict[str, float]]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _batch(a: Analysis) -> tuple[int | None, int]:
    fw = a.run.fw
    loaders = fw.dataloaders or []
    b = loaders[0].get("batch_size") if loaders else None
    accum = (fw.grad_accumulation or {}).get("backwards_per_step") or 1
    return (int(b) if isinstance(b, int) else None), int(round(accum))


def fit_serial_fraction(ratios: Sequence[float], speedups: Sequence[float]) -> float | None:
    xs, ys = [], []
    for r, s in zip(ratios, speedups):
        if r > 1 and s > 0:
            xs.append(1 - 1 / r)
            ys.append(1 / s - 1 / r)
    if not xs:
        return None
    f = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return min(max(f, 0.0), 1.0)


def amdahl_speedup(f: float, r: float) -> float:
    return 1 / (f + (1 - f) / r)


def scaling(runs: Sequence[tuple[str, Analysis]]) -> ScalingResult:
    notes: list[str] = []
    rows = []
    for label, a in runs:
        n = int(a.run.world_size or len(a.ranks) or 1)
        step = a.job_summary.step_p50_us or 0.0
        b, accum = _batch(a)
        rows.append((label, n, step, b, b * accum * n if b else None, a.job_summary.comm_exposed_ratio or 0.0,
                     a.job_summary.mfu))
    rows.sort(key=lambda r: r[1])
    if len({r[1] for r in rows}) < 2:
        notes.append("all runs have the same world size: nothing to compare")
    per_rank = {r[3] for r in rows}
    global_b = {r[4] for r in rows}
    if None in per_rank:
        mode = "unknown"
        notes.append("batch sizes unknown (no DataLoader seen): throughput counted as ranks x steps/s, i.e. weak scaling")
    elif len(global_b) == 1:
        mode = "strong"
    elif len(per_rank) == 1:
        mode = "weak"
    else:
        mode = "mixed"
        notes.append("per-rank and global batch both change: compared by samples per second")
    base = rows[0]

    def throughput(row: tuple[Any, ...]) -> float | None:
        if row[2] <= 0:
            return None
        samples = row[4] if row[4] else row[1]
        return float(samples / (row[2] / 1e6))

    x0 = throughput(base)
    points = []
    ratios, speedups = [], []
    for row in rows:
        x = throughput(row)
        sp = x / x0 if x and x0 else None
        r = row[1] / base[1]
        points.append(ScalingPoint(row[0], row[1], row[2], row[3], row[4], x, sp / r if sp else None, row[5], sp,
                                   row[6]))
        if sp:
            ratios.append(r)
            speedups.append(sp)
    f = fit_serial_fraction(ratios, speedups)
    projected = []
    if f is not None:
        top = rows[-1][1]
        for mult in (2, 4):
            r = top * mult / base[1]
            s = amdahl_speedup(f, r)
            projected.append({"world_size": top * mult, "speedup": s, "efficiency": s / r})
    return ScalingResult(mode, points, f, projected, notes)
