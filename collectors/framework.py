"""What the training process actually used: DDP and FSDP settings, AMP, DataLoaders,
gradient accumulation, parameters and optimizer state, the framework that drives the
optimizer, device and versions.

Nothing here may change what the job computes or how its code is called. torch has
hooks for optimizer steps (used by the runtime); for the rest a few callables are
wrapped at class level — nothing is attached to the user's objects, so pickling,
`torch.save(model)`, `copy.deepcopy`, `isinstance` and `type()` see what they would see
without pardiag:
- `DataLoader.__iter__` and the iterator's `__next__`: the loader's settings and the
  time the step waits for input;
- `torch.autograd.backward`: time in backward and passes per step;
- `DistributedDataParallel.forward`: the DDP modules used, forward time, and the
  forwards run under `no_sync()` (DDP's own `require_backward_grad_sync` flag);
- `FullyShardedDataParallel.forward` (FSDP1, once imported): each unit's settings,
  read from the unit's attributes;
- `autocast.__enter__`: the autocast dtypes used; `GradScaler.scale`: fp16 loss scaling.
No constructor is wrapped. Each wrapper takes `self` positional-only and passes every
other argument through untouched, so no caller's keyword can collide with it;
`inspect.signature` gives the original's (`__wrapped__`); a re-entrant call and any
call while torch.compile traces go straight to the original; a failure of the
wrapper's own bookkeeping is recorded once and turns it into a plain pass-through.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import sys
import time
import types
import weakref
from typing import Any, Callable

import torch

from pardiag.collectors.device_memory import DeviceMemoryProbe

log = logging.getLogger("pardiag.collectors")

# Frameworks that can drive a torch optimizer, by the module prefix of their frames.
# The outermost one on the stack of the first optimizer step is the job's framework.
FRAMEWORK_PREFIXES: tuple[tuple[str, str], ...] = (
    ("lightning.pytorch", "lightning"),
    ("pytorch_lightning", "lightning"),
    ("lightning.fabric", "lightning_fabric"),
    ("lightning_fabric", "lightning_fabric"),
    ("transformers", "transformers"),
    ("accelerate", "accelerate"),
    ("deepspeed", "deepspeed"),
)
# Top-level package whose __version__ is the framework's version.
FRAMEWORK_PACKAGES = {
    "lightning": ("lightning", "pytorch_lightning"),
    "lightning_fabric": ("lightning", "lightning_fabric"),
    "transformers": ("transformers",),
    "accelerate": ("accelerate",),
    "deepspeed": ("deepspeed",),
}
KNOWN_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric", "transformers", "accelerate", "deepspeed", "peft", "trl")


class StepCounters:
    """Host-side timings accumulated between two step boundaries. The collector writes
    the ones named in `pardiag.step_records.SIGNALS` to steps.jsonl."""

    __slots__ = ("data_ns", "data_cpu_ns", "data_calls", "bwd_ns", "backwards", "fwd_ns", "forwards", "no_sync_forwards", "opt_ns",
                 "faults", "bwd_faults", "faults_seen", "in_elems",
                 "gc_ns", "gcs", "gc_seen", "cpu_ns", "cpu_seen", "pcpu_ns", "pcpu_seen", "runq_ns", "runq_seen", "nivcsw", "nivcsw_seen",
                 "rss_mb", "rss_seen", "act_bytes", "act_seen", "dev_alloc_bytes", "dev_alloc_seen")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.data_ns = 0
        self.data_cpu_ns = 0  # the training thread's CPU time inside those calls (the loading it does itself)
        self.data_calls = 0
        self.bwd_ns = 0
        self.backwards = 0
        self.fwd_ns = 0
        self.forwards = 0
        self.no_sync_forwards = 0
        self.opt_ns = 0  # the lead optimizer's step(), set by the runtime's hooks
        self.faults = 0  # the process's minor page faults in the step, set at the boundary
        self.bwd_faults = 0  # ... inside torch.autograd.backward
        self.faults_seen = 0  # 1 when the faults were counted (getrusage exists)
        self.in_elems = 0  # elements of the first tensor argument of each DDP forward
        # host signals (collectors/host_signals.py), set at the boundary; *_seen: 1 when read
        self.gc_ns = self.gcs = self.gc_seen = 0
        self.cpu_ns = self.cpu_seen = 0
        self.pcpu_ns = self.pcpu_seen = 0
        self.runq_ns = self.runq_seen = 0
        self.nivcsw = self.nivcsw_seen = 0
        self.rss_mb = 0.0
        self.rss_seen = 0
        # device memory on sampled steps (device_memory.py)
        self.act_bytes = self.act_seen = 0
        self.dev_alloc_bytes = self.dev_alloc_seen = 0


def minor_faults() -> int | None:
    """The process's minor page faults so far (all its threads); None where getrusage
    does not exist."""
    if _getrusage is None:
        return None
    try:
        return _getrusage(_RUSAGE_SELF).ru_minflt
    except OSError:
        return None


try:
    from resource import RUSAGE_SELF as _RUSAGE_SELF, getrusage as _getrusage
except ImportError:  # not on Unix
    _getrusage = None
    _RUSAGE_SELF = 0


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    """The first tensor among a forward's arguments (a batch of token ids), looking one
    level into a list, tuple or dict; None without one."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, (list, tuple)):
            for w in v:
                if isinstance(w, torch.Tensor):
                    return w
        elif isinstance(v, dict):
            for w in v.values():
                if isinstance(w, torch.Tensor):
                    return w
    return None


