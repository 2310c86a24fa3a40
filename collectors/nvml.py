"""GPU telemetry through NVML (nvidia-ml-py), sampled on the launcher host.

`pardiag run` samples every GPU of its host from a background thread of its own
process, never inside training::

    started = start_sampler(run)              # SamplerStart(sampler | None, status)
    ...                                       # the job runs
    status = started.sampler.stop()           # when started.sampler is not None
    split = split_by_rank(run, host)          # after the job, once the ranks' metas exist

Only cheap queries are made (utilisation, memory, clocks, power, temperature, clock
event reasons); never the process-listing calls, which hold the driver's global lock
for milliseconds. PCIe throughput (about 20 ms a call) and the NVLink counters are read
once a second, spread over the samples so that one sample reads them for a few GPUs
only. A query a GPU does not support disables that metric on that GPU only; any other
failure is counted, and a metric that fails three times in a row is disabled as well.
Nothing here raises into its caller.

File format ``telemetry/<host>.jsonl`` (``ranks/<rank>/telemetry.jsonl`` after the
split), one JSON object a line, values in NVML's own units::

    header  {"format": "pardiag.telemetry", "format_version": 1, "host", "t_ns",
             "interval_s", "driver", "gpus": [{"gpu", "uuid", "name"}]}
    sample  {"t_ns", "gpu", "uuid", "util_gpu_pct", "util_mem_pct", "mem_used_bytes",
             "mem_total_bytes", "sm_clock_mhz", "sm_clock_max_mhz", "power_mw",
             "power_limit_mw", "temp_c", "clock_events",    # reasons bitmask
             "pcie_tx_kBps", "pcie_rx_kBps",                # about once a second
             "nvlink_tx_kib", "nvlink_rx_kib"}              # cumulative, once a second

A metric that could not be read is absent from the line. Lines are buffered and
written about once a second with one write() each, so a crash loses at most a second.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from pardiag import rundir
from pardiag.rundir import RunDir, RunDirError

log = logging.getLogger(__name__)

TELEMETRY_FORMAT = "pardiag.telemetry"
TELEMETRY_VERSION = 1
SLOW_PERIOD_S = 1.0  # PCIe throughput, NVLink counters, power limit
FLUSH_PERIOD_S = 1.0
MIN_INTERVAL_S = 0.02
STOP_TIMEOUT_S = 0.8  # stop() gives the thread this long to leave an NVML call
MAX_CONSECUTIVE_FAILURES = 3
MAX_ERROR_EXAMPLES = 5
ALL_LINKS = 0xFFFFFFFF  # field-value scope: summed over every NVLink
# NVML return codes after which a query is not tried again on that GPU
# (INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND)
PERMANENT_ERRORS = frozenset({2, 3, 4, 13})
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps builds a new one per call

Reader = Callable[[Any, Any], dict[str, Any]]  # (nvml module, device handle) -> fields


def _utilization(nvml: Any, h: Any) -> dict[str, Any]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"util_gpu_pct": int(u.gpu), "util_mem_pct": int(u.memory)}


def _memory(nvml: Any, h: Any) -> dict[str, Any]:
    m = nvml.nvmlDeviceGetMemoryInfo(h)
    return {"mem_used_bytes": int(m.used), "mem_total_bytes": int(m.total)}


def _sm_clock(nvml: Any, h: Any) -> dict[str, Any]:
    return {"sm_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))}


def _sm_clock_max(nvml: Any, h: Any) -> dict[str, Any]:
    return {"sm_clock_max_mhz": int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))}


def _power(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_mw": int(nvml.nvmlDeviceGetPowerUsage(h))}


def _power_limit(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_limit_mw": int(nvml.nvmlDeviceGetEnforcedPowerLimit(h))}


def _power_management_limit(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_limit_mw": int(nvml.nvmlDeviceGetPowerManagementLimit(h))}


def _temperature(nvml: Any, h: Any) -> dict[str, Any]:
    return {"temp_c": int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))}


def _clock_events(nvml: Any, h: Any) -> dict[str, Any]:
    return {"clock_events": int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))}


def _throttle_reasons(nvml: Any, h: Any) -> dict[str, Any]:
    return {"clock_events": int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))}


def _pcie(nvml: Any, h: Any) -> dict[str, Any]:
    return {
        "pcie_tx_kBps": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)),
        "pcie_rx_kBps": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)),
    }


def _nvlink(nvml: Any, h: Any) -> dict[str, Any]:
    ids = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS), (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)]
    values = nvml.nvmlDeviceGetFieldValues(h, ids)
    for v in values:
        if v.nvmlReturn != 0:
            raise nvml.NVMLError(v.nvmlReturn)
    return {"nvlink_tx_kib": int(values[0].value.ullVal), "nvlink_rx_kib": int(values[1].value.ullVal)}


Cadence = Literal["sample", "slow", "once"]


@dataclass(frozen=True)
class Metric:
    """One query. `readers` are tried in order: a later one replaces an earlier one
    the GPU or the library does not support. `sticky` values are repeated in every
    line until read again (limits read rarely)."""

    name: str
    readers: tuple[Reader, ...]
    calls: tuple[str, ...]  # the NVML functions the readers call
    cadence: Cadence = "sample"
    sticky: bool = False


METRICS: tuple[Metric, ...] = (
    Metric("utilization", (_utilization,), ("nvmlDeviceGetUtilizationRates",)),
    Metric("memory", (_memory,), ("nvmlDeviceGetMemoryInfo",)),
    Metric("sm_clock", (_sm_clock,), ("nvmlDeviceGetClockInfo",)),
    Metric("sm_clock_max", (_sm_clock_max,), ("nvmlDeviceGetMaxClockInfo",), "once", True),
    Metric("power", (_power,), ("nvmlDeviceGetPowerUsage",)),
    Metric("power_limit", (_power_limit, _power_management_limit),
           ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), "slow", True),
    Metric("temperature", (_temperature,), ("nvmlDeviceGetTemperature",)),
    Metric("clock_events", (_clock_events, _throttle_reasons),
           ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")),
    Metric("pcie", (_pcie,), ("nvmlDeviceGetPcieThroughput",), "slow"),
    Metric("nvlink", (_nvlink,), ("nvmlDeviceGetFieldValues",), "slow"),
)
SETUP_CALLS = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
               "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlSystemGetDriverVersion")
NVML_CALLS: tuple[str, ...] = SETUP_CALLS + tuple(c for m in METRICS for c in m.calls)


# --------------------------------------------------------------------------- files


def telemetry_dir(run: RunDir) -> Path:
    return Path(run.root) / "telemetry"


def host_telemetry_path(run: RunDir, host: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
    return telemetry_dir(run) / f"{safe}.jsonl"


def host_telemetry_files(run: RunDir) -> list[Path]:
    d = telemetry_dir(run)
    return sorted(d.glob("*.jsonl")) if d.is_dir() else []


@dataclass(frozen=True)
class TelemetryFile:
    headers: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    dropped: int  # lines that were neither (a torn last line after a crash)


def _parse_line(line: str, path: Path) -> dict[str, Any] | None:
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
            rec = _parse_line(line, path)
            if rec is None:
                dropped += 1
            elif "format" in rec:
                headers.append(rec)
            else:
                samples.append(rec)
    return TelemetryFile(headers, samples, dropped)


def _lock(path: Path) -> int | None:
    """An exclusive lock beside the host file: one sampler per host, and no split while
    it writes. None when another process holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.stem}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)  # closing releases the flock
        except OSError:
            pass


