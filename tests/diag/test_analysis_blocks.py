"""The typed nccl, telemetry, hang and what-if blocks: they travel through analysis.json
unchanged, older shapes are upgraded on load, and a hang from either source is one type
that every renderer shows."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from factories import (
    EVIL,
    analysis,
    critical_path,
    estimated,
    gpu_telemetry,
    nccl_hang,
    nccl_summary,
    pardiag_hang,
    rank,
    replay_estimate,
    share_estimate,
    telemetry_summary,
)
from pardiag.analysis import Analysis, from_dict
from pardiag.analysis_blocks import Hang, NcclSummary, Telemetry, WhatIf, upgrade_blocks
from pardiag.analyzers.hang import diagnose
from pardiag.analyzers.levers import what_if
from pardiag.analyzers.nccl.log import merge_logs, parse_nccl_log
from pardiag.analyzers.nccl.summary import summarise
from pardiag.analyzers.rules import advise
from pardiag.render_text import summary_text
from pardiag.report_md import render_markdown
from pardiag.tui.screens.nccl import hang as hang_view

DATA = Path(__file__).parents[1] / "data"
GLOO_TIMEOUT = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
                "operation to complete")
WATCHDOG = ("[rank{r}]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=10, NumelOut=10, "
            "Timeout(ms)=600000) ran for 600100 milliseconds before timing out.")


def real_pardiag_hang() -> Hang:
    """pardiag's diagnosis of a 3-rank job: ranks 0 and 1 timed out in gloo's recv in step 6,
    rank 2 finished step 4 and was still running."""
    exits = {r: {"status": "exception", "type": "RuntimeError", "message": GLOO_TIMEOUT, "step": 6} for r in (0, 1)}
    exits[2] = {"status": "running", "step": 5}
    h = diagnose(exits, {0: 5, 1: 5, 2: 4}, world_size=3)
    assert h is not None
    return h


def real_nccl_block() -> NcclSummary:
    """The nccl block of a log where ranks 0 and 1 of 3 time out in all-reduce SeqNum 41."""
    log = parse_nccl_log([WATCHDOG.format(r=0, s=41), WATCHDOG.format(r=1, s=41)])
    return summarise(merge_logs([log]), world_size=3)


def full() -> Analysis:
    """Every block filled: NCCL with its hang, telemetry, pardiag's hang, the what-if."""
    gpus = [gpu_telemetry(r, samples=60, util_gpu_ratio_mean=0.5 + r / 10, slowdown_share=0.3 * r,
                          throttle_share={"hw_thermal_slowdown": 0.3 * r}, sm_clock_max_mhz=1980,
                          memory_headroom_ratio=0.02, memory_used_max_bytes=78 * 2**30, memory_total_bytes=80 * 2**30,
                          memory_headroom_bytes=2 * 2**30, series={"util": [0.1, 0.9]}) for r in (0, 1)]
    a = analysis([rank(0, compute=0.6, comm_exposed=0.2, dataloader=0.1), rank(1, compute=0.6, dataloader=0.1)],
                 nccl=real_nccl_block(), telemetry=telemetry_summary(gpus), hang=real_pardiag_hang())
    return advise(a, telemetry=a.telemetry)


# -- round trips ------------------------------------------------------------------------------


def test_every_block_round_trips_through_analysis_json() -> None:
    a = full()
    assert a.nccl is not None and a.nccl.hang is not None and a.nccl.hang.source == "nccl"
    assert a.telemetry is not None and len(a.telemetry.gpus) == 2
    assert a.hang is not None and a.hang.source == "pardiag"
    assert isinstance(a.what_if, WhatIf) and a.what_if.findings  # the GPU health findings estimate a saving
    assert from_dict(a.to_dict()) == a
    assert from_dict(json.loads(a.to_json())) == a


@pytest.mark.parametrize("make", [nccl_hang, pardiag_hang, lambda: nccl_hang(summary=EVIL)])
def test_factory_hangs_round_trip_in_both_places(make: Any) -> None:
    h = make()
    a = analysis([rank(0)], hang=h if h.source == "pardiag" else None, nccl=nccl_summary([{"host": "h"}], hang=h))
    assert from_dict(json.loads(a.to_json())) == a


def test_absent_blocks_are_none_and_written_as_before() -> None:
    a = analysis([rank(0)])
    assert a.nccl is None and a.telemetry is None and a.hang is None
    doc = json.loads(a.to_json())
    assert doc["nccl"] == {} and doc["telemetry"] == {} and doc["hang"] is None and doc["what_if"] is None
    back = from_dict(doc)
    assert back.nccl is None and back.telemetry is None and back == a


# -- the JSON keeps every key it had ------------------------------------------------------------


