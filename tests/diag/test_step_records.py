"""steps.jsonl records: the version-1 lines every earlier pardiag wrote upgrade to the
typed record, version 2 round-trips from the collector's writer through the reader, a
newer version is refused with one line, and a new per-step signal is a row in the table
plus a counter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pardiag import rundir, step_records
from pardiag.analyzers.pipeline import _host_phases
from pardiag.analyzers.stragglers import RankEvidence, find_stragglers
from pardiag.step_records import SIGNALS, Signal, StepRecord, counted, parse, upgrade_v1

# Lines as the collector wrote them before "v" existed (version 1): a plain step, a step
# with DDP forwards inside the profiler window, a pardiag.step() step, the first step.
V1_PLAIN = ('{"step":5,"t_end_ns":1764553000123456789,"dur_us":1523.4,"pardiag_us":2.5,"data_us":120.0,'
            '"bwd_us":800.25,"opt_us":90.5,"backwards":1}')
V1_DDP_PROFILED = ('{"step":8,"t_end_ns":1764553000223456789,"dur_us":2100.0,"pardiag_us":3.0,"data_us":100.0,'
                   '"bwd_us":900.0,"opt_us":80.0,"backwards":1,"fwd_us":400.0,"forwards":1,"profiler":"active"}')
V1_EXPLICIT = ('{"step":2,"t_end_ns":1764553000323456789,"dur_us":1000.0,"pardiag_us":1.0,"data_us":0.0,'
               '"bwd_us":500.0,"opt_us":0.0,"backwards":1,"source":"explicit"}')
V1_FIRST = ('{"step":0,"t_end_ns":1764553000023456789,"dur_us":null,"pardiag_us":0.0,"data_us":0.0,'
            '"bwd_us":0.0,"opt_us":0.0,"backwards":0}')


def test_a_version_1_line_upgrades_to_the_typed_record() -> None:
    rec = parse(json.loads(V1_PLAIN))
    assert rec == StepRecord(step=5, t_end_ns=1764553000123456789, dur_us=1523.4, pardiag_us=2.5, profiler=None,
                             source="optimizer",
                             signals={"dataloader": 120.0, "backward": 800.25, "optimizer": 90.5, "backwards": 1})
    assert rec.get("forward") is None and rec.get("forwards") is None  # not observed: missing, not 0
    assert counted(rec)

    ddp = parse(json.loads(V1_DDP_PROFILED))
    assert ddp is not None and ddp.get("forward") == 400.0 and ddp.get("forwards") == 1
    assert ddp.profiler == "active" and not counted(ddp)

    explicit = parse(json.loads(V1_EXPLICIT))
    assert explicit is not None and explicit.source == "explicit" and explicit.get("optimizer") == 0.0

    first = parse(json.loads(V1_FIRST))
    assert first is not None and first.dur_us is None and not counted(first)  # the warm-up step


def test_upgrade_v1_says_what_version_1_lacked() -> None:
    up = upgrade_v1({"step": 3, "dur_us": 10.0})
    assert up == {"v": 2, "step": 3, "dur_us": 10.0, "source": "optimizer", "pardiag_us": 0.0}
    rec = parse({"step": 3, "dur_us": 10.0})
    assert rec == StepRecord(step=3, t_end_ns=None, dur_us=10.0, pardiag_us=0.0, signals={})


def test_counted_is_the_one_definition() -> None:
    def rec(step: int, pardiag_us: float = 0.0, profiler: str | None = None) -> StepRecord:
        return StepRecord(step=step, t_end_ns=None, dur_us=100.0, pardiag_us=pardiag_us, profiler=profiler)

    assert counted(rec(1)) and counted(rec(9, pardiag_us=999.9))
    assert not counted(rec(0))  # warm-up
    assert not counted(rec(4, profiler="warmup")) and not counted(rec(4, profiler="active"))
    assert not counted(rec(7, pardiag_us=1000.0))  # pardiag opened or closed the profiler in it
    # a boundary of 5 ms in which pardiag burned 0.5 ms of CPU (it waited the rest) counts;
    # one that burned 2.0 ms does not; without the CPU time, its wall time decides
    waited = StepRecord(step=5, t_end_ns=None, dur_us=100.0, pardiag_us=5000.0, pardiag_cpu_us=500.0)
    assert waited.pardiag_own_us == 500.0 and counted(waited)
    assert not counted(StepRecord(step=5, t_end_ns=None, dur_us=100.0, pardiag_us=5000.0, pardiag_cpu_us=2000.0))
    # the field round-trips, and a line without it reads None (not 0: not measured)
    assert parse(waited.to_dict()) == waited
    assert parse({"v": 2, "step": 5, "dur_us": 1.0, "pardiag_us": 5000.0}).pardiag_cpu_us is None


def test_a_newer_version_is_refused_with_one_line(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    p.write_text(V1_PLAIN + "\n" + '{"v":3,"step":6,"dur_us":1.0,"signals":{}}\n')
    with pytest.raises(rundir.RunDirError) as e:
        list(rundir.iter_steps(p))
    msg = str(e.value)
    assert "\n" not in msg and "newer than this pardiag understands" in msg and msg.endswith("upgrade pardiag")
    assert str(p) in msg and "version 3" in msg


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    p.write_text(V1_FIRST + "\n" + V1_PLAIN + "\n" + V1_PLAIN[:40])
    assert [r.step for r in rundir.iter_steps(p)] == [0, 5]


def test_mixed_versions_in_one_file(tmp_path: Path) -> None:
    """A run resumed by a newer pardiag appends version-2 lines after version-1 ones."""
    p = tmp_path / "steps.jsonl"
    v2 = StepRecord(step=6, t_end_ns=1, dur_us=1500.0, pardiag_us=2.0, signals={"dataloader": 110.0}).to_dict()
    p.write_text(V1_PLAIN + "\n" + json.dumps(v2) + "\n")
    recs = list(rundir.iter_steps(p))
    assert [r.step for r in recs] == [5, 6] and recs[1].get("dataloader") == 110.0 and recs[1].get("backward") is None


# -- the collector's writer, in process ---------------------------------------------------


def _collector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from pardiag.collectors.config import CollectorConfig
    from pardiag.collectors.runtime import Collector

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    c = Collector(rundir.RunDir(tmp_path), CollectorConfig(profile=False))
    c.framework.first_activity_ns = time.perf_counter_ns()
    return c


def _step(c, **counters: int) -> None:  # type: ignore[no-untyped-def]
    """One step with these counter values (ns, or calls) ended by the optimizer hook."""
    for k, v in counters.items():
        setattr(c.framework.counters, k, v)
    c.advance("optimizer")
    c.boundary_ns = 0  # pardiag's own boundary work on this machine is not under test
    if c.boundary_cpu_ns is not None:
        c.boundary_cpu_ns = 0


def test_a_version_2_line_round_trips_through_the_writer_and_the_reader(tmp_path: Path, monkeypatch) -> None:
    c = _collector(tmp_path, monkeypatch)
    _step(c, data_ns=5_000, bwd_ns=40_000, backwards=1, opt_ns=7_000)
    _step(c, data_ns=6_000, data_cpu_ns=2_000, data_calls=1, bwd_ns=41_000, backwards=1, opt_ns=8_000,
          fwd_ns=20_000, forwards=2)
    c.at_exit()
    lines = [json.loads(x) for x in c.run.steps(0).read_text().splitlines()]
    assert [x["v"] for x in lines] == [2, 2] and [x["source"] for x in lines] == ["optimizer", "optimizer"]
    assert "fwd_us" not in lines[0] and "forwards" not in lines[0]  # no forward seen: left out
    assert "data_cpu_us" not in lines[0] and "data_calls" not in lines[0]  # no fetch counted: left out
    assert (lines[1]["data_cpu_us"], lines[1]["data_calls"]) == (2.0, 1)
    assert (lines[1]["data_us"], lines[1]["bwd_us"], lines[1]["opt_us"], lines[1]["fwd_us"], lines[1]["forwards"]) == (
        6.0, 41.0, 8.0, 20.0, 2)
    recs = rundir.read_steps(c.run, 0)
    assert [r.to_dict() for r in recs] == lines  # what was written is what is read
    assert recs[0].signals == {"dataloader": 5.0, "backward": 40.0, "optimizer": 7.0, "backwards": 1}
    assert recs[1].get("forward") == 20.0 and recs[1].get("forwards") == 2
    assert recs[1].dur_us is not None and recs[1].dur_us > 0 and recs[1].pardiag_us == 0.0


@pytest.mark.parametrize("rival", ["process", "thread"])
def test_what_its_boundary_waited_for_is_not_pardiags_work(tmp_path: Path, monkeypatch, rival: str) -> None:
    """Each step boundary does 30 ms of CPU work while a rival spins: a process on this
    thread's one CPU (the boundary waits on the run queue), or a Python thread of this
    process (it waits for the GIL, on any core). The boundary's wall time is about twice
    its work; pardiag's own time is the 30 ms of work."""
    from pardiag.collectors.runtime import _thread_cpu_ns

    if rival == "process" and not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs CPU affinity (Linux)")
    if _thread_cpu_ns() is None:
        pytest.skip("this OS does not tell a thread's CPU time")
    c = _collector(tmp_path, monkeypatch)
    work_ns = 30_000_000

    def busy(counters) -> None:  # type: ignore[no-untyped-def]
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < work_ns:
            pass

    c.advance("optimizer")  # the first boundary also sets the rank up (its directory, files)
    monkeypatch.setattr(c.framework.device_memory, "end_step", busy)
    stop = threading.Event()
    mask = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if rival == "process":
        cpu = min(mask)  # type: ignore[arg-type]
        spinner = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
        os.sched_setaffinity(0, {cpu})  # this thread only
        time.sleep(0.3)  # the spinner pinned and running
    else:
        def spin() -> None:
            while not stop.is_set():
                pass

        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
    try:
        for _ in range(4):
            c.advance("optimizer")
    finally:
        if rival == "process":
            os.sched_setaffinity(0, mask)  # type: ignore[arg-type]
            spinner.kill()
            spinner.wait()
        else:
            stop.set()
            thread.join()
    c.at_exit()
    recs = rundir.read_steps(c.run, 0)[2:]  # each holds the boundary before it: those with the work
    assert len(recs) == 3
    # it waited for the rival about as long as it worked (here 25-82 ms per boundary, own 30.1-32.0)
    assert sum(r.pardiag_us - r.pardiag_own_us for r in recs) > work_ns / 1e3, recs
    for r in recs:
        assert r.pardiag_cpu_us is not None, r
        # the 30 ms burned and pardiag's own bookkeeping: 0.02-0.6 ms alone; beside the rival
        # the thread's CPU time read 0.1-2.0 ms more on one day, 3.1-3.7 on another and up to
        # 10.8 in a full run on a busy host (a shared host's CPU clock runs on while it waits).
        # Well under the 25-82 ms of waiting, which would make it the wall's 55-110 ms.
        assert work_ns / 1e3 <= r.pardiag_own_us < 1.5 * work_ns / 1e3, r
        assert not counted(r)  # 30 ms of work is a disturbed step all the same