# --------------------------------------------------------------------------- sampler


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str | None
    name: str | None
    reader: dict[str, int]  # metric -> reader in use; a disabled metric is absent
    failures: dict[str, int] = field(default_factory=dict)
    sticky: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # metrics read at least once


class SamplerStart(NamedTuple):
    sampler: Sampler | None  # None when NVML cannot be used; status says why
    status: dict[str, Any]


class Sampler:
    """Samples every GPU of the host each `interval_s` in a daemon thread and appends
    lines to the host file. Build it with `start_sampler` (or `open_sampler` and
    `sample_once` to drive it by hand)."""

    def __init__(self, nvml: Any, gpus: list[_Gpu], fd: int, lock_fd: int | None, interval_s: float,
                 file: str, driver: str | None, clock_ns: Callable[[], int]) -> None:
        self._nvml = nvml
        self._nvml_error: Any = getattr(nvml, "NVMLError", ())
        self._gpus = gpus
        self._fd = fd
        self._lock_fd = lock_fd
        self._interval = interval_s
        self._slow_every = max(1, round(SLOW_PERIOD_S / interval_s))
        self._file = file
        self._driver = driver
        self._clock = clock_ns
        self._buffer: list[str] = []
        self._last_flush = time.monotonic()
        self._closed = False
        self._close_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] | None = None
        self._crash: str | None = None
        self._started = time.monotonic()
        self.samples = 0
        self.lines = 0
        self.dropped_lines = 0
        self.late = 0
        self.errors = 0
        self._error_examples: list[str] = []
        self.disabled: list[dict[str, Any]] = []
        self._cpu_ns = 0
        self._wall_ns = 0
        self._wall_max_ns = 0

    # -- running

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pardiag-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self.sample_once()
                next_t += self._interval
                delay = next_t - time.monotonic()
                if delay < 0:  # a sample took longer than the interval: skip, do not catch up
                    self.late += 1
                    next_t = time.monotonic() + self._interval
                    delay = self._interval
                if self._stop.wait(delay):
                    break
        except BaseException as e:  # never let the thread die silently
            self._crash = f"sampling thread stopped: {e!r}"
        finally:
            self._close()

    def sample_once(self) -> None:
        """One sample of every GPU; never raises."""
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            tick = self.samples
            for pos, gpu in enumerate(self._gpus):
                if not gpu.reader:  # a GPU whose every metric is disabled is left alone
                    continue
                rec = self._record(gpu, pos, tick)
                if len(rec) > 3:  # more than t_ns, gpu, uuid
                    self._buffer.append(_ENCODER.encode(rec) + "\n")
            self.samples += 1
            if not any(g.reader for g in self._gpus):
                self._stop.set()  # nothing left to read: the thread ends
            if time.monotonic() - self._last_flush >= FLUSH_PERIOD_S:
                self._flush()
        except Exception as e:
            self._error(f"sample: {e!r}")
        finally:
            wall = time.perf_counter_ns() - wall0
            self._cpu_ns += time.thread_time_ns() - cpu0
            self._wall_ns += wall
            self._wall_max_ns = max(self._wall_max_ns, wall)

    def _record(self, gpu: _Gpu, pos: int, tick: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"t_ns": self._clock(), "gpu": gpu.index, "uuid": gpu.uuid}
        for m in METRICS:
            if m.name not in gpu.reader or not self._due(m, gpu, pos, tick):
                continue
            values = self._read(gpu, m)
            if values is None:
                continue
            if m.sticky:
                gpu.sticky.update(values)
            else:
                rec.update(values)
            gpu.done.add(m.name)
        rec.update(gpu.sticky)
        return rec

    def _due(self, m: Metric, gpu: _Gpu, pos: int, tick: int) -> bool:
        if m.cadence == "once":
            return m.name not in gpu.done
        if m.cadence == "slow":  # GPU `pos` on every slow_every-th sample, GPUs staggered;
            # a sticky value (a limit) is read on the first sample as well
            return tick % self._slow_every == pos % self._slow_every or (m.sticky and m.name not in gpu.done)
        return True

    def _read(self, gpu: _Gpu, m: Metric) -> dict[str, Any] | None:
        while m.name in gpu.reader:
            try:
                values = m.readers[gpu.reader[m.name]](self._nvml, gpu.handle)
            except Exception as e:
                if self._permanent(e):
                    self._fall_back(gpu, m, e)
                    continue
                self._failure(gpu, m, e)
                return None
            gpu.failures[m.name] = 0
            return values
        return None

    def _permanent(self, e: Exception) -> bool:
        if isinstance(e, (AttributeError, TypeError)):  # function or constant missing in this library
            return True
        return isinstance(e, self._nvml_error) and getattr(e, "value", None) in PERMANENT_ERRORS

    def _fall_back(self, gpu: _Gpu, m: Metric, e: Exception) -> None:
        nxt = gpu.reader[m.name] + 1
        if nxt < len(m.readers):
            gpu.reader[m.name] = nxt
            return
        del gpu.reader[m.name]
        self.disabled.append({"gpu": gpu.index, "metric": m.name, "reason": error_text(e)})

    def _failure(self, gpu: _Gpu, m: Metric, e: Exception) -> None:
        self._error(f"GPU {gpu.index} {m.name}: {error_text(e)}")
        n = gpu.failures.get(m.name, 0) + 1
        gpu.failures[m.name] = n
        if n >= MAX_CONSECUTIVE_FAILURES:
            del gpu.reader[m.name]
            self.disabled.append({"gpu": gpu.index, "metric": m.name,
                                  "reason": f"failed {n} times in a row: {error_text(e)}"})

    def _error(self, text: str) -> None:
        self.errors += 1
        if len(self._error_examples) < MAX_ERROR_EXAMPLES:
            self._error_examples.append(text)

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._buffer or self._fd < 0:
            return
        n = len(self._buffer)
        data = "".join(self._buffer).encode()
        self._buffer.clear()
        try:
            while data:
                data = data[os.write(self._fd, data):]
            self.lines += n
        except OSError as e:
            self.dropped_lines += n
            self._error(f"writing the telemetry file: {e.strerror or e}")

    def _close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._flush()
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
            _unlock(self._lock_fd)

    # -- stopping

    def stop(self) -> dict[str, Any]:
        """Stops sampling (within STOP_TIMEOUT_S), flushes, and says how it went:
        {"status": "ok"|"failed", "reason", "samples", "gpus", "cost_us_per_sample",
        "cpu_us_per_sample", "errors", "disabled", ...}. Never raises; idempotent."""
        if self._result is not None:
            return self._result
        stuck = False
        try:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(STOP_TIMEOUT_S)
                stuck = self._thread.is_alive()
            if not stuck:
                self._close()
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass
            self._result = self._status(stuck)
        except Exception as e:
            self._result = {"status": "failed", "reason": f"stopping the NVML sampler: {e!r}"}
        return self._result

    def _status(self, stuck: bool) -> dict[str, Any]:
        n = self.samples
        reason = None
        if stuck:
            reason = f"the sampling thread was still inside an NVML call after {STOP_TIMEOUT_S} s"
        elif self._crash:
            reason = self._crash
        elif n and not any(g.reader for g in self._gpus):
            reason = "no metric could be read on any GPU"
        return {
            "status": "failed" if reason else "ok",
            "reason": reason,
            "samples": n,
            "gpus": len(self._gpus),
            "interval_s": self._interval,
            "duration_s": time.monotonic() - self._started,
            "cost_us_per_sample": self._wall_ns / n / 1e3 if n else None,
            "cpu_us_per_sample": self._cpu_ns / n / 1e3 if n else None,
            "max_us_per_sample": self._wall_max_ns / 1e3 if n else None,
            "late_samples": self.late,
            "lines": self.lines,
            "dropped_lines": self.dropped_lines,
            "errors": self.errors,
            "error_examples": list(self._error_examples),
            "disabled": list(self.disabled),
            "driver": self._driver,
            "file": self._file,
        }


