"""A training shows none of Lightning's warnings that do not apply to recsys (the logging
interval, its own LeafSpec deprecation, the workers advice with num_workers=0) nor its "Tip:"
advertisements, and shows any other warning as before."""

from __future__ import annotations

import logging
import warnings

import pytest
from pytorch_lightning.utilities.warnings import PossibleUserWarning

from recsys.tasks import train
from recsys.tasks.train import lightning_notices_filtered


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lightning_lines():
    """What Lightning logs (its logger does not propagate to caplog's root handler)."""
    handler = _Lines()
    logger = logging.getLogger("pytorch_lightning")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_only_the_named_warnings_are_dropped():
    interval = "The number of training batches (3) is smaller than the logging interval x"
    workers = "The 'train_dataloader' does not have many workers which may be a bottleneck."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with lightning_notices_filtered(num_workers=0):
            warnings.warn(interval, PossibleUserWarning, stacklevel=1)
            warnings.warn(workers, PossibleUserWarning, stacklevel=1)
            warnings.warn("something else", PossibleUserWarning, stacklevel=1)
        with lightning_notices_filtered(num_workers=2):  # workers set: the advice applies
            warnings.warn(workers, PossibleUserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else", workers]


def test_a_resumed_trainings_own_checkpoints_are_not_warned_of():
    """``resume=last`` showed Lightning's "Checkpoint directory ... exists and is not empty"
    on every resume: the folder holds the run's own checkpoints, which it continues."""
    folder = "Checkpoint directory /runs/a/checkpoints exists and is not empty."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with lightning_notices_filtered(num_workers=0, resuming=True):
            warnings.warn(folder, UserWarning, stacklevel=1)
        with lightning_notices_filtered(num_workers=0):  # not resuming: someone else's files
            warnings.warn(folder, UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [folder]


def test_a_tracked_training_on_many_cores_shows_no_inapplicable_notice(
    make_config, monkeypatch, lightning_lines
):
    # many cores (Lightning would advise workers), an MLflow logger (it would warn about the
    # logging interval: the tiny data has fewer batches per epoch than log_every_n_steps)
    monkeypatch.setattr(
        "pytorch_lightning.trainer.connectors.data_connector.suggested_max_num_workers",
        lambda devices: 15,
    )
    cfg = make_config("config", ["experiment=tiny", "trainer.max_epochs=1"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.run(cfg)
    shown = [str(w.message) for w in caught]
    for words in ("logging interval", "LeafSpec", "does not have many workers"):
        assert not [m for m in shown if words in m], shown
    assert not [line for line in lightning_lines if "Tip:" in line], lightning_lines
    assert any(line.startswith("GPU available") for line in lightning_lines)  # the rest stays
