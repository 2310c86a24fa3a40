"""What pardiag's per-step hooks cost outside the profiler window, measured where it
can be resolved: in one process, on a dispatch-bound loop (a tiny MLP, about 1 ms
per step) where a few microseconds per step are visible. The collector is installed
exactly as `pardiag run` installs it (sitecustomize on PYTHONPATH), with the profiler
off, against the same loop without it; runs alternate and the median of medians is
compared.

The cost per step then gives the expected outside-window ratio of any job:
1 + cost / step time (printed for the example's ~65 ms step on this machine).

    python benchmarks/hook_cost.py              # 5 alternating pairs, 3000 steps each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = r"""
import json, sys, time, torch
torch.manual_seed(0); torch.set_num_threads(1)
m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4096, 64)), batch_size=8)
times, last, n = [], None, int(sys.argv[1])
while len(times) < n:
    for (x,) in data:
        m(x).sum().backward(); opt.step(); opt.zero_grad()
        now = time.perf_counter()
        if last is not None: times.append(now - last)
        last = now
        if len(times) >= n: break
times = sorted(times[200:])
print(json.dumps({"median_us": times[len(times) // 2] * 1e6}))
"""


def one(steps: int, with_pardiag: bool, run_dir: Path) -> float:
    env = dict(os.environ)
    env.pop("PARDIAG_RUN_DIR", None)
    if with_pardiag:
        from pardiag import rundir
        from pardiag.collectors.config import CollectorConfig
        from pardiag.envsetup import build_env

        env = build_env(env, rundir.RunDir(run_dir), CollectorConfig(profile=False), nccl_log=False).env
    out = subprocess.run([sys.executable, "-c", LOOP, str(steps)], env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_us"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--reference-step-ms", type=float, default=65.0, help="a job's step time to project the ratio on")
    args = p.parse_args(argv)
    plain, hooked = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for w in order:
                v = one(args.steps, w, Path(tmp) / f"r{i}")
                (hooked if w else plain).append(v)
    p50_plain, p50_hooked = statistics.median(plain), statistics.median(hooked)
    cost = p50_hooked - p50_plain
    print(f"tiny-MLP step, median of {args.pairs} runs x {args.steps} steps:")
    print(f"  plain        {p50_plain:8.1f} us   runs: {', '.join(f'{v:.0f}' for v in plain)}")
    print(f"  with pardiag {p50_hooked:8.1f} us   runs: {', '.join(f'{v:.0f}' for v in hooked)}")
    print(f"  ratio {p50_hooked / p50_plain:.3f}; pardiag's cost {cost:.1f} us per step")
    ref = args.reference_step_ms * 1000
    print(f"  projected outside-window ratio for a {args.reference_step_ms:g} ms step: {(ref + cost) / ref:.4f} (target <= 1.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
