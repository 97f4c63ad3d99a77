"""Lightning callbacks of recsys."""

from __future__ import annotations

import logging
import time

import pytorch_lightning as pl
import torch

from recsys.training.metrics import MeanAccumulator

log = logging.getLogger(__name__)


class TrainingClock(pl.Callback):
    """Measures training time without validation, and records a curve of quality over it.

    After every validation it appends ``{"epoch", "train_seconds", "val/<metric>", ...}`` to
    :attr:`history` and logs ``time/train_seconds`` (cumulative seconds spent in training
    epochs: batches and their loading, not validation). With ``test_curve=True`` it also
    evaluates the test split at that point and records ``curve/test_<metric>``: a
    speed-to-quality curve ("minutes until test NDCG@10 reached x") for benchmarks. Those
    numbers never select a model (checkpointing and early stopping watch ``val/``).
    """

    def __init__(self, test_curve: bool = False) -> None:
        self.test_curve = test_curve
        self.train_seconds = 0.0
        self.history: list[dict[str, float]] = []
        self._started: float | None = None
        self._curve: dict[str, float] = {}

    def state_dict(self) -> dict:
        """Kept in checkpoints, so a resumed training (``resume=last``) continues the clock."""
        return {"train_seconds": self.train_seconds, "history": list(self.history)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_seconds = float(state_dict["train_seconds"])
        self.history = list(state_dict["history"])

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()

    def _stop(self) -> None:
        if self._started is not None:
            self.train_seconds += time.perf_counter() - self._started
            self._started = None

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._stop()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._stop()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        pl_module.log("time/train_seconds", self.train_seconds)
        self._curve = {}
        if self.test_curve and trainer.datamodule is not None:
            totals = MeanAccumulator()
            with torch.no_grad():
                for batch in trainer.datamodule.test_dataloader():
                    batch = batch.to(pl_module.device)
                    totals.update(pl_module.evaluation_metrics(batch))
            for name, value in totals.compute().items():
                if name.startswith(("ndcg_at", "hr_at")):
                    self._curve[f"curve/test_{name}"] = value
                    pl_module.log(f"curve/test_{name}", value)

    def on_validation_end(self, trainer, pl_module) -> None:
        # after every epoch-end hook (the module logs coverage in its own), before the
        # checkpoint callbacks, which Lightning runs last: the saved clock holds this entry
        if trainer.sanity_checking:
            return
        entry = {"epoch": float(trainer.current_epoch), "train_seconds": self.train_seconds}
        entry.update(
            {
                name: float(value)
                for name, value in trainer.callback_metrics.items()
                if name.startswith("val/")
            }
        )
        self.history.append({**entry, **self._curve})
