"""Small Kineto-format traces written by tests, with numbers chosen to check by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def kernel(name: str, ts: float, dur: float, stream: int = 7, correlation: int = 1, cat: str = "kernel", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": correlation, "device": 0, **args}}


def write_trace(path: Path, events: list[dict[str, Any]], rank: int | None = 0, world: int = 2,
                backend: str = "gloo") -> Path:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    if rank is not None:
        doc["distributedInfo"] = {
            "backend": backend, "rank": rank, "world_size": world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": f"cpu:{backend}",
                           "pg_size": world, "ranks": list(range(world))}],
        }
    doc["traceEvents"] = events
    text = json.dumps(doc, indent=1)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path
