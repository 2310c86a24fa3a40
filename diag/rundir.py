"""The run directory: the one place that knows file names, layout and on-disk formats.

Collectors write through this module, analyzers and renderers read through it.
It imports nothing heavy (no torch, no rich) because it is loaded inside every
training process.

Layout (format version 1); `ENTRIES` lists the same, and `pardiag merge` joins
per-node directories from that list::

    RUN/
      manifest.json                 written last, atomically, by the launcher(s)
      launchers/<host>.<pid>.json   one record per `pardiag run` process (several nodes)
      ranks/<rank>/trace.json.gz    Kineto trace of the profiled window (trace.json until
                                    the launcher has compressed it)
      ranks/<rank>/trace-2.json.gz  the extra window recorded when the job slowed down
      ranks/<rank>/steps.jsonl      one line per training step, every step (versioned per
                                    line; the format is `step_records`)
      ranks/<rank>/meta.json        what the rank used (DDP, FSDP, AMP, DataLoader, ...) and how
                                    it ended; read as a typed RankMeta (pardiag.rank_meta, which
                                    keeps the format's history and upgrades older versions)
      ranks/<rank>/summary.json     the trace reduced on its node: breakdown, phases, collectives
      ranks/<rank>/telemetry.jsonl  NVML samples of the GPU(s) the rank used
      telemetry/<host>.jsonl        NVML samples of a host while the job runs; after the job
                                    only the GPUs no rank used are left here
      nccl/<host>.<pid>.log         NCCL_DEBUG output
      flight/                       PyTorch flight-recorder dumps
      logs/                         launcher stdout/stderr copies, bootstrap errors
      factors/gemm.json             the job's top GEMM shapes timed in fp32 and bf16/fp16 after
                                    the job, on its host (pardiag.analyzers.factors reads it)
      factors/allreduce.json        all_reduce time = alpha + bytes * beta: fitted to the run's
                                    calls, or a short sweep after the job
      factors/loader.json           a DataLoader worker's hand-over of a batch of the job's
                                    input shape, timed after the job when its loop waited for input
      analysis.json                 cached Analysis
      report.html

Telemetry files (``telemetry/<host>.jsonl``, ``ranks/<rank>/telemetry.jsonl``) hold one
JSON object a line, values in NVML's own units::

    header  {"format": "pardiag.telemetry", "format_version": 1, "host", "t_ns",
             "interval_s", "driver", "gpus": [{"gpu", "uuid", "name"}]}
    sample  {"t_ns", "gpu", "uuid", "util_gpu_pct", "util_mem_pct", "mem_used_bytes",
             "mem_total_bytes", "sm_clock_mhz", "sm_clock_max_mhz", "power_mw",
             "power_limit_mw", "temp_c", "clock_events",    # reasons bitmask
             "pcie_tx_kBps", "pcie_rx_kBps",                # about once a second
             "nvlink_tx_kib", "nvlink_rx_kib"}              # cumulative, once a second

A metric that could not be read is absent from the line. A file may hold several
headers (a rank file that received lines from more than one sampling).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator, Literal

if TYPE_CHECKING:  # step_records imports this module; the collector never reads steps
    from pardiag.rank_meta import RankMeta
    from pardiag.step_records import StepRecord

FORMAT = "pardiag.run"
FORMAT_VERSION = 1
META_FORMAT = "pardiag.rank-meta"
META_VERSION = 2  # 2: exception messages and tracebacks redacted when written
LAUNCHER_FORMAT = "pardiag.launcher"
LAUNCHER_VERSION = 1
SUMMARY_FORMAT = "pardiag.rank-summary"
SUMMARY_VERSION = 1
TELEMETRY_FORMAT = "pardiag.telemetry"
TELEMETRY_VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One top-level entry of a run directory. `collected` entries are written while
    the job runs (on every node: `pardiag merge` joins them); `derived` ones are
    rebuilt from the collected ones (the manifest) or made on demand; a `lock` belongs
    to the processes writing this directory."""

    name: str
    kind: Literal["dir", "file"]
    role: Literal["collected", "derived", "lock"]


