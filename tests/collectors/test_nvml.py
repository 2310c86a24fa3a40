"""NVML sampler, per-rank split, telemetry block and gpu_health findings.

This machine has no GPU, so the sampler runs against a fake with pynvml's interface:
module-level functions with the real signatures, the real library's NVMLError
classes, constants and ctypes result structures. Each query returns the next value of
a per-GPU sequence, so every number below can be worked out by hand.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
import types
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import pynvml
import pytest

from pardiag import rundir
from pardiag.analysis import Analysis, Straggler
from pardiag.analysis_blocks import telemetry_from_dict
from pardiag.rank_meta import RankMeta
from pardiag.run_info import RunInfo
from pardiag.analyzers.rules import RuleContext, ordered, run_rules
from pardiag.analyzers.telemetry import (
    CLOCK_EVENT_REASONS,
    decode_clock_events,
    telemetry_block,
)
from pardiag.collectors import nvml
from pardiag.collectors.nvml_metrics import METRICS, NVML_CALLS
from pardiag.collectors.nvml_sampler import MAX_CONSECUTIVE_FAILURES
from pardiag.collectors.telemetry_split import gpu_of_rank, split_by_rank
from pardiag.rundir import RunDir

def gpu_health_findings(block: dict[str, Any], stragglers: list[int]) -> list[dict[str, Any]]:
    """The registry's GPU health rows on a telemetry block (as analysis.json holds it), ordered as the Analysis orders
    them, as JSON; `stragglers` are the ranks the step-time analysis named."""
    named = [Straggler(rank=r, excess_us_per_step=0.0, cause="test", evidence=[]) for r in stragglers]
    ctx = RuleContext(Analysis(run=RunInfo(), ranks=[], collectives=[], stragglers=named), telemetry=telemetry_from_dict(block))
    return [asdict(f) for f in ordered(run_rules(ctx, family="telemetry"))]


GIB = 1024**3
UUID0 = "GPU-0a1b2c3d-0000-4000-8000-00000000000a"
UUID1 = "GPU-0a1b2c3d-1111-4000-8000-00000000000b"
HW_THERMAL, SW_THERMAL, SW_POWER, IDLE = 0x40, 0x20, 0x4, 0x1


# --------------------------------------------------------------------------- the fake


@dataclass
class FakeGpu:
    """The k-th call of a query on this GPU returns element k % len of its sequence."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util_gpu: Sequence[int] = (90,)
    util_mem: Sequence[int] = (40,)
    mem_used: Sequence[int] = (60 * GIB,)
    mem_total: int = 80 * GIB
    sm_clock: Sequence[int] = (1980,)
    sm_clock_max: int = 1980
    power_mw: Sequence[int] = (400_000,)
    power_limit_mw: int = 700_000
    temp_c: Sequence[int] = (60,)
    clock_events: Sequence[int] = (0,)
    pcie_tx_kBps: int = 2_000_000
    pcie_rx_kBps: int = 1_000_000
    nvlink_step_kib: int | None = 1 << 20  # counters grow 1 GiB a read; None: no NVLink
    unsupported: frozenset[str] = frozenset()  # functions that raise NVMLError_NotSupported
    failing: frozenset[str] = frozenset()  # functions that raise NVMLError_Unknown


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def make_fake(gpus: Sequence[FakeGpu], init_error: int | None = None, pcie_latency_s: float = 0.0) -> Any:
    """A module with pynvml's interface over `gpus`; `fake.calls` counts calls by name."""
    fake: Any = types.ModuleType("fake_pynvml")
    for name in dir(pynvml):
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "c_nvml")):
            setattr(fake, name, getattr(pynvml, name))
    calls: Counter[str] = Counter()
    per_gpu: Counter[tuple[str, int]] = Counter()
    state = {"init": 0}
    fake.calls, fake.state = calls, state

    def call_global(fn: str) -> None:
        calls[fn] += 1
        if fn not in ("nvmlInit", "nvmlShutdown") and state["init"] <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def call(fn: str, handle: _Handle) -> tuple[FakeGpu, int]:
        call_global(fn)
        g = gpus[handle.index]
        if fn in g.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in g.failing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        k = per_gpu[(fn, handle.index)]
        per_gpu[(fn, handle.index)] += 1
        return g, k

    def at(seq: Sequence[int], k: int) -> int:
        return seq[k % len(seq)]

    def nvmlInit() -> None:
        call_global("nvmlInit")
        if init_error is not None:
            raise pynvml.NVMLError(init_error)
        state["init"] += 1

    def nvmlShutdown() -> None:
        call_global("nvmlShutdown")
        state["init"] -= 1

    def nvmlDeviceGetCount() -> int:
        call_global("nvmlDeviceGetCount")
        return len(gpus)

    def nvmlSystemGetDriverVersion() -> str:
        call_global("nvmlSystemGetDriverVersion")
        return "560.35.03"

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        call_global("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        return call("nvmlDeviceGetUUID", handle)[0].uuid

    def nvmlDeviceGetName(handle: _Handle) -> str:
        return call("nvmlDeviceGetName", handle)[0].name

    def nvmlDeviceGetUtilizationRates(handle: _Handle) -> Any:
        g, k = call("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=at(g.util_gpu, k), memory=at(g.util_mem, k))

    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: Any = None) -> Any:
        g, k = call("nvmlDeviceGetMemoryInfo", handle)
        used = at(g.mem_used, k)
        return pynvml.c_nvmlMemory_t(total=g.mem_total, free=g.mem_total - used, used=used)

    def nvmlDeviceGetClockInfo(handle: _Handle, type: int) -> int:
        g, k = call("nvmlDeviceGetClockInfo", handle)
        if type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return at(g.sm_clock, k)

    def nvmlDeviceGetMaxClockInfo(handle: _Handle, type: int) -> int:
        g, _ = call("nvmlDeviceGetMaxClockInfo", handle)
        if type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.sm_clock_max

    def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
        g, k = call("nvmlDeviceGetPowerUsage", handle)
        return at(g.power_mw, k)

    def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
        return call("nvmlDeviceGetEnforcedPowerLimit", handle)[0].power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
        return call("nvmlDeviceGetPowerManagementLimit", handle)[0].power_limit_mw

    def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
        g, k = call("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return at(g.temp_c, k)

    def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
        g, k = call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return at(g.clock_events, k)

    def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
        g, k = call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return at(g.clock_events, k)

    def nvmlDeviceGetPcieThroughput(device: _Handle, counter: int) -> int:
        g, _ = call("nvmlDeviceGetPcieThroughput", device)
        time.sleep(pcie_latency_s)  # the real call measures over about 20 ms
        return g.pcie_tx_kBps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kBps

    def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: Sequence[Any]) -> Any:
        g, k = call("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            values[i].fieldId, values[i].scopeId = fid
            if g.nvlink_step_kib is None:  # NVML reports unsupported fields per value
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = (k + 1) * g.nvlink_step_kib
        return values

    for fn in list(locals().values()):
        if inspect.isfunction(fn) and fn.__name__.startswith("nvml"):
            setattr(fake, fn.__name__, fn)
    return fake


def healthy() -> FakeGpu:
    return FakeGpu(UUID0)


def throttled_and_slow() -> FakeGpu:
    return FakeGpu(UUID1, util_gpu=(60,), sm_clock=(1400,), clock_events=(HW_THERMAL,), mem_used=(79 * GIB,),
                   temp_c=(88,), power_mw=(690_000,))


def write_meta(run: RunDir, rank: int, host: str, device: dict[str, Any]) -> None:
    rundir.atomic_write_json(run.meta(rank), {
        "format": rundir.META_FORMAT, "format_version": rundir.META_VERSION,
        "host": host, "rank": rank, "local_rank": rank, "device": device,
    })


def cuda(index: int, uuid: str | None, cvd: str | None = None) -> dict[str, Any]:
    return {"type": "cuda", "index": index, "name": "NVIDIA H100 80GB HBM3", "uuid": uuid,
            "total_memory_bytes": 80 * GIB, "max_memory_allocated_bytes": 50 * GIB,
            "max_memory_reserved_bytes": 60 * GIB, "cuda_visible_devices": cvd}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def by_gpu(block: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {g["gpu"]: g for g in block["gpus"]}


# --------------------------------------------------------------------------- interface


def test_fake_and_sampler_use_only_real_pynvml_functions() -> None:
    fake = make_fake([healthy()])
    for name in NVML_CALLS:
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        r, f = inspect.signature(real).parameters, inspect.signature(getattr(fake, name)).parameters
        assert list(r) == list(f), name
        assert [p.default for p in r.values()] == [p.default for p in f.values()], name
    # cheap queries only: nothing that lists processes (reference/perf.md §3.1)
    assert not [n for n in NVML_CALLS if "Process" in n]


def test_clock_event_names_match_pynvml() -> None:
    for bit, name in CLOCK_EVENT_REASONS:
        const = "nvmlClocksThrottleReason" + "".join(w.capitalize() for w in name.split("_"))
        assert getattr(pynvml, const) == bit, const
    assert decode_clock_events(HW_THERMAL | SW_POWER | 0x1000) == ["sw_power_cap", "hw_thermal_slowdown", "bit_0x1000"]


# --------------------------------------------------------------------------- the thread


def test_sampler_thread_split_block_and_findings(tmp_path: Path) -> None:
    run, host = RunDir(tmp_path), rundir.hostname()
    write_meta(run, 0, host, cuda(0, UUID0))
    write_meta(run, 1, host, cuda(1, UUID1[4:]))  # torch's bare form of the UUID
    fake = make_fake([healthy(), throttled_and_slow()], pcie_latency_s=0.02)

    started = nvml.start_sampler(run, 0.05, nvml=fake)
    assert started.sampler is not None, started.status
    assert started.status["status"] == "ok" and started.status["gpus"] == 2
    time.sleep(0.5)
    t0 = time.monotonic()
    st = started.sampler.stop()
    assert time.monotonic() - t0 < 1.0
    assert st["status"] == "ok", st
    assert 5 <= st["samples"] <= 12
    assert st["gpus"] == 2 and st["errors"] == 0 and st["disabled"] == []
    assert st["cost_us_per_sample"] > 0 and st["cpu_us_per_sample"] > 0
    assert set(fake.calls) <= set(NVML_CALLS) and fake.state["init"] == 0

    recs = lines(run.host_telemetry(host))
    header, samples = recs[0], recs[1:]
    assert header["format"] == "pardiag.telemetry" and header["host"] == host
    assert [g["uuid"] for g in header["gpus"]] == [UUID0, UUID1]
    assert len(samples) == 2 * st["samples"] == st["lines"]
    first = samples[0]
    assert first["gpu"] == 0 and first["uuid"] == UUID0
    assert {k: first[k] for k in ("util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz",
                                  "sm_clock_max_mhz", "power_mw", "power_limit_mw", "temp_c", "clock_events",
                                  "pcie_tx_kBps", "pcie_rx_kBps", "nvlink_tx_kib", "nvlink_rx_kib")} == {
        "util_gpu_pct": 90, "util_mem_pct": 40, "mem_used_bytes": 60 * GIB, "mem_total_bytes": 80 * GIB,
        "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "power_mw": 400_000, "power_limit_mw": 700_000,
        "temp_c": 60, "clock_events": 0, "pcie_tx_kBps": 2_000_000, "pcie_rx_kBps": 1_000_000,
        "nvlink_tx_kib": 1 << 20, "nvlink_rx_kib": 1 << 20}
    # PCIe once a second, GPUs staggered: GPU 0 on sample 0, GPU 1 on sample 1
    pcie = [(i // 2, s["gpu"]) for i, s in enumerate(samples) if "pcie_tx_kBps" in s]
    assert pcie == [(0, 0), (1, 1)]
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 4

    split = split_by_rank(run, host)
    assert split["status"] == "ok", split
    assert [(a["rank"], a["gpu"], a["by"]) for a in split["assignments"]] == [(0, 0, "uuid"), (1, 1, "uuid")]
    assert split["unassigned_gpus"] == [] and split["lines"] == {"ranks": len(samples), "host": 0}
    for rank in (0, 1):
        recs = lines(run.telemetry(rank))
        assert [g["gpu"] for g in recs[0]["gpus"]] == [rank]
        assert len(recs) == 1 + st["samples"] and {r["gpu"] for r in recs[1:]} == {rank}
    assert len(lines(run.host_telemetry(host))) == 1  # the header stays

    block = telemetry_block(run).to_dict()
    assert block["status"] == "ok" and block["ranks"] == {
        "0": {"host": host, "gpu": 0, "uuid": UUID0}, "1": {"host": host, "gpu": 1, "uuid": UUID1}}
    g0, g1 = by_gpu(block)[0], by_gpu(block)[1]
    assert g0["samples"] == g1["samples"] == st["samples"]
    assert g0["util_gpu_ratio_mean"] == pytest.approx(0.9) and g1["util_gpu_ratio_p50"] == pytest.approx(0.6)
    assert (g1["sm_clock_mean_mhz"], g1["sm_clock_min_mhz"], g1["sm_clock_max_mhz"]) == (1400, 1400, 1980)
    assert g1["sm_clock_ratio"] == pytest.approx(1400 / 1980)
    assert (g1["power_mean_w"], g1["power_limit_w"]) == (pytest.approx(690), pytest.approx(700))
    assert g1["temperature_max_c"] == 88
    assert (g1["memory_headroom_bytes"], g1["memory_headroom_ratio"]) == (GIB, pytest.approx(1 / 80))
    assert g1["throttle_share"] == {"hw_thermal_slowdown": 1.0} and g0["throttle_share"] == {}
    assert (g0["pcie_tx_mean_gbps"], g0["pcie_rx_mean_gbps"]) == (pytest.approx(2.0), pytest.approx(1.0))
    assert block["hosts"][host]["throttled_gpus"] == [1]
    assert block["hosts"][host]["power_total_mean_w"] == pytest.approx(400 + 690)

    found = gpu_health_findings(block, stragglers=[1])
    assert [(f["lever"], f["severity"], f["ranks"]) for f in found] == [
        ("gpu_health", "high", [1]), ("gpu_health", "high", [1]), ("gpu_health", "medium", [1])]
    throttle, slow, memory = found
    assert "thermally throttled" in throttle["title"]
    assert throttle["est_saving_pct"] == pytest.approx(100 * (1 - 1400 / 1980))
    assert "straggler" in slow["title"]
    assert slow["est_saving_pct"] == pytest.approx(100 * (1 - 1400 / 1980) * 0.6)
    assert "out-of-memory" in memory["title"] and memory["est_saving_pct"] is None
    assert all(f["evidence"] and (f["action"].get("code") or f["action"].get("env")) and f["action"]["doc"]
               for f in found)


def test_stop_returns_within_a_second(tmp_path: Path) -> None:
    waiting = nvml.start_sampler(RunDir(tmp_path / "a"), 5.0, nvml=make_fake([healthy()]))
    assert waiting.sampler is not None
    time.sleep(0.1)
    t0 = time.monotonic()
    assert waiting.sampler.stop()["status"] == "ok"
    assert time.monotonic() - t0 < 1.0

    # a sampler stuck in a slow NVML call: stop() still returns, and says so
    stuck = nvml.start_sampler(RunDir(tmp_path / "b"), 0.05, nvml=make_fake([healthy()], pcie_latency_s=0.6))
    assert stuck.sampler is not None
    time.sleep(0.05)
    t0 = time.monotonic()
    st = stuck.sampler.stop()
    assert time.monotonic() - t0 < 1.0
    assert st["status"] == "failed" and "still inside an NVML call" in st["reason"]
    assert stuck.sampler.stop() is st
    thread = stuck.sampler._thread
    assert thread is not None
    thread.join(3)
    assert not thread.is_alive()


def test_lines_reach_the_file_about_once_a_second(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    started = nvml.start_sampler(run, 0.05, nvml=make_fake([healthy()]))
    assert started.sampler is not None
    path = run.host_telemetry(rundir.hostname())
    try:
        time.sleep(0.3)
        assert len(lines(path)) == 1  # only the header: samples are buffered
        deadline = time.monotonic() + 2.0
        while len(lines(path)) == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(lines(path)) > 1
    finally:
        started.sampler.stop()


# --------------------------------------------------------------------------- by hand


def drive(run: RunDir, fake: Any, ticks: int, interval_s: float = 0.25) -> dict[str, Any]:
    """Run the real sampler's sample loop by hand: tick k at k * interval_s."""
    now = [0]
    opened = nvml.open_sampler(run, interval_s, nvml=fake, host="node-a", clock_ns=lambda: now[0])
    assert opened.sampler is not None, opened.status
    for k in range(ticks):
        now[0] = int(k * interval_s * 1e9)
        opened.sampler.sample_once()
    status: dict[str, Any] = opened.sampler.stop()
    return status


def test_block_and_findings_by_hand(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    write_meta(run, 0, "node-a", cuda(0, None, cvd="0,1"))  # no UUID: CUDA_VISIBLE_DEVICES + index
    write_meta(run, 1, "node-a", cuda(1, UUID1))
    g0 = FakeGpu(UUID0, util_gpu=(100, 90, 80, 90), power_mw=(300_000, 400_000, 500_000, 400_000),
                 temp_c=(60, 62, 64, 62), clock_events=(0, 0, IDLE, 0))
    g1 = FakeGpu(UUID1, util_gpu=(60, 70, 80, 70), sm_clock=(1200, 1500, 1980, 1500),
                 clock_events=(HW_THERMAL, SW_THERMAL, 0, SW_POWER), mem_used=(79 * GIB,),
                 temp_c=(80, 85, 90, 85), power_mw=(690_000,), nvlink_step_kib=None, pcie_tx_kBps=500_000)
    st = drive(run, make_fake([g0, g1]), ticks=8)
    assert st["samples"] == 8 and st["status"] == "ok"
    assert st["disabled"] == [{"gpu": 1, "metric": "nvlink", "reason": "Not Supported"}]

    split = split_by_rank(run, "node-a")
    assert [(a["rank"], a["gpu"], a["by"]) for a in split["assignments"]] == [
        (0, 0, "cuda_visible_devices"), (1, 1, "uuid")]

    block = telemetry_block(run).to_dict()
    a, b = by_gpu(block)[0], by_gpu(block)[1]
    assert a["span_us"] == 7 * 250_000
    assert (a["util_gpu_ratio_mean"], a["util_gpu_ratio_p50"]) == (pytest.approx(0.9), pytest.approx(0.9))
    assert (a["power_mean_w"], a["power_max_w"], a["power_ratio"]) == (
        pytest.approx(400), pytest.approx(500), pytest.approx(400 / 700))
    assert (a["temperature_max_c"], a["temperature_mean_c"]) == (64, 62)
    assert a["throttle_share"] == {"gpu_idle": 0.25} and a["slowdown_share"] == 0.0
    assert (a["memory_headroom_bytes"], a["memory_headroom_ratio"]) == (20 * GIB, 0.25)
    # PCIe read on samples 0 and 4 of GPU 0 (1 and 5 of GPU 1); NVLink counters +1 GiB a second
    assert a["pcie_tx_mean_gbps"] == pytest.approx(2.0) and b["pcie_tx_mean_gbps"] == pytest.approx(0.5)
    assert a["nvlink_tx_mean_gbps"] == pytest.approx(GIB / 1e9) and b["nvlink_tx_mean_gbps"] is None

    assert (b["util_gpu_ratio_mean"], b["util_gpu_ratio_p50"]) == (pytest.approx(0.7), pytest.approx(0.7))
    assert (b["sm_clock_mean_mhz"], b["sm_clock_busy_mean_mhz"], b["sm_clock_min_mhz"]) == (1545, 1545, 1200)
    assert b["throttle_share"] == {"hw_thermal_slowdown": 0.25, "sw_power_cap": 0.25, "sw_thermal_slowdown": 0.25}
    assert b["slowdown_share"] == 0.75 and b["sm_clock_slowdown_mean_mhz"] == 1400
    assert (b["temperature_max_c"], b["memory_headroom_ratio"]) == (90, 1 / 80)

    found = gpu_health_findings(block, stragglers=[1])
    assert [(f["severity"], f["ranks"]) for f in found] == [("high", [1]), ("high", [1]), ("medium", [1])]
    throttle, slow, memory = found
    assert throttle["est_saving_pct"] == pytest.approx(100 * 0.75 * (1 - 1400 / 1980))  # 21.97
    assert "hw_thermal_slowdown in 25.0% of 8 samples" in throttle["evidence"]
    assert slow["est_saving_pct"] == pytest.approx(100 * (1 - 1545 / 1980) * 0.7)  # 15.38
    assert "SM clock 22.0% lower and utilisation 22.2% lower" in slow["title"]
    assert memory["action"]["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    unlinked = gpu_health_findings(block, stragglers=[])
    assert [f["severity"] for f in unlinked] == ["high", "medium", "medium"]
    assert not any("straggler" in f["title"] for f in unlinked)


def test_idle_samples_do_not_dilute_throttling(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    drive(run, make_fake([FakeGpu(UUID0, util_gpu=(0, 0, 90, 90), clock_events=(IDLE, IDLE, HW_THERMAL, 0))]),
          ticks=12)
    g = telemetry_block(run).to_dict()["gpus"][0]
    assert g["throttle_share"] == {"gpu_idle": 0.5, "hw_thermal_slowdown": 0.25}
    assert (g["busy_samples"], g["slowdown_share"]) == (6, 0.5)
    (f,) = gpu_health_findings(telemetry_block(run).to_dict(), [])
    assert f["severity"] == "high" and "in 50.0% of busy samples" in f["title"] and f["ranks"] == []


def test_not_supported_disables_one_metric_only(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    g1 = FakeGpu(UUID1, unsupported=frozenset({"nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons"}),
                 clock_events=(SW_POWER,))
    fake = make_fake([healthy(), g1])
    st = drive(run, fake, ticks=6)
    assert st["status"] == "ok" and st["errors"] == 0
    assert st["disabled"] == [{"gpu": 1, "metric": "power", "reason": "Not Supported"}]
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 6 + 1  # GPU 1 asked once, never again
    samples = lines(run.host_telemetry("node-a"))[1:]
    s0 = [s for s in samples if s["gpu"] == 0]
    s1 = [s for s in samples if s["gpu"] == 1]
    assert all("power_mw" in s for s in s0) and not any("power_mw" in s for s in s1)
    # the older clock-reasons query stands in for the newer one
    assert all(s["clock_events"] == SW_POWER for s in s1)
    assert all({"util_gpu_pct", "sm_clock_mhz", "temp_c", "mem_used_bytes", "power_limit_mw"} <= set(s) for s in s1)
    block = telemetry_block(run).to_dict()
    assert by_gpu(block)[1]["power_mean_w"] is None and by_gpu(block)[0]["power_mean_w"] == pytest.approx(400)


def test_repeated_failures_disable_a_metric_and_never_raise(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    fake = make_fake([FakeGpu(UUID0, failing=frozenset({"nvmlDeviceGetTemperature"}))])
    st = drive(run, fake, ticks=5)
    assert st["status"] == "ok" and st["samples"] == 5
    assert st["errors"] == MAX_CONSECUTIVE_FAILURES
    assert st["disabled"][0]["metric"] == "temperature" and "3 times in a row" in st["disabled"][0]["reason"]
    assert fake.calls["nvmlDeviceGetTemperature"] == 3
    samples = lines(run.host_telemetry("node-a"))[1:]
    assert len(samples) == 5 and all("temp_c" not in s and s["util_gpu_pct"] == 90 for s in samples)


def test_a_gpu_that_answers_nothing(tmp_path: Path) -> None:
    every = frozenset(c for m in METRICS for c in m.calls)
    started = nvml.start_sampler(RunDir(tmp_path), 0.05, nvml=make_fake([FakeGpu(UUID0, unsupported=every)]))
    assert started.sampler is not None
    thread = started.sampler._thread
    assert thread is not None
    thread.join(1.0)
    assert not thread.is_alive()  # nothing left to read: the thread ended by itself
    st = started.sampler.stop()
    assert st["status"] == "failed" and st["reason"] == "no metric could be read on any GPU"
    assert len(st["disabled"]) == len(METRICS) and st["lines"] == 0


def test_unusable_nvml_is_skipped_with_a_reason(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    broken = make_fake([healthy()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    sampler, status = nvml.start_sampler(run, 0.1, nvml=broken)
    assert sampler is None and status["status"] == "skipped"
    assert "Driver Not Loaded" in status["reason"]
    sampler, status = nvml.start_sampler(run, 0.1, nvml=make_fake([]))
    assert sampler is None and status == {"status": "skipped", "reason": "NVML reports no GPU"}
    assert not run.host_telemetry_files()


def test_real_nvml_on_this_machine() -> None:
    status = nvml.probe()
    if status["status"] == "ok":
        pytest.skip("a GPU is present: probe reports it")
    assert status["status"] == "skipped" and "NVML" in status["reason"]


def test_one_sampler_per_host(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    first = nvml.start_sampler(run, 0.05, nvml=make_fake([healthy()]))
    try:
        second = nvml.start_sampler(run, 0.05, nvml=make_fake([healthy()]))
        assert second.sampler is None and "already samples" in second.status["reason"]
        assert split_by_rank(run, rundir.hostname())["status"] == "skipped"  # still writing
    finally:
        assert first.sampler is not None
        first.sampler.stop()


# --------------------------------------------------------------------------- ranks


@pytest.mark.parametrize("device,expected", [
    (cuda(0, UUID1), (1, "uuid")),
    (cuda(0, UUID1[4:].upper()), (1, "uuid")),
    (cuda(0, None, cvd="1,0"), (1, "cuda_visible_devices")),
    (cuda(1, None, cvd=" 1, 0"), (0, "cuda_visible_devices")),
    (cuda(0, None, cvd="GPU-0a1b2c3d-1111"), (1, "cuda_visible_devices")),
    (cuda(0, None, cvd="GPU-0a1b2c3d"), None),  # ambiguous prefix
    (cuda(1, None), (1, "index")),
    (cuda(0, "GPU-ffffffff-0000-4000-8000-000000000000", cvd="1"), (1, "cuda_visible_devices")),
    (cuda(2, None, cvd="0,1"), None),
    ({"type": "cpu"}, None),
])
def test_gpu_of_rank(device: dict[str, Any], expected: tuple[int, str] | None) -> None:
    meta = RankMeta.from_mapping({"host": "h", "rank": 0, "local_rank": 0, "device": device})
    assert gpu_of_rank(meta, {0: UUID0, 1: UUID1}) == expected


def test_unmatched_gpus_stay_in_the_host_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    write_meta(run, 3, "node-a", cuda(0, UUID1))
    write_meta(run, 4, "node-b", cuda(0, UUID0))  # another host: not this split's business
    drive(run, make_fake([healthy(), throttled_and_slow()]), ticks=6)
    split = split_by_rank(run, "node-a")
    assert [(a["rank"], a["gpu"]) for a in split["assignments"]] == [(3, 1)]
    assert split["unassigned_gpus"] == [0]
    host_recs = lines(run.host_telemetry("node-a"))
    assert {r["gpu"] for r in host_recs[1:]} == {0} and len(host_recs) == 7
    assert split_by_rank(run, "node-a")["lines"] == {"ranks": 0, "host": 6}  # idempotent
    assert len(lines(run.telemetry(3))) == 7

    block = telemetry_block(run).to_dict()
    assert [(g["gpu"], g["ranks"]) for g in block["gpus"]] == [(0, []), (1, [3])]
    assert block["hosts"]["node-a"]["unassigned_gpus"] == [0]
    # only the job's GPU is judged; the unused one is no peer
    assert all(f["ranks"] == [3] for f in gpu_health_findings(block, [3]))


def test_torn_lines_and_missing_telemetry(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.ranks_dir.mkdir(parents=True)
    empty = telemetry_block(run).to_dict()
    assert empty["status"] == "absent" and empty["gpus"] == [] and "no GPU telemetry" in empty["reason"]
    assert gpu_health_findings(empty, [0]) == []

    drive(run, make_fake([healthy()]), ticks=6)
    path = run.host_telemetry("node-a")
    with open(path, "a") as f:
        f.write('{"t_ns": 99, "gpu": 0, "util_gp')  # a crash mid-line
    block = telemetry_block(run).to_dict()
    assert block["gpus"][0]["samples"] == 6 and "1 unreadable line" in block["problems"][0]
    assert gpu_health_findings(block, []) == []


def test_newer_telemetry_format_is_refused_politely(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    path = run.host_telemetry("node-a")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "pardiag.telemetry", "format_version": 99}) + "\n")
    block = telemetry_block(run).to_dict()
    assert block["status"] == "absent" and "newer than this pardiag" in block["problems"][0]


def test_sampler_thread_is_a_daemon_and_named(tmp_path: Path) -> None:
    started = nvml.start_sampler(RunDir(tmp_path), 0.05, nvml=make_fake([healthy()]))
    assert started.sampler is not None
    try:
        names = {t.name: t.daemon for t in threading.enumerate()}
        assert names.get("pardiag-nvml") is True
    finally:
        started.sampler.stop()

