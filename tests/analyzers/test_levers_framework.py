"""Each finding's change in the words of the framework the job ran under (Hugging Face
Trainer, Lightning Trainer and Fabric, Accelerate, DeepSpeed), with the numbers the rule
computed; plain torch, unchanged, when the job used none of them or the run did not
record one. Every keyword a framework form uses must be a parameter of the installed
framework's class (or a DeepSpeed config key), and changes of the global batch say what
they mean for the learning rate."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import math
import re
from typing import Any

import pytest
import torch

from pardiag.analysis import Analysis, Finding, from_dict
from pardiag.analyzers.pipeline import _framework
from pardiag.rank_meta import RankMeta
from pardiag.analyzers.levers import DS_CONFIG
from pardiag.analyzers.rules import advise
from factories import GB, MB, analysis, ddp, facts, rank

FORMS = ("transformers", "lightning", "lightning_fabric", "accelerate", "deepspeed")

# DeepSpeed's config keys the advice may set, as DeepSpeed names them
# (deepspeed/runtime/constants.py: train_micro_batch_size_per_gpu, gradient_accumulation_steps,
# bf16.enabled, fp16.enabled, train_batch_size; deepspeed/runtime/zero/config.py:
# zero_optimization.stage, reduce_bucket_size). Checked against DeepSpeed itself where installed.
DS_KEYS = {"bf16.enabled", "fp16.enabled", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu",
           "train_batch_size", "zero_optimization.stage", "zero_optimization.reduce_bucket_size"}

LEGACY_ACCUMULATION = (
    "for i, batch in enumerate(loader):\n"
    "    sync = (i + 1) % 4 == 0\n"
    "    with (contextlib.nullcontext() if sync else model.no_sync()):\n"
    "        (loss_fn(model(batch)) / 4).backward()\n"
    "    if sync:\n"
    "        optimizer.step(); optimizer.zero_grad()"
)


# -- runs built by hand, one per lever, with a framework name --------------------------------


def by_lever(a: Analysis) -> dict[str, Finding]:
    return {f.lever: f for f in advise(a).findings}


def comm_bound(fw: dict[str, Any]) -> dict[str, Finding]:
    """Exposed communication 20%, one 40 MB bucket, 30% input wait, 50% fp32/TF32 GEMMs:
    dataloader, gradient_accumulation, ddp_bucket_size and mixed_precision fire."""
    ops = {"gemm_us": {"fp32": 20_000.0, "tf32": 30_000.0}}
    host = {"step": 100_000.0, "dataloader": 30_000.0}
    return by_lever(analysis([rank(r, compute=0.6, comm_exposed=0.2, ops=ops, host=host) for r in (0, 1)], fw))


def every_finding(name: str | None, **fw_args: Any) -> list[Finding]:
    """One finding of each lever that has a framework form."""
    out = list(comm_bound(facts(name, **fw_args)).values())
    out.append(by_lever(analysis([rank(r, compute=0.8) for r in (0, 1)],
                                 facts(name, ddp=[ddp(find_unused=True)], **fw_args)))["ddp_find_unused"])
    # a GPU busy 30% of the time using 10 of 80 GB: a larger batch
    out.append(by_lever(analysis([rank(r, compute=0.3) for r in (0, 1)],
                                 facts(name, device={"total_memory_bytes": 80 * GB},
                                       peak_memory_reserved_bytes_max=10 * GB, **fw_args)))["batch_size"])
    # idle 50% with 8 us kernels: torch.compile
    out.append(by_lever(analysis([rank(0, compute=0.5, ops={"compute_kernel_p50_us": 8.0})],
                                 facts(name, **fw_args)))["host_overhead"])
    for params, opt, fsdp in ((10 * GB, 20 * GB, None), (30 * GB, 60 * GB, None), (90 * GB, 180 * GB, None)):
        fw = facts(name, parameters={"local_bytes": params}, optimizers=[{"class": "AdamW", "state_bytes": opt}],
                   device={"total_memory_bytes": 80 * GB}, peak_memory_reserved_bytes_max=79 * GB, fsdp=fsdp, **fw_args)
        out.append(by_lever(analysis([rank(i, compute=0.8) for i in range(8)], fw))["sharding"])
    tiny = facts(name, parameters={"local_bytes": 0.1 * GB}, optimizers=[{"state_bytes": 0.2 * GB}],
                 device={"total_memory_bytes": 80 * GB}, peak_memory_reserved_bytes_max=2 * GB, fsdp={"fsdp2": {}},
                 **fw_args)
    out.append(by_lever(analysis([rank(i, compute=0.5, comm_exposed=0.3) for i in range(2)], tiny))["sharding"])
    cpu = facts(name, device={"bf16_matmul": True, "amx": True}, parameters={"bytes_by_dtype": {"torch.float32": 1}},
                **fw_args)
    out.append(by_lever(analysis([rank(0, device="cpu", compute=0.8, ops={"cpu_gemm_us": 40_000.0})], cpu))[
        "mixed_precision"])
    return out


# -- what the installed frameworks accept ----------------------------------------------------


def resolve(call: str) -> Any:
    """The callable an import path names (a module attribute, or a class attribute)."""
    mod, _, attr = call.rpartition(".")
    try:
        return getattr(importlib.import_module(mod), attr)
    except ModuleNotFoundError:
        owner_mod, _, cls = mod.rpartition(".")
        return getattr(getattr(importlib.import_module(owner_mod), cls), attr)


def parameters(call: str) -> dict[str, inspect.Parameter]:
    params = {k: p for k, p in inspect.signature(resolve(call)).parameters.items()
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and k != "self"}
    if call.endswith(".strategies.DDPStrategy"):
        # Lightning passes DDPStrategy's other keyword arguments to DistributedDataParallel
        # (strategies/ddp.py: DistributedDataParallel(module=..., device_ids=..., **self._ddp_kwargs))
        params.update(inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters)
    return params


def type_ok(p: inspect.Parameter, value: Any) -> bool:
    """An int-typed parameter gets an int (TrainingArguments rejects 2.5 for
    ddp_bucket_cap_mb), a bool-typed one a bool; expressions are not checked."""
    ann = str(p.annotation)
    if isinstance(value, str) and not ann.startswith(("str", "<class 'str'>")) and "str" not in ann:
        return True  # an expression written as code (e.g. DDPCommunicationHookType.BF16)
    if ann in ("int", "<class 'int'>", "int | None", "Optional[int]"):
        return isinstance(value, int) and not isinstance(value, bool)
    if ann in ("bool", "<class 'bool'>", "bool | None", "Optional[bool]"):
        return isinstance(value, bool)
    return True


def dotted(d: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and k in ("bf16", "fp16", "zero_optimization"):
            out |= dotted(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


CALL_PATHS = {  # the name a snippet calls -> import path, per framework
    "transformers": {"TrainingArguments": "transformers.TrainingArguments"},
    "lightning": {"Trainer": "lightning.pytorch.Trainer", "DDPStrategy": "lightning.pytorch.strategies.DDPStrategy"},
    "lightning_fabric": {"Fabric": "lightning.fabric.Fabric", "DDPStrategy": "lightning.fabric.strategies.DDPStrategy",
                         "no_backward_sync": "lightning.fabric.Fabric.no_backward_sync"},
    "accelerate": {"Accelerator": "accelerate.Accelerator",
                   "DistributedDataParallelKwargs": "accelerate.utils.DistributedDataParallelKwargs",
                   "DeepSpeedPlugin": "accelerate.utils.DeepSpeedPlugin",
                   "FullyShardedDataParallelPlugin": "accelerate.utils.FullyShardedDataParallelPlugin"},
    "torch": {"DataLoader": "torch.utils.data.DataLoader", "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel"},
}


def calls_in(code: str) -> list[tuple[str, set[str]]]:
    """(called name, keyword names) of every call in a Python snippet."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            out.append((name, {k.arg for k in node.keywords if k.arg}))
    return out


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMS)
def test_every_keyword_of_a_framework_form_exists_in_the_installed_framework(name: str) -> None:
    for package in {"transformers": ("transformers",), "lightning": ("lightning",), "lightning_fabric": ("lightning",),
                    "accelerate": ("accelerate",)}.get(name, ()):
        pytest.importorskip(package, reason=f"checking the {name} form needs {package} installed")
    findings = every_finding(name, version="2.6.0", loaded={"lightning": "2.6.0"})
    in_form = [f for f in findings if f.action.get("framework") == name]
    levers = {f.lever for f in in_form}
    expected = {"transformers": {"dataloader", "gradient_accumulation", "ddp_bucket_size", "mixed_precision",
                                 "ddp_find_unused", "batch_size", "host_overhead", "sharding"},
                "lightning": {"dataloader", "gradient_accumulation", "ddp_bucket_size", "mixed_precision",
                              "ddp_find_unused", "batch_size", "sharding"},
                "accelerate": {"dataloader", "gradient_accumulation", "ddp_bucket_size", "mixed_precision",
                               "ddp_find_unused", "batch_size", "sharding"},
                "deepspeed": {"dataloader", "gradient_accumulation", "mixed_precision", "batch_size", "sharding"}}
    expected["lightning_fabric"] = expected["lightning"]
    assert levers == expected[name]
    for f in in_form:
        code = f.action["code"]
        assert f.action["torch_code"] and f.action["torch_code"] != code
        if name == "deepspeed" and any(s["call"] == DS_CONFIG for s in f.action["settings"]):
            config = json.loads("\n".join(line for line in code.splitlines() if not line.startswith("#")))
            merged = {k: v for s in f.action["settings"] for k, v in s["kwargs"].items()}
            assert config == merged, f.lever
            assert dotted(config) <= DS_KEYS, (f.lever, dotted(config) - DS_KEYS)
            continue
        for s in f.action["settings"]:
            params = parameters(s["call"])
            for k, v in s["kwargs"].items():
                assert k in params, f"{f.lever}: {s['call']} has no parameter {k}"
                assert type_ok(params[k], v), f"{f.lever}: {s['call']}({k}={v!r}) has the wrong type"
                if k == "deepspeed" and isinstance(v, dict):  # TrainingArguments(deepspeed={config})
                    assert dotted(v) <= DS_KEYS, (f.lever, dotted(v) - DS_KEYS)
        # the code says what the settings say, and nothing the installed framework lacks
        paths = {**CALL_PATHS["torch"], **CALL_PATHS.get(name, {})}
        calls = calls_in(code)
        for called, keywords in calls:
            if called in paths:
                params = parameters(paths[called])
                assert keywords <= set(params), f"{f.lever}: {called}({keywords - set(params)}) unknown"
        for s in f.action["settings"]:
            short = s["call"].rsplit(".", 1)[1]
            assert any(c == short and set(s["kwargs"]) <= kw for c, kw in calls), (f.lever, short, code)


