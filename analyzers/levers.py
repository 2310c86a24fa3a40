"""The lever advisor: what to change, with the evidence and the expected gain.

One small rule per lever of DESIGN.md, in a table. A rule reads the Analysis (ranks,
collectives, stragglers, the framework facts each rank recorded) and returns a finding
or nothing. `est_saving_pct` is the share of the median step time the change would
remove, computed from this run's own figures under the assumption stated in the
finding; a lever the job already uses, or a healthy run, gets no finding.

Thresholds and where they come from (see ../shared/reference/anchors.md):
- dataloader: input wait >= 5% of the step (TensorBoard plugin rule 1; XProf: moderate
  at 5%, high at 20%).
- gradient_accumulation / ddp_bucket_size / comm_overlap: exposed communication >= 10%
  of the step (TensorBoard plugin rule 4); high at 20%. Waiting for other ranks inside a
  collective is left out: that is imbalance (the straggler lever), not transfer cost.
- straggler: see stragglers.py; severity as TraceML (warn 10%, critical 20%).
- mixed_precision: fp32/TF32 GEMM time >= 10% of the step on a GPU with tensor cores
  (TensorBoard plugin rule 6 fires on any eligible time; 10% keeps small gains quiet).
- sharding: device memory peak >= 90% of capacity (TensorBoard plugin rule 7), or model
  state (parameters + gradients + optimizer state) >= 60% of it.
- batch_size: peak memory <= 50% of capacity and GPU busy < 50% (TensorBoard plugin rule 5).
- sync_points: >= 2 host-device synchronisations per step (Nsight Systems cuda_api_sync).
- host_overhead: GPU idle >= 20% with median compute kernels under 20 us (launch-bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from pardiag.analysis import Analysis, Finding, RankResult

DOCS = {
    "dataloader": "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
    "no_sync": "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync",
    "ddp": "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "comm_hooks": "https://pytorch.org/docs/stable/ddp_comm_hooks.html",
    "amp": "https://pytorch.org/docs/stable/amp.html",
    "fsdp": "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html",
    "zero": "https://www.deepspeed.ai/tutorials/zero/",
    "cuda_graphs": "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs",
    "compile": "https://pytorch.org/docs/stable/generated/torch.compile.html",
    "sync": "https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution",
}
# Speed-up of bf16/fp16 tensor-core GEMMs over what the run used, per device generation
# (dense peak ratios from NVIDIA datasheets): fp32 SIMT -> bf16 is ~16x on A100/H100,
# TF32 -> bf16 is 2x. Real layers reach a fraction of peak, so the projection uses
# half of the peak ratio, capped at 4x.
PRECISION_SPEEDUP = {"fp32": 4.0, "tf32": 1.5, "unknown": 1.5}


@dataclass(frozen=True)
class Context:
    a: Analysis
    fw: dict[str, Any]
    step_us: float  # median step time over ranks (all steps)

    @property
    def ranks(self) -> list[RankResult]:
        return [r for r in self.a.ranks if r.window_us > 0]

    def share(self, key: str) -> float:
        """Mean over ranks of a breakdown category's share of the profiled window."""
        rs = self.ranks
        if not rs:
            return 0.0
        return sum(r.breakdown_us.get(key, 0.0) / r.window_us for r in rs) / len(rs)

    def exposed_transfer(self) -> float:
        """Exposed communication without the time ranks waited for each other inside it
        (that is imbalance, not the cost of moving data), as a share of the window: a
        rank's exposed time is scaled by the share of its collective time that was
        transfer, transfer / (transfer + wait)."""
        rs = self.ranks
        if not rs:
            return 0.0
        total = 0.0
        for r in rs:
            coll = r.transfer_us + r.wait_us
            frac = r.transfer_us / coll if coll > 0 else 1.0
            total += r.breakdown_us.get("comm_exposed", 0.0) * frac / r.window_us
        return total / len(rs)

    @property
    def gpu(self) -> bool:
        return any(r.device_type == "cuda" for r in self.a.ranks)

    @property
    def ddp(self) -> dict[str, Any] | None:
        d = self.fw.get("ddp") or []
        return d[0] if d else None


