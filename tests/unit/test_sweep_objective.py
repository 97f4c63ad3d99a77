"""What the pipelines return to Hydra: the objective an optimising sweeper ranks trials by."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import run as run_pipeline
from pipelines import train as train_pipeline
from recsys.tasks import main, train


def test_the_main_job_returns_the_validation_score_never_a_test_metric(monkeypatch, make_config):
    """pipelines.run returned test NDCG@10 as "the value a Hydra sweeper optimises": an
    Optuna, Nevergrad or Ax sweep over it chose its settings by the test set. It returns the
    validation score that selected the model; the printout still shows the test figures."""
    metrics = {
        "best/val_ndcg_at_10": 0.31,
        "test/ndcg_at_10": 0.52,
        "test/hr_at_10": 0.61,
        "test/popularity_ndcg_at_10": 0.12,
    }
    result = main.MainResult(Path("best.ckpt"), Path("recommendations"), metrics, "tracking off")
    monkeypatch.setattr(main, "run", lambda cfg: result)
    assert run_pipeline.entry(make_config("config", ["logger=none"])) == pytest.approx(0.31)


def test_a_training_job_returns_its_validation_score(monkeypatch, make_config):
    """pipelines.train returned its TrainResult, which no optimising sweeper can rank: it
    returns the score that selected its checkpoint, whatever metric callbacks monitor."""
    result = train.TrainResult(
        checkpoint=Path("best.ckpt"),
        prepared_dir=Path("prepared"),
        best_val={"best/val_mrr": 0.27},
        scoring_checkpoint=Path("model.ckpt"),
        run="tracking off",
    )
    monkeypatch.setattr(train, "run", lambda cfg: result)
    assert train_pipeline.entry(make_config("config", ["logger=none"])) == pytest.approx(0.27)
    assert train.sweep_objective({}) is None  # (no score: nothing to rank by)