def _tensor_facts(t: Any, seen_in: str) -> dict[str, Any]:
    """A tensor's shape and dtype as plain JSON; what could not be read is said, so that
    an odd tensor (a subclass with symbolic sizes) costs this fact, not the forward's timing."""
    try:
        return {"shape": [int(d) for d in t.shape], "dtype": str(t.dtype).removeprefix("torch."), "seen_in": seen_in}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:200], "seen_in": seen_in}


# While torch.compile traces, every wrapper calls straight through, so the traced code
# is the code the job would have had.
_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


class Framework:
    """Installs the hooks and wrappers and turns what they saw into `meta.json` facts."""

    MAX_MODULES = 64

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self.on_error = on_error
        self.counters = StepCounters()
        self.device_memory = DeviceMemoryProbe(on_error)
        self.first_activity_ns: int | None = None
        self.ddp: list[weakref.ref[Any]] = []
        self.fsdp: list[dict[str, Any]] = []
        self.loaders: dict[int, dict[str, Any]] = {}
        self.optimizers: list[weakref.ref[Any]] = []
        self.autocast_seen: dict[str, set[str]] = {}
        self.no_sync_calls = 0
        self.first_input: dict[str, Any] | None = None  # the first DDP forward's first tensor: shape, dtype
        self.grad_scaler_calls = 0
        self.backwards_per_step: list[int] = []
        self.framework: dict[str, Any] | None = None
        self.patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
        self.eager_codes: list[Any] = []
        self._failed: set[str] = set()
        self._depth = {"next": 0, "backward": 0}
        self._module_ids: set[int] = set()
        self._last_facts: dict[str, Any] = {}
        self._ddp_seen: dict[int, dict[str, Any]] = {}

    # -- installation -----------------------------------------------------------------

    def install(self) -> None:
        for name, fn in (
            ("dataloader", self._patch_dataloader),
            ("backward", self._patch_backward),
            ("grad_scaler", self._patch_grad_scaler),
            ("autocast", self._patch_autocast),
            ("ddp", self._patch_ddp),
        ):
            try:
                fn()
            except Exception as e:  # a torch version without that API
                self.on_error(f"framework.{name}", e)

    def uninstall(self) -> None:
        """Put every wrapped callable back."""
        for owner, attr, original in reversed(self.patched):
            try:
                setattr(owner, attr, original)
            except Exception:
                pass
        self.patched.clear()

    def _fail(self, name: str, e: BaseException) -> None:
        """A wrapper's own bookkeeping failed: record it once and pass through from now on."""
        if name not in self._failed:
            self._failed.add(name)
            self.on_error(f"framework.{name}", e)

    def _wrap_method(self, name: str, owner: Any, attr: str, before: Callable[[Any, tuple, dict], Any],
                     after: Callable[[Any, Any], None] | None = None, eager: bool = False) -> None:
        """Wrap `owner.attr` (a function taking self first). `before(self, args, kwargs)`
        runs first and returns a token for `after(self, token)`, which runs when the
        original returns or raises. Arguments and the result pass through untouched.

        `eager`: torch.compile never traces the wrapper itself (see `skip_in_dynamo`)."""
        original = owner.__dict__[attr]
        fw = self
        depth = self._depth
        key = name if name in depth else None

        def wrapper(self, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            if _compiling() or name in fw._failed or (key is not None and depth[key]):
                return original(self, *args, **kwargs)
            try:
                token = before(self, args, kwargs)
            except Exception as e:
                fw._fail(name, e)
                return original(self, *args, **kwargs)
            if key is not None:
                depth[key] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                if key is not None:
                    depth[key] -= 1
                if after is not None:
                    try:
                        after(self, token)
                    except Exception as e:
                        fw._fail(name, e)

        if eager:  # its own code object, so that skipping it skips no other wrapper
            wrapper = types.FunctionType(wrapper.__code__.replace(), wrapper.__globals__, wrapper.__name__,
                                         wrapper.__defaults__, wrapper.__closure__)
            self.eager_codes.append(wrapper.__code__)
        functools.update_wrapper(wrapper, original)
        setattr(owner, attr, wrapper)
        self.patched.append((owner, attr, original))

    def skip_in_dynamo(self, _dynamo: Any = None) -> None:
        """torch.compile over a DDP model traces DDP.forward; traced, the wrapper would
        record nothing (it passes straight through while compiling). Marked as skipped,
        it runs eagerly and DDP.forward is compiled from its own frame, as torch itself
        does for DDP's `_inside_ddp_forward` (the same losses, bitwise, tested). Called
        once torch._dynamo is imported."""
        try:
            from torch._dynamo.eval_frame import skip_code

            for code in self.eager_codes:
                skip_code(code)
        except Exception as e:
            self.on_error("framework.dynamo", e)

    def _patch_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        counters = self.counters

        def before_next(_it: Any, _a: tuple, _k: dict) -> tuple[int, int]:
            return time.perf_counter_ns(), time.thread_time_ns()

        def after_next(_it: Any, t: tuple[int, int]) -> None:
            counters.data_cpu_ns += time.thread_time_ns() - t[1]
            counters.data_ns += time.perf_counter_ns() - t[0]
            counters.data_calls += 1
            if self.first_activity_ns is None:
                self.first_activity_ns = t[0]

        def before_iter(loader: Any, _a: tuple, _k: dict) -> None:
            self._record_loader(loader)

        self._wrap_method("next", dl._BaseDataLoaderIter, "__next__", before_next, after_next)
        self._wrap_method("dataloader", dl.DataLoader, "__iter__", before_iter)

    def _record_loader(self, loader: Any) -> None:
        key = id(loader)
        if key in self.loaders:
            self.loaders[key]["iterations_started"] += 1
            return
        if len(self.loaders) >= self.MAX_MODULES:
            return
        try:
            dataset_len: int | None = len(loader.dataset)
        except Exception:
            dataset_len = None
        sampler = getattr(loader, "sampler", None)
        self.loaders[key] = {
            "class": type(loader).__name__,
            "num_workers": getattr(loader, "num_workers", None),
            "pin_memory": getattr(loader, "pin_memory", None),
            "batch_size": getattr(loader, "batch_size", None),
            # a loader built with batch_sampler= (HF Trainer, Accelerate) has batch_size None
            "batch_sampler_batch_size": getattr(getattr(loader, "batch_sampler", None), "batch_size", None),
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
        """`torch.autograd.backward` is a module function (Tensor.backward calls it)."""
        import torch.autograd

        original = torch.autograd.backward
        fw = self
        counters = self.counters
        depth = self._depth
        memory = self.device_memory

        def backward(*args, **kwargs):  # type: ignore[no-untyped-def]
            if _compiling() or depth["backward"] or "backward" in fw._failed:
                return original(*args, **kwargs)
            if memory.armed:
                memory.at_backward(counters)
            f0 = minor_faults()
            t0 = time.perf_counter_ns()
            depth["backward"] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth["backward"] -= 1
                counters.bwd_ns += time.perf_counter_ns() - t0
                counters.backwards += 1
                f1 = minor_faults()
                if f0 is not None and f1 is not None:
                    counters.bwd_faults += f1 - f0
                if fw.first_activity_ns is None:
                    fw.first_activity_ns = t0

        functools.update_wrapper(backward, original)
        torch.autograd.backward = backward
        self.patched.append((torch.autograd, "backward", original))

    def _patch_grad_scaler(self) -> None:
        from torch.amp import grad_scaler

        def before(_scaler: Any, _a: tuple, _k: dict) -> None:
            self.grad_scaler_calls += 1

        self._wrap_method("grad_scaler", grad_scaler.GradScaler, "scale", before)

    def _patch_autocast(self) -> None:
        """Which autocast dtypes the job enters (torch.autocast and its cuda/cpu forms)."""
        from torch.amp import autocast_mode

        seen = self.autocast_seen

        def before(ctx: Any, _a: tuple, _k: dict) -> None:
            if getattr(ctx, "_enabled", False):
                seen.setdefault(str(ctx.device), set()).add(str(ctx.fast_dtype))

        self._wrap_method("autocast", autocast_mode.autocast, "__enter__", before)

    def _patch_ddp(self) -> None:
        """DDP modules the job calls, their forward time and the forwards under
        `no_sync()` (DDP's own `require_backward_grad_sync` flag), from the class's
        `forward`: nothing is attached to the user's module (hooks on it would make
        `torch.save(model)` fail to pickle them)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        counters = self.counters
        seen = self._module_ids
        memory = self.device_memory

        def before(m: Any, _a: tuple, _k: dict) -> int:
            if memory.armed:
                memory.at_forward()
            if id(m) not in seen and len(self.ddp) < self.MAX_MODULES:
                seen.add(id(m))
                self.ddp.append(weakref.ref(m))
            counters.forwards += 1
            t = _first_tensor(_a, _k)
            if t is not None:
                counters.in_elems += t.numel()
                if self.first_input is None:  # once: what a sample is (its shape past the batch)
                    self.first_input = _tensor_facts(t, "DistributedDataParallel.forward")
            if not getattr(m, "require_backward_grad_sync", True):
                counters.no_sync_forwards += 1
                self.no_sync_calls += 1
            return time.perf_counter_ns()

        def after(_m: Any, t0: int) -> None:
            counters.fwd_ns += time.perf_counter_ns() - t0

        self._wrap_method("ddp", DDP, "forward", before, after, eager=True)

    def patch_fsdp(self, fsdp_module: Any) -> None:
        """FSDP1 units the job calls, with their settings; called once
        torch.distributed.fsdp is imported."""
        cls = getattr(fsdp_module, "FullyShardedDataParallel", None)
        if cls is None or "forward" not in cls.__dict__:
            return
        seen = self._module_ids
        memory = self.device_memory

        def before(m: Any, _a: tuple, _k: dict) -> None:
            if memory.armed:
                memory.at_forward()
            if id(m) not in seen and len(self.fsdp) < self.MAX_MODULES:
                seen.add(id(m))
                self.fsdp.append(_fsdp1_settings(m))

        try:
            self._wrap_method("fsdp", cls, "forward", before)
        except Exception as e:
            self.on_error("framework.fsdp", e)

    def note_optimizer(self, opt: Any) -> None:
        for ref in self.optimizers:
            if ref() is opt:
                return
        if len(self.optimizers) < 16:
            self.optimizers.append(weakref.ref(opt))

    def note_step_caller(self, frame: Any) -> None:
        """Called once, from the first optimizer step: which framework drove it."""
        found: str | None = None
        depth = 0
        while frame is not None and depth < 200:
            name = frame.f_globals.get("__name__") or ""
            for prefix, fw_name in FRAMEWORK_PREFIXES:
                if name == prefix or name.startswith(prefix + "."):
                    found = fw_name  # keep going: the outermost frame wins
                    break
            frame = frame.f_back
            depth += 1
        self.framework = {
            "name": found or "torch",
            "version": _framework_version(found) if found else torch.__version__,
            "detected_from": "optimizer step caller",
        }

    # -- facts ------------------------------------------------------------------------

    def facts(self) -> dict[str, Any]:
        """Current facts; objects already freed (the model after training, at exit)
        are described as they were last seen."""
        out: dict[str, Any] = {}
        for key, fn in (
            ("ddp", self._ddp_facts),
            ("fsdp", self._fsdp_facts),
            ("amp", self._amp_facts),
            ("inputs", lambda: {"first": self.first_input} if self.first_input else None),
            ("dataloaders", lambda: list(self.loaders.values())),
            ("grad_accumulation", self._accumulation_facts),
            ("optimizers", self._optimizer_facts),
            ("parameters", self._parameter_facts),
            ("device", _device_facts),
            ("versions", _versions),
            ("threads", _thread_facts),
            ("framework", self._framework_facts),
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
                d = self._describe_ddp(m)
                # DDP refreshes unused_parameter_size only at the iterations it samples:
                # keep the largest seen at any write of meta.json
                prev = (self._ddp_seen.get(i) or {}).get("unused_parameter_size_max")
                cur = d["logging"].get("unused_parameter_size")
                sizes = [v for v in (prev, cur) if isinstance(v, int) and not isinstance(v, bool)]
                d["unused_parameter_size_max"] = max(sizes) if sizes else None
                self._ddp_seen[i] = d
        return [self._ddp_seen[i] for i in sorted(self._ddp_seen)]

    def _describe_ddp(self, m: Any) -> dict[str, Any]:
        # The constructor is not wrapped: its settings are read back from the module.
        d: dict[str, Any] = {
            "args": {
                k: _plain(getattr(m, k))
                for k in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph",
                          "broadcast_buffers", "device_ids")
                if hasattr(m, k)
            }
        }
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

    def _framework_facts(self) -> dict[str, Any]:
        loaded = {}
        for pkg in KNOWN_PACKAGES:
            mod = sys.modules.get(pkg)
            if mod is not None:
                loaded[pkg] = _version_of(mod)
        out = dict(self.framework or {"name": None, "version": None, "detected_from": "no optimizer step yet"})
        out["loaded"] = loaded
        out["wrapped"] = [f"{getattr(o, '__name__', type(o).__name__)}.{a}" for o, a, _ in self.patched]
        return out

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
                    # set by LR schedulers: the configured rate, where "lr" is mid-schedule
                    "initial_lr": groups[0].get("initial_lr") if groups else None,
                    "state_bytes": state_bytes,
                    "foreach": groups[0].get("foreach") if groups else None,
                    "fused": groups[0].get("fused") if groups else None,
                }
            )
        return out

    def _parameter_facts(self) -> dict[str, Any]:
        seen: set[int] = set()
        count = numel = nbytes = trainable = grads = 0
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
                    if p.requires_grad:
                        trainable += b
                    if p.grad is not None:
                        grads += _local_bytes(p.grad)
                    dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + b
                    devices.add(str(p.device))
        return {
            "tensors": count,
            "numel": numel,
            "local_bytes": nbytes,
            # parameters that train: each has a gradient of its size at the end of backward
            "trainable_bytes": trainable,
            # the gradients allocated when meta.json was written (a step boundary, after the
            # optimizer step, before a zero_grad of the next step)
            "grad_bytes": grads,
            "bytes_by_dtype": dtypes,
            "devices": sorted(devices),
        }


# -- helpers ------------------------------------------------------------------------------


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


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def _fsdp1_settings(module: Any) -> dict[str, Any]:
    """An FSDP1 unit's settings, as FSDP stored them on the module."""
    return {
        "module": type(getattr(module, "module", module)).__name__,
        "sharding_strategy": _plain(getattr(module, "sharding_strategy", None)),
        "mixed_precision": _plain(getattr(module, "mixed_precision", None)),
        "cpu_offload": _plain(getattr(module, "cpu_offload", None)),
        "use_orig_params": _plain(getattr(module, "_use_orig_params", None)),
        "backward_prefetch": _plain(getattr(module, "backward_prefetch", None)),
        "forward_prefetch": _plain(getattr(module, "forward_prefetch", None)),
        "limit_all_gathers": _plain(getattr(module, "limit_all_gathers", None)),
    }


def _version_of(mod: Any) -> str | None:
    v = getattr(mod, "__version__", None)
    return str(v) if v is not None else None


def _framework_version(name: str) -> str | None:
    for pkg in FRAMEWORK_PACKAGES.get(name, ()):
        mod = sys.modules.get(pkg)
        if mod is not None and _version_of(mod):
            return _version_of(mod)
    return None


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
    try:  # the process's peak resident memory, on every device (a GPU job's host side too)
        import resource

        d["host_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        pass
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
