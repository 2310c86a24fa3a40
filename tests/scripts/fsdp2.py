"""FSDP2 (fully_shard) on gloo: parameters sharded over 2 ranks, all-gathered for
forward and backward, gradients reduced."""

import gc

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(8):
    model(torch.randn(8, 128)).sum().backward()
    opt.step()
    opt.zero_grad()
# gloo (torch 2.13) can abort at exit when its threads outlive the interpreter: end the
# group once nothing holds it
del model, opt
gc.collect()
dist.destroy_process_group()
