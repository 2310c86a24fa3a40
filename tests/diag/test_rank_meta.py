"""meta.json as a typed, versioned record (pardiag.rank_meta) and the Analysis' typed
`run` block (pardiag.run_info): older versions are upgraded on read, a newer one is
refused in one line, exception text never reaches the disk unredacted (meta.json,
manifest.json), and the `run` block keeps its JSON keys and values."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from pardiag import manifest, rundir
from pardiag.analysis import from_dict
from pardiag.rank_meta import RankMeta, parse_meta
from pardiag.redact import REDACTION_FAILED, redact_message, safe_redact
from pardiag.redact import REDACTED
from pardiag.run_info import FrameworkInfo, RunInfo
from pardiag.rundir import RunDir

from factories import CASES, small

SECRET = "s3cr3tVALUE42"
HOME = os.path.expanduser("~")
MESSAGE = f"bad config --api-key={SECRET} TOKEN={SECRET} in {HOME}/proj/train.py"
DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(autouse=True)
def _paths_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARDIAG_SHOW_PATHS", raising=False)


def meta_v1(rank: int = 0, **over: Any) -> dict[str, Any]:
    """A meta.json as the version-1 collector wrote it: every top-level key, the
    exception text as raised (a secret and the home directory in it)."""
    doc: dict[str, Any] = {
        "format": "pardiag.rank-meta", "format_version": 1,
        "rank": rank, "world_size": 2, "local_rank": rank, "rank_source": "torch.distributed", "backend": "gloo",
        "host": "node0", "pid": 4242 + rank, "started_ns": 1_700_000_000_000_000_000,
        "updated_ns": 1_700_000_010_000_000_000, "steps_completed": 7, "step_source": "optimizer",
        "argv": ["train.py", "--api-key=<redacted>"],
        "exit": {"status": "exception", "type": "ValueError", "message": MESSAGE, "step": 7},
        "ddp": [{"args": {"find_unused_parameters": True}, "static_graph": False, "find_unused_parameters": True,
                 "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0, "comm_hook": None,
                 "logging": {"iteration": 5, "unused_parameter_size": 0, "backend_name": "gloo"},
                 "bucket_sizes_bytes": [1024], "bucket_count": 1, "unused_parameter_size_max": 512}],
        "fsdp": None,
        "amp": {"autocast": False},
        "dataloaders": [{"class": "DataLoader", "num_workers": 2, "pin_memory": False, "batch_size": 16,
                         "batch_sampler_batch_size": 16, "persistent_workers": False, "prefetch_factor": 2,
                         "drop_last": False, "dataset": "TensorDataset", "dataset_len": 256, "sampler": "DistributedSampler",
                         "multiprocessing_context": None, "iterations_started": 1}],
        "grad_accumulation": {"backwards_per_step": 1.0},
        "optimizers": [{"class": "SGD", "state_bytes": 0}],
        "parameters": {"local_bytes": 4096, "bytes_by_dtype": {"torch.float32": 4096}},
        "device": {"cuda_available": False, "type": "cpu", "name": "x86_64", "max_memory_reserved_bytes": None},
        "versions": {"python": "3.11.7", "torch": "2.5.0"},
        "threads": {"torch_num_threads": 4, "cpu_count": 8, "sched_affinity": 8, "python_executable": "/usr/bin/python"},
        "framework": {"name": "torch", "version": "2.5.0", "detected_from": "torch.optim", "loaded": {},
                      "wrapped": ["torch.autograd.backward"]},
        "profiler": {"status": "skipped", "reason": "profiling is off"},
        "collectors": {"steps": {"status": "ok"}, "profiler": {"status": "skipped", "reason": "profiling is off"},
                       "meta": {"status": "ok"}},
        "errors": [{"where": "meta.amp", "error": f"RuntimeError: password={SECRET}", "step": 3,
                    "traceback": f'  File "{HOME}/proj/train.py", line 3\nRuntimeError: password={SECRET}\n'}],
    }
    doc.update(over)
    return doc


def write_meta(run: RunDir, doc: dict[str, Any]) -> None:
    rundir.atomic_write_json(run.meta(doc["rank"]), doc)


# -- reading: the upgrade chain -------------------------------------------------------------


def test_a_version_1_meta_reads_back_typed_with_its_secrets_redacted(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    write_meta(run, meta_v1())
    m = rundir.read_meta(run, 0)
    assert isinstance(m, RankMeta) and m.format_version == 1  # as written; upgraded on read
    assert m.exit.status == "exception" and m.exit.type == "ValueError" and m.exit.step == 7
    assert m.exit.message == f"bad config --api-key={REDACTED} TOKEN={REDACTED} in ~/proj/train.py"
    assert m.errors[0].error == f"RuntimeError: password={REDACTED}"
    assert m.errors[0].traceback == f'  File "~/proj/train.py", line 3\nRuntimeError: password={REDACTED}\n'
    assert SECRET not in json.dumps(m.to_dict()) and HOME + "/" not in json.dumps(m.to_dict())
    # the typed parts
    assert (m.rank, m.world_size, m.host, m.pid, m.backend) == (0, 2, "node0", 4242, "gloo")
    assert m.device is not None and m.device.type == "cpu" and m.device.max_memory_reserved_bytes is None
    assert m.ddp is not None and m.ddp[0].find_unused_parameters is True
    assert (m.ddp[0].unused_parameter_size, m.ddp[0].unused_parameter_size_max, m.ddp[0].iteration) == (0, 512, 5)
    assert m.dataloaders is not None and m.dataloaders[0].batch_size == 16 and m.dataloaders[0].extra == {"class": "DataLoader"}
    assert m.framework is not None and (m.framework.name, m.framework.version) == ("torch", "2.5.0")
    assert m.profiler is not None and (m.profiler.status, m.profiler.reason) == ("skipped", "profiling is off")


def test_nothing_is_dropped_on_the_way_through(tmp_path: Path) -> None:
    """Every key of the file comes back from to_dict, those of a newer minor writer too
    (kept in `extra`); only the redacted texts and the version differ."""
    doc = meta_v1(new_top={"x": 1})
    doc["exit"] = dict(doc["exit"], new_exit_key=2)
    doc["device"] = dict(doc["device"], new_device_key=3)
    m = parse_meta(copy.deepcopy(doc), "meta.json")
    assert m.extra == {"new_top": {"x": 1}} and m.exit.extra == {"new_exit_key": 2}
    assert m.device is not None and m.device.extra == {"new_device_key": 3}
    back = m.to_dict()
    assert list(back) == list(doc)  # same keys, same order
    for k in doc:
        if k not in ("format_version", "exit", "errors"):
            assert back[k] == doc[k], k
    assert back["format_version"] == rundir.META_VERSION == 2
    assert {k: v for k, v in back["exit"].items() if k != "message"} == {k: v for k, v in doc["exit"].items() if k != "message"}


def test_a_value_not_of_its_type_reads_as_none_and_is_kept() -> None:
    doc = meta_v1(pid="4242", device={"type": "cpu", "max_memory_reserved_bytes": "lots"})
    m = parse_meta(doc, "meta.json")
    assert m.pid is None and m.extra["pid"] == "4242"
    assert m.device is not None and m.device.type == "cpu" and m.device.max_memory_reserved_bytes is None
    back = m.to_dict()
    assert back["pid"] == "4242" and back["device"] == {"type": "cpu", "max_memory_reserved_bytes": "lots"}


def test_a_version_2_meta_is_read_as_written() -> None:
    """Version 2 was redacted by its writer: reading it changes no text."""
    doc = meta_v1(format_version=2, exit={"status": "exception", "type": "E", "message": "plain text", "step": 1})
    m = parse_meta(doc, "meta.json")
    assert m.format_version == 2 and m.exit.message == "plain text"
    assert m.errors[0].error == f"RuntimeError: password={SECRET}"  # not touched: v2 texts are as the writer left them


@pytest.mark.parametrize("doc, message", [
    ({"format": "pardiag.rank-meta", "format_version": 3}, "format version 3 is newer than this pardiag understands (2); upgrade pardiag"),
    ({"format": "pardiag.rank-meta"}, "format_version missing"),
    ({"format": "pardiag.run", "format_version": 1}, "not a pardiag.rank-meta file"),
    ([1, 2], "not a pardiag.rank-meta file"),
])
def test_a_meta_that_cannot_be_read_is_refused_in_one_line(tmp_path: Path, doc: Any, message: str) -> None:
    run = RunDir(tmp_path)
    run.meta(0).parent.mkdir(parents=True)
    run.meta(0).write_text(json.dumps(doc))
    with pytest.raises(rundir.RunDirError) as e:
        rundir.read_meta(run, 0)
    assert str(e.value) == f"{run.meta(0)}: {message}" and "\n" not in str(e.value)


def test_redact_message() -> None:
    assert redact_message(f"--password {SECRET} --token=-x user", env={}) == f"--password {REDACTED} --token={REDACTED} user"
    assert redact_message("token expired; Timeout(ms)=600000 SeqNum=5", env={}) == "token expired; Timeout(ms)=600000 SeqNum=5"
    assert redact_message(f"it was {SECRET}", env={"WANDB_API_KEY": SECRET}) == f"it was {REDACTED}"
    assert safe_redact(None) is None


def test_a_redaction_that_fails_writes_its_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    from pardiag import redact

    def broken(text: str, env: Any = None) -> str:
        raise re_error

    re_error = RuntimeError("boom")
    monkeypatch.setattr(redact, "redact_message", broken)
    assert safe_redact(MESSAGE) == REDACTION_FAILED


# -- writing: the collector and the manifest ------------------------------------------------


def _collector(tmp_path: Path) -> Any:
    pytest.importorskip("torch")
    from pardiag.collectors.config import CollectorConfig
    from pardiag.collectors.runtime import Collector

    c = Collector(RunDir(tmp_path), CollectorConfig(profile=False))
    c.rank_info = {"rank": 0, "world_size": 1, "local_rank": 0, "source": "default"}
    c._previous_excepthook = lambda *a: None  # the job's own hook: nothing to print here
    return c


def test_the_collector_writes_no_secret_to_disk(tmp_path: Path) -> None:
    c = _collector(tmp_path)
    try:
        raise RuntimeError(MESSAGE)
    except RuntimeError as e:
        c._error("steps", e)  # a failure inside pardiag, with its traceback
        c._excepthook(type(e), e, e.__traceback__)  # the job's own exception
    c.write_meta()
    text = c.run.meta(0).read_text()
    assert SECRET not in text and f"{HOME}/proj" not in text
    m = rundir.read_meta(c.run, 0)
    assert m.format_version == 2
    assert m.exit.status == "exception" and m.exit.type == "RuntimeError"
    assert m.exit.message == f"bad config --api-key={REDACTED} TOKEN={REDACTED} in ~/proj/train.py"
    mine = [e for e in m.errors if e.where == "steps"]
    assert mine[0].error == f"RuntimeError: {m.exit.message}" and mine[0].traceback and REDACTED in mine[0].traceback


def test_the_profiler_failure_reason_has_no_secret(tmp_path: Path) -> None:
    """The profiler window's own failure text goes into meta.json as its status reason."""
    from pardiag.collectors.config import CollectorConfig
    from pardiag.collectors.profiler import ProfilerWindow

    errors: list[str] = []
    w = ProfilerWindow(CollectorConfig(), tmp_path / "trace.json", tmp_path / "trace.partial.json", False,
                       lambda where, e: errors.append(where))
    w._fail(RuntimeError(MESSAGE))
    status = w.status()
    assert status["status"] == "failed" and errors == ["profiler"]
    assert status["reason"] == f"RuntimeError: bad config --api-key={REDACTED} TOKEN={REDACTED} in ~/proj/train.py"


