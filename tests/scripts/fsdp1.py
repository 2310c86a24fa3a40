"""FSDP1 on gloo (CPU), every object built with keyword arguments only; prints each
step's loss exactly (repr) so runs with and without pardiag can be compared bitwise."""

import gc

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

dist.init_process_group(backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(in_features=64, out_features=64) for _ in range(3)])
fsdp = FullyShardedDataParallel(module=model, device_id=torch.device("cpu"),
                                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=True)
opt = torch.optim.SGD(params=fsdp.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(1 + dist.get_rank())
for step in range(6):
    loss = fsdp(torch.randn(8, 64, generator=gen)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        print(f"loss {step} {loss.item()!r}", flush=True)
# gloo (torch 2.13) can abort at exit when its threads outlive the interpreter: end the
# group once nothing holds it
del fsdp, model, opt, loss
gc.collect()
dist.destroy_process_group()
