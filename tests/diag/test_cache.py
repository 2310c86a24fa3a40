"""The analysis cache (`pardiag.analysis_cache`): one policy for every reader of a run,
on a real run directory and on real analysis files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, run_pardiag, torchrun
from pardiag import analysis as model
from pardiag import rundir
from pardiag.analysis_cache import cache_is_fresh, has_raw_data, load_or_analyze
from pardiag.tui.loader import path_loader

DATA = Path(__file__).resolve().parents[1] / "data"
OLD = DATA / "tui-demo.analysis.json"  # schema 1, no run next to it


def _schema_version(path: Path) -> int:
    return int(json.loads(path.read_text())["schema_version"])


def _as_schema_1(a: model.Analysis) -> dict[str, Any]:
    """The document an older pardiag cached for the same run: schema 1 had no summary."""
    doc = json.loads(a.to_json())
    doc.pop("summary")
    doc["schema_version"] = 1
    return doc


def _write_fresh(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc))
    later = path.stat().st_mtime + 10
    os.utime(path, (later, later))  # newer than everything in the run: a fresh cache


def _no_analysis(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("analysed again although the cache serves")


# -- a run directory without raw data next to its analysis ----------------------------------------


def test_an_older_analysis_without_raw_data_is_upgraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    os.utime(run / "manifest.json", (1_000_000, 1_000_000))
    shutil.copy(OLD, run / "analysis.json")
    assert not has_raw_data(rundir.RunDir(run))
    import pardiag.analyzers.pipeline as analyzer

    monkeypatch.setattr(analyzer, "analyze_path", _no_analysis)
    expected = model.load(OLD)
    for path in (run, run / "analysis.json", OLD):
        a = load_or_analyze(path, quiet=True)
        assert a == expected and a.job_summary.computed_from == "ranks"
    assert (run / "analysis.json").read_bytes() == OLD.read_bytes()  # upgraded in memory, left as it was


# -- a real run -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "ddp"
    res = run_pardiag("run", "-q", "--no-report", "--out", str(out), "--profile-steps", "2,1,2", "--",
                      *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "8"))
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture
def run(recorded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(recorded, copy)
    (copy / "analysis.json").unlink(missing_ok=True)
    return copy


@pytest.mark.slow
def test_the_cache_is_written_once_then_served(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[Path] = []
    real_write = rundir.atomic_write_text

    def counting(path: Path, text: str, durable: bool = True) -> None:
        writes.append(path)
        real_write(path, text, durable)

    monkeypatch.setattr(rundir, "atomic_write_text", counting)
    progress: list[tuple[int, int]] = []
    a = path_loader(run)(lambda done, total: progress.append((done, total)))  # the TUI's way in
    assert writes == [run / "analysis.json"] and progress  # progress told to the TUI
    assert cache_is_fresh(rundir.RunDir(run)) and _schema_version(run / "analysis.json") == model.SCHEMA_VERSION
    import pardiag.analyzers.pipeline as analyzer

    monkeypatch.setattr(analyzer, "analyze_path", _no_analysis)
    assert load_or_analyze(run, quiet=True) == a  # the command's way in: the same cache
    assert path_loader(run)(lambda done, total: None) == a
    assert writes == [run / "analysis.json"]


@pytest.mark.slow
def test_an_older_cache_of_a_run_with_raw_data_is_analysed_again(run: Path) -> None:
    a = load_or_analyze(run, quiet=True)
    assert a.job_summary.computed_from == "steps" and a.job_summary.step_percentiles_us.p50 is not None
    old = _as_schema_1(a)
    upgraded = model.from_dict(old)  # what upgrading the old document gives: no job-step percentiles
    assert upgraded.job_summary.computed_from == "ranks"

    tui = path_loader(run)
    for load in (lambda: load_or_analyze(run, quiet=True), lambda: load_or_analyze(run / "analysis.json"),
                 lambda: tui(lambda done, total: None)):
        _write_fresh(run / "analysis.json", old)
        again = load()
        assert again.job_summary.computed_from == "steps"
        assert again.job_summary.step_percentiles_us == a.job_summary.step_percentiles_us
        assert _schema_version(run / "analysis.json") == model.SCHEMA_VERSION  # cached anew
        assert cache_is_fresh(rundir.RunDir(run))


@pytest.mark.slow
def test_the_commands_see_the_reanalysed_run(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pardiag.cli import main

    a = load_or_analyze(run, quiet=True)
    _write_fresh(run / "analysis.json", _as_schema_1(a))
    assert main(["analyze", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["computed_from"] == "steps"
    assert doc["summary"]["step_percentiles_us"] == json.loads(a.to_json())["summary"]["step_percentiles_us"]
    assert _schema_version(run / "analysis.json") == model.SCHEMA_VERSION


@pytest.mark.slow
def test_a_run_that_lost_its_raw_data_keeps_the_upgrade(run: Path) -> None:
    a = load_or_analyze(run, quiet=True)
    shutil.rmtree(run / "ranks")
    (run / "ranks").mkdir()
    _write_fresh(run / "analysis.json", _as_schema_1(a))
    b = load_or_analyze(run, quiet=True)
    assert b.job_summary.computed_from == "ranks" and b.ranks == model.from_dict(_as_schema_1(a)).ranks
    assert _schema_version(run / "analysis.json") == 1


@pytest.mark.slow
def test_a_cache_written_by_another_pardiag_version_is_analysed_again(run: Path) -> None:
    """The same schema, but another version's analysis code may have counted differently:
    a run that still has its data is analysed again, and the cache rewritten by this one."""
    from pardiag import __version__

    a = load_or_analyze(run, quiet=True)
    doc = json.loads(a.to_json())
    assert doc["pardiag_version"] == __version__
    doc["pardiag_version"] = "0.0.1"
    doc["ranks"][0]["window_us"] = 1.0  # what the other version "measured"
    for path in (run, run / "analysis.json"):
        _write_fresh(run / "analysis.json", doc)
        again = load_or_analyze(path, quiet=True)
        assert again.ranks[0].window_us == a.ranks[0].window_us != 1.0
        assert json.loads((run / "analysis.json").read_text())["pardiag_version"] == __version__
    # without raw data the other version's document is all there is: read as it is
    shutil.rmtree(run / "ranks")
    (run / "ranks").mkdir()
    _write_fresh(run / "analysis.json", doc)
    assert load_or_analyze(run, quiet=True).ranks[0].window_us == 1.0


@pytest.mark.slow
def test_a_rank_summary_written_by_another_pardiag_version_is_not_used(run: Path) -> None:
    r = rundir.RunDir(run)
    trace, _ = r.find_trace(0)
    assert trace is not None and rundir.read_summary(r, 0, trace) is not None  # written by `pardiag run`
    doc = json.loads(r.summary(0).read_text())
    doc["pardiag_version"] = "0.0.1"
    mtime = r.summary(0).stat().st_mtime_ns
    r.summary(0).write_text(json.dumps(doc))
    os.utime(r.summary(0), ns=(mtime, mtime))
    assert rundir.read_summary(r, 0, trace) is None  # the trace is read again instead
    doc.pop("pardiag_version")  # a summary from before the version was recorded
    r.summary(0).write_text(json.dumps(doc))
    assert rundir.read_summary(r, 0, trace) is None
