"""Plain torch under torchrun: FSDP2 (fully_shard) on gloo, every layer and the root
sharded over the 2 ranks."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from common import RandomRegression, shutdown, train_regression


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = RandomRegression(8 * world * args.steps, dim=64, out=64)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    train_regression(model, opt, loader, rank, world)


if __name__ == "__main__":
    main()
    shutdown()
