"""ranks/<rank>/meta.json as a typed record: what one rank used and how it ended.

The collector writes plain dicts (it runs inside the training and must stay cheap);
readers go through `parse_meta` (via `rundir.read_meta`) and get a frozen `RankMeta`.
The parts pardiag reads field by field are typed sub-records; the rest stay mappings.
Nothing is dropped: keys this pardiag does not know (a newer minor writer) are kept in
each record's `extra`, and `to_dict()` gives the document back.

Format history (`format_version`):
  1  the first; exception messages and tracebacks were written as the job raised them
  2  `exit.message`, `exit.traceback` and `errors[].error` / `errors[].traceback` are
     redacted when written (secrets, the home directory), see `redact_message`

An older version is upgraded on read, one step at a time (`UPGRADES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from pardiag.redact import safe_redact

# --------------------------------------------------------------------------- records

_R = TypeVar("_R", bound="_Record")


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_num(v: Any) -> float | int | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _opt_bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _mapping(v: Any) -> Mapping[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _opt_mapping(v: Any) -> Mapping[str, Any] | None:
    return dict(v) if isinstance(v, Mapping) else None


def _any(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class _Record:
    """A JSON object with typed fields for the keys pardiag reads. `keys`: the keys the
    document had, in order, so that `to_dict` gives back what was read (a key that was
    absent stays absent); `extra`: the keys no field names, and the value of a typed
    key that is not of its type (the field reads None; the value is not lost)."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    keys: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_mapping(cls: type[_R], d: Mapping[str, Any]) -> _R:
        names = {f.name for f in fields(cls)} - {"extra", "keys"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in d.items():
            if k not in names:
                extra[k] = v
                continue
            kwargs[k] = cls._TYPES.get(k, _any)(v)
            if kwargs[k] is None and v is not None:
                extra[k] = v  # not of the field's type: kept as it was
        return cls(**kwargs, extra=extra, keys=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, as read (values of typed fields as typed)."""
        names = {f.name for f in fields(self)} - {"extra", "keys"}
        out: dict[str, Any] = {}
        for k in self.keys:
            if k in self.extra:
                out[k] = self.extra[k]
            elif k in names:
                out[k] = _plain(getattr(self, k))
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out


def _plain(v: Any) -> Any:
    if isinstance(v, _Record):
        return v.to_dict()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return dict(v)
    return v


@dataclass(frozen=True)
class ExitInfo(_Record):
    """How the rank ended: `status` "running" (no exit seen: killed, or still going),
    "exited" or "exception" (with the exception's `type` and redacted `message`)."""

    status: str = "running"
    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    step: int | None = None

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "status": lambda v: v if isinstance(v, str) else "running",
        "type": _opt_str, "message": _opt_str, "traceback": _opt_str, "step": _opt_int,
    }


@dataclass(frozen=True)
class DeviceInfo(_Record):
    """The device the rank trained on (`type` "cuda" or "cpu")."""

    type: str | None = None
    index: int | None = None
    name: str | None = None
    capability: str | None = None
    uuid: str | None = None
    cuda_visible_devices: Any = None  # as the variable was set (a string; a list from some writers)
    total_memory_bytes: int | None = None
    max_memory_allocated_bytes: int | None = None
    max_memory_reserved_bytes: int | None = None
    cuda_available: bool | None = None

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "type": _opt_str, "index": _opt_int, "name": _opt_str, "capability": _opt_str, "uuid": _opt_str,
        "total_memory_bytes": _opt_int, "max_memory_allocated_bytes": _opt_int,
        "max_memory_reserved_bytes": _opt_int, "cuda_available": _opt_bool,
    }


@dataclass(frozen=True)
class DdpModule(_Record):
    """One DistributedDataParallel module: its settings, and DDP's own runtime record
    (`logging`, `_get_ddp_logging_data()`)."""

    find_unused_parameters: bool | None = None
    static_graph: bool | None = None
    gradient_as_bucket_view: bool | None = None
    bucket_cap_mb: float | int | None = None
    comm_hook: str | None = None
    bucket_count: int | None = None
    bucket_sizes_bytes: Any = None
    unused_parameter_size_max: int | None = None  # largest unused size at any write of meta.json
    args: Mapping[str, Any] = field(default_factory=dict)
    logging: Mapping[str, Any] = field(default_factory=dict)

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "find_unused_parameters": _opt_bool, "static_graph": _opt_bool, "gradient_as_bucket_view": _opt_bool,
        "bucket_cap_mb": _opt_num, "comm_hook": _opt_str, "bucket_count": _opt_int,
        "unused_parameter_size_max": _opt_int, "args": _mapping, "logging": _mapping,
    }

    @property
    def unused_parameter_size(self) -> int | None:
        return _opt_int(self.logging.get("unused_parameter_size"))

    @property
    def iteration(self) -> int | None:
        return _opt_int(self.logging.get("iteration"))