Rule = Callable[[Context], Finding | None]


def _sev(share: float, medium: float, high: float) -> str:
    return "high" if share >= high else "medium" if share >= medium else "low"


def _pct(x: float) -> float:
    return round(100.0 * x, 1)


# -- rules ------------------------------------------------------------------------------


def straggler(ctx: Context) -> Finding | None:
    if not ctx.a.stragglers or ctx.step_us <= 0:
        return None
    s = max(ctx.a.stragglers, key=lambda s: s.excess_us_per_step)
    # fixed, the others stop waiting for it: the step shrinks by their extra wait
    held = s.held_us_per_step if s.held_us_per_step is not None else s.excess_us_per_step
    share = held / ctx.step_us
    what = {
        "dataloader": "rank {r} waits longer for its input: check that each rank's shard of the data costs the same "
        "(sample sizes, augmentation), give it more DataLoader workers, or check its disk/network.",
        "forward": "rank {r} computes longer in forward: uneven inputs (sequence lengths, padding), another process "
        "on its CPU or GPU, or a slower device (clocks, thermal throttling).",
        "backward": "rank {r} computes longer in backward: uneven inputs, contention on its CPU/GPU, or a slower device.",
        "optimizer": "rank {r} spends longer in the optimizer step: extra work only on that rank (logging, "
        "checkpointing, EMA) or a slower device.",
        "host overhead": "rank {r} spends longer outside forward/backward: Python work only on that rank "
        "(logging, metrics, checkpoints) or CPU contention (pin threads, OMP_NUM_THREADS).",
    }.get(s.cause, "rank {r} is slower; compare its phases with the others'.")
    return Finding(
        lever="straggler",
        severity=_sev(share, 0.10, 0.20),
        title=f"rank {s.rank} is {s.excess_us_per_step / 1000:.1f} ms per step slower ({s.cause}); "
              f"the others wait {held / 1000:.1f} ms per step for it",
        evidence=list(s.evidence),
        ranks=[s.rank],
        est_saving_pct=_pct(min(share, 0.95)),
        action={"text": what.format(r=s.rank), "assumption": "the others stop waiting for it", "code": f"# check rank {s.rank}: nvidia-smi -q -d CLOCK,PERFORMANCE; top -H -p <pid>"},
    )


