"""Memory by category (analyzers/memory.py): the allocator's events of a profiled step,
worked by hand; the rank's block from meta.json facts and steps.jsonl samples; the
device probe of the collector (collectors/device_memory.py) with a reader standing in
for the CUDA allocator's count."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pardiag.analyzers.memory import rank_memory, trace_memory
from pardiag.analyzers.trace import MemoryEvents
from pardiag.collectors.device_memory import EVERY, FIRST, DeviceMemoryProbe
from pardiag.collectors.framework import StepCounters
from pardiag.rank_meta import parse_meta

MB = 2**20


def events(rows: list[tuple[float, int, int]], device: int = 0) -> MemoryEvents:
    """(ts, bytes, total after) rows."""
    ts, b, tot = zip(*rows)
    n = len(rows)
    return MemoryEvents(np.array(ts, dtype=float), np.array(b, dtype=np.int64), np.array(tot, dtype=np.int64),
                        np.zeros(n, dtype=np.int64), np.full(n, device, dtype=np.int64))


def test_a_step_by_hand() -> None:
    # step 3 runs from 0 to 100; 5,000 bytes held when it starts (the total before the
    # first event); zero_grad frees 1,000; forward keeps 300 + 200 and frees a 100-byte
    # temporary; backward starts at 40, allocates 2,000 of gradients and frees 400 of
    # activations. Step 4 (100-200) allocates nothing and has no backward.
    mem = events([(5, -1000, 4000), (10, 300, 4300), (20, 200, 4500), (30, -100, 4400),
                  (50, 2000, 6400), (60, -400, 6000)])
    got = trace_memory(mem, [(3, 0.0, 100.0), (4, 100.0, 200.0)], np.array([40.0, 45.0]))
    assert got is not None and got["device"] == "cpu" and got["events"] == 6
    # base: the lowest total before backward (4,000 after zero_grad); at 40: 4,400
    assert got["steps"]["3"] == {"activations": 400, "peak": 2400, "growth": 1000}
    assert got["steps"]["4"] == {"peak": 0, "growth": 0}  # nothing allocated, no backward
    assert got["activations_bytes"] == 400 and got["peak_above_start_bytes"] == 2400
    assert got["growth_per_step_bytes"] == 500  # the median of 1,000 and 0


def test_the_device_s_events_are_taken_over_the_host_s() -> None:
    host = events([(10, 999, 999)], device=0)
    cuda = events([(10, 64, 64), (30, 16, 80)], device=1)
    mem = MemoryEvents(*(np.concatenate([getattr(host, f), getattr(cuda, f)])
                         for f in ("ts_us", "nbytes", "total_allocated", "total_reserved", "device_type")))
    got = trace_memory(mem, [(0, 0.0, 50.0)], np.array([20.0]))
    assert got is not None and got["device"] == "cuda" and got["activations_bytes"] == 64


def test_no_events_no_block() -> None:
    empty = events([(0, 0, 0)])
    empty = MemoryEvents(*(getattr(empty, f)[:0] for f in ("ts_us", "nbytes", "total_allocated", "total_reserved",
                                                            "device_type")))
    assert trace_memory(empty, [(0, 0.0, 1.0)], np.array([])) is None


def meta(device: dict[str, Any], bucket_view: bool = False, grad_bytes: int = 100 * MB) -> Any:
    return parse_meta({
        "format": "pardiag.rank-meta", "format_version": 2, "rank": 0,
        "parameters": {"local_bytes": 100 * MB, "trainable_bytes": 100 * MB, "grad_bytes": grad_bytes},
        "optimizers": [{"class": "AdamW", "state_bytes": 200 * MB}],
        "ddp": [{"gradient_as_bucket_view": bucket_view, "bucket_sizes_bytes": [25 * MB, 25 * MB, 50 * MB]}],
        "device": device,
    }, "meta.json")


GPU = {"type": "cuda", "total_memory_bytes": 80 * 1024 * MB, "max_memory_allocated_bytes": 1000 * MB,
       "max_memory_reserved_bytes": 1500 * MB}


def test_a_gpu_rank_by_category() -> None:
    m = rank_memory(meta(GPU), None, acts=[300 * MB, 320 * MB, 310 * MB], dev_alloc=[500 * MB, 520 * MB],
                    rss_mb=[2000.0])
    assert m is not None and m["device"] == "cuda"
    # gradients: one per trainable parameter (100 MB) and DDP's bucket copy (100 MB)
    assert m["peak"] == {"parameters": 100 * MB, "gradients": 200 * MB, "optimizer_state": 200 * MB,
                         "activations": 310 * MB, "other": 1000 * MB - 810 * MB, "total": 1000 * MB}
    # steady: the allocator at the step's end (510 MB) less parameters, the gradients held
    # then (100 MB and the buckets' 100 MB) and the optimizer state
    assert m["steady"] == {"parameters": 100 * MB, "gradients": 200 * MB, "optimizer_state": 200 * MB,
                           "activations": 0.0, "other": 10 * MB, "total": 510 * MB}
    assert (m["reserved"], m["allocated"], m["capacity"]) == (1500 * MB, 1000 * MB, 80 * 1024 * MB)
    assert m["rss_steady"] == 2000 * MB and m["rss_peak"] is None  # no host maxrss in this meta
    with_rss = rank_memory(meta({**GPU, "host_max_rss_bytes": 3000 * MB}), None, acts=[], dev_alloc=[], rss_mb=[])
    assert with_rss is not None and with_rss["rss_peak"] == 3000 * MB
    assert "3 sampled steps" in m["sources"]["activations"]


def test_gradients_as_bucket_views_are_counted_once_and_unknown_stays_unknown() -> None:
    m = rank_memory(meta(GPU, bucket_view=True), None, acts=[], dev_alloc=[], rss_mb=[])
    assert m is not None
    assert m["peak"]["gradients"] == 100 * MB and m["sources"]["gradients"] == "one per trainable parameter"
    # no activations measured: they and "other" are unknown, not zero
    assert m["peak"]["activations"] is None and m["peak"]["other"] is None
    assert m["steady"]["total"] is None and m["steady"]["activations"] is None


def test_a_cpu_rank_reports_rss_and_the_profiler_s_activations() -> None:
    cpu = {"type": "cpu", "total_memory_bytes": 12 * 1024 * MB, "memory_is_host_share": True,
           "max_memory_reserved_bytes": 900 * MB}  # on a CPU the collector stores maxrss there
    prof = {"device": "cpu", "events": 10, "activations_bytes": 131_080, "peak_above_start_bytes": 4 * MB,
            "growth_per_step_bytes": 0, "steps": {"7": {"activations": 131_080, "peak": 4 * MB, "growth": 0}}}
    m = rank_memory(meta(cpu, grad_bytes=0), prof, acts=[], dev_alloc=[], rss_mb=[800.0, 810.0, 805.0])
    assert m is not None and m["device"] == "cpu"
    assert (m["rss_peak"], m["rss_steady"]) == (900 * MB, 805 * MB)
    assert m["peak"]["activations"] == 131_080 and m["peak"]["total"] is None and m["peak"]["other"] is None
    assert m["steady"]["gradients"] == 100 * MB  # none held at the boundary, the buckets stay
    assert "1 profiled steps" in m["sources"]["activations"] and m["profiled"]["activations_bytes"] == 131_080


def test_nothing_known_is_no_block() -> None:
    assert rank_memory(None, None, acts=[], dev_alloc=[], rss_mb=[]) is None


class Reader:
    """The allocator's count: `values` in turn."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.values.pop(0)


