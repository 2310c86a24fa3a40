"""Plain torch under torchrun: torch.compile over a DistributedDataParallel model (gloo).
--backend picks the compile backend (inductor by default)."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from common import RandomRegression, Record, mlp, shutdown


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
    record = Record(rank)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
        record.loss(loss)
    record.done(steps, world_size=world, compile_backend=args.backend, version=torch.__version__)


if __name__ == "__main__":
    main()
    shutdown()
