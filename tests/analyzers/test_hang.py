"""Hang diagnosis: a real job whose rank 1 stops calling collectives, and the rules on
records written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, run_pardiag, torchrun
from pardiag.analyzers.hang import diagnose


@pytest.mark.slow
@pytest.mark.timed
def test_rank_that_stops_calling_collectives_is_named(tmp_path: Path) -> None:
    out = tmp_path / "hang"
    res = run_pardiag("run", "--no-report", "--out", str(out), "--", *torchrun(2, SCRIPTS / "stop_collectives.py"))
    assert res.returncode != 0  # the job failed; pardiag returns its code
    said = " ".join(res.stderr.split())  # the summary at the end of the run, unwrapped
    assert "hang: rank(s) 0 timed out in a collective (recv) during step 6; rank(s) 1 never arrived" in said
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    h = doc["hang"]
    assert h["step"] == 6
    assert [w["rank"] for w in h["waited"]] == [0] and h["waited"][0]["timeout_ms"] == 5000
    (late,) = h["late"]
    assert late["rank"] == 1 and late["last_step"] == 5
    assert any(n["message"].startswith("hang: ") for n in doc["notices"])


def test_nccl_watchdog_message_by_hand() -> None:
    msg = ("[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
           "NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.")
    exits = {0: {"status": "exception", "message": msg, "step": 41}, 1: {"status": "exception", "message": msg, "step": 41},
             2: {"status": "exited", "step": 100}, 3: {"status": "running"}}
    h = diagnose(exits, {0: 40, 1: 40, 2: 99, 3: 39}, world_size=4)
    assert h is not None and h.step == 41
    assert [(w.rank, w.op, w.timeout_ms) for w in h.waited] == [(0, "allreduce", 600000), (1, "allreduce", 600000)]
    assert [x.rank for x in h.late] == [3]  # rank 2 went past step 41: it is not the one missing
    assert diagnose({0: {"status": "exception", "message": "ValueError: bad shape", "step": 3}}, {0: 2}, 1) is None


# -- only collective evidence gives a verdict -------------------------------------------------
# Messages as torch, gloo and NCCL word them (exit records: meta.json's "type" and "message").
COLLECTIVE_EXITS = [
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for "
                     "recv operation to complete", "recv", 5000),
    ("DistBackendError", "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting "
                         "1800000ms for send operation to complete", "send", 1800000),
    ("DistBackendError", "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
                         "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600042 milliseconds before "
                         "timing out.", "allreduce", 600000),
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                     "[127.0.0.1]:41868", None, None),
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:3184: Connection "
                     "reset by peer", None, None),
    ("DistBackendError", "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process "
                         "exited or there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed "
                         "possibly due to a network error or a remote process exiting prematurely.", None, None),
    ("RuntimeError", "Rank 1 failed to pass monitoredBarrier in 5000 ms", "barrier", 5000),
    ("DistBackendError", "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
                         "kernels, subsequent GPU operations might run on corrupted/incomplete data.", None, None),
]

# Timeouts and broken connections that are not a collective: the job failed, but no rank
# waited for another in a collective.
OTHER_EXITS = [
    ("RuntimeError", "DataLoader timed out after 5 seconds"),
    ("ReadTimeout", "HTTPSConnectionPool(host='huggingface.co', port=443): Read timed out. (read timeout=10)"),
    ("ReadTimeoutError", "HTTPConnectionPool(host='metrics.internal', port=80): Read timed out."),
    ("ConnectionError", "('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))"),
    ("ConnectionResetError", "[Errno 104] Connection reset by peer"),
    ("TimeoutError", "timed out"),
    ("timeout", "The read operation timed out"),
    ("TimeoutExpired", "Command '['nvidia-smi']' timed out after 5 seconds"),
    ("Timeout", "The file lock '/data/cache/.lock' could not be acquired. Timeout waiting for the lock"),
    ("DistStoreError", "Timed out after 901 seconds waiting for clients. 1/2 clients joined."),
    ("RuntimeError", "Connection closed by peer while streaming the dataset shard"),
    ("RuntimeError", "wandb: Network error (ReadTimeout), entering retry loop. watchdog timeout"),
]


@pytest.mark.parametrize("etype,message,op,timeout_ms", COLLECTIVE_EXITS)
def test_collective_evidence_gives_a_verdict(etype: str, message: str, op: str | None, timeout_ms: int | None) -> None:
    exits = {0: {"status": "exception", "type": etype, "message": message, "step": 7}, 1: {"status": "running"}}
    h = diagnose(exits, {0: 6, 1: 4}, world_size=2)
    assert h is not None and h.step == 7 and h.source == "pardiag"
    assert [(w.rank, w.op, w.timeout_ms) for w in h.waited] == [(0, op, timeout_ms)]
    assert [x.rank for x in h.late] == [1]


@pytest.mark.parametrize("etype,message", OTHER_EXITS)
def test_a_timeout_outside_collectives_is_no_hang(etype: str, message: str) -> None:
    exits = {0: {"status": "exception", "type": etype, "message": message, "step": 7}, 1: {"status": "running"}}
    assert diagnose(exits, {0: 6, 1: 4}, world_size=2) is None


@pytest.mark.parametrize("what", ["timed out", "Timeout", "timeout expired", "connection reset by peer",
                                  "Connection closed by peer", "watchdog timeout"])
@pytest.mark.parametrize("where", ["DataLoader worker (pid 4242)", "requests.get('https://example.org')",
                                   "socket recv", "redis", "checkpoint upload to s3"])
def test_any_non_collective_timeout_is_no_hang(what: str, where: str) -> None:
    """The class, not a list of strings: a timeout wording next to anything that is not a
    collective backend never becomes "timed out in a collective"."""
    exits = {0: {"status": "exception", "type": "RuntimeError", "message": f"{where}: {what}", "step": 3}}
    assert diagnose(exits, {0: 2, 1: 2}, world_size=2) is None
