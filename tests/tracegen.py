"""Small Kineto-format traces written by tests, with numbers chosen to check by hand.

These are raw profiler events and files, the input the analyzers parse; pardiag's own
objects (ranks, Analyses, run directories) are built by `factories`. Two writers: one as
`torch.profiler` exports a CPU job (with its process-group config), one as Kineto lays
out a GPU trace (one event per line, metadata around the list), with the launch events
HTA needs."""

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


# -- a CPU rank's step ---------------------------------------------------------------------

DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def cpu_rank(gloo_start: float, gloo_dur: float) -> list[dict[str, Any]]:
    """One step, 1000-2000 us, on the loop's thread 1; gloo's thread is 9."""
    return [
        x("ProfilerStep#5", 1000, 1000, cat="user_annotation"),
        x(DL, 1000, 100, cat="user_annotation"),
        x("aten::stack", 1020, 60),
        x("aten::linear", 1100, 300),
        x("aten::addmm", 1150, 200),
        x("autograd::engine::evaluate_function: AddmmBackward0", 1450, 250),
        x("gloo:all_reduce", gloo_start, gloo_dur, tid=9, cat="user_annotation",
          **{"Input Dims": [[1000]], "Input type": ["float"]}),
        x("Optimizer.step#SGD.step", 1900, 50, cat="user_annotation"),
        x("aten::add_", 1900, 40),
    ]


# -- GPU traces as Kineto writes them, with what HTA reads ---------------------------------


def write_kineto_trace(path: Path, events: list[dict[str, Any]], *, rank: int = 0,
                       layout: str = "kineto", trailing: dict[str, Any] | None = None) -> Path:
    """Write events as Kineto does (one event per line, metadata around the list),
    or as ``json.dumps`` does (one line); ``.gz`` paths are gzipped."""
    head = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                     "world_size": 2}}
    tail = {"traceName": "synthetic", "baseTimeNanoseconds": 1700000000000000000}
    tail.update(trailing or {})
    if layout == "kineto":
        text = ("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in head.items())
                + '  "traceEvents": [\n' + ",\n".join("  " + json.dumps(e) for e in events)
                + "\n  ]" + "".join(f',\n  "{k}": {json.dumps(v)}' for k, v in tail.items())
                + "\n}\n")
    else:
        text = json.dumps({**head, "traceEvents": events, **tail})
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def meta_events() -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "x"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 0, "dur": 1000, "args": {"Op count": 0}},
        {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 3, "cat": "ac2g", "name": "ac2g",
         "bp": "e"},
    ]


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1,
            "tid": 1, "ts": ts, "dur": dur, "args": {"External id": n}}


def cpu_op(name: str, ts: float, dur: float, ext: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {"External id": ext, "Record function id": 0}}


def launch(corr: int, ts: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
            "ts": ts, "dur": 1, "args": {"External id": 1, "cbid": 211, "correlation": corr}}


