"""The evaluation's progress bar clears itself (``leave=False``) without ending its line: into
a file or a pipe (``> job.log 2>&1``) the next log line, the evaluation's result ("test
NDCG@10 ..."), was written behind the bar's updates on the same line, where a reader or a log
system looking for lines that start with a timestamp missed it. It is drawn on a terminal
only now, as Lightning's bar is (:func:`recsys.shown_live`)."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest
import torch

from recsys.training.evaluation import evaluate


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Batch:
    def to(self, device):
        return self


class _Module:
    encoder = SimpleNamespace(num_items=10)
    metric_ks = (10,)

    def to(self, device):
        return self

    def eval(self):
        return self

    def evaluation_metrics(self, batch, coverage):
        return {"hr_at_10": torch.tensor([1.0, 0.0])}


@pytest.mark.parametrize(("stderr", "drawn"), [(io.StringIO, False), (_Terminal, True)])
def test_the_evaluation_bar_is_drawn_on_a_terminal_only(monkeypatch, stderr, drawn):
    shown = stderr()
    monkeypatch.setattr(sys, "stderr", shown)
    metrics = evaluate(
        _Module(),
        [_Batch(), _Batch()],
        device=torch.device("cpu"),
        split="test",
        description="test model",
        segment=True,
    )
    assert metrics["hr_at_10"] == 0.5
    assert ("test model" in shown.getvalue()) is drawn
