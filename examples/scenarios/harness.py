"""The training loop the scenarios share: DDP over gloo (or one process), a torch
DataLoader, AdamW, optional bf16 autocast, gradient accumulation and a slow rank.

Every scenario plants one problem and names, in `FIX`, the change its finding advises;
`--fix` runs it with that change applied (benchmarks/whatif_accuracy.py compares the
two). Without `--fix` a scenario runs exactly its problem."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Vectors(Dataset):
    """Deterministic random feature vectors and labels; `delay_s` per sample mimics a
    slow input pipeline (decoding, augmentation, remote storage)."""

    def __init__(self, n: int, dim: int, classes: int, delay_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


class Batches(Dataset):
    """Whole batches stored ready (DataLoader(batch_size=None)): no per-sample collate,
    as a loader of pre-batched shards would give."""

    def __init__(self, batches: int, batch: int, dim: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(batches, batch, dim, generator=g)
        self.y = torch.randint(0, classes, (batches, batch), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Tokens(Dataset):
    """Sequences of token ids of `seq` tokens and a label each; on rank `long_rank` (from
    the launcher's RANK) the sequences are `factor` times longer, as when one rank's
    shard holds the long documents."""

    def __init__(self, n: int, seq: int, vocab: int, classes: int, long_rank: int = -1, factor: int = 1) -> None:
        g = torch.Generator().manual_seed(0)
        length = seq * factor if int(os.environ.get("RANK", "0")) == long_rank else seq
        self.x = torch.randint(0, vocab, (n, length), generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class TokenModel(nn.Module):
    """Token embeddings, a per-token MLP and mean pooling: work in proportion to tokens."""

    def __init__(self, vocab: int, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim), nn.ReLU())
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)).mean(dim=1))


def mlp(dim: int, hidden: int, layers: int, classes: int) -> nn.Module:
    blocks: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, classes))


def busy(ms: float) -> None:
    """Real CPU work (not a sleep) for about `ms` milliseconds."""
    a = torch.randn(64, 64)
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def args(extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--fix", action="store_true",
                   help="apply the change the scenario's finding advises (the scenario's FIX)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="with --fix: a value of the fix as a run's finding gave it (e.g. workers=6), over FIX")
    if extra:
        extra(p)
    return p.parse_args()


def settings(a: argparse.Namespace, problem: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `train`: the scenario's `problem`, with `fix` and then the
    --set values (JSON literals, else text) laid over it under --fix; `steps` from the
    command line either way."""
    if not a.fix:
        if a.set:
            raise SystemExit("error: --set gives a value of the fix: it needs --fix")
        return {**problem, "steps": a.steps}
    given: dict[str, Any] = {}
    for item in a.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set wants KEY=VALUE, got {item!r}")
        try:
            given[key] = json.loads(text)
        except ValueError:
            given[key] = text
    return {**problem, **fix, **given, "steps": a.steps}


def bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16). Without
    them bf16 autocast is emulated and slow (a 3-layer MLP's steps took 1,176 ms in bf16
    against 96 in fp32 on an AVX2 CPU): a user there trains in fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return "amx_bf16" in flags or "avx512_bf16" in flags
    except OSError:
        pass
    return False


