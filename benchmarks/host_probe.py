"""What kind of host an accuracy table was measured on: whether one CPU's torch work
slows another's, and how much the host's speed moved while the table was recorded.

A 2-rank job on CPUs runs one rank per CPU, and the estimates take each rank's measured
operators as its own. Where two CPUs share their vector units (two threads of one core,
which a virtual machine need not say), a change that moves one rank's work would move
the other's speed too, which no trace shows. The probe times it, in processes of its own:

* ``matmul_us``: a 256x256 float32 matrix multiply, one thread pinned to one CPU, alone
  (the median of rounds);
* ``beside_us``: the same while a second process pinned to another CPU multiplies
  matrices in a loop (timed once that process is pinned and running: one that is still
  importing torch shares the first CPU, and the multiply then reads 2x slower);
  ``slowdown`` = beside_us / matmul_us, 1.0 where the CPUs do not share (the 2-CPU host
  of the README's tables: 0.98-1.05x).

Taken at the start and the end of a benchmark, the two ``matmul_us`` give the host's drift;
``speed_us`` (the multiply alone) is taken before, between and after the two jobs of each
pair: how far the host's speed moved under it (with --steady, the pair is recorded again
when it moved more than that).
Linux only (CPU affinity); None elsewhere or with one CPU.

    python benchmarks/host_probe.py      # prints the probe as JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

SIZE = 256
ROUNDS = 7
CALLS = 200

_TIMER = """
import os, statistics, time, torch
torch.set_num_threads(1)
os.sched_setaffinity(0, [CPU])
a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
for _ in range(20):
    a @ b
rounds = []
for _ in range(ROUNDS):
    t0 = time.perf_counter()
    for _ in range(CALLS):
        a @ b
    rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
print(statistics.median(rounds))
""".replace("SIZE", str(SIZE)).replace("ROUNDS", str(ROUNDS)).replace("CALLS", str(CALLS))

_HOG = """
import os, torch
torch.set_num_threads(1)
os.sched_setaffinity(0, [CPU])
x = torch.randn(SIZE, SIZE)
print("ready", flush=True)
while True:
    x @ x
""".replace("SIZE", str(SIZE))


def _cpus() -> list[int] | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus if len(cpus) >= 2 else None


def _time_on(cpu: int, python: str) -> float:
    out = subprocess.run([python, "-c", _TIMER.replace("CPU", str(cpu))], capture_output=True, text=True,
                         timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def speed_us(python: str = sys.executable) -> float | None:
    """``matmul_us`` alone (about 3 s, torch's import included): the host's speed right
    now, taken between the jobs of a pair; None where the probe cannot run."""
    cpus = _cpus()
    if cpus is None:
        return None
    try:
        return round(_time_on(cpus[0], python), 1)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def probe(python: str = sys.executable) -> dict[str, Any] | None:
    """The probe's figures (module docstring), or None where it cannot run."""
    cpus = _cpus()
    if cpus is None:
        return None
    a, b = cpus[0], cpus[1]
    try:
        alone = _time_on(a, python)
        hog = subprocess.Popen([python, "-c", _HOG.replace("CPU", str(b))], stdout=subprocess.PIPE, text=True)
        try:
            assert hog.stdout is not None
            hog.stdout.readline()  # the hog runs before the timing starts
            time.sleep(0.2)
            beside = _time_on(a, python)
        finally:
            hog.kill()
            hog.wait()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return {"cpus": [a, b], "matmul_us": round(alone, 1), "beside_us": round(beside, 1),
            "slowdown": round(beside / alone, 2) if alone > 0 else None}


def words(start: dict[str, Any] | None, end: dict[str, Any] | None) -> str | None:
    """One line for a table's foot: the slowdown (the start's probe) and the drift from
    the start's matmul time to the end's."""
    if start is None:
        return None
    line = (f"host: a {SIZE}x{SIZE} float32 matmul on CPU {start['cpus'][0]} took {start['matmul_us']:.0f} us alone, "
            f"{start['beside_us']:.0f} us while CPU {start['cpus'][1]} multiplied matrices ({start['slowdown']:.2f}x)")
    if end is not None and start["matmul_us"] > 0:
        drift = 100 * (end["matmul_us"] / start["matmul_us"] - 1)
        line += f"; alone it took {start['matmul_us']:.0f} us at the start, {end['matmul_us']:.0f} at the end ({drift:+.0f}%)"
    return line


if __name__ == "__main__":
    print(json.dumps(probe(), indent=2))
