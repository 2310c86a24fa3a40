"""The replay of the profiled window, on hand-built gloo traces whose numbers are worked
out by hand (tracegen.gloo_replay_rank): forward 1000 us, backward 1200 us, a 10 us
c10d::allreduce_ call, the worker's all-reduce (transfer 200 us once both ranks are in),
the loop waking 20 us after it, the optimizer 100 us."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardiag.analyzers.replay import (
    CollectivesAtTransfer, RemoveHostGaps, RemoveInputWait, ScaleCompute, Straggler, build_model, replay,
    what_if)
from pardiag.analyzers.trace import load_trace
from conftest import FIXTURES
from tracegen import (
    cpu_op, gloo_replay_rank, launch, launched_kernel, meta_events, shifted, slow_forward, step, two_steps,
    write_kineto_trace, write_trace)


def _model(tmp_path: Path, rank0: list[dict[str, object]], rank1: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    traces = {r: load_trace(write_trace(tmp_path / f"rank{r}.json", ev, rank=r)) for r, ev in ((0, rank0), (1, rank1))}
    return build_model(traces, hosts={0: "node", 1: "node"})


@pytest.fixture
def late_rank(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Rank 1 sleeps 300 us before its forward: it reaches the all-reduce at 2510 us,
    rank 0 at 2210 us; both finish it at 2710 (200 us of transfer), step 2830 us."""
    return _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710))


def test_replay_reproduces_the_measured_step(late_rank) -> None:  # type: ignore[no-untyped-def]
    r = replay(late_rank)
    assert r.measured_steps == {0: {1: 2830.0}, 1: {1: 2830.0}}
    assert r.replayed_steps[0][1] == pytest.approx(2830.0)
    assert r.replayed_steps[1][1] == pytest.approx(2830.0)
    assert r.error == pytest.approx(0.0, abs=1e-9)
    assert r.refusal() is None
    # the collective is one sync point: 200 us of transfer, the rest of rank 0's 500 us is waiting
    (key, members), = late_rank.groups.items()
    assert key == ("0:default_pg", 1, 0)
    assert [late_rank.nodes[i].dur for i in members] == [200.0, 200.0]


def test_removing_the_late_ranks_sleep_removes_the_others_wait(late_rank) -> None:  # type: ignore[no-untyped-def]
    # rank 1 reaches the all-reduce at 2200 + 10 (the call, then the worker's 10 us
    # pick-up) = 2210 like rank 0; done at 2410, awake at 2430, optimizer to 2530
    for edit in (RemoveHostGaps(ranks=(1,)), Straggler(1)):
        r = replay(late_rank, [edit])
        assert r.replayed_steps[0][1] == pytest.approx(2530.0)
        assert r.replayed_steps[1][1] == pytest.approx(2530.0)
    # rank 0's own 300 us of waiting is gone without editing rank 0
    res = what_if(late_rank, [RemoveHostGaps(ranks=(1,))])
    assert res.each[0].step_us == pytest.approx(2530.0)
    assert res.each[0].saving == pytest.approx(300 / 2830)


def test_a_straggler_keeps_the_phases_that_did_not_make_it_late(tmp_path: Path) -> None:
    # rank 1 sleeps 300 us and its backward takes 1250 us, 50 us more than rank 0's.
    # It calls the all-reduce at 300 + 2250 = 2550, arrives 2560, done 2760, wakes 2780,
    # steps 2880 us. Only the sleep is late (300 us >= 5% of 2880; 50 us is not): without
    # it rank 1 arrives at 2260, both finish at 2460, wake 2480, optimizer to 2580. Copying
    # rank 0's backward too would move the two ranks in lock-step (2530)
    rank1 = gloo_replay_rank(300, 2560, 2760)
    for e in rank1:
        if str(e["name"]).endswith("AddmmBackward0"):
            e["dur"] = 1250.0
        elif e["name"] == "c10d::allreduce_":
            e["ts"] = float(e["ts"]) + 50  # type: ignore[arg-type]
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2760), rank1)
    assert replay(m).replayed_steps[1][1] == pytest.approx(2880.0)
    r = replay(m, [Straggler(1)])
    assert r.replayed_steps[0][1] == pytest.approx(2580.0)
    assert r.replayed_steps[1][1] == pytest.approx(2580.0)
    # a cause that slows the whole rank (CPU contention) edits every phase: its backward
    # at rank 0's 1200 us too, the all-reduce called at 2200, arriving at 2210 with
    # rank 0's, done 2410 (rank 0's measured 200 us transfer), wake 2430, steps 2530
    r = replay(m, [Straggler(1, every_phase=True)])
    assert r.replayed_steps[0][1] == pytest.approx(2530.0)
    assert r.replayed_steps[1][1] == pytest.approx(2530.0)



