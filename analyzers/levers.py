"""The lever advisor: what to change, with the evidence and the expected gain.

One small rule per lever of DESIGN.md, each a row of the one registry
(`analyzers.rules.RULES`, which also orders them). A rule reads the Analysis (ranks,
collectives, stragglers, the framework facts each rank recorded) through its
`RuleContext` and returns its finding, or [] for nothing. `est_saving_pct` is the share of the median step time the change would
remove, computed from this run's own figures under the assumption stated in the
finding; a lever the job already uses, or a healthy run, gets no finding. The
job-level figures (the median step, exposed communication with and without waiting,
the breakdown's shares) are the Analysis' `summary`, the ones every report shows.

Thresholds: each rule's docstring states them, with where they come from (see
../shared/reference/anchors.md), and each is a named constant before the rule
(`DATALOADER_MIN`, `COMM_OVERLAP_HIGH`, ...). Severity follows the symptom's share, held
to the saving a user can get: a finding that saves under 5% of the step (SAVING_LOW)
is low, and one with no saving estimated is not high unless its rule says why.
Savings take shares of the profiled window as shares of the median step; when profiled
steps were over 10% longer or shorter than the median step (`profiled_step_inflation`),
the finding says so in its evidence and assumption. A saving is never more than the
share of the step it works on (the exposed communication, the input wait, the GEMM
time within the compute time, the idle time). Exposed communication leaves out the time
ranks waited for each other inside a collective: that is imbalance (the straggler
lever), not transfer cost. straggler: see stragglers.py; severity as TraceML (warn
10%, critical 20%).

Significance of a share (`share_test`, the statistic in shares.py): the share rules
(dataloader, gradient_accumulation, ddp_bucket_size, comm_overlap) make their finding
only when the symptom's share clears the threshold pooled and step by step: per step,
the symptom's time over the step's length, both summed over the ranks; its one-sided 95%
lower bound (SHARE_CONFIDENCE) from SHARE_BOOTSTRAP bootstrap resamples of the steps must
reach the threshold too, and with fewer than SHARE_MIN_STEPS (5) steps (the default
profiler window records 3) every step must. Exposed communication is tested over the
profiled window's steps, each rank's exposed time scaled by its transfer fraction as the
pooled figure is; the input wait over steps.jsonl's counted steps, else the window's.
The evidence states the bound and how it was made; an Analysis without per-step figures
(an older file) is judged on the pooled share, and the evidence says so. Measured on
the scenarios (2 ranks, gloo, 30 steps): the healthy control's exposed communication
wanders between 0.4% and 23% from step to step and pooled over 10% (10.1% to 11.8%) in
4 of 22 recordings, a false gradient_accumulation finding each time; step by step, none,
while every comm_bound, tiny_buckets and slow_input recording (5 each) kept its finding
(benchmarks/share_noise.py).

ddp_find_unused (an extension of DESIGN.md's vocabulary): DDP ran with
find_unused_parameters=True (no static graph) and every rank's DDP recorded no unused
parameter. Low severity and no estimated saving: what the search costs is not
separable in one run (the profiler inflates its small per-parameter operators), and
DDP samples the unused-parameter size only at some iterations.

Actions are written in the words of the framework that drove the job
(`run.framework.name`: the Hugging Face Trainer, Lightning Trainer or Fabric, Accelerate,
DeepSpeed), with the numbers the rule computed; plain torch otherwise. For the rules
that have framework forms, `action.code` is that form, `action.framework` names it,
`action.settings` lists the keyword arguments (or DeepSpeed config keys) as data and
`action.torch_code` keeps the plain torch form. An action that changes the global batch
says so in `action.batch`, with what it means for the learning rate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pardiag.analysis import Finding, Lever, Severity, Straggler
from pardiag.analysis_blocks import WhatIf, WhatIfRow
from pardiag.run_info import FrameworkInfo
from pardiag.analyzers import host_causes
from pardiag.analyzers.memory_rules import allocator_fragmentation as allocator_fragmentation  # rows of rules.py
from pardiag.analyzers.memory_rules import memory_imbalance as memory_imbalance
from pardiag.analyzers.shares import ShareBound, host_bound, window_bound
from pardiag.analyzers.steps import median
from pardiag.analyzers.summary import PAGE_BYTES, transfer_fraction

if TYPE_CHECKING:  # the registry imports this module
    from pardiag.analyzers.rules import RuleContext

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


def _sev(share: float, medium: float, high: float) -> Severity:
    return "high" if share >= high else "medium" if share >= medium else "low"


SAVING_LOW = 0.05  # a change that saves less than this share of the step is low


def _severity(share: float, medium: float, high: float, saving: float | None) -> Severity:
    """Severity by the symptom's share (`_sev`), held to what the change saves: a saving
    under SAVING_LOW of the step is low, and a finding with no saving estimated is never
    high (a rule that says otherwise states why in its docstring)."""
    sev = _sev(share, medium, high)
    if saving is None:
        return "medium" if sev == "high" else sev
    return "low" if saving < SAVING_LOW else sev


def _pct(x: float) -> float:
    return round(100.0 * x, 1)


def _part(x: float) -> str:
    """A share in an assumption's words: "half", else a percentage."""
    return "half" if x == 0.5 else f"{x:.0%}"


def _bounded(saving: float, removes: float) -> float:
    """A saving is never more than the share of the step whose time the change removes
    (the exposed communication, the input wait, the GEMM or idle time)."""
    return max(0.0, min(saving, removes))


WINDOW_INFLATION_NOTE = 1.1  # profiled steps this much longer (or shorter) than the median: said


def _window_basis(ctx: RuleContext) -> list[str]:
    """The evidence line for a saving that takes a share of the profiled window as a share
    of the median step, when profiled steps were more than 10% longer or shorter than
    the median step; [] otherwise."""
    x = ctx.inflation
    if x is None or x <= 0 or 1 / WINDOW_INFLATION_NOTE < x < WINDOW_INFLATION_NOTE:
        return []
    return [f"profiled steps took {x:.2g}x the median step: the saving takes the profiled window's shares as "
            "shares of the median step, as they are (the profiler slows some work more than other, so without "
            "it the shares may differ)"]


def _on_window(ctx: RuleContext, assumption: str) -> str:
    """`assumption`, saying which step its shares are of when the bases differ."""
    x = ctx.inflation
    return assumption + (f"; shares of the profiled window (steps there {x:.2g}x the median step) applied to the "
                         "median step unchanged" if _window_basis(ctx) else "")


def share_test(share: float, threshold: float, bound: ShareBound | None, what: str) -> tuple[bool, list[str]]:
    """Whether a share rule's symptom clears its threshold, and the evidence line that
    says how: the pooled `share` must reach `threshold`, and so must the lower bound of
    the share over the steps (`analyzers.shares`: a one-sided 95% bootstrap bound over
    the steps, or with fewer than 5 steps the smallest step), so that noise from step to
    step makes no finding. Without per-step figures (`bound` None: an older analysis,
    one built by hand) the pooled share decides alone, and the line says so."""
    if share < threshold:
        return False, []
    if bound is None:
        return True, [f"{what}: no per-step figures in this analysis, judged on the pooled share only"]
    return bound.clears(threshold), [bound.words(what, threshold)]


def _exposed_bound(ctx: RuleContext) -> ShareBound | None:
    """The bound of the exposed communication without waiting (`ctx.exposed_transfer`),
    step by step: each rank's exposed time in a step scaled by its transfer fraction, as
    the pooled figure is."""
    return window_bound(ctx.ranks, lambda r, f: f.get("comm_exposed", 0.0) * transfer_fraction(r))


EXPOSED_WORDS = "exposed communication (waiting for other ranks left out)"


# -- the framework the job ran under ------------------------------------------------------

FRAMEWORKS = ("torch", "lightning", "lightning_fabric", "transformers", "accelerate", "deepspeed")
HF_ARGS = "transformers.TrainingArguments"
ACC = "accelerate.Accelerator"
ACC_DDP = "accelerate.utils.DistributedDataParallelKwargs"
DS_CONFIG = "deepspeed.config"  # keys of the DeepSpeed config (JSON or dict), not a class
TORCH_LOADER = "torch.utils.data.DataLoader"
TORCH_DDP = "torch.nn.parallel.DistributedDataParallel"


class Expr(str):
    """A keyword value written as code (a name, an expression), not as a literal."""


def _lit(v: Any) -> str:
    if isinstance(v, Expr):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)  # bool, int, None, dict of literals