def dataloader(ctx: Context) -> Finding | None:
    shares = []
    for r in ctx.a.ranks:
        hp = r.host_phases_us
        if hp.get("step"):
            shares.append(hp.get("dataloader", 0.0) / hp["step"])
    share = sum(shares) / len(shares) if shares else ctx.share("dataloader")
    source = "median over all steps (steps.jsonl)" if shares else "share of the profiled window"
    if share < 0.05:
        return None
    loaders = ctx.fw.get("dataloaders") or []
    cur = loaders[0] if loaders else {}
    workers = int(cur.get("num_workers") or 0)
    cpus = ((ctx.fw.get("threads") or {}).get("sched_affinity") or 8)
    per_rank_cpus = max(1, cpus // max(1, _local_ranks(ctx)))
    # one batch takes `share` of a step to load on the main process; with w workers
    # loading in parallel the wait disappears once w * step >= load time
    need = max(2, math.ceil(share / max(1e-6, 1 - share)) + 1) if workers == 0 else workers * 2
    proposal = min(need, per_rank_cpus) if per_rank_cpus > 1 else need
    args = [f"num_workers={proposal}", "persistent_workers=True", "prefetch_factor=2"]
    if ctx.gpu and not cur.get("pin_memory"):
        args.append("pin_memory=True")
    return Finding(
        lever="dataloader",
        severity=_sev(share, 0.05, 0.20),
        title=f"{share:.0%} of each step waits for input" + (f" (DataLoader num_workers={workers})" if cur else ""),
        evidence=[f"DataLoader wait {share:.1%} of the step ({source})"] + (
            [f"DataLoader: num_workers={workers}, pin_memory={cur.get('pin_memory')}, "
             f"persistent_workers={cur.get('persistent_workers')}, batch_size={cur.get('batch_size')}"] if cur else []
        ),
        ranks=[r.rank for r in ctx.a.ranks],
        est_saving_pct=_pct(share * 0.9),
        action={"code": f"DataLoader(dataset, batch_size=..., {', '.join(args)})", "doc": DOCS["dataloader"],
                "assumption": "workers load batches while the GPU/CPU computes; 90% of the wait hidden"},
    )


def _local_ranks(ctx: Context) -> int:
    hosts = {r.host for r in ctx.a.ranks if r.host}
    return max(1, len(ctx.a.ranks) // max(1, len(hosts)))


def gradient_accumulation(ctx: Context) -> Finding | None:
    exposed = ctx.exposed_transfer()
    acc = ctx.fw.get("grad_accumulation") or {}
    if exposed < 0.10 or not ctx.ddp or (acc.get("backwards_per_step") or 1) > 1:
        return None
    k = 4
    saving = exposed * (1 - 1 / k)
    return Finding(
        lever="gradient_accumulation",
        severity=_sev(exposed, 0.10, 0.20),
        title=f"communication not hidden by compute takes {exposed:.0%} of the step; accumulate {k} micro-batches per sync",
        evidence=[f"exposed communication {exposed:.1%} of the profiled time (mean over ranks, "
                  "waiting for other ranks left out)",
                  "one backward pass per optimizer step (no gradient accumulation)"],
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action={
            "code": (
                f"for i, batch in enumerate(loader):\n"
                f"    sync = (i + 1) % {k} == 0\n"
                f"    with (contextlib.nullcontext() if sync else model.no_sync()):\n"
                f"        (loss_fn(model(batch)) / {k}).backward()\n"
                f"    if sync:\n"
                f"        optimizer.step(); optimizer.zero_grad()"
            ),
            "doc": DOCS["no_sync"],
            "assumption": f"exposed communication paid once per {k} micro-batches; the global batch grows {k}x "
                          "(scale the learning rate or shrink the micro-batch)",
        },
    )


def ddp_bucket_size(ctx: Context) -> Finding | None:
    d = ctx.ddp
    exposed = ctx.exposed_transfer()
    if not d or exposed < 0.05:
        return None
    sizes = d.get("bucket_sizes_bytes") or []
    total = sum(sizes)
    cap = d.get("bucket_cap_mb") or 25.0
    ar = [c for c in ctx.a.collectives if c.op == "all_reduce" and c.calls]
    mean_bytes = sum(c.bytes for c in ar) / sum(c.calls for c in ar) if ar and any(c.bytes for c in ar) else None
    evidence = [f"exposed communication {exposed:.1%} of the profiled time",
                f"bucket_cap_mb={cap:g}: {len(sizes)} bucket(s) of {', '.join(f'{b / 2**20:.1f}' for b in sizes)} MB"]
    if len(sizes) == 1 and total > 0:
        new_cap = max(1.0, round(total / 4 / 2**20, 1))
        why = "one bucket: its all-reduce can only start after the whole backward pass"
        saving = min(exposed * 0.5, ctx.share("compute") * 0.5)
    elif mean_bytes is not None and mean_bytes < 1 << 20 and len(sizes) > 8:
        new_cap = min(100.0, cap * 4)
        why = f"many small all-reduces (mean {mean_bytes / 2**10:.0f} KB): latency-bound"
        saving = exposed * 0.25
        evidence.append(f"{sum(c.calls for c in ar)} all-reduces in the window, mean {mean_bytes / 2**10:.0f} KB")
    else:
        return None
    extra = []
    if not d.get("gradient_as_bucket_view"):
        extra.append("gradient_as_bucket_view=True")
    if not d.get("static_graph") and not d.get("find_unused_parameters"):
        extra.append("static_graph=True")
    args = ", ".join([f"bucket_cap_mb={new_cap:.3g}"] + extra)
    code = f"model = DistributedDataParallel(model, {args})"
    if not d.get("comm_hook") and exposed >= 0.10:
        code += ("\n# and send gradients in bf16 (half the bytes):\n"
                 "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
                 "model.register_comm_hook(None, default_hooks.bf16_compress_hook)")
    return Finding(
        lever="ddp_bucket_size",
        severity=_sev(exposed, 0.10, 0.20),
        title=f"DDP buckets: {why}; try bucket_cap_mb={new_cap:.3g}",
        evidence=evidence,
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action={"code": code, "doc": DOCS["ddp"],
                "assumption": "half of the exposed all-reduce overlaps the remaining backward pass"},
    )


def comm_overlap(ctx: Context) -> Finding | None:
    exposed = ctx.exposed_transfer()
    hidden = ctx.share("comm_overlapped")
    if exposed < 0.10 or hidden > exposed or ctx.ddp:
        return None  # DDP overlap is tuned through its buckets
    fsdp = ctx.fw.get("fsdp")
    if fsdp:
        code = ("# FSDP2: prefetch the next layer's all-gather\n"
                "for prev, nxt in zip(layers, layers[1:]):\n    prev.set_modules_to_forward_prefetch([nxt])\n"
                "model.set_reshard_after_forward(False)  # trades memory for fewer all-gathers")
        doc = DOCS["fsdp"]
    else:
        code = ("work = dist.all_reduce(tensor, async_op=True)  # start it early\n"
                "# ... independent compute ...\nwork.wait()")
        doc = DOCS["sync"]
    return Finding(
        lever="comm_overlap",
        severity=_sev(exposed, 0.10, 0.20),
        title=f"{exposed:.0%} of the step is communication that nothing overlaps",
        evidence=[f"exposed communication {exposed:.1%}, overlapped {hidden:.1%} of the profiled time"],
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(min(exposed, ctx.share("compute")) * 0.5),
        action={"code": code, "doc": doc, "assumption": "half of the exposed communication hidden under compute"},
    )


CPU_BF16_SPEEDUP = 2.0  # AMX bf16 GEMMs measured 3.6x fp32 on one core; half of it for whole layers


def mixed_precision(ctx: Context) -> Finding | None:
    amp = ctx.fw.get("amp") or {}
    if amp.get("autocast"):
        return None
    if not ctx.gpu:
        return _cpu_mixed_precision(ctx)
    gemm: dict[str, float] = {}
    window = 0.0
    for r in ctx.ranks:
        window += r.window_us
        for k, v in (r.ops.get("gemm_us") or {}).items():
            gemm[k] = gemm.get(k, 0.0) + v
    slow = {k: v for k, v in gemm.items() if k in ("fp32", "tf32")}
    share = sum(slow.values()) / window if window else 0.0
    if share < 0.10:
        return None
    saving = sum(v / window * (1 - 1 / PRECISION_SPEEDUP[k]) for k, v in slow.items())
    cap = (ctx.fw.get("device") or {}).get("capability") or ""
    dtype = "torch.bfloat16" if cap and cap >= "8" else "torch.float16"
    code = (f"with torch.autocast(device_type='cuda', dtype={dtype}):\n    loss = loss_fn(model(batch))\nloss.backward()")
    if dtype == "torch.float16":
        code = ("scaler = torch.amp.GradScaler()\nwith torch.autocast(device_type='cuda', dtype=torch.float16):\n"
                "    loss = loss_fn(model(batch))\nscaler.scale(loss).backward()\nscaler.step(optimizer); scaler.update()")
    return Finding(
        lever="mixed_precision",
        severity=_sev(share, 0.10, 0.30),
        title=f"{share:.0%} of the step runs fp32/TF32 matrix multiplies without autocast",
        evidence=[f"GEMM kernel time by precision: " + ", ".join(f"{k} {v / 1000:.1f} ms" for k, v in sorted(gemm.items())),
                  "no autocast seen in forward"],
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action={"code": code, "doc": DOCS["amp"],
                "assumption": "fp32 GEMMs run 4x and TF32 GEMMs 1.5x faster in bf16/fp16 (half the peak ratios)"},
    )


def _cpu_mixed_precision(ctx: Context) -> Finding | None:
    """CPUs with bf16 matrix units (AMX, AVX512-BF16) run bf16 GEMMs several times faster."""
    dev = ctx.fw.get("device") or {}
    dtypes = set(((ctx.fw.get("parameters") or {}).get("bytes_by_dtype") or {}))
    if not dev.get("bf16_matmul") or (dtypes and dtypes != {"torch.float32"}):
        return None
    window = sum(r.window_us for r in ctx.ranks)
    gemm = sum(float(r.ops.get("cpu_gemm_us") or 0.0) for r in ctx.ranks)
    share = gemm / window if window else 0.0
    if share < 0.10:
        return None
    return Finding(
        lever="mixed_precision",
        severity=_sev(share, 0.10, 0.30),
        title=f"{share:.0%} of the step is fp32 matrix multiplies on a CPU with bf16 matrix units",
        evidence=[f"matmul/conv operators {gemm / 1000:.1f} ms of {window / 1000:.1f} ms profiled (all ranks)",
                  f"CPU has {'AMX' if dev.get('amx') else 'AVX512-BF16'}; parameters are float32; no autocast seen"],
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(share * (1 - 1 / CPU_BF16_SPEEDUP)),
        action={"code": "with torch.autocast(device_type='cpu', dtype=torch.bfloat16):\n"
                        "    loss = loss_fn(model(batch))\nloss.backward()",
                "doc": DOCS["amp"], "assumption": f"matmuls {CPU_BF16_SPEEDUP:g}x faster in bf16"},
    )


def sharding(ctx: Context) -> Finding | None:
    dev = ctx.fw.get("device") or {}
    total = dev.get("memory_budget_bytes") or dev.get("total_memory_bytes")
    params = (ctx.fw.get("parameters") or {}).get("local_bytes") or 0
    opt = sum(o.get("state_bytes") or 0 for o in ctx.fw.get("optimizers") or [])
    if not total or not params:
        return None
    state = 2 * params + opt  # parameters, gradients, optimizer state (this rank's share)
    peak = ctx.fw.get("peak_memory_reserved_bytes_max") or dev.get("max_memory_reserved_bytes") or 0
    n = max(1, int(ctx.a.run.get("world_size") or 1))
    gb = 2**30
    where = ("the planned " if dev.get("memory_budget_bytes") else "") + (
        "host memory share" if dev.get("memory_is_host_share") and not dev.get("memory_budget_bytes") else "device")
    ev = [f"model state {state / gb:.2f} GB per rank (parameters {params / gb:.2f}, gradients {params / gb:.2f}, "
          f"optimizer {opt / gb:.2f}) on {where} of {total / gb:.1f} GB; peak {peak / gb:.2f} GB"]
    if ctx.fw.get("fsdp") and state * n < 0.25 * total and ctx.exposed_transfer() >= 0.10:
        return Finding(
            lever="sharding", severity="medium",
            title="the whole model state fits one device: DDP would avoid FSDP's all-gathers",
            evidence=ev + [f"unsharded model state {state * n / gb:.2f} GB is under 25% of the device",
                           f"exposed communication {ctx.exposed_transfer():.0%}"],
            ranks=[], est_saving_pct=None,
            action={"code": "model = DistributedDataParallel(model)  # instead of fully_shard(model)", "doc": DOCS["ddp"]},
        )
    if ctx.fw.get("fsdp") or (peak < 0.90 * total and state < 0.60 * total):
        return None
    if opt >= params and 2 * params + opt / n < 0.6 * total:
        stage, code = "ZeRO-1 (shard the optimizer state)", "# torch: ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW)"
        after = 2 * params + opt / n
    elif params + (params + opt) / n < 0.6 * total:
        stage, code = "ZeRO-2 (shard gradients and optimizer state)", "# DeepSpeed: zero_optimization.stage = 2"
        after = params + (params + opt) / n
    elif state / n < 0.6 * total:
        stage, code = "FSDP / ZeRO-3 (shard parameters too)", "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)"
        after = state / n
    else:
        return Finding(
            lever="sharding", severity="high",
            title="model state does not fit even fully sharded: add tensor or pipeline parallelism",
            evidence=ev + [f"fully sharded over {n} ranks: {state / n / gb:.2f} GB per rank"],
            ranks=[], est_saving_pct=None, action={"doc": DOCS["fsdp"], "text": "split layers across devices (tensor/pipeline parallel)"},
        )
    return Finding(
        lever="sharding", severity="high" if peak >= 0.9 * total else "medium",
        title=f"device memory is the limit: {stage} frees room for larger batches",
        evidence=ev + [f"after sharding over {n} ranks: about {after / gb:.2f} GB of model state per rank"],
        ranks=[], est_saving_pct=None,
        action={"code": code, "doc": DOCS["zero"] if "ZeRO" in stage else DOCS["fsdp"]},
    )


def batch_size(ctx: Context) -> Finding | None:
    dev = ctx.fw.get("device") or {}
    total = dev.get("total_memory_bytes")
    peak = ctx.fw.get("peak_memory_reserved_bytes_max") or 0
    if not ctx.gpu or not total or not peak:
        return None
    busy = 1 - ctx.share("idle") - ctx.share("dataloader")
    if peak > 0.5 * total or busy >= 0.5:
        return None
    loaders = ctx.fw.get("dataloaders") or []
    bs = (loaders[0].get("batch_size") if loaders else None) or "B"
    return Finding(
        lever="batch_size", severity="medium",
        title=f"the GPU is busy {busy:.0%} of the step and uses {peak / total:.0%} of its memory: a larger batch amortises overheads",
        evidence=[f"peak memory reserved {peak / 2**30:.1f} of {total / 2**30:.0f} GB", f"GPU busy {busy:.0%} of the profiled time"],
        ranks=[r.rank for r in ctx.ranks], est_saving_pct=None,
        action={"code": f"DataLoader(dataset, batch_size={bs if isinstance(bs, str) else bs * 2}, ...)  # and scale the learning rate",
                "assumption": "throughput per sample improves; convergence may need a learning-rate change"},
    )


def sync_points(ctx: Context) -> Finding | None:
    if not ctx.gpu:
        return None
    calls = steps = 0
    for r in ctx.ranks:
        calls += int(r.ops.get("sync_calls") or 0) + int(r.ops.get("item_calls") or 0)
        steps += r.steps_profiled
    per_step = calls / steps if steps else 0.0
    if per_step < 2:
        return None
    return Finding(
        lever="sync_points", severity="medium" if per_step >= 10 else "low",
        title=f"{per_step:.0f} host-GPU synchronisations per step stall the launch queue",
        evidence=[f"{calls} synchronising calls (cudaStreamSynchronize, cudaMemcpy, .item(), nonzero) in {steps} rank-steps"],
        ranks=[r.rank for r in ctx.ranks], est_saving_pct=None,
        action={"code": "# keep metrics on the GPU; read them every N steps\nrunning_loss += loss.detach()\n"
                        "if step % 50 == 0:\n    print(running_loss.item() / 50)", "doc": DOCS["sync"]},
    )


def host_overhead(ctx: Context) -> Finding | None:
    if not ctx.gpu:
        return None
    idle = ctx.share("idle")
    p50s = [r.ops.get("compute_kernel_p50_us") for r in ctx.ranks if r.ops.get("compute_kernel_p50_us")]
    p50 = sorted(p50s)[len(p50s) // 2] if p50s else None
    if idle < 0.20 or p50 is None or p50 >= 20:
        return None
    ev = [f"GPU idle {idle:.0%} of the profiled time", f"median compute kernel {p50:.0f} us"]
    if ctx.a.hta:
        host = sum(v.get("host_wait_us", 0.0) for v in (ctx.a.hta.get("idle_by_rank") or {}).values())
        ev.append(f"HTA: {host / 1000:.1f} ms of idle time is host wait (the CPU did not enqueue work)")
    return Finding(
        lever="host_overhead", severity=_sev(idle, 0.20, 0.40),
        title="the GPU waits for the CPU to launch many small kernels",
        evidence=ev, ranks=[r.rank for r in ctx.ranks], est_saving_pct=_pct(idle * 0.5),
        action={"code": "model = torch.compile(model)  # fuses small kernels; or capture with CUDA graphs",
                "doc": DOCS["compile"], "assumption": "half of the idle time removed by fewer, larger kernels"},
    )


RULES: tuple[tuple[str, Rule], ...] = (
    ("straggler", straggler),
    ("dataloader", dataloader),
    ("gradient_accumulation", gradient_accumulation),
    ("ddp_bucket_size", ddp_bucket_size),
    ("comm_overlap", comm_overlap),
    ("mixed_precision", mixed_precision),
    ("sharding", sharding),
    ("batch_size", batch_size),
    ("sync_points", sync_points),
    ("host_overhead", host_overhead),
)


def median_step_us(a: Analysis) -> float:
    xs = sorted(r.step_time_us.p50 for r in a.ranks if r.step_time_us.p50)
    if xs:
        return xs[len(xs) // 2]
    ws = sorted(r.window_us / r.steps_profiled for r in a.ranks if r.steps_profiled)
    return ws[len(ws) // 2] if ws else 0.0


def advise(a: Analysis, extra: Sequence[Finding] = ()) -> Analysis:
    """The Analysis with the findings of every rule (plus `extra`, e.g. from NCCL logs)
    and the what-if projection."""
    ctx = Context(a=a, fw=a.run.get("framework") or {}, step_us=median_step_us(a))
    findings = list(a.findings) + list(extra)
    for _name, rule in RULES:
        try:
            f = rule(ctx)
        except Exception as e:  # one rule's bug must not take the analysis down
            a.notices.append(replace_notice(f"lever rule {_name} failed: {type(e).__name__}: {e}"))
            continue
        if f is not None:
            findings.append(f)
    findings.sort(key=rank_key)
    return replace(a, findings=findings, what_if=what_if(ctx.step_us, findings))


SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


# levers whose change alters the training itself (the global batch): offered after
# changes that keep the maths the same, at equal severity
CHANGES_TRAINING = {"gradient_accumulation", "batch_size"}


def rank_key(f: Finding) -> tuple[int, int, int, float]:
    """Most important first: severity; within it a memory limit (it decides what else is
    possible); then changes that keep the training the same; then the larger saving."""
    blocking = 0 if f.lever == "sharding" and f.severity == "high" else 1
    semantic = 1 if f.lever in CHANGES_TRAINING else 0
    return (SEVERITY_ORDER.get(f.severity, 3), blocking, semantic, -(f.est_saving_pct or 0.0))


def replace_notice(message: str) -> Any:
    from pardiag.analysis import Notice

    return Notice("warning", message)


def what_if(step_us: float, findings: Sequence[Finding]) -> dict[str, Any] | None:
    """Projected step time per finding and for all of them together. Savings are
    assumed independent: together they multiply, (1 - s1)(1 - s2)..., which is
    optimistic when two findings address the same time."""
    if step_us <= 0:
        return None
    per = []
    remaining = 1.0
    for f in findings:
        if f.est_saving_pct:
            s = min(f.est_saving_pct, 95.0) / 100
            per.append({"lever": f.lever, "title": f.title, "step_us": step_us * (1 - s), "saving_pct": f.est_saving_pct})
            remaining *= 1 - s
    return {
        "step_us": step_us,
        "findings": per,
        "all_step_us": step_us * remaining,
        "all_saving_pct": round(100 * (1 - remaining), 1),
        "assumption": "each saving as its finding states; savings of different findings treated as independent",
    }