def test_deepspeed_keys_are_deepspeed_s_own_where_installed() -> None:
    ds = pytest.importorskip("deepspeed")
    from deepspeed.runtime import constants as c
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    top = {c.BFLOAT16, c.FP16, c.GRADIENT_ACCUMULATION_STEPS, c.TRAIN_MICRO_BATCH_SIZE_PER_GPU, c.TRAIN_BATCH_SIZE}
    zero = set(DeepSpeedZeroConfig.model_fields)
    for key in DS_KEYS:
        head, _, tail = key.partition(".")
        assert head in top | {"zero_optimization"}, (ds.__version__, key)
        if head == "zero_optimization":
            assert tail in zero
        elif tail:
            assert tail == c.BFLOAT16_ENABLED


@pytest.mark.parametrize("name", ["torch", None, "horovod"])
def test_plain_torch_form_is_unchanged_without_a_framework(name: str | None) -> None:
    f = comm_bound(facts(name))
    for lever in ("dataloader", "gradient_accumulation", "ddp_bucket_size", "mixed_precision"):
        assert f[lever].action["framework"] == "torch" and "torch_code" not in f[lever].action
    assert f["dataloader"].action["code"] == (
        "DataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True, prefetch_factor=2, pin_memory=True)")
    assert f["dataloader"].action["settings"] == [{"call": "torch.utils.data.DataLoader", "kwargs": {
        "num_workers": 2, "persistent_workers": True, "prefetch_factor": 2, "pin_memory": True}}]
    assert f["ddp_bucket_size"].action["code"].startswith(
        "model = DistributedDataParallel(model, bucket_cap_mb=10, gradient_as_bucket_view=True, static_graph=True)\n"
        "# and send gradients in bf16 (half the bytes):")
    assert f["mixed_precision"].action["code"] == (
        "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    loss = loss_fn(model(batch))\nloss.backward()")
    # the loop as before, and one line saying the global batch changes
    acc = f["gradient_accumulation"].action["code"]
    assert acc.startswith(LEGACY_ACCUMULATION + "\n# changes training: global batch 64 -> 256")
    assert comm_bound(facts(name))["ddp_bucket_size"].action == comm_bound(facts(None))["ddp_bucket_size"].action