def test_a_stragglers_slow_wake_up_after_the_collective_is_part_of_its_excess(tmp_path: Path) -> None:
    # rank 1 sleeps 300 us and its loop wakes 400 us after the all-reduce is done (at
    # 3110, not 2730): on a shared CPU the rank that burns the most loses the cores when
    # it wakes. Its waits are set to rank 0's (20 us) with its late phases: rank 1
    # arrives at 2210 with rank 0, done 2410, awake 2430, optimizer to 2530. Kept as
    # measured, it would wake at 2810, step 2910
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710, wake_us=3110))
    base = replay(m)
    assert base.replayed_steps[1][1] == pytest.approx(3210.0)
    assert base.error == pytest.approx(0.0, abs=1e-9)
    r = replay(m, [Straggler(1)])
    assert r.replayed_steps[1][1] == pytest.approx(2530.0)
    assert r.replayed_steps[0][1] == pytest.approx(2530.0)
    # a wake-up only 60 us over rank 0's (< 5% of the step) is set to it all the same:
    # awake at 2430 instead of 2490
    (tmp_path / "small").mkdir()
    m = _model(tmp_path / "small", gloo_replay_rank(0, 2210, 2710), gloo_replay_rank(300, 2510, 2710, wake_us=2790))
    assert replay(m, [Straggler(1)]).replayed_steps[1][1] == pytest.approx(2530.0)


def test_a_straggler_that_began_the_window_late_begins_it_with_its_peers(tmp_path: Path) -> None:
    # rank 1 began its profiled step 500 us after rank 0 (its slowness in the step
    # before) and did the same work: forward at 500, the all-reduce from 2710 to 2910
    # (rank 0 waits in it from 2210), awake 2930, optimizer to 3030: rank 0's step 3030
    # us. Begun with rank 0 at 0 it arrives at 2210, both done at 2410, awake 2430,
    # optimizer to 2530
    (tmp_path / "a").mkdir()
    m = _model(tmp_path / "a", gloo_replay_rank(0, 2210, 2910), shifted(gloo_replay_rank(0, 2210, 2410), 500.0))
    base = replay(m)
    assert base.replayed_steps[0][1] == pytest.approx(3030.0)
    assert base.replayed_steps[1][1] == pytest.approx(2530.0)
    r = replay(m, [Straggler(1)])
    assert r.replayed_steps[0][1] == pytest.approx(2530.0)
    assert r.replayed_steps[1][1] == pytest.approx(2530.0)
    # the peer that began late is not moved: only the edited straggler is
    m = _model(tmp_path / "a", shifted(gloo_replay_rank(0, 2210, 2410), 500.0), gloo_replay_rank(0, 2210, 2910))
    assert replay(m, [Straggler(0)]).replayed_steps[1][1] == pytest.approx(2530.0)
    assert replay(m, [Straggler(1)]).replayed_steps[1][1] == pytest.approx(3030.0)


