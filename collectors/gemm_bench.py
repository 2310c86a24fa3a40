"""Time a job's matrix-multiply and convolution shapes in fp32 and in a lower precision.

`pardiag run` starts this file, after the job, with the job's own Python (which has
torch; pardiag's environment may not), on the host and device type the job used::

    python gemm_bench.py SPEC.json OUT.json

SPEC names the device type, the threads the job used, its TF32 settings, a time budget
and the shapes (`pardiag.analyzers.gemm_shapes.GemmShape.to_dict`). Each shape's
operator is called through the dispatcher (``torch.ops.aten.<op>``) with inputs of the
recorded sizes, strides and argument values:

* fp32: floating inputs in float32, as the job ran them;
* half (bf16 on a CPU, bf16 on a GPU that supports it, else fp16): a forward operator
  with float32 inputs under ``torch.autocast``, so the casts autocast adds are timed
  with it; a backward operator (called by autograd's engine) with its inputs already in
  the half type, as autocast's saved activations and gradients are.

The two are timed alternately (so that other work on the host slows both alike), in
batches of calls long enough for the clock, after a warm-up: the median of the batches'
per-call time. On a GPU with CUDA events around each batch.

With ``peak_budget_s`` in SPEC, it also times one large square matrix multiply in each
of the two precisions (n x n matrices, n doubled from 256 until a call lasts 20 ms or n
reaches 4096 on a CPU, 8192 on a GPU; through ``torch.mm`` and through
``torch.nn.functional.linear``, the faster counts: on some CPUs bf16 runs 7x faster
through oneDNN's linear than through mm): the throughput this host reaches with the job's
threads, the peak that MFU is measured against where no datasheet figure
applies (a CPU). The file imports only torch and the standard library: it runs in a
separate process and never inside the job.
"""

from __future__ import annotations

import ast
import json
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch

FLOAT_TYPES = {"float": torch.float32, "double": torch.float64, "c10::Half": torch.float16,
               "c10::BFloat16": torch.bfloat16}
INT_TYPES = {"long int": torch.int64, "int": torch.int32, "short int": torch.int16,
             "signed char": torch.int8, "unsigned char": torch.uint8, "bool": torch.bool}
BATCH_S = 2e-4  # a timed batch lasts at least this long
MIN_REPEATS, MAX_REPEATS = 3, 25
PEAK_CALL_S = 0.02  # the square GEMM grows until one call lasts this long
PEAK_MAX_N = {"cpu": 4096, "cuda": 8192}


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def half_dtype(device: str) -> torch.dtype:
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def _tensor(dims: list[int], strides: list[int] | None, dtype: torch.dtype, device: str) -> torch.Tensor:
    if strides is None or len(strides) != len(dims) or any(s < 0 for s in strides):
        strides = list(torch.empty(dims, device="meta").stride())
    storage = 1 + sum((d - 1) * s for d, s in zip(dims, strides) if d > 0) if all(d > 0 for d in dims) else 0
    if dtype.is_floating_point:
        base = torch.randn(storage, dtype=torch.float32, device=device).to(dtype)
    elif dtype == torch.bool:
        base = torch.ones(storage, dtype=dtype, device=device)
    else:
        base = torch.randint(0, 2, (storage,), dtype=dtype, device=device)
    return base.as_strided(dims, strides)


def _value(text: str) -> Any:
    if text == "":
        raise ValueError("an argument's value was not recorded")
    return ast.literal_eval(text)


def build_args(shape: dict[str, Any], floats: torch.dtype, device: str) -> list[Any]:
    """The operator's arguments: tensors of the recorded sizes and strides (floating ones
    in `floats`), the recorded values of the others."""
    args: list[Any] = []
    for dims, typ, strides, conc in zip(shape["dims"], shape["dtypes"], shape["strides"], shape["concrete"]):
        if typ in FLOAT_TYPES or typ in INT_TYPES:
            if dims is None:
                raise ValueError(f"input of type {typ} has no recorded size")
            dtype = floats if typ in FLOAT_TYPES else INT_TYPES[typ]
            args.append(_tensor(dims, strides, dtype, device))
        elif typ == "":
            args.append(None)  # an optional tensor not given (a linear without bias)
        elif typ in ("Scalar", "ScalarList"):
            args.append(_value(conc))
        else:
            raise ValueError(f"input type {typ!r} cannot be made again")
    return args


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Timer:
    def __init__(self, device: str) -> None:
        self.device = device

    def batch(self, fn: Callable[[], Any], inner: int) -> float:
        """Seconds per call of `fn`, over `inner` calls."""
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner


KEEP_FLOAT32 = frozenset({"logsumexp"})
"""Backward inputs that stay float32 under autocast (the flash-attention forward returns
its logsumexp in float32 whatever the type of q, k and v)."""


def _schema_arguments(op: Any) -> list[Any]:
    try:
        return list(op.default._schema.arguments)
    except (AttributeError, RuntimeError):
        return []