def test_the_collector_writes_the_placeholder_when_redaction_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pardiag import redact

    c = _collector(tmp_path)

    def broken(text: str, env: Any = None) -> str:
        raise ValueError("redaction broke")

    monkeypatch.setattr(redact, "redact_message", broken)
    try:
        raise RuntimeError(MESSAGE)
    except RuntimeError as e:
        c._error("steps", e)
        c._excepthook(type(e), e, e.__traceback__)
    c.write_meta()
    doc = json.loads(c.run.meta(0).read_text())
    assert SECRET not in json.dumps(doc)
    assert doc["exit"]["message"] == REDACTION_FAILED
    steps = [e for e in doc["errors"] if e["where"] == "steps"][0]
    assert steps["error"] == steps["traceback"] == REDACTION_FAILED


def test_manifest_failed_ranks_reason_has_no_secret_on_disk(tmp_path: Path) -> None:
    """From a version-1 meta (upgraded on read), and from a meta whose writer left a
    secret in a version-2 file: the manifest redacts the reason it writes itself."""
    run = RunDir(tmp_path)
    write_meta(run, meta_v1(0))
    write_meta(run, meta_v1(1, format_version=2))  # a writer that did not redact
    manifest.write(run)
    text = run.manifest.read_text()
    assert SECRET not in text
    reasons = {f["rank"]: f["reason"] for f in json.loads(text)["failed_ranks"]}
    want = f"ValueError: bad config --api-key={REDACTED} TOKEN={REDACTED} in ~/proj/train.py"
    assert reasons == {0: want, 1: want}


