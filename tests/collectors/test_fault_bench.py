"""What a page fault of fresh memory costs, measured end to end on this host:
`collectors/fault_bench.py` in a process of its own, written to factors/faults.json and
read back; when `pardiag run` measures it (a CPU rank whose backward faulted in every
step); and what a failed measurement or a damaged file leaves."""

from __future__ import annotations

import json
import mmap
import os
import sys
from pathlib import Path

import pytest

from pardiag import measure, rundir
from pardiag.analyzers import factors

# times measurements against each other: not beside another test (Makefile, TEST_WORKERS)
pytestmark = pytest.mark.timed


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[rundir.RunDir, dict]:
    run = rundir.RunDir(tmp_path_factory.mktemp("faults"))
    return run, measure.measure_faults(run, sys.executable, os.environ)


def test_writing_fresh_memory_costs_more_than_writing_it_again(measured: tuple[rundir.RunDir, dict]) -> None:
    _, doc = measured
    assert doc["status"] == "ok", doc.get("reason")
    assert doc["bytes"] == 16 << 20 and doc["pages"] == (16 << 20) // mmap.PAGESIZE and doc["repeats"] == 15
    # every page of the fresh block is faulted in once (a huge page brings in 512 at once)
    assert doc["pages"] // 512 <= doc["faults"] <= doc["pages"] + 64
    assert doc["fresh_us"] > doc["again_us"] > 0
    # the cost per fault is the difference over the faults, as the file says
    assert doc["us_per_fault"] > 0 and len(doc["each_us_per_fault"]) == 15
    assert min(doc["each_us_per_fault"]) <= doc["us_per_fault"] <= max(doc["each_us_per_fault"])
    assert 0 < doc["seconds"] <= measure.FAULTS_TIMEOUT_S


def test_the_file_reads_back_with_its_source(measured: tuple[rundir.RunDir, dict]) -> None:
    run, doc = measured
    c = factors.fault_cost(run.root)
    assert c is not None and c.us == pytest.approx(doc["us_per_fault"])
    assert c.source.startswith("measured: 16 MB of fresh memory written on this host after the job")


def test_a_python_that_cannot_run_it_fails_in_one_line(tmp_path: Path) -> None:
    run = rundir.RunDir(tmp_path)
    bad = tmp_path / "python"
    bad.write_text("#!/bin/sh\necho 'no interpreter here' >&2\nexit 7\n")
    bad.chmod(0o755)
    doc = measure.measure_faults(run, str(bad), os.environ)
    assert doc["status"] == "failed" and doc["reason"] == "the measurement failed (exit 7): no interpreter here"
    r = factors.read_faults(run.root)
    assert r.value is None and r.reason == "faults.json: the measurement failed (exit 7): no interpreter here"


@pytest.mark.parametrize("content, why", [
    (None, "faults.json: not recorded"),
    ("{not json", "faults.json: unreadable (JSONDecodeError)"),
    (json.dumps({"format": factors.FAULTS_FORMAT, "format_version": 99, "status": "ok"}),
     "faults.json: format version 99 is newer than this pardiag reads (1); upgrade pardiag"),
    (json.dumps({"format": factors.FAULTS_FORMAT, "format_version": 1, "status": "ok", "us_per_fault": 0}),
     "faults.json: unreadable (no cost per fault)"),
])
def test_a_missing_or_damaged_file_is_no_factor_and_says_why(tmp_path: Path, content: str | None, why: str) -> None:
    if content is not None:
        (tmp_path / "factors").mkdir()
        (tmp_path / "factors" / "faults.json").write_text(content)
    r = factors.read_faults(tmp_path)
    assert r.value is None and r.reason == why


def _rank(run: rundir.RunDir, device: str, bwd_faults: float | None, rank: int = 0) -> None:
    run.rank_dir(rank).mkdir(parents=True, exist_ok=True)
    run.meta(rank).write_text(json.dumps({"format": rundir.META_FORMAT, "format_version": rundir.META_VERSION,
                                          "rank": rank, "world_size": 1, "host": f"node{rank}",
                                          "device": {"type": device}}))
    extra = {} if bwd_faults is None else {"faults": bwd_faults + 10, "bwd_faults": bwd_faults}
    lines = [{"v": 2, "step": i, "t_end_ns": None, "dur_us": 50000.0, "pardiag_us": 0.0, "source": "optimizer",
              **extra} for i in range(8)]
    run.steps(rank).write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize("device, bwd_faults, reason", [
    ("cpu", 8160.0, None),
    ("cpu", 999.0, "backward page-faulted fewer than 1000 times per step"),
    ("cpu", 0.0, "backward page-faulted fewer than 1000 times per step"),
    ("cpu", None, "no step records count the page faults"),
    ("cuda", 8160.0, "no rank of this node trained on a CPU"),
])
def test_measured_after_the_job_where_a_cpu_ranks_backward_faulted_in_every_step(
        tmp_path: Path, device: str, bwd_faults: float | None, reason: str | None) -> None:
    run = rundir.RunDir(tmp_path)
    _rank(run, device, bwd_faults)
    got = measure.measure_after_job(run, [sys.executable, "train.py"], "node0", [0], 0, os.environ, quiet=True)
    if reason is None:
        assert got["faults"]["status"] == "ok"
        assert factors.fault_cost(run.root) is not None
    else:
        assert got["faults"] == {"status": "skipped", "reason": reason}
        assert not run.faults_factor.exists()


def test_faults_in_the_profiled_steps_alone_are_timed_too(tmp_path: Path) -> None:
    # the allocator faulted 8,160 times in each of the 3 profiled steps and never outside
    # them: the accumulation estimate counts the window's (summary.backward_faults), so
    # their cost is timed
    run = rundir.RunDir(tmp_path)
    _rank(run, "cpu", 0.0)
    lines = [json.loads(l) for l in run.steps(0).read_text().splitlines()]
    for x in lines[3:6]:
        x.update(profiler="active", bwd_faults=8160.0)
    run.steps(0).write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = measure.measure_after_job(run, [sys.executable, "train.py"], "node0", [0], 0, os.environ, quiet=True)
    assert got["faults"]["status"] == "ok"


def test_of_two_nodes_the_lowest_ranks_measures(tmp_path: Path) -> None:
    run = rundir.RunDir(tmp_path)
    _rank(run, "cpu", 8160.0, rank=0)
    _rank(run, "cpu", 8160.0, rank=1)
    got = measure.measure_after_job(run, [sys.executable, "train.py"], "node1", [1], 0, os.environ, quiet=True)
    assert got["faults"] == {"status": "skipped", "reason": "rank 0's node measures it"}
    assert not run.faults_factor.exists()
