"""The Analysis' `run` block as typed records: what the job was (world size, backend,
device, command, hosts, versions) and, in `framework`, what its ranks used.

`asdict` gives the same JSON keys and values the block had as a plain dict; `devices`
(plain traces' `deviceProperties`) and the framework's identity (`name`, `version`,
`detected_from`, `loaded`) are now always present, None or {} where the run did not
record them. `from_dict` reads the block of every analysis.json schema version.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_dict(v: Any) -> dict[str, Any] | None:
    return dict(v) if isinstance(v, Mapping) else None


def _opt_list(v: Any) -> list[Any] | None:
    return list(v) if isinstance(v, (list, tuple)) else None


@dataclass(frozen=True)
class FrameworkInfo:
    """What the job used, as rank 0 (or the lowest rank) recorded it in meta.json: the
    DDP modules (each with the kept part of DDP's logging data and `across_ranks`), FSDP,
    AMP, DataLoaders, gradient accumulation, optimizers, parameters, device, threads;
    the peak device memory over all ranks; the framework that stepped the optimizer
    (`name`/`version` None when not recorded: plain torch assumed)."""

    ddp: list[dict[str, Any]] | None = None
    fsdp: dict[str, Any] | None = None
    amp: dict[str, Any] | None = None
    dataloaders: list[dict[str, Any]] | None = None
    grad_accumulation: dict[str, Any] | None = None
    optimizers: list[Any] | None = None
    parameters: dict[str, Any] | None = None
    device: dict[str, Any] | None = None
    threads: dict[str, Any] | None = None
    peak_memory_reserved_bytes_max: int | None = None
    name: str | None = None
    version: str | None = None
    detected_from: Any = None
    loaded: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FrameworkInfo:
        return cls(
            ddp=_opt_list(d.get("ddp")),
            fsdp=_opt_dict(d.get("fsdp")),
            amp=_opt_dict(d.get("amp")),
            dataloaders=_opt_list(d.get("dataloaders")),
            grad_accumulation=_opt_dict(d.get("grad_accumulation")),
            optimizers=_opt_list(d.get("optimizers")),
            parameters=_opt_dict(d.get("parameters")),
            device=_opt_dict(d.get("device")),
            threads=_opt_dict(d.get("threads")),
            peak_memory_reserved_bytes_max=_opt_int(d.get("peak_memory_reserved_bytes_max")),
            name=d["name"] if isinstance(d.get("name"), str) else None,
            version=d["version"] if isinstance(d.get("version"), str) else None,
            detected_from=d.get("detected_from"),
            loaded=dict(d["loaded"]) if isinstance(d.get("loaded"), Mapping) else {},
        )


EMPTY_FRAMEWORK = FrameworkInfo()


@dataclass(frozen=True)
class RunInfo:
    """The job: `path` analysed (home as ~), world size, ranks analysed, backend, device
    type and name, the command (redacted), launcher, hosts, exit code, versions, the
    profiler settings, per-rank clock offsets (rank as a JSON key), the collectors'
    status, the framework facts; `devices`: the node's GPUs from plain traces' metadata
    (None for run directories)."""

    path: str | None = None
    world_size: int | None = None  # None only in an Analysis built without it (the pipeline always sets it)
    ranks_analyzed: int = 0
    backend: str | None = None
    device_type: str | None = None
    device_name: str | None = None
    command: Any = None  # list of words as launched; whatever an older file held otherwise
    launcher: Any = None
    hosts: list[str] = field(default_factory=list)
    exit_code: int | None = None
    versions: dict[str, Any] | None = None
    profiler: dict[str, Any] | None = None
    clock_offsets_us: dict[str, float] = field(default_factory=dict)
    collectors: dict[str, Any] | None = None
    framework: FrameworkInfo | None = None
    devices: list[dict[str, Any]] | None = None

    @property
    def fw(self) -> FrameworkInfo:
        """`framework`, or an empty one when the run recorded none."""
        return self.framework if self.framework is not None else EMPTY_FRAMEWORK

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunInfo:
        """The `run` block of an analysis.json of any schema version (keys missing in
        older files take the defaults an analysis without that fact has)."""
        fw = d.get("framework")
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        kw["world_size"] = _opt_int(d.get("world_size"))
        kw["ranks_analyzed"] = _opt_int(d.get("ranks_analyzed")) or 0
        kw["hosts"] = [str(h) for h in d.get("hosts") or []]
        kw["exit_code"] = _opt_int(d.get("exit_code"))
        kw["versions"] = _opt_dict(d.get("versions"))
        kw["profiler"] = _opt_dict(d.get("profiler"))
        kw["clock_offsets_us"] = dict(d.get("clock_offsets_us") or {})
        kw["collectors"] = _opt_dict(d.get("collectors"))
        kw["framework"] = FrameworkInfo.from_dict(fw) if isinstance(fw, Mapping) else None
        kw["devices"] = _opt_list(d.get("devices"))
        return cls(**kw)