def train(model: nn.Module, data: Dataset, **kw: Any) -> int:
    """Train (see `_train`), then end the process group once nothing holds the model:
    with torch 2.13 on gloo, a group left to the interpreter's exit can abort the process."""
    code = _train(model, data, **kw)
    del model, data
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def _train(
    model: nn.Module,
    data: Dataset,
    *,
    steps: int,
    batch: int | None,
    bucket_cap_mb: float = 25.0,
    autocast: bool | str = False,
    workers: int = 0,
    persistent_workers: bool = False,
    accum: int = 1,
    slow_rank: int = -1,
    slow_ms: float = 0.0,
    slow_from: int = 0,
    optimizer: str = "adamw",
    pause_ms: float = 0.0,
    burner_rank: int = -1,
    pin_ranks: bool = False,
    gc_rank: int = -1,
    gc_every: int = 0,
    gc_heap: int = 0,
    gc_freeze: bool = False,
    hold_rank: int = -1,
    hold_mib: int = 0,
    fresh_rank: int = -1,
    keep_memory: bool = False,
) -> int:
    """`batch=None` takes the dataset's items as whole batches; `steps` counts optimizer
    steps (of `accum` micro-batches each); optimizer "zero_adamw" shards AdamW's state
    over the ranks (ZeroRedundancyOptimizer; plain AdamW in one process).

    `slow_rank` does `slow_ms` of extra CPU work before each optimizer step's first
    micro-batch from optimizer step `slow_from` on. `autocast`: bf16 autocast; "where_fast"
    only on a CPU with bf16 matrix units (`bf16_units`), fp32 elsewhere. `pin_ranks`: each rank on its own
    CPU (rank % CPUs); `burner_rank`: another process spins on that rank's CPU for the
    whole job. `gc_rank` keeps `gc_heap` long-lived objects and calls gc.collect() every
    `gc_every` steps (as a memory-minded callback would); `gc_freeze`: gc.freeze() once
    they are built, so that collections skip them. `hold_rank` keeps `hold_mib` MiB of
    float32 data for the whole job (an evaluation set only that rank loads). `fresh_rank`:
    that rank's C library allocator maps every block of 128 KiB or more afresh and hands
    it back when freed (its dynamic threshold fixed low, as glibc's ``M_MMAP_THRESHOLD``
    allows), so each step faults its tensors' memory in again, and the other ranks'
    allocators keep theirs; `keep_memory`: every rank's allocator keeps freed memory
    (what ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824`` in the
    environment do at start-up)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if autocast == "where_fast":
        autocast = bf16_units()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    rank = dist.get_rank() if distributed else 0
    if rank == fresh_rank and not keep_memory:
        mallopt(M_MMAP_THRESHOLD, 128 << 10)
    elif keep_memory or fresh_rank >= 0:  # the fix, or the planted rank's peers: they keep theirs
        mallopt(M_MMAP_THRESHOLD, 32 << 20)
        mallopt(M_TRIM_THRESHOLD, 1 << 30)
    with contextlib.ExitStack() as stack:
        if pin_ranks or rank == burner_rank:
            cpu = pin(rank)
            if rank == burner_rank:
                stack.enter_context(burner(cpu))
        heap = [{"i": i, "v": [i]} for i in range(gc_heap)] if rank == gc_rank else []
        # kept alive by this frame until training ends; 4 bytes an element
        held = torch.randn(hold_mib * 2**18) if rank == hold_rank and hold_mib else None  # noqa: F841
        if heap and gc_freeze:
            gc.freeze()
        return _loop(model, data, rank, distributed, steps=steps, batch=batch, autocast=autocast, workers=workers,
                     persistent_workers=persistent_workers, accum=accum, slow_rank=slow_rank, slow_ms=slow_ms,
                     slow_from=slow_from, optimizer=optimizer, pause_ms=pause_ms, gc_every=gc_every if heap else 0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def mallopt(param: int, value: int) -> bool:
    """glibc's mallopt(param, value); False (and a line on stderr) where the C library
    has none or refuses: the planted problem or its fix is then not in place."""
    import ctypes
    import sys

    try:
        ok = bool(ctypes.CDLL(None).mallopt(param, value))
    except (OSError, AttributeError):
        ok = False
    if not ok:
        print(f"harness: mallopt({param}, {value}) is not available here", file=sys.stderr)
    return ok


def pin(rank: int) -> int:
    """This process (and the threads it starts from now on) on one CPU: rank % CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


@contextlib.contextmanager
def burner(cpu: int) -> Iterator[None]:
    """Another process spinning on `cpu` until the block ends."""
    import subprocess
    import sys

    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _loop(model: nn.Module, data: Dataset, rank: int, distributed: bool, *, steps: int, batch: int | None,
          autocast: bool, workers: int, persistent_workers: bool, accum: int, slow_rank: int, slow_ms: float,
          slow_from: int, optimizer: str, pause_ms: float, gc_every: int) -> int:
    sampler = DistributedSampler(data, shuffle=False) if distributed else None
    # workers stay for the next epoch only when asked (a fix); the default keeps the problem's loader as it was
    more: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers and persistent_workers else {}
    loader = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=workers,
                        drop_last=batch is not None, **more)
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    elif optimizer == "zero_adamw" and distributed:  # ZeRO-1: each rank keeps the AdamW state of its share
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    done = micro = 0
    while done < steps:
        for x, y in loader:
            if rank == slow_rank and micro % accum == 0 and done >= slow_from:
                busy(slow_ms)
            micro += 1
            sync = micro % accum == 0
            ctx = model.no_sync() if distributed and not sync else contextlib.nullcontext()
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            with ctx:
                with amp:
                    loss = loss_fn(model(x), y) / accum
                loss.backward()
            if not sync:
                continue
            opt.step()
            opt.zero_grad(set_to_none=True)
            if pause_ms:
                time.sleep(pause_ms / 1000)  # waiting on something outside the job (metrics, I/O)
            if gc_every and done % gc_every == 0:
                gc.collect()
            done += 1
            if done >= steps:
                break
    return 0