def test_each_framework_says_it_with_the_rule_s_numbers() -> None:
    hf = comm_bound(facts("transformers", "4.57.0"))
    assert "TrainingArguments(..., dataloader_num_workers=2, dataloader_persistent_workers=True, " \
           "dataloader_prefetch_factor=2, dataloader_pin_memory=True)" in hf["dataloader"].action["code"]
    assert "TrainingArguments(..., gradient_accumulation_steps=4)" in hf["gradient_accumulation"].action["code"]
    assert "TrainingArguments(..., ddp_bucket_cap_mb=10, ddp_static_graph=True)" in hf["ddp_bucket_size"].action["code"]
    assert "TrainingArguments(..., bf16=True)" in hf["mixed_precision"].action["code"]
    assert hf["ddp_bucket_size"].action["torch_code"].startswith("model = DistributedDataParallel(model, bucket_cap_mb=10")

    lt = comm_bound(facts("lightning", "2.5.0", {"lightning": "2.5.0"}))
    assert "Trainer(..., accumulate_grad_batches=4)" in lt["gradient_accumulation"].action["code"]
    assert 'Trainer(..., precision="bf16-mixed")' in lt["mixed_precision"].action["code"]
    assert ("Trainer(..., strategy=DDPStrategy(bucket_cap_mb=10, gradient_as_bucket_view=True, "
            "static_graph=True, ddp_comm_hook=default_hooks.bf16_compress_hook))") in lt["ddp_bucket_size"].action["code"]
    assert "in your LightningDataModule" in lt["dataloader"].action["code"]

    fab = comm_bound(facts("lightning_fabric", "2.5.0", {"lightning": "2.5.0"}))
    assert 'Fabric(..., precision="bf16-mixed")' in fab["mixed_precision"].action["code"]
    assert "with fabric.no_backward_sync(model, enabled=not sync):" in fab["gradient_accumulation"].action["code"]
    assert "Fabric(..., strategy=DDPStrategy(bucket_cap_mb=10, gradient_as_bucket_view=True, static_graph=True))" \
           in fab["ddp_bucket_size"].action["code"]

    acc = comm_bound(facts("accelerate", "1.10.0"))
    assert 'Accelerator(..., mixed_precision="bf16")' in acc["mixed_precision"].action["code"]
    assert "Accelerator(..., gradient_accumulation_steps=4)" in acc["gradient_accumulation"].action["code"]
    assert ("DistributedDataParallelKwargs(bucket_cap_mb=10, gradient_as_bucket_view=True, static_graph=True, "
            "comm_hook=DDPCommunicationHookType.BF16)") in acc["ddp_bucket_size"].action["code"]
    assert "Accelerator(..., kwargs_handlers=[ddp_kwargs])" in acc["ddp_bucket_size"].action["code"]

    ds = comm_bound(facts("deepspeed", "0.17.0"))
    assert ds["mixed_precision"].action["code"].endswith('{"bf16": {"enabled": true}}')
    assert '{"gradient_accumulation_steps": 4}' in ds["gradient_accumulation"].action["code"]
    assert ds["ddp_bucket_size"].action["framework"] == "torch"  # a DDP the script built itself


