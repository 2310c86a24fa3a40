"""`job_timeline`: the job on one clock. The step chart of the Analysis (`step_view`) on
the real GPU fixture: the step every rank recorded, tiled by the breakdown's categories,
on the same clock as the merged export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES
from pardiag.analyzers.pipeline import analyze_path

SAMPLED = FIXTURES / "gpu-traces" / "sampled-128rank-job"
CATEGORIES = {"compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle"}


def test_step_view_of_a_real_gpu_job(tmp_path: Path) -> None:
    from pardiag.export_perfetto import export_perfetto

    a = analyze_path(SAMPLED)
    st = a.step_timeline
    assert st is not None and st["step"] == 551 and st["ranks_total"] == 2  # steps 551-552: the first of the middle two
    assert st["clock_offsets_us"] == {"0": 0.0, "1": 332.0} == a.run.clock_offsets_us
    rows = {r["rank"]: r for r in st["ranks"]}
    assert sorted(rows) == [0, 1] and min(r["start_us"] for r in rows.values()) == 0.0
    for r in rows.values():
        segs = r["segments"]
        assert segs[0][0] == r["start_us"] and segs[-1][1] == r["end_us"]
        assert all(a1 == b0 for (_, a1, _), (b0, _, _) in zip(segs, segs[1:]))  # they tile the step
        assert {c for _, _, c in segs} <= CATEGORIES
    # each rank's step lasts what the analysis' per-step breakdown says it lasts
    for rr in a.ranks:
        assert rows[rr.rank]["end_us"] - rows[rr.rank]["start_us"] == pytest.approx(
            sum(rr.breakdown_per_step_us["551"].values()))
    # and sits where the export puts that step: the same clock
    export_perfetto(SAMPLED, tmp_path / "job.json", a)
    events = json.loads((tmp_path / "job.json").read_text())["traceEvents"]
    starts = {e["pid"]: e["ts"] for e in events if e.get("cat") == "pardiag.step" and e["name"] == "step 551"}
    assert starts[1] - starts[0] == pytest.approx(rows[1]["start_us"] - rows[0]["start_us"], abs=0.002)


def test_the_block_survives_the_json_round_trip() -> None:
    from pardiag.analysis import from_dict

    a = analyze_path(SAMPLED)
    assert from_dict(json.loads(a.to_json())).step_timeline == json.loads(json.dumps(a.step_timeline))


def test_every_profiled_step_with_its_collectives() -> None:
    """`steps`: both profiled steps, each tiled as the middle one is, with the matched
    collectives of that step (all_reduce of step 551: 78 MB, rank 0 waits 3357 us of
    its 11727 us, the transfer is rank 1's 8370 us)."""
    st = analyze_path(SAMPLED).step_timeline
    assert st is not None and [e["step"] for e in st["steps"]] == [551, 552]
    middle = st["steps"][0]
    assert middle["ranks"] == st["ranks"]
    reduce = [c for c in middle["collectives"] if c["op"] == "all_reduce"][0]
    r0, r1 = reduce["members"]
    assert reduce["bytes"] == 78473228 and (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["end_us"] - r0["start_us"] == pytest.approx(11727) and r0["wait_us"] == pytest.approx(3357)
    assert r0["transfer_us"] == r1["transfer_us"] == pytest.approx(8370) and r1["wait_us"] == 0.0
    for e in st["steps"]:
        for c in e["collectives"]:
            for m in c["members"]:
                row = next(r for r in e["ranks"] if r["rank"] == m["rank"])
                assert row["start_us"] <= m["start_us"] < m["end_us"] <= row["end_us"] + 1.0


@pytest.mark.parametrize(("n", "middle", "size", "want"), [
    (3, 1, 10, [0, 1, 2]),
    (40, 19, 10, list(range(11, 27))),  # 16 steps: the middle, then the nearest, earlier first
    (5, 2, 40_000, [1, 2]),  # the middle and the earlier neighbour: a third step would make 120,000 runs
    (5, 2, 200_000, [2]),  # the middle alone over the budget is held all the same
])
def test_steps_held_around_the_middle(n: int, middle: int, size: int, want: list[int]) -> None:
    from pardiag.analyzers.job_timeline import _bounded

    steps = list(range(n))
    assert _bounded(steps, middle, {s: size for s in steps}) == want
