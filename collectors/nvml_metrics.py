"""The NVML queries the telemetry sampler makes, as a table.

Only cheap queries (utilisation, memory, clocks, power, temperature, clock event
reasons); never the process-listing calls, which hold the driver's global lock for
milliseconds. Each metric has readers tried in order: a later one replaces an earlier
one that the GPU or the library does not support. A reader takes the NVML module
(pynvml, or a fake with its interface in tests) and a device handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

ALL_LINKS = 0xFFFFFFFF  # field-value scope: summed over every NVLink
# NVML return codes after which a query is not tried again on that GPU
# (INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND)
PERMANENT_ERRORS = frozenset({2, 3, 4, 13})

Reader = Callable[[Any, Any], dict[str, Any]]  # (nvml module, device handle) -> fields


def _utilization(nvml: Any, h: Any) -> dict[str, Any]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"util_gpu_pct": int(u.gpu), "util_mem_pct": int(u.memory)}


def _memory(nvml: Any, h: Any) -> dict[str, Any]:
    m = nvml.nvmlDeviceGetMemoryInfo(h)
    return {"mem_used_bytes": int(m.used), "mem_total_bytes": int(m.total)}


def _sm_clock(nvml: Any, h: Any) -> dict[str, Any]:
    return {"sm_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))}


def _sm_clock_max(nvml: Any, h: Any) -> dict[str, Any]:
    return {"sm_clock_max_mhz": int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))}


def _power(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_mw": int(nvml.nvmlDeviceGetPowerUsage(h))}


def _power_limit(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_limit_mw": int(nvml.nvmlDeviceGetEnforcedPowerLimit(h))}


def _power_management_limit(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_limit_mw": int(nvml.nvmlDeviceGetPowerManagementLimit(h))}


def _temperature(nvml: Any, h: Any) -> dict[str, Any]:
    return {"temp_c": int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))}


def _clock_events(nvml: Any, h: Any) -> dict[str, Any]:
    return {"clock_events": int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))}


def _throttle_reasons(nvml: Any, h: Any) -> dict[str, Any]:
    return {"clock_events": int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))}


def _pcie(nvml: Any, h: Any) -> dict[str, Any]:
    return {
        "pcie_tx_kBps": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)),
        "pcie_rx_kBps": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)),
    }


def _nvlink(nvml: Any, h: Any) -> dict[str, Any]:
    ids = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS), (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)]
    values = nvml.nvmlDeviceGetFieldValues(h, ids)
    for v in values:
        if v.nvmlReturn != 0:
            raise nvml.NVMLError(v.nvmlReturn)
    return {"nvlink_tx_kib": int(values[0].value.ullVal), "nvlink_rx_kib": int(values[1].value.ullVal)}


Cadence = Literal["sample", "slow", "once"]


@dataclass(frozen=True)
class Metric:
    """One query. `readers` are tried in order: a later one replaces an earlier one
    the GPU or the library does not support. `sticky` values are repeated in every
    line until read again (limits read rarely)."""

    name: str
    readers: tuple[Reader, ...]
    calls: tuple[str, ...]  # the NVML functions the readers call
    cadence: Cadence = "sample"
    sticky: bool = False


METRICS: tuple[Metric, ...] = (
    Metric("utilization", (_utilization,), ("nvmlDeviceGetUtilizationRates",)),
    Metric("memory", (_memory,), ("nvmlDeviceGetMemoryInfo",)),
    Metric("sm_clock", (_sm_clock,), ("nvmlDeviceGetClockInfo",)),
    Metric("sm_clock_max", (_sm_clock_max,), ("nvmlDeviceGetMaxClockInfo",), "once", True),
    Metric("power", (_power,), ("nvmlDeviceGetPowerUsage",)),
    Metric("power_limit", (_power_limit, _power_management_limit),
           ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), "slow", True),
    Metric("temperature", (_temperature,), ("nvmlDeviceGetTemperature",)),
    Metric("clock_events", (_clock_events, _throttle_reasons),
           ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")),
    Metric("pcie", (_pcie,), ("nvmlDeviceGetPcieThroughput",), "slow"),
    Metric("nvlink", (_nvlink,), ("nvmlDeviceGetFieldValues",), "slow"),
)
SETUP_CALLS = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
               "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlSystemGetDriverVersion")
NVML_CALLS: tuple[str, ...] = SETUP_CALLS + tuple(c for m in METRICS for c in m.calls)


def try_call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def text(v: Any) -> str | None:
    """NVML's strings come as bytes from older pynvml releases."""
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def error_text(e: BaseException) -> str:
    """The first line of an error, at most 200 characters."""
    s = str(e) or type(e).__name__
    return s.splitlines()[0][:200]

