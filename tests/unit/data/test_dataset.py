"""Tests for recsys.data.dataset (and the time buckets of recsys.data.sequences): exact batches
on a hand-built sequence table, window coverage, time-gap conventions, and store loading."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from recsys.data.batch import SeqBatch
from recsys.data.dataset import (
    SequenceStore,
    TargetRows,
    TrainPrefixes,
    TrainWindows,
    batch_loader,
)
from recsys.data.sequences import BEHAVIORS, ITEMS, SEQUENCE_COLUMNS, TIMES, TimeBuckets
from recsys.data.split import TEST_START, TEST_TARGET, TRAIN_END, VAL_TARGET
from recsys.schema import USER

BUCKETS = TimeBuckets(unit_seconds=60, num_buckets=8)
T, F = True, False

# Item of every event = 10 + its flat index, so a batch shows exactly which events it holds.
#   u1: 9 events, training = positions 0..6, validation target 7, test target 8
#       gaps to the previous event: 0 0 59 60 180 420 3281 4000 500 (seconds)
#   u2: 3 events, much later in time than u1 (a gap measured across users would be huge)
#   u3: 1 event (nothing to train on);  u4: 4 events, none in training
U1_TIMES = [1000, 1000, 1059, 1119, 1299, 1719, 5000, 9000, 9500]
U2_TIMES = [1_000_000, 1_000_060, 1_000_200]
U3_TIMES = [3000]
U4_TIMES = [2000, 2100, 2200, 2300]
QUERY_TIME = 1_000_500  # 300 s after u2's last event


def sequences_frame() -> pl.DataFrame:
    """The layout of a prepared ``sequences.parquet`` (user, lists, split positions)."""
    users = [("u1", U1_TIMES, 7, 7, 8, 8), ("u2", U2_TIMES, 2, -1, 2, 2)]
    users += [("u3", U3_TIMES, 1, -1, 1, -1), ("u4", U4_TIMES, 0, -1, 2, -1)]
    rows, flat = [], 0
    for user, times, train_end, val, test_start, test in users:
        items = list(range(10 + flat, 10 + flat + len(times)))
        behaviors = [2 + (flat + i) % 4 for i in range(len(times))]
        rows.append((user, items, behaviors, times, train_end, val, test_start, test))
        flat += len(times)
    return pl.DataFrame(
        rows,
        schema={
            USER: pl.String,
            ITEMS: pl.List(pl.Int32),
            BEHAVIORS: pl.List(pl.Int8),
            TIMES: pl.List(pl.Int64),
            TRAIN_END: pl.Int32,
            VAL_TARGET: pl.Int32,
            TEST_START: pl.Int32,
            TEST_TARGET: pl.Int32,
        },
        orient="row",
    )


@pytest.fixture
def store() -> SequenceStore:
    return SequenceStore.from_frame(sequences_frame())


def long(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def behavior_of(item: int) -> int:
    return 0 if item == 0 else 2 + (item - 10) % 4


# -- time buckets ------------------------------------------------------------------------------


def test_time_bucket_edges():
    buckets = TimeBuckets(unit_seconds=60, num_buckets=16)
    gaps = np.array([0, 1, 59, 60, 179, 180, 419, 420, 899, 900])
    np.testing.assert_array_equal(buckets(gaps), [1, 1, 1, 2, 2, 3, 3, 4, 4, 5])


def test_time_bucket_caps_and_clips():
    buckets = TimeBuckets(unit_seconds=60, num_buckets=16)
    np.testing.assert_array_equal(buckets(np.array([10**12, 2**62])), [16, 16])
    np.testing.assert_array_equal(buckets(np.array([-1, -(10**9)])), [1, 1])
    assert buckets.num_embeddings == 17
    np.testing.assert_array_equal(TimeBuckets(60, 1)(np.array([0, 10**6])), [1, 1])
    # a unit so small that a year's gap overflows the division: the last bucket, not a
    # negative one (the overflow's inf was cast to the most negative int64)
    tiny = TimeBuckets(unit_seconds=1e-305, num_buckets=16)
    np.testing.assert_array_equal(tiny(np.array([0, 1, 365 * 86_400])), [1, 16, 16])


def test_time_bucket_unit_is_configurable():
    days = TimeBuckets(unit_seconds=86_400, num_buckets=12)
    np.testing.assert_array_equal(days(np.array([0, 86_399, 86_400, 3 * 86_400])), [1, 1, 2, 3])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unit_seconds": 0}, "unit_seconds=0 must be > 0"),
        ({"unit_seconds": -5.0}, "unit_seconds=-5.0 must be > 0"),
        ({"num_buckets": 0}, "num_buckets=0 must be in [1, 64]"),
        ({"num_buckets": 65}, "num_buckets=65 must be in [1, 64]"),
    ],
)
def test_time_bucket_validation(kwargs, message):
    with pytest.raises(ValueError) as info:
        TimeBuckets(**kwargs)
    assert message in str(info.value)


# -- the store -------------------------------------------------------------------------------


def test_store_from_frame_flattens_lists(store):
    assert tuple(sequences_frame().columns) == SEQUENCE_COLUMNS  # the prepared file's layout
    np.testing.assert_array_equal(store.offsets, [0, 9, 12, 13, 17])
    np.testing.assert_array_equal(store.lengths, [9, 3, 1, 4])
    np.testing.assert_array_equal(store.item, np.arange(10, 27))
    np.testing.assert_array_equal(store.timestamp, U1_TIMES + U2_TIMES + U3_TIMES + U4_TIMES)
    np.testing.assert_array_equal(store.train_end, [7, 2, 1, 0])
    np.testing.assert_array_equal(store.val_target, [7, -1, -1, -1])
    np.testing.assert_array_equal(store.test_target, [8, 2, -1, -1])
    assert store.user_id.to_list() == ["u1", "u2", "u3", "u4"]
    assert store.num_users == 4
    for name in ("item", "behavior", "timestamp", "train_end", "val_target", "test_target"):
        assert getattr(store, name).dtype == np.int64, name


def test_store_from_parquet_equals_from_frame(tmp_path):
    frame = sequences_frame()
    frame.write_parquet(tmp_path / "sequences.parquet")
    # several row groups / chunks must not change anything
    chunked = pl.concat([frame[:2], frame[2:]], rechunk=False)
    stores = [
        SequenceStore.from_frame(frame),
        SequenceStore.from_frame(chunked),
        SequenceStore.from_parquet(tmp_path / "sequences.parquet"),
        SequenceStore.from_parquet(str(tmp_path / "sequences.parquet")),
    ]
    for other in stores[1:]:
        assert other.user_id.equals(stores[0].user_id)
        for name in (
            "offsets",
            "item",
            "behavior",
            "timestamp",
            "train_end",
            "val_target",
            "test_target",
        ):
            np.testing.assert_array_equal(getattr(other, name), getattr(stores[0], name), name)


# -- training windows ------------------------------------------------------------------------


def test_train_windows_exact_batch(store):
    windows = TrainWindows(store, max_seq_len=3, time_buckets=BUCKETS)
    # u1 (7 training events): [e3 e4 e5 e6] then [e0 e1 e2 e3]; u2 (2): [e0 e1]; u3, u4: none
    assert len(windows) == 3
    batch = windows[[0, 1, 2]]
    assert isinstance(batch, SeqBatch)
    assert len(batch) == 3
    expected_item = long([[13, 14, 15], [10, 11, 12], [0, 0, 19]])
    expected_target = long([[14, 15, 16], [11, 12, 13], [0, 0, 20]])
    torch.testing.assert_close(batch.item, expected_item)
    torch.testing.assert_close(batch.target_item, expected_target)
    torch.testing.assert_close(batch.padding_mask, torch.tensor([[T, T, T], [T, T, T], [F, F, T]]))
    behavior = expected_item.apply_(behavior_of)
    torch.testing.assert_close(batch.behavior, behavior)
    torch.testing.assert_close(batch.target_behavior, expected_target.clone().apply_(behavior_of))
    # gap to the previous event of the same user; e3's previous event (e2) is outside the window
    # u2's first event: 0, not the (huge) gap to u1's last event
    torch.testing.assert_close(batch.time_bucket, long([[2, 3, 4], [1, 1, 1], [0, 0, 1]]))
    # training: gap from each event to the next one (its target)
    torch.testing.assert_close(batch.query_time_bucket, long([[3, 4, 6], [1, 1, 2], [0, 0, 2]]))
    torch.testing.assert_close(batch.user_index, long([0, 0, 1]))
    for name in ("item", "behavior", "time_bucket", "query_time_bucket", "target_item"):
        assert getattr(batch, name).dtype == torch.long, name


def test_train_windows_never_reach_the_evaluation_events(store):
    for max_seq_len in (1, 2, 3, 4, 8, 50):
        windows = TrainWindows(store, max_seq_len=max_seq_len, time_buckets=BUCKETS)
        batch = windows[list(range(len(windows)))]
        seen = torch.cat([batch.item[batch.padding_mask], batch.target_item[batch.padding_mask]])
        # u1's validation / test events (items 17, 18) and all of u4 (23..26) stay out
        assert not set(seen.tolist()) & {17, 18, 23, 24, 25, 26}


def test_train_windows_left_padding_is_all_zero(store):
    windows = TrainWindows(store, max_seq_len=6, time_buckets=BUCKETS)
    batch = windows[list(range(len(windows)))]
    pad = ~batch.padding_mask
    assert pad.any()
    for name in ("item", "behavior", "time_bucket", "query_time_bucket", "target_item"):
        assert (getattr(batch, name)[pad] == 0).all(), name
    # left padding: once a row turns real it stays real
    assert (batch.padding_mask.int().diff(dim=1) >= 0).all()
    assert batch.padding_mask[:, -1].all()


def random_store(seed: int, num_users: int = 40, num_items: int | None = None) -> SequenceStore:
    """Random histories; every event its own item (flat index + 10), or with ``num_items``
    items drawn from 2 .. num_items + 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 25, size=num_users)
    train_end = np.array([rng.integers(0, n + 1) for n in lengths])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    times = [np.sort(rng.integers(0, 10**6, size=n)) for n in lengths]
    if num_items is None:
        items = [list(range(offsets[u] + 10, offsets[u + 1] + 10)) for u in range(num_users)]
    else:
        items = [rng.integers(2, num_items + 2, size=n).tolist() for n in lengths]
    frame = pl.DataFrame(
        {
            USER: [f"u{i}" for i in range(num_users)],
            ITEMS: items,
            BEHAVIORS: [[2] * n for n in lengths],
            TIMES: [t.tolist() for t in times],
            TRAIN_END: train_end,
            VAL_TARGET: [-1] * num_users,
            TEST_START: lengths,
            TEST_TARGET: [-1] * num_users,
        },
        schema_overrides={
            ITEMS: pl.List(pl.Int32),
            BEHAVIORS: pl.List(pl.Int8),
            TRAIN_END: pl.Int32,
            VAL_TARGET: pl.Int32,
            TEST_START: pl.Int32,
            TEST_TARGET: pl.Int32,
        },
    )
    return SequenceStore.from_frame(frame)


