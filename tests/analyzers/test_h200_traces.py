"""Real traces from one H200 (tests/data/h200/README.md): torch 2.11, CUDA 13, NCCL 2.28.
Each number is checked against HTA or worked out here from the raw JSON, never against
pardiag alone."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pardiag.analyzers.kernels import KernelKind, event_kinds
from pardiag.analyzers.pipeline import analyze_path
from pardiag.analyzers.rank_trace import analyze_rank_trace, collective_calls, SYNC_CALLS
from pardiag.analyzers.trace import load_trace
from hta_reference import compare, hta_numbers, ours

H200 = Path(__file__).resolve().parents[1] / "data" / "h200"
RUNS = ("nccl", "gloo2", "probe")
TRACES = sorted(H200.glob("*/rank*.json.gz"))


def raw(path: Path) -> list[dict[str, Any]]:
    return json.loads(gzip.open(path).read())["traceEvents"]


def window(events: list[dict[str, Any]]) -> tuple[float, float]:
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    return min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)


@pytest.fixture(scope="module")
def hta_results() -> dict[Path, Any]:
    return {path: numbers for run in RUNS for name, numbers in hta_numbers(H200 / run).items()
            for path in [H200 / run / name]}


@pytest.mark.parametrize("path", TRACES, ids=[f"{p.parent.name}-{p.name}" for p in TRACES])
def test_the_gpu_breakdown_equals_hta(path: Path, hta_results: dict[Path, Any]) -> None:
    compare(ours(path), hta_results[path], rel=1e-12)


def test_kernel_classes_are_hta_s() -> None:
    """Every GPU event's class as HTA's get_kernel_type gives it; NCCL's one-rank reduce
    (no `nccl` prefix) is computation to both."""
    from hta.utils.utils import get_kernel_type

    for path in TRACES:
        t = load_trace(path)
        kinds = event_kinds(t.gpu.name_id, t.gpu.cat_id, t.names, t.cats)
        theirs = [get_kernel_type(t.names[i]) for i in t.gpu.name_id.tolist()]
        assert [KernelKind(k).name for k in kinds.tolist()] == theirs, path
    probe = load_trace(H200 / "probe" / "rank0.json.gz")
    one_rank = [i for i, n in enumerate(probe.names) if "oneRankReduce" in n]
    assert one_rank and int((probe.gpu.name_id == one_rank[0]).sum()) == 3


def test_gloo_on_cuda_tensors_is_timed_on_the_host() -> None:
    """gloo reduces CUDA tensors on host threads: each host `gloo:all_reduce` span is the
    collective (not an enqueue of untraced work), and its gpu_user_annotation copy on a
    stream is not a second collective."""
    for rank in (0, 1):
        path = H200 / "gloo2" / f"rank{rank}.json.gz"
        events = raw(path)
        lo, hi = window(events)
        spans = sorted((e["ts"], e["dur"]) for e in events
                       if e.get("cat") == "user_annotation" and e["name"] == "gloo:all_reduce"
                       and e["ts"] < hi and e["ts"] + e["dur"] > lo)
        assert len(spans) == 3
        t = load_trace(path)
        rt = analyze_rank_trace(t)
        calls = collective_calls(t, rt.steps)
        assert [c.timing for c in calls] == ["host"] * 3
        assert [x for c in calls for x in (c.start_us, c.dur_us)] == pytest.approx([x for s in spans for x in s], abs=1e-3)
        # the GPU breakdown counts them as communication: none overlaps a compute kernel
        # here (DDP's one bucket is reduced after the backward), so all of it is exposed
        clipped = sum(min(s + d, hi) - max(s, lo) for s, d in spans)
        b = rt.breakdown_us
        assert b["comm_exposed"] + b["comm_overlapped"] == pytest.approx(clipped, rel=1e-6)


def test_gloo_wait_and_transfer_from_both_ranks() -> None:
    """Matched across the two ranks: transfer = the shorter of each pair of spans, the
    rest is waiting (both ranks share one host clock)."""
    durs = {rank: sorted((e["ts"], e["dur"]) for e in raw(H200 / "gloo2" / f"rank{rank}.json.gz")
                         if e.get("cat") == "user_annotation" and e["name"] == "gloo:all_reduce")
            for rank in (0, 1)}
    pairs = [(a[1], b[1]) for a, b in zip(durs[0], durs[1])]
    doc = analyze_path(H200 / "gloo2").to_dict()
    (coll,) = doc["collectives"]
    assert coll["op"] == "all_reduce" and coll["calls"] == 3 and coll["group_size"] == 2
    assert coll["transfer_us"] == pytest.approx(sum(min(p) for p in pairs), rel=1e-6)
    for rank in (0, 1):
        waited = sum(p[rank] - min(p) for p in pairs)
        assert coll["wait_by_rank_us"][str(rank)] == pytest.approx(waited, rel=1e-6, abs=1e-6)
    assert not any("NCCL collectives have no kernel" in n["message"] for n in doc["notices"])


def test_a_process_group_of_one_rank_is_said_to_move_nothing() -> None:
    """DDP on one rank: three nccl:all_reduce with no kernel. The notice says why (a group
    of one rank), not that the kernels' names are unknown or the trace sampled."""
    events = raw(H200 / "nccl" / "rank0.json.gz")
    sizes = [e["args"].get("Group size") for e in events if e["name"] == "record_param_comms"
             and e.get("args", {}).get("Collective name") == "allreduce"]
    assert sizes and set(sizes) == {1}
    for run in ("nccl", "probe"):
        texts = [n["message"] for n in analyze_path(H200 / run).to_dict()["notices"]]
        assert not any("kernel names of this library are not known" in t for t in texts), run
        assert not any("NCCL collectives have no kernel" in t for t in texts), run
    texts = [n["message"] for n in analyze_path(H200 / "nccl").to_dict()["notices"]]
    assert any(t.startswith("3 collectives ran in process groups of one rank") for t in texts), texts


def test_sync_waits_of_microseconds_make_no_finding() -> None:
    """31 synchronising runtime calls in the window, 1-43 us each (DDP times its first 10
    iterations with CUDA events): the host waits 0.1% of the window, so no sync finding."""
    path = H200 / "nccl" / "rank0.json.gz"
    events = raw(path)
    lo, hi = window(events)
    sync = [e for e in events if e.get("cat") == "cuda_runtime" and SYNC_CALLS.match(e["name"])
            and lo <= e["ts"] < hi]
    rt = analyze_rank_trace(load_trace(path))
    assert rt.ops["item_device_reads"] == 0
    assert rt.ops["sync_calls"] == len(sync) == 30
    assert rt.ops["sync_us"] == pytest.approx(sum(e["dur"] for e in sync), rel=1e-9)
    assert rt.ops["sync_us"] / (hi - lo) < 0.002
    doc = analyze_path(H200 / "nccl").to_dict()
    assert "sync_points" not in {f["lever"] for f in doc["findings"]}
    assert re.match(r"cuda(Event|Stream|Device)Synchronize", sync[0]["name"])
