"""Lightning Fabric: Fabric(accelerator="cpu", devices=2, strategy="ddp"), fabric.launch()
starts the second rank. A plain loop over fabric.setup()'s model, optimizer and
DataLoader; the job counts its own optimizer steps."""

from __future__ import annotations

import argparse

import torch
from lightning.fabric import Fabric
from lightning.fabric import __version__ as fabric_version
from torch.utils.data import DataLoader

from common import RandomRegression, Record, mlp, shutdown


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(RandomRegression(8 * 2 * args.steps), batch_size=8))
    record = Record(fabric.global_rank)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        steps += 1
        record.loss(loss)
    record.done(steps, world_size=fabric.world_size, version=fabric_version)


if __name__ == "__main__":
    main()
    shutdown()
