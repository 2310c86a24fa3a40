"""Process groups and their role in the parallelism (data, FSDP shard, tensor,
pipeline, ...), so a multi-dimensional job shows which dimension costs what.

The role comes first from the group's description when PyTorch named it (DeviceMesh
groups are described as `mesh_<dim>`: `mesh_dp`, `mesh_tp`, `mesh_pp`,
`mesh_dp_shard`, ...), else from what the group carries and its ranks:
all-gathers with reduce-scatters are FSDP sharding, sends/receives are pipeline
stages, all-reduces over every rank are data parallelism, all-reduces within
consecutive ranks are tensor parallelism, over strided ranks data-parallel replicas.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Mapping, Sequence

from pardiag.analysis import Collective, ProcessGroup

DESC_ROLES = (
    (re.compile(r"(dp_shard|fsdp|shard)", re.I), "FSDP shard"),
    (re.compile(r"(dp_replicate|replicate|ddp)", re.I), "data-parallel (replicas)"),
    (re.compile(r"(^|_)tp($|_)|tensor", re.I), "tensor-parallel"),
    (re.compile(r"(^|_)pp($|_)|pipe", re.I), "pipeline-parallel"),
    (re.compile(r"(^|_)cp($|_)|context", re.I), "context-parallel"),
    (re.compile(r"(^|_)ep($|_)|expert", re.I), "expert-parallel"),
    (re.compile(r"(^|_)dp($|_)|data", re.I), "data-parallel"),
)


UNATTRIBUTED = "unknown: the traces do not name the group of each call"


def _named_role(desc: str) -> str | None:
    return next((role for pattern, role in DESC_ROLES if desc and pattern.search(desc)), None)


def role_of(desc: str, ranks: Sequence[int], world: int, ops: Mapping[str, int], fsdp: bool = False) -> str:
    """`fsdp`: the job shards with FSDP (gloo has no reduce-scatter, so FSDP's gradient
    reduction shows as all-reduce there)."""
    named = _named_role(desc)
    if named:
        return named
    names = " ".join(ops)
    if not ops:
        return "no traffic in the window"  # nothing says what it is for
    if "all_gather" in names and ("reduce_scatter" in names or (fsdp and "all_reduce" in names)):
        return "FSDP shard"
    if "send" in names or "recv" in names:
        return "pipeline-parallel"
    size = len(ranks)
    if size and size == world:
        return "data-parallel" if "all_reduce" in names else "all ranks"
    if size > 1:
        steps = {b - a for a, b in zip(ranks, ranks[1:])}
        if steps == {1} and "all_reduce" in names:
            return "tensor-parallel"
        if len(steps) == 1 and "all_reduce" in names:
            return "data-parallel (replicas)"
    return "unknown"


def process_groups(
    traces: Mapping[int, Any], collectives: Sequence[Collective], world: int, fsdp: bool = False
) -> list[ProcessGroup]:
    configs: dict[str, dict[str, Any]] = {}
    for t in traces.values():
        for pg in getattr(t, "pg_config", ()):
            key = f"{pg['name']}:{pg['desc']}" if pg.get("desc") else str(pg["name"])
            configs.setdefault(key, pg)
    ops: dict[str, dict[str, int]] = defaultdict(dict)
    total: dict[str, float] = defaultdict(float)
    wait: dict[str, float] = defaultdict(float)
    for c in collectives:
        ops[c.process_group][c.op] = ops[c.process_group].get(c.op, 0) + c.calls
        total[c.process_group] += c.total_us
        wait[c.process_group] += c.wait_us
    # calls the traces do not name a group for (gloo's annotations): any configured group may
    # have carried them, so one without named calls is not said to have had no traffic
    unnamed = any(k.startswith("?") for k in ops)
    out = []
    for key in sorted(set(configs) | set(ops)):
        cfg = configs.get(key, {})
        ranks = list(cfg.get("ranks") or [])
        name, _, desc = key.partition(":")
        out.append(
            ProcessGroup(
                name=name,
                desc=cfg.get("desc") or desc,
                role=(UNATTRIBUTED if unnamed and key not in ops and not _named_role(cfg.get("desc") or desc)
                      else role_of(cfg.get("desc") or desc, ranks or list(range(world)) if not cfg else ranks, world,
                                   ops.get(key, {}), fsdp)),
                size=cfg.get("size") or (len(ranks) or None),
                ranks=ranks,
                ops=dict(sorted(ops.get(key, {}).items())),
                total_us=total.get(key, 0.0),
                wait_us=wait.get(key, 0.0),
            )
        )
    return out
