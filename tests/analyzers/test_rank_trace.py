"""Per-rank breakdown, phases and collectives on small traces worked out by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pardiag.analyzers.pipeline import analyze_path
from pardiag.analyzers.collectives import bus_factor
from pardiag.analyzers.rank_trace import analyze_rank_trace
from pardiag.analyzers.trace import load_trace
from tracegen import DL, cpu_rank, kernel, write_trace, x


@pytest.fixture
def cpu_traces(tmp_path: Path) -> Path:
    write_trace(tmp_path / "rank0.json", cpu_rank(1600, 250), rank=0)
    write_trace(tmp_path / "rank1.json.gz", cpu_rank(1700, 100), rank=1)
    return tmp_path


def test_cpu_breakdown_by_hand(cpu_traces: Path) -> None:
    r = analyze_rank_trace(load_trace(cpu_traces / "rank0.json"))
    assert r.device_type == "cpu" and [s.step for s in r.steps] == [5] and r.window_us == 1000
    # data 1000-1100 (collate inside counts as input loading); compute 1100-1400,
    # 1450-1600, 1900-1940; comm 1600-1850 of which 1600-1700 under backward
    assert r.breakdown_us == {
        "dataloader": 100.0, "compute": 490.0, "comm_overlapped": 100.0,
        "comm_exposed": 150.0, "memcpy": 0.0, "idle": 160.0,
    }
    # a gap while the all-reduce is in flight is the thread blocked in backward
    # (1700-1850); the other gaps run no torch operator and no collective: host work,
    # no longer given to the phase before them (which made a sleep before forward read
    # as forward): 1400-1450 between forward and backward, 1850-1900 after the all-reduce
    # ended and before the optimizer, 1950-2000 after the optimizer
    assert r.phases_us == {"dataloader": 100.0, "forward": 300.0, "backward": 400.0, "optimizer": 50.0,
                           "other": 0.0, "host": 150.0}
    assert r.host_gaps_us == {"between forward and backward": 50.0, "between backward and the optimizer": 50.0,
                              "at the step's end, after the optimizer": 50.0}
    (c,) = r.collectives
    assert (c.op, c.process_group, c.bytes, c.step, c.group_size) == ("all_reduce", "0:default_pg", 4000, 5, 2)


def test_a_steps_segments_by_hand(cpu_traces: Path) -> None:
    """The same step in time order: the breakdown's categories where they happen."""
    r = analyze_rank_trace(load_trace(cpu_traces / "rank0.json"))
    assert r.segments_per_step_us == {5: (
        (1000.0, 1100.0, "dataloader"), (1100.0, 1400.0, "compute"), (1400.0, 1450.0, "idle"),
        (1450.0, 1600.0, "compute"), (1600.0, 1700.0, "comm_overlapped"), (1700.0, 1850.0, "comm_exposed"),
        (1850.0, 1900.0, "idle"), (1900.0, 1940.0, "compute"), (1940.0, 2000.0, "idle"))}
    totals: dict[str, float] = {}
    for s, e, c in r.segments_per_step_us[5]:
        totals[c] = totals.get(c, 0.0) + e - s
    assert totals == {k: v for k, v in r.breakdown_per_step_us[5].items() if v}


def test_a_stretch_too_short_to_draw_joins_the_one_before() -> None:
    from pardiag.analyzers.rank_trace import step_segments

    empty = (np.empty(0), np.empty(0))
    compute = (np.array([10.0, 50.0]), np.array([10.1, 80.0]))  # 0.1 us of 100: under 1/500 of the step
    assert step_segments((0.0, 100.0), compute, empty, empty, empty, True) == (
        (0.0, 50.0, "idle"), (50.0, 80.0, "compute"), (80.0, 100.0, "idle"))