@dataclass(frozen=True)
class DataLoaderInfo(_Record):
    """One DataLoader the rank iterated (its class name stays in `extra["class"]`)."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    batch_sampler_batch_size: int | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    drop_last: bool | None = None
    dataset: str | None = None
    dataset_len: int | None = None
    sampler: str | None = None
    multiprocessing_context: str | None = None
    iterations_started: int | None = None

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "num_workers": _opt_int, "pin_memory": _opt_bool, "batch_size": _opt_int,
        "batch_sampler_batch_size": _opt_int, "persistent_workers": _opt_bool, "prefetch_factor": _opt_int,
        "drop_last": _opt_bool, "dataset": _opt_str, "dataset_len": _opt_int, "sampler": _opt_str,
        "multiprocessing_context": _opt_str, "iterations_started": _opt_int,
    }


@dataclass(frozen=True)
class FrameworkIdent(_Record):
    """The framework whose code stepped the optimizer (HF Trainer, Lightning, ...):
    `name`/`version` None when not known yet; `loaded`: known packages imported."""

    name: str | None = None
    version: str | None = None
    detected_from: Any = None
    loaded: Mapping[str, Any] = field(default_factory=dict)

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "name": _opt_str, "version": _opt_str, "loaded": _mapping,
    }


@dataclass(frozen=True)
class ProfilerInfo(_Record):
    """The rank's profiler window: `status` ok / partial / failed / skipped, and why."""

    status: str | None = None
    reason: str | None = None

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"status": _opt_str, "reason": _opt_str}


@dataclass(frozen=True)
class ErrorEntry(_Record):
    """A failure inside the collector (that part was switched off): where, the
    redacted error text, the step, the redacted traceback."""

    where: str | None = None
    error: str | None = None
    step: int | None = None
    traceback: str | None = None

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "where": _opt_str, "error": _opt_str, "step": _opt_int, "traceback": _opt_str,
    }


def _records(cls: type[_R]) -> Callable[[Any], tuple[_R, ...] | None]:
    def conv(v: Any) -> tuple[_R, ...] | None:
        if not isinstance(v, (list, tuple)):
            return None
        return tuple(cls.from_mapping(x) for x in v if isinstance(x, Mapping))

    return conv


def _record(cls: type[_R]) -> Callable[[Any], _R | None]:
    return lambda v: cls.from_mapping(v) if isinstance(v, Mapping) else None


def _opt_list(v: Any) -> tuple[Any, ...] | None:
    return tuple(v) if isinstance(v, (list, tuple)) else None


