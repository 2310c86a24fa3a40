"""Small pieces of the collection path, checked without starting a job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pardiag.analyzers.steps import percentile, step_stats
from pardiag.collectors.bootstrap import entry_point, is_launcher
from pardiag.collectors.config import CollectorConfig, ProfileSchedule, parse_ranks
from pardiag.recording import job_key_from, launcher_kind
from pardiag.envsetup import build_env, inject_dir
from pardiag.redact import REDACTED, redact_argv, redact_env, redact_text
from pardiag.rundir import RunDir, iter_steps
from pardiag.step_records import parse as parse_step


@pytest.mark.parametrize(
    "argv, launcher",
    [
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], True),
        (["python", "/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"], True),
        (["python", "-m", "torch.distributed.launch", "t.py"], True),
        (["python", "/usr/bin/deepspeed", "t.py"], True),
        (["python", "-m", "deepspeed.launcher.launch", "--world_info", "x"], True),
        (["python", "/venv/bin/accelerate", "launch", "t.py"], True),
        (["python", "-m", "accelerate.commands.launch", "t.py"], True),
        (["python", "/usr/local/bin/horovodrun", "-np", "2", "python", "t.py"], True),
        (["python", "train.py", "--epochs", "1"], False),
        (["python", "-u", "-X", "faulthandler", "train.py"], False),
        (["python", "-m", "mypkg.train"], False),
        (["python", "-c", "print(1)"], False),
        (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"], False),
    ],
)
def test_launcher_processes_are_recognised(argv: list[str], launcher: bool) -> None:
    assert is_launcher(argv) is launcher


def test_entry_point_skips_interpreter_options() -> None:
    assert entry_point(["py", "-X", "dev", "-W", "ignore", "-u", "a.py", "-m", "x"]) == ("script", "a.py")
    assert entry_point(["py", "-mtorch.distributed.run"]) == ("module", "torch.distributed.run")
    assert entry_point(["py"]) == ("", "")


def test_profile_schedule_parse() -> None:
    s = ProfileSchedule.parse("5,2,4")
    assert (s.wait, s.warmup, s.active, s.first_active, s.end) == (5, 2, 4, 7, 11)
    for bad in ("5,2", "a,b,c", "1,1,0", "-1,2,3"):
        with pytest.raises(ValueError):
            ProfileSchedule.parse(bad)


def test_parse_ranks() -> None:
    assert parse_ranks("0,3,8-11") == (0, 3, 8, 9, 10, 11)
    assert parse_ranks("2, 1,1") == (1, 2)
    for bad in ("", "x", "3-1", "1-"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_config_round_trips_through_env() -> None:
    cfg = CollectorConfig(schedule=ProfileSchedule(9, 1, 2), ranks=(0, 5), record_shapes=False)
    back = CollectorConfig.from_env({"PARDIAG_CONFIG": cfg.to_env()})
    assert back == cfg
    assert back.profiles_rank(5) and not back.profiles_rank(1)
    assert CollectorConfig.from_env({}) == CollectorConfig()


def test_redact_env_by_name_and_value() -> None:
    env = {
        "HF_TOKEN": "abc",
        "WANDB_API_KEY": "1234567890",
        "AWS_SECRET_ACCESS_KEY": "x",
        "DB_PASSWORD": "pw",
        "NCCL_DEBUG": "INFO",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "MY_URL": "https://user:hunter2@example.com/x",
        "SOMETHING": "ghp_" + "a" * 36,
    }
    r = redact_env(env)
    assert r["HF_TOKEN"] == r["WANDB_API_KEY"] == r["AWS_SECRET_ACCESS_KEY"] == r["DB_PASSWORD"] == REDACTED
    assert r["NCCL_DEBUG"] == "INFO" and r["SSH_AUTH_SOCK"] == "/tmp/agent"
    assert r["MY_URL"] == f"https://user:{REDACTED}@example.com/x"
    assert r["SOMETHING"] == REDACTED


def test_redact_argv() -> None:
    argv = ["train.py", "--api-key", "s3cr3t", "--token=abc", "--lr", "0.1", "password=pw", "hf_" + "b" * 30]
    assert redact_argv(argv) == [
        "train.py", "--api-key", REDACTED, f"--token={REDACTED}", "--lr", "0.1", f"password={REDACTED}", REDACTED,
    ]


def test_redact_text_hides_secret_values_from_env() -> None:
    text = "connecting with key verysecretvalue and token sk-" + "c" * 30
    out = redact_text(text, {"SERVICE_KEY": "verysecretvalue", "PATH": "/bin"})
    assert "verysecretvalue" not in out and "sk-ccc" not in out and out.count(REDACTED) == 2


def test_iter_steps_skips_torn_last_line(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    p.write_text('{"step":0,"dur_us":1}\n{"step":1,"dur_us":2}\n{"step":2,"du')
    assert [r.step for r in iter_steps(p)] == [0, 1]
    assert list(iter_steps(tmp_path / "missing.jsonl")) == []


def test_step_stats_by_hand() -> None:
    recs = [{"step": 0, "dur_us": 1000.0, "data_us": 0}]  # step 0 left out
    recs += [{"step": i, "dur_us": float(d), "data_us": 10.0} for i, d in enumerate([100, 300, 200, 400], start=1)]
    recs += [{"step": 5, "dur_us": 900.0, "data_us": 0, "profiler": "active"}]
    recs += [{"step": 6, "dur_us": 800.0, "data_us": 0, "profiler": "warmup"}]
    recs += [{"step": 7, "dur_us": 700.0, "data_us": 0, "pardiag_us": 450_000.0}]  # closing the window
    st = step_stats([parse_step(r) for r in recs])
    assert st.disturbed == 1
    assert st.n == 4 and st.p50_us == 250.0 and st.mean_us == 250.0 and st.max_us == 400.0
    assert st.p90_us == pytest.approx(370.0)  # 300 + 0.7 * (400 - 300)
    assert st.data_share == pytest.approx(40 / 1000)
    assert st.profiled_p50_us == 900.0 and st.last_step == 7
    assert percentile([1.0], 0.9) == 1.0


def test_job_key() -> None:
    tr = ["torchrun", "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29500", "t.py"]
    assert job_key_from(tr, {}) == "torchrun-@10.0.0.1:29500"
    assert job_key_from(["torchrun", "--nnodes=2", "--rdzv-id=42", "--rdzv-endpoint=h:1", "t.py"], {}) == "torchrun-42@h:1"
    assert job_key_from(["torchrun", "--nproc-per-node", "8", "t.py"], {}) is None
    assert job_key_from(["python", "t.py"], {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}) == "slurm-77.3"
    assert launcher_kind(["python3", "-m", "torch.distributed.run", "t.py"]) == "torchrun"
    assert launcher_kind(["/usr/bin/srun", "python", "t.py"]) == "slurm"
    assert launcher_kind(["python3.11", "t.py"]) == "python"


def test_build_env_keeps_user_settings(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    base = {"PYTHONPATH": "/a:/b", "NCCL_DEBUG": "WARN", "PATH": "/bin"}
    e = build_env(base, run, CollectorConfig())
    assert e.env["PYTHONPATH"].split(os.pathsep) == [str(inject_dir()), "/a", "/b"]
    assert e.env["NCCL_DEBUG"] == "WARN" and e.kept_from_user == {"NCCL_DEBUG": "WARN"}
    assert e.env["NCCL_DEBUG_FILE"] == str(tmp_path.resolve() / "nccl" / "%h.%p.log")
    assert e.env["NCCL_DEBUG_SUBSYS"] == "INIT,BOOTSTRAP,ENV,NET,GRAPH,TUNING"
    assert e.env["PARDIAG_RUN_DIR"] == str(tmp_path.resolve())
    assert (inject_dir() / "sitecustomize.py").is_file()
    off = build_env(base, run, CollectorConfig(), nccl_log=False)
    assert "NCCL_DEBUG_FILE" not in off.env


def test_import_hygiene() -> None:
    """The CLI and the analyzers load without torch, textual or plotly."""
    code = (
        "import sys, pkgutil, importlib, pardiag.cli, pardiag.analyzers\n"
        "for m in pkgutil.iter_modules(pardiag.analyzers.__path__):\n"
        "    importlib.import_module('pardiag.analyzers.' + m.name)\n"
        "pardiag.cli.build_parser()\n"
        "bad = [m for m in ('torch', 'textual', 'plotly', 'pynvml') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_home_paths(monkeypatch) -> None:
    from pardiag.redact import home_paths

    monkeypatch.delenv("PARDIAG_SHOW_PATHS", raising=False)
    assert home_paths("/home/ada/proj/train.py --x /home/adam/y", home="/home/ada") == "~/proj/train.py --x /home/adam/y"
    assert home_paths("/home/ada", home="/home/ada") == "~"
    monkeypatch.setenv("PARDIAG_SHOW_PATHS", "1")
    assert home_paths("/home/ada/x", home="/home/ada") == "/home/ada/x"


def test_a_collector_that_cannot_install_leaves_its_reason_where_the_manifest_reads_it(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from pardiag import manifest, rundir
    from pardiag.collectors import runtime

    monkeypatch.setenv("PARDIAG_RUN_DIR", str(tmp_path))
    try:
        raise RuntimeError("no profiler here")
    except RuntimeError as e:
        runtime._record_install_failure(e)
    run = rundir.RunDir(tmp_path)
    path = run.bootstrap_error(rundir.hostname(), os.getpid())
    assert "RuntimeError: no profiler here" in path.read_text()
    status = manifest._collector_status(run, {}, {}, None, [])
    assert status["bootstrap"]["status"] == "failed" and status["bootstrap"]["files"] == [path.name]
