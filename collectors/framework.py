"""What the training process actually used: DDP and FSDP settings, AMP, DataLoaders,
gradient accumulation, parameters and optimizer state, device and versions.

Facts come from the objects the script creates, seen through small wrappers around
their constructors and a few methods. The wrappers only count, time and keep weak
references; they never change arguments or results, and they switch themselves
off on the first error.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import sys
import time
import weakref
from typing import Any, Callable

import torch

log = logging.getLogger("pardiag.collectors")


class StepCounters:
    """Host-side timings accumulated between two step boundaries."""

    __slots__ = ("data_ns", "data_calls", "bwd_ns", "backwards", "fwd_ns", "forwards")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.data_ns = 0
        self.data_calls = 0
        self.bwd_ns = 0
        self.backwards = 0
        self.fwd_ns = 0
        self.forwards = 0


class Framework:
    """Installs the wrappers and turns what they saw into the `meta.json` facts."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self.on_error = on_error
        self.counters = StepCounters()
        self.first_activity_ns: int | None = None
        self.ddp: list[weakref.ref[Any]] = []
        self.ddp_args: dict[int, dict[str, Any]] = {}
        self.fsdp: list[dict[str, Any]] = []
        self.loaders: dict[int, dict[str, Any]] = {}
        self.optimizers: list[weakref.ref[Any]] = []
        self.autocast_seen: dict[str, set[str]] = {}
        self.no_sync_calls = 0
        self.grad_scaler_calls = 0
        self.backwards_per_step: list[int] = []
        self._forward_hook: Any = None
        self._last_facts: dict[str, Any] = {}
        self._ddp_seen: dict[int, dict[str, Any]] = {}

    # -- installation -----------------------------------------------------------------

    def install(self) -> None:
        for name, fn in (
            ("dataloader", self._patch_dataloader),
            ("backward", self._patch_backward),
            ("ddp", self._patch_ddp),
            ("grad_scaler", self._patch_grad_scaler),
            ("autocast", self._install_forward_hook),
        ):
            try:
                fn()
            except Exception as e:  # a torch version without that API
                self.on_error(f"framework.{name}", e)

    def _wrap(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, attr)
        wrapped = make(original)
        functools.update_wrapper(wrapped, original)
        setattr(owner, attr, wrapped)

    def _patch_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        fw = self
        counters = self.counters

        def make_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any, *a: Any, **k: Any) -> Any:
                original(it, loader, *a, **k)
                try:
                    fw._record_loader(loader)
                except Exception as e:
                    fw.on_error("framework.dataloader", e)

            return __init__

        def make_next(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                t0 = time.perf_counter_ns()
                try:
                    return original(it)
                finally:
                    t1 = time.perf_counter_ns()
                    counters.data_ns += t1 - t0
                    counters.data_calls += 1
                    if fw.first_activity_ns is None:
                        fw.first_activity_ns = t0

            return __next__

        self._wrap(dl._BaseDataLoaderIter, "__init__", make_init)
        self._wrap(dl._BaseDataLoaderIter, "__next__", make_next)

    def _record_loader(self, loader: Any) -> None:
        key = id(loader)
        if key in self.loaders:
            self.loaders[key]["iterations_started"] += 1
            return
        try:
            dataset_len: int | None = len(loader.dataset)
        except Exception:
            dataset_len = None
        sampler = getattr(loader, "sampler", None)
        self.loaders[key] = {
            "num_workers": getattr(loader, "num_workers", None),
            "pin_memory": getattr(loader, "pin_memory", None),
            "batch_size": getattr(loader, "batch_size", None),
            "persistent_workers": getattr(loader, "persistent_workers", None),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
            "drop_last": getattr(loader, "drop_last", None),
            "dataset": type(getattr(loader, "dataset", None)).__name__,
            "dataset_len": dataset_len,
            "sampler": type(sampler).__name__ if sampler is not None else None,
            "multiprocessing_context": _ctx_name(getattr(loader, "multiprocessing_context", None)),
            "iterations_started": 1,
        }

    def _patch_backward(self) -> None:
        import torch.autograd

        fw = self
        counters = self.counters

        def make(original: Any) -> Any:
            def backward(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter_ns()
                try:
                    return original(*a, **k)
                finally:
                    counters.bwd_ns += time.perf_counter_ns() - t0
                    counters.backwards += 1
                    if fw.first_activity_ns is None:
                        fw.first_activity_ns = t0

            return backward

        self._wrap(torch.autograd, "backward", make)

    def _patch_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        fw = self

        def make_init(original: Any) -> Any:
            def __init__(module: Any, *a: Any, **k: Any) -> Any:
                original(module, *a, **k)
                try:
                    fw._record_ddp(module, k)
                except Exception as e:
                    fw.on_error("framework.ddp", e)

            return __init__

        def make_no_sync(original: Any) -> Any:
            def no_sync(module: Any, *a: Any, **k: Any) -> Any:
                fw.no_sync_calls += 1
                return original(module, *a, **k)

            return no_sync

        self._wrap(DDP, "__init__", make_init)
        self._wrap(DDP, "no_sync", make_no_sync)

    def _record_ddp(self, module: Any, kwargs: dict[str, Any]) -> None:
        self.ddp.append(weakref.ref(module))
        self.ddp_args[id(module)] = {
            k: kwargs[k]
            for k in (
                "bucket_cap_mb",
                "find_unused_parameters",
                "gradient_as_bucket_view",
                "static_graph",
                "broadcast_buffers",
                "device_ids",
            )
            if k in kwargs
        }
        counters = self.counters

        def pre(_m: Any, _inputs: Any) -> None:
            counters.forwards += 1
            counters.fwd_ns -= time.perf_counter_ns()

        def post(_m: Any, _inputs: Any, _out: Any) -> None:
            counters.fwd_ns += time.perf_counter_ns()

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def patch_fsdp(self, fsdp_module: Any) -> None:
        """Called once torch.distributed.fsdp is imported."""
        cls = getattr(fsdp_module, "FullyShardedDataParallel", None)
        if cls is None:
            return
        fw = self

        def make_init(original: Any) -> Any:
            def __init__(module: Any, *a: Any, **k: Any) -> Any:
                original(module, *a, **k)
                try:
                    if not fw.fsdp or len(fw.fsdp) < 64:
                        fw.fsdp.append(_fsdp1_settings(module, k))
                except Exception as e:
                    fw.on_error("framework.fsdp", e)

            return __init__

        try:
            self._wrap(cls, "__init__", make_init)
        except Exception as e:
            self.on_error("framework.fsdp", e)

    def _patch_grad_scaler(self) -> None:
        from torch.amp import grad_scaler

        fw = self

        def make(original: Any) -> Any:
            def scale(scaler: Any, *a: Any, **k: Any) -> Any:
                fw.grad_scaler_calls += 1
                return original(scaler, *a, **k)

            return scale

        self._wrap(grad_scaler.GradScaler, "scale", make)

    def _install_forward_hook(self) -> None:
        from torch.nn.modules import module as nn_module

        seen = self.autocast_seen

        def hook(_m: Any, _inputs: Any) -> None:
            for dev in ("cuda", "cpu"):
                try:
                    if torch.is_autocast_enabled(dev):
                        seen.setdefault(dev, set()).add(str(_autocast_dtype(dev)))
                except Exception:
                    pass

        self._forward_hook = nn_module.register_module_forward_pre_hook(hook)

    def stop_forward_hook(self) -> None:
        if self._forward_hook is not None:
            try:
                self._forward_hook.remove()
            except Exception:
                pass
            self._forward_hook = None

    def note_optimizer(self, opt: Any) -> None:
        for ref in self.optimizers:
            if ref() is opt:
                return
        if len(self.optimizers) < 16:
            self.optimizers.append(weakref.ref(opt))

    # -- facts ------------------------------------------------------------------------

    def facts(self) -> dict[str, Any]:
        """Current facts; objects already freed (the model after training, at exit)
        are described as they were last seen."""
        out: dict[str, Any] = {}
        for key, fn in (
            ("ddp", self._ddp_facts),
            ("fsdp", self._fsdp_facts),
            ("amp", self._amp_facts),
            ("dataloaders", lambda: list(self.loaders.values())),
            ("grad_accumulation", self._accumulation_facts),
            ("optimizers", self._optimizer_facts),
            ("parameters", self._parameter_facts),
            ("device", _device_facts),
            ("versions", _versions),
            ("threads", _thread_facts),
        ):
            try:
                out[key] = fn()
            except Exception as e:
                self.on_error(f"meta.{key}", e)
                out[key] = None
        if not self._live_optimizers() and self._last_facts:
            for key in ("fsdp", "optimizers", "parameters"):
                out[key] = self._last_facts.get(key)
        self._last_facts = out
        return out

    def _ddp_facts(self) -> list[dict[str, Any]]:
        for i, ref in enumerate(self.ddp):
            m = ref()
            if m is not None:
                self._ddp_seen[i] = self._describe_ddp(m)
        return [self._ddp_seen[i] for i in sorted(self._ddp_seen)]

    def _describe_ddp(self, m: Any) -> dict[str, Any]:
        d: dict[str, Any] = {"args": dict(self.ddp_args.get(id(m), {}))}
        d["static_graph"] = bool(getattr(m, "static_graph", False))
        d["find_unused_parameters"] = bool(getattr(m, "find_unused_parameters", False))
        d["gradient_as_bucket_view"] = bool(getattr(m, "gradient_as_bucket_view", False))
        cap = getattr(m, "bucket_bytes_cap", None)
        d["bucket_cap_mb"] = cap / (1024 * 1024) if isinstance(cap, (int, float)) else None
        d["comm_hook"] = _comm_hook_name(m)
        d["logging"] = _ddp_logging_data(m)
        sizes = _int_list(d["logging"].get("rebuilt_bucket_sizes")) or _int_list(
            d["logging"].get("bucket_sizes")
        )
        d["bucket_sizes_bytes"] = sizes
        d["bucket_count"] = len(sizes) if sizes else None
        return d

    def _fsdp_facts(self) -> dict[str, Any] | None:
        fsdp2 = _fsdp2_facts(self._live_optimizers())
        if not self.fsdp and not fsdp2:
            return None
        return {"fsdp1": self.fsdp[:8], "fsdp1_wrapped_modules": len(self.fsdp), "fsdp2": fsdp2}

    def _amp_facts(self) -> dict[str, Any]:
        return {
            "autocast": {dev: sorted(dtypes) for dev, dtypes in self.autocast_seen.items()},
            "grad_scaler_calls": self.grad_scaler_calls,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        }

    def _accumulation_facts(self) -> dict[str, Any]:
        bps = self.backwards_per_step
        return {
            "no_sync_calls": self.no_sync_calls,
            "backwards_per_step": _median(bps),
            "backwards_per_step_max": max(bps) if bps else None,
            "steps_seen": len(bps),
        }

    def _live_optimizers(self) -> list[Any]:
        return [o for o in (r() for r in self.optimizers) if o is not None]

    def _optimizer_facts(self) -> list[dict[str, Any]]:
        out = []
        for opt in self._live_optimizers():
            state_bytes = 0
            for st in opt.state.values():
                for v in st.values() if isinstance(st, dict) else ():
                    if isinstance(v, torch.Tensor):
                        state_bytes += _local_bytes(v)
            groups = opt.param_groups
            out.append(
                {
                    "class": type(opt).__name__,
                    "param_groups": len(groups),
                    "lr": groups[0].get("lr") if groups else None,
                    "state_bytes": state_bytes,
                    "foreach": groups[0].get("foreach") if groups else None,
                    "fused": groups[0].get("fused") if groups else None,
                }
            )
        return out

    def _parameter_facts(self) -> dict[str, Any]:
        seen: set[int] = set()
        count = numel = nbytes = 0
        dtypes: dict[str, int] = {}
        devices: set[str] = set()
        for opt in self._live_optimizers():
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                    count += 1
                    numel += p.numel()
                    b = _local_bytes(p)
                    nbytes += b
                    dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + b
                    devices.add(str(p.device))
        return {
            "tensors": count,
            "numel": numel,
            "local_bytes": nbytes,
            "bytes_by_dtype": dtypes,
            "devices": sorted(devices),
        }


# -- helpers ------------------------------------------------------------------------------


def _autocast_dtype(dev: str) -> Any:
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(dev)
    return torch.get_autocast_gpu_dtype() if dev == "cuda" else torch.get_autocast_cpu_dtype()


def _ctx_name(ctx: Any) -> str | None:
    if ctx is None:
        return None
    get = getattr(ctx, "get_start_method", None)
    return get() if callable(get) else str(ctx)


def _local_bytes(t: Any) -> int:
    local = getattr(t, "_local_tensor", None)  # DTensor: only this rank's shard
    if local is not None:
        t = local
    return int(t.numel() * t.element_size())


def _median(xs: list[int]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _int_list(v: Any) -> list[int]:
    if isinstance(v, str):
        return [int(x) for x in v.replace(",", " ").split() if x.strip().isdigit()]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return []


def _ddp_logging_data(m: Any) -> dict[str, Any]:
    try:
        data = m._get_ddp_logging_data()
    except Exception:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool))}


