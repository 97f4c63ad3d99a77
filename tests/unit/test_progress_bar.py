"""Lightning's progress bar in a job whose output is not a terminal (cron, a scheduler,
``> job.log 2>&1``, ``| tee``): with refresh every batch it wrote each batch's update,
carriage-returned, into the log, one giant line per epoch (megabytes over a nightly training).
``trainer.enable_progress_bar=auto`` (the default) shows it on a terminal only; the job log
keeps its one line per epoch."""

from __future__ import annotations

import io
import sys

import pytest
from omegaconf import OmegaConf

from recsys.config import compose
from recsys.tasks import train


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bar_shown(value, stdout, monkeypatch) -> bool | None:
    monkeypatch.setattr(sys, "stdout", stdout)
    return train.progress_bar(OmegaConf.create({"enable_progress_bar": value}))


def test_auto_is_the_default_and_shows_the_bar_on_a_terminal_only(monkeypatch):
    assert compose("config", []).trainer.enable_progress_bar == "auto"
    assert _bar_shown("auto", _Terminal(), monkeypatch) is True
    assert _bar_shown("auto", io.StringIO(), monkeypatch) is False  # a file or a pipe
    assert _bar_shown("auto", None, monkeypatch) is False  # no stdout at all (pythonw)
    closed = io.StringIO()
    closed.close()  # isatty raises ValueError
    assert _bar_shown("auto", closed, monkeypatch) is False


def test_true_and_false_are_applied_as_given(monkeypatch):
    assert _bar_shown(True, io.StringIO(), monkeypatch) is True  # a bar into the file, as asked
    assert _bar_shown(False, _Terminal(), monkeypatch) is False


def test_a_notebook_keeps_its_bar(monkeypatch):
    """A Jupyter kernel's stdout is no terminal (``isatty()`` is False) but shows the bar live."""
    outstream = type("OutStream", (io.StringIO,), {"__module__": "ipykernel.iostream"})
    assert _bar_shown("auto", outstream(), monkeypatch) is True


@pytest.mark.parametrize(
    ("stdout", "expected"), [(io.StringIO(), False), (_Terminal(), True)], ids=["file", "tty"]
)
def test_the_trainer_is_built_with_the_bar_resolved(monkeypatch, tmp_path, stdout, expected):
    """``auto`` reaches Lightning as a decision (any string would be truthy there: a bar)."""
    cfg = compose("config", ["experiment=tiny", "trainer.enable_progress_bar=auto"])
    built = {}

    def instantiate(config, **kwargs):
        built.update(kwargs)

    monkeypatch.setattr(train, "instantiate", instantiate)
    monkeypatch.setattr(sys, "stdout", stdout)
    train.check_trainer_settings(cfg)
    assert built["enable_progress_bar"] is expected


def test_other_values_are_refused_naming_the_choices():
    cfg = compose("config", ["trainer.enable_progress_bar=sometimes"])
    with pytest.raises(
        ValueError, match=r"^trainer.enable_progress_bar='sometimes' must be true, false or auto"
    ):
        train.check_settings(cfg)
