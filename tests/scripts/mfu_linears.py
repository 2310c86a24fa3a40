"""A training job whose FLOPs are counted by hand, for the MFU tests: DDP (gloo) under
torchrun, 4 x Linear(512, 512) on batches of 64 feature vectors (the input needs no
gradient), SGD. With --checkpoint, layers 1 and 2 run under torch.utils.checkpoint
(non-reentrant): their forward runs again in backward.

Per step and rank, by hand: forward 4 x 2 x 64 x 512 x 512 = 134,217,728 FLOPs; backward
the weight and input gradients of every layer but the first's input gradient:
7 x 33,554,432 = 234,881,024; with --checkpoint, one more forward product recomputed
(non-reentrant checkpointing stops before the second: it has every tensor it needs).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

BATCH, DIM, LAYERS = 64, 512, 4


class Linears(torch.nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(DIM, DIM) for _ in range(LAYERS))
        self.checkpointed = checkpointed

    def middle(self, h: torch.Tensor) -> torch.Tensor:
        return self.layers[2](self.layers[1](h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](x)
        h = checkpoint(self.middle, h, use_reentrant=False) if self.checkpointed else self.middle(h)
        return self.layers[3](h)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--checkpoint", action="store_true")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo")
    model: torch.nn.Module = Linears(args.checkpoint)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * args.steps, DIM))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    for (x,) in loader:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return 0


if __name__ == "__main__":
    from gloo_exit import shutdown

    code = main()
    shutdown()
    sys.exit(code)
