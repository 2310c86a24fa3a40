"""The DataLoader hand-over measured end to end on this CPU: `collectors/loader_bench.py`
in a process of its own at a batch shape, written to factors/loader.json and read back;
when it is measured (the loop waited for its input); and what a failed measurement or a
damaged file leaves."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pardiag import measure, rundir
from pardiag.analyzers import factors

# times measurements against each other: not beside another test (Makefile, TEST_WORKERS)
pytestmark = pytest.mark.timed

torch = pytest.importorskip("torch")


def _meta(shape: list[int]) -> SimpleNamespace:  # what measure_loader reads of a RankMeta
    return SimpleNamespace(inputs={"first": {"shape": shape, "dtype": "float32", "seen_in": "forward"}})


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[rundir.RunDir, dict, dict]:
    """A 32x256 batch (the slow_input scenario's) and a 32 MiB one (32x512x512)."""
    small = rundir.RunDir(tmp_path_factory.mktemp("small"))
    large = rundir.RunDir(tmp_path_factory.mktemp("large"))
    a = measure.measure_loader(small, 0, _meta([32, 256]), sys.executable, os.environ)  # type: ignore[arg-type]
    b = measure.measure_loader(large, 0, _meta([32, 512, 512]), sys.executable, os.environ)  # type: ignore[arg-type]
    return small, a, b


def test_a_ready_batch_is_handed_over_and_a_larger_one_takes_longer(measured: tuple[rundir.RunDir, dict, dict]) -> None:
    _, small, large = measured
    for doc in (small, large):
        assert doc["status"] == "ok", doc.get("reason")
        assert doc["handover_us"] > 0 and doc["samples"] >= 9 and doc["workers"] == measure.LOADER_WORKERS
        assert 0 < doc["seconds"] <= measure.LOADER_TIMEOUT_S
    # 32 MiB moved through shared memory against 32 KiB: the hand-over grows with the batch
    assert large["handover_us"] > 2 * small["handover_us"], (small["handover_us"], large["handover_us"])
    # making the 32 MiB batch in the loop (a copy) is timed too
    assert large["inline_us"] > small["inline_us"]


def test_what_loading_in_workers_adds_to_the_hosts_cpu(measured: tuple[rundir.RunDir, dict, dict]) -> None:
    """The workers' CPU per batch (their /proc schedstat) and the loop's in each next(),
    less the loop's making one itself: 1.01-1.09 ms for the 32x256 batch on this host, of
    which 0.64-0.67 ms the workers'. Moving 32 MiB through shared memory costs more."""
    _, small, large = measured
    for doc in (small, large):
        assert doc["workers_cpu_us"] > 0 and doc["loop_cpu_us"] > 0 and doc["inline_cpu_us"] > 0, doc
        assert doc["cpu_us"] == pytest.approx(doc["loop_cpu_us"] + doc["workers_cpu_us"] - doc["inline_cpu_us"])
    assert large["cpu_us"] > small["cpu_us"]
    # the loop's CPU in a next() is part of its wall time there (a sliver more: the clocks tick apart)
    assert small["loop_cpu_us"] < 1.5 * small["p90_us"]


def test_the_file_reads_back_with_its_source(measured: tuple[rundir.RunDir, dict, dict]) -> None:
    run, doc, _ = measured
    h = factors.loader_handover(run.root)
    assert h is not None and h.us == pytest.approx(doc["handover_us"]) and h.shape == (32, 256)
    assert h.source.startswith("measured: a 32x256 float32 batch handed over by 2 DataLoader workers")
    assert h.cpu_us == pytest.approx(doc["cpu_us"]) and h.loop_cpu_us == pytest.approx(doc["loop_cpu_us"])
    assert h.cpu_source.startswith("measured: 2 DataLoader workers collating 32x256 batches on this host after the job "
                                   f"burned {doc['workers_cpu_us'] / 1e3:.2f} ms of CPU per batch")


def test_a_file_from_before_the_cpu_was_timed_gives_the_hand_over_alone(tmp_path: Path) -> None:
    (tmp_path / "factors").mkdir()
    (tmp_path / "factors" / "loader.json").write_text(json.dumps(
        {"format": factors.LOADER_FORMAT, "format_version": 1, "status": "ok", "handover_us": 700.0, "shape": [32, 256],
         "workers": 2, "samples": 60}))
    h = factors.loader_handover(tmp_path)
    assert h is not None and h.us == 700.0 and h.cpu_us is None and h.cpu_source == "" and h.loop_cpu_us == 0.0


def test_a_job_python_without_torch_fails_in_one_line(python_without_torch: Path, tmp_path: Path) -> None:
    run = rundir.RunDir(tmp_path)
    doc = measure.measure_loader(run, 0, _meta([4, 4]), str(python_without_torch), os.environ)  # type: ignore[arg-type]
    assert doc["status"] == "failed" and "No module named 'torch'" in doc["reason"] and "\n" not in doc["reason"]
    r = factors.read_loader(run.root)
    assert r.value is None and r.reason is not None and r.reason.startswith("loader.json: the measurement failed")


def test_no_input_shape_or_a_huge_batch_is_skipped(tmp_path: Path) -> None:
    run = rundir.RunDir(tmp_path)
    doc = measure.measure_loader(run, 0, SimpleNamespace(inputs=None), sys.executable, os.environ)  # type: ignore[arg-type]
    assert doc["status"] == "skipped" and doc["reason"] == "meta.json names no input tensor shape"
    # 64x3x512x512 float32 is 192 MiB: timed; 128x... is 384 MiB, five copies would be 1.9 GiB
    assert measure.LOADER_MAX_BYTES == 256 << 20
    doc = measure.measure_loader(run, 0, _meta([128, 3, 512, 512]), sys.executable, os.environ)  # type: ignore[arg-type]
    assert doc["status"] == "skipped" and doc["reason"] == "the batch's first tensor is 384 MiB, over the 256 MiB timed"


@pytest.mark.parametrize("content, why", [
    (None, "loader.json: not recorded"),
    ("{not json", "loader.json: unreadable (JSONDecodeError)"),
    (json.dumps({"format": factors.LOADER_FORMAT, "format_version": 99, "status": "ok"}),
     "loader.json: format version 99 is newer than this pardiag reads (1); upgrade pardiag"),
    (json.dumps({"format": factors.LOADER_FORMAT, "format_version": 1, "status": "ok", "handover_us": -3,
                 "shape": [2]}), "loader.json: unreadable (no hand-over time or shape)"),
])
def test_a_missing_or_damaged_file_is_no_factor_and_says_why(tmp_path: Path, content: str | None, why: str) -> None:
    if content is not None:
        (tmp_path / "factors").mkdir()
        (tmp_path / "factors" / "loader.json").write_text(content)
    r = factors.read_loader(tmp_path)
    assert r.value is None and r.reason == why


def _steps(run: rundir.RunDir, rank: int, data_us: float, step_us: float) -> None:
    run.rank_dir(rank).mkdir(parents=True, exist_ok=True)
    lines = [{"v": 2, "step": i, "t_end_ns": None, "dur_us": step_us, "pardiag_us": 0.0, "source": "optimizer",
              "data_us": data_us} for i in range(8)]
    run.steps(rank).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_wait_share_decides_whether_to_measure(tmp_path: Path) -> None:
    run = rundir.RunDir(tmp_path)
    _steps(run, 0, 3000.0, 60000.0)  # 5% of the step: at the bar
    from pardiag.analyzers.levers import DATALOADER_MIN

    # measured where the dataloader rule can give a finding
    assert measure.loader_wait_share(run, 0) == pytest.approx(0.05) and measure.LOADER_MIN_SHARE == DATALOADER_MIN
    _steps(run, 1, 100.0, 60000.0)
    assert measure.loader_wait_share(run, 1) == pytest.approx(100 / 60000)
    assert measure.loader_wait_share(run, 2) is None  # no step records
