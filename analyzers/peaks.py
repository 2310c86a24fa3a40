"""Peak floating-point throughput per device and precision: the denominator of MFU.

One row per device: the pattern its name matches (as NVML, ``torch.cuda.get_device_name``
or a trace's ``deviceProperties`` write it; the first row that matches wins, so a more
specific row comes first), the vendor's dense figures in TFLOP/s (no 2:4 sparsity) for
each precision the device has, and the datasheet they come from. ``fp32`` is the rate
an fp32 matmul without TF32 runs at: on NVIDIA GPUs the non-tensor (CUDA core) rate, on
AMD's the FP32 matrix rate (rocBLAS runs fp32 GEMMs on the matrix cores); ``tf32``,
``bf16``, ``fp16`` and ``fp8`` are the tensor (matrix) core rates. A precision a device
lacks has no entry.

Where a datasheet gives only figures with sparsity (marked * there), the dense figure is
half of it, as its footnote says. AMD's MI250X and MI250 are two graphics compute dies
(GCDs) per package, and torch sees each GCD as one device: their rows are half the
package's figures.

A device without a row (a CPU, or a GPU not listed) gets the GEMM measured after the
job instead (`pardiag.analyzers.efficiency`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PeakRow:
    device: str  # what the row calls the device ("H100 SXM")
    pattern: re.Pattern[str]
    tflops: dict[str, float]  # precision -> dense TFLOP/s
    source: str  # the datasheet

    def matches(self, name: str) -> bool:
        return bool(self.pattern.search(name))


def _p(regex: str) -> re.Pattern[str]:
    return re.compile(regex, re.IGNORECASE)


_H100 = ("NVIDIA H100 Tensor Core GPU datasheet "
         "(resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (www.nvidia.com/en-us/data-center/h200/)"
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)")
_B200 = "NVIDIA HGX B200 datasheet, per GPU (www.nvidia.com/en-us/data-center/hgx/)"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (www.nvidia.com/en-us/data-center/v100/)"
_L40S = "NVIDIA L40S GPU datasheet (www.nvidia.com/en-us/data-center/l40s/)"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet (www.nvidia.com/en-us/data-center/l4/)"
_A10 = "NVIDIA A10 Tensor Core GPU datasheet (www.nvidia.com/en-us/data-center/products/a10-gpu/)"
_T4 = "NVIDIA T4 Tensor Core GPU datasheet (www.nvidia.com/en-us/data-center/tesla-t4/)"
_MI300X = "AMD Instinct MI300X data sheet (www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html)"
_MI325X = "AMD Instinct MI325X data sheet (www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html)"
_MI250X = "AMD Instinct MI250X brochure (www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html)"
_MI250 = "AMD Instinct MI250 brochure (www.amd.com/en/products/accelerators/instinct/mi200/mi250.html)"

PEAKS: tuple[PeakRow, ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column (per GPU): FP32 60, TF32 835*,
    # BF16/FP16 1,671*, FP8 3,341* TFLOPS (* with sparsity)
    PeakRow("H100 NVL", _p(r"\bH100\b.*\bNVL\b"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
                                                  "fp8": 1670.5}, _H100),
    # the same datasheet, H100 PCIe column: FP32 51, TF32 756*, BF16/FP16 1,513*, FP8 3,026*
    PeakRow("H100 PCIe", _p(r"\bH100\b.*\bPCIe\b"), {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5,
                                                    "fp8": 1513.0}, _H100),
    # the same datasheet, H100 SXM column: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958*
    # (NVML: "NVIDIA H100 80GB HBM3", "NVIDIA H100")
    PeakRow("H100 SXM", _p(r"\bH100\b"), {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                                         "fp8": 1979.0}, _H100),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: FP32 60, TF32 835*, BF16/FP16
    # 1,671*, FP8 3,341*
    PeakRow("H200 NVL", _p(r"\bH200\b.*\bNVL\b"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
                                                  "fp8": 1670.5}, _H200),
    # the same datasheet, H200 SXM column: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958*
    # (NVML: "NVIDIA H200")
    PeakRow("H200 SXM", _p(r"\bH200\b"), {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                                         "fp8": 1979.0}, _H200),
    # NVIDIA HGX B200 datasheet, per GPU: FP32 75, TF32 2.2*, FP16/BF16 4.5*, FP8 9* PFLOPS
    PeakRow("B200", _p(r"\bB200\b"), {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0,
                                     "fp8": 4500.0}, _B200),
    # NVIDIA A100 datasheet (SXM and PCIe, 40 and 80 GB alike): FP32 19.5, TF32 156 (312*),
    # BF16/FP16 312 (624*) TFLOPS. NVML: "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
    # "NVIDIA A100 80GB PCIe"; "NVIDIA A100-PG509-200" is an SXM4 board
    PeakRow("A100", _p(r"\bA100\b"), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, _A100),
    # NVIDIA V100 datasheet: V100S PCIe FP32 16.4, Tensor 130 TFLOPS (no BF16, no TF32)
    PeakRow("V100S PCIe", _p(r"\bV100S\b"), {"fp32": 16.4, "fp16": 130.0}, _V100),
    # the same datasheet: V100 PCIe FP32 14, Tensor 112 ("Tesla V100-PCIE-32GB")
    PeakRow("V100 PCIe", _p(r"\bV100\b.*\bPCIe\b"), {"fp32": 14.0, "fp16": 112.0}, _V100),
    # the same datasheet: V100 SXM2 FP32 15.7, Tensor 125 ("Tesla V100-SXM2-16GB")
    PeakRow("V100 SXM2", _p(r"\bV100\b"), {"fp32": 15.7, "fp16": 125.0}, _V100),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1,466*)
    PeakRow("L40S", _p(r"\bL40S\b"), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
                                     "fp8": 733.0}, _L40S),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* ("NVIDIA L4")
    PeakRow("L4", _p(r"\bL4\b"), {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}, _L4),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*) ("NVIDIA A10";
    # not the A10G, another part)
    PeakRow("A10", _p(r"\bA10\b"), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, _A10),
    # NVIDIA T4 datasheet: FP32 8.1, mixed-precision FP16/FP32 65 TFLOPS ("Tesla T4")
    PeakRow("T4", _p(r"\bT4\b"), {"fp32": 8.1, "fp16": 65.0}, _T4),
    # AMD Instinct MI325X data sheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9
    PeakRow("MI325X", _p(r"\bMI325X\b"), {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                                         "fp8": 2614.9}, _MI325X),
    # AMD Instinct MI300X data sheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9
    PeakRow("MI300X", _p(r"\bMI300X\b"), {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                                         "fp8": 2614.9}, _MI300X),
    # AMD Instinct MI250X brochure, per package of two GCDs: FP32 matrix 95.7, FP16/BF16 383;
    # torch sees one GCD: half of each
    PeakRow("MI250X (one GCD)", _p(r"\bMI250X\b"), {"fp32": 47.85, "bf16": 191.5, "fp16": 191.5}, _MI250X),
    # AMD Instinct MI250 brochure, per package of two GCDs: FP32 matrix 90.5, FP16/BF16 362.1;
    # torch sees one GCD: half of each
    PeakRow("MI250 (one GCD)", _p(r"\bMI250\b"), {"fp32": 45.25, "bf16": 181.05, "fp16": 181.05}, _MI250),
)


def peak_row(device_name: str | None) -> PeakRow | None:
    """The table's row for a device name, or None."""
    if not device_name:
        return None
    return next((r for r in PEAKS if r.matches(device_name)), None)
