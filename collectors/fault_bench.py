"""Time what a minor page fault of fresh memory costs on this host: what a process pays
again in every step for memory its allocator handed back to the kernel (gradients freed
by ``zero_grad(set_to_none=True)`` and allocated afresh by the next backward).

`pardiag run` starts this file after the job, with the job's own Python::

    python fault_bench.py SPEC.json OUT.json

SPEC: ``mb`` (the block written, default 16), ``repeats``. Each repeat maps a fresh
anonymous block, writes every byte of it once (the kernel faults each page in, zeroed)
and again (no faults), and takes the difference of the two over the faults counted
(``getrusage`` minor faults, as steps.jsonl counts them: with transparent huge pages a
fault can bring in more than a page). The median over the repeats is the cost per fault.
The cost grows with the block (on a 2-CPU x86_64 host, one minute: 1.23 us per fault at
8 MB, 1.28 at 16, 1.49 at 32, 1.61 at 64, 1.64 at 128): 16 MB, a large layer's gradient
(a 2048x2048 float32 one), is the default; the comm_bound jobs' own steps said 1.08 and
1.29 us where a rank faulted its two such gradients in some steps and not in others.
Only the standard library is imported; one thread writes, as a training thread does.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import resource
import statistics
import sys
import time
from typing import Any


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def one(size: int) -> tuple[float, int, float, float]:
    """(us per fault, faults, us writing fresh, us writing again) of one fresh block."""
    m = mmap.mmap(-1, size)
    buf = (ctypes.c_char * size).from_buffer(m)
    addr = ctypes.addressof(buf)
    f0 = _faults()
    t0 = time.perf_counter()
    ctypes.memset(addr, 1, size)
    fresh = time.perf_counter() - t0
    faults = _faults() - f0
    t0 = time.perf_counter()
    ctypes.memset(addr, 2, size)
    again = time.perf_counter() - t0
    del buf
    m.close()
    return (fresh - again) * 1e6 / max(faults, 1), faults, fresh * 1e6, again * 1e6


def main(spec_path: str, out_path: str) -> int:
    started = time.perf_counter()
    spec: dict[str, Any] = json.loads(open(spec_path).read())
    size = max(int(spec.get("mb") or 16), 1) << 20
    repeats = max(int(spec.get("repeats") or 15), 1)
    one(size)  # the first block also maps the pages ctypes and mmap touch
    runs = [one(size) for _ in range(repeats)]
    doc = {"us_per_fault": statistics.median(r[0] for r in runs),
           "faults": statistics.median(r[1] for r in runs),
           "pages": size // mmap.PAGESIZE, "page_bytes": mmap.PAGESIZE, "bytes": size, "repeats": repeats,
           "fresh_us": statistics.median(r[2] for r in runs), "again_us": statistics.median(r[3] for r in runs),
           "each_us_per_fault": [round(r[0], 4) for r in runs], "seconds": time.perf_counter() - started}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
