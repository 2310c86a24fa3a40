"""A DDP job (gloo, CPU) run with find_unused_parameters True or False, to measure what
the setting costs when every parameter is used.

With find_unused_parameters=True and no static graph, DDP does per step what it skips
otherwise: after forward it walks the autograd graph from the outputs
(`Reducer.prepare_for_backward(outputs)`, in the trace as
`torch.distributed.ddp.reducer::search_unused_parameters`), marks each parameter used
in its backward hook, all-reduces the map of used parameters once the last bucket is
ready (an int all_reduce of one element per parameter tensor), and reads the map back
per parameter before copying gradients out of the buckets. The model is deep and
narrow (many parameter tensors and autograd nodes, little arithmetic) so that this
bookkeeping is a visible part of the step.

    torchrun --nproc-per-node 2 find_unused.py --find-unused 1 --steps 40

--find-unused both: two copies of the model, one with each setting, stepped in turn
(even steps: False, odd steps: True), so that every step of one has neighbours of the
other taken under the same load (separate runs on a shared machine differ by more than
the setting costs); the ground truth for the setting's cost.
--unused-layer: the last layer is never used (find_unused_parameters=True is needed).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


class Net(torch.nn.Module):
    def __init__(self, layers: int, width: int, unused_layer: bool) -> None:
        super().__init__()
        mods: list[torch.nn.Module] = []
        for _ in range(layers):
            mods += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.GELU()]
        self.body = torch.nn.Sequential(*mods)
        self.spare = torch.nn.Linear(width, width) if unused_layer else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # self.spare, when there, gets no gradient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--find-unused", choices=("0", "1", "both"), required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--unused-layer", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)  # two ranks share the machine's cores
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    settings = [False, True] if args.find_unused == "both" else [args.find_unused == "1"]
    models = []
    for find_unused in settings:
        torch.manual_seed(0)
        # both: a process group each, so that the used-parameter map's all_reduce, which
        # DDP does not wait for, delays the next step of its own model, as it would alone
        group = dist.new_group() if len(settings) > 1 else None
        models.append(torch.nn.parallel.DistributedDataParallel(
            Net(args.layers, args.width, args.unused_layer), find_unused_parameters=find_unused, process_group=group
        ))
    # one optimizer, so that every optimizer step ends one step of pardiag's record; it
    # skips the parameters of the copy that did not run (their gradients are None)
    opt = torch.optim.SGD([prm for m in models for prm in m.parameters()], lr=1e-3)
    x = torch.randn(args.batch, args.width)

    times: dict[bool, list[float]] = {s: [] for s in settings}
    for step in range(args.steps):
        find_unused, model = settings[step % len(models)], models[step % len(models)]
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        times[find_unused].append(time.perf_counter() - t0)
    if rank == 0:
        for s, ts in times.items():
            ts.sort()
            print(f"find_unused={int(s)} median step {ts[len(ts) // 2] * 1e6:.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    from gloo_exit import shutdown

    code = main()
    shutdown()
    sys.exit(code)
