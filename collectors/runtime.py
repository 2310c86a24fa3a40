"""The collector inside a training process.

Installed right after the process imports torch. A step ends when the script's
optimizer finishes `step()` (a global optimizer hook, so plain loops, Lightning,
the HF Trainer and Accelerate all work unchanged) or when the script calls
`pardiag.step()`. Nothing is written before the first step.

Per step, one line in `steps.jsonl` (host timestamps, the counters named in
`pardiag.step_records.SIGNALS`; the format is that module's). On the
configured steps, a torch.profiler window. `meta.json` is written after the first
steps, when the window closes and at exit. Every failure is caught, recorded in
`meta.json` and switches the failing part off: the training never sees an error
from pardiag.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from pardiag import rundir, step_records
from pardiag.redact import safe_redact
from pardiag.redact import redact_argv
from pardiag.collectors.bootstrap import ENV_RUN_DIR, _PostImportFinder
from pardiag.collectors.config import CollectorConfig
from pardiag.collectors.framework import Framework, minor_faults
from pardiag.collectors.host_signals import HostProbe
from pardiag.collectors.slowdown import SlowdownWatch
from pardiag.collectors.profiler import ProfilerWindow, cuda_in_use

RANK_VARS = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "MV2_COMM_WORLD_RANK",
    "HOROVOD_RANK",
    "SLURM_PROCID",
)
WORLD_VARS = (
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "MV2_COMM_WORLD_SIZE",
    "HOROVOD_SIZE",
    "SLURM_NTASKS",
)
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
MAX_ERRORS = 50


def _thread_cpu_ns() -> int | None:
    """The calling thread's CPU time, or None where the OS does not tell: pardiag's own
    work at a step boundary is the CPU time it burns there. Its wall time there also holds
    what the thread waited for that is not pardiag's: a core (a rank whose CPU another
    process shares), or a lock such as the GIL, which another thread of the job may hold
    while it waits for that core (the contended scenario's rank 1: boundaries of 1.5-7 ms
    of wall time in 0.15-0.5 ms of CPU, none of it on the run queue, between two lines of
    pure Python; its peer's took 0.2-0.5 ms)."""
    try:
        return time.thread_time_ns()
    except (AttributeError, OSError):
        return None


def resolve_rank(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """The process's rank: torch.distributed when initialised, else the launcher's variables."""
    info: dict[str, Any] = {"rank": None, "world_size": None, "local_rank": None, "source": None}
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            info.update(
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                backend=str(dist.get_backend()),
                source="torch.distributed",
            )
    except Exception:
        pass
    if info["rank"] is None:
        for var in RANK_VARS:
            v = environ.get(var, "")
            if v.isdigit():
                info.update(rank=int(v), source=var)
                break
    if info["world_size"] is None:
        for var in WORLD_VARS:
            v = environ.get(var, "")
            if v.isdigit():
                info["world_size"] = int(v)
                break
    for var in LOCAL_RANK_VARS:
        v = environ.get(var, "")
        if v.isdigit():
            info["local_rank"] = int(v)
            break
    if info["rank"] is None:
        info.update(rank=0, world_size=info["world_size"] or 1, source="default")
    return info


class Collector:
    def __init__(self, run: rundir.RunDir, cfg: CollectorConfig) -> None:
        self.run = run
        self.cfg = cfg
        self.pid = os.getpid()
        self.host = rundir.hostname()
        self.errors: list[dict[str, Any]] = []
        self.disabled: set[str] = set()
        self.framework = Framework(self._error)
        self.step = 0  # global number of the step in progress
        self.rank_info: dict[str, Any] | None = None
        self.steps_out: rundir.StepsWriter | None = None
        self.window: ProfilerWindow | None = None
        self.extra_window: ProfilerWindow | None = None  # recorded when the job slowed down
        self.watch: SlowdownWatch | None = None
        self._watch_failed = False
        self.explicit_steps = False
        self.lead_optimizer: weakref.ref[Any] | None = None
        self.opt_t0: int | None = None
        self.signal_fields = step_records.counter_fields()
        self.prev_end_ns: int | None = None
        self.prev_faults: int | None = None  # the process's minor page faults at the last boundary
        self.boundary_ns = 0
        self.boundary_cpu_ns: int | None = None  # the thread's CPU time in the boundary
        self.started_wall_ns = time.time_ns()
        self.exit_info: dict[str, Any] = {"status": "running"}
        self.meta_writes = 0
        self._lock = threading.Lock()
        self._hooks: list[Any] = []
        self.host_probe: HostProbe | None = None

    # -- wiring ---------------------------------------------------------------------------

    def install(self) -> None:
        self.framework.install()
        try:  # built here, in the thread that imports torch: the training thread
            self.host_probe = HostProbe(self._error)
            self.host_probe.install_gc()
        except Exception as e:
            self._error("host", e)
            self.host_probe = None
        from torch.optim import optimizer as optim_mod

        self._hooks.append(optim_mod.register_optimizer_step_pre_hook(self._on_opt_pre))
        self._hooks.append(optim_mod.register_optimizer_step_post_hook(self._on_opt_post))
        if "torch._dynamo" in sys.modules:
            self.framework.skip_in_dynamo()
        else:
            sys.meta_path.insert(0, _PostImportFinder("torch._dynamo", self.framework.skip_in_dynamo))
        if "torch.distributed.fsdp" in sys.modules:
            self.framework.patch_fsdp(sys.modules["torch.distributed.fsdp"])
        else:
            sys.meta_path.insert(
                0, _PostImportFinder("torch.distributed.fsdp", self.framework.patch_fsdp)
            )
        atexit.register(self.at_exit)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A forked child (DataLoader worker) is not this rank: it must not write.
        self.disabled.add("all")
        self.steps_out = None
        self.window = None
        if self.host_probe is not None:
            self.host_probe.uninstall()
            self.host_probe = None

    def _error(self, where: str, e: BaseException) -> None:
        # The text is redacted here, once: meta.json never holds it unredacted.
        if len(self.errors) < MAX_ERRORS:
            try:
                text = f"{type(e).__name__}: {e}"
            except Exception:
                text = type(e).__name__
            self.errors.append(
                {
                    "where": where,
                    "error": safe_redact(text),
                    "step": self.step,
                    "traceback": safe_redact(traceback.format_exc(limit=6)),
                }
            )

    # -- hooks ----------------------------------------------------------------------------

    def _on_opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._is_lead(opt):
                self.opt_t0 = time.perf_counter_ns()
                if self.framework.framework is None:
                    self.framework.note_step_caller(sys._getframe(1))
        except Exception as e:
            self._error("optimizer_pre", e)

    def _on_opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.explicit_steps or "all" in self.disabled:
            return
        try:
            if not self._is_lead(opt):
                return
            if self.opt_t0 is not None:
                self.framework.counters.opt_ns = time.perf_counter_ns() - self.opt_t0
                self.opt_t0 = None
            self.advance("optimizer")
        except Exception as e:
            self._error("optimizer_post", e)

    def _is_lead(self, opt: Any) -> bool:
        """Only the first optimizer stepped ends a step (a GAN steps two per iteration)."""
        lead = self.lead_optimizer() if self.lead_optimizer is not None else None
        if lead is None:
            self.lead_optimizer = weakref.ref(opt)
            self.framework.note_optimizer(opt)
            return True
        if lead is not opt:
            self.framework.note_optimizer(opt)
        return lead is opt

    def explicit_step(self) -> None:
        """`pardiag.step()`: the script marks step ends itself; optimizer hooks stop counting."""
        if "all" in self.disabled:
            return
        self.explicit_steps = True
        try:
            self.advance("explicit")
        except Exception as e:
            self._error("step", e)

    # -- the step boundary ---------------------------------------------------------------

    def advance(self, source: str) -> None:
        with self._lock:
            now = time.perf_counter_ns()
            cpu0 = _thread_cpu_ns()
            wall = time.time_ns()
            if self.rank_info is None:
                self._start()
            fw = self.framework
            c = fw.counters
            faults = minor_faults()
            if faults is not None and self.prev_faults is not None:
                c.faults, c.faults_seen = faults - self.prev_faults, 1
            self.prev_faults = faults
            if self.host_probe is not None:
                try:
                    self.host_probe.fill(c)
                except Exception as e:
                    self._error("host", e)
                    self.host_probe.uninstall()
                    self.host_probe = None
            fw.device_memory.end_step(c)
            begin = self.prev_end_ns if self.prev_end_ns is not None else fw.first_activity_ns
            rec: dict[str, Any] = {
                "v": step_records.VERSION,
                "step": self.step,
                "t_end_ns": wall,
                "dur_us": (now - begin) / 1e3 if begin is not None else None,
                "pardiag_us": self.boundary_ns / 1e3,
                "source": source,
            }
            if self.boundary_cpu_ns is not None:
                rec["pardiag_cpu_us"] = self.boundary_cpu_ns / 1e3
            for key, counter, per, observed_by in self.signal_fields:
                if observed_by is None or getattr(c, observed_by):
                    rec[key] = getattr(c, counter) / per if per else getattr(c, counter)
            if self.window is not None:
                ph = self.window.phase_of(self.step)
                if not ph and self.extra_window is not None:
                    ph = self.extra_window.phase_of(self.step)
                    if ph:
                        rec["window"] = 2
                if ph:
                    rec["profiler"] = ph
            fw.backwards_per_step.append(c.backwards)
            if len(fw.backwards_per_step) > 1000:
                del fw.backwards_per_step[:500]
            c.reset()
            if self.steps_out is not None:
                try:
                    self.steps_out.write(rec)
                except Exception as e:
                    self._error("steps", e)
                    self.steps_out = None
            self.step += 1
            fw.device_memory.start_step(self.step)
            if self.window is not None:
                was_running = self.window.state == "running"
                self.window.on_boundary(self.step)
                if was_running and self.window.state != "running":
                    self.write_meta()  # window closed: record what it captured
                if not self._watch_failed:
                    try:
                        self._watch(rec)
                    except Exception as e:  # the step boundary's own bookkeeping goes on
                        self._watch_failed = True
                        self._error("slowdown", e)
            if self.step == self.cfg.meta_sample_steps:
                self.write_meta()
            # The step ends now; what pardiag does at the boundary (opening or closing
            # the profiler, writing the trace) is part of the next step's wall time and
            # is reported in its `pardiag_us`, so analyses can tell it apart.
            self.prev_end_ns = now
            cpu1 = _thread_cpu_ns() if cpu0 is not None else None
            self.boundary_ns = time.perf_counter_ns() - now
            self.boundary_cpu_ns = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None

    def _watch(self, rec: dict[str, Any]) -> None:
        """After the first window: watch for a slowdown and run the extra window."""
        w = self.window
        if w is None or w.state in ("pending", "running") or not self.cfg.profile_on_slowdown:
            return
        if self.extra_window is not None:
            was_running = self.extra_window.state == "running"
            self.extra_window.on_boundary(self.step)
            if was_running and self.extra_window.state != "running":
                self.write_meta()
            return
        if self.watch is None:
            self.watch = SlowdownWatch(self._error)
        own = rec.get("pardiag_cpu_us", rec["pardiag_us"])
        counts = "profiler" not in rec and own < step_records.DISTURBED_US
        start = self.watch.on_step(rec["step"], rec.get("dur_us"), counts)
        if start is None or self.rank_info is None:
            return
        rank = self.rank_info["rank"]
        sched = replace(self.cfg.schedule, wait=max(start, self.step))
        self.extra_window = ProfilerWindow(replace(self.cfg, schedule=sched), self.run.trace(rank, 2),
                                           self.run.partial_trace(rank, 2), use_cuda=self.window.use_cuda,
                                           on_error=self._error)
        self.extra_window.on_boundary(self.step)

    def _start(self) -> None:
        info = resolve_rank(os.environ)
        self.rank_info = info
        rank = info["rank"]
        self.run.rank_dir(rank).mkdir(parents=True, exist_ok=True)
        try:
            self.steps_out = rundir.StepsWriter(self.run.steps(rank))
        except Exception as e:
            self._error("steps", e)
        if self.cfg.profiles_rank(rank):
            self.window = ProfilerWindow(
                self.cfg,
                self.run.trace(rank),
                self.run.partial_trace(rank),
                use_cuda=cuda_in_use(self.framework._live_optimizers()),
                on_error=self._error,
            )
        self.write_meta()

    # -- meta -----------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        info = dict(self.rank_info or {})
        doc: dict[str, Any] = {
            "format": rundir.META_FORMAT,
            "format_version": rundir.META_VERSION,
            "rank": info.get("rank"),
            "world_size": info.get("world_size"),
            "local_rank": info.get("local_rank"),
            "rank_source": info.get("source"),
            "backend": info.get("backend"),
            "host": self.host,
            "pid": self.pid,
            "started_ns": self.started_wall_ns,
            "updated_ns": time.time_ns(),
            "steps_completed": self.step,
            "step_source": "explicit" if self.explicit_steps else "optimizer",
            "argv": redact_argv(sys.argv),
            "exit": self.exit_info,
        }
        doc.update(self.framework.facts())
        if self.window is not None:
            doc["profiler"] = self.window.status()
        else:
            rank = info.get("rank")
            doc["profiler"] = {
                "status": "skipped",
                "reason": "profiling is off" if not self.cfg.profile else f"rank {rank} not in --ranks",
            }
        if self.watch is not None or self.extra_window is not None:
            extra = self.extra_window.status() if self.extra_window is not None else {"status": "not needed"}
            if self.watch is not None:
                extra["trigger"] = self.watch.trigger
                extra["watch_stopped"] = self.watch.off
            doc["profiler_extra"] = [extra]
        doc["collectors"] = {
            "steps": {"status": "ok" if self.steps_out is not None else "failed"},
            "profiler": {"status": doc["profiler"]["status"], "reason": doc["profiler"].get("reason")},
            "meta": {"status": "ok"},
        }
        doc["errors"] = self.errors
        return doc

    def write_meta(self) -> None:
        if self.rank_info is None or "all" in self.disabled:
            return
        try:
            rundir.atomic_write_json(self.run.meta(self.rank_info["rank"]), self.meta(), durable=False)
            self.meta_writes += 1
        except Exception as e:
            self._error("meta", e)

    # -- exit -----------------------------------------------------------------------------

    def _excepthook(self, etype: Any, value: Any, tb: Any) -> None:
        try:
            self.exit_info = {
                "status": "exception",
                "type": getattr(etype, "__name__", str(etype)),
                "message": safe_redact(str(value)[:2000]),
                "step": self.step,
            }
            if "torch.distributed" in sys.modules:  # the collectives this rank issued, as it failed
                from pardiag.collectors.flight_dump import dump_on_failure

                rank = (self.rank_info or resolve_rank(os.environ))["rank"]
                if rank is not None:
                    dump_on_failure(self.run, int(rank))
        except Exception:
            pass
        self._previous_excepthook(etype, value, tb)

    def at_exit(self) -> None:
        if "all" in self.disabled:
            return
        try:
            if self.exit_info.get("status") == "running":
                self.exit_info = {"status": "exited", "step": self.step}
            if self.window is not None:
                self.window.finish()
            if self.extra_window is not None:
                self.extra_window.finish()
            if self.steps_out is not None:
                self.steps_out.close()
            self.write_meta()
        except Exception:
            pass


_collector: Collector | None = None


def install() -> None:
    """Called once torch is imported in a worker process. Never raises."""
    global _collector
    if _collector is not None:
        return
    try:
        run = rundir.RunDir(Path(os.environ[ENV_RUN_DIR]))
        cfg = CollectorConfig.from_env()
        c = Collector(run, cfg)
        c.install()
        _collector = c
    except Exception as e:
        _record_install_failure(e)


def _record_install_failure(e: BaseException) -> None:
    try:
        run = rundir.RunDir(Path(os.environ[ENV_RUN_DIR]))
        path = run.bootstrap_error(rundir.hostname(), os.getpid())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("pardiag collector failed to install:\n" + traceback.format_exc())
    except Exception:
        pass


def collector() -> Collector | None:
    return _collector
