"""Real frameworks under `pardiag run`: Lightning (Trainer and Fabric), the Hugging Face
Trainer, Accelerate, DeepSpeed, and plain torch jobs written the ways people write them
(torch.compile, FSDP2, keyword arguments, spawned DataLoader workers).

Each job in tests/frameworks/ runs twice, 2 ranks on the CPU (gloo): plain, and under
`pardiag run`. The job records every loss it computed and counts its optimizer steps
itself (the framework's own counter); pardiag must not change a single bit of the
training, and must record every optimizer step, the profiler window on every rank, and
the framework that drove the steps."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import free_port, read_json, read_steps, run_pardiag, torchrun

pytestmark = pytest.mark.slow

JOBS_DIR = Path(__file__).resolve().parents[1] / "frameworks"
TIMEOUT = 300


@dataclass(frozen=True)
class Job:
    script: str
    launcher: str  # python (the framework starts its ranks) | torchrun | accelerate | deepspeed
    framework: str  # meta["framework"]["name"]
    package: str  # meta["framework"]["version"] is this module's __version__ (the job records it)
    args: tuple[str, ...] = ()
    steps: int = 12  # optimizer steps per rank
    accum: int = 1  # micro-batches (losses, backward passes) per optimizer step
    requires: tuple[str, ...] = ()
    install: str = "pip install -e '.[frameworks]'"
    env: dict[str, str] = field(default_factory=dict)
    ddp: int = 1  # DistributedDataParallel modules the job trains (meta["ddp"])
    bucket_cap_mb: float = 25.0  # DDP's default
    num_workers: int = 0  # every DataLoader's
    fsdp2: bool = False
    gap: str = ""  # a fact pardiag does not record yet for this job (its test is an expected failure)


JOBS: dict[str, Job] = {
    "lightning_trainer": Job("lightning_trainer.py", "python", "lightning", "lightning", requires=("lightning",)),
    "lightning_fabric": Job("lightning_fabric_job.py", "python", "lightning_fabric", "lightning.fabric",
                            requires=("lightning",)),
    "hf_trainer": Job("hf_trainer.py", "torchrun", "transformers", "transformers", requires=("transformers", "accelerate")),
    "hf_trainer_accum": Job("hf_trainer.py", "torchrun", "transformers", "transformers", args=("--accum", "2"),
                            accum=2, requires=("transformers", "accelerate")),
    "accelerate_accum": Job("accelerate_job.py", "accelerate", "accelerate", "accelerate", accum=2,
                            requires=("accelerate",)),
    # DeepSpeed builds its shared-memory comm op (g++, ninja) on its first run: ~25 s once
    "deepspeed_zero2": Job("deepspeed_zero.py", "deepspeed", "deepspeed", "deepspeed", requires=("deepspeed",),
                           install="pip install --no-build-isolation deepspeed", env={"DS_ACCELERATOR": "cpu"}, ddp=0),
    "torch_compile_ddp": Job("torch_compile_ddp.py", "torchrun", "torch", "torch"),
    "torch_fsdp2": Job("torch_fsdp2.py", "torchrun", "torch", "torch", ddp=0, fsdp2=True),
    "torch_ddp_kwargs": Job("torch_ddp_kwargs.py", "torchrun", "torch", "torch", bucket_cap_mb=1.0),
    "torch_spawn_loader": Job("torch_spawn_loader.py", "torchrun", "torch", "torch", num_workers=2),
}


def console_script(name: str) -> str:
    """The launcher as users type it (`accelerate launch`, `deepspeed`), from this Python's
    environment."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def command(job: Job) -> list[str]:
    script = str(JOBS_DIR / job.script)
    if job.launcher == "python":
        return [sys.executable, script, *job.args]
    if job.launcher == "torchrun":
        return torchrun(2, Path(script), *job.args)
    if job.launcher == "accelerate":
        # `--cpu` alone starts ONE process (accelerate's simple launcher, without an mpirun
        # hostfile); --multi_gpu is the torchrun launcher, and Accelerator(cpu=True) in the
        # job makes it MULTI_CPU on gloo
        return [console_script("accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), script, *job.args]
    if job.launcher == "deepspeed":
        return [console_script("deepspeed"), "--num_gpus", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), script, *job.args]
    raise ValueError(job.launcher)


@dataclass
class Record:
    losses: list[float]
    done: dict[str, Any]


def read_record(prefix: Path, rank: int) -> Record | None:
    path = Path(f"{prefix}.rank{rank}.jsonl")
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [d["loss"] for d in lines if "loss" in d]
    done = [d for d in lines if "optimizer_steps" in d]
    return Record(losses, done[-1] if done else {})


@dataclass
class Runs:
    job: Job
    plain: subprocess.CompletedProcess[str]
    traced: subprocess.CompletedProcess[str]
    out: Path
    plain_records: dict[int, Record | None]
    traced_records: dict[int, Record | None]

    def said(self) -> str:
        def tail(text: str) -> str:  # the job's own lines, without its per-step loss prints
            return "\n".join(line for line in text.splitlines() if not line.startswith("loss "))[-4000:]

        return (f"plain rc={self.plain.returncode}:\n{tail(self.plain.stderr)}\n"
                f"pardiag rc={self.traced.returncode}:\n{tail(self.traced.stderr)}")


def job_env(work: Path, name: str) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PARDIAG_RUN_DIR", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    env.update({
        "FW_RECORD": str(work / f"{name}.losses"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # a cold compile in every run: pardiag's run must not reuse what the plain run compiled
        "TORCHINDUCTOR_CACHE_DIR": str(work / f"{name}.inductor"),
    })
    return env


