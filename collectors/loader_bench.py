"""Time how long a DataLoader's worker processes take to hand a ready batch to the
training loop, at the job's input shape, and what loading in workers adds to the host's
CPU time per batch: what the loop still pays per batch once loading runs in workers, and
what the workers burn beside it on the cores the ranks compute on.

`pardiag run` starts this file after the job, with the job's own Python (which has torch;
pardiag's environment may not)::

    python loader_bench.py SPEC.json OUT.json

SPEC: ``shape`` and ``dtype`` of the batch's first tensor (meta.json ``inputs.first``),
``workers``, ``budget_s``. The dataset holds rows of that shape less its first dimension,
with an int64 label each, and the loader makes batches of ``shape[0]`` rows with the
default collate, as a map-style dataset does: a worker collates into shared memory and
puts the batch on its queue; the loop takes it off and rebuilds the tensors. After the
workers have started and made a few batches each, the loop sleeps `GAP_S` before each
``next()`` so that the next batch is ready, as it is when the workers keep ahead of the
step (or twice the time the batch takes to make, for a batch that takes longer than
that); the median of those ``next()`` calls is the hand-over. The batch made in the loop
itself, with no workers, is timed first: that is the time to make one.

CPU time: the loop's own per ``next()`` (``thread_time``), with and without workers, and
the workers' per batch (``/proc/<pid>/task/*/schedstat`` of each worker over the timed batches,
Linux; else not measured). ``cpu_us``, the workers' and the loop's with workers less the
loop's without, is what moving the loading into workers adds to the host per batch
(collating into shared memory, pickling, the queue and the file descriptors' passing):
the loading itself the job's loop already burned. Only torch and the standard library are
imported: it runs in a process of its own, never inside the job.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

GAP_S = 0.005  # the loop's own work between two batches (at least): the workers have one ready
MAX_SAMPLES = 60
MIN_SAMPLES = 9
PRIMED = 3  # batches each worker makes before the timing: a forked worker's first ones copy its pages
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


class Rows(Dataset):  # type: ignore[type-arg]
    """``n`` samples of ``shape`` (a batch's shape less its first dimension), each with a
    label: views of one batch's ``rows`` rows, so that it holds a single batch in memory."""

    def __init__(self, n: int, rows: int, shape: list[int], dtype: torch.dtype) -> None:
        self.n = n
        self.x = torch.zeros([rows, *shape], dtype=dtype)
        self.y = torch.zeros(rows, dtype=torch.int64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i % len(self.y)], self.y[i % len(self.y)]


@dataclass
class Timed:
    wall_us: list[float] = field(default_factory=list)  # each timed next()
    loop_cpu_us: list[float] = field(default_factory=list)  # the loop's CPU time in each
    workers_cpu_us: float | None = None  # the workers' CPU time per batch over the timed ones


def _cpu_ns(pid: int) -> int | None:
    """A process's CPU time so far, all its threads (a worker sends each batch's file
    descriptors from threads of their own: 9-13% of its CPU over 60 batches), None where /proc does not
    say."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total
    except (OSError, ValueError, IndexError):
        return None


def _workers_ns(it: Any) -> int | None:
    times = [_cpu_ns(w.pid) for w in getattr(it, "_workers", None) or () if isinstance(getattr(w, "pid", None), int)]
    if not times or None in times:
        return None
    return sum(t for t in times if t is not None)


def time_next(workers: int, shape: list[int], dtype: torch.dtype, deadline: float, gap_s: float) -> Timed:
    """The timed ``next()`` calls (the workers' start and first batches untimed)."""
    rows = shape[0] if shape and shape[0] > 0 else 1
    kw: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    primed = PRIMED * workers + 1
    data = Rows(rows * (MAX_SAMPLES + primed + 2 * workers + 1), rows, list(shape[1:]), dtype)
    loader = DataLoader(data, batch_size=rows, num_workers=workers, **kw)
    out = Timed()
    it = iter(loader)
    for _ in range(primed):
        next(it)
    time.sleep(0.2)  # every worker up and ahead
    w0 = _workers_ns(it) if workers else None
    for _ in range(MAX_SAMPLES):
        if len(out.wall_us) >= MIN_SAMPLES and time.perf_counter() > deadline:
            break
        time.sleep(gap_s)
        c, t = time.thread_time_ns(), time.perf_counter()
        next(it)
        out.wall_us.append((time.perf_counter() - t) * 1e6)
        out.loop_cpu_us.append((time.thread_time_ns() - c) / 1e3)
    w1 = _workers_ns(it) if w0 is not None else None
    if w0 is not None and w1 is not None and out.wall_us:
        # the workers made as many batches as the loop took: they stay the same number ahead
        out.workers_cpu_us = (w1 - w0) / 1e3 / len(out.wall_us)
    del it
    return out


def main(spec_path: str, out_path: str) -> int:
    started = time.perf_counter()
    spec = json.loads(open(spec_path).read())
    shape = [int(d) for d in spec["shape"]]
    dtype = DTYPES.get(str(spec.get("dtype")), torch.float32)
    workers = max(int(spec.get("workers") or 2), 1)
    budget = float(spec.get("budget_s") or 4.0)
    torch.set_num_threads(1)
    inline = time_next(0, shape, dtype, started + budget * 0.2, GAP_S)
    gap = max(GAP_S, 2e-6 * statistics.median(inline.wall_us))
    handed = time_next(workers, shape, dtype, started + budget, gap)
    h = handed.wall_us
    loop_cpu, inline_cpu = statistics.mean(handed.loop_cpu_us), statistics.mean(inline.loop_cpu_us)
    doc = {"handover_us": statistics.median(h), "p90_us": sorted(h)[int(0.9 * (len(h) - 1))],
           "inline_us": statistics.median(inline.wall_us), "samples": len(h), "workers": workers, "shape": shape,
           "dtype": str(dtype).removeprefix("torch."), "gap_s": gap, "torch": torch.__version__,
           "loop_cpu_us": loop_cpu, "inline_cpu_us": inline_cpu, "workers_cpu_us": handed.workers_cpu_us,
           "cpu_us": (max(loop_cpu + handed.workers_cpu_us - inline_cpu, 0.0)
                      if handed.workers_cpu_us is not None else None),
           "seconds": time.perf_counter() - started}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
