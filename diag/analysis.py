"""The Analysis: everything renderers show, as frozen dataclasses and as JSON
(`schema: pardiag.analysis`, `schema_version: 2`, see DESIGN.md).

Times are microseconds (`_us`), sizes bytes, ratios 0..1. Nothing is rounded here.
New fields are added, never renamed: others read this JSON. An older version is
upgraded on load by `upgrade_v1`, never by defaults scattered through the readers.

Schema history: 1, the first; 2 adds `summary` (the job-level figures every output
shows, computed once) and `ranks[].step_time_us.profiled_p50`. The nccl, telemetry,
hang and what-if blocks are typed in `pardiag.analysis_blocks`; their older shapes are
upgraded there (`upgrade_blocks`), for either schema.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, TypeVar, get_args

from pardiag.analysis_blocks import (
    Hang,
    NcclSummary,
    Telemetry,
    WhatIf,
    hang_from_dict,
    nccl_from_dict,
    telemetry_from_dict,
    upgrade_blocks,
    what_if_from_dict,
)
from pardiag.analysis_efficiency import Efficiency, efficiency_from_dict
from pardiag.errors import UserError
from pardiag.run_info import FrameworkInfo, RunInfo  # noqa: F401  (FrameworkInfo: for readers)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")

SCHEMA = "pardiag.analysis"
SCHEMA_VERSION = 2

Severity = Literal["high", "medium", "low"]
# `findings[].lever`: DESIGN.md's fixed vocabulary plus its deliberate extensions, a closed
# type (tests and CI depend on the ids). A new id is added here, to DESIGN.md's list and to
# the README's; tests/analyzers/test_rules.py checks that the three agree.
Lever = Literal[
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
    # extensions (DESIGN.md): a straggler whose host signals say why (analyzers/host_causes.py)
    "host_contention",  # its training thread waits for a CPU
    "garbage_collection",  # Python's garbage-collection pauses
    "input_imbalance",  # bigger batches than the other ranks'
    # extensions: memory by category (analyzers/memory_rules.py)
    "memory_imbalance",  # one rank holds far more memory than the others
    "allocator_fragmentation",  # the CUDA allocator reserved far more than it allocated
]
LEVERS: tuple[Lever, ...] = get_args(Lever)
BREAKDOWN_KEYS = ("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle")
PHASE_KEYS = ("dataloader", "forward", "backward", "optimizer", "other", "host")


@dataclass(frozen=True)
class StepTime:
    p50: float | None
    mean: float | None
    max: float | None
    n: int
    p90: float | None = None
    steps_total: int = 0
    disturbed: int = 0
    profiled_p50: float | None = None  # median of the steps inside the profiler's active window (steps.jsonl)


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
    # per profiled step (its number as text), the breakdown's categories (they sum to the
    # step's length): what the share rules test step by step (levers.share_test)
    breakdown_per_step_us: dict[str, dict[str, float]] = field(default_factory=dict)
    # per counted step of steps.jsonl (the last HOST_STEPS_KEPT), its duration ("step")
    # and the host phases it observed
    host_per_step_us: dict[str, dict[str, float]] = field(default_factory=dict)
    # model / hardware FLOPs utilisation of this rank (the `efficiency` block's, None when
    # not known: no shapes, no peak, an older analysis)
    mfu: float | None = None
    hfu: float | None = None
    # bytes by category at the peak and at the step's end, reserved, allocated, RSS
    # (analyzers/memory.py, its MEMORY_DEFINITIONS); None when nothing is known
    memory: dict[str, Any] | None = None


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
    # the backend's own name when it runs the op as another (gloo: `gloo:all_reduce` for a
    # reduce_scatter); `op` is always what the program asked for
    implementation: str | None = None


@dataclass(frozen=True)
class Straggler:
    rank: int
    excess_us_per_step: float  # the straggler's extra work per step
    cause: str
    evidence: list[str]
    held_us_per_step: float | None = None  # how much longer the others wait per step
    held_from: str | None = None  # what held_us_per_step was timed over: "steps.jsonl" or "profiled window"

    @property
    def wait_us(self) -> float:
        """How much longer the others wait per step: ``held_us_per_step``, or the extra
        work where the wait was not timed apart."""
        return self.held_us_per_step if self.held_us_per_step is not None else self.excess_us_per_step


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
    lever: Lever
    severity: Severity
    title: str
    evidence: list[str]
    ranks: list[int]
    est_saving_pct: float | None
    action: dict[str, Any]
    # where est_saving_pct comes from (None: not stated, an older analysis): method
    # ("replay" | "share"), saving_pct, share_saving_pct, replay_error_pct, refused (why
    # the replay was not used), edits (one line each) and factors (name, value, unit,
    # source, measured); `pardiag.display.estimate_of` reads it
    estimate: dict[str, Any] | None = None

    # No check here: an analysis.json written by a newer pardiag, with a lever id this one
    # does not know, still loads. Rules are held to the vocabulary by the registry
    # (analyzers/rules.Row refuses an unknown id when the table is built).


@dataclass(frozen=True)
class Notice:
    """Something missing or suspicious, said plainly to the user."""

    level: Literal["error", "warning", "info"]
    message: str


# What each summary figure includes; stored with the figures so that a reader of
# analysis.json need not guess, and shown by the reports next to the numbers.
SUMMARY_DEFINITIONS = {
    "step_p50_us": "median over ranks of each rank's p50 step time over all undisturbed steps (steps.jsonl); "
                   "with an even number of ranks the mean of the two middle values. Without steps.jsonl: the same "
                   "median of the ranks' profiled window per step (step_p50_source says which)",
    "comm_exposed_ratio": "exposed communication (not hidden under compute), waiting for other ranks included, "
                          "pooled over the job: the sum over ranks of exposed time / the sum of their profiled windows",
    "comm_exposed_transfer_ratio": "exposed communication with the waiting for other ranks left out, pooled: each "
                                   "rank's exposed time scaled by its collectives' transfer / (transfer + wait), "
                                   "summed over ranks / the sum of their profiled windows",
    "breakdown_ratio": "each breakdown category pooled over the job: sum over ranks / sum of profiled windows",
    "step_percentiles_us": "percentiles (linear interpolation) of the job's step time: per undisturbed step seen "
                           "by every rank, the slowest rank's duration (source 'steps'); without steps.jsonl one "
                           "value per rank, its profiled window per step (source 'profiled')",
    "profiled_step_inflation": "profiled step / unprofiled step: per rank, the median step inside the profiler "
                               "window (else the profiled window per step) / its p50 step; for the job, the median "
                               "over ranks of the profiled step / step_p50_us; by_phase_us: per host phase of "
                               "steps.jsonl (untimed: the step less its phases), the median over ranks of its "
                               "median inside the profiler's active window less its median over the counted steps; "
                               "adjacent: the same ratio as job against the counted steps at most 4 before the "
                               "window opens or after it closes (median over ranks); page_faults: the process's "
                               "minor page faults per step, profiled and plain, medians as by_phase_us",
    "mfu": "the job's model FLOPs utilisation, as the efficiency block's mfu (its definitions say how it is "
           "counted); None when not known",
    "hfu": "the job's hardware FLOPs utilisation (recomputed forward passes counted), as efficiency.hfu",
}


@dataclass(frozen=True)
class StepPercentiles:
    """The job's step time distribution; see SUMMARY_DEFINITIONS["step_percentiles_us"]."""

    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    n: int
    source: Literal["steps", "profiled", "none"]


