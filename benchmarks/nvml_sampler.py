"""What does the NVML sampler cost? CPU time of its thread per sample and per second.

Runs the real sampler (`pardiag.collectors.nvml.start_sampler`) at 10 Hz for a few
seconds and reads its own accounting (`time.thread_time_ns` and wall time around
every sample, in the sampling thread):

  fake  the fake NVML of tests/collectors/test_nvml.py (1 and 8 GPUs). Its queries cost next to
        nothing, so the figure is pardiag's own work per sample: Python, JSON,
        buffering, the writes.
  nvml  the real NVML, when a GPU is present: driver calls included. The wall time
        per sample shows NVML's latency; the largest sample is one that read PCIe
        throughput (about 20 ms a direction). A second table times each query.

    python benchmarks/nvml_sampler.py                      # 5 s per row
    python benchmarks/nvml_sampler.py --seconds 10 --gpus 1,8,16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pardiag.collectors import nvml  # noqa: E402
from pardiag.collectors.nvml_metrics import METRICS, error_text  # noqa: E402
from pardiag.rundir import RunDir  # noqa: E402


def measure(backend: Any, seconds: float, interval_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pardiag-nvml-bench-") as tmp:
        started = nvml.start_sampler(RunDir(Path(tmp)), interval_s, nvml=backend)
        if started.sampler is None:
            return {"error": started.status.get("reason")}
        time.sleep(seconds)
        status: dict[str, Any] = started.sampler.stop()
        return status


def row(label: str, st: dict[str, Any]) -> str:
    if st.get("error") or not st.get("samples"):
        return f"{label:<28} {'—':>5}  {st.get('error') or st.get('reason')}"
    n, dur = st["samples"], st["duration_s"]
    cpu_us_s = st["cpu_us_per_sample"] * n / dur
    return (f"{label:<28} {st['gpus']:>5} {n:>8} {st['cpu_us_per_sample']:>12.1f} {st['cost_us_per_sample']:>12.1f} "
            f"{st['max_us_per_sample']:>12.1f} {cpu_us_s / 1e3:>10.2f} {cpu_us_s / 1e4:>8.3f}")


def real_nvml_present() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        ok = pynvml.nvmlDeviceGetCount() > 0
        pynvml.nvmlShutdown()
        return pynvml if ok else None
    except Exception:
        return None


def per_query(pynvml: Any, repeats: int = 20) -> list[tuple[str, float | None, str]]:
    """Median wall µs of each query the sampler makes, on GPU 0."""
    out: list[tuple[str, float | None, str]] = []
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for m in METRICS:
            times = []
            try:
                for _ in range(repeats):
                    t0 = time.perf_counter_ns()
                    m.readers[0](pynvml, h)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                out.append((m.name, statistics.median(times), ""))
            except Exception as e:
                out.append((m.name, None, error_text(e)))
    finally:
        pynvml.nvmlShutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="sampling time per row")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between samples (0.1 = 10 Hz)")
    ap.add_argument("--gpus", default="1,8", help="GPU counts of the fake, comma-separated")
    args = ap.parse_args(argv)

    from test_nvml import FakeGpu, make_fake

    hz = 1 / args.interval
    print(f"NVML sampler cost at {hz:g} Hz, {args.seconds:g} s per row")
    print("fake = the FAKE NVML of tests/collectors/test_nvml.py: no driver calls; pardiag's own work plus the fake's "
          "Python stand-ins for pynvml's wrappers")
    print(f"{'backend':<28} {'gpus':>5} {'samples':>8} {'cpu µs/smp':>12} {'wall µs/smp':>12} "
          f"{'max wall µs':>12} {'cpu ms/s':>10} {'% core':>8}")
    for n in (int(x) for x in args.gpus.split(",") if x.strip()):
        gpus = [FakeGpu(f"GPU-00000000-0000-4000-8000-{i:012x}") for i in range(n)]
        print(row("fake", measure(make_fake(gpus), args.seconds, args.interval)))
    real = real_nvml_present()
    if real is None:
        print(row("nvml (real)", {"error": nvml.probe().get("reason")}))
        return 0
    print(row("nvml (real)", measure(real, args.seconds, args.interval)))
    print("\nreal NVML, median wall µs per query on GPU 0 (20 calls each)")
    for name, us, err in per_query(real):
        print(f"  {name:<14} {f'{us:,.1f}' if us is not None else '—':>10}  {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
