"""`pardiag analyze` as a user runs it: run directories, trace folders, bad input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import SCRIPTS, read_json, run_pardiag, torchrun
from tracegen import cpu_rank, write_trace


@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    write_trace(d / "a.json", cpu_rank(1600, 250), rank=0)
    write_trace(d / "b.json.gz", cpu_rank(1700, 100), rank=1)
    return d


def test_json_output_is_the_contract(two_ranks: Path) -> None:
    res = run_pardiag("analyze", str(two_ranks), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "pardiag.analysis" and doc["schema_version"] == 2
    r0 = doc["ranks"][0]
    assert set(r0["breakdown_us"]) == {"compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle"}
    assert sum(r0["breakdown_us"].values()) == pytest.approx(r0["window_us"])
    # "host" added: time on the training thread with no torch operator and no wait
    # (a key added to the contract; the others keep their names)
    assert set(r0["phases_us"]) == {"dataloader", "forward", "backward", "optimizer", "other", "host"}
    assert sum(r0["phases_us"].values()) == pytest.approx(r0["window_us"])
    assert doc["collectives"][0]["wait_us"] == 75.0
    assert doc["stragglers"] == []
    # input: 100 of 1000 us on both ranks -> 90% of it hidden by workers
    # exposed comm: 150 us on rank 0 whose collective was 100 transfer + 150 wait -> 60 us
    # of exposed transfer; 100 us on rank 1 (no wait): pooled over the two 1000 us windows,
    # (60 + 100) / 2000 = 8% of transfer not hidden, under the 10% bar -> no comm finding
    s = doc["summary"]
    assert s["comm_exposed_transfer_ratio"] == pytest.approx(0.08)
    assert s["comm_exposed_ratio"] == pytest.approx((150 + 100) / 2000)  # waiting included
    assert s["step_p50_us"] == pytest.approx(1000.0) and s["step_p50_source"] == "profiled window"
    assert s["step_percentiles_us"]["source"] == "profiled" and s["step_percentiles_us"]["n"] == 2
    (data,) = doc["findings"]
    assert data["lever"] == "dataloader" and data["est_saving_pct"] == pytest.approx(9.0)
    assert "num_workers=2" in data["action"]["code"]
    # these traces have no c10d call issuing their all-reduces: the replay could not move
    # them, so the estimate stays the share-based one and says why
    assert data["estimate"]["method"] == "share" and "2 of 2 collectives have no issuing call" in data["estimate"]["refused"]
    assert doc["what_if"]["method"] == "share"
    # the measured window's critical path still holds: rank 1 arrives last (1750 us) at the
    # all-reduce, so the step's end waited on rank 1
    assert doc["critical_path"]["rank"] == 1 and doc["critical_path"]["replay_error_pct"] == 0.0
    window_step = 1000.0  # no steps.jsonl: the profiled step is the reference
    assert doc["what_if"]["all_step_us"] == pytest.approx(window_step * (1 - 0.09))


def test_terminal_summary(two_ranks: Path) -> None:
    res = run_pardiag("analyze", str(two_ranks))
    assert res.returncode == 0
    assert "all_reduce" in res.stdout and "compute" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "name, content, expect",
    [
        ("truncated.json.gz", None, "truncated"),
        ("broken.json", b'{"traceEvents": [{"ph": "X", "ts": 1,', "rank 1: trace unreadable"),
        ("empty.json", b"", "rank 1: trace unreadable"),
        ("shape.json", b'{"hello": [1, 2, 3]}', "rank 1: trace unreadable"),
    ],
)
def test_corrupt_trace_gives_partial_analysis(two_ranks: Path, name: str, content: bytes | None, expect: str) -> None:
    bad = two_ranks / "b.json.gz"
    if content is None:
        data = bad.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    else:
        bad.unlink()
        (two_ranks / name).write_bytes(content)
        # the name carries no rank and there is no distributedInfo: taken by order
    res = run_pardiag("analyze", str(two_ranks), "--json")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    messages = " | ".join(n["message"] for n in doc["notices"])
    assert "rank 1" in messages and ("unreadable" in messages)
    if content is None:
        assert "truncated" in messages.lower() or "gzip" in messages.lower()
    assert doc["ranks"][0]["window_us"] == 1000.0  # rank 0 still analysed


def test_missing_path_and_wrong_file(tmp_path: Path) -> None:
    res = run_pardiag("analyze", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such file or directory" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "notes.txt").write_text("hi")
    res = run_pardiag("analyze", str(tmp_path / "notes.txt"))
    assert res.returncode == 2 and "not a trace" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_pardiag("analyze", str(empty))
    assert res.returncode == 2 and "no run directory and no trace files" in res.stderr


def test_newer_run_format_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"format": "pardiag.run", "format_version": 99}))
    res = run_pardiag("analyze", str(run))
    assert res.returncode == 2 and "newer than this pardiag" in res.stderr


def test_duplicate_ranks_and_unranked(tmp_path: Path) -> None:
    write_trace(tmp_path / "x.json", cpu_rank(1600, 250), rank=0)
    write_trace(tmp_path / "y.json", cpu_rank(1700, 100), rank=0)
    write_trace(tmp_path / "z.json", cpu_rank(1700, 100), rank=None)
    res = run_pardiag("analyze", str(tmp_path), "--json")
    doc = json.loads(res.stdout)
    messages = " | ".join(n["message"] for n in doc["notices"])
    assert "two traces claim rank 0" in messages
    assert "z.json: no rank in the trace or its name; taken as rank 1 by order" in messages
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]


NCCL_LOGS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "nccl" / "logs"


@pytest.mark.skipif(not NCCL_LOGS.is_dir(), reason="reference NCCL logs not present")
def test_nccl_logs_of_a_run_and_from_the_command_line(two_ranks: Path, tmp_path: Path) -> None:
    # a run directory whose nccl/ folder holds the logs of its processes
    run = tmp_path / "run"
    for r, src in ((0, two_ranks / "a.json"), (1, two_ranks / "b.json.gz")):
        (run / "ranks" / str(r)).mkdir(parents=True)
        shutil.copy(src, run / "ranks" / str(r) / ("trace.json" if src.suffix == ".json" else "trace.json.gz"))
    (run / "nccl").mkdir()
    shutil.copy(NCCL_LOGS / "08-chimera2-v2193-shm-p2p-level-loc-loopback-bootstrap.log", run / "nccl" / "h.1.log")
    doc = json.loads(run_pardiag("analyze", str(run), "--json").stdout)
    assert doc["nccl"]["hosts"][0]["versions"] == ["2.19.3+cuda12.2"]
    assert doc["nccl"]["transports"]["gpt-dev-ppt"] == {"SHM/direct/direct": 4}
    levers = [(f["lever"], f["severity"], f["action"].get("env")) for f in doc["findings"]]
    assert ("nccl_env", "high", {"NCCL_P2P_LEVEL": None}) in levers
    # a log given on the command line: the watchdog timeout becomes a hang diagnosis
    res = run_pardiag("analyze", str(two_ranks), "--json", "--nccl-log",
                      str(NCCL_LOGS / "17-basicsr737-torch-watchdog-allreduce-timeout-pg-guid-format.log"))
    doc = json.loads(res.stdout)
    assert doc["nccl"]["hang"]["kind"] == "collective_stuck"
    assert any(n["message"].startswith("hang: process group 0(default_pg): ranks [0, 1, 2] timed out in ALLREDUCE SeqNum 808")
               for n in doc["notices"])
    res = run_pardiag("analyze", str(two_ranks), "--nccl-log", str(tmp_path / "missing.log"))
    assert res.returncode == 2 and "no such file" in res.stderr


def test_many_traces_in_parallel_workers(tmp_path: Path) -> None:
    """More traces than a worker process takes in its life: the pool must not stall."""
    for r in range(20):
        write_trace(tmp_path / f"rank{r}.json", cpu_rank(1600 + r, 100 + r), rank=r, world=20)
    res = run_pardiag("analyze", str(tmp_path), "--json", "--jobs", "2", timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["ranks"]] == list(range(20))
    # durations 100..119 us: the shortest is the transfer of the one all-reduce
    assert doc["collectives"][0]["transfer_us"] == 100.0


def test_reports_hide_the_home_directory_and_secrets(two_ranks: Path, tmp_path: Path) -> None:
    home = str(Path.home())
    run = tmp_path / "run"
    for r, src in ((0, two_ranks / "a.json"), (1, two_ranks / "b.json.gz")):
        (run / "ranks" / str(r)).mkdir(parents=True)
        shutil.copy(src, run / "ranks" / str(r) / ("trace.json" if src.suffix == ".json" else "trace.json.gz"))
    manifest = {"format": "pardiag.run", "format_version": 1, "world_size": 2,
                "command": ["python", f"{home}/work/train.py", "--hf-token", "<redacted>", "ghp_" + "x" * 36],
                "failed_ranks": [{"rank": 1, "step": 3, "reason": f"OSError: {home}/data missing, key sk-{'y' * 30}"}]}
    (run / "manifest.json").write_text(json.dumps(manifest))
    for fmt in ("json", "md", "html"):
        res = run_pardiag("report", str(run), "--format", fmt, "-o", str(tmp_path / f"r.{fmt}"))
        assert res.returncode == 0, res.stderr
        text = (tmp_path / f"r.{fmt}").read_text()
        assert f"{home}/work" not in text and f"{home}/data" not in text and "ghp_xxx" not in text and "sk-yyy" not in text
        if fmt != "md":  # the PR comment does not repeat the command
            assert "~/work/train.py" in text


def test_expert_parallel_kernels_are_communication_not_compute(tmp_path: Path) -> None:
    """DeepEP moves tokens in kernels of its own, with no collective record: 300 us of
    dispatch and combine per step are communication, and the job is not told it has none."""
    from tracegen import launch, launched_kernel, meta_events, step, write_kineto_trace

    for r in (0, 1):
        write_kineto_trace(tmp_path / f"rank{r}.json", [
            *meta_events(), step(1, 0, 2000),
            launch(1, 10), launched_kernel("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", 100, 200, 1),
            launch(2, 20), launched_kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 300, 1000, 2),
            launch(3, 30), launched_kernel("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*)", 1300, 100, 3),
            launch(4, 40), launched_kernel("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", 1400, 50, 4),
        ], rank=r)
    from pardiag.analyzers.pipeline import analyze_path

    a = analyze_path(tmp_path, jobs=1)
    for r in a.ranks:
        assert r.gpu is not None and r.gpu.comm_us == 300.0 and r.gpu.compute_us == 1050.0
    messages = [n.message for n in a.notices]
    assert not any("no communication in any trace" in m for m in messages), messages
    assert any("communication kernels ran (0.6 ms over the ranks)" in m for m in messages), messages