def test_fp16_older_lightning_and_standalone_packages() -> None:
    volta = {"capability": "7.0"}
    assert 'precision="16-mixed"' in comm_bound(facts("lightning", "2.1.0", device=volta))["mixed_precision"].action["code"]
    assert "fp16=True" in comm_bound(facts("transformers", device=volta))["mixed_precision"].action["code"]
    assert 'mixed_precision="fp16"' in comm_bound(facts("accelerate", device=volta))["mixed_precision"].action["code"]
    assert '{"fp16": {"enabled": true}}' in comm_bound(facts("deepspeed", device=volta))["mixed_precision"].action["code"]
    # Lightning 1.x spelled it precision="bf16" / 16
    assert 'precision="bf16"' in comm_bound(facts("lightning", "1.9.5"))["mixed_precision"].action["code"]
    assert "precision=16" in comm_bound(facts("lightning", "1.9.5", device=volta))["mixed_precision"].action["code"]
    # a job that imported pytorch_lightning (not the unified package) gets that import
    pl = comm_bound(facts("lightning", "2.5.0", {"pytorch_lightning": "2.5.0", "lightning_fabric": "2.5.0"}))
    assert pl["mixed_precision"].action["code"].startswith("from pytorch_lightning import Trainer")
    assert pl["mixed_precision"].action["settings"][0]["call"] == "pytorch_lightning.Trainer"


