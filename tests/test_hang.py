"""Hang diagnosis: a real job whose rank 1 stops calling collectives, and the rules on
records written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, run_pardiag, torchrun
from pardiag.analyzers.hang import diagnose


@pytest.mark.slow
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
    assert h is not None and h["step"] == 41
    assert [(w["rank"], w["op"], w["timeout_ms"]) for w in h["waited"]] == [(0, "allreduce", 600000), (1, "allreduce", 600000)]
    assert [x["rank"] for x in h["late"]] == [3]  # rank 2 went past step 41: it is not the one missing
    assert diagnose({0: {"status": "exception", "message": "ValueError: bad shape", "step": 3}}, {0: 2}, 1) is None
