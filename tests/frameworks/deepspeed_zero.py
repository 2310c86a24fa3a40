"""DeepSpeed ZeRO stage 2 on the CPU (DS_ACCELERATOR=cpu, gloo), started by the deepspeed
launcher. The model's optimizer is a torch AdamW handed to deepspeed.initialize (no
compiled DeepSpeed op needed); the job counts optimizer steps with engine.global_steps."""

from __future__ import annotations

import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader, DistributedSampler

from common import RandomRegression, Record, mlp, shutdown


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage}, "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000, "wall_clock_breakdown": False,
    }
    engine, _opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    data = RandomRegression(8 * world * args.steps)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    record = Record(rank)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        record.loss(loss)
    record.done(engine.global_steps, world_size=world, zero_stage=args.stage, version=deepspeed.__version__)


if __name__ == "__main__":
    main()
    shutdown()