# --------------------------------------------------------------------------- starting


def start_sampler(run: RunDir, interval_s: float = 0.1, nvml: Any = None) -> SamplerStart:
    """Start sampling this host's GPUs every `interval_s` into ``telemetry/<host>.jsonl``.

    Returns (sampler, status). `sampler` is None when NVML cannot be used; `status` is
    {"status": "skipped"|"failed", "reason"} then, {"status": "ok", "gpus", ...}
    otherwise. `nvml` replaces the pynvml module (tests). Never raises."""
    opened = open_sampler(run, interval_s, nvml)
    if opened.sampler is None:
        return opened
    try:
        opened.sampler.start()
    except Exception as e:
        opened.sampler.stop()
        return SamplerStart(None, {"status": "failed", "reason": f"could not start the sampling thread: {e!r}"})
    return opened


def open_sampler(run: RunDir, interval_s: float = 0.1, nvml: Any = None, host: str | None = None,
                 clock_ns: Callable[[], int] = time.time_ns) -> SamplerStart:
    """Like `start_sampler` without the thread: call `sample_once()` by hand."""
    try:
        return _open(run, interval_s, nvml, host or rundir.hostname(), clock_ns)
    except Exception as e:
        return SamplerStart(None, {"status": "failed", "reason": f"could not start the NVML sampler: {error_text(e)}"})