def test_the_run_queue_time_of_a_step_comes_off_the_phase_it_lengthened(tmp_path: Path) -> None:
    # two steps of 2530 us; in step 2 rank 0's forward took 1400 us instead of 1000: it
    # arrived at 2530 + 2610 = 5140, rank 1 at 4740, done 5340, step 2930 on both. Rank
    # 0's thread waited 400 us for a core in that step (steps.jsonl runq_us, beyond its
    # usual): its forward is cut to its shortest in the window (1000 us), and the step
    # replays at 2530. 250 us on the run queue cut it by 250 only (1150: step 2680)
    from pardiag.analyzers.replay import without_run_queue

    one = gloo_replay_rank(0, 2210, 2410)
    rank0 = two_steps(one, slow_forward(gloo_replay_rank(0, 2210, 2410), 400.0), 2530.0)
    rank1 = two_steps(one, gloo_replay_rank(0, 2210, 2810, wake_us=2830), 2530.0)
    m = _model(tmp_path, rank0, rank1)
    base = replay(m)
    assert base.replayed_steps[0] == pytest.approx({1: 2530.0, 2: 2930.0})
    assert base.error == pytest.approx(0.0, abs=1e-9)
    quiet = without_run_queue(m, {0: {2: 400.0}})
    assert replay(quiet).replayed_steps[0] == pytest.approx({1: 2530.0, 2: 2530.0})
    assert replay(without_run_queue(m, {0: {2: 250.0}})).replayed_steps[0][2] == pytest.approx(2680.0)
    # the model itself is untouched; a step with no excess, or a step not in the window, changes nothing
    assert replay(m).replayed_steps[0][2] == pytest.approx(2930.0)
    assert without_run_queue(m, {0: {1: 400.0}, 1: {7: 300.0}}) is m

def test_collectives_at_transfer_time_do_not_fix_a_late_rank(late_rank) -> None:  # type: ignore[no-untyped-def]
    # nobody waits: rank 0 is done at 2210 + 200 + 20 + 100 = 2530, but rank 1 still
    # arrives at 2510 and ends at 2830: the job moves at rank 1's pace
    r = replay(late_rank, [CollectivesAtTransfer()])
    assert r.replayed_steps[0][1] == pytest.approx(2530.0)
    assert r.replayed_steps[1][1] == pytest.approx(2830.0)
    assert r.replayed_step_us == pytest.approx(2830.0)


def test_compute_scaled_and_edits_replayed_together(late_rank) -> None:  # type: ignore[no-untyped-def]
    # at half the compute: forward 500, backward 600, the call 5; rank 1 arrives at
    # 300 + 1100 + 10 (pick-up) = 1410, done 1610, awake 1630, optimizer 50 -> 1680
    assert replay(late_rank, [ScaleCompute(0.5)]).replayed_step_us == pytest.approx(1680.0)
    # with the sleep gone as well: both arrive at 1110, done 1310, awake 1330 -> 1380
    res = what_if(late_rank, [ScaleCompute(0.5), RemoveHostGaps()])
    assert res.combined.step_us == pytest.approx(1380.0)
    assert [w.step_us for w in res.each] == pytest.approx([1680.0, 2530.0])
    # one replay, not a product of the two savings
    prod = 1 - (1 - res.each[0].saving) * (1 - res.each[1].saving)
    assert res.combined.saving == pytest.approx(1 - 1380 / 2830)
    assert abs(res.combined.saving - prod) > 0.01


def test_critical_path_goes_through_the_late_rank(late_rank) -> None:  # type: ignore[no-untyped-def]
    cp = replay(late_rank).critical_paths[1]
    # rank 1: sleep 300, forward 1000, backward 1200, the all-reduce from the end of
    # backward (10 us pick-up + 200 us transfer), the 20 us wake-up, optimizer 100
    assert cp.by_rank_us == pytest.approx({1: 2830.0})
    assert cp.by_phase_us == pytest.approx({"host": 300.0, "forward": 1000.0, "backward": 1200.0,
                                            "comm": 210.0, "wait": 20.0, "optimizer": 100.0})
    assert (cp.top_rank, cp.top_phase, cp.top_collective) == (1, "backward", "all_reduce 0:default_pg")
    # with rank 1 fixed, both arrive together
    cp = replay(late_rank, [RemoveHostGaps()]).critical_paths[1]
    assert "host" not in cp.by_phase_us and sum(cp.by_phase_us.values()) == pytest.approx(2530.0)


