"""Rank 1 stops calling collectives at step 6 (sleeps past the 5 s collective timeout):
rank 0 times out waiting for it inside DDP's all-reduce."""

import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    if rank == 1 and step == 6:
        time.sleep(60)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
