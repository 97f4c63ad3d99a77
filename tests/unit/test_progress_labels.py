"""Evaluation progress bars name what they evaluate in words, not by metric-name prefixes
(they read "test :", "test popularity_:")."""

from recsys.tasks.evaluate import progress_label


def test_progress_labels_name_the_model_and_the_baselines():
    assert progress_label("test", "", "") == "test model"
    assert progress_label("test", "", "popularity_") == "test popularity baseline"
    assert progress_label("val", "segment_", "transition_") == "val segment transition baseline"
