"""The table of datasheet peaks: the row each real device name picks, and what every row
holds (a source, dense figures in a sane order)."""

from __future__ import annotations

import pytest

from pardiag.analyzers.peaks import PEAKS, peak_row

# names as NVML (nvmlDeviceGetName), torch.cuda.get_device_name and Kineto's
# deviceProperties write them
NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
    ("NVIDIA H100", "H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.5),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA A100-PG509-200", "A100", 312.0),  # the fixture's deviceProperties
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA A10", "A10", 125.0),
    ("AMD Instinct MI300X", "MI300X", 1307.4),
    ("AMD Instinct MI250X", "MI250X (one GCD)", 191.5),
    ("AMD Instinct MI250X / MI250", "MI250X (one GCD)", 191.5),
]


@pytest.mark.parametrize("name, row, bf16", NAMES)
def test_a_device_name_picks_its_row(name: str, row: str, bf16: float) -> None:
    got = peak_row(name)
    assert got is not None and got.device == row and got.tflops["bf16"] == bf16


@pytest.mark.parametrize("name, row, fp16", [("Tesla V100-SXM2-16GB", "V100 SXM2", 125.0),
                                              ("Tesla V100-PCIE-32GB", "V100 PCIe", 112.0),
                                              ("Tesla V100S-PCIE-32GB", "V100S PCIe", 130.0),
                                              ("Tesla T4", "T4", 65.0)])
def test_gpus_without_bf16_have_no_bf16_entry(name: str, row: str, fp16: float) -> None:
    got = peak_row(name)
    assert got is not None and got.device == row and got.tflops["fp16"] == fp16
    assert "bf16" not in got.tflops and "tf32" not in got.tflops


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40", "NVIDIA GeForce RTX 4090", "Intel(R) Xeon(R) Platinum",
                                  "AMD EPYC 7763", "", None])
def test_other_devices_have_no_row(name: str | None) -> None:
    assert peak_row(name) is None


def test_every_row_is_dense_ordered_and_cited() -> None:
    for row in PEAKS:
        t = row.tflops
        assert row.source and ("datasheet" in row.source or "data sheet" in row.source or "brochure" in row.source)
        assert t["fp32"] > 0 and all(v > 0 for v in t.values())
        assert t.get("tf32", t["fp32"]) >= t["fp32"]
        half = t.get("bf16", t.get("fp16"))
        assert half is not None and half >= t.get("tf32", t["fp32"])
        if "fp8" in t:
            assert t["fp8"] == pytest.approx(2 * half, rel=0.02)  # fp8 doubles the 16-bit rate (L40S: 733 against 362.05)
