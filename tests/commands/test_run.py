"""`pardiag run` end to end: real torchrun jobs (gloo on the CPU), real traces."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, free_port, pardiag_cmd, read_json, read_steps, run_pardiag, torchrun

pytestmark = pytest.mark.slow

LAYER_BYTES = (256 * 256 + 256) * 4  # one Linear(256, 256) in float32


def trace_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    names = {e.get("name", "") for e in doc["traceEvents"]}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("runs") / "ddp"
    res = run_pardiag(
        "run", "--out", str(out), "--profile-steps", "3,1,2", "--",
        *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "9"),
    )
    return res, out


def test_two_ranks_exit_code_and_summary(ddp_run) -> None:
    res, out = ddp_run
    assert res.returncode == 0, res.stderr[-3000:]
    said = " ".join(res.stderr.split())  # the summary, unwrapped
    assert f"run directory: {out} world size: 2" in said
    assert "collectors: steps ok, meta ok, profiler ok" in said
    assert "where each rank's profiled time went" in said and "all_reduce" in said
    assert f"report: {out}/report.html" in said and (out / "report.html").is_file()
    assert f"next: pardiag report {out}" in said


def test_two_ranks_trace_per_rank_with_global_step_numbers(ddp_run) -> None:
    _res, out = ddp_run
    for rank in (0, 1):
        # window 3,1,2: steps 0-2 skipped, step 3 warm-up, steps 4 and 5 recorded
        assert trace_steps(out / "ranks" / str(rank) / "trace.json.gz") == [4, 5]
        with gzip.open(out / "ranks" / str(rank) / "trace.json.gz", "rt") as f:
            doc = json.load(f)
        assert doc["distributedInfo"]["rank"] == rank
        assert doc["distributedInfo"]["world_size"] == 2
        names = {e.get("name", "") for e in doc["traceEvents"]}
        assert any(n.startswith("gloo:all_reduce") for n in names)


def test_two_ranks_steps_jsonl_has_every_step(ddp_run) -> None:
    _res, out = ddp_run
    for rank in (0, 1):
        steps = read_steps(out / "ranks" / str(rank) / "steps.jsonl")
        assert [s["step"] for s in steps] == list(range(9))
        assert [s.get("profiler") for s in steps] == [None, None, None, "warmup", "active", "active", None, None, None]
        assert all(s["backwards"] == 1 for s in steps)
        assert all(s["dur_us"] > 0 and s["bwd_us"] > 0 and s["data_us"] > 0 for s in steps)
        # the step boundaries are wall-clock times that increase
        ends = [s["t_end_ns"] for s in steps]
        assert ends == sorted(ends)


def test_two_ranks_meta_has_real_ddp_buckets(ddp_run) -> None:
    _res, out = ddp_run
    meta = read_json(out / "ranks" / "0" / "meta.json")
    assert meta["rank"] == 0 and meta["world_size"] == 2 and meta["backend"] == "gloo"
    (ddp,) = meta["ddp"]
    assert ddp["bucket_cap_mb"] == 1.0
    assert ddp["find_unused_parameters"] is False
    assert ddp["gradient_as_bucket_view"] is False
    assert ddp["static_graph"] is False
    # buckets close once they reach 1 MiB: 4 layers, then the remaining 2
    assert ddp["bucket_sizes_bytes"] == [4 * LAYER_BYTES, 2 * LAYER_BYTES]
    assert ddp["bucket_count"] == 2
    assert meta["parameters"]["local_bytes"] == 6 * LAYER_BYTES
    assert meta["parameters"]["tensors"] == 12
    (loader,) = meta["dataloaders"]
    assert loader["batch_size"] == 16 and loader["num_workers"] == 0 and loader["pin_memory"] is False
    assert meta["grad_accumulation"]["backwards_per_step"] == 1.0
    assert meta["grad_accumulation"]["no_sync_calls"] == 0
    assert meta["optimizers"][0]["class"] == "SGD"
    assert meta["profiler"]["status"] == "ok" and meta["profiler"]["steps_recorded"] == [4, 5]
    assert meta["exit"]["status"] == "exited"
    assert meta["device"]["type"] == "cpu"
    assert meta["errors"] == []


def test_two_ranks_manifest_complete(ddp_run) -> None:
    _res, out = ddp_run
    m = read_json(out / "manifest.json")
    assert m["format"] == "pardiag.run" and m["format_version"] == 1
    assert m["complete"] is True and m["exit_code"] == 0
    assert m["world_size"] == 2 and m["launcher"] == "torchrun"
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    assert all(r["steps"] == 9 and r["trace"] == "trace.json.gz" for r in m["ranks"])
    col = m["collectors"]
    assert col["steps"]["status"] == "ok" and col["meta"]["status"] == "ok"
    assert col["profiler"]["status"] == "ok" and col["profiler"]["ranks_with_trace"] == [0, 1]
    assert col["nccl"]["status"] == "skipped" and "gloo" in col["nccl"]["reason"]
    assert col["telemetry"]["status"] in ("skipped", "ok")
    assert m["failed_ranks"] == [] and col["missing_ranks"] == []
    assert m["nccl_env"]["set_by_pardiag"]["NCCL_DEBUG"] == "INFO"
    assert m["nccl_env"]["set_by_pardiag"]["NCCL_DEBUG_FILE"].endswith("nccl/%h.%p.log")
    logs = list((out / "logs").glob("*.stdout.log"))
    assert len(logs) == 1 and "rank 0 done after 9 steps" in logs[0].read_text()


def test_profiled_ranks_limited_by_ranks_option(tmp_path: Path) -> None:
    out = tmp_path / "r"
    res = run_pardiag("run", "-q", "--out", str(out), "--ranks", "1", "--profile-steps", "1,1,1", "--",
                      *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "4"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (out / "ranks/0/trace.json.gz").exists()
    assert trace_steps(out / "ranks/1/trace.json.gz") == [2]
    assert len(read_steps(out / "ranks/0/steps.jsonl")) == 4  # every rank records steps
    meta0 = read_json(out / "ranks/0/meta.json")
    assert meta0["profiler"]["status"] == "skipped" and "--ranks" in meta0["profiler"]["reason"]
    assert read_json(out / "manifest.json")["collectors"]["profiler"]["status"] == "ok"


def test_crash_on_rank_1_keeps_everything(tmp_path: Path) -> None:
    out = tmp_path / "crash"
    args = ("--steps", "20", "--crash-rank", "1", "--crash-step", "7")
    plain = subprocess.run(torchrun(2, SCRIPTS / "tiny_ddp.py", *args), capture_output=True, text=True, timeout=240)
    res = run_pardiag("run", "--out", str(out), "--profile-steps", "2,1,2", "--",
                      *torchrun(2, SCRIPTS / "tiny_ddp.py", *args))
    assert plain.returncode != 0
    assert res.returncode == plain.returncode
    m = read_json(out / "manifest.json")
    assert m["exit_code"] == plain.returncode
    failed = {f["rank"]: f for f in m["failed_ranks"]}
    assert 1 in failed and "planted crash on rank 1 at step 7" in failed[1]["reason"]
    assert failed[1]["step"] == 7
    # rank 1 finished steps 0..6 before it crashed, and its window (steps 3-4) is complete
    assert [s["step"] for s in read_steps(out / "ranks/1/steps.jsonl")] == list(range(7))
    assert trace_steps(out / "ranks/1/trace.json.gz") == [3, 4]
    assert "rank 1 failed" in res.stderr


def test_single_process_plain_python(tmp_path: Path) -> None:
    out = tmp_path / "single"
    res = run_pardiag("run", "-q", "--out", str(out), "--profile-steps", "2,1,2", "--",
                      sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "6")
    assert res.returncode == 0, res.stderr[-2000:]
    meta = read_json(out / "ranks/0/meta.json")
    assert meta["world_size"] == 1 and meta["rank_source"] == "default"
    assert meta["ddp"] == []
    assert trace_steps(out / "ranks/0/trace.json.gz") == [3, 4]
    assert read_json(out / "manifest.json")["launcher"] == "python"


def test_loop_without_optimizer_uses_pardiag_step(tmp_path: Path) -> None:
    out = tmp_path / "explicit"
    res = run_pardiag("run", "-q", "--out", str(out), "--profile-steps", "1,1,1", "--",
                      sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "5", "--no-optimizer")
    assert res.returncode == 0, res.stderr[-2000:]
    steps = read_steps(out / "ranks/0/steps.jsonl")
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    assert all(s.get("source") == "explicit" for s in steps)
    assert read_json(out / "ranks/0/meta.json")["step_source"] == "explicit"
    assert trace_steps(out / "ranks/0/trace.json.gz") == [2]


def test_gradient_accumulation_is_seen(tmp_path: Path) -> None:
    out = tmp_path / "accum"
    res = run_pardiag("run", "-q", "--out", str(out), "--no-profile", "--",
                      *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "4", "--accum", "3"))
    assert res.returncode == 0, res.stderr[-2000:]
    meta = read_json(out / "ranks/0/meta.json")
    assert meta["grad_accumulation"]["backwards_per_step"] == 3.0
    assert meta["grad_accumulation"]["no_sync_calls"] == 8  # 2 of every 3 micro-batches, 4 steps
    assert all(s["backwards"] == 3 for s in read_steps(out / "ranks/0/steps.jsonl"))
    assert meta["profiler"]["status"] == "skipped"
    col = read_json(out / "manifest.json")["collectors"]["profiler"]
    assert col["status"] == "skipped" and col["reason"] == "profiling is off"


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = tmp_path / "usersite"
    user.mkdir()
    marker = tmp_path / "marker.txt"
    (user / "sitecustomize.py").write_text(
        "import os, sys\nopen(os.environ['MARKER'], 'a').write(' '.join(sys.orig_argv[1:2]) + '\\n')\n"
    )
    out = tmp_path / "site"
    res = run_pardiag("run", "-q", "--out", str(out), "--profile-steps", "1,1,1", "--",
                      sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "3",
                      env={"PYTHONPATH": str(user), "MARKER": str(marker)})
    assert res.returncode == 0, res.stderr[-2000:]
    # the pardiag launcher and the training process each ran it once
    ran = marker.read_text().splitlines()
    assert sorted(ran) == sorted(["-m", str(SCRIPTS / "tiny_ddp.py")])
    assert len(read_steps(out / "ranks/0/steps.jsonl")) == 3
    pythonpath = read_json(out / "manifest.json")["env"]["PYTHONPATH"].split(os.pathsep)
    assert pythonpath[-1] == str(user) and len(pythonpath) == 2


def test_exit_code_of_the_command_is_returned(tmp_path: Path) -> None:
    res = run_pardiag("run", "-q", "--out", str(tmp_path / "x"), "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert res.returncode == 7
    m = read_json(tmp_path / "x" / "manifest.json")
    assert m["exit_code"] == 7 and m["collectors"]["steps"]["status"] == "skipped"


def test_command_not_found(tmp_path: Path) -> None:
    res = run_pardiag("run", "-q", "--out", str(tmp_path / "x"), "--", "no-such-command-xyz")
    assert res.returncode == 127
    assert "command not found: no-such-command-xyz" in res.stderr
    assert "Traceback" not in res.stderr
    assert read_json(tmp_path / "x" / "manifest.json")["launchers"][0]["error"].startswith("command not found")


def test_nothing_to_run_is_a_usage_error() -> None:
    res = run_pardiag("run")
    assert res.returncode == 2 and "nothing to run" in res.stderr and "Traceback" not in res.stderr


def test_sigint_is_forwarded_and_data_kept(tmp_path: Path) -> None:
    out = tmp_path / "int"
    env = dict(os.environ)
    proc = subprocess.Popen(
        pardiag_cmd("run", "-q", "--out", str(out), "--profile-steps", "1,1,1", "--",
                    sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "100000", "--sleep-ms", "20"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a shell that started the tests in the background left SIGINT ignored, and the job
        # would inherit that (as it would without pardiag): the test wants it as a terminal has it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    steps = out / "ranks/0/steps.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not steps.exists() or len(steps.read_text().splitlines()) < 5):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _o, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT  # python died of KeyboardInterrupt
    m = read_json(out / "manifest.json")
    assert m["launchers"][0]["signals_received"] == ["SIGINT"]
    assert m["exit_code"] == 130
    assert len(read_steps(steps)) >= 5
    meta = read_json(out / "ranks/0/meta.json")
    assert meta["exit"]["status"] == "exception" and meta["exit"]["type"] == "KeyboardInterrupt"
    assert (out / "ranks/0/trace.json.gz").exists()


def test_two_nodes_share_one_out(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    port = str(free_port())

    def node(i: int) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
               str(SCRIPTS / "tiny_ddp.py"), "--steps", "6"]
        return subprocess.Popen(pardiag_cmd("run", "-q", "--out", str(out), "--profile-steps", "2,1,1", "--", *cmd),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    a = node(0)
    time.sleep(0.5)
    b = node(1)
    for p in (a, b):
        _o, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    m = read_json(out / "manifest.json")
    assert len(m["launchers"]) == 2 and all(l["status"] == "ended" for l in m["launchers"])
    assert m["complete"] is True and m["world_size"] == 2
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    assert all(r["trace"] == "trace.json.gz" and r["steps"] == 6 for r in m["ranks"])
    assert len(list((out / "logs").glob("*.stdout.log"))) == 2
    assert not (tmp_path / "shared-2").exists()


def test_second_run_into_same_out_does_not_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "same"
    cmd = [sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "2"]
    assert run_pardiag("run", "-q", "--out", str(out), "--no-profile", "--", *cmd).returncode == 0
    res = run_pardiag("run", "--out", str(out), "--no-profile", "--", *cmd)
    assert res.returncode == 0
    assert (tmp_path / "same-2" / "manifest.json").exists()
    assert "recording into" in res.stderr and "same-2" in res.stderr
    assert len(read_json(out / "manifest.json")["launchers"]) == 1


@pytest.mark.parametrize(
    "env, rank, world",
    [
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, 3, 4),  # mpirun (Open MPI)
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, 2, 3),  # mpirun (MPICH / Intel MPI)
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, 5, 8),  # srun
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, 1, 2),  # horovodrun
        ({"RANK": "6", "WORLD_SIZE": "7", "SLURM_PROCID": "0"}, 6, 7),  # torchrun under srun
    ],
)
def test_rank_from_launcher_variables(env: dict[str, str], rank: int, world: int) -> None:
    from pardiag.collectors.runtime import resolve_rank

    info = resolve_rank(env)
    assert (info["rank"], info["world_size"]) == (rank, world)


def test_srun_style_rank_and_shared_default_out(tmp_path: Path) -> None:
    """Under srun every task runs `pardiag run` itself; the rank comes from SLURM_PROCID
    and the default run directory is named after the job, so every node finds it."""
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    res = run_pardiag("run", "-q", "--profile-steps", "1,1,1", "--",
                      sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "3", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path / "pardiag-runs" / "slurm-4242.0"
    meta = read_json(out / "ranks/1/meta.json")
    assert meta["rank"] == 1 and meta["world_size"] == 2 and meta["rank_source"] == "SLURM_PROCID"
    m = read_json(out / "manifest.json")
    assert m["job_key"] == "slurm-4242.0" and m["collectors"]["missing_ranks"] == [0]
    assert m["collectors"]["steps"]["status"] == "partial"


def test_window_cut_short_leaves_a_partial_trace(tmp_path: Path) -> None:
    out = tmp_path / "short"
    # the window wants steps 4-8 recorded, the script stops after step 5
    res = run_pardiag("run", "-q", "--out", str(out), "--profile-steps", "3,1,5", "--",
                      sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "6")
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (out / "ranks/0/trace.json.gz").exists()
    # the trace ends inside step 6 (the script's tail after its loop)...
    assert trace_steps(out / "ranks/0/trace.partial.json.gz") == [4, 5, 6]
    prof = read_json(out / "ranks/0/meta.json")["profiler"]
    assert prof["status"] == "partial" and prof["complete"] is False and prof["steps_recorded"] == [4, 5]
    m = read_json(out / "manifest.json")
    assert m["ranks"][0]["trace"] == "trace.partial.json.gz" and m["ranks"][0]["trace_complete"] is False
    assert m["collectors"]["profiler"]["status"] == "partial"
    # ...so the analysis uses the finished steps only, and says the window was cut short
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    assert doc["ranks"][0]["steps_profiled"] == 2 and doc["ranks"][0]["trace_complete"] is False
    assert any("cut short" in n["message"] for n in doc["notices"])


def test_merge_joins_per_node_directories(tmp_path: Path) -> None:
    """Nodes without a shared filesystem each write their own directory; merge joins them."""
    for rank in (0, 1):
        env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2"}
        res = run_pardiag("run", "-q", "--out", str(tmp_path / f"node{rank}"), "--profile-steps", "1,1,1", "--",
                          sys.executable, str(SCRIPTS / "tiny_ddp.py"), "--steps", "3", env=env)
        assert res.returncode == 0, res.stderr[-2000:]
    res = run_pardiag("merge", str(tmp_path / "node0"), str(tmp_path / "node1"), "-o", str(tmp_path / "all"))
    assert res.returncode == 0, res.stderr
    m = read_json(tmp_path / "all" / "manifest.json")
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and len(m["launchers"]) == 2
    assert m["collectors"]["missing_ranks"] == [] and m["collectors"]["steps"]["status"] == "ok"
    # merging into a directory that is not empty is refused, nothing is overwritten
    res = run_pardiag("merge", str(tmp_path / "node0"), "-o", str(tmp_path / "all"))
    assert res.returncode == 2 and "not empty" in res.stderr


def test_fsdp2_collectives_per_process_group(tmp_path: Path) -> None:
    out = tmp_path / "fsdp"
    res = run_pardiag("run", "-q", "--no-report", "--out", str(out), "--profile-steps", "3,1,2", "--",
                      *torchrun(2, SCRIPTS / "fsdp2.py"))
    assert res.returncode == 0, res.stderr[-2000:]
    meta = read_json(out / "ranks/0/meta.json")
    f2 = meta["fsdp"]["fsdp2"]
    assert f2["dtensor_params"] == 8 and f2["mesh_shape"] == [2] and f2["placements"] == ["(Shard(dim=0),)"]
    assert meta["parameters"]["local_bytes"] == 4 * (128 * 128 + 128) * 4 // 2  # half of each tensor per rank
    doc = json.loads(run_pardiag("analyze", str(out), "--json").stdout)
    ops = {c["op"]: c for c in doc["collectives"]}
    # 4 sharded layers + the root: all-gathers in forward and again in backward, every step
    assert ops["all_gather"]["calls"] >= 2 * 4 * 2 and ops["all_gather"]["process_group"] == "0:default_pg"
    # named by what FSDP asked for (`c10d::_reduce_scatter_base_`), not by how gloo runs it
    # (an all_reduce of the whole gradient): one per sharded layer per step
    assert "all_reduce" not in ops and ops["reduce_scatter"]["implementation"] == "gloo:all_reduce"
    assert ops["reduce_scatter"]["calls"] == 4 * 2 and ops["all_gather"]["implementation"] is None
    assert ops["reduce_scatter"]["bytes"] == 4 * 2 * (128 * 128 + 128) * 4  # the unsharded gradient, fp32
    (group,) = doc["process_groups"]
    assert group["role"] == "FSDP shard" and group["ranks"] == [0, 1]


def test_node_summaries_give_the_same_analysis(ddp_run, tmp_path: Path) -> None:
    """Each node summarises its ranks' traces after the job; the central analysis reads the
    summaries and gets exactly what parsing the traces gives. A summary that no longer
    matches its trace is ignored."""
    import os
    import shutil

    _res, src = ddp_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    for rank in (0, 1):
        doc = read_json(out / f"ranks/{rank}/summary.json")
        assert doc["format"] == "pardiag.rank-summary" and doc["source"]["trace"] == "trace.json.gz"
    from_summaries = json.loads(run_pardiag("analyze", str(out), "--json", "--force").stdout)
    for rank in (0, 1):
        (out / f"ranks/{rank}/summary.json").unlink()
    from_traces = json.loads(run_pardiag("analyze", str(out), "--json", "--force").stdout)
    assert from_summaries == from_traces
    # a stale summary (the trace changed since) is not used
    shutil.copy(src / "ranks/0/summary.json", out / "ranks/0/summary.json")
    trace = out / "ranks/0/trace.json.gz"
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 1_000_000_000))
    from pardiag.analyzers import reduce
    from pardiag.rundir import RunDir

    assert reduce.load(RunDir(out), 0, trace) is None


def test_a_trace_another_node_compressed_first_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes whose `pardiag run` share one directory and one host name both claim every
    rank's trace (test_two_nodes_share_one_out on 127.0.0.1): a trace listed by one can be
    gone by the time it is stat-ed or compressed. That is the other node's work, done:
    no traceback, and the trace that is there is compressed."""
    from pardiag import recording, rundir as rd

    run = rd.RunDir(tmp_path)
    for r in (0, 1):
        run.rank_dir(r).mkdir(parents=True)
    run.trace(0, 1).write_text('{"traceEvents": []}')
    gone = run.trace(1, 1)  # listed (is_file says yes), then compressed by the other node
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: p == gone or real_is_file(p))
    recording.compress_traces(run, [0, 1])
    assert (run.rank_dir(0) / "trace.json.gz").is_file() and not real_is_file(run.trace(0, 1))
    # and one whose compression the other node finished first: its unlink finds nothing
    run.trace(0, 1).write_text('{"traceEvents": []}')
    real_compress = rd.compress_file

    def raced(p: Path, level: int = 6) -> Path:
        real_compress(p, level)
        raise FileNotFoundError(2, "No such file or directory", str(p))

    monkeypatch.setattr(rd, "compress_file", raced)
    recording.compress_traces(run, [0])
    assert (run.rank_dir(0) / "trace.json.gz").is_file()