def test_whole_megabytes_where_the_framework_takes_an_int() -> None:
    # one 10 MB bucket: cap 10 / 4 = 2.5 MB; TrainingArguments and Accelerate take whole MB
    fw = facts("transformers", ddp=[ddp(total=10 * MB)])
    code = comm_bound(fw)["ddp_bucket_size"].action["code"]
    assert "ddp_bucket_cap_mb=3, ddp_static_graph=True)  # with your other arguments; 2.5 MB rounded: it takes whole MB" in code
    assert "bucket_cap_mb=2.5" in comm_bound(facts("lightning", ddp=[ddp(total=10 * MB)]))["ddp_bucket_size"].action["code"]
    assert "DistributedDataParallelKwargs(bucket_cap_mb=3," in comm_bound(
        facts("accelerate", ddp=[ddp(total=10 * MB)]))["ddp_bucket_size"].action["code"]
    assert "bucket_cap_mb=2.5" in comm_bound(facts(None, ddp=[ddp(total=10 * MB)]))["ddp_bucket_size"].action["code"]


@pytest.mark.parametrize("name", [None, *FORMS])
def test_changes_of_the_global_batch_say_so_with_the_learning_rate(name: str | None) -> None:
    f = comm_bound(facts(name))["gradient_accumulation"]
    # 32 per rank x 2 ranks x 1 backward = 64; accumulating 4 -> 256; SGD lr 0.01 -> 0.04 (linear)
    b = f.action["batch"]
    assert (b["factor"], b["global_batch_before"], b["global_batch_after"], b["optimizer"], b["initial_lr"]) == (
        4, 64, 256, "SGD", 0.01)
    assert "global batch 64 -> 256" in f.title
    assert "lr x4, initial lr 0.01 -> 0.04" in b["note"] and "warm-up" in b["note"] and "Goyal et al., 2017" in b["note"]
    assert "an epoch takes 4x fewer optimizer steps" in f.action["assumption"]
    assert f.action["code"].splitlines()[-1] == (
        "# changes training: global batch 64 -> 256 samples per optimizer step; re-tune the learning rate "
        "(SGD lr x4 (0.01 -> 0.04), linear rule, with warm-up)")


def test_learning_rate_advice_follows_the_optimizer() -> None:
    adam = comm_bound(facts(None, optimizers=[{"class": "AdamW", "lr": 3e-4, "initial_lr": 3e-4}]))[
        "gradient_accumulation"].action["batch"]
    # Adam-type: less than linear; sqrt(4) = 2: 3e-4 -> 6e-4
    assert "lr x2 (square root of 4, initial lr 0.0003 -> 0.0006)" in adam["note"] and "less than linear" in adam["note"]
    # a learning rate recorded mid-schedule (no initial_lr) is no base for numbers: the factor only
    mid = comm_bound(facts(None, optimizers=[{"class": "AdamW", "lr": 6.25e-4}]))["gradient_accumulation"]
    assert mid.action["batch"]["initial_lr"] is None and "0.000625" not in mid.action["batch"]["note"]
    assert mid.action["code"].endswith("re-tune the learning rate (AdamW lr x2, less than linear)")
    other = comm_bound(facts(None, optimizers=[{"class": "Lion", "lr": 1e-4}]))["gradient_accumulation"].action["batch"]
    assert "linear scaling (lr x4) with a warm-up is the usual start for SGD" in other["note"]
    assert "about x2" in other["note"]
    unknown = comm_bound(facts(None, dataloaders=[]))["gradient_accumulation"]
    assert unknown.action["batch"]["global_batch_before"] is None and "(global batch 4x)" in unknown.title
    # with 2 micro-batches already and 8 ranks: 16 x 8 x 2 = 256 -> doubled batch 512
    fw = facts("transformers", dataloaders=[{"batch_size": 16}], grad_accumulation={"backwards_per_step": 2.0},
               device={"total_memory_bytes": 80 * GB}, peak_memory_reserved_bytes_max=10 * GB)
    bs = by_lever(analysis([rank(r, compute=0.3) for r in range(8)], fw))["batch_size"]
    assert bs.action["batch"]["global_batch_before"] == 256 and bs.action["batch"]["global_batch_after"] == 512
    assert "TrainingArguments(..., per_device_train_batch_size=32)" in bs.action["code"]
    assert bs.action["torch_code"].startswith("DataLoader(dataset, batch_size=32, ...)")


