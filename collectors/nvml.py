"""GPU telemetry through NVML (nvidia-ml-py), sampled on the launcher host.

`pardiag run` samples every GPU of its host from a background thread of its own
process, never inside training::

    started = start_sampler(run)              # SamplerStart(sampler | None, status)
    ...                                       # the job runs
    status = started.sampler.stop()           # when started.sampler is not None
    split = split_by_rank(run, host)          # after the job, once the ranks' metas exist

This module opens NVML (or a fake with pynvml's interface, passed as `nvml`), the
GPUs and the host file, and hands them to the sampling thread
(:mod:`pardiag.collectors.nvml_sampler`), which reads the queries of
:mod:`pardiag.collectors.nvml_metrics`. The split by rank is
:mod:`pardiag.collectors.telemetry_split`; the file format and paths are
:mod:`pardiag.rundir`'s. Nothing here raises into its caller.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, NamedTuple

from pardiag import rundir
from pardiag.collectors.nvml_metrics import METRICS, error_text, text, try_call
from pardiag.collectors.nvml_sampler import GpuState, Sampler
from pardiag.collectors.telemetry_split import split_by_rank
from pardiag.rundir import RunDir

__all__ = ["SamplerStart", "open_sampler", "probe", "split_by_rank", "start_sampler"]

MIN_INTERVAL_S = 0.02


class SamplerStart(NamedTuple):
    sampler: Sampler | None  # None when NVML cannot be used; status says why
    status: dict[str, Any]


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
            rundir.unlock(lock_fd)
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
    path = run.host_telemetry(host)
    lock_fd = rundir.lock_exclusive(run.host_telemetry_lock(host))
    if lock_fd is None:
        return SamplerStart(None, {"status": "skipped",
                                   "reason": "another pardiag process already samples this host's GPUs"}), None
    interval = interval_s if math.isfinite(interval_s) and interval_s > 0 else 0.1
    interval = max(interval, MIN_INTERVAL_S)
    driver = text(try_call(nvml.nvmlSystemGetDriverVersion))
    header = rundir.telemetry_header(host, clock_ns(), interval, driver,
                                     [{"gpu": g.index, "uuid": g.uuid, "name": g.name} for g in gpus])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except BaseException:
        rundir.unlock(lock_fd)
        raise
    try:
        os.write(fd, rundir.encode_line(header).encode())
    except BaseException:
        os.close(fd)
        rundir.unlock(lock_fd)
        raise
    file = path.relative_to(run.root).as_posix()
    sampler = Sampler(nvml, gpus, fd, lock_fd, interval, file, driver, clock_ns)
    status = {"status": "ok", "reason": None, "gpus": len(gpus), "interval_s": interval, "driver": driver,
              "file": file, "problems": problems}
    return SamplerStart(sampler, status), lock_fd


def _open_gpus(nvml: Any, count: int) -> tuple[list[GpuState], list[str]]:
    gpus: list[GpuState] = []
    problems: list[str] = []
    for i in range(int(count)):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:
            problems.append(f"GPU {i}: {error_text(e)}")
            continue
        uuid = text(try_call(nvml.nvmlDeviceGetUUID, h))
        name = text(try_call(nvml.nvmlDeviceGetName, h))
        gpus.append(GpuState(i, h, uuid, name, reader={m.name: 0 for m in METRICS}))
    return gpus, problems


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
        driver = text(pynvml.nvmlSystemGetDriverVersion())
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