ENTRIES: tuple[Entry, ...] = (
    Entry("launchers", "dir", "collected"),
    Entry("ranks", "dir", "collected"),
    Entry("telemetry", "dir", "collected"),
    Entry("nccl", "dir", "collected"),
    Entry("flight", "dir", "collected"),
    Entry("logs", "dir", "collected"),
    Entry("factors", "dir", "collected"),  # measured after the job, on the node of the lowest rank
    Entry("manifest.json", "file", "derived"),
    Entry("analysis.json", "file", "derived"),
    Entry("report.html", "file", "derived"),
    Entry(".lock", "file", "lock"),  # the manifest writers' lock
)


class RunDirError(Exception):
    """A run directory that cannot be read as asked (missing, newer format, corrupt)."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def ranks_dir(self) -> Path:
        return self.root / "ranks"

    @property
    def nccl_dir(self) -> Path:
        return self.root / "nccl"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def launchers_dir(self) -> Path:
        return self.root / "launchers"

    @property
    def flight_dir(self) -> Path:
        return self.root / "flight"

    @property
    def factors_dir(self) -> Path:
        """Speed-up factors measured after the job (pardiag.analyzers.factors)."""
        return self.root / "factors"

    @property
    def gemm_factor(self) -> Path:
        return self.factors_dir / "gemm.json"

    @property
    def loader_factor(self) -> Path:
        return self.factors_dir / "loader.json"

    @property
    def faults_factor(self) -> Path:
        return self.factors_dir / "faults.json"

    @property
    def allreduce_factor(self) -> Path:
        return self.factors_dir / "allreduce.json"

    @property
    def telemetry_dir(self) -> Path:
        return self.root / "telemetry"

    @property
    def bootstrap_errors_dir(self) -> Path:
        # collectors/_inject/sitecustomize.py spells this path out too: it runs before
        # pardiag can be imported
        return self.root / "logs" / "bootstrap"

    def bootstrap_error(self, host: str, pid: int) -> Path:
        """Why pardiag's collector could not install in one process."""
        return self.bootstrap_errors_dir / f"{host}.{pid}.txt"

    @property
    def analysis(self) -> Path:
        return self.root / "analysis.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def rank_dir(self, rank: int) -> Path:
        return self.ranks_dir / str(rank)

    def trace(self, rank: int, window: int = 1) -> Path:
        """Where a rank writes its complete trace (the launcher compresses it later); an
        extra window (``window`` 2, recorded when the job slowed down) beside it."""
        return self.rank_dir(rank) / ("trace.json" if window == 1 else f"trace-{window}.json")

    def partial_trace(self, rank: int, window: int = 1) -> Path:
        return self.rank_dir(rank) / ("trace.partial.json" if window == 1 else f"trace-{window}.partial.json")

    def find_trace(self, rank: int, window: int = 1) -> tuple[Path | None, bool]:
        """(the rank's trace file, whether its window is complete); compressed first."""
        for path, complete in (
            (self.trace(rank, window).with_suffix(".json.gz"), True),
            (self.trace(rank, window), True),
            (self.partial_trace(rank, window).with_suffix(".json.gz"), False),
            (self.partial_trace(rank, window), False),
        ):
            if path.is_file():
                return path, complete
        return None, False

    def summary(self, rank: int) -> Path:
        """Compact per-rank result of the trace, written on the rank's node after the job."""
        return self.rank_dir(rank) / "summary.json"

    def steps(self, rank: int) -> Path:
        return self.rank_dir(rank) / "steps.jsonl"

    def meta(self, rank: int) -> Path:
        return self.rank_dir(rank) / "meta.json"

    def telemetry(self, rank: int) -> Path:
        return self.rank_dir(rank) / "telemetry.jsonl"

    def host_telemetry(self, host: str) -> Path:
        """Where the sampler of `host` writes, before the lines are split by rank."""
        return self.telemetry_dir / f"{_safe_name(host)}.jsonl"

    def host_telemetry_lock(self, host: str) -> Path:
        """Held by the sampler of `host` while it writes, and by the split after it."""
        return self.telemetry_dir / f".{_safe_name(host)}.lock"

    def host_telemetry_files(self) -> list[Path]:
        d = self.telemetry_dir
        return sorted(d.glob("*.jsonl")) if d.is_dir() else []

    def flight_prefix(self) -> Path:
        """Prefix PyTorch appends the rank to when it dumps its flight recorder."""
        return self.flight_dir / "rank_"

    def flight_dump(self, rank: int) -> Path:
        """One rank's flight-recorder dump, where PyTorch writes it (`flight_prefix` + rank)."""
        return self.flight_dir / f"rank_{rank}"

    def nccl_log_pattern(self) -> str:
        """NCCL_DEBUG_FILE value: NCCL expands %h to the host name and %p to the pid."""
        return str(self.nccl_dir / "%h.%p.log")

    def launcher_record(self, host: str, pid: int) -> Path:
        return self.launchers_dir / f"{_safe_name(host)}.{pid}.json"

    def stream_log(self, host: str, pid: int, stream: str) -> Path:
        return self.logs_dir / f"{_safe_name(host)}.{pid}.{stream}.log"

    def ranks(self) -> list[int]:
        """Ranks that left a directory, in order."""
        if not self.ranks_dir.is_dir():
            return []
        out = []
        for p in self.ranks_dir.iterdir():
            if p.is_dir() and p.name.isdigit():
                out.append(int(p.name))
        return sorted(out)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "host"


