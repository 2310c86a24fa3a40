"""Plain torch under torchrun: torch.compile over a DistributedDataParallel model (gloo).
--backend picks the compile backend (inductor by default)."""

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
    p.add_argument("--backend", default="inductor")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.compile(DDP(mlp()), backend=args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = RandomRegression(8 * world * args.steps)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    train_regression(model, opt, loader, rank, world, compile_backend=args.backend)


if __name__ == "__main__":
    main()
    shutdown()
