"""Lightning callbacks of recsys."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, EMAWeightAveraging, ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO

from recsys.checkpoint import save_atomically
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
            for name, value in pl_module.per_target_means("test", totals.compute()).items():
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


class EpochLog(pl.Callback):
    """One log line per finished epoch (``run.log`` has no progress bar): its training loss
    and the validation metric that selects the checkpoint, with the best so far (the
    checkpoint callback's, so a resumed training counts its earlier epochs); and, when the
    training ends before ``trainer.max_epochs``, why. Each epoch's line is written when the
    next starts or training ends, as its training loss is final then."""

    def __init__(self, checkpoint: ModelCheckpoint | None = None) -> None:
        self.checkpoint = checkpoint
        self._reported = 0  # epochs finished and logged

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer)
        stopping = [
            c for c in trainer.callbacks if isinstance(c, EarlyStopping) and c.stopped_epoch > 0
        ]
        for callback in stopping:
            log.info(
                "early stopping after epoch %d: %s did not improve for %d epoch(s) "
                "(callbacks.early_stopping.patience)",
                callback.stopped_epoch + 1,
                callback.monitor,
                callback.patience,
            )
        if not stopping and 0 < trainer.current_epoch < (trainer.max_epochs or 0):
            log.info(
                "training stopped after %d of trainer.max_epochs=%d epochs (trainer.max_time "
                "or trainer.max_steps)",
                trainer.current_epoch,
                trainer.max_epochs,
            )

    def _report(self, trainer: pl.Trainer) -> None:
        finished = trainer.current_epoch  # (epochs completed so far)
        metrics = trainer.callback_metrics
        if finished <= self._reported or not metrics:
            return
        self._reported = finished
        parts = [f"epoch {finished}/{trainer.max_epochs}"]
        if "train/loss" in metrics:
            parts.append(f"train/loss {float(metrics['train/loss']):.4f}")
        monitor = self.checkpoint.monitor if self.checkpoint is not None else None
        if monitor in metrics:
            best = self.checkpoint.best_model_score
            shown = "" if best is None else f" (best {float(best):.4f})"
            parts.append(f"{monitor} {float(metrics[monitor]):.4f}{shown}")
        log.info(", ".join(parts))


class MovedRunFolder(pl.Callback):
    """Resuming in a run folder that was moved or copied (restored from a backup onto another
    disk): the checkpoint's ModelCheckpoint states name the folder it was written in, and
    Lightning, finding another ``dirpath``, keeps only ``best_model_path`` of them. The
    continued training then took its first epoch for the best whatever its score, and wrote
    ``best-v1.ckpt`` and ``last-v1.ckpt`` beside the run's ``best.ckpt`` and ``last.ckpt`` (a
    later ``resume=last`` read the stale ``last.ckpt``). Before Lightning reads them, the
    states' paths in the old folder are named in this one, so the run continues as it would
    have where it was written."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        states = checkpoint.get("callbacks") or {}
        moves = set()
        for callback in trainer.checkpoint_callbacks:
            state = states.get(callback.state_key)
            old = state.get("dirpath") if isinstance(state, dict) else None
            if old is None or callback.dirpath is None or old == callback.dirpath:
                continue
            new = callback.dirpath

            def moved(path, old=old, new=new):
                inside = path and Path(path).is_relative_to(old)
                return str(Path(new) / Path(path).relative_to(old)) if inside else path

            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                if key in state:
                    state[key] = moved(state[key])
            if isinstance(state.get("best_k_models"), dict):
                state["best_k_models"] = {moved(k): v for k, v in state["best_k_models"].items()}
            state["dirpath"] = new
            moves.add((old, new))
        for old, new in sorted(moves):
            log.info("resuming in %s what was written in %s (a moved or copied run)", new, old)