def test_input_wait_cut_to_the_fastest_fetch(tmp_path: Path) -> None:
    # both ranks fetch twice (500 us and 100 us, each followed by a 10 us stack) before
    # forward: they arrive at 620 + 2200 + 10 = 2830, done 3030, awake 3050, step 3150;
    # with every fetch as fast as the fastest (100 us), 400 us less
    dl = (500.0, 100.0)
    m = _model(tmp_path, gloo_replay_rank(0, 2830, 3030, dl), gloo_replay_rank(0, 2830, 3030, dl))
    assert replay(m).replayed_step_us == pytest.approx(3150.0)
    assert replay(m, [RemoveInputWait()]).replayed_step_us == pytest.approx(2750.0)


def test_refused_when_the_replay_misses_the_measured_step(tmp_path: Path) -> None:
    # rank 0's all-reduce ends at 2410, before rank 1 arrives at 3510 (it slept 1300 us):
    # on one clock that cannot be one collective. Replayed, rank 0 waits for rank 1:
    # awake at 3510 (its 20 us wake-up cannot come before the collective completes), step
    # 3610 against 2530 measured; rank 1 (transfer 0, awake 220 us later) as measured, 3830
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2410), gloo_replay_rank(1300, 3510, 3710))
    r = replay(m)
    assert r.rank_errors() == {0: pytest.approx((2530.0, 3610.0, 1080 / 2530)),
                               1: pytest.approx((3830.0, 3830.0, 0.0))}
    assert r.error == pytest.approx(1080 / 2530)
    why = r.refusal()
    assert why is not None and "rank 0: 3.61 ms replayed, 2.53 ms measured, 42.7% off" in why
    assert what_if(m, [RemoveHostGaps()]).refused == why


def test_a_wait_that_the_workers_annotation_outlasts(tmp_path: Path) -> None:
    # rank 0's loop is released at 2730 (the collective completed at 2710, when rank 1's
    # ended), but rank 0's worker closes its annotation only at 3700 (descheduled): the gap
    # before 2730 is still a wait for the collective, not host work
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 3700, wake_us=2730),
               gloo_replay_rank(300, 2510, 2710))
    (wait0,) = [n for n in m.nodes if n.rank == 0 and n.kind == "wait"]
    assert (wait0.measured_start, wait0.measured_end, wait0.dur) == (2210.0, 2730.0, 20.0)
    (k,) = m.groups
    assert [m.nodes[i].transfer for i in m.groups[k]] == [200.0, 200.0]
    r = replay(m)
    assert r.error == pytest.approx(0.0, abs=1e-9)
    # rank 1's sleep removed: both arrive at 2210, released at 2410 + 20, step 2530
    assert replay(m, [RemoveHostGaps(ranks=(1,))]).replayed_steps == {0: {1: pytest.approx(2530.0)},
                                                                      1: {1: pytest.approx(2530.0)}}


def test_ranks_of_unknown_hosts_are_aligned_on_their_collectives(tmp_path: Path) -> None:
    # the same traces as above without hosts: rank 1's clock is taken as 800 us ahead
    # (its all-reduce ends at 3510, rank 0's at 2710), which explains the whole difference
    traces = {r: load_trace(write_trace(tmp_path / f"rank{r}.json", ev, rank=r)) for r, ev in
              ((0, gloo_replay_rank(0, 2210, 2710)), (1, gloo_replay_rank(300, 2510, 3510)))}
    r = replay(build_model(traces))
    assert r.replayed_step_us == pytest.approx(3630.0)
    assert r.error == pytest.approx(0.0, abs=1e-9)


def test_a_collective_seen_on_one_rank_keeps_its_measured_length(tmp_path: Path) -> None:
    # rank 1's trace has no all-reduce: rank 0's is a local op of its measured 500 us
    r1 = [e for e in gloo_replay_rank(300, 2510, 2710) if e["name"] != "gloo:all_reduce"]
    m = _model(tmp_path, gloo_replay_rank(0, 2210, 2710), r1)
    assert m.groups == {}
    r = replay(m)
    assert r.replayed_steps[0][1] == pytest.approx(2830.0)
    assert r.error == pytest.approx(0.0, abs=1e-9)


