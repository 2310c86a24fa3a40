"""The steps.jsonl format: one typed record per training step, and one table of the
per-step signals in it.

The collector writes a line per step from `SIGNALS` (it reads each row's counter from
`collectors.framework.StepCounters`), readers get `StepRecord`s from
`rundir.iter_steps`, and every statistic over "the steps that count" uses `counted`.
A new per-step signal is a counter in the framework's `StepCounters`, a row in
`SIGNALS` and a test: the record, the host phases of the Analysis, the straggler
causes and the displays follow from the row.

Versions: lines written now carry ``"v": 2``; a line without ``"v"`` is version 1
and goes through `upgrade_v1`, which says what version 1 lacked. A line of a newer
version is refused with one line (`rundir.RunDirError`): its fields may mean
something this pardiag does not know.

A version-2 line::

    {"v": 2, "step": 7, "t_end_ns": ..., "dur_us": 812.5, "pardiag_us": 3.1,
     "pardiag_cpu_us": 2.9,                             # its CPU time (pardiag's own work)
     "source": "optimizer", "data_us": ..., "bwd_us": ..., "backwards": 1,
     "data_cpu_us": ..., "data_calls": 1,               # only when the loop fetched input
     "opt_us": ..., "fwd_us": ..., "forwards": 1,       # only when observed
     "faults": 2051, "bwd_faults": 2040,                # minor page faults (Unix)
     "in_elems": 4096, "gc_us": 0.0, "gcs": 0,          # host signals (host_signals.py),
     "cpu_us": ..., "pcpu_us": ..., "runq_us": ...,    # each where the OS offers it
     "nivcsw": 3,
     "rss_mb": 812.4,
     "act_bytes": 2.1e9, "dev_alloc_bytes": 6.3e9,     # sampled steps, GPU only
     "profiler": "active"}                              # only inside the window

A signal that was not observed in a step (no DDP forward seen) is absent from the
line and None in the record: missing is not zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from pardiag.rundir import RunDirError

VERSION = 2

WARMUP_STEPS = 1  # step 0 carries one-time costs (allocator, first collectives)
# A step in which pardiag itself spent this long (opening or closing the profiler,
# writing the trace: its CPU time there, not its waits for a core or the GIL) is left
# out of the statistics of undisturbed steps.
DISTURBED_US = 1000.0

Source = Literal["optimizer", "explicit"]


@dataclass(frozen=True, slots=True)
class Signal:
    """One per-step signal: how it is measured, written, read and shown."""

    name: str  # as shown and as keyed in the Analysis ("dataloader")
    key: str  # its JSON key in steps.jsonl ("data_us")
    counter: str  # the StepCounters attribute the collector reads
    where: str  # where it is measured, in words
    unit: Literal["us", "count"]  # "us": the counter is in ns and written in us
    host_phase: bool  # its median over counted steps is a rank's host phase (host_phases_us)
    colour: str | None = None  # display colour; the table's order is the display order
    cause: str | None = None  # the straggler cause it maps to (stragglers.CAUSE_NAMES)
    observed_by: str | None = None  # a counter that is 0 when it was not observed: key left out
    holds_wait: bool = False  # includes the wait for other ranks (DDP's all-reduce in backward)


SIGNALS: tuple[Signal, ...] = (
    Signal("dataloader", "data_us", "data_ns", "DataLoader iterator's __next__ (framework.py)", "us", True,
           colour="#3aa57a", cause="dataloader"),
    Signal("forward", "fwd_us", "fwd_ns", "DDP module's forward (framework.py)", "us", True,
           colour="#5b9bd5", cause="forward", observed_by="forwards"),
    Signal("backward", "bwd_us", "bwd_ns", "torch.autograd.backward, DDP's wait included (framework.py)", "us", True,
           colour="#2f5f9e", cause="backward", holds_wait=True),
    Signal("optimizer", "opt_us", "opt_ns", "the lead optimizer's step() (runtime.py hooks)", "us", True,
           colour="#d9a53a", cause="optimizer"),
    Signal("dataloader_cpu", "data_cpu_us", "data_cpu_ns", "CPU time of the training thread inside the DataLoader "
           "iterator's __next__ (thread_time, framework.py): the loading the loop does itself", "us", False,
           observed_by="data_calls"),
    Signal("dataloader_calls", "data_calls", "data_calls", "DataLoader __next__ calls in the step (framework.py)",
           "count", False, observed_by="data_calls"),
    Signal("backwards", "backwards", "backwards", "backward calls in the step (framework.py)", "count", False),
    Signal("forwards", "forwards", "forwards", "DDP forward calls in the step (framework.py)", "count", False,
           observed_by="forwards"),
    Signal("page_faults", "faults", "faults", "the process's minor page faults in the step, all threads "
           "(getrusage at the boundary, runtime.py)", "count", False, observed_by="faults_seen"),
    Signal("backward_page_faults", "bwd_faults", "bwd_faults", "the process's minor page faults inside "
           "torch.autograd.backward (framework.py)", "count", False, observed_by="faults_seen"),
    Signal("input_elements", "in_elems", "in_elems", "elements of the first tensor argument of the step's DDP "
           "forwards (framework.py)", "count", False, observed_by="forwards"),
    Signal("gc", "gc_us", "gc_ns", "Python garbage-collection pauses, any thread (gc.callbacks, host_signals.py)",
           "us", False, observed_by="gc_seen"),
    Signal("gcs", "gcs", "gcs", "garbage collections in the step (host_signals.py)", "count", False,
           observed_by="gc_seen"),
    Signal("cpu", "cpu_us", "cpu_ns", "CPU time of the training thread (schedstat or thread_time, host_signals.py)",
           "us", False, observed_by="cpu_seen"),
    Signal("process_cpu", "pcpu_us", "pcpu_ns", "CPU time of the rank's process, all its threads (the "
           "collectives' worker threads too; process_time, host_signals.py)", "us", False, observed_by="pcpu_seen"),
    Signal("run_queue", "runq_us", "runq_ns", "time the training thread was runnable but waited for a CPU "
           "(/proc schedstat, host_signals.py)", "us", False, observed_by="runq_seen"),
    Signal("involuntary_switches", "nivcsw", "nivcsw", "the training thread's involuntary context switches "
           "(getrusage RUSAGE_THREAD, host_signals.py)", "count", False, observed_by="nivcsw_seen"),
    Signal("rss_mb", "rss_mb", "rss_mb", "the process's resident memory at the step's end, MiB "
           "(/proc/self/statm, host_signals.py)", "count", False, observed_by="rss_seen"),
    Signal("activations", "act_bytes", "act_bytes", "device bytes allocated just before the step's first backward "
           "less those at its first DDP/FSDP forward (or its start): what forward left for backward; sampled steps "
           "on a GPU (device_memory.py)", "count", False, observed_by="act_seen"),
    Signal("device_allocated", "dev_alloc_bytes", "dev_alloc_bytes", "device bytes allocated at the step's end "
           "(torch.cuda.memory_allocated; sampled steps on a GPU, device_memory.py)", "count", False,
           observed_by="dev_alloc_seen"),
)


def signal(name: str) -> Signal:
    """The row of `SIGNALS` called `name`; KeyError for none."""
    for s in SIGNALS:
        if s.name == name:
            return s
    raise KeyError(name)


def host_phases() -> tuple[Signal, ...]:
    """The signals shown per rank as host phases, in display order."""
    return tuple(s for s in SIGNALS if s.host_phase)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One line of steps.jsonl, upgraded to the current version."""

    step: int
    t_end_ns: int | None  # wall clock at the step's end
    dur_us: float | None  # None: no activity before the first step end to time it from
    pardiag_us: float  # pardiag's own work at the previous boundary, inside this step
    profiler: str | None = None  # the profiler window's phase ("warmup", "active"), None outside
    source: Source = "optimizer"  # what ended the step: the optimizer hook or pardiag.step()
    signals: Mapping[str, float] = field(default_factory=dict)  # signal name -> value, observed ones only
    # the training thread's CPU time in that boundary; None where the OS does not tell
    pardiag_cpu_us: float | None = None

    @property
    def pardiag_own_us(self) -> float:
        """pardiag's own work at the previous boundary: the CPU time it burned there
        (its wall time where that is not known). The wall time also holds waits that are
        not pardiag's: for a core, or for the GIL that another thread of the job holds
        (collectors.runtime._thread_cpu_ns), and those fall elsewhere in the step without
        pardiag."""
        return self.pardiag_us if self.pardiag_cpu_us is None else self.pardiag_cpu_us

    def get(self, name: str) -> float | None:
        """A signal's value in this step; None when it was not observed."""
        return self.signals.get(name)

    def to_dict(self) -> dict[str, Any]:
        """The version-2 JSON object of this record (what the collector writes)."""
        out: dict[str, Any] = {"v": VERSION, "step": self.step, "t_end_ns": self.t_end_ns, "dur_us": self.dur_us,
                               "pardiag_us": self.pardiag_us, "source": self.source}
        if self.pardiag_cpu_us is not None:
            out["pardiag_cpu_us"] = self.pardiag_cpu_us
        for s in SIGNALS:
            if s.name in self.signals:
                out[s.key] = self.signals[s.name]
        if self.profiler is not None:
            out["profiler"] = self.profiler
        return out


