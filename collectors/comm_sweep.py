"""Time all_reduce at a few sizes on the job's ranks, after the job.

`pardiag run` starts this file with torchrun (same number of processes per node and the
same backend as the job, the job's Python) when the run's own all_reduce calls are too
alike in size to fit a latency/bandwidth curve::

    torchrun --standalone --nproc-per-node N comm_sweep.py --backend gloo --out OUT.json \
        --sizes 262144,1048576,... --budget-s 15

For each size (smallest first): a warm-up, then repeats of barrier + all_reduce, each
rank timing its own call; the transfer time of a repeat is the shortest time across the
ranks (the last to arrive waited least), and the size's time is the median over
repeats. The number of repeats is cut so that the sweep fits its budget; sizes that do
not fit are left out. Rank 0 writes {backend, world_size, points: [{bytes, us, n}],
seconds}. Imports only torch and the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

MAX_REPEATS = 10
MIN_REPEATS = 3


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", required=True, help="bytes, comma-separated")
    p.add_argument("--budget-s", type=float, default=15.0)
    a = p.parse_args()
    started = time.perf_counter()
    sizes = sorted({int(s) for s in a.sizes.split(",") if s.strip()})
    cuda = a.backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(a.backend)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def agreed(value: float, op: dist.ReduceOp) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    points = []
    for i, size in enumerate(sizes):
        left = a.budget_s - (time.perf_counter() - started)
        per_size = left / (len(sizes) - i)
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)  # warm-up: buffers and connections for this size
        sync()
        one = agreed(time.perf_counter() - t0, dist.ReduceOp.MAX)
        fits = int(per_size / max(one, 1e-6))
        repeats = int(agreed(min(MAX_REPEATS, fits), dist.ReduceOp.MIN))
        if repeats < MIN_REPEATS and points:
            break  # larger sizes take longer still: the budget is spent
        mine = []
        for _ in range(max(repeats, 1)):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            mine.append(time.perf_counter() - t0)
        times = torch.tensor(mine, dtype=torch.float64, device=device)
        dist.all_reduce(times, op=dist.ReduceOp.MIN)  # per repeat, the rank that waited least
        points.append({"bytes": x.numel() * 4, "us": statistics.median(times.tolist()) * 1e6, "n": len(mine)})
        del x
    dist.barrier()
    if rank == 0:
        doc = {"backend": a.backend, "world_size": world, "device": device.type, "points": points,
               "seconds": time.perf_counter() - started}
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, a.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
