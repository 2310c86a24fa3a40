"""Plain torch under torchrun: DDP fed by a DataLoader with 2 worker processes started
with the spawn method (the dataset comes from an importable module, as spawn needs)."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from common import mlp, RandomRegression, shutdown, train_regression


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = RandomRegression(8 * world * args.steps)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False),
                        num_workers=2, multiprocessing_context="spawn")
    train_regression(model, opt, loader, rank, world)


if __name__ == "__main__":
    main()
    shutdown()