@pytest.fixture(scope="module", params=list(JOBS))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    name = request.param
    job = JOBS[name]
    missing = [m for m in job.requires if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed ({job.install})")
    work = tmp_path_factory.mktemp(name)
    plain_dir, traced_dir = work / "plain", work / "pardiag"
    plain_dir.mkdir()
    traced_dir.mkdir()
    env = job_env(plain_dir, "job") | job.env
    plain = subprocess.run(command(job), cwd=plain_dir, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    env = job_env(traced_dir, "job") | job.env
    out = traced_dir / "run"
    traced = subprocess.run([sys.executable, "-m", "pardiag", "run", "--no-measure", "--out", str(out), "--", *command(job)],
                            cwd=traced_dir, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    for res, where in ((plain, plain_dir), (traced, traced_dir)):  # kept for a failure's post-mortem
        (where / "stdout.log").write_text(res.stdout)
        (where / "stderr.log").write_text(res.stderr)
    return Runs(job, plain, traced, out,
                {r: read_record(plain_dir / "job.losses", r) for r in (0, 1)},
                {r: read_record(traced_dir / "job.losses", r) for r in (0, 1)})


def bits(xs: list[float]) -> list[str]:
    return [struct.pack("<d", x).hex() for x in xs]


def test_same_exit_code(runs: Runs) -> None:
    assert runs.plain.returncode == 0, runs.said()
    assert runs.traced.returncode == runs.plain.returncode, runs.said()


def test_identical_losses_at_every_step(runs: Runs) -> None:
    job = runs.job
    for rank in (0, 1):
        plain, traced = runs.plain_records[rank], runs.traced_records[rank]
        assert plain is not None and plain.done, f"plain run, rank {rank} left no record\n{runs.said()}"
        assert traced is not None and traced.done, f"pardiag run, rank {rank} left no record\n{runs.said()}"
        assert plain.done["world_size"] == 2
        assert len(plain.losses) == job.steps * job.accum
        assert bits(traced.losses) == bits(plain.losses), f"rank {rank}: {traced.losses} != {plain.losses}"
        assert traced.done == plain.done


def test_steps_jsonl_has_every_optimizer_step(runs: Runs) -> None:
    job = runs.job
    for rank in (0, 1):
        rec = runs.traced_records[rank]
        assert rec is not None and rec.done, runs.said()
        taken = rec.done["optimizer_steps"]  # counted by the job, from the framework's own counter
        assert taken == job.steps
        steps = read_steps(runs.out / "ranks" / str(rank) / "steps.jsonl")
        assert [s["step"] for s in steps] == list(range(taken))
        # backward passes per optimizer step: the micro-batches of gradient accumulation
        assert [s["backwards"] for s in steps] == [job.accum] * taken
        # the process's page faults per step, from the second boundary on (the first has no
        # count to start from): the step's own include those inside its backward passes
        assert "faults" not in steps[0]
        assert all(s["faults"] >= s["bwd_faults"] >= 0 for s in steps[1:]), [
            (s.get("faults"), s.get("bwd_faults")) for s in steps]
        # the process's CPU time holds its training thread's, and the rest of its threads'
        # (gloo's workers): at least as much per step, never more than the step on 2 cores
        # times the process's threads can burn (all of them at most the machine's cores)
        cores = os.cpu_count() or 1
        assert all(s["pcpu_us"] >= s["cpu_us"] - 50 for s in steps[1:]), [(s["pcpu_us"], s["cpu_us"]) for s in steps]
        assert all(s["pcpu_us"] <= cores * s["dur_us"] + 1000 for s in steps[1:]), [
            (s["pcpu_us"], s["dur_us"]) for s in steps]


def test_profiler_window_on_every_rank(runs: Runs) -> None:
    for rank in (0, 1):
        rank_dir = runs.out / "ranks" / str(rank)
        assert (rank_dir / "trace.json.gz").is_file(), runs.said()
        prof = read_json(rank_dir / "meta.json")["profiler"]
        assert prof["status"] == "ok", prof
        assert prof["steps_recorded"] == [7, 8, 9]  # the default window 5,2,3


def test_analysis_has_both_ranks(runs: Runs) -> None:
    cached = runs.out / "analysis.json"
    if cached.is_file():
        doc = read_json(cached)
    else:
        res = run_pardiag("analyze", str(runs.out), "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["run"]["world_size"] == 2
    assert all(r["steps_profiled"] == 3 for r in doc["ranks"])


def test_meta_names_the_framework_and_its_version(runs: Runs) -> None:
    job = runs.job
    rec = runs.plain_records[0]
    assert rec is not None and rec.done, runs.said()
    version = rec.done["version"]  # the job's own `import <package>; <package>.__version__`
    for rank in (0, 1):
        meta = read_json(runs.out / "ranks" / str(rank) / "meta.json")
        assert meta["rank"] == rank and meta["world_size"] == 2
        assert meta["framework"]["name"] == job.framework, meta["framework"]
        assert meta["framework"]["version"] == version, meta["framework"]
        assert meta["errors"] == [], meta["errors"]


def test_meta_has_the_ddp_fsdp_and_accumulation_facts(runs: Runs, request: pytest.FixtureRequest) -> None:
    job = runs.job
    if job.gap:  # strict: once pardiag records it, this passes and says to drop the gap
        request.applymarker(pytest.mark.xfail(reason=job.gap, strict=True))
    for rank in (0, 1):
        meta = read_json(runs.out / "ranks" / str(rank) / "meta.json")
        assert len(meta["ddp"]) == job.ddp, meta["ddp"]
        assert all(d["bucket_count"] >= 1 and d["bucket_cap_mb"] == job.bucket_cap_mb for d in meta["ddp"])
        assert meta["dataloaders"] and {d["num_workers"] for d in meta["dataloaders"]} == {job.num_workers}
        assert bool((meta["fsdp"] or {}).get("fsdp2")) == job.fsdp2, meta["fsdp"]
        acc = meta["grad_accumulation"]
        assert acc["backwards_per_step"] == job.accum
        if job.ddp:  # the micro-batches that are not the last of their step run under no_sync()
            assert acc["no_sync_calls"] == (job.accum - 1) * job.steps
