"""Hugging Face Accelerate: Accelerator(gradient_accumulation_steps=2), a loop under
accelerator.accumulate(model). The job counts optimizer steps itself: one per micro-batch
after which Accelerate synchronised the gradients (accelerator.sync_gradients)."""

from __future__ import annotations

import argparse

import accelerate
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from common import RandomRegression, Record, mlp, shutdown


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=2)
    args = p.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.accum, cpu=True)
    set_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    n = 8 * args.accum * args.steps * accelerator.num_processes
    loader = DataLoader(RandomRegression(n), batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    record = Record(accelerator.process_index)
    steps = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        record.loss(loss)
        if accelerator.sync_gradients:
            steps += 1
    record.done(steps, micro_batches=record.losses, world_size=accelerator.num_processes,
                distributed_type=str(accelerator.distributed_type), version=accelerate.__version__)


if __name__ == "__main__":
    main()
    shutdown()