@dataclass(frozen=True)
class Inflation:
    """How much longer a profiled step is than an unprofiled one (1.0: no slowdown)."""

    job: float | None
    by_rank: dict[str, float] = field(default_factory=dict)  # rank (as a JSON key) -> ratio
    # what grew: per host phase of steps.jsonl ("untimed": the step less its phases), the
    # extra time per profiled step (median over ranks of profiled less unprofiled medians)
    by_phase_us: dict[str, float] = field(default_factory=dict)
    # the profiled step over the counted steps just before and after the window (median
    # over ranks): the profiler's own cost, without the drift of a machine whose load changed
    adjacent: float | None = None
    # the process's minor page faults per step (steps.jsonl, Unix): "profiled" and "plain" (the
    # median over ranks of the medians inside the active window and over the counted steps)
    page_faults: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    """The job-level figures every output shows, computed once (analyzers/summary.py);
    what each includes is in `definitions`."""

    step_p50_us: float | None
    step_p50_source: Literal["all steps", "profiled window", "none"]
    comm_exposed_ratio: float | None
    comm_exposed_transfer_ratio: float | None
    breakdown_ratio: dict[str, float]
    step_percentiles_us: StepPercentiles
    profiled_step_inflation: Inflation
    computed_from: Literal["steps", "ranks"]  # "ranks": without step records (schema 1 upgraded, or built by hand)
    definitions: dict[str, str] = field(default_factory=lambda: dict(SUMMARY_DEFINITIONS))
    mfu: float | None = None  # the efficiency block's, for the job
    hfu: float | None = None


