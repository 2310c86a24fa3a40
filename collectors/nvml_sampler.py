"""The telemetry sampling thread: every GPU of the host, each interval, one line a GPU.

PCIe throughput (about 20 ms a call) and the NVLink counters are read once a second,
spread over the samples so that one sample reads them for a few GPUs only. A query a
GPU does not support disables that metric on that GPU only; any other failure is
counted, and a metric that fails three times in a row is disabled as well. Lines are
buffered and written about once a second with one write() each, so a crash loses at
most a second. Nothing here raises into its caller.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pardiag import rundir
from pardiag.collectors.nvml_metrics import METRICS, PERMANENT_ERRORS, Metric, error_text

SLOW_PERIOD_S = 1.0  # PCIe throughput, NVLink counters, power limit
FLUSH_PERIOD_S = 1.0
STOP_TIMEOUT_S = 0.8  # stop() gives the thread this long to leave an NVML call
MAX_CONSECUTIVE_FAILURES = 3
MAX_ERROR_EXAMPLES = 5


@dataclass
class GpuState:
    """One GPU as the sampler sees it: its handle, the reader each metric uses, and
    the failures and sticky values the sampler keeps for it."""

    index: int
    handle: Any
    uuid: str | None
    name: str | None
    reader: dict[str, int]  # metric -> reader in use; a disabled metric is absent
    failures: dict[str, int] = field(default_factory=dict)
    sticky: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # metrics read at least once


class Sampler:
    """Samples every GPU of the host each `interval_s` in a daemon thread and appends
    lines to the host file. Build it with `nvml.start_sampler` (or `nvml.open_sampler`
    and `sample_once` to drive it by hand)."""

    def __init__(self, nvml: Any, gpus: list[GpuState], fd: int, lock_fd: int | None, interval_s: float,
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
                    self._buffer.append(rundir.encode_line(rec))
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

    def _record(self, gpu: GpuState, pos: int, tick: int) -> dict[str, Any]:
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

    def _due(self, m: Metric, gpu: GpuState, pos: int, tick: int) -> bool:
        if m.cadence == "once":
            return m.name not in gpu.done
        if m.cadence == "slow":  # GPU `pos` on every slow_every-th sample, GPUs staggered;
            # a sticky value (a limit) is read on the first sample as well
            return tick % self._slow_every == pos % self._slow_every or (m.sticky and m.name not in gpu.done)
        return True

    def _read(self, gpu: GpuState, m: Metric) -> dict[str, Any] | None:
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

    def _fall_back(self, gpu: GpuState, m: Metric, e: Exception) -> None:
        nxt = gpu.reader[m.name] + 1
        if nxt < len(m.readers):
            gpu.reader[m.name] = nxt
            return
        del gpu.reader[m.name]
        self.disabled.append({"gpu": gpu.index, "metric": m.name, "reason": error_text(e)})

    def _failure(self, gpu: GpuState, m: Metric, e: Exception) -> None:
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
            rundir.unlock(self._lock_fd)

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