def find_unused(name: str | None = None, **ddp_args: Any) -> Finding | None:
    a = analysis([rank(r, compute=0.8) for r in (0, 1)], facts(name, ddp=[ddp(find_unused=True, **ddp_args)]))
    return by_lever(a).get("ddp_find_unused")


def test_find_unused_fires_only_when_every_rank_recorded_no_unused_parameter() -> None:
    f = find_unused()
    assert f is not None and f.severity == "low" and f.est_saving_pct is None and f.ranks == [0, 1]
    assert "each of its 256 parameter tensors" in f.evidence[0]
    assert f.evidence[1] == ("DDP recorded no unused parameter (unused_parameter_size 0) on all 2 ranks at the "
                             "iterations it samples: iterations 1-10")
    assert f.action["code"].startswith("model = DistributedDataParallel(model, find_unused_parameters=False)")
    assert "Expected to have finished reduction in the prior iteration" in f.action["code"]
    assert find_unused(unused=288) is None  # a rank saw 288 bytes of unused parameters: the flag is needed
    assert find_unused(unused=None) is None  # DDP recorded nothing: no evidence
    assert find_unused(ranks=1) is None  # one of the two ranks did not record it
    static = facts(None, ddp=[dict(ddp(find_unused=True), static_graph=True)])
    assert "ddp_find_unused" not in by_lever(analysis([rank(r, compute=0.8) for r in (0, 1)], static))
    assert "ddp_find_unused" not in by_lever(analysis([rank(r, compute=0.8) for r in (0, 1)], facts(None)))
    assert "ddp_find_unused" not in [x.lever for x in advise(analysis([rank(0, compute=0.8)], {})).findings]


def test_find_unused_in_each_framework_s_words() -> None:
    hf = find_unused("transformers")
    assert "TrainingArguments(..., ddp_find_unused_parameters=False)" in hf.action["code"]
    assert "ddp_static_graph=True when" in hf.action["code"]
    assert any("Hugging Face Trainer passes find_unused_parameters=True" in e for e in hf.evidence)
    lt = find_unused("lightning")
    assert "Trainer(..., strategy=DDPStrategy(find_unused_parameters=False))" in lt.action["code"]
    assert '"ddp_find_unused_parameters_true"' in lt.action["code"]
    fab = find_unused("lightning_fabric")
    assert "Fabric(..., strategy=DDPStrategy(find_unused_parameters=False))" in fab.action["code"]
    acc = find_unused("accelerate")
    assert "DistributedDataParallelKwargs(find_unused_parameters=False)" in acc.action["code"]
    assert "DistributedDataParallelKwargs(static_graph=True) when" in acc.action["code"]
    assert find_unused("deepspeed").action["framework"] == "torch"


def test_sync_points_count_only_reads_from_the_device() -> None:
    # find_unused with AdamW: 1024 .item() reads of CPU tensors in 4 steps (DDP's used map,
    # the step counters; op_stats saw no copy inside them) and 8 that copied from the GPU:
    # 8 / 4 = 2 per step, whatever the DDP settings
    ops = {"item_calls": 1024 + 8, "item_device_reads": 8, "item_host_reads": 1024, "sync_calls": 0,
           "compute_kernel_p50_us": 200.0}
    for fw in (facts(None, ddp=[ddp(find_unused=True)]), facts(None)):
        f = by_lever(analysis([rank(0, steps=4, compute=0.9, ops=ops)], fw))["sync_points"]
        assert f.title.startswith("2 host-GPU synchronisations per step")
        assert "0 runtime calls that wait" in f.evidence[0] and "8 value reads" in f.evidence[0]
        assert "1024 .item()/nonzero reads of CPU tensors left out" in f.evidence[1]
    only_host = dict(ops, item_calls=1024, item_device_reads=0)
    assert "sync_points" not in by_lever(analysis([rank(0, steps=4, compute=0.9, ops=only_host)], facts(None)))
    # an analysis without the split does not count its reads as waits
    old = {"item_calls": 1024, "sync_calls": 4, "compute_kernel_p50_us": 200.0}
    assert "sync_points" not in by_lever(analysis([rank(0, steps=4, compute=0.9, ops=old)], facts(None)))


