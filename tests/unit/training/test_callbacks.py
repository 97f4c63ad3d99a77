"""CheckMonitors and RandomStreams on their own (the tasks' tests run them inside real
trainings)."""

from __future__ import annotations

import io
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from recsys.training.callbacks import CheckMonitors, RandomStreams

LOGGED = SimpleNamespace(callback_metrics={"val/ndcg_at_10": 0.1, "val/mrr": 0.2})


def test_logged_and_training_time_monitors_pass():
    monitors = {
        "callbacks.model_checkpoint.monitor": "val/ndcg_at_10",
        "callbacks.early_stopping.monitor": "train/loss",  # logged once training runs
        "callbacks.clock.monitor": "time/train_seconds",
    }
    CheckMonitors(monitors).on_sanity_check_end(LOGGED, None)


def test_an_unlogged_monitor_is_refused_with_the_names_to_choose_from():
    check = CheckMonitors({"callbacks.model_checkpoint.monitor": "val/hr_at_50"})
    message = r"'val/hr_at_50' is not a metric .*; set it to one of: val/mrr, val/ndcg_at_10$"
    with pytest.raises(ValueError, match=message):
        check.on_sanity_check_end(LOGGED, None)
    with pytest.raises(ValueError, match=r"write 'val/ndcg_at_10'"):
        CheckMonitors({"k": "val/ndcg@10"}).on_sanity_check_end(LOGGED, None)


def test_random_streams_survive_a_weights_only_checkpoint():
    """The saved state, through torch.save and a weights_only load, puts every global stream
    back where it was: the next draws repeat."""

    def draws() -> tuple:
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    draws()  # streams somewhere in the middle
    np.random.standard_normal()  # numpy caches half of a Gaussian pair: its state too
    buffer = io.BytesIO()
    torch.save({"callbacks": {"RandomStreams": RandomStreams().state_dict()}}, buffer)
    expected = draws(), np.random.standard_normal()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    buffer.seek(0)
    RandomStreams().load_state_dict(
        torch.load(buffer, weights_only=True)["callbacks"]["RandomStreams"]
    )
    assert (draws(), np.random.standard_normal()) == expected


def test_stop_on_divergence_reads_the_epochs_losses_once_and_names_the_settings():
    from recsys.training.callbacks import StopOnDivergence

    guard = StopOnDivergence("training.optimizer.lr=1000000.0")
    trainer = SimpleNamespace(current_epoch=3)
    guard.on_train_epoch_start(trainer, None)
    guard._check(trainer, None)  # no step yet: nothing to refuse
    for loss in (1.0, 0.5):
        guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, 0)
    guard.on_validation_start(trainer, None)  # all finite
    guard.on_train_batch_end(trainer, None, torch.tensor(float("inf")), None, 0)
    guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(0.1)}, None, 0)
    # current_epoch counts from 0, the epoch log ("epoch 4/40, train/loss ...") and the SIGTERM
    # message from 1: the fourth epoch is named epoch 4 in all of them
    with pytest.raises(FloatingPointError, match=r"in epoch 4, .* \(training.optimizer.lr=1000000"):
        guard.on_validation_start(trainer, None)
    guard.on_train_epoch_start(trainer, None)  # a new epoch starts clean
    guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(float("nan"))}, None, 0)
    with pytest.raises(FloatingPointError, match="training diverged"):
        guard.on_train_epoch_end(trainer, None)


def test_stop_on_divergence_reads_the_weights_the_last_step_left():
    """The last step of an epoch can break the weights after its loss was finite (an update
    that overflows: training.optimizer.weight_decay=1e300 with one batch per epoch); such
    weights were validated (NDCG 0), saved as the best checkpoint and the training ended
    with status 0. The weights are now read too, and named."""
    from recsys.training.callbacks import StopOnDivergence

    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    guard = StopOnDivergence("training.optimizer.weight_decay=1e300")
    trainer = SimpleNamespace(current_epoch=0)
    guard.on_train_epoch_start(trainer, module)
    guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(4.3)}, None, 0)
    guard.on_validation_start(trainer, module)  # finite weights: nothing to refuse
    with torch.no_grad():
        module[1].weight[0, 1] = float("inf")
    message = r"the weights were not finite \(NaN or inf\) after its last step \(1.weight\) in"
    with pytest.raises(FloatingPointError, match=message + r" epoch 1, .*weight_decay=1e300"):
        guard.on_validation_start(trainer, module)
    with pytest.raises(FloatingPointError, match=message):
        guard.on_train_epoch_end(trainer, module)