def hostname() -> str:
    return socket.gethostname()


# ---------------------------------------------------------------------------
# Writing


def atomic_write_text(path: Path, text: str, durable: bool = True) -> None:
    """Write to a temporary file in the same folder, then rename over the target.

    `durable=False` skips the fsync: for files rewritten often from inside training.
    """
    atomic_write_bytes(path, text.encode("utf-8"), durable)


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> None:
    """`atomic_write_text` for bytes (a flight-recorder dump: no fsync by default)."""
    with atomic_open(path) as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())


@contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """`atomic_write_bytes` for a file written as it is produced: a temporary file in the
    same folder, renamed over the target when the block ends without an error, removed
    when it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", durable)


class StepsWriter:
    """Appends one JSON line per step with a single write() so a crash loses at most
    the line being written and concurrent readers never see half a record."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps builds a new one per call


def encode_line(record: dict[str, Any]) -> str:
    """One JSON line of a .jsonl file (compact, newline included)."""
    return _ENCODER.encode(record) + "\n"


def lock_exclusive(path: Path) -> int | None:
    """Take an exclusive lock on `path` (created if missing) without waiting: the file
    descriptor, to give to `unlock`, or None when another process holds the lock."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)  # closing releases the flock
        except OSError:
            pass


def telemetry_header(host: str, t_ns: int, interval_s: float, driver: str | None,
                     gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The first line of a telemetry file; `gpus`: [{"gpu", "uuid", "name"}]."""
    return {"format": TELEMETRY_FORMAT, "format_version": TELEMETRY_VERSION, "host": host, "t_ns": t_ns,
            "interval_s": interval_s, "driver": driver, "gpus": gpus}


def trace_source(trace: Path) -> dict[str, Any]:
    """What a rank summary names of the trace it came from; it is used only while these match."""
    st = trace.stat()
    return {"trace": trace.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_summary(run: RunDir, rank: int, trace: Path, body: dict[str, Any]) -> None:
    """ranks/<rank>/summary.json: `body` (the analyzers' reduced trace) under the
    summary's format, the rank and the trace it came from."""
    from pardiag import __version__

    doc = {"format": SUMMARY_FORMAT, "format_version": SUMMARY_VERSION, "pardiag_version": __version__,
           "rank": rank, "source": trace_source(trace), **body}
    atomic_write_text(run.summary(rank), json.dumps(doc) + "\n", durable=False)


def compress_file(path: Path, level: int = 6) -> Path:
    """`x.json` -> `x.json.gz` atomically; the original is removed only afterwards."""
    import gzip
    import shutil

    target = path.with_name(path.name + ".gz")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=level) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    path.unlink()
    return target


# ---------------------------------------------------------------------------
# Reading


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise RunDirError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None


