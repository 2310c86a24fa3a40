"""A 2-rank DDP job (gloo, CPU) in which one rank sleeps a fixed time before each
forward pass: the ground truth for the straggler's estimated saving (run it with and
without the sleep, compare the steps).

Model: 4 x Linear(512, 512), batch 64; no DataLoader (the batches are made in the loop).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep-rank", type=int, default=1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512)
    for _ in range(args.steps):
        if rank == args.sleep_rank and args.sleep_ms > 0:
            time.sleep(args.sleep_ms / 1000)  # host work outside torch operators
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