def test_pardiag_hang_json_keeps_its_keys_and_values() -> None:
    doc = json.loads(analysis([rank(0)], hang=real_pardiag_hang()).to_json())["hang"]
    assert doc["source"] == "pardiag" and doc["step"] == 6
    assert doc["summary"] == ("rank(s) 0, 1 timed out in a collective (recv) during step 6; rank(s) 2 never arrived")
    assert doc["waited"] == [{"rank": r, "step": 6, "op": "recv", "timeout_ms": 5000, "message": GLOO_TIMEOUT}
                             for r in (0, 1)]
    assert doc["late"] == [{"rank": 2, "last_step": 4, "ended": "running",
                            "reason": "never reached the collective: its last finished step is 4; it was killed or "
                                      "is still running"}]
    assert doc["collect_next"][0].startswith("py-spy dump")
    assert doc["kind"] is None and doc["ranks_stuck"] is None  # NCCL's parts: added, empty


def test_nccl_hang_json_keeps_its_keys_and_gains_the_common_rows() -> None:
    doc = json.loads(analysis([rank(0)], nccl=real_nccl_block()).to_json())["nccl"]
    assert {"files", "processes", "world_size", "nnodes", "multi_node", "hosts", "transports", "init_s_max",
            "warnings", "errors", "hang"} <= set(doc)
    h = doc["hang"]
    assert {"kind", "summary", "world_size", "process_groups", "ranks_stuck", "never_arrived", "coll_laggards",
            "first_error", "flight_recorder", "collect_next", "env", "doc"} <= set(h)
    assert h["kind"] == "collective_stuck" and h["never_arrived"] == [2] and h["world_size"] == 3
    assert [(r["rank"], r["seq"], r["op_type"], r["timeout_ms"]) for r in h["ranks_stuck"]] == [
        (0, 41, "ALLREDUCE", 600000), (1, 41, "ALLREDUCE", 600000)]
    # added: the source and the rows both kinds share
    assert h["source"] == "nccl" and h["step"] is None
    assert [(w["rank"], w["op"], w["timeout_ms"]) for w in h["waited"]] == [(0, "allreduce", 600000),
                                                                           (1, "allreduce", 600000)]
    assert [(x["rank"], x["reason"]) for x in h["late"]] == [
        (2, "no timeout line in the NCCL logs: it never reached the collective")]


def test_telemetry_and_what_if_json_keep_their_shape() -> None:
    a = full()
    doc = json.loads(a.to_json())
    assert set(doc["telemetry"]) == {"source", "status", "reason", "gpus", "hosts", "ranks", "problems"}
    assert doc["telemetry"]["ranks"] == {"0": {"host": "h", "gpu": 0, "uuid": "GPU-0"},
                                         "1": {"host": "h", "gpu": 1, "uuid": "GPU-1"}}
    # the keys of the first what-if, then (added) how it was projected
    assert set(doc["what_if"]) == {"step_us", "findings", "all_step_us", "all_saving_pct", "assumption",
                                   "method", "replay_error_pct", "refused"}
    assert set(doc["what_if"]["findings"][0]) == {"lever", "title", "step_us", "saving_pct"}


def test_estimates_what_if_method_and_critical_path_round_trip() -> None:
    a = estimated()
    doc = json.loads(a.to_json())
    assert doc["findings"][0]["estimate"] == replay_estimate()
    assert doc["findings"][1]["estimate"]["refused"] == share_estimate()["refused"]
    assert (doc["what_if"]["method"], doc["what_if"]["replay_error_pct"]) == ("replay", 3.1)
    assert doc["critical_path"] == critical_path()
    assert from_dict(doc) == a


def test_an_analysis_without_estimates_or_critical_path_loads_as_before() -> None:
    """analysis.json written before these keys: no `estimate` in the findings, no `method`
    in the what-if, no `critical_path`. It loads with them unknown (None)."""
    doc = json.loads(estimated().to_json())
    for f in doc["findings"]:
        del f["estimate"]
    for k in ("method", "replay_error_pct", "refused"):
        del doc["what_if"][k]
    del doc["critical_path"]
    a = from_dict(doc)
    assert [f.estimate for f in a.findings] == [None, None] and a.critical_path is None
    assert a.what_if is not None and (a.what_if.method, a.what_if.replay_error_pct, a.what_if.refused) == (None, None, None)
    assert a.what_if.all_saving_pct == 18.0 and [f.est_saving_pct for f in a.findings] == [12.4, 7.5]


# -- older shapes -------------------------------------------------------------------------------


def test_nccl_hang_without_source_is_upgraded_to_what_the_analysis_writes_now() -> None:
    """analysis.json before the common rows: NCCL's diagnosis had no source, step, waited
    or late. Loaded, it is the Hang the NCCL diagnosis builds today."""
    a = analysis([rank(0)], nccl=real_nccl_block())
    doc = json.loads(a.to_json())
    old = doc["nccl"]["hang"]
    for key in ("source", "step", "waited", "late"):
        del old[key]
    up = from_dict(doc)
    assert a.nccl is not None and up.nccl is not None and up.nccl.hang == a.nccl.hang
    assert up == a


