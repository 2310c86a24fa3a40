"""The Analysis' blocks about the NCCL logs, GPU telemetry, a hang and the what-if
projection, as frozen dataclasses (see `pardiag.analysis` for the whole contract).

Every key these blocks ever wrote is still written with the same value; keys are only
added. A block a run does not have is None in the Analysis (`nccl`, `telemetry`,
`hang`, `what_if`); in the JSON `nccl` and `telemetry` then stay `{}` as they always
were. An older shape of a block is brought up to date by `upgrade_blocks`, in one place,
before the blocks are built: readers never test for missing keys.

A hang has one type, `Hang`, whichever diagnosed it: pardiag's own records
(`source: "pardiag"`, analyzers/hang.py: the ranks' exit records and step records) or
the NCCL logs (`source: "nccl"`, stored in `nccl.hang`: PyTorch's watchdog lines).
Both fill the common fields every reader shows (summary, step when known, the ranks
that waited with their op, the ranks that never arrived with why, what to collect
next); the NCCL-only parts are None for pardiag's. When the run's `flight/` folder holds
flight-recorder dumps, `flight` carries what they say (analyzers/flight_recorder.py) and the
verdict is merged: `source` names the evidence that decided it (`"flight_recorder"` when the
dumps name a culprit) and `sources` every one that was read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Mapping, Sequence

HangSource = Literal["pardiag", "nccl", "flight_recorder"]
HangKind = Literal["collective_stuck", "desync"]


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `d` that are fields of `cls` (a newer pardiag may write more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def _ints(xs: Any) -> list[int]:
    return [int(x) for x in xs or ()]


# --------------------------------------------------------------------------- hang


@dataclass(frozen=True)
class HangWait:
    """A rank that waited in a collective until it timed out (or failed in it)."""

    rank: int | None
    op: str | None  # lower case: "allreduce", "recv", "barrier"; None when the message names none
    step: int | None = None  # the training step it was in (pardiag's records; NCCL logs do not say)
    timeout_ms: int | None = None
    message: str = ""  # pardiag: the exception's message (first 300 characters); NCCL: where it stopped


@dataclass(frozen=True)
class HangLate:
    """A rank that never arrived at the collective the others waited in."""

    rank: int
    reason: str
    last_step: int | None = None  # pardiag: its last finished step (None: none, or unknown)
    ended: str | None = None  # pardiag: how its process ended ("exited", "running", "no record")


@dataclass(frozen=True)
class StuckRank:
    """NCCL: one rank's watchdog timeout line, with its progress when it logged one."""

    rank: int | None
    process_group: str
    seq: int | None
    op_type: str | None
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    last_enqueued: int | None
    last_completed: int | None


@dataclass(frozen=True)
class HangGroup:
    """NCCL: the diagnosis of one process group whose collectives timed out."""

    process_group: str
    seq: int | None
    op_type: str | None
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    kind: HangKind
    ranks_timed_out: list[int]
    ranks_behind: list[int]
    ranks_without_timeout: list[int] | None  # None: not the world group, or world size unknown


@dataclass(frozen=True)
class CollLaggard:
    """NCCL: a process whose last COLL opCount is behind the others' on a communicator
    of the same size."""

    host: str | None
    pid: int | None
    ranks: list[int]
    nranks: int
    last_op_count: int
    behind_by: int


@dataclass(frozen=True)
class FlightCall:
    """Flight recorder: one collective as one rank recorded it."""

    seq: int  # collective_seq_id (p2p_seq_id for send/recv), per process group, from 1
    op: str  # "all_reduce", "barrier", "send 0->1"
    state: str  # "completed", or c10d's state when not known to be ("scheduled", "started")
    input_sizes: list[list[int]] = field(default_factory=list)
    output_sizes: list[list[int]] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)  # "function (file:line)", innermost first
    timeout_ms: int | None = None
    rank: int | None = None
    user_frame: str | None = None  # the innermost frame outside torch: where the job made the call


@dataclass(frozen=True)
class FlightRank:
    """Flight recorder: one rank's last completed and last entered collective in a group."""

    rank: int
    last_completed: FlightCall | None
    last_entered: FlightCall | None


@dataclass(frozen=True)
class FlightMismatch:
    """Flight recorder: the first collective the ranks of a group disagree on. `match_state`
    is torch fr_trace's MatchState name (COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH,
    COLLECTIVE_DTYPE_MISMATCH, COLLECTIVE_STATE_MISMATCH), or MISSING_RANKS when some ranks
    never entered it."""

    seq: int
    match_state: str
    reference_rank: int
    culprit_ranks: list[int]
    expected: FlightCall  # the reference rank's call
    found: list[FlightCall] = field(default_factory=list)  # the culprits' calls (rank set)
    detail: str = ""