def _open(run: RunDir, interval_s: float, nvml: Any, host: str, clock_ns: Callable[[], int]) -> SamplerStart:
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return SamplerStart(None, {"status": "skipped", "reason": "nvidia-ml-py (pynvml) is not installed"})
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:
        return SamplerStart(None, {"status": "skipped",
                                   "reason": f"no NVIDIA driver/GPU reachable through NVML ({error_text(e)})"})
    opened: SamplerStart | None = None
    lock_fd: int | None = None
    try:
        opened, lock_fd = _open_initialised(run, interval_s, nvml, host, clock_ns)
        return opened
    finally:
        if opened is None or opened.sampler is None:
            _unlock(lock_fd)
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass


def _open_initialised(run: RunDir, interval_s: float, nvml: Any, host: str,
                      clock_ns: Callable[[], int]) -> tuple[SamplerStart, int | None]:
    count = nvml.nvmlDeviceGetCount()
    if not count:
        return SamplerStart(None, {"status": "skipped", "reason": "NVML reports no GPU"}), None
    gpus, problems = _open_gpus(nvml, count)
    if not gpus:
        return SamplerStart(None, {"status": "failed", "reason": "no GPU handle: " + "; ".join(problems)}), None
    path = host_telemetry_path(run, host)
    lock_fd = _lock(path)
    if lock_fd is None:
        return SamplerStart(None, {"status": "skipped",
                                   "reason": "another pardiag process already samples this host's GPUs"}), None
    interval = interval_s if math.isfinite(interval_s) and interval_s > 0 else 0.1
    interval = max(interval, MIN_INTERVAL_S)
    driver = _text(_try(nvml.nvmlSystemGetDriverVersion))
    header = {"format": TELEMETRY_FORMAT, "format_version": TELEMETRY_VERSION, "host": host, "t_ns": clock_ns(),
              "interval_s": interval, "driver": driver,
              "gpus": [{"gpu": g.index, "uuid": g.uuid, "name": g.name} for g in gpus]}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except BaseException:
        _unlock(lock_fd)
        raise
    try:
        os.write(fd, (json.dumps(header, separators=(",", ":")) + "\n").encode())
    except BaseException:
        os.close(fd)
        _unlock(lock_fd)
        raise
    file = path.relative_to(run.root).as_posix()
    sampler = Sampler(nvml, gpus, fd, lock_fd, interval, file, driver, clock_ns)
    status = {"status": "ok", "reason": None, "gpus": len(gpus), "interval_s": interval, "driver": driver,
              "file": file, "problems": problems}
    return SamplerStart(sampler, status), lock_fd