def _call(name: str, kwargs: dict[str, Any], rest: bool = True) -> str:
    """`name(..., k=v)`: `...` stands for the arguments the job already passes."""
    args = (["..."] if rest else []) + [f"{k}={_lit(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(args)})"


@dataclass(frozen=True)
class Form:
    """One change in one framework's words: the code to paste and, as data, the
    keyword arguments it sets per callable (`call` is the import path)."""

    code: str
    settings: list[dict[str, Any]] = field(default_factory=list)


def _set(call: str, **kwargs: Any) -> dict[str, Any]:
    return {"call": call, "kwargs": kwargs}


def framework_name(fw: FrameworkInfo) -> str:
    """The framework the job's optimizer steps came from; plain torch when the run did
    not record one (older runs) or names another."""
    name = fw.name
    return name if name in FRAMEWORKS else "torch"


def _lightning(fw: FrameworkInfo) -> tuple[str, str]:
    """Import paths of (Trainer's package, Fabric's package) as the job imported them:
    the unified `lightning` package unless only the standalone ones were loaded."""
    loaded = fw.loaded
    unified = "lightning" in loaded
    return ("pytorch_lightning" if "pytorch_lightning" in loaded and not unified else "lightning.pytorch",
            "lightning_fabric" if "lightning_fabric" in loaded and not unified else "lightning.fabric")


def _major(version: Any) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _lightning_precision(fw: FrameworkInfo, half: str) -> Any:
    """Lightning 2 names mixed precision "bf16-mixed"/"16-mixed"; 1.x used "bf16"/16."""
    if (_major(fw.version) or 2) < 2:
        return "bf16" if half == "bf16" else 16
    return "bf16-mixed" if half == "bf16" else "16-mixed"


def _hf(note: str = "", /, **kwargs: Any) -> Form:
    return Form("from transformers import TrainingArguments\n"
                f"args = {_call('TrainingArguments', kwargs)}  # with your other arguments{note}",
                [_set(HF_ARGS, **kwargs)])


def _trainer(fw: FrameworkInfo, **kwargs: Any) -> Form:
    pkg = _lightning(fw)[0]
    return Form(f"from {pkg} import Trainer\ntrainer = {_call('Trainer', kwargs)}", [_set(f"{pkg}.Trainer", **kwargs)])


def _fabric(fw: FrameworkInfo, **kwargs: Any) -> Form:
    pkg = _lightning(fw)[1]
    return Form(f"from {pkg} import Fabric\nfabric = {_call('Fabric', kwargs)}", [_set(f"{pkg}.Fabric", **kwargs)])


def _accelerator(**kwargs: Any) -> Form:
    return Form(f"from accelerate import Accelerator\naccelerator = {_call('Accelerator', kwargs)}",
                [_set(ACC, **kwargs)])


def _ds(config: dict[str, Any], note: str = "") -> Form:
    return Form("# DeepSpeed config (the JSON file or dict given to deepspeed.initialize), merged into yours"
                + (f"; {note}" if note else "") + ":\n" + json.dumps(config),
                [_set(DS_CONFIG, **config)])


def _ddp_strategy(fw: FrameworkInfo, owner: str, ddp_kwargs: dict[str, Any], imports: str = "") -> Form:
    """Lightning's DDPStrategy (its keyword arguments go to DistributedDataParallel) in a
    Trainer (`owner` "trainer") or Fabric."""
    trainer_pkg, fabric_pkg = _lightning(fw)
    pkg, cls = (trainer_pkg, "Trainer") if owner == "trainer" else (fabric_pkg, "Fabric")
    strategy = _call("DDPStrategy", ddp_kwargs, rest=False)
    return Form(f"from {pkg} import {cls}\nfrom {pkg}.strategies import DDPStrategy\n{imports}"
                f"{cls.lower()} = {_call(cls, {'strategy': Expr(strategy)})}",
                [_set(f"{pkg}.strategies.DDPStrategy", **ddp_kwargs), _set(f"{pkg}.{cls}", strategy=Expr(strategy))])


def _accelerate_ddp(ddp_kwargs: dict[str, Any], imports: str = "", note: str = "") -> Form:
    return Form("from accelerate import Accelerator\nfrom accelerate.utils import DistributedDataParallelKwargs\n"
                f"{imports}ddp_kwargs = {_call('DistributedDataParallelKwargs', ddp_kwargs, rest=False)}"
                + (f"  # {note}" if note else "") + "\n"
                f"accelerator = {_call('Accelerator', {'kwargs_handlers': Expr('[ddp_kwargs]')})}",
                [_set(ACC_DDP, **ddp_kwargs), _set(ACC, kwargs_handlers=Expr("[ddp_kwargs]"))])


def _loader_form(where: str, kwargs: dict[str, Any]) -> Form:
    args = ", ".join(["dataset"] + [f"{k}={_lit(v)}" for k, v in kwargs.items()])
    return Form(f"# {where}\nDataLoader({args})", [_set(TORCH_LOADER, **kwargs)])


LOADER_PLACE = {
    "lightning": "in your LightningDataModule's (or LightningModule's) train_dataloader()",
    "lightning_fabric": "the DataLoader you pass to fabric.setup_dataloaders()",
    "accelerate": "the DataLoader you pass to accelerator.prepare()",
    "deepspeed": "the DataLoader you build (or the one deepspeed.initialize builds from training_data)",
}


def _whole(x: float) -> int:
    """A size for settings that take whole megabytes (TrainingArguments, Accelerate)."""
    return max(1, int(math.floor(x + 0.5)))


def in_framework(ctx: RuleContext, action: dict[str, Any], forms: dict[str, Form],
                 torch_settings: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """`action` with its code in the words of the job's framework where `forms` has one
    (the plain torch code kept in `torch_code`), plus `framework` and `settings`."""
    name = framework_name(ctx.framework)
    form = forms.get(name) if name != "torch" else None
    out = dict(action)
    if form is None:
        out["framework"] = "torch"
        if torch_settings:
            out["settings"] = list(torch_settings)
        return out
    if action.get("code"):
        out["torch_code"] = action["code"]
    out["code"] = form.code
    out["framework"] = name
    out["settings"] = list(form.settings)
    return out


# -- what a change of the global batch means for the learning rate -----------------------

SGD_LIKE = ("SGD",)
ADAM_LIKE = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "FusedAdam", "DeepSpeedCPUAdam")


def loader_batch(loader: dict[str, Any]) -> Any:
    """Samples per batch of a recorded DataLoader: its batch_size, or its batch sampler's
    when it was built with batch_sampler= (the HF Trainer and Accelerate do)."""
    return loader.get("batch_size") or loader.get("batch_sampler_batch_size")


def batch_change(ctx: RuleContext, factor: int) -> dict[str, Any]:
    """The global batch per optimizer step before and after a change that multiplies it
    by `factor`, and what to do about the learning rate (`note`; `comment`: the same in
    one line for the code)."""
    loaders = ctx.framework.dataloaders or []
    per_rank = loader_batch(loaders[0]) if loaders and isinstance(loaders[0], dict) else None
    world = int(ctx.analysis.run.world_size or len(ctx.analysis.ranks) or 1)
    acc = (ctx.framework.grad_accumulation or {}).get("backwards_per_step") or 1
    before = int(per_rank * world * acc) if isinstance(per_rank, int) and per_rank > 0 else None
    after = before * factor if before else None
    opts = ctx.framework.optimizers or []
    opt = opts[0] if opts and isinstance(opts[0], dict) else {}
    # The learning rate a scheduler started from (torch's schedulers keep it as the group's
    # initial_lr); the current `lr` is wherever the schedule was when recorded, so no
    # numbers are proposed from it.
    cls, lr = opt.get("class"), opt.get("initial_lr")
    lr = lr if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 else None
    sqrt = math.sqrt(factor)
    if cls in SGD_LIKE:
        rule = (f"{cls}: the linear scaling rule (lr x{factor}"
                + (f", initial lr {lr:g} -> {lr * factor:g}" if lr else "")
                + ") with a warm-up is the usual start (Goyal et al., 2017)")
        short = (f"{cls} lr x{factor}" + (f" ({lr:g} -> {lr * factor:g})" if lr else "")
                 + ", linear rule, with warm-up")
    elif cls in ADAM_LIKE:
        rule = (f"{cls}: Adam-type optimizers usually tolerate less than linear scaling; lr x{sqrt:.2g} (square root of "
                f"{factor}" + (f", initial lr {lr:g} -> {lr * sqrt:.3g}" if lr else "") + ") is a common start")
        short = f"{cls} lr x{sqrt:.2g}" + (f" ({lr:g} -> {lr * sqrt:.3g})" if lr else "") + ", less than linear"
    else:
        rule = (f"linear scaling (lr x{factor}) with a warm-up is the usual start for SGD (Goyal et al., 2017); "
                f"Adam-type optimizers usually tolerate less (about x{sqrt:.2g})")
        short = f"SGD lr x{factor} with warm-up; Adam-type about x{sqrt:.2g}"
    if before:
        shape = f"{per_rank} per rank x {world} rank{'s' if world != 1 else ''} x {int(acc * factor)} micro-batch" + (
            "es" if acc * factor != 1 else "")
        head = f"global batch {before} -> {after} samples per optimizer step ({shape})"
    else:
        head = f"global batch {factor}x larger per optimizer step"
    note = (f"{head}: an epoch takes {factor}x fewer optimizer steps, so schedules counted in steps (warm-up, "
            f"decay, max_steps) need adjusting, and the learning rate needs re-tuning: {rule}; compare the loss curve "
            "with this run's")
    return {"factor": factor, "global_batch_before": before, "global_batch_after": after, "optimizer": cls,
            "initial_lr": lr,
            "note": note, "comment": f"# changes training: {head.split(' (')[0]}; re-tune the learning rate ({short})"}


def _with_batch(action: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """An action that changes the global batch: `batch` (numbers and note), the note in
    the assumption, and one comment line under each form of the code."""
    out = dict(action)
    out["batch"] = {k: v for k, v in batch.items() if k != "comment"}
    out["assumption"] = f"{action['assumption']}; {batch['note']}" if action.get("assumption") else batch["note"]
    for key in ("code", "torch_code"):
        if isinstance(out.get(key), str) and out[key]:
            out[key] = f"{out[key]}\n{batch['comment']}"
    return out


# -- rules ------------------------------------------------------------------------------


STRAGGLER_CODE = {
    host_causes.CONTENTION: "# what shares rank {r}'s CPUs: top -H; then e.g. OMP_NUM_THREADS=<cores per rank> "
                            "taskset -c <its cores> ...",
    host_causes.GC: "import gc\ngc.freeze()   # after building the model and loaders\ngc.disable()\n"
                    "# in the loop: if step % 100 == 0: gc.collect()   # every rank at the same step",
    host_causes.INPUT: "# balance tokens per rank: sort or bucket samples by length, or pack sequences",
    host_causes.FAULTS: "# in every rank's environment (the launcher's), so that glibc keeps freed memory:\n"
                        "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 torchrun ...\n"
                        "# or preload another allocator: LD_PRELOAD=<path to libjemalloc.so or libtcmalloc.so>",
}


HOST_LEVERS: dict[str, Lever] = {host_causes.CONTENTION: "host_contention", host_causes.GC: "garbage_collection",
                                 host_causes.INPUT: "input_imbalance"}


def straggler(ctx: RuleContext) -> list[Finding]:
    """The rank the others wait for (analyzers/stragglers.py), when its host signals do
    not say why (those are the host levers' findings)."""
    return _straggler(ctx, "straggler")


def host_contention(ctx: RuleContext) -> list[Finding]:
    """A straggler whose training thread waits for a CPU (analyzers/host_causes.py)."""
    return _straggler(ctx, "host_contention")


def garbage_collection(ctx: RuleContext) -> list[Finding]:
    """A straggler that pauses for Python's garbage collector."""
    return _straggler(ctx, "garbage_collection")


def input_imbalance(ctx: RuleContext) -> list[Finding]:
    """A straggler whose batches are bigger than the other ranks'."""
    return _straggler(ctx, "input_imbalance")


def straggler_saving_us(s: Straggler, step_us: float) -> float:
    """What fixing the straggler takes off a step of ``step_us``: the others stop waiting
    for it, so the step shrinks by their extra wait, but never by more than the
    straggler's extra work (the time the fix removes) nor by more than the step itself."""
    return min(s.wait_us, s.excess_us_per_step, step_us)


def _straggler(ctx: RuleContext, lever: Lever) -> list[Finding]:
    if not ctx.analysis.stragglers or ctx.step_us <= 0:
        return []
    s = max(ctx.analysis.stragglers, key=lambda s: s.excess_us_per_step)
    if HOST_LEVERS.get(host_causes.cause_kind(s.cause) or "", "straggler") != lever:
        return []
    held = s.wait_us
    share = straggler_saving_us(s, ctx.step_us) / ctx.step_us
    what = {
        "dataloader": "rank {r} waits longer for its input: check that each rank's shard of the data costs the same "
        "(sample sizes, augmentation), give it more DataLoader workers, or check its disk/network.",
        "forward": "rank {r} computes longer in forward: uneven inputs (sequence lengths, padding), another process "
        "on its CPU or GPU, or a slower device (clocks, thermal throttling).",
        "backward": "rank {r} computes longer in backward: uneven inputs, contention on its CPU/GPU, or a slower device.",
        "optimizer": "rank {r} spends longer in the optimizer step: extra work only on that rank (logging, "
        "checkpointing, EMA, a larger share of a sharded optimizer's state: ZeroRedundancyOptimizer "
        "splits the parameters by size, not always evenly) or a slower device.",
        "host overhead": "rank {r} spends longer outside forward/backward: Python work only on that rank "
        "(logging, metrics, checkpoints) or CPU contention (pin threads, OMP_NUM_THREADS).",
        "operators after backward": "rank {r} runs more operators after backward (metrics, logging, gradient "
        "clipping only on that rank) or runs them slower.",
    }.get(s.cause, "rank {r} is slower; compare its phases with the others'.")
    kind = host_causes.cause_kind(s.cause)
    if kind == host_causes.CONTENTION:
        what = ("rank {r}'s training thread waits for a CPU: another process or too many threads share its cores. "
                "Find them (top -H, ps -eLf), give each rank its own cores (numactl or taskset), and set "
                "OMP_NUM_THREADS so that ranks x threads fit the cores.")
    elif kind == host_causes.GC:
        what = ("rank {r} pauses longer for Python's garbage collector: make collections happen on every rank at "
                "the same step (gc.disable() after setup, gc.collect() every N steps), or gc.freeze() after "
                "building the model and loaders so that long-lived objects are not scanned again.")
    elif kind == host_causes.FAULTS:
        what = ("rank {r} page-faults its memory in afresh every step: its C library's allocator hands freed "
                "memory (activations, gradients set to None) back to the kernel and takes it again, where the other "
                "ranks' allocators keep theirs. Make every rank keep it: MALLOC_MMAP_THRESHOLD_=33554432 and "
                "MALLOC_TRIM_THRESHOLD_=1073741824 in the job's environment (glibc; blocks over 32 MiB are still "
                "mapped afresh), or preload jemalloc or tcmalloc.")
    elif kind == host_causes.INPUT:
        what = ("rank {r} gets bigger batches than the others (more elements: longer sequences, more padding): "
                "balance the work per rank (bucket or sort by length, pack sequences, a token-based sampler).")
    elif s.cause.startswith("work outside"):
        what = ("rank {r} spends longer outside DataLoader, forward, backward and optimizer: work only on that "
                "rank before forward or after the optimizer (data preparation, logging, metrics, checkpoints) or "
                "CPU contention from another process (top -H -p <pid>; pin threads, OMP_NUM_THREADS).")
    elif s.cause.startswith("host work"):
        # the rank runs no torch operator then: its own Python, I/O or waiting
        what = ("rank {r} spends longer in host work outside torch operators" +
                (f" ({s.cause.split(': ', 1)[1]})" if ": " in s.cause else "") +
                ": Python, I/O or sleeping only on that rank (data reads, logging, checkpoints), or CPU "
                "contention from another process (top -H -p <pid>; pin threads, OMP_NUM_THREADS).")
    return [Finding(
        lever=lever,
        severity=_sev(share, 0.10, 0.20),
        title=f"rank {s.rank} is {s.excess_us_per_step / 1000:.1f} ms per step slower ({s.cause}); "
              f"the others wait {held / 1000:.1f} ms per step for it",
        evidence=list(s.evidence),
        ranks=[s.rank],
        est_saving_pct=_pct(share),
        action={"text": what.format(r=s.rank), "assumption": "the others stop waiting for it",
                "code": STRAGGLER_CODE.get(kind or "", "# check rank {r}: nvidia-smi -q -d CLOCK,PERFORMANCE; "
                                                      "top -H -p <pid>").format(r=s.rank)},
    )]


DATALOADER_MIN = 0.05  # input wait, share of the step
DATALOADER_HIGH = 0.20
DATALOADER_HIDDEN = 0.9  # share of the wait more workers hide


def dataloader(ctx: RuleContext) -> list[Finding]:
    """Input wait >= 5% of the step (TensorBoard plugin rule 1; XProf: moderate at 5%),
    high at 20%; the median over all steps of steps.jsonl, else the profiled window's
    share. More workers (up to the CPUs of the rank, never fewer than now) are assumed to
    hide 90% of the wait; a rank with no CPU left for another worker gets no saving."""
    shares = []
    for r in ctx.analysis.ranks:
        hp = r.host_phases_us
        if hp.get("step"):
            shares.append(min(1.0, hp.get("dataloader", 0.0) / hp["step"]))  # a wait is at most its step
    share = sum(shares) / len(shares) if shares else ctx.share("dataloader")
    source = "median over all steps (steps.jsonl)" if shares else "share of the profiled window"
    bound = (host_bound(ctx.analysis.ranks, "dataloader") if shares
             else window_bound(ctx.ranks, lambda r, f: f.get("dataloader", 0.0)))
    found, significance = share_test(share, DATALOADER_MIN, bound, "DataLoader wait")
    if not found:
        return []
    loaders = ctx.framework.dataloaders or []
    cur = loaders[0] if loaders else {}
    workers = int(cur.get("num_workers") or 0)
    cpus = ((ctx.framework.threads or {}).get("sched_affinity") or 8)
    per_rank_cpus = max(1, cpus // max(1, _local_ranks(ctx)))
    # one batch takes `share` of a step to load on the main process; with w workers
    # loading in parallel the wait disappears once w * step >= load time
    need = max(2, math.ceil(share / max(1e-6, 1 - share)) + 1) if workers == 0 else workers * 2
    proposal = min(need, per_rank_cpus) if per_rank_cpus > 1 else need
    # an advice never goes backwards: with every CPU of the rank already given to workers,
    # more would only share the same CPUs, and fewer would load slower
    proposal = max(proposal, workers)
    kw: dict[str, Any] = {"num_workers": proposal, "persistent_workers": True, "prefetch_factor": 2}
    if ctx.on_gpu and not cur.get("pin_memory"):
        kw["pin_memory"] = True
    hf = {f"dataloader_{k}": v for k, v in kw.items()}
    forms = {"transformers": _hf(**hf)}
    forms.update({name: _loader_form(where, kw) for name, where in LOADER_PLACE.items()})
    action: dict[str, Any] = {
        "code": f"DataLoader(dataset, batch_size=..., {', '.join(f'{k}={_lit(v)}' for k, v in kw.items())})",
        "doc": DOCS["dataloader"],
        "assumption": f"workers load batches while the GPU/CPU computes; {DATALOADER_HIDDEN:.0%} of the wait hidden"}
    basis = [] if shares else _window_basis(ctx)
    if basis:
        action["assumption"] = _on_window(ctx, action["assumption"])
    saving: float | None = _bounded(share * DATALOADER_HIDDEN, share)
    cpu_bound = workers > 0 and proposal == workers
    if cpu_bound:  # no worker to add: the same workers cannot be assumed to hide more
        saving = None
        action["assumption"] = "no saving estimated: the rank has no CPU left for another worker"
        action["text"] = (f"each rank's {per_rank_cpus} CPU{'s' if per_rank_cpus != 1 else ''} already run "
                          f"{workers} workers: make a batch cheaper to load (decode or augment once, offline; "
                          "lighter transforms), or give each rank more CPUs")
    return [Finding(
        lever="dataloader",
        severity=_severity(share, DATALOADER_MIN, DATALOADER_HIGH, saving),
        title=f"{share:.0%} of each step waits for input" + (f" (DataLoader num_workers={workers})" if cur else ""),
        evidence=[f"DataLoader wait {share:.1%} of the step ({source})"] + (
            [f"DataLoader: num_workers={workers}, pin_memory={cur.get('pin_memory')}, "
             f"persistent_workers={cur.get('persistent_workers')}, batch_size={cur.get('batch_size')}"] if cur else []
        ) + significance + basis + _workers_share_cpus(ctx, proposal, per_rank_cpus, saving),
        ranks=[r.rank for r in ctx.analysis.ranks],
        est_saving_pct=_pct(saving) if saving is not None else None,
        action=in_framework(ctx, action, forms, [_set(TORCH_LOADER, **kw)]),
    )]


WORKERS_SHARE_SAID = "they load on the CPUs the rank computes on"  # the caveat's words: the replay drops it where it counts them


def _workers_share_cpus(ctx: RuleContext, proposal: int, per_rank_cpus: int, saving: float | None) -> list[str]:
    """On CPUs, more workers per rank than the rank has CPUs: they load on the CPUs the
    rank computes on, where the estimate takes them as having their own. Measured: the
    slow_input scenario (2 ranks on 2 CPUs, its loading a sleep per sample) advised 11 to
    14 workers per rank; its fixed jobs' training threads waited 0.8-2.6 ms per step for
    a CPU, against 0.1-0.3 ms with the problem, the rest of their step (all but the wait
    for input) ran 0.3-3.4 ms longer, and the saving came out 3.6 to 6.6 points under the
    estimate in all 8 pairs of four invocations. The replay's estimate counts the
    workers' CPU time on the ranks' cores where steps.jsonl times the loop's loading CPU
    (``estimates.WorkerLoad``, since pardiag 0.5.5) and drops this caveat; it stays for
    the recordings that do not."""
    if saving is None or ctx.on_gpu or proposal <= per_rank_cpus:
        return []
    return [f"{proposal} workers per rank on {per_rank_cpus} CPU{'s' if per_rank_cpus != 1 else ''} per rank: "
            f"{WORKERS_SHARE_SAID}, where the estimate takes them as having their own, so the "
            "saving can be smaller (on 2 CPUs, 11-14 workers per rank kept the training threads 0.8-2.6 ms per step "
            "waiting for a CPU and came out 3.6-6.6 points under the estimate)"]


def _local_ranks(ctx: RuleContext) -> int:
    hosts = {r.host for r in ctx.analysis.ranks if r.host}
    return max(1, len(ctx.analysis.ranks) // max(1, len(hosts)))


GRADIENT_ACCUMULATION_MIN = 0.10  # exposed communication, share of the step
GRADIENT_ACCUMULATION_HIGH = 0.20
GRADIENT_ACCUMULATION_STEPS = 4  # micro-batches per optimizer step proposed


FRESH_FAULTS_SAID = 1000  # page faults per unprofiled step from which a CPU job's fresh memory is named
FRESH_CAVEAT_HEAD = "each step page-faults"  # the caveat's first words: the replay drops it where it counts them


def _fresh_memory_caveat(ctx: RuleContext) -> list[str]:
    """On CPUs, the page faults of every step (steps.jsonl): memory the job takes fresh
    each step, often its gradients freed by ``zero_grad(set_to_none=True)``. Micro-batches
    that accumulate into gradients already in memory may not fault them again, so the
    saving can be larger than estimated; how much depends on the allocator. The
    comm_bound scenario's problem runs faulted 2,094 times per step and its fixed runs
    2,094 times per 4 micro-batches (three recordings each; 8,160 and 8,160 in later
    ones): the fix faults a quarter as often per micro-batch. Where the replay can tell
    the faults are the gradients' (`estimates.accumulating_backward`) it counts them and drops this
    caveat; it stays where it cannot (no replay, unsteady faults, gradients added into)."""
    if not ctx.ranks or any(r.device_type != "cpu" for r in ctx.ranks):
        return []
    plain = ctx.analysis.job_summary.profiled_step_inflation.page_faults.get("plain")
    if plain is None or plain < FRESH_FAULTS_SAID:
        return []
    return [f"{FRESH_CAVEAT_HEAD} {plain:,.0f} times ({plain * PAGE_BYTES / 2**20:.0f} MB touched fresh, "
            "steps.jsonl): micro-batches that accumulate into gradients already in memory may not fault again, "
            "so the saving can be larger than estimated (the allocator decides; not counted)"]


def gradient_accumulation(ctx: RuleContext) -> list[Finding]:
    """Exposed communication >= 10% of the step (TensorBoard plugin rule 4) under DDP with
    one backward per optimizer step, high at 20%. Accumulating 4 micro-batches pays the
    exposed communication once per 4 (a saving of 3/4 of it) and changes the global batch."""
    exposed = ctx.exposed_transfer()
    acc = ctx.framework.grad_accumulation or {}
    if exposed < GRADIENT_ACCUMULATION_MIN or not ctx.ddp or (acc.get("backwards_per_step") or 1) > 1:
        return []
    found, significance = share_test(exposed, GRADIENT_ACCUMULATION_MIN, _exposed_bound(ctx), EXPOSED_WORDS)
    if not found:
        return []
    k = GRADIENT_ACCUMULATION_STEPS
    saving = _bounded(exposed * (1 - 1 / k), exposed)
    batch = batch_change(ctx, k)
    grows = (f" (global batch {batch['global_batch_before']} -> {batch['global_batch_after']})"
             if batch["global_batch_before"] else f" (global batch {k}x)")
    fabric_pkg = _lightning(ctx.framework)[1]
    forms = {
        "transformers": _hf(gradient_accumulation_steps=k),
        "lightning": _trainer(ctx.framework, accumulate_grad_batches=k),
        "lightning_fabric": Form(
            f"for i, batch in enumerate(loader):\n"
            f"    sync = (i + 1) % {k} == 0\n"
            f"    with fabric.no_backward_sync(model, enabled=not sync):\n"
            f"        fabric.backward(loss_fn(model(batch)) / {k})\n"
            f"    if sync:\n"
            f"        optimizer.step(); optimizer.zero_grad()",
            [_set(f"{fabric_pkg}.Fabric.no_backward_sync", enabled=Expr("not sync"))]),
        "accelerate": Form(
            f"from accelerate import Accelerator\n"
            f"accelerator = {_call('Accelerator', {'gradient_accumulation_steps': k})}\n"
            f"for batch in loader:\n"
            f"    with accelerator.accumulate(model):  # syncs gradients every {k}th micro-batch\n"
            f"        accelerator.backward(loss_fn(model(batch)))  # divides the loss by {k}\n"
            f"        optimizer.step(); optimizer.zero_grad()  # steps every {k}th",
            [_set(ACC, gradient_accumulation_steps=k)]),
        "deepspeed": _ds({"gradient_accumulation_steps": k},
                         "if it sets train_batch_size, that must equal micro-batch x accumulation x ranks"),
    }
    return [Finding(
        lever="gradient_accumulation",
        severity=_severity(exposed, GRADIENT_ACCUMULATION_MIN, GRADIENT_ACCUMULATION_HIGH, saving),
        title=f"communication not hidden by compute takes {exposed:.0%} of the step; accumulate {k} micro-batches "
              f"per sync{grows}",
        evidence=[ctx.exposed_words()] + significance
        + ["one backward pass per optimizer step (no gradient accumulation)"] + _window_basis(ctx)
        + _fresh_memory_caveat(ctx),
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action=_with_batch(in_framework(ctx, {
            "code": (
                f"for i, batch in enumerate(loader):\n"
                f"    sync = (i + 1) % {k} == 0\n"
                f"    with (contextlib.nullcontext() if sync else model.no_sync()):\n"
                f"        (loss_fn(model(batch)) / {k}).backward()\n"
                f"    if sync:\n"
                f"        optimizer.step(); optimizer.zero_grad()"
            ),
            "doc": DOCS["no_sync"],
            "assumption": _on_window(ctx, f"exposed communication paid once per {k} micro-batches, each as large "
                                          "as now"),
        }, forms), batch),
    )]


DDP_BUCKET_SIZE_MIN = 0.05  # exposed communication, share of the step
DDP_BUCKET_SIZE_MEDIUM = 0.10  # TensorBoard plugin rule 4; also where a bf16 hook is offered
DDP_BUCKET_SIZE_HIGH = 0.20
DDP_BUCKET_SIZE_SPLIT = 4  # one bucket: a cap of a quarter of it
DDP_BUCKET_SIZE_OVERLAP = 0.5  # ... lets this share of the exposed all-reduce overlap backward
DDP_BUCKET_SIZE_SMALL_BYTES = 2**20  # mean all-reduce under this: latency-bound
DDP_BUCKET_SIZE_MANY = 8  # ... with more buckets than this
DDP_BUCKET_SIZE_GROW = 4  # ... a cap this many times larger
DDP_BUCKET_SIZE_MAX_CAP_MB = 100.0
DDP_BUCKET_SIZE_FEWER_CALLS = 0.25  # ... removes this share of the exposed time


def packed_buckets(sizes: Sequence[int], cap_mb: float) -> int:
    """How many buckets DDP makes of the given ones, kept whole and in order, under
    `cap_mb`: it adds gradients to a bucket until the bucket reaches the cap
    (torch.distributed's `_compute_bucket_assignment_by_size`). Today's buckets are the
    smallest units known (their parameters are not recorded one by one), so this counts
    at most as many buckets as DDP would make."""
    cap = cap_mb * 2**20
    n = 0
    filled = 0.0
    for b in sizes:
        filled += b
        if filled >= cap:
            n += 1
            filled = 0.0
    return n + (1 if filled > 0 else 0)


def fewer_buckets(sizes: Sequence[int], cap_mb: float) -> tuple[float, int | None]:
    """(the cap to advise, the buckets it gives) for DDP_BUCKET_SIZE_GROW x fewer
    buckets: a cap GROW x the current one does nothing when each bucket already holds one
    gradient larger than it (0.05 MB buckets of 0.25 MB weights stay 25 buckets at
    0.2 MB), so the cap is also raised to GROW x the median bucket. None when even the
    largest cap offered gives no fewer buckets."""
    median_mb = (median(sizes) or 0.0) / 2**20
    new_cap = min(DDP_BUCKET_SIZE_MAX_CAP_MB, max(cap_mb * DDP_BUCKET_SIZE_GROW, median_mb * DDP_BUCKET_SIZE_GROW))
    new_cap = float(f"{new_cap:.2g}") if new_cap < 10 else round(new_cap)
    packed = packed_buckets(sizes, new_cap)
    return new_cap, packed if packed < len(sizes) else None


def ddp_bucket_size(ctx: RuleContext) -> list[Finding]:
    """Exposed communication >= 5% of the step under DDP whose buckets hide it badly: low
    under 10%, medium from 10% (TensorBoard plugin rule 4), high at 20%. One bucket over
    1 MB: a cap of a 1/4 of it is assumed to let 50% of the exposed all-reduce overlap the
    backward pass (at most 50% of the compute). More than 8 buckets with all-reduces
    under 1 MB on average: a cap 4x larger and at least 4x the median bucket (at most
    100 MB; none when no such cap merges buckets, `fewer_buckets`) is assumed to remove 25%
    of the exposed time. From 10% a bf16 compression hook is offered too."""
    d = ctx.ddp
    exposed = ctx.exposed_transfer()
    if not d or exposed < DDP_BUCKET_SIZE_MIN:
        return []
    found, significance = share_test(exposed, DDP_BUCKET_SIZE_MIN, _exposed_bound(ctx), EXPOSED_WORDS)
    if not found:
        return []
    sizes = d.get("bucket_sizes_bytes") or []
    total = sum(sizes)
    cap = d.get("bucket_cap_mb") or 25.0
    ar = [c for c in ctx.analysis.collectives if c.op == "all_reduce" and c.calls]
    mean_bytes = sum(c.bytes for c in ar) / sum(c.calls for c in ar) if ar and any(c.bytes for c in ar) else None
    evidence = [ctx.exposed_words(), *significance,
                f"bucket_cap_mb={cap:g}: {len(sizes)} bucket(s) of {', '.join(f'{b / 2**20:.1f}' for b in sizes)} MB"]
    if len(sizes) == 1 and total > DDP_BUCKET_SIZE_SMALL_BYTES:  # at most 1 MB: a 1 MB cap would not split it
        new_cap = max(1.0, round(total / DDP_BUCKET_SIZE_SPLIT / 2**20, 1))
        why = "one bucket: its all-reduce can only start after the whole backward pass"
        saving = _bounded(min(exposed, ctx.share("compute")) * DDP_BUCKET_SIZE_OVERLAP, exposed)
        assumption = (f"{_part(DDP_BUCKET_SIZE_OVERLAP)} of the exposed all-reduce overlaps the remaining backward "
                      "pass (at most that share of the compute)")
    elif (mean_bytes is not None and mean_bytes < DDP_BUCKET_SIZE_SMALL_BYTES
          and len(sizes) > DDP_BUCKET_SIZE_MANY):
        new_cap, packed = fewer_buckets(sizes, cap)
        if packed is None:
            return []  # no cap up to the largest offered gives fewer buckets
        why = f"many small all-reduces (mean {mean_bytes / 2**10:.0f} KB): latency-bound"
        saving = _bounded(exposed * DDP_BUCKET_SIZE_FEWER_CALLS, exposed)
        assumption = (f"{DDP_BUCKET_SIZE_GROW}x fewer, larger all-reduces remove {DDP_BUCKET_SIZE_FEWER_CALLS:.0%} "
                      "of the exposed communication (their per-call latency)")
        evidence.append(f"{sum(c.calls for c in ar)} all-reduces in the window, mean {mean_bytes / 2**10:.0f} KB")
        evidence.append(f"bucket_cap_mb={new_cap:.3g} packs these {len(sizes)} buckets into {packed} "
                        "(DDP closes a bucket once it reaches the cap)")
    else:
        return []
    evidence += _window_basis(ctx)
    kw: dict[str, Any] = {"bucket_cap_mb": new_cap}
    if not d.get("gradient_as_bucket_view"):
        kw["gradient_as_bucket_view"] = True
    static = not d.get("static_graph") and not d.get("find_unused_parameters")
    if static:
        kw["static_graph"] = True
    hook = not d.get("comm_hook") and exposed >= DDP_BUCKET_SIZE_MEDIUM
    code = f"model = DistributedDataParallel(model, {', '.join(f'{k}={_lit(v)}' for k, v in kw.items())})"
    if hook:
        code += ("\n# and send gradients in bf16 (half the bytes):\n"
                 "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
                 "model.register_comm_hook(None, default_hooks.bf16_compress_hook)")
    whole = _whole(new_cap)
    rounded = f"{new_cap:.3g} MB rounded: it takes whole MB" if whole != round(new_cap, 3) else ""
    hf_kw: dict[str, Any] = {"ddp_bucket_cap_mb": whole}
    if static:
        hf_kw["ddp_static_graph"] = True
    hf = _hf(f"; {rounded}" if rounded else "", **hf_kw)
    left = [x for x, on in (("gradient_as_bucket_view", "gradient_as_bucket_view" in kw),
                            ("a bf16 compression hook", hook)) if on]
    if left:
        hf = Form(hf.code + f"\n# TrainingArguments has no setting for {' or '.join(left)}", hf.settings)
    hook_import = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
    acc_kw = dict(kw, bucket_cap_mb=whole)
    if hook:
        acc_kw["comm_hook"] = Expr("DDPCommunicationHookType.BF16")
    acc = _accelerate_ddp(acc_kw, "from accelerate.utils import DDPCommunicationHookType\n" if hook else "", rounded)
    forms = {
        "transformers": hf,
        "lightning": _ddp_strategy(ctx.framework, "trainer", dict(kw, ddp_comm_hook=Expr("default_hooks.bf16_compress_hook"))
                                   if hook else kw, hook_import if hook else ""),
        "lightning_fabric": _ddp_strategy(ctx.framework, "fabric", kw),
        "accelerate": acc,
    }
    return [Finding(
        lever="ddp_bucket_size",
        severity=_severity(exposed, DDP_BUCKET_SIZE_MEDIUM, DDP_BUCKET_SIZE_HIGH, saving),
        title=f"DDP buckets: {why}; try bucket_cap_mb={new_cap:.3g}",
        evidence=evidence,
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action=in_framework(ctx, {"code": code, "doc": DOCS["ddp"], "assumption": _on_window(ctx, assumption)},
                            forms, [_set(TORCH_DDP, **kw)]),
    )]


COMM_OVERLAP_MIN = 0.10  # exposed communication, share of the step
COMM_OVERLAP_HIGH = 0.20
COMM_OVERLAP_HIDDEN = 0.5  # share of the exposed time assumed hidden under compute


def comm_overlap(ctx: RuleContext) -> list[Finding]:
    """Exposed communication >= 10% of the step (TensorBoard plugin rule 4), no more of it
    hidden than exposed, and no DDP (whose overlap is its buckets); high at 20%. Starting
    collectives early (async_op, FSDP prefetch) is assumed to hide 50% of the exposed time,
    at most 50% of the compute it can hide under."""
    exposed = ctx.exposed_transfer()
    hidden = ctx.share("comm_overlapped")
    if exposed < COMM_OVERLAP_MIN or hidden > exposed or ctx.ddp:
        return []  # DDP overlap is tuned through its buckets
    found, significance = share_test(exposed, COMM_OVERLAP_MIN, _exposed_bound(ctx), EXPOSED_WORDS)
    if not found:
        return []
    saving = _bounded(min(exposed, ctx.share("compute")) * COMM_OVERLAP_HIDDEN, exposed)
    fsdp = ctx.framework.fsdp
    if fsdp:
        code = ("# FSDP2: prefetch the next layer's all-gather\n"
                "for prev, nxt in zip(layers, layers[1:]):\n    prev.set_modules_to_forward_prefetch([nxt])\n"
                "model.set_reshard_after_forward(False)  # trades memory for fewer all-gathers")
        doc = DOCS["fsdp"]
    else:
        code = ("work = dist.all_reduce(tensor, async_op=True)  # start it early\n"
                "# ... independent compute ...\nwork.wait()")
        doc = DOCS["sync"]
    return [Finding(
        lever="comm_overlap",
        severity=_severity(exposed, COMM_OVERLAP_MIN, COMM_OVERLAP_HIGH, saving),
        title=f"{exposed:.0%} of the step is communication that nothing overlaps",
        evidence=[ctx.exposed_words(), *significance,
                  f"communication hidden under compute {hidden:.1%} of the profiled time"] + _window_basis(ctx),
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action={"code": code, "doc": doc,
                "assumption": _on_window(ctx, f"{_part(COMM_OVERLAP_HIDDEN)} of the exposed communication hidden "
                                              "under compute")},
    )]


BF16_CAPABILITY = (8, 0)  # Ampere: the first GPUs with bf16 tensor cores


def capability(text: Any) -> tuple[int, ...] | None:
    """A CUDA compute capability ("8.0", "10.0", "12.1") as numbers, so that Blackwell's
    10.0 compares above Ampere's 8.0 (as text it sorts below it); None when unreadable."""
    try:
        parts = tuple(int(p) for p in str(text).strip().split("."))
    except ValueError:
        return None
    return parts if text is not None and 1 <= len(parts) <= 2 else None


CPU_BF16_SPEEDUP = 2.0  # AMX bf16 GEMMs measured 3.6x fp32 on one core; half of it for whole layers
MIXED_PRECISION_MIN = 0.10  # fp32/TF32 matrix multiplies, share of the profiled time
MIXED_PRECISION_HIGH = 0.30


def mixed_precision(ctx: RuleContext) -> list[Finding]:
    """fp32/TF32 GEMM kernels >= 10% of the profiled time on a GPU without autocast
    (TensorBoard plugin rule 6 fires on any; 10% keeps small gains quiet), high at 30%;
    GEMM time counts at most the compute time (kernels on concurrent streams add up to more);
    fp32 GEMMs are assumed 4x and TF32 1.5x faster in bf16/fp16 (half the peak ratios).
    bf16 from compute capability 8.0, fp16 with a GradScaler before it. On a CPU with
    bf16 matrix units: matmul operators >= 10%, high at 30%, assumed 2x faster."""
    amp = ctx.framework.amp or {}
    if amp.get("autocast"):
        return []
    if not ctx.on_gpu:
        return _cpu_mixed_precision(ctx)
    gemm: dict[str, float] = {}
    window = 0.0
    for r in ctx.ranks:
        window += r.window_us
        for k, v in (r.ops.get("gemm_us") or {}).items():
            gemm[k] = gemm.get(k, 0.0) + v
    slow = {k: v for k, v in gemm.items() if k in ("fp32", "tf32")}
    kernels = sum(slow.values()) / window if window else 0.0
    # kernels on concurrent streams can add up to more than the compute time they ran in
    share = min(kernels, ctx.share("compute"))
    if share < MIXED_PRECISION_MIN:
        return []
    scale = share / kernels
    saving = _bounded(sum(v / window * scale * (1 - 1 / PRECISION_SPEEDUP[k]) for k, v in slow.items()), share)
    cap = capability((ctx.framework.device or {}).get("capability"))
    dtype = "torch.bfloat16" if cap is not None and cap >= BF16_CAPABILITY else "torch.float16"
    code = (f"with torch.autocast(device_type='cuda', dtype={dtype}):\n    loss = loss_fn(model(batch))\nloss.backward()")
    if dtype == "torch.float16":
        code = ("scaler = torch.amp.GradScaler()\nwith torch.autocast(device_type='cuda', dtype=torch.float16):\n"
                "    loss = loss_fn(model(batch))\nscaler.scale(loss).backward()\nscaler.step(optimizer); scaler.update()")
    forms = _precision_forms(ctx, "bf16" if dtype == "torch.bfloat16" else "fp16")
    return [Finding(
        lever="mixed_precision",
        severity=_severity(share, MIXED_PRECISION_MIN, MIXED_PRECISION_HIGH, saving),
        title=f"{share:.0%} of the step runs fp32/TF32 matrix multiplies without autocast",
        evidence=["GEMM kernel time by precision: " + ", ".join(f"{k} {v / 1000:.1f} ms" for k, v in sorted(gemm.items())),
                  "no autocast seen in forward"] + _window_basis(ctx),
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action=in_framework(ctx, {"code": code, "doc": DOCS["amp"],
                                  "assumption": _on_window(ctx, f"fp32 GEMMs run {PRECISION_SPEEDUP['fp32']:g}x "
                                                           f"and TF32 GEMMs {PRECISION_SPEEDUP['tf32']:g}x faster in "
                                                           "bf16/fp16 (half the peak ratios)")}, forms),
    )]


def _precision_forms(ctx: RuleContext, half: str) -> dict[str, Form]:
    """Mixed precision in each framework's words; `half` is "bf16" or "fp16" (the
    frameworks add the loss scaling fp16 needs themselves)."""
    return {
        "transformers": _hf(**{half: True}),
        "lightning": _trainer(ctx.framework, precision=_lightning_precision(ctx.framework, half)),
        "lightning_fabric": _fabric(ctx.framework, precision=_lightning_precision(ctx.framework, half)),
        "accelerate": _accelerator(mixed_precision=half),
        "deepspeed": _ds({half: {"enabled": True}}),
    }


def _cpu_mixed_precision(ctx: RuleContext) -> list[Finding]:
    """CPUs with bf16 matrix units (AMX, AVX512-BF16) run bf16 GEMMs several times faster."""
    dev = ctx.framework.device or {}
    dtypes = set(((ctx.framework.parameters or {}).get("bytes_by_dtype") or {}))
    if not dev.get("bf16_matmul") or (dtypes and dtypes != {"torch.float32"}):
        return []
    window = sum(r.window_us for r in ctx.ranks)
    gemm = sum(float(r.ops.get("cpu_gemm_us") or 0.0) for r in ctx.ranks)
    share = min(gemm / window if window else 0.0, ctx.share("compute"))
    if share < MIXED_PRECISION_MIN:
        return []
    saving = _bounded(share * (1 - 1 / CPU_BF16_SPEEDUP), share)
    return [Finding(
        lever="mixed_precision",
        severity=_severity(share, MIXED_PRECISION_MIN, MIXED_PRECISION_HIGH, saving),
        title=f"{share:.0%} of the step is fp32 matrix multiplies on a CPU with bf16 matrix units",
        evidence=[f"matmul/conv operators {gemm / 1000:.1f} ms of {window / 1000:.1f} ms profiled (all ranks)",
                  f"CPU has {'AMX' if dev.get('amx') else 'AVX512-BF16'}; parameters are float32; no autocast seen"]
        + _window_basis(ctx),
        ranks=[r.rank for r in ctx.ranks],
        est_saving_pct=_pct(saving),
        action=in_framework(ctx, {"code": "with torch.autocast(device_type='cpu', dtype=torch.bfloat16):\n"
                                          "    loss = loss_fn(model(batch))\nloss.backward()",
                                  "doc": DOCS["amp"],
                                  "assumption": _on_window(ctx, f"matmuls {CPU_BF16_SPEEDUP:g}x faster in bf16")},
                            _precision_forms(ctx, "bf16")),
    )]


SHARDING_PEAK = 0.90  # device memory peak, share of capacity
SHARDING_STATE = 0.60  # this rank's model state, share of capacity; also what a stage must fit under
SHARDING_UNSHARDED = 0.25  # under FSDP: the unsharded state under this share, ...
SHARDING_EXPOSED = 0.10  # ... with exposed communication from this share of the step


def _largest_memory(ctx: RuleContext) -> dict[str, Any]:
    """The memory categories at the peak of the rank that holds the most model state
    (`ranks[].memory`, analyzers/memory.py); {} when no rank has them."""
    best: dict[str, Any] = {}
    for r in ctx.ranks:
        peak = (r.memory or {}).get("peak") or {}
        if peak.get("parameters") and sum(peak.get(k) or 0 for k in ("parameters", "gradients", "optimizer_state")) \
                > sum(best.get(k) or 0 for k in ("parameters", "gradients", "optimizer_state")):
            best = dict(peak)
    return best


def sharding(ctx: RuleContext) -> list[Finding]:
    """Device memory peak >= 90% of capacity (TensorBoard plugin rule 7) or this rank's
    model state (parameters + gradients + optimizer state) >= 60% of it: the smallest ZeRO
    stage that brings the state under 60%; high from a 90% peak (the next larger batch
    runs out of memory; it decides what else can change), medium otherwise. Under FSDP, a
    whole model state under 25% of the device with exposed communication >= 10% of the
    step: DDP instead (medium). No saving is estimated: the gain is what the freed memory
    is used for. The gradients are the measured ones where the ranks' memory by category
    has them (DDP's bucket buffers are a second copy), else as many bytes as the
    parameters; measured activations are named with what checkpointing would free."""
    dev = ctx.framework.device or {}
    total = dev.get("memory_budget_bytes") or dev.get("total_memory_bytes")
    params = (ctx.framework.parameters or {}).get("local_bytes") or 0
    opt = sum(o.get("state_bytes") or 0 for o in ctx.framework.optimizers or [])
    if not total or not params:
        return []
    mem = _largest_memory(ctx)
    grads = mem.get("gradients") or params
    state = params + grads + opt  # parameters, gradients, optimizer state (this rank's share)
    peak = ctx.framework.peak_memory_reserved_bytes_max or dev.get("max_memory_reserved_bytes") or 0
    n = max(1, int(ctx.analysis.run.world_size or 1))
    gb = 2**30
    where = ("the planned " if dev.get("memory_budget_bytes") else "") + (
        "host memory share" if dev.get("memory_is_host_share") and not dev.get("memory_budget_bytes") else "device")
    measured = " measured, DDP's bucket copy included" if grads != params and mem.get("gradients") else ""
    ev = [f"model state {state / gb:.2f} GB per rank (parameters {params / gb:.2f}, gradients {grads / gb:.2f}"
          f"{measured}, optimizer {opt / gb:.2f}) on {where} of {total / gb:.1f} GB; peak {peak / gb:.2f} GB"]
    if n > 1 and not ctx.framework.fsdp:
        keep = 1 - 1 / n
        ev.append(f"sharded over {n} ranks, each rank frees: ZeRO-1 {opt * keep / gb:.2f} GB (optimizer state), "
                  f"ZeRO-2 {(grads + opt) * keep / gb:.2f} GB (and gradients), FSDP / ZeRO-3 {state * keep / gb:.2f} GB "
                  "(and parameters)")
    if mem.get("activations"):
        ev.append(f"activations {mem['activations'] / gb:.2f} GB held for backward: activation checkpointing "
                  "frees most of them (each checkpointed block keeps its input) for one more forward in backward")
    if ctx.framework.fsdp and state * n < SHARDING_UNSHARDED * total and ctx.exposed_transfer() >= SHARDING_EXPOSED:
        return [Finding(
            lever="sharding", severity="medium",
            title="the whole model state fits one device: DDP would avoid FSDP's all-gathers",
            evidence=ev + [f"unsharded model state {state * n / gb:.2f} GB is under {SHARDING_UNSHARDED:.0%} of the device",
                           ctx.exposed_words()],
            ranks=[], est_saving_pct=None,
            action=in_framework(ctx, {"code": "model = DistributedDataParallel(model)  # instead of fully_shard(model)",
                                      "doc": DOCS["ddp"]}, {
                "lightning": _trainer(ctx.framework, strategy="ddp"),
                "lightning_fabric": _fabric(ctx.framework, strategy="ddp"),
                "transformers": Form("# drop fsdp=... and fsdp_config=... from TrainingArguments: the Trainer then "
                                     "wraps the model in DistributedDataParallel"),
                "accelerate": Form("# drop fsdp_plugin=... from Accelerator(...) (and FSDP from the accelerate "
                                   "config): accelerator.prepare then wraps the model in DistributedDataParallel"),
            }),
        )]
    if ctx.framework.fsdp or (peak < SHARDING_PEAK * total and state < SHARDING_STATE * total):
        return []
    if opt >= params and params + grads + opt / n < SHARDING_STATE * total:
        stage, code = "ZeRO-1 (shard the optimizer state)", "# torch: ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW)"
        after, zero = params + grads + opt / n, 1
    elif params + (grads + opt) / n < SHARDING_STATE * total:
        stage, code = "ZeRO-2 (shard gradients and optimizer state)", "# DeepSpeed: zero_optimization.stage = 2"
        after, zero = params + (grads + opt) / n, 2
    elif state / n < SHARDING_STATE * total:
        stage, code = "FSDP / ZeRO-3 (shard parameters too)", "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)"
        after, zero = state / n, 3
    else:
        return [Finding(
            lever="sharding", severity="high",
            title="model state does not fit even fully sharded: add tensor or pipeline parallelism",
            evidence=ev + [f"fully sharded over {n} ranks: {state / n / gb:.2f} GB per rank"],
            ranks=[], est_saving_pct=None, action={"doc": DOCS["fsdp"], "text": "split layers across devices (tensor/pipeline parallel)"},
        )]
    return [Finding(
        lever="sharding", severity="high" if peak >= SHARDING_PEAK * total else "medium",
        title=f"device memory is the limit: {stage} frees room for larger batches",
        evidence=ev + [f"after sharding over {n} ranks: about {after / gb:.2f} GB of model state per rank"],
        ranks=[], est_saving_pct=None,
        action=in_framework(ctx, {"code": code, "doc": DOCS["zero"] if "ZeRO" in stage else DOCS["fsdp"]},
                            _sharding_forms(ctx, zero)),
    )]


def _sharding_forms(ctx: RuleContext, zero: int) -> dict[str, Form]:
    """ZeRO stage `zero` (3: parameters too, FSDP's full sharding) in each framework's words."""
    hf_ds = {"zero_optimization": {"stage": zero}, "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto", "train_batch_size": "auto"}
    if zero == 3:
        acc = Form("from accelerate import Accelerator\nfrom accelerate.utils import FullyShardedDataParallelPlugin\n"
                   "# FULL_SHARD by default; give auto_wrap_policy to shard layer by layer\n"
                   f"accelerator = {_call('Accelerator', {'fsdp_plugin': Expr('FullyShardedDataParallelPlugin()')})}",
                   [_set(ACC, fsdp_plugin=Expr("FullyShardedDataParallelPlugin()"))])
        strategy = "fsdp"
    else:
        plugin = f"DeepSpeedPlugin(zero_stage={zero})"
        acc = Form("from accelerate import Accelerator\nfrom accelerate.utils import DeepSpeedPlugin\n"
                   f"accelerator = {_call('Accelerator', {'deepspeed_plugin': Expr(plugin)})}",
                   [_set("accelerate.utils.DeepSpeedPlugin", zero_stage=zero), _set(ACC, deepspeed_plugin=Expr(plugin))])
        strategy = f"deepspeed_stage_{zero}"
    forms = {
        "transformers": _hf(deepspeed=hf_ds),
        "lightning": _trainer(ctx.framework, strategy=strategy),
        "lightning_fabric": _fabric(ctx.framework, strategy=strategy),
        "accelerate": acc,
    }
    uses_deepspeed = ("transformers",) if zero == 3 else ("transformers", "lightning", "lightning_fabric", "accelerate")
    for k in uses_deepspeed:
        forms[k] = Form(forms[k].code + "\n# needs the deepspeed package", forms[k].settings)
    forms["deepspeed"] = _ds({"zero_optimization": {"stage": zero}})
    return forms


BATCH_SIZE_PEAK = 0.5  # peak memory reserved at most this share of capacity, ...
BATCH_SIZE_BUSY = 0.5  # ... and the GPU busy under this share of the profiled time
BATCH_SIZE_FILL = 0.9  # a larger batch must keep the peak under this share of the device


def batch_size(ctx: RuleContext) -> list[Finding]:
    """Peak memory reserved <= 50% of the device and the GPU busy < 50% of the profiled
    time (TensorBoard plugin rule 5): a batch twice as large. Medium with no saving
    estimated: how much throughput per sample improves depends on the model. Where the
    ranks' activations were measured (memory by category), the batch that fits is said:
    activations grow with the batch, the rest of the peak does not, under 90% of the
    device; when twice the batch would not fit, no finding. GPU busy is its kernels' time
    (the ranks' `gpu` blocks, HTA's idle over their span) where the trace has kernels: an
    H200 run of gloo on CUDA tensors read 40% busy from the breakdown, whose
    communication there is gloo's host-side transfers, and 9% from its kernels."""
    dev = ctx.framework.device or {}
    total = dev.get("total_memory_bytes")
    peak = ctx.framework.peak_memory_reserved_bytes_max or 0
    if not ctx.on_gpu or not total or not peak:
        return []
    busy = 1 - ctx.share("idle") - ctx.share("dataloader")
    spans = [r.gpu for r in ctx.ranks if r.gpu is not None and r.gpu.span_us > 0]
    if spans:  # the kernels' own busy time (HTA's): gloo's host-side transfers keep no kernel busy
        busy = 1 - sum(g.idle_us for g in spans) / sum(g.span_us for g in spans)
    if peak > BATCH_SIZE_PEAK * total or busy >= BATCH_SIZE_BUSY:
        return []
    fit = _batch_fit(ctx)
    if fit is not None and fit[0] < 2:
        return []
    loaders = ctx.framework.dataloaders or []
    bs = (loader_batch(loaders[0]) if loaders and isinstance(loaders[0], dict) else None) or "B"
    new = bs * 2 if isinstance(bs, int) else Expr("...")
    forms = {"transformers": _hf(per_device_train_batch_size=new)}
    forms.update({name: _loader_form(where, {"batch_size": new}) for name, where in LOADER_PLACE.items()})
    if isinstance(new, int):
        forms["deepspeed"] = _ds({"train_micro_batch_size_per_gpu": new}, "if it sets train_batch_size, double that too")
    return [Finding(
        lever="batch_size", severity="medium",
        title=f"the GPU is busy {busy:.0%} of the step and uses {peak / total:.0%} of its memory: a larger batch amortises overheads",
        evidence=[f"peak memory reserved {peak / 2**30:.1f} of {total / 2**30:.0f} GB", f"GPU busy {busy:.0%} of the profiled time"]
        + ([fit[1]] if fit else []),
        ranks=[r.rank for r in ctx.ranks], est_saving_pct=None,
        action=_with_batch(in_framework(ctx, {
            "code": f"DataLoader(dataset, batch_size={bs if isinstance(bs, str) else bs * 2}, ...)",
            "assumption": "throughput per sample improves"}, forms), batch_change(ctx, 2)),
    )]


def _batch_fit(ctx: RuleContext) -> tuple[float, str] | None:
    """How many times the batch fits on the fullest GPU rank whose activations were
    measured: (the device's share less the peak's part that does not grow with the batch)
    / the activations; with the words. None when not measured."""
    best: tuple[float, str] | None = None
    for r in ctx.ranks:
        m = r.memory or {}
        act, alloc, cap = (m.get("peak") or {}).get("activations"), m.get("allocated"), m.get("capacity")
        if not (act and alloc and cap):
            continue
        k = (BATCH_SIZE_FILL * cap - (alloc - act)) / act
        if best is None or k < best[0]:
            gb = 2**30
            best = (k, f"rank {r.rank}: activations {act / gb:.2f} GB of a {alloc / gb:.2f} GB peak: a batch up to "
                       f"{math.floor(k * 10) / 10:g}x as large fits under {BATCH_SIZE_FILL:.0%} of its {cap / gb:.0f} GB")
    return best


SYNC_POINTS_MIN = 2  # host-device synchronisations per rank-step
SYNC_POINTS_MEDIUM = 10
SYNC_POINTS_MIN_WAIT = 0.01  # the host's time inside them, share of the profiled time
SYNC_POINTS_MEDIUM_WAIT = 0.05


def sync_points(ctx: RuleContext) -> list[Finding]:
    """>= 2 host-device synchronisations per rank-step (Nsight Systems cuda_api_sync),
    medium from 10, low below: runtime calls that wait by themselves plus value reads
    (.item(), nonzero) that copied from the device (`op_stats`). A read of a CPU tensor
    (an optimizer's step counter, DDP's map of used parameters) waits for nothing and is
    only reported beside them; an analysis without the split counts no read.
    Where the trace gives the host's time inside those waits (`sync_us`), a sync that
    returns at once costs next to nothing (the queue was empty: a host-bound job): under
    1% of the profiled time, no finding; medium needs 5% as well as 10 per step. On an
    H200, DDP's own timing of its first 10 iterations made 8 waits per step of 1-6 us
    each. No saving is estimated: what a sync costs depends on the work queued before it."""
    if not ctx.on_gpu:
        return []
    syncs = reads = host = steps = 0
    wait_us: float | None = 0.0
    for r in ctx.ranks:
        syncs += int(r.ops.get("sync_calls") or 0)
        reads += int(r.ops.get("item_device_reads") or 0)
        host += int(r.ops.get("item_host_reads") or 0)
        steps += r.steps_profiled
        w = r.ops.get("sync_us")
        wait_us = wait_us + float(w) if wait_us is not None and isinstance(w, (int, float)) else None
    calls = syncs + reads
    per_step = calls / steps if steps else 0.0
    if per_step < SYNC_POINTS_MIN:
        return []
    window = sum(r.window_us for r in ctx.ranks)
    wait = wait_us / window if wait_us is not None and window > 0 else None
    if wait is not None and wait < SYNC_POINTS_MIN_WAIT:
        return []
    evidence = [f"{calls} host-device synchronisations in {steps} rank-steps: {syncs} runtime calls that wait "
                f"(cudaStreamSynchronize, cudaMemcpy, ...) and {reads} value reads (.item(), nonzero) that copied "
                "from the device"]
    if wait is not None and wait_us is not None:
        evidence.append(f"the host waits inside them {wait_us / 1e3:.1f} ms, {wait:.1%} of the profiled time")
    if host:
        evidence.append(f"{host} .item()/nonzero reads of CPU tensors left out (host memory: no GPU wait)")
    return [Finding(
        lever="sync_points",
        severity="medium" if per_step >= SYNC_POINTS_MEDIUM and (wait is None or wait >= SYNC_POINTS_MEDIUM_WAIT)
        else "low",
        title=f"{per_step:.0f} host-GPU synchronisations per step stall the launch queue",
        evidence=evidence,
        ranks=[r.rank for r in ctx.ranks], est_saving_pct=None,
        action={"code": "# keep metrics on the GPU; read them every N steps\nrunning_loss += loss.detach()\n"
                        "if step % 50 == 0:\n    print(running_loss.item() / 50)", "doc": DOCS["sync"]},
    )]


def _find_unused_modules(ctx: RuleContext) -> list[dict[str, Any]]:
    """DDP modules that search for unused parameters every iteration (find_unused_parameters
    without a static graph, which skips the search after its first iteration)."""
    return [d for d in ctx.framework.ddp or []
            if isinstance(d, dict) and d.get("find_unused_parameters") and not d.get("static_graph")]


FIND_UNUSED_ON = {
    "transformers": "the Hugging Face Trainer passes find_unused_parameters=True to DDP unless "
                    "ddp_find_unused_parameters is set (or, for its own models, gradient checkpointing is on)",
    "lightning": 'Lightning turns it on with strategy="ddp_find_unused_parameters_true" or '
                 'DDPStrategy(find_unused_parameters=True); its "ddp" leaves it off',
    "lightning_fabric": 'Fabric turns it on with strategy="ddp_find_unused_parameters_true" or '
                        'DDPStrategy(find_unused_parameters=True); its "ddp" leaves it off',
    "accelerate": "Accelerate turns it on with DistributedDataParallelKwargs(find_unused_parameters=True); "
                  "its default is False",
}
FIND_UNUSED_CAVEAT = (
    "# if some iteration leaves a parameter without gradient (a branch not taken), DDP then stops with\n"
    "# \"Expected to have finished reduction in the prior iteration\": keep True for such a model, or use\n"
    "# {static} when the same parameters go unused in every iteration"
)
STATIC_GRAPH = {"torch": "static_graph=True", "transformers": "ddp_static_graph=True",
                "lightning": "DDPStrategy(static_graph=True)", "lightning_fabric": "DDPStrategy(static_graph=True)",
                "accelerate": "DistributedDataParallelKwargs(static_graph=True)"}


def _sampled(iteration: int) -> str:
    """The iterations at which DDP records its runtime statistics, up to `iteration`
    (the first 10, then every 100th)."""
    if iteration <= 1:
        return "iteration 1"
    head = f"iterations 1-{min(iteration, 10)}"
    return head + (f" and every 100th up to {iteration // 100 * 100}" if iteration >= 100 else "")


def ddp_find_unused(ctx: RuleContext) -> list[Finding]:
    """find_unused_parameters=True on a model that, by DDP's own record on every rank,
    uses all its parameters. No estimated saving: one run does not separate the search's
    cost (its per-parameter operators are small and the profiler inflates them), so the
    finding states the work DDP does and what DDP recorded."""
    world = int(ctx.analysis.run.world_size or len(ctx.analysis.ranks) or 0)
    found = []
    for d in _find_unused_modules(ctx):
        acr = d.get("across_ranks") or {}
        ranks = int(acr.get("ranks") or 0)
        it = acr.get("iteration_min")
        if (ranks < max(1, world) or acr.get("find_unused_parameters") != ranks
                or acr.get("unused_parameter_size_reported") != ranks or acr.get("unused_parameter_size_max") != 0
                or not isinstance(it, int) or it < 1):
            continue  # a rank that did not record it, or any unused parameter: the flag may be needed
        found.append((d, ranks, it))
    if not found:
        return []
    evidence = []
    for d, ranks, it in found:
        log = d.get("logging") or {}
        n = log.get("num_parameter_tensors")
        name = log.get("module_name") or "the model"
        tensors = f"each of its {n} parameter tensors" if isinstance(n, int) else "each parameter tensor"
        evidence.append(
            f"DistributedDataParallel({name}, find_unused_parameters=True), no static graph: every step DDP walks the "
            f"autograd graph from the forward's outputs, marks {tensors} used during backward, all-reduces that map "
            "(one more all_reduce per step) and reads it back per parameter")
        evidence.append(f"DDP recorded no unused parameter (unused_parameter_size 0) on all {ranks} rank"
                        f"{'s' if ranks != 1 else ''} at the iterations it samples: {_sampled(it)}")
    name = framework_name(ctx.framework)
    if name in FIND_UNUSED_ON:
        evidence.append(FIND_UNUSED_ON[name])
    off_kw = {"find_unused_parameters": False}
    lightning_note = '  # or strategy="ddp" instead of "ddp_find_unused_parameters_true"'
    trainer, fabric = _ddp_strategy(ctx.framework, "trainer", off_kw), _ddp_strategy(ctx.framework, "fabric", off_kw)
    acc = _accelerate_ddp(off_kw)
    forms = {
        "transformers": _hf(ddp_find_unused_parameters=False),
        "lightning": Form(trainer.code + lightning_note, trainer.settings),
        "lightning_fabric": Form(fabric.code + lightning_note, fabric.settings),
        "accelerate": Form(acc.code + "  # False is the default: drop find_unused_parameters=True", acc.settings),
    }
    forms = {k: Form(f.code + "\n" + FIND_UNUSED_CAVEAT.format(static=STATIC_GRAPH[k]), f.settings)
             for k, f in forms.items()}
    return [Finding(
        lever="ddp_find_unused",
        severity="low",
        title="DDP searches for unused parameters every step and found none: set find_unused_parameters=False",
        evidence=evidence,
        ranks=[r.rank for r in ctx.analysis.ranks],
        est_saving_pct=None,
        action=in_framework(ctx, {
            "code": "model = DistributedDataParallel(model, find_unused_parameters=False)  # the default\n"
                    + FIND_UNUSED_CAVEAT.format(static=STATIC_GRAPH["torch"]),
            "doc": DOCS["ddp"],
            "text": "The search runs after every forward and its bookkeeping in every backward; with every "
                    "parameter used, it always finds nothing. Its cost is not estimated from one run: compare "
                    "the step time after the change (pardiag diff).",
        }, forms, [_set(TORCH_DDP, **off_kw)]),
    )]


HOST_OVERHEAD_IDLE = 0.20  # GPU idle, share of the profiled time
HOST_OVERHEAD_HIGH = 0.40
HOST_OVERHEAD_KERNEL_US = 20  # median compute kernel under this: launch-bound
HOST_OVERHEAD_HIDDEN = 0.5  # share of the idle time fewer, larger kernels remove


def host_overhead(ctx: RuleContext) -> list[Finding]:
    """A launch-bound GPU: idle >= 20% of the profiled time with median compute kernels
    under 20 us, high at 40%. Fewer, larger kernels (torch.compile, CUDA graphs) are
    assumed to remove 50% of the idle time."""
    if not ctx.on_gpu:
        return []
    idle = ctx.share("idle")
    p50s = [float(v) for r in ctx.ranks if (v := r.ops.get("compute_kernel_p50_us"))]
    p50 = median(p50s)
    if idle < HOST_OVERHEAD_IDLE or p50 is None or p50 >= HOST_OVERHEAD_KERNEL_US:
        return []
    saving = _bounded(idle * HOST_OVERHEAD_HIDDEN, idle)
    ev = [f"GPU idle {idle:.0%} of the profiled time", f"median compute kernel {p50:.0f} us"]
    if ctx.analysis.hta:
        host = sum(v.get("host_wait_us", 0.0) for v in (ctx.analysis.hta.get("idle_by_rank") or {}).values())
        ev.append(f"HTA: {host / 1000:.1f} ms of idle time is host wait (the CPU did not enqueue work)")
    ev += _window_basis(ctx)
    return [Finding(
        lever="host_overhead", severity=_severity(idle, HOST_OVERHEAD_IDLE, HOST_OVERHEAD_HIGH, saving),
        title="the GPU waits for the CPU to launch many small kernels",
        evidence=ev, ranks=[r.rank for r in ctx.ranks], est_saving_pct=_pct(saving),
        action=in_framework(ctx, {"code": "model = torch.compile(model)  # fuses small kernels; or capture with CUDA graphs",
                                  "doc": DOCS["compile"],
                                  "assumption": _on_window(ctx, f"{_part(HOST_OVERHEAD_HIDDEN)} of the idle time "
                                                           "removed by fewer, larger kernels")},
                            {"transformers": _hf(torch_compile=True)}),
    )]


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


def what_if(step_us: float, findings: Sequence[Finding]) -> WhatIf | None:
    """Projected step time per finding and for all of them together. Savings are
    assumed independent: together they multiply, (1 - s1)(1 - s2)..., which is
    optimistic when two findings address the same time. A finding whose saving is a
    share of other steps than the job's median one (``action["basis_step_us"]``: a
    straggler that began part-way, its saving of the steps after it) is left out: a
    straggler from step 25 of 40 took the steps from 4.2 to 36.1 ms, 88% of which its fix
    saves, and on the run's median step of 7.0 ms that read "7.0 → 0.8 ms"."""
    if step_us <= 0:
        return None
    per = []
    remaining = 1.0
    for f in findings:
        if f.est_saving_pct and not f.action.get("basis_step_us"):
            s = min(f.est_saving_pct, 95.0) / 100
            per.append(WhatIfRow(lever=f.lever, title=f.title, step_us=step_us * (1 - s), saving_pct=f.est_saving_pct))
            remaining *= 1 - s
    if not per:
        return None
    return WhatIf(
        step_us=step_us,
        findings=per,
        all_step_us=step_us * remaining,
        all_saving_pct=round(100 * (1 - remaining), 1),
        assumption="each saving as its finding states; savings of different findings treated as independent",
    )
