"""Does torch.profiler slow backward more when micro-batches accumulate gradients?

One process, no DDP: examples/scenarios/comm_bound.py's model (an MLP 1024 -> 2048 x3 ->
10, batch 2, bf16 autocast, SGD), trained in steps of ACCUM micro-batches (gradients set
to None after each optimizer step). Blocks of steps without and with torch.profiler
alternate; the script prints the median backward time per micro-batch of each, their
ratio, and the operators that took most of the profiled time. Compare `--accum 1` with
`--accum 4`: the gradient-accumulation estimate of a run that does not accumulate cannot
see a slowdown that appears only once it does.

    python benchmarks/profiler_accumulation.py --accum 4
    python benchmarks/profiler_accumulation.py --accum 1 --no-shapes
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step (default 4)")
    p.add_argument("--no-shapes", action="store_true", help="profile without record_shapes")
    p.add_argument("--blocks", type=int, default=6, help="blocks of each kind, alternating (default 6)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per block (default 4)")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    dims = [1024, 2048, 2048, 2048]
    layers: list[torch.nn.Module] = []
    for i, o in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, dims[0])

    def step() -> float:
        """One optimizer step; the mean backward time of its micro-batches (s)."""
        spent = 0.0
        for _ in range(a.accum):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().sum() / a.accum
            t = time.perf_counter()
            loss.backward()
            spent += time.perf_counter() - t
        opt.step()
        opt.zero_grad(set_to_none=True)
        return spent / a.accum

    for _ in range(5):
        step()
    plain: list[float] = []
    profiled: list[float] = []
    prof = None
    for _ in range(a.blocks):
        plain += [step() for _ in range(a.steps)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=not a.no_shapes) as prof:
            profiled += [step() for _ in range(a.steps)]
    p50, q50 = statistics.median(plain) * 1e3, statistics.median(profiled) * 1e3
    print(f"accum {a.accum}, shapes {'off' if a.no_shapes else 'on'}: backward per micro-batch "
          f"{p50:.2f} ms plain, {q50:.2f} ms profiled, ratio {q50 / p50:.2f}")
    if prof is not None:
        print("most profiled time (last block):")
        for e in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:6]:
            print(f"  {e.key[:60]:60s} {e.count:5d} calls {e.cpu_time_total / 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