@pytest.mark.parametrize("max_seq_len", [1, 2, 3, 7, 30])
def test_train_windows_partition_the_targets(max_seq_len):
    store = random_store(seed=max_seq_len)
    windows = TrainWindows(store, max_seq_len=max_seq_len, time_buckets=BUCKETS)
    batch = windows[list(range(len(windows)))]
    mask = batch.padding_mask
    targets = batch.target_item[mask].numpy() - 10  # back to flat indices
    inputs = batch.item[mask].numpy() - 10
    np.testing.assert_array_equal(targets, inputs + 1)
    expected = np.concatenate(
        [
            np.arange(store.offsets[u] + 1, store.offsets[u] + store.train_end[u])
            for u in range(store.num_users)
        ]
    )
    # every training event from a user's second on is a target exactly once
    np.testing.assert_array_equal(np.sort(targets), expected)
    assert len(np.unique(targets)) == len(targets)
    # no window holds more than max_seq_len inputs, and targets stay in their user's history
    assert (mask.sum(dim=1) <= max_seq_len).all()
    user = batch.user_index.numpy()
    assert (targets.reshape(-1) >= 0).all()
    first = np.repeat(store.offsets[user], mask.sum(dim=1).numpy())
    stop = np.repeat(store.offsets[user] + store.train_end[user], mask.sum(dim=1).numpy())
    assert ((inputs >= first) & (targets < stop)).all()


