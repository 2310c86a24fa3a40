"""Time all_reduce at a few sizes on the job's ranks, after the job.

`pardiag run` starts this file with torchrun (same number of processes per node and the
same backend as the job, the job's Python) when the run's own all_reduce calls are too
alike in size to fit a latency/bandwidth curve::

    torchrun --standalone --nproc-per-node N comm_sweep.py --backend gloo --out OUT.json \
        --sizes 262144,1048576,... --budget-s 15

After a warm-up of every size, rounds over all sizes of barrier + all_reduce, each rank
timing its own call (a burst of other work on the host then slows every size alike); a
call's transfer time is the shortest across the ranks (the last to arrive waited least),
and a size's time is the median over rounds. The rounds (3 to 20) fit the budget; the
largest sizes are left out when not even 3 rounds of them fit. Rank 0 writes {backend, world_size, points: [{bytes, us, n}],
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

MAX_ROUNDS = 20
MIN_ROUNDS = 3


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

    # warm-up: every size twice (buffers, connections), and how long one call of each takes
    bufs = [torch.ones(max(1, size // 4), dtype=torch.float32, device=device) for size in sizes]
    one = []
    for x in bufs:
        dist.barrier()
        for _ in range(2):
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
        one.append(agreed(time.perf_counter() - t0, dist.ReduceOp.MAX))
    # keep the sizes of which MIN_ROUNDS rounds fit the budget left (smallest first)
    left = a.budget_s - (time.perf_counter() - started)
    keep = 0
    while keep < len(bufs) and sum(one[:keep + 1]) * MIN_ROUNDS <= left:
        keep += 1
    bufs, one = bufs[:max(keep, 1)], one[:max(keep, 1)]
    rounds = int(agreed(max(1, min(MAX_ROUNDS, int(left / max(sum(one), 1e-6)))), dist.ReduceOp.MIN))
    # rounds over all sizes, so that a burst of other work on the host slows every size alike
    times = torch.zeros(rounds, len(bufs), dtype=torch.float64)
    for r in range(rounds):
        for i, x in enumerate(bufs):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times[r, i] = time.perf_counter() - t0
    times = times.to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MIN)  # per call, the rank that waited least
    times = times.cpu()
    points = [{"bytes": x.numel() * 4, "us": statistics.median(times[:, i].tolist()) * 1e6, "n": rounds}
              for i, x in enumerate(bufs)]
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