def _comm_hook_name(m: Any) -> str | None:
    hook = getattr(m, "_comm_hook", None) or getattr(getattr(m, "logger", None), "comm_hook", None)
    if hook is None:
        return None
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def _fsdp1_settings(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    def text(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return str(v)

    return {
        "module": type(getattr(module, "module", module)).__name__,
        "sharding_strategy": text(getattr(module, "sharding_strategy", None) or kwargs.get("sharding_strategy")),
        "mixed_precision": text(getattr(module, "mixed_precision", None) or kwargs.get("mixed_precision")),
        "cpu_offload": text(kwargs.get("cpu_offload")),
        "use_orig_params": text(kwargs.get("use_orig_params")),
        "backward_prefetch": text(kwargs.get("backward_prefetch")),
        "forward_prefetch": text(kwargs.get("forward_prefetch")),
        "limit_all_gathers": text(kwargs.get("limit_all_gathers")),
    }


def _fsdp2_facts(optimizers: list[Any]) -> dict[str, Any] | None:
    """FSDP2 (`fully_shard`) parameters are DTensors sharded over a device mesh."""
    n = 0
    mesh: Any = None
    placements: set[str] = set()
    for opt in optimizers:
        for g in opt.param_groups:
            for p in g["params"]:
                dm = getattr(p, "device_mesh", None)
                if dm is None or not hasattr(p, "placements"):
                    continue
                n += 1
                mesh = dm
                placements.add(str(tuple(p.placements)))
    if not n:
        return None
    return {
        "dtensor_params": n,
        "mesh_shape": list(getattr(mesh, "shape", ()) or ()),
        "mesh_dim_names": list(getattr(mesh, "mesh_dim_names", None) or ()),
        "placements": sorted(placements),
    }


def _device_facts() -> dict[str, Any]:
    d: dict[str, Any] = {"cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        i = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        d.update(
            {
                "type": "cuda",
                "index": i,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "total_memory_bytes": props.total_memory,
                "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(i),
                "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(i),
                "uuid": str(getattr(props, "uuid", "")) or None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        )
    else:
        d["type"] = "cpu"
        d["name"] = platform.processor() or platform.machine()
        d.update(_cpu_facts())
    budget = os.environ.get("PARDIAG_MEMORY_PER_RANK")
    if budget and budget.isdigit():
        d["memory_budget_bytes"] = int(budget)  # `pardiag run --memory-per-rank`: plan for this device size
    return d


def _cpu_facts() -> dict[str, Any]:
    """For CPU training: bf16 matrix units, and host memory as this rank's share."""
    out: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    out["bf16_matmul"] = "amx_bf16" in flags or "avx512_bf16" in flags
                    out["amx"] = "amx_bf16" in flags
                    break
    except OSError:
        pass
    total = _host_memory_bytes()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    if total:
        out["total_memory_bytes"] = total // max(local, 1)
        out["memory_is_host_share"] = True
    try:
        import resource

        out["max_memory_reserved_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        pass
    return out


def _host_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when that is lower."""
    total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                v = f.read().strip()
            if v.isdigit() and (total is None or int(v) < total):
                total = int(v)
        except OSError:
            continue
    return total


def _versions() -> dict[str, Any]:
    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "platform": platform.platform(),
    }
    try:
        if torch.cuda.is_available():
            nv = torch.cuda.nccl.version()
            v["nccl"] = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else str(nv)
            v["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    return v


def _thread_facts() -> dict[str, Any]:
    return {
        "torch_num_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python_executable": sys.executable,
    }