def is_disturbed(rec: StepRecord) -> bool:
    """pardiag itself worked long enough in this step to change its duration."""
    return rec.pardiag_own_us >= DISTURBED_US


def counted(rec: StepRecord) -> bool:
    """The one definition of a step that counts (an "undisturbed" step): past the
    warm-up, outside the profiler window and not disturbed by pardiag's own work."""
    return rec.step >= WARMUP_STEPS and rec.profiler is None and rec.pardiag_own_us < DISTURBED_US


def counter_fields() -> tuple[tuple[str, str, float | None, str | None], ...]:
    """For the collector, from `SIGNALS`: (JSON key, counter, divisor or None, observed_by)
    per signal, computed once so the per-step loop does no lookups in the table."""
    return tuple((s.key, s.counter, 1e3 if s.unit == "us" else None, s.observed_by) for s in SIGNALS)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if isinstance(v, int) else float(v)


def upgrade_v1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 object in the version-2 shape. Version 1 (every line written before
    "v" existed):
    - had no "v";
    - wrote "source" only for `pardiag.step()` steps: absent means the optimizer hook;
    - early lines lack "pardiag_us" (written before pardiag timed its own work): 0;
    - a signal key that is absent was not observed (no DDP forward: no "fwd_us"):
      it stays absent, so the record says None, not 0; readers before version 2
      turned some of these into 0.
    Everything else meant the same."""
    out = dict(obj)
    out["v"] = VERSION
    if out.get("source") != "explicit":
        out["source"] = "optimizer"
    if _number(out.get("pardiag_us")) is None:
        out["pardiag_us"] = 0.0
    return out


def parse(obj: Any, path: Path | str = "steps.jsonl") -> StepRecord | None:
    """The record of one decoded JSON line; None for a line that is no step record
    (not an object, no integer "step"). A newer version raises RunDirError."""
    if not isinstance(obj, dict):
        return None
    v = obj.get("v", 1)
    if not isinstance(v, int) or isinstance(v, bool):
        return None
    if v > VERSION:
        raise RunDirError(f"{path}: steps format version {v} is newer than this pardiag understands "
                          f"({VERSION}); upgrade pardiag")
    if v < VERSION:
        obj = upgrade_v1(obj)
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    t_end = obj.get("t_end_ns")
    prof = obj.get("profiler")
    signals = {s.name: x for s in SIGNALS if (x := _number(obj.get(s.key))) is not None}
    return StepRecord(
        step=step,
        t_end_ns=t_end if isinstance(t_end, int) and not isinstance(t_end, bool) else None,
        dur_us=_number(obj.get("dur_us")),
        pardiag_us=_number(obj.get("pardiag_us")) or 0.0,
        profiler=prof if isinstance(prof, str) and prof else None,
        source="explicit" if obj.get("source") == "explicit" else "optimizer",
        signals=signals,
        pardiag_cpu_us=_number(obj.get("pardiag_cpu_us")),
    )
