"""Hugging Face Trainer under torchrun: a tiny GPT-2 built from its config, random tokens.
The job records the loss of every training_step as computed (the Trainer's own logs are
rounded) and counts optimizer steps with a TrainerCallback (on_step_end runs once per
optimizer step, after gradient accumulation)."""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from common import RandomTokens, Record, shutdown


class CountSteps(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.steps += 1


class RecordingTrainer(Trainer):
    record: Record

    def training_step(self, *args, **kwargs):  # noqa: ANN002, ANN003
        loss = super().training_step(*args, **kwargs)
        self.record.loss(loss)
        return loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64))
    batch = 4
    data = RandomTokens(batch * args.accum * args.steps * int(os.environ.get("WORLD_SIZE", "1")))
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=batch,
            gradient_accumulation_steps=args.accum, logging_steps=1, report_to=[], use_cpu=True,
            save_strategy="no", seed=0, learning_rate=1e-3, dataloader_num_workers=0,
            disable_tqdm=True,
        )
        counter = CountSteps()
        trainer = RecordingTrainer(model=model, args=targs, train_dataset=data, callbacks=[counter])
        trainer.record = Record(targs.process_index)
        trainer.train()
        trainer.record.done(counter.steps, global_step=trainer.state.global_step,
                            micro_batches=trainer.record.losses, world_size=targs.world_size,
                            version=transformers.__version__)


if __name__ == "__main__":
    main()
    shutdown()
