"""Collector options passed from `pardiag run` to every rank through one environment
variable (JSON), so the launcher and the ranks cannot disagree on defaults."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ENV_CONFIG = "PARDIAG_CONFIG"


@dataclass(frozen=True)
class ProfileSchedule:
    """Steps are counted from 0 (the first optimizer step of the process).

    ``wait`` steps run unprofiled, then ``warmup`` steps with the profiler warming up
    (not recorded), then ``active`` steps recorded into the trace. One window per run.
    """

    wait: int = 5
    warmup: int = 2
    active: int = 3

    @property
    def first_active(self) -> int:
        return self.wait + self.warmup

    @property
    def end(self) -> int:
        """Number of completed steps after which the trace is complete."""
        return self.wait + self.warmup + self.active

    @classmethod
    def parse(cls, text: str) -> "ProfileSchedule":
        """'WAIT,WARMUP,ACTIVE' (e.g. '5,2,3')."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"--profile-steps wants WAIT,WARMUP,ACTIVE as three whole numbers, got {text!r}"
            )
        wait, warmup, active = (int(p) for p in parts)
        if active < 1:
            raise ValueError("--profile-steps: ACTIVE must be at least 1")
        return cls(wait, warmup, active)


@dataclass(frozen=True)
class CollectorConfig:
    schedule: ProfileSchedule = field(default_factory=ProfileSchedule)
    profile: bool = True
    ranks: tuple[int, ...] | None = None  # None: every rank is profiled
    record_shapes: bool = True
    with_stack: bool = False
    # record allocations: None (the default) on a CPU-only job, where the CPU allocator keeps
    # no count and the profiler's events are the only way to the activations (no cost
    # measured on the bundled example: 1.03x against 1.12x without, 4 runs each); off on a
    # GPU, where the CUDA allocator's counts give them (collectors/device_memory.py)
    profile_memory: bool | None = None
    meta_sample_steps: int = 3  # steps during which forward hooks look at autocast
    profile_on_slowdown: bool = True  # one more window when the job slows down (collectors/slowdown.py)

    def profiles_rank(self, rank: int) -> bool:
        return self.profile and (self.ranks is None or rank in self.ranks)

    def to_env(self) -> str:
        d = asdict(self)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "CollectorConfig":
        raw = (environ if environ is not None else os.environ).get(ENV_CONFIG)
        if not raw:
            return cls()
        d: dict[str, Any] = json.loads(raw)
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if "schedule" in d:
            d["schedule"] = ProfileSchedule(**d["schedule"])
        if d.get("ranks") is not None:
            d["ranks"] = tuple(int(r) for r in d["ranks"])
        return cls(**d)


def parse_ranks(text: str) -> tuple[int, ...]:
    """'0,3,8-11' -> (0, 3, 8, 9, 10, 11)."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ValueError(f"--ranks: bad range {part!r} (use e.g. 0-3)")
            out.update(range(int(lo), int(hi) + 1))
        elif part.isdigit():
            out.add(int(part))
        else:
            raise ValueError(f"--ranks: {part!r} is not a rank number")
    if not out:
        raise ValueError("--ranks: no ranks given")
    return tuple(sorted(out))
