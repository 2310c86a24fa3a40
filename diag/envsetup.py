"""The environment every process of the wrapped command inherits.

pardiag's sitecustomize goes first on PYTHONPATH (the user's PYTHONPATH follows it
and an existing sitecustomize still runs), NCCL logs into the run directory, and
PyTorch's flight recorder dumps there on a timeout. Settings the user already made
are kept and recorded, never overridden.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pardiag import rundir
from pardiag.collectors.bootstrap import ENV_RUN_DIR
from pardiag.collectors.config import ENV_CONFIG, CollectorConfig

# INIT/ENV give versions and overrides, BOOTSTRAP/NET the interfaces and network,
# GRAPH the topology, rings and trees, TUNING the algorithm choices. COLL (one line per
# collective per rank) is left out: it is on the critical path.
NCCL_SUBSYS = "INIT,BOOTSTRAP,ENV,NET,GRAPH,TUNING"
FLIGHT_RECORDER_ENTRIES = "2000"

# Variable families worth keeping in the manifest (after redaction).
RECORDED_PREFIXES = (
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "GLOO_",
    "OMP_",
    "MKL_",
    "KMP_",
    "MASTER_",
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "HOROVOD_",
    "ACCELERATE_",
    "DEEPSPEED_",
    "UCX_",
    "FI_",
    "HF_",
    "PARDIAG_",
)
RECORDED_NAMES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYTHONPATH", "LD_PRELOAD")


def inject_dir() -> Path:
    """Folder holding pardiag's sitecustomize.py."""
    from pardiag.collectors import _inject

    return Path(_inject.__file__).resolve().parent


@dataclass
class RankEnv:
    env: dict[str, str]
    set_by_pardiag: dict[str, str] = field(default_factory=dict)
    kept_from_user: dict[str, str] = field(default_factory=dict)


def build_env(
    base: Mapping[str, str], run: rundir.RunDir, cfg: CollectorConfig, nccl_log: bool = True
) -> RankEnv:
    env = dict(base)
    ours: dict[str, str] = {}
    kept: dict[str, str] = {}

    def default(name: str, value: str) -> None:
        if name in env and env[name] != "":
            kept[name] = env[name]
        else:
            env[name] = value
            ours[name] = value

    inject = str(inject_dir())
    user_pp = env.get("PYTHONPATH", "")
    parts = [p for p in user_pp.split(os.pathsep) if p and p != inject]
    env["PYTHONPATH"] = os.pathsep.join([inject] + parts)
    env[ENV_RUN_DIR] = str(run.root.resolve())
    env[ENV_CONFIG] = cfg.to_env()
    ours.update({"PYTHONPATH": env["PYTHONPATH"], ENV_RUN_DIR: env[ENV_RUN_DIR]})

    if nccl_log:
        default("NCCL_DEBUG", "INFO")
        default("NCCL_DEBUG_SUBSYS", NCCL_SUBSYS)
        default("NCCL_DEBUG_FILE", rundir.RunDir(run.root.resolve()).nccl_log_pattern())
    flight = str(run.flight_prefix().resolve())
    # torch 2.9 renamed the flight recorder's variables (the old names still work, with
    # a deprecation warning); a user's setting under either name is kept.
    new_names = _torch_at_least(2, 9)
    if not any(env.get(n) for n in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")):
        default("TORCH_FR_BUFFER_SIZE" if new_names else "TORCH_NCCL_TRACE_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
    default("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if not any(env.get(n) for n in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")):
        default("TORCH_FR_DUMP_TEMP_FILE" if new_names else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", flight)
    return RankEnv(env=env, set_by_pardiag=ours, kept_from_user=kept)


def _torch_at_least(major: int, minor: int) -> bool:
    """The installed torch's version, read without importing torch."""
    from importlib import metadata

    try:
        parts = metadata.version("torch").split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (major, minor)
    except Exception:
        return True


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the environment that explains a distributed run."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(RECORDED_PREFIXES) or k in RECORDED_NAMES
    }