def test_older_telemetry_gpu_records_state_the_missing_figures_as_unknown() -> None:
    """A GPU summary from before the busy-sample figures: no busy_samples, no busy clock,
    no series. Upgraded explicitly: counts 0, figures None; the rules then find nothing."""
    g = {"host": "h", "gpu": 0, "uuid": None, "name": "A100", "ranks": [0], "samples": 9, "span_us": 9e5,
         "util_gpu_ratio_mean": 0.9, "slowdown_share": 0.5, "throttle_share": {"hw_thermal_slowdown": 0.5}}
    doc = upgrade_blocks({"telemetry": {"status": "ok", "gpus": [g], "hosts": {}, "ranks": {}}})
    up = doc["telemetry"]["gpus"][0]
    assert up["busy_samples"] == 0 and up["sm_clock_busy_mean_mhz"] is None and up["series"] == {}
    assert up["util_gpu_ratio_mean"] == 0.9 and up["throttle_share"] == {"hw_thermal_slowdown": 0.5}
    a = from_dict({**json.loads(analysis([rank(0)]).to_json()), "telemetry": doc["telemetry"]})
    assert isinstance(a.telemetry, Telemetry) and a.telemetry.source == "nvml" and a.telemetry.problems == []
    advised = advise(a, telemetry=a.telemetry)
    assert [f for f in advised.findings if f.lever == "gpu_health"] == []  # 0 busy samples, one GPU: no verdict
    assert not [n for n in advised.notices if "rule" in n.message]  # and no rule tripped over a missing figure


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.analysis.json")))
def test_stored_analyses_load_typed_and_write_back_the_same_blocks(name: str) -> None:
    """The schema-1 analysis.json files kept with the tests: every key of their nccl,
    telemetry and hang blocks comes back with its value."""
    doc = json.loads((DATA / name).read_text())
    a = from_dict(doc)
    again = json.loads(a.to_json())
    for block in ("nccl", "telemetry", "hang"):
        assert_kept(doc.get(block), again[block], block)
    assert from_dict(again) == a


def assert_kept(old: Any, new: Any, where: str) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for k, v in old.items():
            assert k in new, f"{where}.{k} dropped"
            assert_kept(v, new[k], f"{where}.{k}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (x, y) in enumerate(zip(old, new)):
            assert_kept(x, y, f"{where}[{i}]")
    else:
        assert new == old, where


# -- both kinds, one type, every renderer -------------------------------------------------------


def test_pardiag_hang_in_text_and_markdown() -> None:
    a = analysis([rank(0), rank(1)], hang=real_pardiag_hang())
    text = " ".join(summary_text(a, width=400).split())
    assert "hang: rank(s) 0, 1 timed out in a collective (recv) during step 6; rank(s) 2 never arrived" in text
    assert f"rank 0 waited in step 6: {GLOO_TIMEOUT}"[:80] in text
    assert "rank 2 never reached the collective: its last finished step is 4" in text
    md = render_markdown(a)
    assert "### Hang" in md and "rank 2 never reached the collective: its last finished step is 4" in md
    assert "rank 1 waited in step 6: \\[../third\\_party/gloo" in md


def test_nccl_hang_in_text_and_markdown() -> None:
    a = analysis([rank(0), rank(1)], nccl=real_nccl_block())
    text = " ".join(summary_text(a, width=400).split())
    assert "hang: process group 0(default_pg): ranks [0, 1] timed out in ALLREDUCE SeqNum 41" in text
    assert "rank 0 waited: ALLREDUCE SeqNum 41 in process group 0(default_pg), ran for 600100 ms" in text
    assert "rank 2 no timeout line in the NCCL logs: it never reached the collective" in text
    md = render_markdown(a)
    assert "### Hang" in md and "rank 2 no timeout line in the NCCL logs" in md
    assert "timed out in ALLREDUCE SeqNum 41" in md


def test_pardiag_hang_is_shown_before_the_nccl_one() -> None:
    a = analysis([rank(0)], nccl=real_nccl_block(), hang=real_pardiag_hang())
    text = " ".join(summary_text(a, width=400).split())
    assert "hang: rank(s) 0, 1 timed out in a collective (recv)" in text
    assert "hang: process group" not in text


def render(renderable: Any) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return " ".join(console.export_text().split())


def test_comm_setup_view_draws_either_kind() -> None:
    nccl = real_nccl_block()
    assert nccl.hang is not None
    out = render(hang_view(nccl.hang))
    assert "HANG collective stuck" in out and "where each rank stopped" in out and "ALLREDUCE" in out
    assert "ranks never arrived: 2" in out and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in out
    out = render(hang_view(real_pardiag_hang()))
    assert "HANG" in out and "timed out in a collective (recv) during step 6" in out
    assert "ranks never arrived: 2" in out and "where each rank stopped" in out and "recv" in out


def test_what_if_is_typed() -> None:
    a = full()
    assert a.what_if is not None
    assert a.what_if == what_if(a.what_if.step_us, a.findings)
    for row in a.what_if.findings:
        assert row.step_us == pytest.approx(a.what_if.step_us * (1 - min(row.saving_pct, 95.0) / 100))