def test_epoch_log_gives_each_epoch_once_and_why_training_ended_early(caplog):
    """run.log has no progress bar: one line per finished epoch (its final training loss, the
    selecting metric and the best so far), written once, and the reason of an early end."""
    import logging

    from pytorch_lightning.callbacks import EarlyStopping

    from recsys.training.callbacks import EpochLog

    checkpoint = SimpleNamespace(monitor="val/ndcg_at_10", best_model_score=torch.tensor(0.25))
    stopping = EarlyStopping(monitor="val/ndcg_at_10", mode="max", patience=2)
    trainer = SimpleNamespace(
        current_epoch=0, max_epochs=10, callback_metrics={}, callbacks=[stopping]
    )
    callback = EpochLog(checkpoint)
    with caplog.at_level(logging.INFO, logger="recsys.training.callbacks"):
        callback.on_train_epoch_start(trainer, None)  # nothing finished yet: no line
        trainer.current_epoch = 1
        trainer.callback_metrics = {
            "train/loss": torch.tensor(4.5),
            "val/ndcg_at_10": torch.tensor(0.2),
        }
        callback.on_train_epoch_start(trainer, None)
        callback.on_train_epoch_start(trainer, None)  # (the same epoch again: no second line)
        trainer.current_epoch, stopping.stopped_epoch = 4, 3
        callback.on_train_end(trainer, None)
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 1/10, train/loss 4.5000, val/ndcg_at_10 0.2000 (best 0.2500)",
        "epoch 4/10, train/loss 4.5000, val/ndcg_at_10 0.2000 (best 0.2500)",
        "early stopping after epoch 4: val/ndcg_at_10 did not improve for 2 epoch(s) "
        "(callbacks.early_stopping.patience)",
    ]
    caplog.clear()
    stopping.stopped_epoch = 0  # ended by trainer.max_time: said so
    trainer.current_epoch = 6
    with caplog.at_level(logging.INFO, logger="recsys.training.callbacks"):
        EpochLog(checkpoint).on_train_end(trainer, None)
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith("training stopped after 6 of trainer.max_epochs=10 epochs")
    )


def test_a_checkpoint_cut_by_a_full_disk_leaves_the_one_before(make_config, monkeypatch):
    """Lightning wrote each checkpoint into the system's temporary folder and moved it into
    the run folder: where they lie on two devices (/tmp a tmpfs), the move copies into
    last.ckpt in place, so a disk that filled up during the copy left last.ckpt cut short,
    epoch 1's gone, and an error naming the temporary file. Either way the bytes reach the
    checkpoints folder (a move across devices, or a file written there), epoch 2's write of
    last.ckpt fails halfway here: the error names last.ckpt and the full disk, and epoch 1's
    last.ckpt is left whole, with no file of the failed write beside it."""
    import errno
    import shutil
    from pathlib import Path

    from recsys.tasks import train

    cfg = make_config("config", ["experiment=tiny", "logger=none", "trainer.max_epochs=2"])
    folder = Path(cfg.paths.run_dir) / "checkpoints"
    writes = {"last": 0}

    def disk_full(target: Path, data: bytes) -> bool:
        """Whether this write into the checkpoints folder is the one that fills the disk
        (epoch 2's of last.ckpt), after writing half of it."""
        if target.parent != folder or "last.ckpt" not in target.name:
            return False
        writes["last"] += 1
        if writes["last"] < 2:
            return False
        with open(target, "wb") as f:
            f.write(data[: len(data) // 2])
        return True

    move = shutil.move

    def move_across_devices(src, dst):  # what shutil.move does from another device
        if disk_full(Path(dst), Path(src).read_bytes()):
            raise OSError(errno.ENOSPC, "No space left on device")
        return move(src, dst)

    write_bytes = Path.write_bytes

    def write_onto_the_disk(self, data):
        if disk_full(self, bytes(data)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(self, data)

    monkeypatch.setattr(shutil, "move", move_across_devices)
    monkeypatch.setattr(Path, "write_bytes", write_onto_the_disk)
    with pytest.raises(OSError, match=r"no space left on the device of .*last\.ckpt") as info:
        train.run(cfg)
    assert info.value.errno == errno.ENOSPC
    assert str(folder) in str(info.value)
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == ["best.ckpt", "last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 0  # epoch 1's, whole