def _open_gpus(nvml: Any, count: int) -> tuple[list[_Gpu], list[str]]:
    gpus: list[_Gpu] = []
    problems: list[str] = []
    for i in range(int(count)):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:
            problems.append(f"GPU {i}: {error_text(e)}")
            continue
        uuid = _text(_try(nvml.nvmlDeviceGetUUID, h))
        name = _text(_try(nvml.nvmlDeviceGetName, h))
        gpus.append(_Gpu(i, h, uuid, name, reader={m.name: 0 for m in METRICS}))
    return gpus, problems


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def error_text(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]


# --------------------------------------------------------------------------- ranks


def normalise_uuid(v: Any) -> str | None:
    """'GPU-8f3c…' and torch's bare '8f3c…' compare equal."""
    if v is None:
        return None
    s = str(v).strip().lower()
    s = s[4:] if s.startswith("gpu-") else s
    return s or None


def gpu_of_rank(meta: dict[str, Any], gpus: dict[int, str | None]) -> tuple[int, str] | None:
    """(NVML index, how it was matched) of the GPU a rank used, from its meta.json.

    `gpus` maps NVML indices to UUIDs. The UUID decides when the meta has one; otherwise
    the rank's CUDA device index is looked up in its CUDA_VISIBLE_DEVICES (indices or
    UUID prefixes), or taken as the NVML index when that variable was not set (CUDA's
    and NVML's orders agree on most machines; the UUID is the reliable key)."""
    dev = meta.get("device") or {}
    if not isinstance(dev, dict) or dev.get("type") != "cuda":
        return None
    want = normalise_uuid(dev.get("uuid"))
    if want:
        for idx, uuid in gpus.items():
            if normalise_uuid(uuid) == want:
                return idx, "uuid"
    local = dev.get("index") if isinstance(dev.get("index"), int) else meta.get("local_rank")
    if not isinstance(local, int) or local < 0:
        return None
    cvd = dev.get("cuda_visible_devices")
    if cvd is None:
        return (local, "index") if local in gpus else None
    entries = [e.strip() for e in (",".join(map(str, cvd)) if isinstance(cvd, (list, tuple)) else str(cvd)).split(",")]
    entries = [e for e in entries if e]
    if local >= len(entries):
        return None
    entry = entries[local]
    if entry.isdigit():
        return (int(entry), "cuda_visible_devices") if int(entry) in gpus else None
    prefix = normalise_uuid(entry) or ""
    hits = [idx for idx, uuid in gpus.items() if prefix and (normalise_uuid(uuid) or "").startswith(prefix)]
    return (hits[0], "cuda_visible_devices") if len(hits) == 1 else None