@dataclass(frozen=True)
class Analysis:
    run: RunInfo
    ranks: list[RankResult]
    collectives: list[Collective]
    stragglers: list[Straggler]
    process_groups: list[ProcessGroup] = field(default_factory=list)
    nccl: NcclSummary | None = None  # None: no NCCL logs (`{}` in the JSON, as always)
    telemetry: Telemetry | None = None  # None: no telemetry block (`{}` in the JSON)
    scaling: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    hta: dict[str, Any] | None = None
    what_if: WhatIf | None = None  # projected step time if the findings were applied
    hang: Hang | None = None  # from pardiag's records: who timed out in which collective, who never arrived
    summary: Summary | None = None  # None only while constructing: filled in from the ranks
    # what the end of the median step waited on (None: not computed, an older analysis):
    # step, rank, path_us, by_rank_us, by_phase_us, by_collective_us, top_rank, top_phase,
    # top_collective, replay_error_pct; `pardiag.display.critical_path_of` reads it
    critical_path: dict[str, Any] | None = None
    # the whole run over time from steps.jsonl (analyzers/temporal.py `Temporal.to_dict`):
    # steps, job_step_us, change_points, spikes, periodic, warmup, windows, late_us, last_rank
    temporal: dict[str, Any] | None = None
    # the extra profiler window a slowdown triggered, against the first
    # (analyzers/extra_window.py): steps, first_step, trigger, ranks (per rank step_us,
    # breakdown_us and phases_us as [first, second] per profiled step), grew
    extra_window: dict[str, Any] | None = None
    # one profiled step of every rank on one clock (analyzers/job_timeline.py `step_view`):
    # step, ranks (at most 32: per rank start_us, end_us and its segments [start_us, end_us,
    # breakdown category] in order, the earliest start at 0), ranks_total, clock_offsets_us
    step_timeline: dict[str, Any] | None = None
    # model and hardware FLOPs utilisation, achieved TFLOP/s, the peak used and where it
    # comes from, samples or tokens per second (analyzers/efficiency.py); None: no trace,
    # or an older analysis
    efficiency: Efficiency | None = None

    def __post_init__(self) -> None:
        # An Analysis built without a summary (by hand, or a schema-1 file) gets the one
        # computed from its ranks, so that every reader finds the same figures.
        if self.summary is None:
            from pardiag.analyzers.summary import summary_from_ranks

            object.__setattr__(self, "summary", summary_from_ranks(self.ranks))

    @property
    def job_summary(self) -> Summary:
        """The summary, typed as present (it always is after construction)."""
        assert self.summary is not None
        return self.summary

    def to_dict(self) -> dict[str, Any]:
        from pardiag import __version__

        d: dict[str, Any] = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "pardiag_version": __version__}
        d.update(asdict(self))
        d["nccl"] = d["nccl"] or {}  # a run without the block has always written {}
        d["telemetry"] = d["telemetry"] or {}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False, default=_json_default)


