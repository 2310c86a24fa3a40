"""Plain torch under torchrun: DDP, optimizer, sampler and DataLoader built with keyword
arguments only, as many scripts do (DistributedDataParallel(module=model, ...))."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from common import RandomRegression, Record, mlp, shutdown


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed=0)
    model = DistributedDataParallel(module=mlp(), bucket_cap_mb=1)
    opt = torch.optim.SGD(params=model.parameters(), lr=0.05, momentum=0.9)
    data = RandomRegression(n=8 * world * args.steps)
    loader = DataLoader(dataset=data, batch_size=8, sampler=DistributedSampler(dataset=data, shuffle=False))
    record = Record(rank)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(input=model(x), target=y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        record.loss(loss)
    record.done(steps, world_size=world, version=torch.__version__)


if __name__ == "__main__":
    main()
    shutdown()
