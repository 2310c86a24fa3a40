"""One torch.profiler window per rank, driven by the global step counter.

The profiler object is created only when the window opens (no cost before it) and
dropped when the trace is written (no cost after it). Steps inside the window carry
their global number (`ProfilerStep#<step>`), the same on every rank, so windows line
up across ranks. A complete trace goes to `trace.json`; a window cut short by the
process exiting goes to `trace.partial.json` and never replaces a complete one.
Compression is left to the launcher after the job ends, so no gzip competes with
the training for the CPU.

After a CUDA window, CUPTI stays subscribed to every CUDA call unless Kineto tears it
down, which it does only when TEARDOWN_CUPTI is "1" as the trace stops; PyTorch reports
10-20% slower training after profiling without it (pytorch/pytorch#144455). The window
sets it for its own stop when nobody else has (a user's or PyTorch's own value, e.g. the
"0" it sets for CUDA graphs on old CUDA, is left as it is) and CUDA is 12.6 or newer,
where Kineto's teardown is reliable also with CUDA graphs; the status says which.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from pardiag.collectors.config import CollectorConfig, ProfileSchedule
from pardiag.redact import safe_redact


TEARDOWN_ENV = "TEARDOWN_CUPTI"
TEARDOWN_MIN_CUDA = (12, 6)


def cupti_teardown_plan(use_cuda: bool, environ: Any = os.environ, cuda: str | None = None) -> tuple[bool, str]:
    """(set TEARDOWN_CUPTI=1 for this window, why). cuda: torch.version.cuda when None."""
    if not use_cuda:
        return False, "no CUDA activity traced"
    if TEARDOWN_ENV in environ:
        return False, f"{TEARDOWN_ENV}={environ[TEARDOWN_ENV]!r} was already set: kept"
    version = torch.version.cuda if cuda is None else cuda
    try:
        parts = tuple(int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return False, f"CUDA version {version!r} not understood: CUPTI left as Kineto leaves it"
    if parts < TEARDOWN_MIN_CUDA:
        return False, f"CUDA {version} is older than 12.6: CUPTI left as Kineto leaves it"
    return True, f"{TEARDOWN_ENV}=1 while the window stops: CUPTI detaches after the trace"


def phase(s: ProfileSchedule, rel: int) -> ProfilerAction:
    """Profiler action for the step `rel` steps after the window opened."""
    if rel < s.warmup:
        return ProfilerAction.WARMUP
    if rel < s.warmup + s.active - 1:
        return ProfilerAction.RECORD
    if rel == s.warmup + s.active - 1:
        return ProfilerAction.RECORD_AND_SAVE
    return ProfilerAction.NONE


class ProfilerWindow:
    def __init__(
        self,
        cfg: CollectorConfig,
        trace_path: Path,
        partial_path: Path,
        use_cuda: bool,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self.cfg = cfg
        self.schedule = cfg.schedule
        self.trace_path = trace_path
        self.partial_path = partial_path
        self.use_cuda = use_cuda
        # the allocations: as asked, else on when the job runs on the CPU only (config.py)
        self.profile_memory = cfg.profile_memory if cfg.profile_memory is not None else not use_cuda
        self.on_error = on_error
        self.state = "pending"  # pending -> running -> done | failed
        self.prof: Any = None
        self.first_step: int | None = None
        self.steps_recorded: list[int] = []
        self.complete = False
        self.reason: str | None = None
        self.export_s: float | None = None
        self.trace_bytes: int | None = None
        self._finished = False
        self._exiting = False
        self.cupti_teardown: str | None = None  # what the window did about TEARDOWN_CUPTI
        self._set_teardown = False

    @property
    def activities(self) -> list[str]:
        return ["cpu", "cuda"] if self.use_cuda else ["cpu"]

    def phase_of(self, step: int) -> str | None:
        """'warmup' / 'active' for a global step inside the window, else None."""
        if self.first_step is None or step < self.first_step:
            return None
        rel = step - self.first_step
        if rel < self.schedule.warmup:
            return "warmup"
        if rel < self.schedule.warmup + self.schedule.active:
            return "active"
        return None

    def on_boundary(self, next_step: int) -> None:
        """Called after a step ended; `next_step` is the global number of the one starting."""
        try:
            if self.state == "pending" and next_step >= self.schedule.wait:
                self._open(next_step)
            elif self.state == "running":
                self.prof.step()
                if self._finished:
                    self._close()
        except Exception as e:
            self._fail(e)

    def _open(self, first: int) -> None:
        acts = [ProfilerActivity.CPU]
        if self.use_cuda:
            acts.append(ProfilerActivity.CUDA)
        sched = self.schedule

        def schedule_fn(step: int) -> ProfilerAction:
            return phase(sched, max(step - first, 0))

        self.first_step = first
        try:
            self._set_teardown, self.cupti_teardown = cupti_teardown_plan(self.use_cuda)
            if self._set_teardown:
                os.environ[TEARDOWN_ENV] = "1"
        except Exception as e:  # never a reason to skip the window
            self._set_teardown, self.cupti_teardown = False, f"not decided: {type(e).__name__}"
        self.prof = profile(
            activities=acts,
            schedule=schedule_fn,
            on_trace_ready=self._ready,
            record_shapes=self.cfg.record_shapes,
            with_stack=self.cfg.with_stack,
            profile_memory=self.profile_memory,
        )
        self.prof.step_num = first  # label steps with their global number
        self.prof.start()
        self.state = "running"

    def _ready(self, prof: Any) -> None:
        t0 = time.perf_counter()
        # step() has already moved step_num to the next step when the trace is ready;
        # stop() at exit has not.
        last = prof.step_num if self._exiting else prof.step_num - 1
        start = self.first_step + self.schedule.warmup
        self.steps_recorded = list(range(start, last + 1))
        # A window stopped at process exit ends inside a step: never complete.
        self.complete = not self._exiting and len(self.steps_recorded) >= self.schedule.active
        if self._exiting:
            self.steps_recorded = self.steps_recorded[:-1]
        target = self.trace_path if self.complete else self.partial_path
        if not self.complete and self.trace_path.exists():
            self.reason = "a partial window was dropped: a complete trace already exists"
            self._finished = True
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            prof.export_chrome_trace(str(tmp))
            if not tmp.is_file():  # the exporter reports a failed write only in its log
                raise OSError(f"torch.profiler could not write {target.name} (is the disk full?)")
            os.replace(tmp, target)
            self.trace_bytes = target.stat().st_size
        except Exception as e:
            self.on_error("profiler.export", e)
            self.reason = f"trace could not be written: {type(e).__name__}: {safe_redact(str(e))}"
            self.complete = False
            # the exporter may leave its own temporary file (tmp + ".tmp") on a full disk
            for junk in (tmp, tmp.with_name(tmp.name + ".tmp")):
                try:
                    os.unlink(junk)
                except OSError:
                    pass
        self.export_s = time.perf_counter() - t0
        self._finished = True

    def _restore_teardown(self) -> None:
        """The environment as the job had it, once the trace has stopped."""
        if self._set_teardown:
            self._set_teardown = False
            if os.environ.get(TEARDOWN_ENV) == "1":
                os.environ.pop(TEARDOWN_ENV, None)

    def _close(self) -> None:
        try:
            self.prof.stop()
        except Exception as e:
            self.on_error("profiler.stop", e)
        self.prof = None
        self._restore_teardown()
        self.state = "done" if self.complete else "done_partial"
        if self.trace_bytes is None:
            # A failed export (a full disk) can leave the profiler's results in a reference
            # cycle that holds the half-written file open: collected now, its space comes
            # back at once instead of whenever the cyclic collector next runs, so the
            # job's step records still fit.
            import gc

            gc.collect()

    def _fail(self, e: BaseException) -> None:
        self.on_error("profiler", e)
        self.reason = f"{type(e).__name__}: {safe_redact(str(e))}"
        self.state = "failed"
        prof, self.prof = self.prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass
        self._restore_teardown()

    def finish(self) -> None:
        """At process exit: save a window cut short."""
        if self.state == "running" and self.prof is not None:
            self._exiting = True
            try:
                self.prof.stop()  # triggers _ready for a recording window
            except Exception as e:
                self._fail(e)
            else:
                self.prof = None
                self._restore_teardown()
                if not self._finished:
                    self.reason = "the process ended before the window reached its active steps"
                self.state = "done" if self.complete else "done_partial"

    def status(self) -> dict[str, Any]:
        if self.state == "pending":
            st, reason = "skipped", (
                f"the run ended before step {self.schedule.wait} where the window opens"
            )
        elif self.state == "failed" or (self.state in ("done", "done_partial") and not self.trace_bytes):
            st, reason = "failed", self.reason or "no trace was written"
        elif self.complete:
            st, reason = "ok", None
        else:
            st, reason = "partial", self.reason or "window cut short"
        return {
            "status": st,
            "reason": reason,
            "first_step": self.first_step,
            "steps_recorded": self.steps_recorded,
            "complete": self.complete,
            "activities": self.activities,
            "schedule": {
                "wait": self.schedule.wait,
                "warmup": self.schedule.warmup,
                "active": self.schedule.active,
            },
            "record_shapes": self.cfg.record_shapes,
            "with_stack": self.cfg.with_stack,
            "profile_memory": self.profile_memory,
            "export_s": self.export_s,
            "trace_bytes": self.trace_bytes,
            "cupti_teardown": self.cupti_teardown,
            "trace": (self.trace_path.name if self.complete else self.partial_path.name)
            if self.trace_bytes
            else None,
        }


def cuda_in_use(optimizers: list[Any]) -> bool:
    """CUDA activity is traced when the model lives on a GPU."""
    if not torch.cuda.is_available():
        return False
    for opt in optimizers:
        for g in opt.param_groups:
            for p in g["params"]:
                if p.is_cuda:
                    return True
    return torch.cuda.is_initialized()