def meta(rank_: int, unused: int, name: str | None = "transformers") -> RankMeta:
    m: dict[str, Any] = {
        "ddp": [{"find_unused_parameters": True, "static_graph": False, "bucket_sizes_bytes": [100],
                 "logging": {"unused_parameter_size": unused, "iteration": 10 + rank_, "num_parameter_tensors": 4,
                             "master_addr": "10.0.0.1", "prev_iteration_grad_ready_order_indices": "3, 2, 1, 0",
                             "avg_backward_comm_time": 1234}}],
        "threads": {"python_executable": "/opt/py/bin/python", "sched_affinity": 4},
    }
    if name:
        m["framework"] = {"name": name, "version": "4.57.0", "detected_from": "optimizer step caller",
                          "loaded": {"transformers": "4.57.0", "accelerate": "1.10.0"}, "wrapped": ["x.y"]}
    return RankMeta.from_mapping(m)


def test_run_framework_carries_name_version_and_ddp_s_record_of_every_rank() -> None:
    metas = {0: meta(0, 0), 1: meta(1, 288)}
    before = copy.deepcopy({r: m.to_dict() for r, m in metas.items()})
    fw = _framework(metas)
    assert {r: m.to_dict() for r, m in metas.items()} == before  # the metas are not changed
    assert fw is not None
    assert (fw.name, fw.version, fw.loaded) == ("transformers", "4.57.0", {"transformers": "4.57.0",
                                                                           "accelerate": "1.10.0"})
    assert fw.ddp is not None and fw.threads is not None
    d = fw.ddp[0]
    assert d["logging"] == {"unused_parameter_size": 0, "iteration": 10, "num_parameter_tensors": 4,
                            "avg_backward_comm_time": 1234}
    assert d["across_ranks"] == {"ranks": 2, "find_unused_parameters": 2, "unused_parameter_size_reported": 2,
                                 "unused_parameter_size_max": 288, "iteration_min": 10}
    assert "python_executable" not in fw.threads
    old = _framework({0: meta(0, 0, name=None)})
    assert old is not None and old.name is None and old.version is None and old.loaded == {}
    assert _framework({}) is None


def test_actions_survive_the_json_contract() -> None:
    a = advise(analysis([rank(r, compute=0.6, comm_exposed=0.2) for r in (0, 1)], facts("accelerate")))
    back = from_dict(json.loads(a.to_json()))
    f = {x.lever: x for x in back.findings}["ddp_bucket_size"]
    assert f.action["framework"] == "accelerate" and f.action["settings"][0]["kwargs"]["comm_hook"] == (
        "DDPCommunicationHookType.BF16")
    assert re.search(r"bucket_cap_mb=10\b", f.action["torch_code"]) and math.isfinite(f.est_saving_pct)


def test_no_bucket_advice_that_would_not_split_the_bucket() -> None:
    # a real HF Trainer job (tiny GPT-2): one 0.5 MB bucket; the smallest cap proposed is 1 MB,
    # which leaves it one bucket: no finding rather than a change that changes nothing
    small = comm_bound(facts("transformers", ddp=[ddp(total=MB // 2)]))
    assert "ddp_bucket_size" not in small
    # 3 MB: cap max(1, 0.75) = 1 MB splits it in three
    assert "bucket_cap_mb=1" in comm_bound(facts(None, ddp=[ddp(total=3 * MB)]))["ddp_bucket_size"].action["code"]


def test_global_batch_from_a_loader_built_with_a_batch_sampler() -> None:
    # the HF Trainer's loader: batch_size None, its batch sampler takes 16; 16 x 2 ranks = 32 -> 128
    loader = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "batch_size": None,
              "batch_sampler_batch_size": 16}
    b = comm_bound(facts("transformers", dataloaders=[loader]))["gradient_accumulation"].action["batch"]
    assert (b["global_batch_before"], b["global_batch_after"]) == (32, 128)