@dataclass(frozen=True)
class FlightGroup:
    """Flight recorder: one process group across the dumps."""

    process_group: str
    ranks: list[int]
    dumped_ranks: list[int]
    missing_dumps: list[int]
    last: list[FlightRank]
    first_mismatch: FlightMismatch | None
    culprit_ranks: list[int]
    never_arrived: list[int]
    stuck_frames: list[str] = field(default_factory=list)  # the stuck call's Python frames
    stuck_user_frame: str | None = None  # the innermost of them outside torch


@dataclass(frozen=True)
class FlightRecord:
    """What the run's flight-recorder dumps say; `notes` name every file or rank left out."""

    summary: str
    files: list[str]
    ranks_dumped: list[int]
    missing_ranks: list[int]
    version: str | None
    groups: list[FlightGroup]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _call(d: Mapping[str, Any] | None) -> FlightCall | None:
    return FlightCall(**_known(FlightCall, d)) if d else None


def flight_from_dict(d: Mapping[str, Any] | None) -> FlightRecord | None:
    if not d:
        return None
    groups = []
    for g in d.get("groups") or ():
        x = _known(FlightGroup, g)
        x["last"] = [FlightRank(rank=int(r["rank"]), last_completed=_call(r.get("last_completed")),
                                last_entered=_call(r.get("last_entered"))) for r in g.get("last") or ()]
        m = g.get("first_mismatch")
        if m:
            m2 = _known(FlightMismatch, m)
            m2["expected"] = _call(m["expected"])
            m2["found"] = [_call(c) for c in m.get("found") or ()]
            x["first_mismatch"] = FlightMismatch(**m2)
        groups.append(FlightGroup(**x))
    f = _known(FlightRecord, d)
    f["groups"] = groups
    return FlightRecord(**f)


@dataclass(frozen=True)
class Hang:
    """Who timed out in which collective and who never arrived; see the module docstring."""

    source: HangSource
    summary: str
    step: int | None = None
    waited: list[HangWait] = field(default_factory=list)
    late: list[HangLate] = field(default_factory=list)
    collect_next: list[str] = field(default_factory=list)
    # NCCL only (None from pardiag's records)
    kind: HangKind | None = None
    world_size: int | None = None
    process_groups: list[HangGroup] | None = None
    ranks_stuck: list[StuckRank] | None = None
    never_arrived: list[int] | None = None  # None: cannot be told (world size unknown)
    coll_laggards: list[CollLaggard] | None = None
    first_error: str | None = None
    flight_recorder: list[str] | None = None
    env: dict[str, str] | None = None
    doc: str | None = None
    # the flight-recorder dumps (None: none in the run) and every source read for the verdict
    flight: FlightRecord | None = None
    sources: list[HangSource] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hang_from_dict(d: Mapping[str, Any]) -> Hang:
    """A hang block of the current shape (`upgrade_blocks` brings older ones to it)."""
    h = _known(Hang, d)
    h["waited"] = [HangWait(**_known(HangWait, w)) for w in d.get("waited") or ()]
    h["late"] = [HangLate(**_known(HangLate, x)) for x in d.get("late") or ()]
    h["collect_next"] = [str(x) for x in d.get("collect_next") or ()]
    if d.get("process_groups") is not None:
        h["process_groups"] = [HangGroup(**_known(HangGroup, g)) for g in d["process_groups"]]
    if d.get("ranks_stuck") is not None:
        h["ranks_stuck"] = [StuckRank(**_known(StuckRank, r)) for r in d["ranks_stuck"]]
    if d.get("coll_laggards") is not None:
        h["coll_laggards"] = [CollLaggard(**_known(CollLaggard, c)) for c in d["coll_laggards"]]
    if d.get("env") is not None:
        h["env"] = dict(d["env"])
    h["flight"] = flight_from_dict(d.get("flight"))
    h["sources"] = [str(x) for x in d.get("sources") or ()]
    return Hang(**h)


def nccl_waited(stuck: Sequence[StuckRank]) -> list[HangWait]:
    """NCCL's stuck ranks as the common `waited` rows: op in lower case, where it stopped."""
    return [HangWait(rank=s.rank, op=s.op_type.lower() if s.op_type else None, timeout_ms=s.timeout_ms,
                     message=f"{s.op_type or 'collective'} SeqNum {s.seq} in process group {s.process_group}"
                             + (f", ran for {s.ran_for_ms} ms" if s.ran_for_ms is not None else ""))
            for s in stuck]


def nccl_late(groups: Sequence[HangGroup], never: Sequence[int] | None) -> list[HangLate]:
    """NCCL's ranks that never arrived as the common `late` rows, with why each is named."""
    behind = {r for g in groups for r in g.ranks_behind}
    return [HangLate(rank=r, reason="at an earlier SeqNum than the others (desync)" if r in behind
                     else "no timeout line in the NCCL logs: it never reached the collective")
            for r in never or ()]


