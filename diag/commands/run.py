"""`pardiag run [options] -- COMMAND ...`"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from pardiag import manifest, rundir
from pardiag.collectors.config import CollectorConfig, ProfileSchedule, parse_ranks
from pardiag.envsetup import build_env, recorded_env
from pardiag.errors import UserError
from pardiag.launcher import launch
from pardiag.redact import redact_argv, redact_env, redact_text

DESCRIPTION = """Run a training command, unchanged, with every Python rank it starts under
torch.profiler (one window of steps), per-step timestamps for all steps, NCCL debug
logging and PyTorch's flight recorder. Works with torchrun, python -m
torch.distributed.run, srun, mpirun, horovodrun, deepspeed, accelerate launch and
plain python. The command's exit code is returned unchanged."""

EPILOG = """A step ends when the script's torch optimizer finishes step() (or when a loop
without one calls pardiag.step()). Steps are numbered from 0 on every rank.

examples:
  pardiag run -- torchrun --nproc-per-node 2 examples/train_ddp.py --epochs 1
  pardiag run --out runs/exp1 --profile-steps 20,2,3 -- torchrun --nproc-per-node 8 train.py
  srun pardiag run --out /shared/runs/exp1 -- python train.py   # every node, one --out
"""

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", "-o", metavar="DIR", help="run directory (default: pardiag-runs/<time>-<script>)")
    p.add_argument(
        "--profile-steps",
        metavar="WAIT,WARMUP,ACTIVE",
        default="5,2,3",
        help="profiler window: skip WAIT steps, warm up for WARMUP, record ACTIVE (default: 5,2,3)",
    )
    p.add_argument("--ranks", metavar="LIST", help="profile only these ranks, e.g. 0,1 or 0-3,8 (default: all)")
    p.add_argument("--no-profile", action="store_true", help="no profiler trace; steps, meta and logs only")
    p.add_argument("--no-shapes", action="store_true", help="do not record tensor shapes/dtypes (a little cheaper)")
    p.add_argument("--with-stack", action="store_true", help="record Python stacks (costly)")
    p.add_argument("--profile-memory", action="store_true", help="record allocations (costly)")
    p.add_argument("--no-nccl-log", action="store_true", help="do not set NCCL_DEBUG/NCCL_DEBUG_FILE")
    p.add_argument("--memory-per-rank", metavar="SIZE",
                   help="plan for devices of this memory (e.g. 24GiB, 80GB): the sharding advice uses it "
                        "instead of the memory the ranks have")
    p.add_argument("--job-id", help="shared by every node's `pardiag run` of one job (default: from SLURM or the torchrun rendezvous)")
    p.add_argument("--telemetry-interval", type=float, default=0.1, metavar="SECONDS",
                   help="GPU telemetry (NVML) sampling interval; 0 turns it off (default: 0.1)")
    p.add_argument("--no-report", action="store_true", help="do not write report.html after the run")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the run directory at the end")
    p.add_argument("--no-torch-check", action="store_true",
                   help="start the command even when its Python seems to have no torch")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")


def execute(args: argparse.Namespace) -> int:
    cmd = [c for c in (args.cmd or [])]
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("nothing to run: pardiag run [options] -- COMMAND [ARGS...]")
    cfg = collector_config(args)
    if not getattr(args, "no_torch_check", False):
        check_job_torch(cmd, os.environ)
    extra_env = {}
    if args.memory_per_rank:
        extra_env["PARDIAG_MEMORY_PER_RANK"] = str(parse_size(args.memory_per_rank))
    job_key = args.job_id or job_key_from(cmd, os.environ)
    run = choose_run_dir(args.out, cmd, job_key)
    if args.telemetry_interval < 0:
        raise UserError("--telemetry-interval must be 0 (off) or a positive number of seconds")
    return record(run, cmd, cfg, job_key, nccl_log=not args.no_nccl_log, quiet=args.quiet,
                  report=not args.no_report, extra_env=extra_env, telemetry_interval=args.telemetry_interval)


# -- torch in the job's Python ------------------------------------------------------------------
# pardiag itself needs no torch; the training processes do (the profiler runs inside them).
# Before anything starts, find the interpreter the command will use and ask it, cheaply,
# whether it can import torch. When that cannot be told, the job starts.

PYTHON_LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "horovodrun")
# Run with `python -S`: the site setup (venv, user site, .pth files) is done by hand without
# the user's sitecustomize/usercustomize, which must run only in the job itself. Exit 3: no
# torch; any other failure (an old or broken interpreter) means "cannot tell".
TORCH_PROBE = ("import sys; sys.modules['sitecustomize'] = sys.modules['usercustomize'] = None; "
               "import site; site.main(); import importlib.util; "
               "sys.exit(3 if importlib.util.find_spec('torch') is None else 0)")
