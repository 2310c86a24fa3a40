"""Shared by the framework jobs: deterministic data, and the per-step loss record.

Every job writes, on every rank, ``$FW_RECORD.rank<r>.jsonl``: one line per loss the
job computed (``{"loss": x}``, the float exactly as computed: JSON floats round-trip),
then a last line with what the job itself counted (``{"optimizer_steps": n, ...}``).
Without ``FW_RECORD`` nothing is written. The jobs know nothing about pardiag.
"""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import torch
from torch.utils.data import Dataset


class RandomRegression(Dataset):
    """Sample i is drawn from a generator seeded with (seed, i): the same on every
    process, in DataLoader workers too, and picklable (spawn start method)."""

    def __init__(self, n: int, dim: int = 32, out: int = 4, seed: int = 0) -> None:
        self.n, self.dim, self.out, self.seed = n, dim, out, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(self.dim, generator=g), torch.randn(self.out, generator=g)


class RandomTokens(Dataset):
    """Random token sequences for a causal LM (labels = inputs)."""

    def __init__(self, n: int, length: int = 32, vocab: int = 256, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def mlp(dim: int = 32, hidden: int = 64, out: int = 4) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out))


class Record:
    def __init__(self, rank: int) -> None:
        prefix = os.environ.get("FW_RECORD")
        self.path = f"{prefix}.rank{rank}.jsonl" if prefix else None
        self.losses = 0
        if self.path:
            open(self.path, "w").close()

    def _write(self, doc: dict[str, Any]) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(doc) + "\n")

    def loss(self, value: Any) -> None:
        x = float(value.detach().item() if isinstance(value, torch.Tensor) else value)
        self.losses += 1
        self._write({"loss": x})
        print(f"loss {self.losses - 1}: {x!r}", flush=True)

    def done(self, optimizer_steps: int, **extra: Any) -> None:
        self._write({"optimizer_steps": optimizer_steps, **extra})


def train_regression(model: Any, opt: Any, loader: Any, rank: int, world: int, **done: Any) -> None:
    """The plain torch jobs' loop: MSE on every batch, one optimizer step per batch, each
    loss recorded, then the step count the loop took."""
    record = Record(rank)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
        record.loss(loss)
    record.done(steps, world_size=world, version=torch.__version__, **done)


def shutdown() -> None:
    """End the job's process group while Python is still fully alive; call it after the
    training function returned (its models, optimizers and trainers are gone).

    torch 2.13 on gloo: a gloo worker thread that releases its last work object after the
    interpreter began finalising takes the GIL, is ended by Python, and the process aborts
    ("terminate called without an active exception", SIGABRT), in a quarter to a half of
    plain 2-rank runs on a busy machine, pardiag or not. Once nothing holds the group,
    destroying it joins those threads first."""
    gc.collect()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