# --------------------------------------------------------------------------- nccl


@dataclass(frozen=True)
class NcclSummary:
    """The `nccl` block: NCCL's setup per host, its problems and the hang diagnosis,
    condensed from the parsed logs (analyzers/nccl/summary.py)."""

    files: int
    processes: int
    world_size: int | None
    nnodes: int | None
    multi_node: bool | None
    hosts: list[dict[str, Any]]  # the parser's per-host records (versions, networks, env, ...)
    transports: dict[str, dict[str, int]]  # host -> transport -> connections
    init_s_max: float | None
    warnings: list[str]
    errors: list[str]
    hang: Hang | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def nccl_from_dict(d: Mapping[str, Any]) -> NcclSummary | None:
    """The block from JSON; None for the `{}` of a run without NCCL logs."""
    if not d:
        return None
    n = _known(NcclSummary, d)
    n["hosts"] = [dict(h) if isinstance(h, Mapping) else {"host": str(h)} for h in d.get("hosts") or ()]
    n["transports"] = {str(h): {str(k): int(v) for k, v in (t or {}).items()} for h, t in (d.get("transports") or {}).items()}
    n["warnings"] = [str(x) for x in d.get("warnings") or ()]
    n["errors"] = [str(x) for x in d.get("errors") or ()]
    n["hang"] = hang_from_dict(d["hang"]) if d.get("hang") else None
    return NcclSummary(**n)


# --------------------------------------------------------------------------- telemetry


@dataclass(frozen=True)
class GpuTelemetry:
    """One GPU's NVML samples, summarised (analyzers/telemetry.py says the units)."""

    host: str | None
    gpu: int
    uuid: str | None
    name: str | None
    ranks: list[int]
    samples: int
    span_us: float
    util_gpu_ratio_mean: float | None
    util_gpu_ratio_p50: float | None
    util_mem_ratio_mean: float | None
    sm_clock_mean_mhz: float | None
    sm_clock_busy_mean_mhz: float | None
    sm_clock_min_mhz: float | None
    sm_clock_max_mhz: float | None
    sm_clock_ratio: float | None
    power_mean_w: float | None
    power_max_w: float | None
    power_limit_w: float | None
    power_ratio: float | None
    temperature_max_c: float | None
    temperature_mean_c: float | None
    memory_used_max_bytes: int | None
    memory_total_bytes: int | None
    memory_headroom_bytes: int | None
    memory_headroom_ratio: float | None
    pcie_tx_mean_gbps: float | None
    pcie_rx_mean_gbps: float | None
    nvlink_tx_mean_gbps: float | None
    nvlink_rx_mean_gbps: float | None
    clock_event_samples: int
    busy_samples: int
    throttle_share: dict[str, float]  # clock event reason -> share of the samples that have events
    slowdown_share: float | None  # busy samples held down by a thermal/power/hardware reason
    sm_clock_slowdown_mean_mhz: float | None
    # per-sample series by figure, drawn as sparklines where a block carries them (the
    # analysis keeps summaries only, so that a long job's analysis.json stays small)
    series: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostTelemetry:
    """One host's GPUs together."""

    gpus: int
    ranks: list[int]
    unassigned_gpus: list[int]
    samples: int
    util_gpu_ratio_mean: float | None
    power_total_mean_w: float | None
    temperature_max_c: float | None
    throttled_gpus: list[int]
    drivers: list[str]


@dataclass(frozen=True)
class RankGpu:
    """The GPU a rank ran on."""

    host: str | None
    gpu: int
    uuid: str | None


@dataclass(frozen=True)
class Telemetry:
    """The `telemetry` block (analyzers/telemetry.py `telemetry_block`). `status` is
    "absent" for a run that recorded none, with the reason."""

    source: str  # "nvml"
    status: Literal["ok", "absent"]
    reason: str | None
    gpus: list[GpuTelemetry]
    hosts: dict[str, HostTelemetry]
    ranks: dict[str, RankGpu]  # rank (as a JSON key) -> its GPU
    problems: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def telemetry_from_dict(d: Mapping[str, Any]) -> Telemetry | None:
    """The block from JSON; None for the `{}` of a run without a telemetry block."""
    if not d:
        return None
    t = _known(Telemetry, d)
    t["gpus"] = [GpuTelemetry(**{**_known(GpuTelemetry, g), "ranks": _ints(g.get("ranks")),
                                 "throttle_share": dict(g.get("throttle_share") or {}),
                                 "series": {str(k): [float(x) for x in v] for k, v in (g.get("series") or {}).items()}})
                 for g in d.get("gpus") or ()]
    t["hosts"] = {str(h): HostTelemetry(**_known(HostTelemetry, s)) for h, s in (d.get("hosts") or {}).items()}
    t["ranks"] = {str(r): RankGpu(**_known(RankGpu, g)) for r, g in (d.get("ranks") or {}).items()}
    t["problems"] = [str(x) for x in d.get("problems") or ()]
    return Telemetry(**t)


