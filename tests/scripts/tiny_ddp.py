"""A small training script for tests: DDP (gloo) under torchrun, or one process.

Model: 6 x Linear(256, 256) = 6 x 65,792 float32 parameters = 1,579,008 bytes,
so with --bucket-cap-mb 1 DDP's rebuilt buckets hold 4 layers (1,052,672 bytes, the
first size to reach 1 MiB) and then 2 layers (526,336 bytes).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--no-optimizer", action="store_true", help="manual SGD + pardiag.step()")
    p.add_argument("--accum", type=int, default=1)
    args = p.parse_args()

    torch.manual_seed(0)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 256))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=0)
    opt = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)

    step = 0
    micro = 0
    for (x,) in loader:
        if step == args.crash_step and rank == args.crash_rank:
            raise RuntimeError(f"planted crash on rank {rank} at step {step}")
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
        micro += 1
        last_micro = micro % args.accum == 0
        if distributed and not last_micro:
            with model.no_sync():
                model(x).pow(2).mean().backward()
            continue
        model(x).pow(2).mean().backward()
        if not last_micro:
            continue
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            with torch.no_grad():
                for prm in model.parameters():
                    prm -= 0.01 * prm.grad
                    prm.grad = None
            import pardiag

            pardiag.step()
        step += 1
        if step >= args.steps:
            break
    print(f"rank {rank} done after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    from gloo_exit import shutdown

    code = main()
    shutdown()
    sys.exit(code)
