"""Rank 1 skips one gradient all-reduce: every step both ranks all-reduce the 16
gradients of a linear layer, but in step 3 rank 1 skips it and goes on to the barrier
that follows the loop. Flight recorder: collective #4 is an all_reduce of [16] floats on
rank 0 and a barrier on rank 1. Both time out after the 5 s collective timeout."""

import datetime

import torch
import torch.distributed as dist

from gloo_exit import shutdown

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
model = torch.nn.Linear(15, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(6):
        model(torch.randn(4, 15)).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if not (rank == 1 and step == 3):
            dist.all_reduce(grads)
        opt.step()
        opt.zero_grad()
        if rank == 1 and step == 3:
            break
    dist.barrier()
finally:
    shutdown()