@dataclass(frozen=True)
class RankMeta(_Record):
    """One rank's meta.json. `format_version` is the version the file was written in
    (an older one has been upgraded to this pardiag's on read). A fact the collector
    could not read is None; a list never recorded is None too (as in the file)."""

    format: str = "pardiag.rank-meta"
    format_version: int = 0
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    rank_source: str | None = None
    backend: str | None = None
    host: str | None = None
    pid: int | None = None
    started_ns: int | None = None
    updated_ns: int | None = None
    steps_completed: int | None = None
    step_source: str | None = None
    argv: tuple[str, ...] | None = None
    exit: ExitInfo = field(default_factory=ExitInfo)
    ddp: tuple[DdpModule, ...] | None = None
    fsdp: Mapping[str, Any] | None = None
    amp: Mapping[str, Any] | None = None
    # `first`: the first tensor the first DDP forward got (shape, dtype): what one sample is
    inputs: Mapping[str, Any] | None = None
    dataloaders: tuple[DataLoaderInfo, ...] | None = None
    grad_accumulation: Mapping[str, Any] | None = None
    optimizers: tuple[Any, ...] | None = None
    parameters: Mapping[str, Any] | None = None
    device: DeviceInfo | None = None
    versions: Mapping[str, Any] | None = None
    threads: Mapping[str, Any] | None = None
    framework: FrameworkIdent | None = None
    profiler: ProfilerInfo | None = None
    collectors: Mapping[str, Any] | None = None
    errors: tuple[ErrorEntry, ...] = ()

    _TYPES: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "format": lambda v: str(v), "format_version": lambda v: _opt_int(v) or 0,
        "rank": _opt_int, "world_size": _opt_int, "local_rank": _opt_int, "rank_source": _opt_str,
        "backend": _opt_str, "host": _opt_str, "pid": _opt_int, "started_ns": _opt_int, "updated_ns": _opt_int,
        "steps_completed": _opt_int, "step_source": _opt_str,
        "argv": lambda v: tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else None,
        "exit": lambda v: ExitInfo.from_mapping(v) if isinstance(v, Mapping) else ExitInfo(),
        "ddp": _records(DdpModule), "fsdp": _opt_mapping, "amp": _opt_mapping, "inputs": _opt_mapping,
        "dataloaders": _records(DataLoaderInfo), "grad_accumulation": _opt_mapping, "optimizers": _opt_list,
        "parameters": _opt_mapping, "device": _record(DeviceInfo), "versions": _opt_mapping,
        "threads": _opt_mapping, "framework": _record(FrameworkIdent), "profiler": _record(ProfilerInfo),
        "collectors": _opt_mapping,
        "errors": lambda v: _records(ErrorEntry)(v) or (),
    }

    def fact(self, key: str) -> Any:
        """A top-level entry as plain JSON (lists, dicts), as the file has it; None if absent."""
        if key not in self.keys and key not in self.extra:
            return None
        return self.to_dict().get(key)

    def to_dict(self) -> dict[str, Any]:
        """The document in this pardiag's format (`format_version` the current one)."""
        from pardiag import rundir

        out = super().to_dict()
        out["format"] = rundir.META_FORMAT
        out["format_version"] = rundir.META_VERSION
        return out


# --------------------------------------------------------------------------- reading


def _redact_v1(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1 to 2: version 1 wrote exception messages and tracebacks as raised, so
    secrets and home paths in them are redacted here, on read, as version 2 does on
    write (`exit.message`, `exit.traceback`, `errors[].error`, `errors[].traceback`)."""
    out = dict(doc)
    ex = out.get("exit")
    if isinstance(ex, Mapping):
        ex = dict(ex)
        for k in ("message", "traceback"):
            if isinstance(ex.get(k), str):
                ex[k] = safe_redact(ex[k])
        out["exit"] = ex
    errs = out.get("errors")
    if isinstance(errs, list):
        new = []
        for e in errs:
            if isinstance(e, Mapping):
                e = dict(e)
                for k in ("error", "traceback"):
                    if isinstance(e.get(k), str):
                        e[k] = safe_redact(e[k])
            new.append(e)
        out["errors"] = new
    out["format_version"] = 2
    return out


# version -> the step that turns a document of that version into the next one
UPGRADES: Mapping[int, Callable[[Mapping[str, Any]], dict[str, Any]]] = {1: _redact_v1}


def parse_meta(doc: Any, path: Path | str) -> RankMeta:
    """A meta.json document (as json.load gave it) as a RankMeta, upgraded to this
    pardiag's version. Raises rundir.RunDirError (one line) for a document that is not
    a rank meta, has no version, or is newer than this pardiag."""
    from pardiag import rundir

    if not isinstance(doc, Mapping) or doc.get("format") != rundir.META_FORMAT:
        raise rundir.RunDirError(f"{path}: not a {rundir.META_FORMAT} file")
    v = doc.get("format_version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise rundir.RunDirError(f"{path}: format_version missing")
    if v > rundir.META_VERSION:
        raise rundir.RunDirError(
            f"{path}: format version {v} is newer than this pardiag understands ({rundir.META_VERSION}); "
            "upgrade pardiag"
        )
    cur: Mapping[str, Any] = doc
    while cur["format_version"] < rundir.META_VERSION:
        step = UPGRADES.get(cur["format_version"])
        if step is None:  # no version before 1 was ever written
            raise rundir.RunDirError(f"{path}: format version {cur['format_version']} is not known")
        cur = step(cur)
    meta = RankMeta.from_mapping(cur)
    return _with_version(meta, v)


def _with_version(meta: RankMeta, v: int) -> RankMeta:
    from dataclasses import replace

    return replace(meta, format_version=v)