def test_train_windows_time_buckets_never_cross_users():
    store = random_store(seed=3)
    windows = TrainWindows(store, max_seq_len=5, time_buckets=BUCKETS)
    batch = windows[list(range(len(windows)))]
    flat = (batch.item - 10).numpy()
    mask = batch.padding_mask.numpy()
    user = np.repeat(batch.user_index.numpy()[:, None], flat.shape[1], axis=1)
    is_first = flat == store.offsets[user]
    previous = np.where(is_first, flat, flat - 1)
    gaps = store.timestamp[np.where(mask, flat, 0)] - store.timestamp[np.where(mask, previous, 0)]
    expected = np.where(mask, BUCKETS(gaps), 0)
    np.testing.assert_array_equal(batch.time_bucket.numpy(), expected)
    next_gap = (
        store.timestamp[np.where(mask, flat + 1, 0)] - store.timestamp[np.where(mask, flat, 0)]
    )
    np.testing.assert_array_equal(
        batch.query_time_bucket.numpy(), np.where(mask, BUCKETS(next_gap), 0)
    )


def test_max_seq_len_must_be_positive(store):
    with pytest.raises(ValueError, match="max_seq_len=0 must be >= 1"):
        TrainWindows(store, max_seq_len=0, time_buckets=BUCKETS)
    with pytest.raises(ValueError, match="width_multiple=0 must be >= 1"):
        TrainWindows(store, max_seq_len=3, time_buckets=BUCKETS, width_multiple=0)