def test_the_probe_samples_every_16th_step() -> None:
    p = DeviceMemoryProbe(lambda where, e: None)
    # base at the boundary (1,000), at the DDP forward after zero_grad (800), before the
    # first backward (1,300), at the step's end (900); a second forward or backward of
    # the same step reads nothing
    p._read = Reader([1000, 800, 1300, 900])
    c = StepCounters()
    sampled = []
    for step in range(FIRST + EVERY + 1):
        p.start_step(step)
        sampled.append(p.sampled)
        if step == FIRST:
            p.at_forward()
            p.at_forward()
            p.at_backward(c)
            p.at_backward(c)
            p.end_step(c)
            assert (c.act_bytes, c.act_seen, c.dev_alloc_bytes, c.dev_alloc_seen) == (500, 1, 900, 1)
            p._read = Reader([7] * 4)
    assert [s for s, on in enumerate(sampled) if on] == [FIRST, FIRST + EVERY]


def test_a_failing_read_stops_the_probe_once() -> None:
    errors: list[str] = []
    p = DeviceMemoryProbe(lambda where, e: errors.append(f"{where}: {e}"))

    def broken() -> int:
        raise RuntimeError("no device")

    p._read = broken
    for step in range(FIRST, FIRST + 3 * EVERY):
        p.start_step(step)
    assert p.off and not p.armed and errors == ["device_memory: no device"]


def test_on_a_cpu_the_probe_reads_nothing() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    p = DeviceMemoryProbe(lambda where, e: None)
    p.start_step(FIRST)
    c = StepCounters()
    p.at_forward()
    p.at_backward(c)
    p.end_step(c)
    assert not p.sampled and (c.act_seen, c.dev_alloc_seen) == (0, 0)


# -- the levers that read the categories ------------------------------------------------