def split_arguments(op: Any, args: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """(positional, keyword) as the operator's schema takes them: the arguments the
    schema makes keyword-only (attention's ``scale``, ``enable_gqa``) by name, since the
    trace records every argument in order."""
    schema = _schema_arguments(op)
    if not any(a.kwarg_only for a in schema):
        return args, {}
    pos = [v for i, v in enumerate(args) if i >= len(schema) or not schema[i].kwarg_only]
    kw = {schema[i].name: v for i, v in enumerate(args) if i < len(schema) and schema[i].kwarg_only}
    return pos, kw


def time_shape(shape: dict[str, Any], device: str, half: torch.dtype, budget_s: float) -> dict[str, Any]:
    """{fp32_us, half_us, speedup, repeats} for one shape, within about `budget_s`."""
    op = getattr(torch.ops.aten, shape["op"].split("::", 1)[1])
    with torch.no_grad():
        a32 = build_args(shape, torch.float32, device)
        p32, k32 = split_arguments(op, a32)
        if shape.get("backward"):
            ah = build_args(shape, half, device)
            for i, arg in enumerate(_schema_arguments(op)[:len(ah)]):
                if arg.name in KEEP_FLOAT32:
                    ah[i] = a32[i]
            ph, kh = split_arguments(op, ah)

            def run_half() -> Any:
                return op(*ph, **kh)
        else:
            def run_half() -> Any:
                with torch.autocast(device_type=device, dtype=half):
                    return op(*p32, **k32)

        def run_fp32() -> Any:
            return op(*p32, **k32)

        timer = Timer(device)
        t0 = time.perf_counter()
        for fn in (run_fp32, run_half):  # warm-up: kernels chosen, caches filled, autocast's paths taken
            fn()
            _sync(device)
        est = max(timer.batch(run_fp32, 1), timer.batch(run_half, 1), 1e-7)
        inner = max(1, min(1000, int(BATCH_S / est)))
        left = budget_s - (time.perf_counter() - t0)
        per_repeat = 2 * est * inner  # one batch of each precision
        # as many repeats as the budget holds, up to MAX_REPEATS; a shape too large for
        # MIN_REPEATS gets one (big shapes vary least)
        repeats = max(0, min(MAX_REPEATS, int(left / per_repeat)))
        repeats = max(repeats, MIN_REPEATS if left >= per_repeat * MIN_REPEATS else 1)
        fp32, hal = [], []
        for _ in range(repeats):
            fp32.append(timer.batch(run_fp32, inner))
            hal.append(timer.batch(run_half, inner))
    f, h = statistics.median(fp32) * 1e6, statistics.median(hal) * 1e6
    return {"fp32_us": f, "half_us": h, "speedup": f / h if h > 0 else None, "repeats": repeats, "calls_per_repeat": inner}


def square_gemm(device: str, dtype: torch.dtype, budget_s: float, op: str = "mm") -> dict[str, Any]:
    """{n, us, tflops, repeats} of one n x n matrix product in `dtype` (`op` "mm": torch.mm;
    "linear": torch.nn.functional.linear, which takes another library path on some CPUs),
    within about `budget_s`: the median of the timed calls after a warm-up."""
    timer = Timer(device)
    t0 = time.perf_counter()
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        if op == "mm":
            def call() -> Any:
                return torch.mm(a, b, out=out)
        else:
            def call() -> Any:
                return torch.nn.functional.linear(a, b)

        call()
        _sync(device)
        once = timer.batch(call, 1)
        spent = time.perf_counter() - t0
        if once >= PEAK_CALL_S or n >= PEAK_MAX_N[device] or spent + 8 * once * 3 > budget_s / 2:
            break
        n *= 2
    inner = max(1, min(100, int(PEAK_CALL_S / max(once, 1e-7))))
    left = budget_s - (time.perf_counter() - t0)
    repeats = max(1, min(MAX_REPEATS, int(left / (once * inner))))
    times = [timer.batch(call, inner) for _ in range(repeats)]
    us = statistics.median(times) * 1e6
    return {"n": n, "op": op, "us": us, "tflops": 2.0 * n ** 3 / us / 1e6, "repeats": repeats,
            "calls_per_repeat": inner}


def measure_peaks(device: str, half: torch.dtype, budget_s: float) -> dict[str, Any]:
    """The square GEMM in float32 (with the job's TF32 setting) and in `half`; a
    precision that fails is an error line, never an exception."""
    out: dict[str, Any] = {}
    for dtype in (torch.float32, half):
        name = str(dtype).removeprefix("torch.")
        best: dict[str, Any] | None = None
        for op in ("mm", "linear"):  # the faster of two library paths: the peak is what this host reaches
            try:
                with torch.no_grad():
                    got = square_gemm(device, dtype, budget_s / 4, op)
            except Exception as e:
                got = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
            if best is None or got.get("tflops", 0.0) > best.get("tflops", 0.0):
                best = got
        out[name] = best
    if device == "cuda":
        out["float32_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return out


def main(argv: list[str]) -> int:
    spec_path, out_path = argv[1], argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    started = time.perf_counter()
    device = spec.get("device") or "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("the job ran on CUDA but this process sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise SystemExit(f"device type {device!r} is not measured (cpu and cuda are)")
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(spec.get("cuda_matmul_allow_tf32", False))
        torch.backends.cudnn.allow_tf32 = bool(spec.get("cudnn_allow_tf32", True))
    half = half_dtype(device)
    peak_budget = float(spec.get("peak_budget_s") or 0.0)
    budget = float(spec.get("budget_s", 15.0)) - peak_budget
    rows = []
    shapes = spec.get("shapes") or []
    for i, shape in enumerate(shapes):
        left = budget - (time.perf_counter() - started)
        row: dict[str, Any] = {"index": i}
        if left <= 0:
            row["error"] = "not timed: the time budget was spent"
        else:
            try:
                row.update(time_shape(shape, device, half, left / (len(shapes) - i)))
            except Exception as e:  # one shape that cannot be run again does not stop the others
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        rows.append(row)
    doc = {"device": device, "device_name": device_name(device), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "half_dtype": str(half).removeprefix("torch."),
           "rows": rows}
    if peak_budget > 0:
        doc["peak"] = measure_peaks(device, half, peak_budget)
    doc["seconds"] = time.perf_counter() - started
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