def test_gpu_breakdown_by_hand(tmp_path: Path) -> None:
    events = [
        x("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        x(DL, 0, 50, cat="user_annotation"),
        kernel("volta_sgemm_128x64_nn", 100, 300, stream=7),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 300, 400, stream=8,
               correlation=2, **{"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
                                 "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                                 "Process Group Description": "default_pg"}),
        kernel("Memcpy HtoD (Pageable -> Device)", 800, 50, stream=7, correlation=3, cat="gpu_memcpy"),
    ]
    r = analyze_rank_trace(load_trace(write_trace(tmp_path / "g.json", events, backend="nccl")))
    assert r.device_type == "cuda"
    assert r.breakdown_us == {
        "compute": 200.0, "comm_overlapped": 100.0, "comm_exposed": 300.0,
        "memcpy": 50.0, "dataloader": 50.0, "idle": 300.0,
    }
    (c,) = r.collectives
    assert (c.op, c.bytes, c.on_gpu, c.process_group) == ("all_reduce", 4000, True, "0:default_pg")


def test_collectives_matched_across_ranks(cpu_traces: Path) -> None:
    a = analyze_path(cpu_traces, jobs=1)
    assert [r.rank for r in a.ranks] == [0, 1]
    (c,) = a.collectives
    # durations 250 (rank 0 arrived first and waited) and 100: transfer 100
    assert (c.calls, c.bytes, c.transfer_us, c.total_us, c.wait_us) == (1, 4000, 100.0, 175.0, 75.0)
    assert c.wait_by_rank_us == {"0": 150.0, "1": 0.0}
    assert c.algbw_gbps == pytest.approx(4000 / 100e-6 / 1e9)
    assert c.busbw_gbps == pytest.approx(c.algbw_gbps * 1.0)  # 2(n-1)/n = 1 for n = 2
    assert a.ranks[0].wait_us == 150.0 and a.ranks[1].wait_us == 0.0
    (g,) = a.process_groups
    assert (g.role, g.size, g.ops) == ("data-parallel", 2, {"all_reduce": 1})
    assert a.notices == []


def test_bus_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("broadcast", 4) == 1.0
    assert bus_factor("barrier", 4) is None


def test_unknown_kernels_are_reported(tmp_path: Path) -> None:
    events = [
        x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        kernel("volta_sgemm_128x64_nn", 100, 300, stream=7),
        kernel("Stream Sync", 500, 40, stream=7, correlation=2),
    ]
    r = analyze_rank_trace(load_trace(write_trace(tmp_path / "g.json", events, backend="nccl")))
    assert r.breakdown_us["compute"] == 300.0 and r.breakdown_us["idle"] == 700.0
    (n,) = r.notices
    assert n.startswith("1 GPU events (40 us) match no known kernel class") and "Stream Sync" in n


def test_item_reads_are_counted_once_on_a_real_gpu_trace() -> None:
    """sampled_rank-0: three `.item()` calls, each an aten::item with an
    aten::_local_scalar_dense inside it and a cudaMemcpyAsync inside that (counted here
    with json, independently of the loader): three host reads, not six."""
    import gzip
    import json

    from conftest import FIXTURES
    from pardiag.analyzers.rank_trace import op_stats
    from pardiag.analyzers.trace import load_trace

    path = FIXTURES / "gpu-traces" / "sampled-128rank-job" / "sampled_rank-0.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    names = [e.get("name") for e in events]
    assert names.count("aten::item") == 3 and names.count("aten::_local_scalar_dense") == 3
    ops = op_stats(load_trace(path), (float("-inf"), float("inf")))
    assert ops["item_calls"] == 3
    assert ops["sync_calls"] == 0  # cudaMemcpyAsync is not a sync call by itself
    # each read has a cudaMemcpyAsync inside it on its thread: three reads from the device
    reads = [e for e in events if e.get("name") == "aten::_local_scalar_dense"]
    copies = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaMemcpyAsync"]
    assert all(any(c["tid"] == r["tid"] and r["ts"] <= c["ts"] <= r["ts"] + r["dur"] for c in copies) for r in reads)
    assert (ops["item_device_reads"], ops["item_host_reads"]) == (3, 0)


def test_syncs_of_a_real_trace_without_value_reads() -> None:
    """a100-2rank-rank0 (counted with json): no .item() or nonzero, and 25 runtime calls
    that wait by themselves (24 cudaEventSynchronize, 1 cudaDeviceSynchronize)."""
    import gzip
    import json

    from conftest import FIXTURES
    from pardiag.analyzers.rank_trace import op_stats
    from pardiag.analyzers.trace import load_trace

    path = FIXTURES / "gpu-traces" / "a100-2rank-rank0" / "nccl_data.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    names = [e.get("name") for e in events if e.get("cat") == "cuda_runtime"]
    assert (names.count("cudaEventSynchronize"), names.count("cudaDeviceSynchronize")) == (24, 1)
    assert not {"aten::_local_scalar_dense", "aten::nonzero"} & {e.get("name") for e in events}
    ops = op_stats(load_trace(path), (float("-inf"), float("inf")))
    assert ops["sync_calls"] == 25 and ops.get("item_device_reads", 0) == 0


def test_a_value_read_is_a_sync_only_when_it_reads_the_device(tmp_path: Path) -> None:
    """Four reads on thread 1: a CPU tensor's (nothing inside), a GPU tensor's (a copy and a
    stream sync inside: one read), a HIP read, and a nonzero that reads a step counter
    inside it (one outer read). A copy on another thread during the first read is not
    its; a stream sync outside any read is a sync of its own."""
    from pardiag.analyzers.rank_trace import op_stats
    from pardiag.analyzers.trace import load_trace

    def rt(name: str, ts: float, corr: int, tid: int = 1) -> dict[str, object]:
        return x(name, ts, 5, tid=tid, cat="cuda_runtime", correlation=corr)

    events = [
        x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        x("aten::_local_scalar_dense", 100, 20),  # host memory
        rt("cudaMemcpyAsync", 105, 1, tid=2),  # another thread's copy
        x("aten::_local_scalar_dense", 200, 50),
        rt("cudaMemcpyAsync", 210, 2), rt("cudaStreamSynchronize", 230, 3),
        x("aten::_local_scalar_dense", 300, 50),
        rt("hipMemcpyWithStream", 310, 4),
        x("aten::nonzero", 400, 100),
        x("aten::_local_scalar_dense", 420, 10),  # nested: the nonzero's own read
        rt("cudaMemcpyAsync", 450, 5),
        rt("cudaStreamSynchronize", 600, 6),
        x("aten::_local_scalar_dense", 1500, 20), rt("cudaMemcpyAsync", 1505, 7),  # after the window
    ]
    ops = op_stats(load_trace(write_trace(tmp_path / "r.json", events)), (0.0, 1000.0))
    assert (ops["item_calls"], ops["item_device_reads"], ops["item_host_reads"]) == (4, 3, 1)
    assert ops["sync_calls"] == 1


def test_collectives_are_named_by_what_the_program_asked_for(tmp_path: Path) -> None:
    """gloo runs `_reduce_scatter_base` as an all_reduce of the whole input on its own
    thread: the collective is a reduce_scatter (the program's `c10d::` call), the
    backend's op a detail. Each annotation takes the oldest call issued before it that it
    can carry out; one with no such call (issued before the window) keeps its own name."""
    from pardiag.analyzers.rank_trace import collective_calls

    gloo = {"Input Dims": [[1000]], "Input type": ["float"]}
    events = [
        x("ProfilerStep#1", 0, 10_000, cat="user_annotation"),
        x("gloo:all_reduce", 50, 100, tid=9, cat="user_annotation", **gloo),  # its call was before the window
        x("c10d::_reduce_scatter_base_", 1000, 20, **{"External id": 3}),
        x("c10d::allreduce_", 1100, 20, **{"External id": 4}),  # DDP's bucket, issued after the reduce-scatter
        x("c10d::_allgather_base_", 1200, 20, **{"External id": 5}),
        x("gloo:all_reduce", 1150, 300, tid=9, cat="user_annotation", **gloo),
        x("gloo:all_reduce", 1500, 200, tid=9, cat="user_annotation", **gloo),
        x("gloo:all_gather", 1800, 100, tid=10, cat="user_annotation", **gloo),
        x("c10d::barrier", 5000, 10, **{"External id": 6}),  # no annotation follows: names nothing
    ]
    trace = load_trace(write_trace(tmp_path / "r0.json", events))
    calls = collective_calls(trace, ())
    assert [(c.op, c.implementation, c.start_us, c.bytes) for c in calls] == [
        ("all_reduce", None, 50, 4000),
        ("reduce_scatter", "gloo:all_reduce", 1150, 4000),
        ("all_reduce", None, 1500, 4000),
        ("all_gather", None, 1800, 8000),  # the gathered size: the input shard x 2 ranks
    ]


def _call(op: str, nbytes: int, dur: float, group: int | None = 2, step: int = 1) -> "CollectiveCall":
    from pardiag.analyzers.rank_trace import CollectiveCall

    return CollectiveCall(step=step, op=op, process_group="?", group_size=group, bytes=nbytes, start_us=0.0,
                          dur_us=dur, on_gpu=True, timing="device")


def test_matching_does_not_depend_on_the_order_ranks_arrive_in() -> None:
    """Traces are parsed in a pool; the rank whose result came first used to give each
    matched collective its size. Sizes that differ between ranks at the same position
    mean different operations (except all-to-all, whose ranks send uneven shares)."""
    from pardiag.analyzers.collectives import match

    r0 = [_call("all_reduce", 4_000_000, 100.0), _call("all_to_all", 1_000_000, 50.0), _call("all_reduce", 2_000_000, 40.0)]
    r1 = [_call("all_reduce", 4_000_000, 300.0), _call("all_to_all", 3_000_000, 70.0), _call("all_reduce", 5_000_000, 40.0)]
    a, b = match({0: r0, 1: r1}), match({1: r1, 0: r0})
    assert a == b
    assert a.mismatched_size == 1  # the third: 2 MB on rank 0, 5 MB on rank 1
    by_op = {c.op: c for c in a.collectives}
    assert by_op["all_reduce"].calls == 1 and by_op["all_reduce"].bytes == 4_000_000
    assert by_op["all_reduce"].transfer_us == 100.0 and by_op["all_reduce"].wait_by_rank_us == {"0": 0.0, "1": 200.0}
    assert by_op["all_reduce"].algbw_gbps == 4_000_000 / 100.0 / 1e3  # 40 GB/s
    assert by_op["all_reduce"].busbw_gbps == 40.0 * 2 * (2 - 1) / 2
    assert by_op["all_to_all"].bytes == 2_000_000  # each rank's share, averaged


def test_no_bus_bandwidth_without_the_group_size() -> None:
    """Two ranks analysed of a 128-rank job: the group is not the ranks that were matched."""
    from pardiag.analyzers.collectives import match

    a = match({0: [_call("all_reduce", 4_000_000, 100.0, group=None)], 1: [_call("all_reduce", 4_000_000, 100.0, group=None)]})
    (c,) = a.collectives
    assert c.algbw_gbps == 40.0 and c.busbw_gbps is None and c.group_size is None and c.ranks_matched == 2


def test_collectives_are_clipped_to_the_profiled_window(tmp_path: Path) -> None:
    """Only the window's time is compared with the window: a call that began before the
    first profiled step counts from the step's start, one after the last step not at all."""
    gloo = {"Input Dims": [[1000]], "Input type": ["float"]}
    events = [
        x("ProfilerStep#5", 1000, 1000, cat="user_annotation"),
        x("aten::linear", 1100, 300),
        x("gloo:all_reduce", 900, 200, tid=9, cat="user_annotation", **gloo),
        x("gloo:all_reduce", 1500, 200, tid=9, cat="user_annotation", **gloo),
        x("gloo:all_reduce", 1950, 300, tid=9, cat="user_annotation", **gloo),
        x("gloo:all_reduce", 2500, 100, tid=9, cat="user_annotation", **gloo),
    ]
    r = analyze_rank_trace(load_trace(write_trace(tmp_path / "r0.json", events)))
    assert r.window_us == 1000
    assert [(c.start_us, c.dur_us, c.step) for c in r.collectives] == [(1000, 100, 5), (1500, 200, 5), (1950, 50, 5)]
    assert sum(c.dur_us for c in r.collectives) <= r.window_us


def test_a_collective_seen_on_one_rank_only_is_reported_not_timed() -> None:
    from pardiag.analyzers.collectives import match

    r0 = [_call("all_reduce", 4_000_000, 100.0), _call("all_reduce", 4_000_000, 900.0, step=2)]
    r1 = [_call("all_reduce", 4_000_000, 300.0)]  # its window ended before step 2
    a = match({0: r0, 1: r1})
    assert a.unmatched == 1 and a.collectives[0].calls == 1
    assert a.transfer_by_rank_us == {0: 100.0, 1: 100.0} and a.wait_by_rank_us == {0: 0.0, 1: 200.0}
    alone = match({0: r0})  # one rank analysed: nothing to match against, every call counts
    assert alone.unmatched == 0 and alone.collectives[0].calls == 2


def test_a_group_without_traffic_is_not_called_data_parallel() -> None:
    from pardiag.analyzers.groups import role_of

    assert role_of("", [0, 1, 2, 3], 4, {}) == "no traffic in the window"
    assert role_of("", [0, 1, 2, 3], 4, {"all_reduce": 3}) == "data-parallel"
    assert role_of("", [0, 1, 2, 3], 4, {"broadcast": 1}) == "all ranks"
    assert role_of("mesh_tp", [0, 1], 4, {}) == "tensor-parallel"  # named by PyTorch: its name says


def test_groups_are_not_said_to_be_idle_when_the_calls_name_no_group() -> None:
    """gloo's annotations name no process group: with two groups configured, the calls go
    to "?", and neither configured group can be said to have had no traffic."""
    from types import SimpleNamespace

    from pardiag.analyzers.collectives import match
    from pardiag.analyzers.groups import UNATTRIBUTED, process_groups

    calls = [_call("all_reduce", 4_000_000, 100.0)]
    matched = match({0: calls, 1: calls})
    pg = [{"name": "0", "desc": "default_pg", "size": 2, "ranks": [0, 1]},
          {"name": "1", "desc": "", "size": 2, "ranks": [0, 1]}]
    traces = {0: SimpleNamespace(pg_config=pg), 1: SimpleNamespace(pg_config=pg)}
    roles = {g.name: g.role for g in process_groups(traces, matched.collectives, 2)}
    assert roles == {"0": UNATTRIBUTED, "1": UNATTRIBUTED, "?": "data-parallel"}
    named = [dict(pg[1], desc="mesh_tp")]
    roles = {g.name: g.role for g in process_groups({0: SimpleNamespace(pg_config=named)}, matched.collectives, 2)}
    assert roles == {"1": "tensor-parallel", "?": "data-parallel"}  # PyTorch named it: its name says


def test_host_work_before_forward_is_not_forward(tmp_path: Path) -> None:
    # a rank that sleeps 300 us after fetching its batch, before its forward pass: one
    # operator (the batch's copy) at 1000-1020, nothing until the forward at 1320
    events = [
        x("ProfilerStep#1", 1000, 1000, cat="user_annotation"),
        x("aten::to", 1000, 20),
        x("aten::linear", 1320, 180),
        x("autograd::engine::evaluate_function: AddmmBackward0", 1500, 300),
        x("Optimizer.step#SGD.step", 1800, 200, cat="user_annotation"),
    ]
    r = analyze_rank_trace(load_trace(write_trace(tmp_path / "sleep.json", events, rank=0)))
    # the operators before the last backward op are forward: 20 + 180 us; the 300 us
    # sleep between them is host work, where it happened
    assert r.phases_us["forward"] == 200.0 and r.phases_us["host"] == 300.0
    assert r.host_gaps_us == {"between the operators of forward": 300.0}
    assert sum(r.phases_us.values()) == r.window_us


def test_host_gap_words() -> None:
    from pardiag.analyzers.rank_trace import _gap_words

    # layer order: dataloader, optimizer, backward, forward, operators after backward
    assert _gap_words(-1, 3) == "at the step's start, before forward"
    assert _gap_words(2, 1) == "between backward and the optimizer"
    assert _gap_words(1, -1) == "at the step's end, after the optimizer"
    assert _gap_words(3, 3) == "between the operators of forward"
    assert _gap_words(4, 4) == "among the operators after backward"
    assert _gap_words(-1, -1) == "with no torch operator in the step"


def test_every_phase_is_in_the_contract_and_labelled() -> None:
    # a phase the trace is cut into and the diff, the charts and the TUI know about
    from pardiag.analysis import PHASE_KEYS
    from pardiag.analyzers.rank_trace import PHASES
    from pardiag.style import PHASE_COLOURS, PHASE_LABELS

    assert set(PHASES) == set(PHASE_KEYS) == set(PHASE_LABELS) == set(PHASE_COLOURS)


def test_a_rank_waits_once_for_collectives_in_flight_together() -> None:
    """gloo runs DDP's buckets concurrently: two all-reduces 10 us apart on rank 1 both wait
    200 us for rank 0. Its wait is the 210 us it spent waiting, not 400."""
    from dataclasses import replace

    from pardiag.analyzers.collectives import match

    def at(c: "CollectiveCall", start: float) -> "CollectiveCall":
        return replace(c, start_us=start)

    r0 = [at(_call("all_reduce", 4_000_000, 100.0), 0.0), at(_call("all_reduce", 4_000_000, 100.0), 10.0)]
    r1 = [at(_call("all_reduce", 4_000_000, 300.0), 0.0), at(_call("all_reduce", 4_000_000, 300.0), 10.0)]
    a = match({0: r0, 1: r1})
    assert a.wait_by_rank_us == {0: 0.0, 1: 210.0}  # [0, 200] and [10, 210]
    assert a.transfer_by_rank_us == {0: 110.0, 1: 110.0}  # [0, 100] and [10, 110]; [200, 300] and [210, 310]
    (c,) = a.collectives
    assert c.wait_us == 400.0 / 2 and c.wait_by_rank_us == {"0": 0.0, "1": 400.0}  # per collective: each call's own