def _levers(a: Any) -> dict[str, Any]:
    from pardiag.analyzers.rules import advise

    return {f.lever: f for f in advise(a).findings}


def test_sharding_counts_the_measured_gradients() -> None:
    """10 GB of parameters with Adam (20 GB of state) and a 76 GB peak on 80 GB, 8 ranks.
    Gradients as many bytes as the parameters: ZeRO-1 leaves 10 + 10 + 20/8 = 22.5 GB. DDP's
    bucket copy measured (20 GB of gradients): ZeRO-1 leaves 10 + 20 + 2.5 = 32.5 GB, still
    under 60% of 80; the evidence says the gradients were measured, and the activations."""
    from dataclasses import replace

    from factories import GB, analysis, rank

    fw = {"parameters": {"local_bytes": 10 * GB}, "optimizers": [{"state_bytes": 20 * GB}],
          "device": {"total_memory_bytes": 80 * GB}, "peak_memory_reserved_bytes_max": 76 * GB}
    plain = _levers(analysis([rank(i, compute=0.8) for i in range(8)], fw))["sharding"]
    assert "gradients 10.00," in plain.evidence[0] and "22.50 GB" in plain.evidence[-1]
    mem = {"peak": {"parameters": 10 * GB, "gradients": 20 * GB, "optimizer_state": 20 * GB,
                    "activations": 30 * GB}}
    ranks = [replace(rank(i, compute=0.8), memory=mem) for i in range(8)]
    f = _levers(analysis(ranks, fw))["sharding"]
    assert "ZeRO-1" in f.title and "gradients 20.00 measured" in f.evidence[0]
    assert "model state 50.00 GB" in f.evidence[0] and "32.50 GB" in f.evidence[-1]
    assert any("activations 30.00 GB" in e and "checkpointing" in e for e in f.evidence)
    # freed per rank over 8: 7/8 of 20 GB of state; of 40 with the gradients; of all 50
    assert any("ZeRO-1 17.50 GB" in e and "ZeRO-2 35.00 GB" in e and "ZeRO-3 43.75 GB" in e for e in f.evidence)


def test_batch_size_says_how_much_larger_a_batch_fits() -> None:
    """80 GB device, 20 GB peak reserved, GPU busy 30%. Activations 10 GB of a 20 GB peak
    allocated: (0.9 x 80 - 10) / 10 = 6.2x fits. Activations 35 GB of a 40 GB peak:
    (72 - 5) / 35 = 1.9x: a batch twice as large does not fit, no finding."""
    from dataclasses import replace

    from factories import GB, analysis, rank

    def run(act: float, alloc: float) -> Any:
        fw = {"device": {"total_memory_bytes": 80 * GB}, "peak_memory_reserved_bytes_max": 20 * GB}
        mem = {"peak": {"activations": act}, "allocated": alloc, "capacity": 80 * GB}
        return _levers(analysis([replace(rank(0, compute=0.3), memory=mem)], fw))

    f = run(10 * GB, 20 * GB)["batch_size"]
    assert any("a batch up to 6.2x as large fits under 90% of its 80 GB" in e for e in f.evidence), f.evidence
    assert "batch_size" not in run(35 * GB, 40 * GB)
    assert "batch_size" in _levers(analysis([rank(0, compute=0.3)], {"device": {"total_memory_bytes": 80 * GB},
                                                                      "peak_memory_reserved_bytes_max": 20 * GB}))


def test_batch_size_takes_the_gpu_busy_time_from_the_kernels() -> None:
    """gloo on CUDA tensors: 30% of the window is exposed communication on the host
    (gloo's threads), 10% compute; the kernels keep the GPU busy 10% of their span
    (HTA's idle 90 of 100 ms), so the finding says 10%, not the breakdown's 40%. Without a
    gpu block the breakdown's share stands; a GPU 60% busy by its kernels gets no finding."""
    from dataclasses import replace

    from factories import GB, analysis, rank
    from pardiag.analysis import GpuTime

    fw = {"device": {"total_memory_bytes": 80 * GB}, "peak_memory_reserved_bytes_max": 20 * GB}
    r = rank(0, compute=0.1, comm_exposed=0.3)

    def gpu(idle_us: float) -> GpuTime:
        return GpuTime(span_us=100_000.0, compute_us=100_000.0 - idle_us, comm_us=0.0, overlap_us=0.0,
                       memory_us=0.0, idle_us=idle_us)

    f = _levers(analysis([replace(r, gpu=gpu(90_000.0))], fw))["batch_size"]
    assert f.title.startswith("the GPU is busy 10% of the step")
    assert _levers(analysis([r], fw))["batch_size"].title.startswith("the GPU is busy 40% of the step")
    assert "batch_size" not in _levers(analysis([replace(r, gpu=gpu(40_000.0))], fw))
