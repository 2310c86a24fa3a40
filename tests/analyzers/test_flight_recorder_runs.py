"""Real gloo runs and their flight-recorder dumps. With torch 2.13 ProcessGroupGloo records
every collective in the flight recorder but nothing writes it on a timeout (NCCL's watchdog
does): the dumps in flight/ are the ones pardiag's collector writes as each rank fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, run_pardiag, torchrun

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, script: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "run"
    res = run_pardiag("run", "--no-report", "--out", str(out), "--", *torchrun(2, SCRIPTS / script), timeout=60)
    assert res.returncode != 0  # the job failed; pardiag returns its code
    assert sorted(p.name for p in (out / "flight").iterdir()) == ["rank_0", "rank_1"]
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    return doc, " ".join(res.stderr.split())


def test_rank_that_skips_an_all_reduce_is_the_culprit(tmp_path: Path) -> None:
    doc, said = _run(tmp_path, "fr_skip.py")
    h = doc["hang"]
    assert h["source"] == "flight_recorder" and h["sources"] == ["pardiag", "flight_recorder"]
    (g,) = h["flight"]["groups"]
    m = g["first_mismatch"]
    assert (g["process_group"], m["seq"], m["match_state"], m["reference_rank"], m["culprit_ranks"]) == (
        "0", 4, "COLLECTIVE_TYPE_MISMATCH", 0, [1])
    assert (m["expected"]["op"], m["expected"]["input_sizes"], m["expected"]["input_dtypes"]) == (
        "all_reduce", [[16]], ["Float"])
    assert [(c["rank"], c["op"], c["input_sizes"]) for c in m["found"]] == [(1, "barrier", [])]
    assert [(x["rank"], x["last_completed"]["seq"], x["last_entered"]["seq"], x["last_entered"]["op"])
            for x in g["last"]] == [(0, 3, 4, "all_reduce"), (1, 3, 4, "barrier")]
    assert g["stuck_user_frame"].endswith("fr_skip.py:22)")  # rank 0's all_reduce in the loop
    assert m["found"][0]["frames"][-1].endswith("fr_skip.py:27)")  # rank 1's barrier after it
    assert "hang: flight recorder: collective #4 of process group 0 is COLLECTIVE_TYPE_MISMATCH" in said


def test_ranks_that_call_different_collectives(tmp_path: Path) -> None:
    doc, said = _run(tmp_path, "fr_mismatch.py")
    h = doc["hang"]
    m = h["flight"]["groups"][0]["first_mismatch"]
    assert (m["seq"], m["match_state"], m["culprit_ranks"], m["detail"]) == (
        3, "COLLECTIVE_TYPE_MISMATCH", [1], "all_reduce vs all_gather")
    assert (m["found"][0]["op"], m["found"][0]["input_sizes"], m["found"][0]["output_sizes"]) == (
        "all_gather", [[8]], [[2, 8]])
    assert h["step"] == 2 and sorted(w["rank"] for w in h["waited"]) == [0, 1]
    assert h["flight"]["notes"] == [] and h["flight"]["version"] == "2.10"
    assert "rank 1 called all_gather of [[8]] Float" in said


def test_gloo_hang_without_dumps_keeps_the_exit_verdict(tmp_path: Path) -> None:
    """The same hang with flight/ emptied afterwards, then with one rank's dump cut short."""
    out = tmp_path / "run"
    run_pardiag("run", "--no-report", "--out", str(out), "--", *torchrun(2, SCRIPTS / "fr_skip.py"), timeout=60)
    dumps = {p.name: p.read_bytes() for p in (out / "flight").iterdir()}
    shutil.rmtree(out / "flight")
    (out / "flight").mkdir()
    h = json.loads(run_pardiag("analyze", "--force", str(out), "--json").stdout)["hang"]
    assert h["source"] == "pardiag" and h["sources"] == ["pardiag"] and h["flight"] is None
    assert sorted(w["rank"] for w in h["waited"]) == [0, 1]
    (out / "flight" / "rank_0").write_bytes(dumps["rank_0"])
    (out / "flight" / "rank_1").write_bytes(dumps["rank_1"][:100])
    doc = json.loads(run_pardiag("analyze", "--force", str(out), "--json").stdout)
    h = doc["hang"]
    assert h["source"] == "pardiag" and h["sources"] == ["pardiag", "flight_recorder"]
    assert h["flight"]["ranks_dumped"] == [0] and h["flight"]["missing_ranks"] == [1]
    assert any(n["message"] == "flight recorder: rank_1: truncated (the pickle ends early); rank 1 left out"
               for n in doc["notices"])
