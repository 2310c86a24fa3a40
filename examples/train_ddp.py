"""A small, self-contained DistributedDataParallel training script.

It trains a Transformer encoder classifier on synthetic token sequences (no
downloads; every sample is generated from the seed and its index), through a real
DataLoader with a DistributedSampler, AdamW and optional autocast / gradient
accumulation. It is the workload of `pardiag demo` and of the tests.

    python examples/train_ddp.py --steps 5                      # one process, no DDP
    torchrun --nproc-per-node 2 examples/train_ddp.py --epochs 1
    pardiag run -- torchrun --nproc-per-node 2 examples/train_ddp.py \\
        --straggler-rank 1 --straggler-ms 40                    # plant a slow rank

A process group is created only when launched by torchrun (or WORLD_SIZE > 1):
nccl when CUDA is available, gloo otherwise, unless --backend says. Each rank uses
one intra-op thread unless --threads is given. Run with --help for all knobs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SyntheticTokens(Dataset):
    """Random token sequences; the label is a function of the first token, so the loss falls."""

    def __init__(self, size: int, seq_len: int, vocab: int, classes: int, seed: int) -> None:
        self.size, self.seq_len, self.vocab = size, seq_len, vocab
        self.classes, self.seed = classes, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(0, self.vocab, (self.seq_len,), generator=g)
        return tokens, tokens[0] % self.classes


class Classifier(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int,
                 classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]])
        return self.head(x[:, 0])  # the first position acts as the [CLS] token


def busy_work(ms: float) -> None:
    """Burn `ms` milliseconds of real CPU (matrix products), not a sleep."""
    a = torch.randn(64, 64)
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows real defaults only (not None, not False of a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    a = p.add_argument
    a("--epochs", type=int, default=None,
      help="passes over the data (default: 1, or as many as --steps needs)")
    a("--steps", type=int, default=None, help="stop after this many optimizer steps")
    a("--batch-size", type=int, default=16, help="samples per micro-batch per rank")
    a("--dataset-size", type=int, default=800, help="samples in the synthetic dataset")
    a("--seq-len", type=int, default=64, help="tokens per sample")
    a("--d-model", type=int, default=128, help="Transformer width")
    a("--layers", type=int, default=2, help="Transformer encoder layers")
    a("--heads", type=int, default=4, help="attention heads")
    a("--vocab", type=int, default=1000, help="vocabulary size")
    a("--classes", type=int, default=10, help="output classes")
    a("--lr", type=float, default=1e-3, help="AdamW learning rate")
    a("--bucket-cap-mb", type=float, default=25, help="DDP gradient bucket size (MB)")
    a("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
      help="autocast dtype (fp16 uses a GradScaler on CUDA only)")
    a("--accum-steps", type=int, default=1,
      help="micro-batches per optimizer step (no_sync on all but the last)")
    a("--workers", type=int, default=0, help="DataLoader num_workers")
    a("--pin-memory", action="store_true", help="DataLoader pin_memory")
    a("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    a("--threads", type=int, default=None, help="torch intra-op threads per rank (default: 1)")
    a("--seed", type=int, default=0, help="seed for data, model and sampler")
    a("--log-every", type=int, default=5, help="rank 0 prints a line every N optimizer steps")
    a("--step-log", default=None, metavar="PATH",
      help="append one JSON line per optimizer step to PATH.rank<r>")
    a("--straggler-rank", type=int, default=None, help="rank that does extra work every step")
    a("--straggler-ms", type=float, default=0.0, help="extra busy CPU time per step (ms)")
    a("--crash-rank", type=int, default=None, help="rank that raises at --crash-step")
    a("--crash-step", type=int, default=None, help="optimizer step at which it raises")
    args = p.parse_args(argv)
    if args.accum_steps < 1:
        p.error("--accum-steps must be at least 1")
    if (args.crash_rank is None) != (args.crash_step is None):
        p.error("--crash-rank and --crash-step go together")
    return args


def launched_distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or 1)
    distributed = launched_distributed()
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if distributed:
        dist.init_process_group(backend=args.backend or ("nccl" if use_cuda else "gloo"))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    # more local ranks than GPUs share them round-robin (gloo only: NCCL refuses two
    # ranks on one GPU); with a GPU per rank this is cuda:<local rank>, as before
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    data = SyntheticTokens(args.dataset_size, args.seq_len, args.vocab, args.classes, args.seed)
    sampler = DistributedSampler(data, world, rank, shuffle=True, seed=args.seed) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None,
                        num_workers=args.workers, pin_memory=args.pin_memory, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    if len(loader) == 0:
        print(f"train_ddp: --dataset-size {args.dataset_size} gives no full batch of "
              f"{args.batch_size} per rank over {world} rank(s)", file=sys.stderr)
        if distributed:
            dist.destroy_process_group()
        return 2

    torch.manual_seed(args.seed)
    net = Classifier(args.vocab, args.d_model, args.heads, args.layers, args.seq_len,
                     args.classes).to(device)
    ddp = DDP(net, device_ids=[device.index] if use_cuda else None,
              bucket_cap_mb=args.bucket_cap_mb) if distributed else None
    model: nn.Module = ddp if ddp is not None else net
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" and use_cuda else None
    loss_fn = nn.CrossEntropyLoss()

    epochs = args.epochs if args.epochs is not None else (1 if args.steps is None else 1 << 30)
    step_log: TextIO | None = None
    if args.step_log:
        step_log = open(f"{args.step_log}.rank{rank}", "a", buffering=1)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"train_ddp: world {world}, {device}, {params / 1e6:.2f}M params, "
              f"{len(loader) // args.accum_steps} steps/epoch, {args.precision}", flush=True)

    step, micro = 0, 0
    last_loss = torch.full((), float("nan"))
    durations: list[float] = []
    t_prev: float | None = None
    done = False
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        batches = iter(loader)
        while not done:
            if t_prev is None:
                t_prev = time.perf_counter()  # step 0 starts at the first batch fetch
            try:
                tokens, labels = next(batches)
            except StopIteration:
                break
            if args.crash_rank == rank and args.crash_step == step:
                raise RuntimeError(f"planted crash on rank {rank} at step {step}")
            first_micro = micro % args.accum_steps == 0
            if args.straggler_rank == rank and args.straggler_ms > 0 and first_micro:
                busy_work(args.straggler_ms)
            tokens = tokens.to(device, non_blocking=args.pin_memory)
            labels = labels.to(device, non_blocking=args.pin_memory)
            boundary = (micro + 1) % args.accum_steps == 0
            sync = ddp.no_sync() if ddp is not None and not boundary else contextlib.nullcontext()
            autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None
                        else contextlib.nullcontext())
            with sync:
                with autocast:
                    loss = loss_fn(model(tokens), labels) / args.accum_steps
                (scaler.scale(loss) if scaler is not None else loss).backward()
            micro += 1
            if not boundary:
                continue
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            now = time.perf_counter()
            dur_us = (now - t_prev) * 1e6
            t_prev = now
            durations.append(dur_us)
            if step_log is not None:
                step_log.write(json.dumps({"step": step, "dur_us": round(dur_us, 1)}) + "\n")
            optimizer.zero_grad(set_to_none=True)
            last_loss = loss.detach() * args.accum_steps
            if rank == 0 and (step + 1) % args.log_every == 0:
                print(f"step {step + 1:4d}  loss {last_loss.item():.4f}  {dur_us / 1e3:7.1f} ms",
                      flush=True)
            step += 1
            done = args.steps is not None and step >= args.steps
        if done:
            break

    if step_log is not None:
        step_log.close()
    if rank == 0:
        median = statistics.median(durations[1:] or durations or [0.0]) / 1e3
        print(f"done: {step} steps, final loss {last_loss.item():.4f}, median step {median:.1f} ms",
              flush=True)
    return 0


def shutdown() -> None:
    """End the process group once the training function returned and nothing holds the
    model any more. With torch 2.13 on gloo, a group left to the interpreter's exit can
    abort the process ("terminate called without an active exception") when a gloo
    thread releases its last work after Python began shutting down."""
    import gc

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    shutdown()
    sys.exit(code)
