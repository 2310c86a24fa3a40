"""Plain torch.profiler traces fill the Analysis' `run` block from their own metadata;
`pardiag analyze --nccl-log FILE` works with a log alone, and next to traces.

The expected values are read from the fixture files themselves (`distributedInfo`,
`deviceProperties`, the NCCL log's own lines), never typed in."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, SHARED, run_pardiag

DATA = Path(__file__).resolve().parents[1] / "data"
NCCL_LOGS = SHARED / "reference" / "nccl" / "logs"


def fixture(*parts: str) -> Path:
    p = FIXTURES.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"fixture {'/'.join(parts)} not present")
    return p


def nccl_log(prefix: str) -> Path:
    found = sorted(NCCL_LOGS.glob(f"{prefix}-*.log"))
    if not found:
        pytest.skip(f"NCCL log {prefix}-* not present")
    return found[0]


def log_text(log: Path) -> str:
    """The log's own lines (the reference logs start with '#' notes on where they come from)."""
    return "\n".join(line for line in log.read_text().splitlines() if not line.startswith("#"))


def metadata(trace: Path) -> dict[str, Any]:
    """The trace's top-level keys, as the file has them (events left out)."""
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt") as f:
        doc = json.load(f)
    doc.pop("traceEvents", None)
    return doc


def analyze_json(*args: str) -> dict[str, Any]:
    res = run_pardiag("analyze", *args, "--json", "-j", "1")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_gpu_trace_names_its_device_backend_and_world() -> None:
    folder = fixture("gpu-traces", "a100-2rank-rank0")
    meta = metadata(next(folder.glob("*.json*")))
    props, dist = meta["deviceProperties"], meta["distributedInfo"]
    run = analyze_json(str(folder))["run"]
    assert run["world_size"] == dist["world_size"]
    assert run["backend"] == dist["backend"]
    assert run["device_type"] == "cuda"
    assert run["device_name"] == props[0]["name"] and len({p["name"] for p in props}) == 1
    assert run["versions"] == {"nccl": dist["nccl_version"]}
    assert [d["id"] for d in run["devices"]] == [p["id"] for p in props]
    assert [d["total_memory_bytes"] for d in run["devices"]] == [p["totalGlobalMem"] for p in props]
    assert run["devices"][0]["capability"] == f"{props[0]['computeMajor']}.{props[0]['computeMinor']}"
    assert run["ranks_analyzed"] == 1  # one rank's trace of a 2-rank job


def test_gpu_traces_without_device_properties_take_the_type_from_the_kernels() -> None:
    folder = fixture("gpu-traces", "sampled-128rank-job")
    metas = [metadata(p) for p in sorted(folder.glob("*.json*"))]
    assert all("deviceProperties" not in m for m in metas)
    a = analyze_json(str(folder))
    run = a["run"]
    assert run["world_size"] == metas[0]["distributedInfo"]["world_size"]
    assert run["backend"] == metas[0]["distributedInfo"]["backend"]
    assert run["device_type"] == "cuda" and all(r["device_type"] == "cuda" for r in a["ranks"])
    assert run["device_name"] is None and run["devices"] is None


def test_cpu_traces_name_backend_world_and_host() -> None:
    traces = sorted((DATA / "cpu-2rank").glob("*.json.gz"))
    metas = [metadata(p) for p in traces]
    a = analyze_json(str(DATA / "cpu-2rank"))
    run = a["run"]
    assert run["world_size"] == metas[0]["distributedInfo"]["world_size"] == len(traces)
    assert run["backend"] == metas[0]["distributedInfo"]["backend"]
    assert metas[0]["deviceProperties"] == [] and run["device_type"] == "cpu" and run["devices"] is None
    assert run["hosts"] == sorted({m["host_name"] for m in metas})
    assert [r["rank"] for r in a["ranks"]] == [m["distributedInfo"]["rank"] for m in metas]


