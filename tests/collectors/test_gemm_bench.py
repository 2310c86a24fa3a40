"""The GEMM measurement end to end on this CPU: shapes from a real trace, timed by
`collectors/gemm_bench.py` in a process of its own, written to factors/gemm.json and
read back; and what a failed or too long measurement leaves."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pardiag import measure, rundir
from pardiag.analyzers import factors
from pardiag.analyzers.gemm_shapes import gemm_shapes

# times measurements against each other: not beside another test (Makefile, TEST_WORKERS)
pytestmark = pytest.mark.timed

torch = pytest.importorskip("torch")

ACTIVE = 2


def record(path: Path) -> None:
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))
    conv = nn.Conv2d(16, 32, 3, padding=1)
    qkv = nn.Linear(64, 3 * 64)
    x, img, tokens = torch.randn(128, 256), torch.randn(4, 16, 32, 32), torch.randn(8, 128, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
                 schedule=schedule(wait=0, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + ACTIVE):
            # attention over 8 sequences of 128 tokens, 4 heads of 16: its forward and the
            # flash-attention backward are timed like the matrix multiplies
            q, k, v = qkv(tokens).view(8, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
            att = nn.functional.scaled_dot_product_attention(q, k, v)
            (model(x).sum() + conv(img).sum() + att.sum()).backward()
            p.step()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> rundir.RunDir:
    r = rundir.RunDir(tmp_path_factory.mktemp("run"))
    r.rank_dir(0).mkdir(parents=True)
    record(r.trace(0))
    return r


@pytest.fixture(scope="module")
def measured(run: rundir.RunDir) -> dict:
    return measure.measure_gemm(run, 0, run.trace(0), None, sys.executable, os.environ)


def test_every_top_shape_is_timed_in_fp32_and_bf16(run: rundir.RunDir, measured: dict) -> None:
    top = gemm_shapes(run.trace(0)).top(measure.TOP_SHAPES)
    assert measured["status"] == "ok", measured.get("reason")
    assert [(r["op"], r["dims"], r["backward"], r["calls"]) for r in measured["shapes"]] == [
        (s.op, [list(d) if d is not None else None for d in s.dims], s.backward, s.calls) for s in top]
    assert {r["op"] for r in measured["shapes"]} >= {"aten::linear", "aten::conv2d", "aten::mm",
                                                      "aten::scaled_dot_product_attention"}
    # the backward takes its scale as a keyword and its logsumexp in float32 under autocast
    assert any(r["op"].startswith("aten::_scaled_dot_product_") and r["op"].endswith("_backward")
               for r in measured["shapes"]), [r["op"] for r in measured["shapes"]]
    for r in measured["shapes"]:
        assert r["error"] is None and r["fp32_us"] > 0 and r["half_us"] > 0
        assert r["speedup"] == pytest.approx(r["fp32_us"] / r["half_us"])
    assert measured["device"] == "cpu" and measured["to_dtype"] == "bfloat16" and measured["from_dtype"] == "float32"
    assert 0 < measured["seconds"] <= measure.GEMM_TIMEOUT_S


def test_the_file_reads_back_as_the_time_weighted_speedup(run: rundir.RunDir, measured: dict) -> None:
    g = factors.gemm_factor(run.root)
    assert g is not None
    rows = measured["shapes"]
    expect = sum(r["trace_us"] for r in rows) / sum(r["trace_us"] / r["speedup"] for r in rows)
    assert g.speedup == pytest.approx(expect) and measured["speedup"] == pytest.approx(expect)
    total = gemm_shapes(run.trace(0)).total_us
    assert g.covered_share == pytest.approx(sum(r["trace_us"] for r in rows) / total)
    assert [r.trace_us for r in g.rows] == [r["trace_us"] for r in rows]
    assert "timed in fp32 and bf16 autocast on this host's CPU after the job" in g.source
    att = sum("attention" in r["op"] for r in rows)
    assert att >= 2 and f"{att} attention shapes" in g.source, g.source


def test_a_job_python_without_torch_fails_in_one_line(run: rundir.RunDir, python_without_torch: Path,
                                                      tmp_path: Path) -> None:
    other = rundir.RunDir(tmp_path)
    doc = measure.measure_gemm(other, 0, run.trace(0), None, str(python_without_torch), os.environ)
    assert doc["status"] == "failed" and "No module named 'torch'" in doc["reason"] and "\n" not in doc["reason"]
    got = factors.read_gemm(tmp_path)
    assert got.value is None and "No module named 'torch'" in (got.reason or "")


def test_a_measurement_past_its_time_is_killed(run: rundir.RunDir, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "GEMM_TIMEOUT_S", 0.3)
    doc = measure.measure_gemm(rundir.RunDir(tmp_path), 0, run.trace(0), None, sys.executable, os.environ)
    assert doc["status"] == "failed" and doc["reason"] == "killed after 0.3 s"
    assert doc["seconds"] < 5


def test_a_failed_job_is_not_measured(run: rundir.RunDir) -> None:
    got = measure.measure_after_job(run, [sys.executable, "train.py"], "host", [0], 3, os.environ, quiet=True)
    assert got == {"status": "skipped", "reason": "the job exited with code 3"}


def test_of_two_pardiag_runs_of_one_job_on_one_host_one_measures(tmp_path: Path) -> None:
    from pardiag import manifest

    run = rundir.RunDir(tmp_path)
    for pid in (1, os.getpid()):  # two torchrun agents of one job, each under its own pardiag run
        manifest.write_launcher_record(run, {"host": "node0", "pid": pid, "status": "ended"})
    got = measure.measure_after_job(run, [sys.executable, "train.py"], "node0", [0], 0, os.environ, quiet=True)
    assert got == {"status": "skipped", "reason": "pardiag run 1 on this host measures"}
    assert not run.factors_dir.exists()


@pytest.mark.parametrize("cmd, world, hosts, words", [
    (["python", "train.py"], 2, ["node0", "node0"], "no sweep: the job was not launched with torchrun"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], 2, ["node0", "node1"], "no sweep: the job ran on more than one node"),
    (["torchrun", "--nproc-per-node", "16", "train.py"], 16, ["node0"] * 16, "16 ranks on this node (a sweep runs up to 8)"),
    (["torchrun", "train.py"], 1, ["node0"], "one process: no all_reduce between ranks"),
])
def test_where_no_sweep_is_affordable_the_file_says_why(tmp_path: Path, cmd: list[str], world: int,
                                                        hosts: list[str], words: str) -> None:
    from pardiag.rank_meta import RankMeta

    run = rundir.RunDir(tmp_path)
    metas = {r: RankMeta.from_mapping({"rank": r, "world_size": world, "host": h, "backend": "gloo"})
             for r, h in enumerate(hosts)}
    doc = measure.measure_allreduce(run, cmd, "node0", metas, sys.executable, os.environ)
    assert doc["status"] == "skipped" and words in doc["reason"]
    got = factors.read_comm(tmp_path)
    assert got.value is None and words in (got.reason or "")


def test_a_sigterm_while_measuring_stops_it_and_still_returns(run: rundir.RunDir, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import threading

    other = rundir.RunDir(tmp_path)
    other.rank_dir(0).mkdir(parents=True)
    (other.rank_dir(0) / "trace.json").write_bytes(run.trace(0).read_bytes())
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    # a measurement that runs past the signal whatever the machine: the real one can time
    # this trace's few shapes in under the second the signal waits (it did, 1 run in 3)
    slow = tmp_path / "slow_bench.py"
    slow.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(measure, "_collector_file", lambda name: slow)
    monkeypatch.setattr(measure, "GEMM_TIMEOUT_S", 60.0)
    timer.start()
    try:
        got = measure.measure_after_job(other, [sys.executable, "train.py"], "h", [0], 0, os.environ, quiet=True)
    finally:
        timer.cancel()
    assert got["status"] == "failed" and got["reason"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_relu_the_first_linear_feeds_is_read_back_as_a_follower(run: rundir.RunDir, measured: dict) -> None:
    # Linear(256, 256) -> ReLU -> Linear: the ReLU and its threshold_backward run on the
    # first linear's output; gemm.json keeps their time and every call of their names'
    found = gemm_shapes(run.trace(0))
    fol = measured["followers"]
    assert {(r["op"], r["backward"]) for r in fol["shapes"]} == {("aten::relu", False),
                                                                  ("aten::threshold_backward", True)}
    assert fol["followers_us"] == pytest.approx(sum(s.trace_us for s in found.followers))
    assert fol["names_us"] == pytest.approx(found.follower_names_us)
    g = factors.gemm_factor(run.root)
    assert g is not None and g.followers is not None and g.followers.byte_ratio == 2.0
    f, n = fol["followers_us"], max(fol["names_us"], fol["followers_us"])
    assert g.followers.speedup == pytest.approx(n / (n - f / 2))
    assert g.followers.source.startswith("assumed: ") and "relu" in g.followers.source


def test_the_estimates_take_the_followers_from_the_run(run: rundir.RunDir, measured: dict) -> None:
    # what `pardiag analyze` hands the mixed_precision plan: the GEMM speed-up and, on a CPU,
    # the followers' speed-up of all the time in their names
    from pardiag.analyzers import estimates

    gemm, _ = estimates.run_factors(run)
    assert gemm is not None and gemm.speedup == pytest.approx(measured["speedup"])
    fol = measured["followers"]
    f, n = fol["followers_us"], max(fol["names_us"], fol["followers_us"])
    assert gemm.followers is not None and gemm.followers.speedup == pytest.approx(n / (n - f / 2))
