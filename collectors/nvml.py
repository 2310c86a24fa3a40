"""GPU telemetry through NVML (nvidia-ml-py), on the launcher host."""

from __future__ import annotations

from typing import Any


def probe() -> dict[str, Any]:
    """Whether NVML can be used here, and why not when it cannot."""
    try:
        import pynvml
    except ImportError:
        return {"status": "skipped", "reason": "nvidia-ml-py (pynvml) is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return {"status": "skipped", "reason": f"no NVIDIA driver/GPU reachable through NVML ({_nvml_error(e)})"}
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:
        return {"status": "failed", "reason": f"NVML query failed: {_nvml_error(e)}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    if not count:
        return {"status": "skipped", "reason": "NVML reports no GPU"}
    return {
        "status": "skipped",
        "reason": "GPU present; per-GPU sampling is not recorded by this version",
        "gpus": count,
        "driver": driver if isinstance(driver, str) else driver.decode(),
    }


def _nvml_error(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]