def test_one_rank_of_a_large_cpu_job() -> None:
    trace = next(fixture("cpu-traces").glob("*.json*"))
    dist = metadata(trace)["distributedInfo"]
    a = analyze_json(str(trace))
    assert a["run"]["world_size"] == dist["world_size"]
    assert a["run"]["backend"] == dist["backend"]
    assert [r["rank"] for r in a["ranks"]] == [dist["rank"]]


def test_terminal_summary_shows_the_trace_metadata() -> None:
    folder = fixture("gpu-traces", "a100-2rank-rank0")
    dist = metadata(next(folder.glob("*.json*")))["distributedInfo"]
    res = run_pardiag("analyze", str(folder), "-j", "1")
    assert res.returncode == 0, res.stderr
    assert f"world size {dist['world_size']}  backend {dist['backend']}  device cuda" in res.stdout


# -- NCCL logs, with or without traces ---------------------------------------------------------------


def test_nccl_log_alone_prints_the_nccl_block_and_findings() -> None:
    log = nccl_log("13")
    text = log_text(log)
    nranks = {int(n) for n in re.findall(r"nranks (\d+)", text)}
    version = re.search(r"NCCL version (\S+)", text).group(1)
    host = re.search(r"^(\S+?):\d+:\d+ ", text, re.MULTILINE).group(1)
    assert len(nranks) == 1
    res = run_pardiag("analyze", "--nccl-log", str(log))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"world size {nranks.pop()}  backend nccl" in out and host in out
    assert "NCCL: 1 log files" in out and version in out
    assert "nccl_env" in out and "Communicator init" in out
    assert "next:" not in out  # nothing to report on but the log


def test_nccl_log_alone_as_json() -> None:
    log = nccl_log("13")
    text = log_text(log)
    a = analyze_json("--nccl-log", str(log))
    assert a["ranks"] == [] and a["run"]["path"] is None and a["run"]["ranks_analyzed"] == 0
    assert a["run"]["world_size"] == int(re.search(r"nranks (\d+)", text).group(1))
    assert a["run"]["backend"] == "nccl"
    assert a["run"]["versions"] == {"nccl": re.search(r"NCCL version (\S+)", text).group(1)}
    assert a["nccl"]["files"] == 1 and a["nccl"]["processes"] == len(set(re.findall(r"^\S+?:(\d+):", text, re.M)))
    assert [f["lever"] for f in a["findings"]] == ["nccl_env"]


def test_nccl_log_alone_diagnoses_a_hang() -> None:
    log = nccl_log("17")
    seq = re.search(r"SeqNum=(\d+)", log_text(log)).group(1)
    res = run_pardiag("analyze", "--nccl-log", str(log))
    assert res.returncode == 0, res.stderr
    assert "hang:" in res.stdout and f"SeqNum {seq}" in res.stdout.replace("\n", " ")


def test_traces_and_a_nccl_log_together() -> None:
    folder = fixture("gpu-traces", "sampled-128rank-job")
    log = nccl_log("16")
    # "(RayTrainWorker pid=615, ip=...) HOST:PID:TID [dev] NCCL INFO ..."
    hosts = sorted(set(re.findall(r"(\S+?):\d+:\d+ \[\d+\] NCCL", log_text(log))))
    assert hosts
    a = analyze_json(str(folder), "--nccl-log", str(log))
    assert [r["rank"] for r in a["ranks"]] == [0, 1] and a["collectives"]
    assert a["nccl"]["files"] == 1 and [h["host"] for h in a["nccl"]["hosts"]] == hosts
    assert a["run"]["world_size"] == metadata(next(folder.glob("*.json*")))["distributedInfo"]["world_size"]
    assert a["run"]["hosts"] == hosts  # the traces name no host; the log does


def test_nothing_to_analyse_is_a_user_error() -> None:
    res = run_pardiag("analyze")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "--nccl-log" in res.stderr
    res = run_pardiag("analyze", "--nccl-log", "no-such.log")
    assert res.returncode == 2 and "no-such.log: no such file" in res.stderr
