"""Recording a run: what launches the job, which job it is (the key every node of one
job shares), claiming the run directory, starting the job with every rank's
environment, and, after it, compressing and summarising this node's traces and writing
the manifest. `pardiag run` and `pardiag demo` call `choose_run_dir` then `record`."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from pardiag import manifest, rundir
from pardiag.collectors.config import CollectorConfig
from pardiag.envsetup import build_env, recorded_env
from pardiag.errors import UserError
from pardiag.launcher import launch
from pardiag.redact import redact_argv, redact_env, redact_text

LAUNCHERS = {
    "torchrun": "torchrun",
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "srun": "slurm",
    "mpirun": "mpi",
    "mpiexec": "mpi",
    "horovodrun": "horovod",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
}


# -- which launcher, which job ------------------------------------------------------------------


def launcher_kind(cmd: Sequence[str]) -> str:
    first = os.path.basename(cmd[0])
    if first in LAUNCHERS:
        return LAUNCHERS[first]
    if re.fullmatch(r"python[0-9.]*", first):
        if "-m" in cmd:
            i = list(cmd).index("-m")
            if i + 1 < len(cmd) and cmd[i + 1] in LAUNCHERS:
                return LAUNCHERS[cmd[i + 1]]
        return "python"
    return first


def job_key_from(cmd: Sequence[str], environ: os._Environ[str] | dict[str, str]) -> str | None:
    """Every node of one job computes the same key; two different jobs do not."""
    if environ.get("SLURM_JOB_ID"):
        return f"slurm-{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"
    for var in ("TORCHELASTIC_RUN_ID", "PBS_JOBID", "LSB_JOBID"):
        if environ.get(var):
            return f"{var.lower()}-{environ[var]}"
    opts = _options(cmd)
    if launcher_kind(cmd) == "torchrun":
        nnodes = opts.get("nnodes", "1")
        if nnodes not in ("1", "1:1"):
            rdzv = opts.get("rdzv_id") or ""
            where = opts.get("rdzv_endpoint") or f"{opts.get('master_addr', '')}:{opts.get('master_port', '')}"
            return f"torchrun-{rdzv}@{where}"
    return None


def _options(cmd: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(cmd):
        if not a.startswith("--"):
            continue
        name, eq, value = a[2:].partition("=")
        name = name.replace("-", "_")
        if not eq:
            value = cmd[i + 1] if i + 1 < len(cmd) and not cmd[i + 1].startswith("-") else ""
        out.setdefault(name, value)
    return out


def default_out(cmd: Sequence[str], job_key: str | None) -> Path:
    if job_key:
        return Path("pardiag-runs") / re.sub(r"[^A-Za-z0-9_.-]+", "_", job_key)
    script = next((os.path.basename(c) for c in cmd if c.endswith(".py")), os.path.basename(cmd[0]))
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", script.removesuffix(".py"))[:40]
    return Path("pardiag-runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}"


# -- the run directory --------------------------------------------------------------------------


def choose_run_dir(out: str | None, cmd: Sequence[str], job_key: str | None) -> rundir.RunDir:
    """Join the directory of the same job (another node), never a different run's.

    The directory is claimed at once with this launcher's record, so a second node
    starting a moment later recognises it as the same job.
    """
    base = Path(out) if out else default_out(cmd, job_key)
    candidate = base
    for n in range(2, 1000):
        try:
            candidate.mkdir(parents=True)
            joined = False
        except FileExistsError:
            if not candidate.is_dir():
                raise UserError(f"{candidate} exists and is not a directory") from None
            joined = _joinable(rundir.RunDir(candidate), job_key)
            if not joined:
                candidate = base.with_name(f"{base.name}-{n}")
                continue
        except PermissionError:
            raise UserError(f"cannot create the run directory {candidate}: permission denied") from None
        except OSError as e:
            raise UserError(f"cannot create the run directory {candidate}: {e.strerror}") from None
        run = rundir.RunDir(candidate)
        _claim(run, job_key)
        if candidate != base and not joined:
            print(f"pardiag: {base} holds another run; recording into {candidate}", file=sys.stderr)
        return run
    raise UserError(f"too many runs named {base}")


def _claim(run: rundir.RunDir, job_key: str | None) -> None:
    try:
        manifest.write_launcher_record(
            run,
            {"host": rundir.hostname(), "pid": os.getpid(), "job_key": job_key, "status": "running", "started": time.time()},
        )
    except OSError as e:
        raise UserError(f"cannot write into {run.root}: {e.strerror}") from None


def _joinable(run: rundir.RunDir, job_key: str | None, wait_s: float = 5.0) -> bool:
    """An empty folder, or a run of the same job still in progress (any job step for SLURM)."""
    if not any(run.root.iterdir()):
        return True
    if job_key is None:
        return False
    deadline = time.time() + wait_s
    records = rundir.read_launcher_records(run)
    while not records and time.time() < deadline:  # the other node is still claiming it
        time.sleep(0.1)
        records = rundir.read_launcher_records(run)
    if not records or any(r.get("job_key") != job_key for r in records):
        return False
    return job_key.startswith("slurm-") or any(r.get("status") == "running" for r in records)


# -- the recording ------------------------------------------------------------------------------


def record(
    run: rundir.RunDir,
    cmd: list[str],
    cfg: CollectorConfig,
    job_key: str | None,
    nccl_log: bool = True,
    quiet: bool = False,
    report: bool = True,
    extra_env: dict[str, str] | None = None,
    telemetry_interval: float = 0.1,
    measure: bool = True,
) -> int:
    from pardiag.collectors import nvml

    for d in (run.ranks_dir, run.logs_dir, run.launchers_dir, run.flight_dir, run.nccl_dir):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot write into {run.root}: {e.strerror}") from None
    if not os.access(run.root, os.W_OK):
        raise UserError(f"cannot write into {run.root}: permission denied")
    host, pid = rundir.hostname(), os.getpid()
    rank_env = build_env({**os.environ, **(extra_env or {})}, run, cfg, nccl_log=nccl_log)
    sampling = nvml.start_sampler(run, interval_s=telemetry_interval) if telemetry_interval > 0 else None
    telemetry = sampling.status if sampling else {"status": "skipped", "reason": "--telemetry-interval 0"}
    rec: dict[str, Any] = {
        "run_id": uuid.uuid4().hex[:12],
        "job_key": job_key,
        "host": host,
        "pid": pid,
        "status": "running",
        "command": redact_argv(cmd),
        "launcher": launcher_kind(cmd),
        "cwd": os.getcwd(),
        "started": time.time(),
        "ended": None,
        "exit_code": None,
        "profiler": {
            "enabled": cfg.profile,
            "schedule": {"wait": cfg.schedule.wait, "warmup": cfg.schedule.warmup, "active": cfg.schedule.active},
            "ranks": list(cfg.ranks) if cfg.ranks is not None else None,
            "record_shapes": cfg.record_shapes,
            "with_stack": cfg.with_stack,
            "profile_memory": cfg.profile_memory,
        },
        "env": redact_env(recorded_env(rank_env.env)),
        "nccl": {
            "set_by_pardiag": redact_env({k: v for k, v in rank_env.set_by_pardiag.items() if k != "PYTHONPATH"}),
            "kept_from_user": redact_env(rank_env.kept_from_user),
        },
        "telemetry": telemetry,
    }
    try:
        manifest.write_launcher_record(run, rec)
    except OSError as e:
        raise UserError(f"cannot write into {run.root}: {e.strerror}") from None
    if not quiet:
        s = cfg.schedule
        window = (
            f"steps {s.first_active}-{s.end - 1}" if cfg.profile else "off"
        )
        print(f"pardiag: recording into {run.root} (profiler window: {window})", file=sys.stderr, flush=True)

    secrets = {k: v for k, v in os.environ.items()}
    result = launch(
        cmd,
        rank_env.env,
        run.stream_log(host, pid, "stdout"),
        run.stream_log(host, pid, "stderr"),
        clean=lambda text: redact_text(text, secrets),
    )
    if result.error:
        print(f"pardiag: error: {result.error}", file=sys.stderr)
    if sampling and sampling.sampler is not None:
        telemetry = sampling.sampler.stop()
        telemetry["split"] = nvml.split_by_rank(run, host)
    rec.update(
        status="ended",
        ended=result.ended,
        exit_code=result.exit_code,
        signals_received=result.signals_received,
        killed_by_signal=result.killed_by_signal,
        error=result.error,
        telemetry=telemetry,
    )
    mine = ranks_on_host(run, host)
    compress_traces(run, mine)
    reduce_traces(run, host, mine)
    if measure:
        from pardiag.measure import measure_after_job

        rec["factors"] = measure_after_job(run, cmd, host, mine, result.exit_code, os.environ, quiet=quiet)
    else:
        rec["factors"] = {"status": "skipped", "reason": "--no-measure"}
    try:
        manifest.write_launcher_record(run, rec)
        doc = manifest.write(run)
    except OSError as e:
        print(f"pardiag: error: could not write the manifest into {run.root}: {e}", file=sys.stderr)
        return result.exit_code
    if not quiet:
        from pardiag.run_summary import print_run_summary

        print_run_summary(run, doc, write_report=report)
    else:
        print(run.root)
    return result.exit_code


def ranks_on_host(run: rundir.RunDir, host: str) -> list[int]:
    """Ranks whose meta says they ran on `host` (or that left no meta)."""
    out = []
    for r in run.ranks():
        try:
            owner = rundir.read_meta(run, r).host
        except rundir.RunDirError:
            owner = None
        if owner in (None, host):
            out.append(r)
    return out


def compress_traces(run: rundir.RunDir, ranks: list[int]) -> None:
    """Compress the traces this host's ranks wrote (after the job: no cost to training)."""
    from concurrent.futures import ThreadPoolExecutor

    listed = [raw for r in ranks for w in (1, 2) for raw in (run.trace(r, w), run.partial_trace(r, w)) if raw.is_file()]
    sizes: dict[Path, int] = {}
    for p in listed:
        try:
            sizes[p] = p.stat().st_size
        except FileNotFoundError:  # compressed meanwhile by another node's pardiag sharing this directory
            pass
    todo = list(sizes)
    if not todo:
        return
    total = sum(sizes.values())
    if total > 64 << 20:
        print(f"pardiag: compressing {len(todo)} traces ({total / 2**20:.0f} MB)", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
        for raw, fut in [(p, pool.submit(rundir.compress_file, p)) for p in todo]:
            try:
                fut.result()
            except FileNotFoundError:  # as above: the other node compressed it first
                pass
            except OSError as e:
                print(f"pardiag: warning: could not compress {raw}: {e}", file=sys.stderr)


def reduce_traces(run: rundir.RunDir, host: str, mine: list[int]) -> None:
    """Summarise this node's traces here, in parallel, so the central analysis of a
    large job reads summaries instead of every trace."""
    from pardiag.node_summaries import write_node_summaries

    if len(mine) > 8:
        print(f"pardiag: summarising {len(mine)} traces on {host}", file=sys.stderr, flush=True)
    try:
        errors = write_node_summaries(run, mine)
    except Exception as e:  # the traces are kept: the analysis can still read them
        print(f"pardiag: warning: could not summarise the traces: {e}", file=sys.stderr)
        return
    for rank, err in sorted(errors.items()):
        if err:
            print(f"pardiag: warning: rank {rank}: {err}", file=sys.stderr)