def launched_kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7,
                    cat: str = "kernel") -> dict[str, Any]:
    """A kernel with the launch fields HTA reads (External id, grid, block); `corr` matches `launch`."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"External id": 1, "device": 0, "stream": stream, "correlation": corr,
                     "grid": [1, 1, 1], "block": [128, 1, 1]}}


# -- two gloo ranks for the replay: worked-out timings -------------------------------------


def gloo_replay_rank(sleep_us: float = 0.0, arrive_us: float = 2210.0, coll_end_us: float = 2710.0,
                     dataloader_us: tuple[float, ...] = (), wake_us: float | None = None) -> list[dict[str, Any]]:
    """One rank's step on thread 1 (gloo's worker is thread 9), starting at 0:
    [DataLoader fetches, each followed by a 10 us aten::stack], `sleep_us` of host gap, forward 1000 us, backward 1200 us,
    c10d::allreduce_ 10 us, the worker's `gloo:all_reduce` from `arrive_us` to
    `coll_end_us`, the loop waking 20 us after it (or at `wake_us`), the optimizer 100 us."""
    t = 0.0
    ev: list[dict[str, Any]] = []
    for d in dataloader_us:
        ev += [x(DL, t, d, cat="user_annotation"), x("aten::stack", t + d, 10.0)]
        t += d + 10
    t += sleep_us
    ev += [x("aten::linear", t, 1000.0), x("autograd::engine::evaluate_function: AddmmBackward0", t + 1000, 1200.0)]
    t += 2200
    ev.append(x("c10d::allreduce_", t, 10.0, **{"External id": 1}))
    ev.append(x("gloo:all_reduce", arrive_us, coll_end_us - arrive_us, tid=9, cat="user_annotation",
                **{"Input Dims": [[1000]], "Input type": ["float"]}))
    wake = coll_end_us + 20 if wake_us is None else wake_us
    ev += [x("Optimizer.step#SGD.step", wake, 100.0, cat="user_annotation"), x("aten::add_", wake, 100.0)]
    return [x("ProfilerStep#1", 0.0, wake + 100, cat="user_annotation"), *ev]



def shifted(events: list[dict[str, Any]], by: float) -> list[dict[str, Any]]:
    """The events moved ``by`` us later."""
    return [{**e, "ts": float(e["ts"]) + by} for e in events]


def slow_forward(events: list[dict[str, Any]], extra_us: float) -> list[dict[str, Any]]:
    """A one-step rank of ``gloo_replay_rank`` whose forward lasts ``extra_us`` longer:
    everything after it, and the step, that much later."""
    out = []
    for e in events:
        e = dict(e)
        if e["name"] == "aten::linear":
            e["dur"] = float(e["dur"]) + extra_us
        elif e["name"] == "ProfilerStep#1":
            e["dur"] = float(e["dur"]) + extra_us
        elif float(e["ts"]) >= 1000.0:
            e["ts"] = float(e["ts"]) + extra_us
        out.append(e)
    return out


def two_steps(first: list[dict[str, Any]], second: list[dict[str, Any]], at: float) -> list[dict[str, Any]]:
    """Two profiled steps of one rank: ``second`` (a one-step rank, as ``gloo_replay_rank``
    makes) moved to ``at`` as step 2."""
    out = list(first)
    for e in shifted(second, at):
        if e["name"] == "ProfilerStep#1":
            e = {**e, "name": "ProfilerStep#2"}
        elif "External id" in e.get("args", {}):
            e = {**e, "args": {**e["args"], "External id": 2}}
        out.append(e)
    return out

# -- counts worked out from a real trace --------------------------------------------------------


def matmul_flops_by_torch(path: Path) -> tuple[float, int]:
    """The trace's matrix products inside its ProfilerSteps, each counted by torch's own
    flop_counter on meta tensors of the recorded shapes: (FLOPs, profiled steps). For a
    trace whose matrix products are all aten::mm, aten::addmm or aten::bmm, none nested in
    another (linear and matmul call them), as in the sampled GPU fixture."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    ops = {"aten::mm": torch.ops.aten.mm, "aten::addmm": torch.ops.aten.addmm, "aten::bmm": torch.ops.aten.bmm}
    total = 0
    with FlopCounterMode(display=False) as fc:
        for e in events:
            if e.get("cat") == "cpu_op" and e["name"] in ops and lo <= e["ts"] < hi:
                dims = e["args"]["Input Dims"]
                tensors = [torch.empty(d, device="meta") for d in dims[:3] if d]
                ops[e["name"]](*tensors)
        total = fc.get_total_flops()
    return float(total), len(steps)


def same_trace(a: Any, b: Any) -> None:
    """Two loaded traces (`pardiag.analyzers.trace.Trace`) are the same, column for column:
    what each reader of the same file must give."""
    import numpy as np

    assert a.names == b.names and a.cats == b.cats
    for table in ("gpu", "cpu", "launches", "memory"):
        ta, tb = getattr(a, table), getattr(b, table)
        for col in ta.__dataclass_fields__:
            assert np.array_equal(getattr(ta, col), getattr(tb, col)), (table, col)
    assert (a.steps, a.collectives, a.flop_ops, a.n_events, a.ts_fractional, a.min_ts_us) == (
        b.steps, b.collectives, b.flop_ops, b.n_events, b.ts_fractional, b.min_ts_us)
    assert (a.distributed, a.device_properties, a.base_time_ns) == (
        b.distributed, b.device_properties, b.base_time_ns)