def _check_version(doc: Any, path: Path, fmt: str, version: int) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise RunDirError(f"{path}: not a {fmt} file")
    v = doc.get("format_version")
    if not isinstance(v, int):
        raise RunDirError(f"{path}: format_version missing")
    if v > version:
        raise RunDirError(
            f"{path}: format version {v} is newer than this pardiag understands ({version}); "
            "upgrade pardiag"
        )
    return doc


def read_manifest(run: RunDir) -> dict[str, Any]:
    return _check_version(read_json(run.manifest), run.manifest, FORMAT, FORMAT_VERSION)


def read_meta(run: RunDir, rank: int) -> RankMeta:
    """The rank's meta.json, upgraded to this pardiag's version. RunDirError when it is
    missing, unreadable or of a newer version."""
    from pardiag.rank_meta import parse_meta

    path = run.meta(rank)
    return parse_meta(read_json(path), path)


def read_launcher_records(run: RunDir) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not run.launchers_dir.is_dir():
        return out
    for p in sorted(run.launchers_dir.glob("*.json")):
        try:
            out.append(_check_version(read_json(p), p, LAUNCHER_FORMAT, LAUNCHER_VERSION))
        except RunDirError:
            continue
    return out


def iter_steps(path: Path) -> Iterator[StepRecord]:
    """Step records, older versions upgraded (`step_records.parse`); a torn last line
    (a killed rank) is skipped, not fatal. Raises RunDirError for a newer version."""
    from pardiag.step_records import parse

    try:
        f = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            rec = parse(obj, path)
            if rec is not None:
                yield rec


def read_steps(run: RunDir, rank: int) -> list[StepRecord]:
    return list(iter_steps(run.steps(rank)))


def read_summary(run: RunDir, rank: int, trace: Path) -> dict[str, Any] | None:
    """The rank's summary document if it exists, is readable, was written by this pardiag
    version (another version's trace reader may have counted differently) and was made
    from `trace` as it is now; else None (the trace is read instead)."""
    from pardiag import __version__

    try:
        doc = json.loads(run.summary(rank).read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != SUMMARY_FORMAT:
            return None
        if doc.get("format_version", 99) > SUMMARY_VERSION or doc.get("pardiag_version") != __version__:
            return None
        if doc.get("source") != trace_source(trace):
            return None
        return doc
    except (OSError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class TelemetryFile:
    headers: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    dropped: int  # lines that were neither (a torn last line after a crash)


def parse_telemetry_line(line: str, path: Path) -> dict[str, Any] | None:
    """A header or a sample; None for a line that is neither. Raises RunDirError for a
    header of a newer format version."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(rec, dict):
        return None
    if "format" in rec:
        if rec.get("format") != TELEMETRY_FORMAT or not isinstance(rec.get("format_version"), int):
            return None
        if rec["format_version"] > TELEMETRY_VERSION:
            raise RunDirError(f"{path}: telemetry format version {rec['format_version']} is newer than this "
                              f"pardiag understands ({TELEMETRY_VERSION}); upgrade pardiag")
        return rec
    return rec if isinstance(rec.get("gpu"), int) and isinstance(rec.get("t_ns"), int) else None


def is_telemetry_header(rec: dict[str, Any]) -> bool:
    return "format" in rec


def read_telemetry(path: Path) -> TelemetryFile:
    """Headers and samples of one telemetry file; unreadable lines are counted, not fatal.
    Raises RunDirError for a newer format version."""
    headers: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    dropped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            rec = parse_telemetry_line(line, path)
            if rec is None:
                dropped += 1
            elif is_telemetry_header(rec):
                headers.append(rec)
            else:
                samples.append(rec)
    return TelemetryFile(headers, samples, dropped)


def normalise_uuid(v: Any) -> str | None:
    """A GPU's UUID as telemetry ('GPU-8f3c…') and meta.json (torch's bare '8f3c…')
    record it, in one form that compares equal."""
    if v is None:
        return None
    s = str(v).strip().lower()
    s = s[4:] if s.startswith("gpu-") else s
    return s or None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (
        (path / "manifest.json").is_file()
        or (path / "ranks").is_dir()
        or (path / "launchers").is_dir()
    )