def test_a_new_signal_is_a_table_row_and_a_counter(tmp_path: Path, monkeypatch) -> None:
    """The files a new per-step signal touches: a counter (collectors/framework.py), a row
    in step_records.SIGNALS, a test. Nothing else: the collector writes it, the reader
    types it, the host phases and the straggler causes report it."""
    from pardiag.collectors.framework import StepCounters

    class Counters(StepCounters):  # the counter a new measurement would add
        __slots__ = ("h2d_ns",)

        def reset(self) -> None:
            super().reset()
            self.h2d_ns = 0

    row = Signal("h2d copy", "h2d_us", "h2d_ns", "host-to-device copies", "us", True, colour="#aa00aa",
                 cause="h2d copy")
    monkeypatch.setattr(step_records, "SIGNALS", (*SIGNALS, row))
    c = _collector(tmp_path, monkeypatch)
    c.framework.counters = Counters()
    # step 0 is the warm-up; steps 1-3 count: 1, 3 and 2 ms -> median 2 ms
    for h2d_ms in (9, 1, 3, 2):
        _step(c, h2d_ns=h2d_ms * 1_000_000, bwd_ns=100_000, backwards=1)
    c.at_exit()
    assert [json.loads(x)["h2d_us"] for x in c.run.steps(0).read_text().splitlines()] == [9000.0, 1000.0, 3000.0, 2000.0]
    recs = rundir.read_steps(c.run, 0)
    assert [r.get("h2d copy") for r in recs] == [9000.0, 1000.0, 3000.0, 2000.0]
    phases = _host_phases(recs)
    assert phases["h2d copy"] == 2000.0 and phases["backward"] == 100.0
    assert "forward" not in phases  # never observed: no median, not a 0

    # a rank that spends 20 ms more per step in the new signal is the straggler, for that cause
    def evidence(rank: int, h2d_us: float, bwd_us: float) -> RankEvidence:
        lines = [{"v": 2, "step": i, "dur_us": 30_000.0, "pardiag_us": 0.0, "bwd_us": bwd_us, "h2d_us": h2d_us,
                  "data_us": 50.0} for i in range(10)]
        return RankEvidence(rank, 0, 0.0, {}, [r for x in lines if (r := parse(x)) is not None])

    (s,) = find_stragglers({0: evidence(0, 1_000.0, 25_000.0), 1: evidence(1, 21_000.0, 5_000.0)})
    assert s.rank == 1 and s.cause == "h2d copy" and s.excess_us_per_step == 20_000.0


def test_the_table_matches_what_the_collector_counts() -> None:
    pytest.importorskip("torch")
    from pardiag.collectors.framework import StepCounters

    c = StepCounters()
    for s in SIGNALS:
        assert hasattr(c, s.counter), s.name
        assert s.observed_by is None or hasattr(c, s.observed_by), s.name
    assert len({s.name for s in SIGNALS}) == len({s.key for s in SIGNALS}) == len(SIGNALS)
    assert [s.name for s in SIGNALS if s.holds_wait] == ["backward"]  # the straggler's wait is read from it
    assert [s.name for s in step_records.host_phases()] == ["dataloader", "forward", "backward", "optimizer"]