def test_gpu_kernels_wait_for_their_launch_and_syncs_for_kernels(tmp_path: Path) -> None:
    # the host launches a 500 us matmul at 50 us (it starts 10 us later), waits for it in
    # cudaStreamSynchronize from 100 us (awake 10 us after it ends at 560), then runs a
    # 100 us operator: step 670 us. At half the kernel time: done at 310, awake 320, 420.
    events = [*meta_events(), step(1, 0, 670), cpu_op("aten::mm", 0, 100), launch(1, 50),
              launched_kernel("volta_sgemm_128x64_nn", 60, 500, corr=1),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
               "ts": 100, "dur": 470, "args": {"cbid": 131, "correlation": 2}},
              cpu_op("aten::add_", 570, 100)]
    m = build_model({0: load_trace(write_kineto_trace(tmp_path / "gpu.json", events))})
    (k,) = [n for n in m.nodes if n.kind == "kernel"]
    assert (k.dur, k.delay, [m.nodes[d].measured_end for d in k.deps]) == (500.0, 10.0, [50.0])
    assert replay(m).replayed_steps == {0: {1: pytest.approx(670.0)}}
    # on a GPU the compute is the kernels: the host's operators keep their time
    assert replay(m, [ScaleCompute(0.5)]).replayed_steps == {0: {1: pytest.approx(420.0)}}


def test_real_gpu_traces_replay(tmp_path: Path) -> None:
    # one rank of a 2-GPU job, and two ranks of a 128-rank job (their collectives' other
    # members are not here: each keeps its measured length, no synchronisation between them)
    for name, files in (("a100-2rank-rank0", ["nccl_data.json.gz"]),
                        ("sampled-128rank-job", ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"])):
        traces = {r: load_trace(FIXTURES / "gpu-traces" / name / f) for r, f in enumerate(files)}
        m = build_model(traces)
        kernels = [n for n in m.nodes if n.kind == "kernel"]
        assert kernels and sum(bool(n.deps) for n in kernels) / len(kernels) > 0.6
        assert m.groups == {}
        r = replay(m)
        assert r.error < 1e-6 and r.refusal() is None


def test_load_run_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    from pardiag.analyzers.replay import load_run
    from pardiag.errors import UserError

    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    with pytest.raises(UserError, match="truncated"):
        load_run(str(tmp_path / "rank0.json"))
    with pytest.raises(UserError, match="no such file"):
        load_run(str(tmp_path / "nothing"))


def _nccl_rank(shift: float) -> list[dict[str, object]]:
    """A GPU rank's 640 us step: `shift` us of host gap, then (times + `shift`) a matmul
    launched at 50 (kernel 60-260), an all-reduce kernel launched at 120 on the comm
    stream from 130; a stream sync from 140 + `shift` released at 540, 10 us after the
    all-reduce ends at 530; a 100 us operator."""
    nccl = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
            "ts": 130 + shift, "dur": 400 - shift,
            "args": {"device": 0, "stream": 20, "correlation": 2, "Collective name": "allreduce",
                     "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float", "Group size": 2,
                     "Process Group Name": "0"}}
    return [*meta_events(), step(1, 0, 640), cpu_op("aten::mm", shift, 100), launch(1, 50 + shift),
            launched_kernel("volta_sgemm_128x64_nn", 60 + shift, 200, corr=1),
            cpu_op("c10d::allreduce_", 100 + shift, 40), launch(2, 120 + shift), nccl,
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
             "ts": 140 + shift, "dur": 400 - shift, "args": {"cbid": 131, "correlation": 3}},
            cpu_op("aten::add_", 540, 100)]


def test_nccl_kernels_are_one_sync_point_across_ranks(tmp_path: Path) -> None:
    # rank 1 starts 200 us late: its all-reduce kernel starts at 330, rank 0's at 130 waits
    # for it; both end at 530 (transfer 200), both syncs release at 540, step 640
    traces = {r: load_trace(write_kineto_trace(tmp_path / f"g{r}.json", _nccl_rank(200.0 * r), rank=r))
              for r in (0, 1)}
    m = build_model(traces, hosts={0: "node", 1: "node"})
    (k,) = m.groups
    assert [m.nodes[i].transfer for i in m.groups[k]] == [200.0, 200.0]
    assert all(m.nodes[i].deps for i in m.groups[k])  # after their launches
    r = replay(m)
    assert r.replayed_steps == {0: {1: pytest.approx(640.0)}, 1: {1: pytest.approx(640.0)}}
    # rank 1 on time: both all-reduces from 130 to 330, released at 340, step 440 on both
    fixed = replay(m, [RemoveHostGaps(ranks=(1,))])
    assert fixed.replayed_steps == {0: {1: pytest.approx(440.0)}, 1: {1: pytest.approx(440.0)}}


