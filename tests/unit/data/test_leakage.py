"""Leakage-freedom of every split, proven on the tensors the model actually receives.

For each split method the prepared data is read back through the same datasets training and
evaluation use (:class:`TrainWindows`, :class:`TargetRows`) and checked against the prepared
events: no training window reaches the validation or test window, no evaluation input holds
its target or any later event, and the vocabulary (and so popularity) counts only training
events.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import recsys.data as rd
from recsys.data.dataset import SequenceStore, TargetRows, TrainWindows
from recsys.data.sequences import TimeBuckets
from recsys.data.synthetic import generate_events
from recsys.schema import UNK_IDX

MAX_SEQ_LEN = 8
SPLITS = {
    "temporal": {"method": "temporal", "val_fraction": 0.15, "test_fraction": 0.15},
    "temporal_purchase": {"method": "temporal", "target_behaviors": ["purchase"]},
    "leave_one_out": {"method": "leave_one_out"},
    "leave_last_3": {"method": "leave_last_n", "holdout_events": 3},
}


@pytest.fixture(scope="module")
def log() -> pl.DataFrame:
    return generate_events(num_users=120, num_items=90, num_categories=6, seed=5)


@pytest.fixture(scope="module", params=list(SPLITS))
def prepared(request, log, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    ds = rd.prepare(
        log, out, columns={"category": "category"}, split=SPLITS[request.param], min_user_events=3
    )
    return request.param, ds, SequenceStore.from_parquet(out / "sequences.parquet")


def _rows_of(dataset) -> list:
    return [dataset[list(range(i, min(i + 64, len(dataset))))] for i in range(0, len(dataset), 64)]


def test_training_windows_stay_before_train_end(prepared):
    _, _, store = prepared
    windows = TrainWindows(store, max_seq_len=MAX_SEQ_LEN, time_buckets=TimeBuckets())
    assert len(windows) > 0
    local_end = windows.end - store.offsets[windows.rows]  # one past the last target
    assert (local_end <= store.train_end[windows.rows]).all()
    # and the gathered targets really are those events: the last target of every window is
    # the event just before `end`, which lies in the training window
    for batch, start in zip(_rows_of(windows), range(0, len(windows), 64)):
        rows = slice(start, start + len(batch))
        last_target = store.item[windows.end[rows] - 1]
        assert (batch.target_item[:, -1].numpy() == last_target).all()


@pytest.mark.parametrize("window", ["val", "test"])
def test_evaluation_inputs_hold_only_earlier_events(prepared, window):
    _, _, store = prepared
    target = store.val_target if window == "val" else store.test_target
    rows = TargetRows(store, target, max_seq_len=MAX_SEQ_LEN, time_buckets=TimeBuckets())
    assert len(rows) > 0
    for batch, start in zip(_rows_of(rows), range(0, len(rows), 64)):
        users = rows.rows[start : start + len(batch)]
        for b, user in enumerate(users):
            p = int(target[user])
            first = int(store.offsets[user])
            expected = store.item[first + max(0, p - MAX_SEQ_LEN) : first + p]
            got = batch.item[b][batch.padding_mask[b]].numpy()
            assert (got == expected).all(), f"user row {user}: input differs from events < {p}"
            assert int(batch.target_item[b]) == store.item[first + p]
            times = store.timestamp[first + max(0, p - MAX_SEQ_LEN) : first + p]
            assert (times <= store.timestamp[first + p]).all()


def test_windows_follow_the_split_definition(prepared):
    name, ds, store = prepared
    lengths = store.lengths
    sequences = ds.sequences()
    train_end = sequences["train_end"].to_numpy()
    test_start = sequences["test_start"].to_numpy()
    assert (train_end <= test_start).all() and (test_start <= lengths).all()
    for column, low, high in (
        ("val_target", train_end, test_start),
        ("test_target", test_start, lengths),
    ):
        target = sequences[column].to_numpy()
        has = target >= 0
        assert has.any()
        assert ((target[has] >= low[has]) & (target[has] < high[has])).all()
        assert (target[has] >= 1).all()  # every target has an input
    if name.startswith("temporal"):
        split = ds.stats["split"]
        events = ds.events()
        cut_val = pl.lit(split["val_start"]).str.to_datetime(time_zone="UTC")
        cut_test = pl.lit(split["test_start"]).str.to_datetime(time_zone="UTC")
        by_window = events.group_by("window").agg(
            pl.col("timestamp").min().alias("first"), pl.col("timestamp").max().alias("last")
        )
        check = by_window.with_columns(cut_val.alias("val"), cut_test.alias("test"))
        rows = {r["window"]: r for r in check.iter_rows(named=True)}
        assert rows["train"]["last"] < rows["val"]["val"]
        assert (
            rows["val"]["first"] >= rows["val"]["val"] and rows["val"]["last"] < rows["val"]["test"]
        )
        assert rows["test"]["first"] >= rows["test"]["test"]
    else:
        n = 1 if name == "leave_one_out" else 3
        assert (test_start == np.maximum(lengths - n, 0)).all()
        assert (train_end == np.maximum(lengths - 2 * n, 0)).all()
    if name == "temporal_purchase":
        events = ds.events()
        targets = events.filter(pl.col("is_target"))
        assert targets["event_type"].unique().to_list() == ["purchase"]


def test_vocabulary_counts_training_events_only(prepared):
    _, ds, _ = prepared
    events = ds.events()
    train_counts = (
        events.filter(pl.col("window") == "train")
        .group_by("item_index")
        .agg(pl.len().alias("expected"))
    )
    joined = ds.vocab.items.join(train_counts, left_on="index", right_on="item_index", how="left")
    assert (joined["train_count"] == joined["expected"]).all()
    # items that occur only after the training window are unknown to the model
    later_only = events.filter(pl.col("window") != "train").join(
        events.filter(pl.col("window") == "train").select("item_index").unique(),
        on="item_index",
        how="anti",
    )
    assert (later_only["item_index"] == UNK_IDX).all()
    assert later_only["item_id"].null_count() == later_only.height