def _json_default(o: Any) -> Any:
    if is_dataclass(o):
        return asdict(o)  # type: ignore[arg-type]
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _build(cls: type[_D], d: Mapping[str, Any]) -> _D:
    known = {f.name: f for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def _summary(d: Mapping[str, Any]) -> Summary:
    s = dict(d)
    s["step_percentiles_us"] = _build(StepPercentiles, s["step_percentiles_us"])
    s["profiled_step_inflation"] = _build(Inflation, s["profiled_step_inflation"])
    s["definitions"] = dict(SUMMARY_DEFINITIONS)  # this pardiag's words for the same figures
    return _build(Summary, s)


def _finding(d: Mapping[str, Any]) -> Finding:
    f = dict(d)
    est = f.get("estimate")
    f["estimate"] = dict(est) if isinstance(est, Mapping) and est else None  # absent: an older pardiag
    return _build(Finding, f)


def upgrade_v1(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Schema 1 to 2, the document part: `summary` did not exist. It is left out here, so
    that the Analysis computes it from the ranks (`computed_from: "ranks"`: the job's step
    percentiles then come from the profiled windows, as schema 1 kept no per-step
    records). `from_dict` then has the advisor recompute its findings and what-if from
    that summary (`analyzers.summary.readvise`): schema 1 advised on other figures."""
    out = dict(doc)
    out.pop("summary", None)
    out["schema_version"] = 2
    return out


def from_dict(doc: Mapping[str, Any], source: str = "analysis") -> Analysis:
    if doc.get("schema") != SCHEMA:
        raise UserError(f"{source}: not a pardiag analysis")
    v = doc.get("schema_version")
    if not isinstance(v, int) or v > SCHEMA_VERSION:
        raise UserError(f"{source}: analysis schema version {v} is newer than this pardiag ({SCHEMA_VERSION}); upgrade pardiag")
    if v < 2:
        doc = upgrade_v1(doc)
    elif not isinstance(doc.get("summary"), Mapping):
        raise UserError(f"{source}: schema version {v} analysis without its summary block")
    doc = upgrade_blocks(doc)
    ranks = []
    for r in doc.get("ranks", []):
        r = dict(r)
        r["step_time_us"] = _build(StepTime, r.get("step_time_us") or {"p50": None, "mean": None, "max": None, "n": 0})
        r["gpu"] = _build(GpuTime, r["gpu"]) if r.get("gpu") else None
        ranks.append(_build(RankResult, r))
    a = Analysis(
        run=RunInfo.from_dict(doc.get("run") or {}),
        ranks=ranks,
        collectives=[_build(Collective, c) for c in doc.get("collectives", [])],
        stragglers=[_build(Straggler, s) for s in doc.get("stragglers", [])],
        process_groups=[_build(ProcessGroup, p) for p in doc.get("process_groups", [])],
        nccl=nccl_from_dict(doc.get("nccl") or {}),
        telemetry=telemetry_from_dict(doc.get("telemetry") or {}),
        scaling=doc.get("scaling"),
        findings=[_finding(f) for f in doc.get("findings", [])],
        notices=[_build(Notice, n) for n in doc.get("notices", [])],
        hta=doc.get("hta"),
        what_if=what_if_from_dict(doc.get("what_if")),
        hang=hang_from_dict(doc["hang"]) if doc.get("hang") else None,
        summary=_summary(doc["summary"]) if "summary" in doc else None,  # None: computed from the ranks
        critical_path=dict(cp) if isinstance(cp := doc.get("critical_path"), Mapping) and cp else None,
        temporal=dict(tp) if isinstance(tp := doc.get("temporal"), Mapping) and tp else None,
        extra_window=dict(xw) if isinstance(xw := doc.get("extra_window"), Mapping) and xw else None,
        step_timeline=dict(st) if isinstance(st := doc.get("step_timeline"), Mapping) and st else None,
        efficiency=efficiency_from_dict(doc.get("efficiency")),
    )
    if v < 2:
        from pardiag.analyzers.summary import readvise

        a = readvise(a)
    return a


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