def test_a_model_past_its_budget_of_operations_is_refused_early(tmp_path: Path) -> None:
    from pardiag.analyzers.replay import MAX_NODES, TooLarge, model_of

    paths = {r: write_trace(tmp_path / f"rank{r}.json", ev, rank=r) for r, ev in
             ((0, gloo_replay_rank(0, 2210, 2710)), (1, gloo_replay_rank(300, 2510, 2710)))}
    per_rank = len(build_model({0: load_trace(paths[0])}).nodes)
    assert per_rank > 2
    # rank 0 alone, of 1,000 ranks: per_rank * 1000 operations projected, over a budget of 1,000
    got: list[int] = []

    def stream():  # type: ignore[no-untyped-def]
        for r in range(1000):
            got.append(r)
            yield r, load_trace(paths[r % 2])

    with pytest.raises(TooLarge, match=f"about {per_rank * 1000:,} operations .{per_rank} per rank., more than its "
                                       "budget of 1,000"):
        build_model(stream(), ranks=1000, max_nodes=1000)
    assert got == [0]  # refused after the first rank: the rest was never read
    # within the budget, the same model as without one
    found = [(r, p, True) for r, p in paths.items()]
    whole = build_model({r: load_trace(p) for r, p in paths.items()}, hosts={0: "node", 1: "node"})
    assert len(model_of(found).nodes) == len(model_of(found, max_nodes=None).nodes) == len(whole.nodes) > per_rank
    assert MAX_NODES >= 3_200_000  # the 1,024-rank benchmark's model (benchmarks/scale.py) fits


def test_an_analysis_past_the_replays_budget_says_so_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from pardiag.analyzers import replay as rp
    from pardiag.analyzers.pipeline import analyze_path

    run = Path(__file__).parent.parent / "data" / "cpu-2rank"
    assert not [n for n in analyze_path(run, jobs=1).notices if "operations" in n.message]
    monkeypatch.setattr(rp, "MAX_NODES", 10)
    a = analyze_path(run, jobs=1)
    (note,) = [n for n in a.notices if "operations" in n.message]
    assert note.level == "info" and "more than its budget of 10 " in note.message and "share-based" in note.message
    assert len(a.ranks) == 2 and a.job_summary.step_p50_us


def test_many_ranks_read_by_worker_processes_give_the_model_read_in_order(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pardiag.analyzers import trace_parallel
    from pardiag.analyzers.replay import model_of

    # 6 ranks (3 pairs of the late-rank traces): more than 2 per core, so forked workers
    # read them, a few ahead, and the model is built as each arrives, in rank order
    found = [(r, write_trace(tmp_path / f"rank{r}.json", gloo_replay_rank(300 * (r % 2), 2210 + 300 * (r % 2), 2710),
                             rank=r), True) for r in range(6)]
    from pardiag.analyzers import trace as trace_module

    read_here: list[object] = []  # traces this process read itself (a forked worker's reads stay there)
    real = trace_module.load_trace
    monkeypatch.setattr(trace_module, "load_trace", lambda p, **kw: (read_here.append(p), real(p, **kw))[1])
    monkeypatch.setattr(trace_parallel, "cores", lambda: 2)
    forked = model_of(found)
    assert read_here == []
    monkeypatch.setattr(trace_parallel, "can_fork", lambda: False)
    serial = model_of(found)
    assert len(read_here) == 6
    assert forked.nodes == serial.nodes and forked.streams == serial.streams and forked.origin == serial.origin
    assert sorted({n.rank for n in forked.nodes}) == list(range(6))
