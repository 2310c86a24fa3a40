"""A DDP job (gloo) whose memory is counted by hand: Linear(256, 1024) -> ReLU ->
Linear(1024, 256) in float32, AdamW, a fixed batch of 32, loss = output.sum().

- parameters: (256 x 1024 + 1024 + 1024 x 256 + 256) x 4 = 2,102,272 bytes
- gradients: as many again, plus DDP's bucket buffer (one bucket under the 25 MB cap,
  gradient_as_bucket_view off): 4,204,544 bytes
- AdamW state: exp_avg and exp_avg_sq per parameter (4,204,544) and a float32 step per
  parameter tensor (4 x 4): 4,204,560 bytes
- activations held at backward: the ReLU's output, which the ReLU and the second
  Linear's matrix multiply save (32 x 1024 x 4 = 131,072 bytes), and the loss; the
  batch is made before the loop, the first Linear's pre-activation is freed in forward.
HOLD_RANK keeps HOLD_MIB MiB more on that rank (default: none).
"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 256)
held = torch.randn(int(os.environ.get("HOLD_MIB", "0")) * 2**18) if dist.get_rank() == int(os.environ.get("HOLD_RANK", "-1")) else None
for _ in range(int(os.environ.get("STEPS", "12"))):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
del model
dist.destroy_process_group()
