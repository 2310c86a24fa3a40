"""The Analysis: everything renderers show, as frozen dataclasses and as JSON
(`schema: pardiag.analysis`, `schema_version: 1`, see DESIGN.md).

Times are microseconds (`_us`), sizes bytes, ratios 0..1. Nothing is rounded here.
New fields are added, never renamed: others read this JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from pardiag.errors import UserError

SCHEMA = "pardiag.analysis"
SCHEMA_VERSION = 1

Severity = Literal["high", "medium", "low"]
LEVERS = (
    "straggler",
    "dataloader",
    "mixed_precision",
    "gradient_accumulation",
    "ddp_bucket_size",
    "comm_overlap",
    "nccl_env",
    "sharding",
    "host_overhead",
    "sync_points",
    "gpu_health",
    "batch_size",
    "ddp_find_unused",  # extension (DESIGN.md): DDP searched for unused parameters and found none
)
BREAKDOWN_KEYS = ("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle")
PHASE_KEYS = ("dataloader", "forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class StepTime:
    p50: float | None
    mean: float | None
    max: float | None
    n: int
    p90: float | None = None
    steps_total: int = 0
    disturbed: int = 0


@dataclass(frozen=True)
class GpuTime:
    span_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    memory_us: float
    idle_us: float
    kernel_us: float = 0.0


@dataclass(frozen=True)
class RankResult:
    rank: int
    host: str | None
    steps_profiled: int
    window_us: float
    breakdown_us: dict[str, float]
    phases_us: dict[str, float]
    step_time_us: StepTime
    gpu: GpuTime | None = None
    trace: str | None = None
    trace_complete: bool = False
    device_type: str | None = None
    wait_us: float = 0.0  # time inside collectives spent waiting for other ranks
    transfer_us: float = 0.0  # time inside collectives moving data (their shortest duration)
    phases_per_step_us: dict[str, float] = field(default_factory=dict)
    host_phases_us: dict[str, float] = field(default_factory=dict)  # from steps.jsonl, per step
    ops: dict[str, Any] = field(default_factory=dict)  # GEMM time by precision, kernel sizes, host syncs


@dataclass(frozen=True)
class Collective:
    op: str
    process_group: str
    calls: int
    bytes: int
    total_us: float
    transfer_us: float
    wait_us: float
    algbw_gbps: float | None
    busbw_gbps: float | None
    group_size: int | None = None
    ranks_matched: int = 0
    wait_by_rank_us: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Straggler:
    rank: int
    excess_us_per_step: float  # the straggler's extra work per step
    cause: str
    evidence: list[str]
    held_us_per_step: float | None = None  # how much longer the others wait per step


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    desc: str
    role: str
    size: int | None
    ranks: list[int]
    ops: dict[str, int]
    total_us: float
    wait_us: float


@dataclass(frozen=True)
class Finding:
    lever: str
    severity: Severity
    title: str
    evidence: list[str]
    ranks: list[int]
    est_saving_pct: float | None
    action: dict[str, Any]


@dataclass(frozen=True)
class Notice:
    """Something missing or suspicious, said plainly to the user."""

    level: Literal["error", "warning", "info"]
    message: str


@dataclass(frozen=True)
class Analysis:
    run: dict[str, Any]
    ranks: list[RankResult]
    collectives: list[Collective]
    stragglers: list[Straggler]
    process_groups: list[ProcessGroup] = field(default_factory=list)
    nccl: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    scaling: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    hta: dict[str, Any] | None = None
    what_if: dict[str, Any] | None = None  # projected step time if the findings were applied
    hang: dict[str, Any] | None = None  # who timed out in which collective, who never arrived

    def to_dict(self) -> dict[str, Any]:
        d = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION}
        d.update(asdict(self))
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False, default=_json_default)


def _json_default(o: Any) -> Any:
    if is_dataclass(o):
        return asdict(o)  # type: ignore[arg-type]
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _build(cls: type, d: Mapping[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def from_dict(doc: Mapping[str, Any], source: str = "analysis") -> Analysis:
    if doc.get("schema") != SCHEMA:
        raise UserError(f"{source}: not a pardiag analysis")
    v = doc.get("schema_version")
    if not isinstance(v, int) or v > SCHEMA_VERSION:
        raise UserError(f"{source}: analysis schema version {v} is newer than this pardiag ({SCHEMA_VERSION}); upgrade pardiag")
    ranks = []
    for r in doc.get("ranks", []):
        r = dict(r)
        r["step_time_us"] = _build(StepTime, r.get("step_time_us") or {"p50": None, "mean": None, "max": None, "n": 0})
        r["gpu"] = _build(GpuTime, r["gpu"]) if r.get("gpu") else None
        ranks.append(_build(RankResult, r))
    return Analysis(
        run=dict(doc.get("run") or {}),
        ranks=ranks,
        collectives=[_build(Collective, c) for c in doc.get("collectives", [])],
        stragglers=[_build(Straggler, s) for s in doc.get("stragglers", [])],
        process_groups=[_build(ProcessGroup, p) for p in doc.get("process_groups", [])],
        nccl=dict(doc.get("nccl") or {}),
        telemetry=dict(doc.get("telemetry") or {}),
        scaling=doc.get("scaling"),
        findings=[_build(Finding, f) for f in doc.get("findings", [])],
        notices=[_build(Notice, n) for n in doc.get("notices", [])],
        hta=doc.get("hta"),
        what_if=doc.get("what_if"),
        hang=doc.get("hang"),
    )


def load(path: Path) -> Analysis:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not a pardiag analysis")
    return from_dict(doc, str(path))