# --------------------------------------------------------------------------- what-if


@dataclass(frozen=True)
class WhatIfRow:
    """One finding's projected step time."""

    lever: str
    title: str
    step_us: float
    saving_pct: float


@dataclass(frozen=True)
class WhatIf:
    """The projected step time per finding and with all of them (analyzers/levers.py)."""

    step_us: float
    findings: list[WhatIfRow]
    all_step_us: float
    all_saving_pct: float
    assumption: str
    # how the figures were projected (None: not stated, an older analysis): "replay", the
    # profiled window replayed with the findings' edits (all_* from one replay with every
    # edit together), or "share", a share of the step times a constant
    method: Literal["replay", "share"] | None = None
    replay_error_pct: float | None = None  # the replay against the measured step
    refused: str | None = None  # why the replay was not used (method "share")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def what_if_from_dict(d: Mapping[str, Any] | None) -> WhatIf | None:
    if not d:
        return None
    w = _known(WhatIf, d)
    w["findings"] = [WhatIfRow(**_known(WhatIfRow, f)) for f in d.get("findings") or ()]
    return WhatIf(**w)


# --------------------------------------------------------------------------- older shapes

_GPU_UNKNOWN: dict[str, Any] = {f.name: None for f in fields(GpuTelemetry)} | {
    "ranks": [], "samples": 0, "span_us": 0.0, "clock_event_samples": 0, "busy_samples": 0, "throttle_share": {},
    "series": {}}
_HOST_UNKNOWN: dict[str, Any] = {"gpus": 0, "ranks": [], "unassigned_gpus": [], "samples": 0, "util_gpu_ratio_mean": None,
                                 "power_total_mean_w": None, "temperature_max_c": None, "throttled_gpus": [],
                                 "drivers": []}
_NCCL_UNKNOWN: dict[str, Any] = {"files": 0, "processes": 0, "world_size": None, "nnodes": None, "multi_node": None,
                                 "hosts": [], "transports": {}, "init_s_max": None, "warnings": [], "errors": [],
                                 "hang": None}


def _upgrade_hang(d: Mapping[str, Any], source: HangSource) -> dict[str, Any]:
    h = dict(d)
    if "source" not in h:  # NCCL's diagnosis had no source and none of the common rows
        h["source"] = source
    if h["source"] == "nccl" and "waited" not in h:
        stuck = [StuckRank(**_known(StuckRank, {**{f.name: None for f in fields(StuckRank)}, **r}))
                 for r in h.get("ranks_stuck") or ()]
        groups = [HangGroup(**_known(HangGroup, {"ranks_behind": [], **g})) for g in h.get("process_groups") or ()]
        h["waited"] = [asdict(w) for w in nccl_waited(stuck)]
        h["late"] = [asdict(x) for x in nccl_late(groups, h.get("never_arrived"))]
    h.setdefault("summary", "the job hung")
    h.setdefault("sources", [h["source"]])  # before the flight recorder was read
    h.setdefault("flight", None)
    return h


def upgrade_blocks(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The nccl, telemetry, hang and what-if blocks of an older analysis.json in today's
    shape: a hang diagnosed from the NCCL logs gains `source: "nccl"` and the common
    `waited`/`late` rows (derived from `ranks_stuck` and `never_arrived`); keys that an
    older pardiag did not write yet (per-GPU figures, NCCL counts) are stated as unknown
    (None, or zero/empty for counts and lists). Blocks already current pass unchanged."""
    out = dict(doc)
    if isinstance(doc.get("hang"), Mapping) and doc["hang"]:
        out["hang"] = _upgrade_hang(doc["hang"], "pardiag")
    nccl = doc.get("nccl")
    if isinstance(nccl, Mapping) and nccl:
        n = {**_NCCL_UNKNOWN, **nccl}
        if isinstance(n["hang"], Mapping) and n["hang"]:
            n["hang"] = _upgrade_hang(n["hang"], "nccl")
        out["nccl"] = n
    tel = doc.get("telemetry")
    if isinstance(tel, Mapping) and tel:
        t = {"source": "nvml", "reason": None, "gpus": [], "hosts": {}, "ranks": {}, "problems": [], **tel}
        t.setdefault("status", "ok" if t["gpus"] else "absent")
        t["gpus"] = [{**_GPU_UNKNOWN, **g} for g in t["gpus"]]
        t["hosts"] = {h: {**_HOST_UNKNOWN, **s} for h, s in t["hosts"].items()}
        t["ranks"] = {r: {"host": None, "uuid": None, **g} for r, g in t["ranks"].items()}
        out["telemetry"] = t
    return out
