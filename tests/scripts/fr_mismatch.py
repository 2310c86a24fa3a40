"""Ranks call different collectives: every step both ranks all-reduce the 16 gradients
of a linear layer, but in step 2 rank 1 all-gathers 8 of them instead. Flight recorder:
collective #3 is an all_reduce of [16] floats on rank 0 and an all_gather of [8] into
[2, 8] on rank 1; neither completes, both time out after the 5 s collective timeout.
(Ranks that all-reduce different sizes abort inside gloo instead: no Python exception,
no dump.)"""

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
        if rank == 1 and step == 2:
            dist.all_gather([torch.empty(8), torch.empty(8)], grads[:8])
        else:
            dist.all_reduce(grads)
        opt.step()
        opt.zero_grad()
finally:
    shutdown()