@pytest.mark.parametrize(
    ("make", "max_seq_len"),
    [
        (lambda store, **kw: TrainWindows(store, **kw), 50),
        (lambda store, **kw: TrainWindows(store, **kw), 4),
        (lambda store, **kw: TrainPrefixes(store, partners=True, **kw), 50),
        (lambda store, **kw: TargetRows(store, store.test_target, seen=True, **kw), 50),
        (lambda store, **kw: TargetRows(store, store.test_target, seen=True, **kw), 7),
    ],
)
@pytest.mark.parametrize("multiple", [1, 4, 8])
def test_width_multiple_only_adds_padding_columns_on_the_left(store, make, max_seq_len, multiple):
    """data.loader.width_multiple rounds a batch's width up (fewer distinct shapes for a GPU),
    never past max_seq_len; the added columns are padding and every real column is as before."""
    torch.manual_seed(0)  # the partners' draw
    plain = make(store, max_seq_len=max_seq_len, time_buckets=BUCKETS)
    torch.manual_seed(0)
    wide = make(store, max_seq_len=max_seq_len, time_buckets=BUCKETS, width_multiple=multiple)
    for indices in ([0], list(range(len(plain)))):
        a, b = plain[indices], wide[indices]
        width, extra = a.item.shape[1], b.item.shape[1] - a.item.shape[1]
        assert b.item.shape[1] == min(max_seq_len, -(-width // multiple) * multiple)
        assert extra >= 0 and (extra == 0 or b.item.shape[1] % multiple == 0)
        for name in ("item", "behavior", "time_bucket", "padding_mask", "query_time_bucket"):
            left, right = getattr(b, name)[:, :extra], getattr(b, name)[:, extra:]
            assert not left.any(), name
            torch.testing.assert_close(right, getattr(a, name), msg=name)
        for name in ("target_item", "target_behavior"):  # (B, T) in training, (B,) otherwise
            target = getattr(b, name)
            target = target[:, extra:] if target.dim() == 2 else target
            torch.testing.assert_close(target, getattr(a, name), msg=name)
        torch.testing.assert_close(b.seen_item, a.seen_item)


# -- evaluation and scoring rows -------------------------------------------------------------


def test_target_rows_exact_batch(store):
    rows = TargetRows(store, store.test_target, max_seq_len=3, time_buckets=BUCKETS)
    assert len(rows) == 2  # u1 and u2
    batch = rows[[0, 1]]
    torch.testing.assert_close(batch.item, long([[15, 16, 17], [0, 19, 20]]))
    torch.testing.assert_close(batch.padding_mask, torch.tensor([[T, T, T], [F, T, T]]))
    torch.testing.assert_close(batch.target_item, long([18, 21]))
    torch.testing.assert_close(batch.target_behavior, long([behavior_of(18), behavior_of(21)]))
    torch.testing.assert_close(batch.user_index, long([0, 1]))
    # gaps to the previous event: e5 420 s, e6 3281 s, e7 4000 s | u2: first 0, then 60 s
    torch.testing.assert_close(batch.time_bucket, long([[4, 6, 7], [0, 1, 2]]))
    # history positions: gap to the next event (3281 s -> 6, 4000 s -> 7 | 60 s -> 2), as in
    # training; the last position: gap to the target (500 s -> 4; 140 s -> 2)
    torch.testing.assert_close(batch.query_time_bucket, long([[6, 7, 4], [0, 2, 2]]))


def test_target_rows_skip_users_without_a_target_or_history(store):
    rows = TargetRows(store, np.array([7, 0, -1, 3]), max_seq_len=2, time_buckets=BUCKETS)
    np.testing.assert_array_equal(rows.rows, [0, 3])
    batch = rows[[0, 1]]
    torch.testing.assert_close(batch.item, long([[15, 16], [24, 25]]))
    torch.testing.assert_close(batch.target_item, long([17, 26]))
    # query time = the target's time even when a query_time is given
    with_query = TargetRows(
        store, np.array([7, 0, -1, 3]), max_seq_len=2, time_buckets=BUCKETS, query_time=QUERY_TIME
    )
    torch.testing.assert_close(with_query[[0, 1]].query_time_bucket, batch.query_time_bucket)
    # u1: 5000 - 1719 = 3281 s -> 6, then 9000 - 5000 = 4000 s -> 7; u4: 100 s -> 2 twice
    torch.testing.assert_close(batch.query_time_bucket, long([[6, 7], [2, 2]]))


def test_target_rows_carry_every_item_before_the_target_for_the_seen_policy(store):
    """seen=True (evaluation): ``seen_item`` is the whole history before the target, the model
    input only its last max_seq_len events; the anchors' evaluation code sets aside the
    whole history (the S3-Rec family's rating matrix, SASRec+'s full_history)."""
    positions = np.array([7, 0, -1, 3])
    rows = TargetRows(store, positions, max_seq_len=2, time_buckets=BUCKETS, seen=True)
    batch = rows[[0, 1]]
    torch.testing.assert_close(batch.item, long([[15, 16], [24, 25]]))
    torch.testing.assert_close(
        batch.seen_item, long([[10, 11, 12, 13, 14, 15, 16], [23, 24, 25, 0, 0, 0, 0]])
    )
    assert batch.seen is batch.seen_item
    plain = TargetRows(store, positions, max_seq_len=2, time_buckets=BUCKETS)[[0, 1]]
    assert plain.seen_item is None and plain.seen is plain.item
    moved = batch.to("cpu")  # the optional field travels with the batch, None stays None
    torch.testing.assert_close(moved.seen_item, batch.seen_item)
    assert plain.to("cpu").seen_item is None


def test_scoring_rows_use_the_whole_history_and_query_time(store):
    rows = TargetRows(
        store,
        store.lengths,
        max_seq_len=3,
        time_buckets=BUCKETS,
        has_target=False,
        query_time=QUERY_TIME,
    )
    assert len(rows) == 4
    batch = rows[[0, 1, 2, 3]]
    torch.testing.assert_close(
        batch.item, long([[16, 17, 18], [19, 20, 21], [0, 0, 22], [24, 25, 26]])
    )
    torch.testing.assert_close(batch.target_item, long([0, 0, 0, 0]))
    torch.testing.assert_close(batch.target_behavior, long([0, 0, 0, 0]))
    # history positions: gap to the next event; last position: gap from each user's last event
    # to QUERY_TIME: u1 991000 s -> capped at 8; u2 300 s -> 3; u3 997500 s -> 8; u4 998200 s -> 8
    torch.testing.assert_close(
        batch.query_time_bucket,
        long([[7, 4, 8], [2, 2, 3], [0, 0, 8], [2, 2, 8]]),
    )
    # without a query time the last position is not conditioned on (0); the history is
    no_time = TargetRows(
        store, store.lengths, max_seq_len=3, time_buckets=BUCKETS, has_target=False
    )[[0, 1, 2, 3]]
    assert (no_time.query_time_bucket[:, -1] == 0).all()
    torch.testing.assert_close(no_time.query_time_bucket[:, :-1], batch.query_time_bucket[:, :-1])


def test_query_time_before_last_event_is_clipped_to_the_first_bucket(store):
    rows = TargetRows(
        store, store.lengths, max_seq_len=2, time_buckets=BUCKETS, has_target=False, query_time=0
    )
    batch = rows[[0, 1, 2, 3]]
    torch.testing.assert_close(batch.query_time_bucket[:, -1], long([1, 1, 1, 1]))


# -- loader ------------------------------------------------------------------------------------


def test_batch_loader_yields_every_window_once_and_is_seeded():
    store = random_store(seed=9)
    windows = TrainWindows(store, max_seq_len=4, time_buckets=BUCKETS)

    def run(seed: int) -> list[torch.Tensor]:
        loader = batch_loader(windows, batch_size=7, shuffle=True, seed=seed)
        return [batch.target_item[:, -1] for batch in loader]

    first, again, other = run(0), run(0), run(1)
    assert all(len(b) <= 7 for b in first)
    seen = torch.cat(first)
    assert len(seen) == len(windows)
    # the last target of a window is its most recent event: unique per window
    assert len(set(seen.tolist())) == len(windows)
    assert torch.equal(seen, torch.cat(again))
    assert not torch.equal(seen, torch.cat(other))
    with pytest.raises(ValueError, match="batch_size=0"):
        batch_loader(windows, batch_size=0, shuffle=False)


def test_time_buckets_relative_to_the_target(store):
    """ATRank's convention: every token's gap is measured to the prediction's moment."""
    buckets = TimeBuckets(unit_seconds=60, num_buckets=8, reference="target")
    rows = TargetRows(store, store.test_target, max_seq_len=3, time_buckets=buckets)
    batch = rows[[0, 1]]
    # u1: target at 9500 s; events at 1719, 5000, 9000 -> 7781 s (8), 4500 s (7), 500 s (4)
    # u2: target at 1_000_200; events at 1_000_000, 1_000_060 -> 200 s (3), 140 s (2)
    torch.testing.assert_close(batch.time_bucket, long([[8, 7, 4], [0, 3, 2]]))
    windows = TrainWindows(store, max_seq_len=3, time_buckets=buckets)
    train = windows[[0]]  # u1's most recent window: inputs e3 e4 e5, last target e6 at 5000 s
    gaps = [5000 - 1119, 5000 - 1299, 5000 - 1719]
    torch.testing.assert_close(train.time_bucket, torch.from_numpy(buckets(np.array([gaps]))))


def test_batches_are_as_wide_as_their_longest_row(store):
    rows = TargetRows(store, store.test_target, max_seq_len=50, time_buckets=BUCKETS)
    assert rows[[1]].item.shape == (1, 2)  # u2's test row holds 2 events
    assert rows[[0, 1]].item.shape == (1 + 1, 8)  # u1's holds 8


def test_length_grouped_batches_cover_every_row_once_and_group_lengths():
    from recsys.data.dataset import LengthGroupedBatches

    lengths = np.random.default_rng(0).integers(1, 50, size=1000)
    sampler = LengthGroupedBatches(lengths, batch_size=10, seed=1, group_batches=100)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 100
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 5  # random batches of 10 would spread over ~40
    assert list(LengthGroupedBatches(lengths, batch_size=10, seed=1)) == list(
        LengthGroupedBatches(lengths, batch_size=10, seed=1)
    )


def test_shuffled_batch_orders_continue_from_a_saved_state():
    """A sampler given an earlier one's state (as a resumed training's data module does) draws
    the epochs that sampler would have drawn next, not its first epoch again; the state
    survives a weights_only checkpoint."""
    import io

    from recsys.data.dataset import LengthGroupedBatches, ShuffledBatches

    lengths = np.random.default_rng(0).integers(1, 50, size=300)
    made = {
        "grouped": lambda: LengthGroupedBatches(lengths, batch_size=10, seed=1),
        "shuffled": lambda: ShuffledBatches(range(300), batch_size=10, seed=1),
    }
    for name, make in made.items():
        first = make()
        epoch_1 = list(first)
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)
        epochs_2_3 = [list(first), list(first)]
        again = make()
        buffer.seek(0)
        again.load_state_dict(torch.load(buffer, weights_only=True))
        assert [list(again), list(again)] == epochs_2_3, name
        assert epochs_2_3[0] != epoch_1, name
        assert sorted(i for b in epochs_2_3[0] for i in b) == list(range(300)), name


# -- training prefixes -----------------------------------------------------------------------


def test_train_prefixes_exact_batch(store):
    prefixes = TrainPrefixes(store, max_seq_len=3, time_buckets=BUCKETS)
    # u1 (7 training events e0..e6): targets e1..e6; u2 (2): e1; u3, u4: none
    assert len(prefixes) == 7
    batch = prefixes[[0, 2, 5, 6]]  # u1 -> e1, u1 -> e3, u1 -> e6, u2 -> e1
    torch.testing.assert_close(
        batch.item, long([[0, 0, 10], [10, 11, 12], [13, 14, 15], [0, 0, 19]])
    )
    # only the last position is this row's target
    torch.testing.assert_close(
        batch.target_item, long([[0, 0, 11], [0, 0, 13], [0, 0, 16], [0, 0, 20]])
    )
    assert (batch.target_behavior[:, :-1] == 0).all()
    torch.testing.assert_close(
        batch.target_behavior[:, -1], long([11, 13, 16, 20]).apply_(behavior_of)
    )
    torch.testing.assert_close(batch.user_index, long([0, 0, 0, 1]))


@pytest.mark.parametrize("max_seq_len", [1, 2, 3, 7, 30])
def test_train_prefixes_predict_every_training_target_once_from_the_events_before_it(max_seq_len):
    store = random_store(seed=max_seq_len)
    prefixes = TrainPrefixes(store, max_seq_len=max_seq_len, time_buckets=BUCKETS)
    windows = TrainWindows(store, max_seq_len=max_seq_len, time_buckets=BUCKETS)
    batch = prefixes[list(range(len(prefixes)))]
    targets = batch.target_item[:, -1].numpy() - 10  # back to flat indices
    # the same targets as the windows, each once
    every = windows[list(range(len(windows)))]
    window_targets = every.target_item[every.padding_mask].numpy() - 10
    np.testing.assert_array_equal(np.sort(targets), np.sort(window_targets))
    assert len(np.unique(targets)) == len(targets)
    for b, target in enumerate(targets):
        user = int(batch.user_index[b])
        first = int(store.offsets[user])
        expected = np.arange(max(first, target - max_seq_len), target)  # the events before it
        got = batch.item[b][batch.padding_mask[b]].numpy() - 10
        np.testing.assert_array_equal(got, expected)
        assert target < first + store.train_end[user]  # never a validation or test event
    np.testing.assert_array_equal(prefixes.input_lengths, batch.padding_mask.sum(dim=1).numpy())


def test_train_prefix_partners_share_the_target_and_are_drawn_uniformly():
    store = random_store(seed=5, num_users=60, num_items=150)
    plain = TrainPrefixes(store, max_seq_len=4, time_buckets=BUCKETS)
    paired = TrainPrefixes(store, max_seq_len=4, time_buckets=BUCKETS, partners=True)
    every = np.arange(len(plain))
    targets = store.item[plain.end]  # each row's target item
    rows = every[:50]
    torch.manual_seed(0)
    batch = paired[list(rows)]
    half = len(rows)
    assert len(batch) == 2 * half
    # the first half is the plain batch; the partner half has no targets
    alone = plain[list(rows)]
    width = alone.item.shape[1]
    torch.testing.assert_close(batch.item[:half, -width:], alone.item)
    torch.testing.assert_close(batch.target_item[:half, -1], alone.target_item[:, -1])
    assert (batch.target_item[half:] == 0).all() and (batch.target_behavior[half:] == 0).all()
    # each partner is another row with the same target (itself only when the target is unique)
    torch.manual_seed(0)
    partner = paired.partner_of(rows)
    np.testing.assert_array_equal(targets[partner], targets[rows])
    group_size = np.array([(targets == t).sum() for t in targets[rows]])
    np.testing.assert_array_equal(partner == rows, group_size == 1)
    assert (group_size > 1).any() and (group_size == 1).any()
    # the partner half is those rows' inputs, cut to the batch's longest row
    assert batch.item.shape[1] == width
    partners_alone = plain[list(partner)]
    cut = min(width, partners_alone.item.shape[1])
    torch.testing.assert_close(batch.item[half:, -cut:], partners_alone.item[:, -cut:])
    assert (
        batch.padding_mask[half:].sum(1) == partners_alone.padding_mask.sum(1).clamp(max=width)
    ).all()
    short = paired[list(np.argsort(plain.input_lengths)[:10])]  # short rows: long partners cut
    assert short.item.shape[1] == plain.input_lengths[np.argsort(plain.input_lengths)[:10]].max()
    # uniform over the other rows with the same target, and seeded
    row = int(np.argmax([(targets == t).sum() for t in targets]))
    others = np.flatnonzero(targets == targets[row])
    others = others[others != row]
    drawn = np.concatenate([paired.partner_of(np.full(2000, row)) for _ in range(3)])
    counts = np.array([(drawn == o).sum() for o in others])
    assert counts.sum() == len(drawn)
    expected = len(drawn) / len(others)
    assert (np.abs(counts - expected) < 5 * np.sqrt(expected)).all()
    torch.manual_seed(1)
    first = paired.partner_of(every)
    torch.manual_seed(1)
    np.testing.assert_array_equal(first, paired.partner_of(every))


@pytest.mark.parametrize("damage", ["cut", "another table"])
def test_a_damaged_sequences_file_is_named_with_the_fix(tmp_path, damage):
    """A prepared folder's sequences.parquet cut short (a full disk, a copy that did not
    finish) failed training and evaluation with pyarrow's bare "ArrowInvalid: ... Parquet
    magic bytes not found in footer", and another table in its place with a KeyError: both
    are named with the fix, as a damaged vocabulary file is."""
    from recsys.data.io import DataError

    path = tmp_path / "sequences.parquet"
    sequences_frame().write_parquet(path)
    if damage == "cut":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        pl.DataFrame({"user_id": ["u1"]}).write_parquet(path)
    with pytest.raises(DataError, match="prepare the log again") as info:
        SequenceStore.from_parquet(path)
    assert str(path) in str(info.value)
    assert f"pipelines.prepare data.prepared_dir={tmp_path}" in str(info.value)