def _host_metas(run: RunDir, host: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for r in run.ranks():
        try:
            meta = rundir.read_meta(run, r)
        except RunDirError:
            continue
        if meta.get("host") == host:
            out.append((r, meta))
    return out


def split_by_rank(run: RunDir, host: str) -> dict[str, Any]:
    """After the job: move each GPU's lines from ``telemetry/<host>.jsonl`` into
    ``ranks/<rank>/telemetry.jsonl`` of the rank(s) of this host that used it (a GPU
    shared by several ranks goes to each). GPUs no rank used stay in the host file.
    Appends to a rank file that exists already. Returns {"status", "reason", "host",
    "assignments": [{"rank", "gpu", "uuid", "by"}], "unassigned_gpus", "lines",
    "dropped_lines"}. Never raises."""
    try:
        return _split(run, host)
    except Exception as e:
        return {"status": "failed", "reason": f"splitting telemetry by rank: {error_text(e)}", "host": host}


def _split(run: RunDir, host: str) -> dict[str, Any]:
    path = host_telemetry_path(run, host)
    if not path.is_file():
        return {"status": "skipped", "reason": "no telemetry file for this host", "host": host}
    lock_fd = _lock(path)
    if lock_fd is None:
        return {"status": "skipped", "reason": "the sampler on this host is still running", "host": host}
    try:
        return _split_locked(run, host, path)
    finally:
        _unlock(lock_fd)


def _split_locked(run: RunDir, host: str, path: Path) -> dict[str, Any]:
    headers: list[str] = []
    header_gpus: dict[int, dict[str, Any]] = {}
    by_gpu: dict[int, list[str]] = {}
    dropped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            rec = _parse_line(line, path)
            if rec is None:
                dropped += 1
            elif "format" in rec:
                headers.append(line if line.endswith("\n") else line + "\n")
                header_gpus.update({g["gpu"]: g for g in rec.get("gpus", []) if isinstance(g.get("gpu"), int)})
            else:
                by_gpu.setdefault(rec["gpu"], []).append(line if line.endswith("\n") else line + "\n")
    uuids = {i: g.get("uuid") for i, g in header_gpus.items()}
    assignments: list[dict[str, Any]] = []
    for rank, meta in _host_metas(run, host):
        hit = gpu_of_rank(meta, uuids)
        if hit is not None:
            assignments.append({"rank": rank, "gpu": hit[0], "uuid": uuids.get(hit[0]), "by": hit[1]})
    last_header = json.loads(headers[-1]) if headers else None
    moved = 0
    for a in assignments:
        lines = by_gpu.get(a["gpu"], [])
        if lines:
            _append_rank_file(run.telemetry(a["rank"]), last_header, a["gpu"], lines)
            moved += len(lines)
    assigned = {a["gpu"] for a in assignments}
    kept = [line for g, lines in sorted(by_gpu.items()) if g not in assigned for line in lines]
    rundir.atomic_write_text(path, "".join(headers) + "".join(kept))
    return {"status": "ok", "reason": None, "host": host, "assignments": assignments,
            "unassigned_gpus": sorted(set(header_gpus) - assigned),
            "lines": {"ranks": moved, "host": len(kept)}, "dropped_lines": dropped}


def _append_rank_file(target: Path, header: dict[str, Any] | None, gpu: int, lines: list[str]) -> None:
    old = target.read_text(encoding="utf-8", errors="replace") if target.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    head = ""
    if header is not None:
        h = dict(header, gpus=[g for g in header.get("gpus", []) if g.get("gpu") == gpu])
        head = json.dumps(h, separators=(",", ":")) + "\n"
    rundir.atomic_write_text(target, old + head + "".join(lines))


# --------------------------------------------------------------------------- probe


def probe() -> dict[str, Any]:
    """Whether NVML can be used here, and why not when it cannot:
    {"status": "ok", "gpus", "driver"} or {"status": "skipped"|"failed", "reason"}."""
    try:
        import pynvml
    except ImportError:
        return {"status": "skipped", "reason": "nvidia-ml-py (pynvml) is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return {"status": "skipped", "reason": f"no NVIDIA driver/GPU reachable through NVML ({error_text(e)})"}
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    except Exception as e:
        return {"status": "failed", "reason": f"NVML query failed: {error_text(e)}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    if not count:
        return {"status": "skipped", "reason": "NVML reports no GPU"}
    return {"status": "ok", "reason": None, "gpus": count, "driver": driver}
