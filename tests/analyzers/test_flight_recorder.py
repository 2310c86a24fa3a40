"""Flight-recorder dumps: matching worked out by hand on dumps built to c10d's format (version
"2.10", the shape torch's flight_recorder components read), agreement with torch's own
`types.Op.match`, bad files, and the merged hang verdict. Real gloo runs are in
test_flight_recorder_runs.py: with torch 2.13 gloo records collectives but never writes a
dump itself; pardiag's collector writes it when a rank fails."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from pardiag.analysis_blocks import flight_from_dict, hang_from_dict, upgrade_blocks
from pardiag.analyzers.flight_recorder import analyze_flight_dir, load_dump, match_state, parse_dump
from pardiag.analyzers.hang import diagnose, with_flight_recorder

FRAMES = [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
          {"name": "train_step", "filename": "/job/train.py", "line": 42}]


def entry(seq: int, op: str = "all_reduce", sizes: Any = ((16,),), out: Any = None, dtype: str = "Float",
          state: str = "completed", pg: str = "0", backend: str = "nccl") -> dict[str, Any]:
    """One `entries` row as c10d writes it (FlightRecorder::dump_entries)."""
    sizes = [list(s) for s in sizes]
    return {"frames": FRAMES, "record_id": seq - 1, "pg_id": int(pg), "process_group": (pg, "default_pg"),
            "thread_name": "python", "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"{backend}:{op}", "time_created_ns": 10 * seq, "input_sizes": sizes,
            "input_dtypes": [dtype] * len(sizes), "output_sizes": [list(s) for s in out] if out else sizes,
            "output_dtypes": [dtype] * len(sizes), "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": False}


def dump(entries: list[dict[str, Any]], world: int, version: str = "2.10") -> bytes:
    done = max((e["collective_seq_id"] for e in entries if e["state"] == "completed"), default=-1)
    return pickle.dumps({"version": version, "comm_lib_version": "2.21.5",
                         "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
                         "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": -1,
                                             "last_completed_collective": done}},
                         "entries": entries})


def write(folder: Path, dumps: dict[int, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, b in dumps.items():
        (folder / f"rank_{r}").write_bytes(b)
    return folder


def healthy(n: int) -> list[dict[str, Any]]:
    return [entry(s) for s in range(1, n + 1)]


def test_rank_that_never_entered_is_the_culprit(tmp_path: Path) -> None:
    # ranks 0 and 2 completed #1-#4 and are stuck in #5; rank 1's dump ends at #4
    stuck = [*healthy(4), entry(5, sizes=((32,),), state="started")]
    f = analyze_flight_dir(write(tmp_path, {0: dump(stuck, 3), 1: dump(healthy(4), 3), 2: dump(stuck, 3)}), 3)
    assert f is not None and f.notes == [] and f.ranks_dumped == [0, 1, 2] and f.version == "2.10"
    (g,) = f.groups
    m = g.first_mismatch
    assert m is not None and (m.seq, m.match_state, m.culprit_ranks) == (5, "MISSING_RANKS", [1])
    assert (m.expected.op, m.expected.input_sizes, m.expected.state) == ("all_reduce", [[32]], "started")
    assert g.never_arrived == [1] and g.culprit_ranks == [1] and g.ranks == [0, 1, 2]
    last = {x.rank: x for x in g.last}
    assert last[0].last_completed.seq == 4 and last[0].last_entered.seq == 5
    assert last[1].last_completed.seq == 4 and last[1].last_entered.seq == 4
    assert g.stuck_user_frame == "train_step (/job/train.py:42)"
    assert f.summary == "process group 0, collective #5 (all_reduce): rank(s) 1 never entered it"


@pytest.mark.parametrize("odd, state, detail", [
    (entry(3, op="all_gather", sizes=((16,),), out=((3, 16),)), "COLLECTIVE_TYPE_MISMATCH", "all_reduce vs all_gather"),
    (entry(3, sizes=((15,),)), "SIZE_OR_SYNTAX_MISMATCH", "input sizes [[16]] vs [[15]]"),
    (entry(3, dtype="BFloat16"), "COLLECTIVE_DTYPE_MISMATCH", "dtypes ['Float'] vs ['BFloat16']"),
    (entry(3, state="started"), "COLLECTIVE_STATE_MISMATCH", "state completed vs started"),
])
def test_first_mismatch_takes_the_majority_as_reference(tmp_path: Path, odd: dict[str, Any], state: str,
                                                        detail: str) -> None:
    # three ranks: ranks 0 and 1 agree on #3, rank 2 differs; #4 differs too but comes later
    same = [*healthy(3), entry(4)]
    other = [*healthy(2), odd, entry(4, sizes=((9,),), state="started")]
    f = analyze_flight_dir(write(tmp_path, {0: dump(same, 3), 1: dump(same, 3), 2: dump(other, 3)}), 3)
    m = f.groups[0].first_mismatch
    assert (m.seq, m.match_state, m.reference_rank, m.culprit_ranks, m.detail) == (3, state, 0, [2], detail)
    assert [c.rank for c in m.found] == [2] and m.found[0].op == odd["profiling_name"].split(":")[1]
    assert f.groups[0].never_arrived == []
    # a collective the ranks disagree on did not complete, whatever the dumps say
    assert {x.rank: x.last_completed.seq for x in f.groups[0].last} == {0: 2, 1: 2, 2: 2}


def test_two_ranks_tie_names_the_higher_rank_like_fr_trace(tmp_path: Path) -> None:
    a = [*healthy(3), entry(4, state="started")]
    b = [*healthy(3), entry(4, op="barrier", sizes=(), state="started")]
    f = analyze_flight_dir(write(tmp_path, {0: dump(a, 2), 1: dump(b, 2)}), 2)
    m = f.groups[0].first_mismatch
    assert (m.seq, m.match_state, m.reference_rank, m.culprit_ranks) == (4, "COLLECTIVE_TYPE_MISMATCH", 0, [1])


def test_gloo_counts_a_failed_collective_as_completed(tmp_path: Path) -> None:
    # gloo leaves `state` at "scheduled" and its pg_status counts the collective that timed out
    a = [entry(s, state="scheduled", backend="gloo") for s in (1, 2, 3)]
    b = [*a[:2], entry(3, op="all_gather", out=((2, 16),), state="scheduled", backend="gloo")]
    files = {r: pickle.dumps({**pickle.loads(dump(x, 2)), "pg_status": {"0": {"last_completed_collective": 3}}})
             for r, x in ((0, a), (1, b))}
    g = analyze_flight_dir(write(tmp_path, files), 2).groups[0]
    assert [(x.last_completed.seq, x.last_entered.seq, x.last_entered.state) for x in g.last] == [
        (2, 3, "scheduled"), (2, 3, "scheduled")]


def test_agrees_with_torch_op_match() -> None:
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    ref = entry(3)
    cases = [entry(3), entry(3, op="all_gather", out=((3, 16),)), entry(3, sizes=((15,),)),
             entry(3, dtype="BFloat16"), entry(3, state="started")]
    members = {"0": {0, 1, 2}}
    for other in cases:
        theirs = types.Op(ref, members, "0").match(types.Op(other, members, "0")).state.name
        a, b = (parse_dump(r, pickle.loads(dump([e], 3))).entries[0] for r, e in ((0, ref), (1, other)))
        assert match_state(a, b, 3)[0] == theirs


@pytest.mark.parametrize("content, note", [
    (lambda good: good[: len(good) // 2], "rank_1: truncated (the pickle ends early); rank 1 left out"),
    (lambda good: b"\x00 NCCL INFO a log, not a dump\n", "rank_1: not a flight-recorder pickle: invalid load key"),
    (lambda good: dump(healthy(2), 2, version="3.0"), "rank_1: format version '3.0', this pardiag reads 2.x"),
    (lambda good: pickle.dumps(Path("/etc/passwd")), "rank_1: not a flight-recorder pickle: refused global pathlib"),
    (lambda good: pickle.dumps({"version": "2.10"}), "rank_1: not a flight-recorder dump (no `entries`)"),
])
def test_a_bad_file_is_one_note_and_the_rest_is_analysed(tmp_path: Path, content: Any, note: str) -> None:
    good = dump([*healthy(2), entry(3, state="started")], 2)
    f = analyze_flight_dir(write(tmp_path, {0: good, 1: content(good)}), 2)
    assert f.ranks_dumped == [0] and f.missing_ranks == [1]
    assert f.notes[0].startswith(note) and len(f.notes) == 2
    assert f.notes[1] == "no readable dump from rank(s) 1: their side of each collective is unknown"
    (g,) = f.groups
    assert g.first_mismatch is None and g.missing_dumps == [1] and g.last[0].last_entered.seq == 3


def test_a_missing_rank_file(tmp_path: Path) -> None:
    f = analyze_flight_dir(write(tmp_path, {0: dump(healthy(3), 4), 2: dump(healthy(3), 4)}), 4)
    assert f.missing_ranks == [1, 3] and f.groups[0].missing_dumps == [1, 3]
    assert f.summary == "every dumped rank issued the same collectives; no dump from rank(s) 1, 3"


def test_no_dump_and_empty_folder(tmp_path: Path) -> None:
    assert analyze_flight_dir(tmp_path / "absent", 2) is None
    assert analyze_flight_dir(write(tmp_path / "empty", {}), 2) is None


def test_restricted_unpickler_never_runs_a_global() -> None:
    class Boom:
        def __reduce__(self) -> Any:
            return (print, ("ran",))

    with pytest.raises(ValueError, match="refused global builtins.print"):
        load_dump(pickle.dumps(Boom()))


# --------------------------------------------------------------------------- the merged verdict

TIMED_OUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete"
EXITS = {0: {"status": "exception", "type": "RuntimeError", "step": 3, "message": TIMED_OUT},
         1: {"status": "running", "step": 3},
         2: {"status": "exception", "type": "RuntimeError", "step": 3, "message": TIMED_OUT}}


def test_flight_recorder_decides_the_verdict_and_keeps_the_exits(tmp_path: Path) -> None:
    stuck = [*healthy(4), entry(5, state="started")]
    flight = analyze_flight_dir(write(tmp_path, {0: dump(stuck, 3), 1: dump(healthy(4), 3), 2: dump(stuck, 3)}), 3)
    exits = diagnose(EXITS, {0: 2, 1: 3, 2: 2}, 3)
    assert exits is not None and exits.late == []  # rank 1 finished step 3: the exits cannot name it
    h = with_flight_recorder(exits, flight)
    assert h.source == "flight_recorder" and h.sources == ["pardiag", "flight_recorder"]
    assert h.summary.startswith("flight recorder: collective #5 of process group 0 (all_reduce of [[16]] Float on "
                                "rank 0): rank(s) 1 never entered it (rank 0 at train_step (/job/train.py:42))")
    assert h.summary.endswith(exits.summary)
    assert [w.rank for w in h.waited] == [0, 2] and h.step == 3
    assert [(x.rank, x.reason) for x in h.late] == [
        (1, "never entered collective #5 (all_reduce) of process group 0 (flight recorder)")]
    again = hang_from_dict(h.to_dict())
    assert again == h and again.flight == flight_from_dict(flight.to_dict())


def test_without_dumps_the_exit_verdict_stands(tmp_path: Path) -> None:
    exits = diagnose(EXITS, {0: 2, 1: 1, 2: 2}, 3)
    h = with_flight_recorder(exits, analyze_flight_dir(tmp_path, 3))
    assert h.source == "pardiag" and h.sources == ["pardiag"] and h.flight is None and h.summary == exits.summary
    assert with_flight_recorder(None, None) is None


def test_dumps_without_a_culprit_ride_along(tmp_path: Path) -> None:
    flight = analyze_flight_dir(write(tmp_path, {0: dump(healthy(3), 2), 1: dump(healthy(3), 2)}), 2)
    assert with_flight_recorder(None, flight) is None
    exits = diagnose(EXITS, {0: 2, 1: 1, 2: 2}, 3)
    h = with_flight_recorder(exits, flight)
    assert h.source == "pardiag" and h.sources == ["pardiag", "flight_recorder"] and h.flight == flight


def test_dumps_alone_make_a_verdict(tmp_path: Path) -> None:
    a = [*healthy(2), entry(3, state="started")]
    b = [*healthy(2), entry(3, sizes=((15,),), state="started")]
    h = with_flight_recorder(None, analyze_flight_dir(write(tmp_path, {0: dump(a, 2), 1: dump(b, 2)}), 2))
    assert h.source == "flight_recorder" and h.sources == ["flight_recorder"]
    assert [(w.rank, w.op) for w in h.waited] == [(0, "all_reduce"), (1, "all_reduce")]
    assert "is SIZE_OR_SYNTAX_MISMATCH: rank 0 called all_reduce of [[16]] Float, rank 1 called all_reduce of " \
           "[[15]] Float" in h.summary


def test_an_older_hang_block_reads_without_the_new_fields() -> None:
    old = {"hang": {"source": "pardiag", "summary": "rank(s) 0 timed out", "step": 6, "waited": [], "late": [],
                    "collect_next": []}}
    h = hang_from_dict(upgrade_blocks(old)["hang"])
    assert h.flight is None and h.sources == ["pardiag"] and h.summary == "rank(s) 0 timed out"


@pytest.mark.parametrize("fmt", ["md", "text", "html"])
def test_every_renderer_shows_the_flight_recorder_verdict(tmp_path: Path, fmt: str) -> None:
    from factories import analysis, rank

    from pardiag.analysis import from_dict
    from pardiag.renderers import render

    a_ = [*healthy(2), entry(3, state="started")]
    b_ = [*healthy(2), entry(3, op="barrier", sizes=(), state="started")]
    h = with_flight_recorder(diagnose(EXITS, {0: 2, 1: 3, 2: 2}, 3),
                             analyze_flight_dir(write(tmp_path, {0: dump(a_, 2), 1: dump(b_, 2)}), 2))
    a = from_dict(json.loads(analysis([rank(0), rank(1)], hang=h).to_json()))  # through analysis.json
    assert a.hang == h
    out = " ".join(render(a, fmt).split()).replace("\\", "").replace("&#35;", "#").replace("&#39;", "'")
    assert "collective #3 of process group 0 is COLLECTIVE_TYPE_MISMATCH: rank 0 called all_reduce of [[16]] Float, " \
           "rank 1 called barrier" in out
    assert "rank 1 last completed #2 all_reduce, last entered #3 barrier (started)" in out
    assert "rank 1 called barrier at train_step (/job/train.py:42)" in out
