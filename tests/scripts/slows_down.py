"""A small DDP job of STEPS steps (default 90), BASE_MS of sleep per step (default 10);
from step SLOW_FROM on (default 20), rank 1 sleeps 30 ms more per step (the job slowed
down)."""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(32, 64)
for step in range(int(os.environ.get("STEPS", "90"))):
    if step >= int(os.environ.get("SLOW_FROM", "20")) and dist.get_rank() == 1:
        time.sleep(0.03)
    time.sleep(float(os.environ.get("BASE_MS", "10")) / 1000)
    m(x).sum().backward(); opt.step(); opt.zero_grad()
dist.destroy_process_group()