TORCH_MISSING = 3
TORCH_PROBE_TIMEOUT_S = 30.0
_SH_EXEC = re.compile(r"""'''exec' ("[^"]+"|'[^']+'|\S+)""")  # pip's launcher for long interpreter paths


def _is_python(name: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(name)) is not None


def _shebang_python(script: str, path: str | None) -> str | None:
    """The Python a script's `#!` line runs: `#!/venv/bin/python`, `#!/usr/bin/env python3`,
    or `#!/bin/sh` followed by pip's `'''exec' /a/long/path/python "$0" "$@"`."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    if not words:
        return None
    prog, rest = words[0], words[1:]
    if os.path.basename(prog) == "env":
        rest = [w for w in rest if not w.startswith("-") and "=" not in w]
        return shutil.which(rest[0], path=path) if rest and _is_python(rest[0]) else None
    if _is_python(prog):
        return prog
    if os.path.basename(prog) in ("sh", "bash") and len(lines) > 1:
        m = _SH_EXEC.match(lines[1])
        exe = m.group(1).strip("'\"") if m else ""
        if _is_python(exe):
            return exe
    return None


def job_python(cmd: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The interpreter the command's training processes will run, or None if it cannot be
    told: the first `python*` of the command (also after srun, mpirun, ...), the Python in
    the `#!` line of torchrun/deepspeed/accelerate/horovodrun, or of the command itself
    (an executable script, a console script)."""
    path = environ.get("PATH")
    for i, arg in enumerate(cmd):
        if _is_python(arg):
            return shutil.which(arg, path=path)
        launcher = os.path.basename(arg) in PYTHON_LAUNCHERS
        if launcher or i == 0:
            exe = shutil.which(arg, path=path)
            found = _shebang_python(exe, path) if exe else None
            if found or launcher:
                return found
    return None


def check_job_torch(cmd: Sequence[str], environ: Mapping[str, str]) -> None:
    """Refuse to start a job whose Python cannot import torch (UserError: exit 2)."""
    python = job_python(cmd, environ)
    if python is None:
        return
    try:
        probe = subprocess.run([python, "-S", "-c", TORCH_PROBE], env=dict(environ), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TORCH_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return
    if probe.returncode == TORCH_MISSING:
        raise UserError(
            f"{python}, the Python this command runs, has no torch: pardiag profiles inside the training "
            "processes, so install torch there or run the command with the Python that has it "
            "(--no-torch-check starts it anyway)"
        )


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '512MiB', '1.5G', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"--memory-per-rank: {text!r} is not a size (e.g. 24GiB, 80GB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    decimal = bool(unit) and not binary and text.strip()[-1:] in "Bb"  # "80GB": powers of 1000
    base = 1000 if decimal else 1024
    power = " KMGT".index(unit or " ")
    return int(value * base**power)


def collector_config(args: argparse.Namespace) -> CollectorConfig:
    try:
        schedule = ProfileSchedule.parse(args.profile_steps)
        ranks = parse_ranks(args.ranks) if args.ranks else None
    except ValueError as e:
        raise UserError(str(e)) from None
    return CollectorConfig(
        schedule=schedule,
        profile=not args.no_profile,
        ranks=ranks,
        record_shapes=not args.no_shapes,
        with_stack=args.with_stack,
        profile_memory=args.profile_memory,
    )


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
    try:
        manifest.write_launcher_record(run, rec)
        doc = manifest.write(run)
    except OSError as e:
        print(f"pardiag: error: could not write the manifest into {run.root}: {e}", file=sys.stderr)
        return result.exit_code
    if not quiet:
        from pardiag.summary import print_run_summary

        print_run_summary(run, doc, write_report=report)
    else:
        print(run.root)
    return result.exit_code


def ranks_on_host(run: rundir.RunDir, host: str) -> list[int]:
    """Ranks whose meta says they ran on `host` (or that left no meta)."""
    out = []
    for r in run.ranks():
        try:
            owner = rundir.read_meta(run, r).get("host")
        except rundir.RunDirError:
            owner = None
        if owner in (None, host):
            out.append(r)
    return out


def compress_traces(run: rundir.RunDir, ranks: list[int]) -> None:
    """Compress the traces this host's ranks wrote (after the job: no cost to training)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [raw for r in ranks for raw in (run.trace(r), run.partial_trace(r)) if raw.is_file()]
    if not todo:
        return
    total = sum(p.stat().st_size for p in todo)
    if total > 64 << 20:
        print(f"pardiag: compressing {len(todo)} traces ({total / 2**20:.0f} MB)", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
        for raw, fut in [(p, pool.submit(rundir.compress_file, p)) for p in todo]:
            try:
                fut.result()
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
