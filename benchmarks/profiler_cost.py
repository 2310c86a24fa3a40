"""What does each torch.profiler setting cost per step, on the bundled example's model?

In one process with one thread (as each rank of `pardiag demo` runs), the example's
Transformer classifier (examples/train_ddp.py, its default sizes, fp32, AdamW) trains
in blocks of --steps steps: a block without the profiler, then a block under
torch.profiler with a setting (CPU activity, as pardiag records on a CPU; the schedule
pardiag uses: warm-up steps, then recorded ones), then without again, settings in turn.
Per block the median step time; a setting's ratio is its recorded steps' median over the
median of the unprofiled blocks on either side (so drift of a busy machine cancels).
Printed per setting: the median ratio over the repetitions and its range, the operator
events recorded per step and the extra time per event. No DDP and no gloo: this is the
profiler's host-side cost alone (`benchmarks/inflation.py` measures the job's own
figure, end to end).

    python benchmarks/profiler_cost.py                   # every setting, 5 repetitions
    python benchmarks/profiler_cost.py --reps 9 --settings shapes,no_shapes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from train_ddp import Classifier, SyntheticTokens, parse_args  # noqa: E402

WARMUP = 2  # pardiag's default warm-up steps (--profile-steps 5,2,3)

# setting -> torch.profiler keyword arguments
SETTINGS: dict[str, dict[str, Any]] = {
    "shapes": {"record_shapes": True},  # pardiag's default
    "no_shapes": {"record_shapes": False},
    "shapes_stack": {"record_shapes": True, "with_stack": True},
    "shapes_memory": {"record_shapes": True, "profile_memory": True},
    # torch's own FLOP estimate per operator (mm, addmm, bmm, baddbmm, conv2d, mul, add): pardiag
    # counts FLOPs from the recorded shapes instead (analyzers/flop_rules.py) and does not turn it
    # on: torch 2.13 keeps the estimate in the in-memory events (`event.flops`) and writes none
    # of it into the exported trace that pardiag reads. Kept to show what it would cost
    "shapes_flops": {"record_shapes": True, "with_flops": True},
}


def make_step() -> Callable[[], None]:
    a = parse_args([])
    torch.manual_seed(a.seed)
    net = Classifier(a.vocab, a.d_model, a.heads, a.layers, a.seq_len, a.classes)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr)
    data = SyntheticTokens(a.dataset_size, a.seq_len, a.vocab, a.classes, a.seed)
    batches = [torch.utils.data.default_collate([data[i] for i in range(j, j + a.batch_size)])
               for j in range(0, a.batch_size * 8, a.batch_size)]
    loss_fn = nn.CrossEntropyLoss()
    i = 0

    def step() -> None:
        nonlocal i
        tokens, labels = batches[i % len(batches)]
        i += 1
        loss_fn(net(tokens), labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def plain_block(step: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profiled_block(step: Callable[[], None], n: int, kwargs: dict[str, Any]) -> tuple[float, float]:
    """(median recorded step, operator events per recorded step)."""
    times: list[float] = []
    counted: list[int] = []

    def ready(prof: Any) -> None:  # the events are cleared when the cycle ends
        counted.append(sum(1 for e in prof.events() if e.device_type.name == "CPU"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=WARMUP, active=n),
                 on_trace_ready=ready, **kwargs) as prof:
        for k in range(WARMUP + n):
            t0 = time.perf_counter()
            step()
            prof.step()  # at the step's end, as pardiag's boundary does
            if k >= WARMUP:
                times.append(time.perf_counter() - t0)
    return statistics.median(times), (counted[0] if counted else 0) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    p.add_argument("--steps", type=int, default=10, help="steps per block (default 10)")
    a = p.parse_args(argv)
    names = [s.strip() for s in a.settings.split(",") if s.strip()]
    if not names or any(s not in SETTINGS for s in names) or a.reps < 1 or a.steps < 3:
        print(f"error: --settings of {', '.join(SETTINGS)}; --reps >= 1; --steps >= 3", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    step = make_step()
    plain_block(step, a.steps)  # warm the allocator and the caches
    ratios: dict[str, list[float]] = {s: [] for s in names}
    extra_us: dict[str, list[float]] = {s: [] for s in names}
    events: dict[str, list[float]] = {s: [] for s in names}
    plain_ms: list[float] = []
    for r in range(a.reps):
        before = plain_block(step, a.steps)
        for s in names:
            prof, ev = profiled_block(step, a.steps, SETTINGS[s])
            after = plain_block(step, a.steps)
            base = (before + after) / 2
            ratios[s].append(prof / base)
            extra_us[s].append((prof - base) * 1e6 / ev if ev else 0.0)
            events[s].append(ev)
            plain_ms.append(base * 1e3)
            print(f"[{r + 1}/{a.reps}] {s}: {prof / base:.3f}x", file=sys.stderr, flush=True)
            before = after
    rows = [["setting", "x (median)", "x (range)", "events/step", "extra us/event"]]
    for s in names:
        rows.append([s, f"{statistics.median(ratios[s]):.3f}", f"{min(ratios[s]):.3f}-{max(ratios[s]):.3f}",
                     f"{statistics.median(events[s]):.0f}", f"{statistics.median(extra_us[s]):.2f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                    for row in rows))
    print(f"(unprofiled step: median {statistics.median(plain_ms):.1f} ms; {a.reps} repetitions of "
          f"{a.steps}-step blocks, one thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
