"""Host signals per step, read at each step boundary in the training thread: what the
host did besides the job's own phases. All cheap (a few system calls per step) and all
optional: what this OS does not offer is left out of the record, not written as 0.

* garbage collection: the pauses of Python's collector (``gc.callbacks``), their count
  and time, whichever thread triggered them (every thread stops while it runs);
* the training thread's CPU time, and the time it was runnable but waited for a CPU
  (the run queue: ``/proc/self/task/<tid>/schedstat`` on Linux), and its involuntary
  context switches (``getrusage(RUSAGE_THREAD)``): a thread that waited long for a CPU
  shares its cores with something else;
* the CPU time of the whole process, all its threads (``time.process_time_ns``): with
  the training thread's, what the collectives' worker threads and the rest burned,
  which on a CPU job is what the ranks of one host share its cores with;
* the process's resident memory at the boundary (``/proc/self/statm``).

The step's wall time less its CPU time less its run-queue time is the time the thread
slept or blocked (a collective, I/O, a sleep): the three tile the step.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any, Callable

try:
    import resource
except ImportError:  # not on Unix
    resource = None  # type: ignore[assignment]


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


class HostProbe:
    """Reads the host counters of the thread that builds it (the training thread) and
    keeps the previous reading, so that each boundary gives the step's deltas."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self.on_error = on_error
        self.tid = threading.get_native_id()
        self.sched_fd = _open(f"/proc/self/task/{self.tid}/schedstat")
        self.statm_fd = _open("/proc/self/statm")
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.rusage_thread = getattr(resource, "RUSAGE_THREAD", None) if resource is not None else None
        self.gc_ns = 0
        self.gcs = 0
        self._gc_t0: int | None = None
        self._gc_cb: Callable[[str, dict[str, Any]], None] | None = None
        self.prev = self._read()

    # -- garbage collection ----------------------------------------------------------
    def install_gc(self) -> None:
        def on_gc(phase: str, _info: dict[str, Any]) -> None:
            # never raises: it runs inside the interpreter's collector
            if phase == "start":
                self._gc_t0 = time.perf_counter_ns()
            elif self._gc_t0 is not None:
                self.gc_ns += time.perf_counter_ns() - self._gc_t0
                self.gcs += 1
                self._gc_t0 = None

        self._gc_cb = on_gc
        gc.callbacks.append(on_gc)

    def uninstall(self) -> None:
        if self._gc_cb is not None:
            try:
                gc.callbacks.remove(self._gc_cb)
            except ValueError:
                pass
            self._gc_cb = None
        for fd in (self.sched_fd, self.statm_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.sched_fd = self.statm_fd = None

    # -- the counters ----------------------------------------------------------------
    def _read(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.sched_fd is not None:
            try:
                run_ns, wait_ns, _slices = os.pread(self.sched_fd, 128, 0).split()[:3]
                out["cpu_ns"], out["runq_ns"] = int(run_ns), int(wait_ns)
            except (OSError, ValueError):
                self.sched_fd = None
        if "cpu_ns" not in out and threading.get_native_id() == self.tid:
            out["cpu_ns"] = time.thread_time_ns()
        try:
            out["pcpu_ns"] = time.process_time_ns()
        except OSError:
            pass
        if self.rusage_thread is not None:
            try:
                out["nivcsw"] = resource.getrusage(self.rusage_thread).ru_nivcsw
            except OSError:
                self.rusage_thread = None
        if self.statm_fd is not None:
            try:
                out["rss"] = int(os.pread(self.statm_fd, 128, 0).split()[1]) * self.page
            except (OSError, ValueError, IndexError):
                self.statm_fd = None
        return out

    def fill(self, c: Any) -> None:
        """The step's deltas into the step counters `c` (their ``*_seen`` flags say
        which were read); call once per boundary, in the training thread."""
        now = self._read()
        prev, self.prev = self.prev, now
        if "cpu_ns" in now and "cpu_ns" in prev:
            c.cpu_ns, c.cpu_seen = now["cpu_ns"] - prev["cpu_ns"], 1
        if "pcpu_ns" in now and "pcpu_ns" in prev:
            c.pcpu_ns, c.pcpu_seen = now["pcpu_ns"] - prev["pcpu_ns"], 1
        if "runq_ns" in now and "runq_ns" in prev:
            c.runq_ns, c.runq_seen = now["runq_ns"] - prev["runq_ns"], 1
        if "nivcsw" in now and "nivcsw" in prev:
            c.nivcsw, c.nivcsw_seen = now["nivcsw"] - prev["nivcsw"], 1
        if "rss" in now:
            c.rss_mb, c.rss_seen = now["rss"] / 2**20, 1
        if self._gc_cb is not None:
            c.gc_ns, c.gcs, c.gc_seen = self.gc_ns, self.gcs, 1
            self.gc_ns = self.gcs = 0
