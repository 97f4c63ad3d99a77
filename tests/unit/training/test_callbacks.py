"""CheckMonitors on its own (the tasks' tests run it inside real trainings)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recsys.training.callbacks import CheckMonitors

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