# -- the Analysis' run block -----------------------------------------------------------------


OLD_RUN_KEYS = {"path", "world_size", "ranks_analyzed", "backend", "device_type", "device_name", "command", "launcher",
                "hosts", "exit_code", "versions", "profiler", "clock_offsets_us", "collectors", "framework"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_info_round_trips(case: str) -> None:
    a = CASES[case]()
    doc = json.loads(a.to_json())
    back = from_dict(doc)
    assert back.run == a.run
    assert json.loads(back.to_json())["run"] == doc["run"]


def test_run_block_has_the_keys_and_values_it_had() -> None:
    a = small()
    run = json.loads(a.to_json())["run"]
    assert set(run) == OLD_RUN_KEYS | {"devices"}  # `devices`: now always there (None for run directories)
    assert run["world_size"] == 2 and run["hosts"] == ["node0"] and run["backend"] == "gloo" and run["devices"] is None
    assert run["command"] == ["torchrun", "--nproc-per-node", "2", "train.py"] and run["framework"] is None


@pytest.mark.parametrize("name", ["tui-demo", "tui-gpu-nccl", "tui-straggler"])
def test_older_analysis_files_load_their_run_block_without_loss(name: str) -> None:
    doc = json.loads((DATA / f"{name}.analysis.json").read_text())
    old = doc["run"]
    run = from_dict(doc).run
    assert isinstance(run, RunInfo)
    new = asdict(run)
    for k, v in old.items():
        if k == "framework" and v is not None:
            assert isinstance(run.framework, FrameworkInfo)
            assert {fk: new["framework"][fk] for fk in v} == v  # every fact kept, values as they were
            assert set(new["framework"]) - set(v) <= {"name", "version", "detected_from", "loaded"}
        else:
            assert new[k] == v, k
    assert set(new) - set(old) <= {"device_name", "devices"}


def test_framework_block_from_the_ranks_metas() -> None:
    """The pipeline's framework block from two ranks' metas: rank 0's facts, the peak
    memory over both, DDP's logging trimmed and `across_ranks` filled in."""
    from pardiag.analyzers.pipeline import _framework

    m0 = parse_meta(meta_v1(0, device={"type": "cuda", "max_memory_reserved_bytes": 100}), "0")
    m1 = parse_meta(meta_v1(1, device={"type": "cuda", "max_memory_reserved_bytes": 300}), "1")
    fw = _framework({0: m0, 1: m1})
    assert fw is not None and fw.peak_memory_reserved_bytes_max == 300
    assert fw.name == "torch" and fw.version == "2.5.0" and fw.detected_from == "torch.optim"
    assert fw.threads == {"torch_num_threads": 4, "cpu_count": 8, "sched_affinity": 8}  # no local path
    assert fw.ddp is not None
    assert fw.ddp[0]["logging"] == {"iteration": 5, "unused_parameter_size": 0, "backend_name": "gloo"}
    assert fw.ddp[0]["across_ranks"] == {"ranks": 2, "find_unused_parameters": 2, "unused_parameter_size_reported": 2,
                                         "unused_parameter_size_max": 512, "iteration_min": 5}
    assert fw.dataloaders == meta_v1()["dataloaders"]