class RandomStreams(pl.Callback):
    """Keeps the global random streams (torch's, CUDA's, numpy's and Python's) in every
    checkpoint and puts them back when a training resumes from one, so that the continued
    epochs draw the dropout masks, sampled negatives and contrastive partners an uninterrupted
    training would have drawn. With the data module's state (the batch order:
    :meth:`recsys.data.datamodule.SeqRecDataModule.state_dict`) a training resumed from an
    epoch's end repeats an uninterrupted one's epochs exactly, on the same machine and
    settings.

    Every value is a tensor or a plain number, so a checkpoint still loads with
    ``weights_only=True``. Lightning restores callback states before the sanity check (which
    runs with the streams isolated) and before the first training batch is drawn, and the
    checkpoint callbacks save after each epoch's validation, whose draws come from generators
    of its own: nothing draws between a save and the next epoch's first batch."""

    def state_dict(self) -> dict:
        numpy_state = np.random.get_state(legacy=False)
        state = {
            "torch": torch.get_rng_state(),
            "numpy": {
                "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                "pos": int(numpy_state["state"]["pos"]),
                "has_gauss": int(numpy_state["has_gauss"]),
                "gauss": float(numpy_state["gauss"]),
            },
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        torch.set_rng_state(state_dict["torch"])
        saved = state_dict["numpy"]
        np.random.set_state(
            {
                "bit_generator": "MT19937",
                "state": {"key": saved["key"].numpy().astype(np.uint32), "pos": saved["pos"]},
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
            }
        )
        version, internal, gauss = state_dict["python"]
        random.setstate((version, tuple(internal), gauss))
        cuda = state_dict.get("cuda")
        if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        elif cuda:
            log.warning(
                "the checkpoint's CUDA random streams (%d devices) do not fit this machine: "
                "the continued epochs' GPU draws start again",
                len(cuda),
            )


class CheckMonitors(pl.Callback):
    """Refuses a ``monitor`` that validation does not log before the first training step,
    where Lightning would only notice after the first epoch (and after writing its outputs).

    ``monitors`` maps each config key to its metric, e.g. ``{"callbacks.model_checkpoint.monitor":
    "val/ndcg_at_10"}``. The names checked against are those the sanity check's validation
    batches logged (Lightning's ``trainer.num_sanity_val_steps``, 2 by default; with 0 nothing is
    checked here), so they are what the module really logs. ``train/`` and ``time/`` metrics
    are logged during training only and are left to Lightning.
    """

    TRAINING_PREFIXES = ("train/", "time/")

    def __init__(self, monitors: Mapping[str, str]) -> None:
        self.monitors = dict(monitors)

    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logged = set(trainer.callback_metrics)
        for key, name in self.monitors.items():
            if name in logged or name.startswith(self.TRAINING_PREFIXES):
                continue
            hint = ""
            if "@" in name:
                hint = f" (MLflow forbids '@' in metric names: write {name.replace('@', '_at_')!r})"
            raise ValueError(
                f"{key}={name!r} is not a metric this run logs at validation{hint}; set it to "
                f"one of: {', '.join(sorted(logged))}"
            )


class StopOnDivergence(pl.Callback):
    """Stops a training whose loss or weights are no longer finite (NaN or inf: the weights
    have diverged, e.g. at too high a learning rate or weight decay) before that epoch is
    validated, so that no checkpoint is written from the diverged weights and no metrics are
    logged for them (a NaN score counts as a miss, so validation would only show a low
    figure). Each step's loss check stays on the device; it is read once per epoch, with the
    weights (the last step's update can break them after its loss was finite).
    ``settings`` names what to change, e.g. ``"training.optimizer.lr=0.1"``."""

    def __init__(self, settings: str = "") -> None:
        self.settings = settings
        self._finite: torch.Tensor | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finite = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is None:
            return
        finite = torch.isfinite(loss.detach()).all()
        self._finite = finite if self._finite is None else self._finite & finite

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None) -> None:
        if self._finite is not None and not bool(self._finite):
            what = "the loss was not finite (NaN or inf)"
        else:
            weights = [] if pl_module is None else list(pl_module.named_parameters())
            bad = [name for name, weight in weights if not torch.isfinite(weight).all()]
            if not bad:
                return
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            what = f"the weights were not finite (NaN or inf) after its last step ({shown})"
        self._finite = None
        raise FloatingPointError(  # (epochs counted from 1, as the epoch log lines count them)
            f"training diverged: {what} in epoch {trainer.current_epoch + 1}, so the weights are "
            "no longer numbers; stopped before validating or saving them. Lower the learning "
            "rate or the weight decay, or clip the gradients harder"
            + (f" ({self.settings})" if self.settings else "")
        )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module)


def bias_corrected_ema(decay: float):
    """The ``avg_fn`` of :class:`BiasCorrectedEMA`: ``(average, current, n) -> new average``,
    where ``average`` holds the first ``n`` points (``n >= 1``; torch's ``AveragedModel`` copies
    the first one).

    After points ``θ_1 .. θ_m`` the average is ``Σ decay^(m-i) θ_i / Σ decay^(m-i)``: an
    exponential moving average normalised like Adam's moments, so the first steps' weights
    count no more than any other point and the average never trails behind them.
    """

    log_decay = math.log(decay)

    def avg_fn(
        average: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor
    ) -> torch.Tensor:
        # the new point's share: (1 - d) / (1 - d^(n+1)), ~1/2 for the second, -> 1 - d later;
        # 1 - d^(n+1) as -expm1((n+1) log d), exact in float32 even for d close to 1
        points = (num_averaged + 1).to(average.dtype)
        share = (1.0 - decay) / -torch.expm1(points * log_decay)
        return torch.lerp(average, current, share)

    return avg_fn


class BiasCorrectedEMA(EMAWeightAveraging):
    """Lightning's EMA weight averaging with the average normalised over the points it holds.

    A plain EMA of decay ``d`` still gives the weights of the first optimizer step a share
    ``d^t`` after ``t`` steps (0.6 after 500 steps at 0.999), so a slow average trails far
    behind training for its first epochs; this one weighs every point by ``d^(age)`` and
    divides by their sum (:func:`bias_corrected_ema`). Every argument is
    ``EMAWeightAveraging``'s (``decay``, ``update_every_n_steps``, ...).
    """

    def __init__(self, decay: float = 0.999, **kwargs) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
            raise ValueError(
                f"callbacks.weight_averaging.decay={decay!r} must be a number in (0, 1), "
                "e.g. 0.999 (about 1000 optimizer steps)"
            )
        super().__init__(decay=decay, **kwargs)
        self._kwargs["avg_fn"] = bias_corrected_ema(float(decay))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, writing each checkpoint beside its path and renaming it
    (:func:`recsys.checkpoint.save_atomically`). Lightning's own writes it into the system's
    temporary folder and moves it into place: where the two lie on different devices (``/tmp``
    a tmpfs, the run folder on a disk), the move copies into ``best.ckpt`` or ``last.ckpt`` in
    place, so a disk filling up (or a kill) during the copy left that checkpoint cut short and
    the previous one gone, with an error naming only the temporary file. A full disk is now an
    ``OSError`` (ENOSPC) naming the checkpoint, and the checkpoint there before stays whole."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("recsys' checkpoint writer takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(checkpoint, path)
