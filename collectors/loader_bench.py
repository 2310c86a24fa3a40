"""Time how long a DataLoader's worker processes take to hand a ready batch to the
training loop, at the job's input shape: what the loop still pays per batch once loading
runs in workers.

`pardiag run` starts this file after the job, with the job's own Python (which has torch;
pardiag's environment may not)::

    python loader_bench.py SPEC.json OUT.json

SPEC: ``shape`` and ``dtype`` of the batch's first tensor (meta.json ``inputs.first``),
``workers``, ``budget_s``. The batches are ready-made tensors of that shape with an int64
label per row (a dataset of whole batches, ``batch_size=None``), so a worker's own work
is a copy: what is timed is the hand-over (the worker puts the batch in shared memory and
on its queue; the loop takes it off and rebuilds the tensors). After the workers have
started, the loop sleeps `GAP_S` before each ``next()`` so that the next batch is ready,
as it is when the workers keep ahead of the step (or twice the time the batch takes to
make, for a batch that takes longer than that); the median of those ``next()`` calls is
the hand-over. The batch made in the loop itself, with no workers, is timed first: that
is the time to make one. Only torch and the standard library are imported: it runs in a process of
its own, never inside the job.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

GAP_S = 0.005  # the loop's own work between two batches (at least): the workers have one ready
MAX_SAMPLES = 60
MIN_SAMPLES = 9
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


class ReadyBatches(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, shape: list[int], dtype: torch.dtype) -> None:
        self.n = n
        self.x = torch.zeros(shape, dtype=dtype)
        self.y = torch.zeros(shape[0] if shape else 1, dtype=torch.int64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x.clone(), self.y.clone()


def time_next(workers: int, shape: list[int], dtype: torch.dtype, deadline: float, gap_s: float) -> list[float]:
    """Microseconds of each timed ``next()`` (the first one, the workers' start, untimed)."""
    kw: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    loader = DataLoader(ReadyBatches(MAX_SAMPLES + 2, shape, dtype), batch_size=None, num_workers=workers, **kw)
    out: list[float] = []
    it = iter(loader)
    next(it)
    time.sleep(0.2)  # every worker up and ahead
    for _ in range(MAX_SAMPLES):
        if len(out) >= MIN_SAMPLES and time.perf_counter() > deadline:
            break
        time.sleep(gap_s)
        t = time.perf_counter()
        next(it)
        out.append((time.perf_counter() - t) * 1e6)
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
    gap = max(GAP_S, 2e-6 * statistics.median(inline))
    handed = time_next(workers, shape, dtype, started + budget, gap)
    doc = {"handover_us": statistics.median(handed), "p90_us": sorted(handed)[int(0.9 * (len(handed) - 1))],
           "inline_us": statistics.median(inline), "samples": len(handed), "workers": workers, "shape": shape,
           "dtype": str(dtype).removeprefix("torch."), "gap_s": gap, "torch": torch.__version__,
           "seconds": time.perf_counter() - started}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
