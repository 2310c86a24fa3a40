"""PyTorch Lightning: Trainer(accelerator="cpu", devices=2, strategy="ddp") on Lightning's
own BoringModel. Started as `python lightning_trainer.py`: Lightning starts the second
rank itself. The job counts optimizer steps with Lightning's trainer.global_step."""

from __future__ import annotations

import argparse

import lightning
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

from common import Record, shutdown


class RecordLosses(Callback):
    def __init__(self) -> None:
        self.record: Record | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.record is None:
            self.record = Record(trainer.global_rank)
        self.record.loss(outputs["loss"])

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        assert self.record is not None
        self.record.done(trainer.global_step, micro_batches=self.record.losses,
                         world_size=trainer.world_size, version=lightning.__version__)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=1)
    args = p.parse_args()
    seed_everything(0)
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps,
        accumulate_grad_batches=args.accum, callbacks=[RecordLosses()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(BoringModel())


if __name__ == "__main__":
    main()
    shutdown()
