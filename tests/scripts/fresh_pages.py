"""A one-process CPU training loop that takes 64 MiB of fresh memory in every step: a
block that size is mapped by glibc's allocator on each allocation and unmapped when
freed, so each step faults its 16,384 pages in again (about 20 ms of a step here).
With --keep the block is allocated once and reused: no faults after the first step."""

import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--keep", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = torch.empty(16 * 2**20) if a.keep else None
for _ in range(a.steps):
    block = kept if kept is not None else torch.empty(16 * 2**20)
    block.fill_(1.0)
    loss = model(torch.randn(8, 64)).sum() + block[:1].sum() * 0
    loss.backward()
    opt.step()
    opt.zero_grad()
    del block
