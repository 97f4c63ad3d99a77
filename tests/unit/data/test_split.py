"""Tests for recsys.data.split: exact split positions on a hand-built log, settings validation,
and the absence of leakage on a prepared synthetic dataset (inputs never contain the target or a
later event; the vocabulary only knows the training window)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys.data import transforms
from recsys.data.dataset import SequenceStore, TargetRows, TrainWindows
from recsys.data.pipeline import SEQUENCES_FILE, PrepareSettings, load_stats, prepare_dataset
from recsys.data.sequences import TimeBuckets
from recsys.data.split import (
    TEST_START,
    TEST_TARGET,
    TRAIN_END,
    VAL_TARGET,
    SplitPoints,
    SplitSettings,
    split_positions,
    temporal_cuts,
    training_events,
)
from recsys.data.synthetic import generate_events
from recsys.data.transforms import POSITION
from recsys.data.validate import ROW
from recsys.data.vocab import ATTRIBUTE, TRAIN_COUNT, Vocab
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, UNK_IDX, USER, EventSchema

T0 = datetime(2024, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=100)

# (user, item, behaviour, time in steps of 100 s). 12 events at distinct times 0..11; with
# val_fraction = test_fraction = 0.2 the cuts are the "lower" quantiles at 0.6 and 0.8 of the
# 12 timestamps: index floor(0.6 * 11) = 6 and floor(0.8 * 11) = 8, i.e. t=6 and t=8.
#   train: t < 6   validation: 6 <= t < 8   test: t >= 8
TINY_LOG = [
    ("A", "i1", "view", 0),
    ("A", "i1", "click", 1),
    ("A", "i2", "view", 6),  # A's first validation event
    ("A", "i2", "purchase", 7),  # A's first validation purchase
    ("A", "i3", "view", 9),  # A's first test event (no test purchase)
    ("B", "i1", "view", 2),
    ("B", "i4", "view", 3),
    ("B", "i4", "purchase", 8),  # B has nothing in validation; test target (any / purchase)
    ("B", "i5", "view", 10),
    ("C", "i4", "view", 4),
    ("C", "i4", "purchase", 5),  # C: training only
    ("D", "i6", "view", 11),  # D: a single test-window event with no history: no target
]


def tiny_log() -> pl.LazyFrame:
    rows = [(u, i, e, T0 + k * STEP) for u, i, e, k in TINY_LOG]
    df = pl.DataFrame(
        rows,
        schema={
            USER: pl.String,
            ITEM: pl.String,
            EVENT_TYPE: pl.String,
            TIMESTAMP: pl.Datetime("us", "UTC"),
        },
        orient="row",
    )
    # shuffled input (``_row`` numbers the shuffled rows): the split must only depend on the
    # sorted history
    return (
        df.sample(fraction=1.0, shuffle=True, seed=5)
        .with_row_index(ROW)
        .lazy()
        .pipe(transforms.sort_events)
        .pipe(transforms.add_position)
    )


def positions(rows: dict[str, tuple[int, int, int, int]]) -> pl.DataFrame:
    """user -> (train_end, val_target, test_start, test_target)."""
    return pl.DataFrame(
        [(u, *v) for u, v in rows.items()],
        schema={
            USER: pl.String,
            TRAIN_END: pl.Int32,
            VAL_TARGET: pl.Int32,
            TEST_START: pl.Int32,
            TEST_TARGET: pl.Int32,
        },
        orient="row",
    )


def split(settings: SplitSettings) -> tuple[SplitPoints, pl.DataFrame]:
    lf = tiny_log()
    points = (
        temporal_cuts(lf, settings) if settings.method == "temporal" else SplitPoints(None, None)
    )
    return points, split_positions(lf, settings, points).collect().sort(USER)


def test_temporal_cuts_are_event_count_quantiles():
    points, _ = split(SplitSettings(val_fraction=0.2, test_fraction=0.2))
    assert points == SplitPoints(val_start=T0 + 6 * STEP, test_start=T0 + 8 * STEP)


@pytest.mark.parametrize(
    "settings",
    [
        SplitSettings(val_fraction=0.2, test_fraction=0.2),
        SplitSettings(method="leave_one_out"),
        SplitSettings(method="leave_last_n", holdout_events=2),
    ],
)
def test_training_events_are_the_positions_before_train_end(settings):
    # the temporal shortcut (timestamp < validation cut) and the window flags of the others
    # must select exactly what the positions say
    points, got_positions = split(settings)
    ends = dict(got_positions.select(USER, TRAIN_END).iter_rows())
    train = training_events(tiny_log(), settings, points).collect()
    expected = tiny_log().filter(
        pl.col(POSITION) < pl.col(USER).replace_strict(ends, return_dtype=pl.Int32)
    )
    assert_frame_equal(train.sort(USER, POSITION), expected.collect().sort(USER, POSITION))
    assert train.height > 0


def test_temporal_split_any_behavior():
    _, got = split(SplitSettings(val_fraction=0.2, test_fraction=0.2))
    expected = positions(
        {
            "A": (2, 2, 4, 4),
            "B": (2, -1, 2, 2),
            "C": (2, -1, 2, -1),
            "D": (0, -1, 0, -1),  # its only event is at position 0: nothing to predict it from
        }
    )
    assert_frame_equal(got, expected)


def test_temporal_split_with_target_behaviors():
    _, got = split(
        SplitSettings(val_fraction=0.2, test_fraction=0.2, target_behaviors=("purchase",))
    )
    expected = positions(
        {
            "A": (2, 3, 4, -1),  # the validation view at position 2 is input, not target
            "B": (2, -1, 2, 2),
            "C": (2, -1, 2, -1),  # C's purchase lies in the training window
            "D": (0, -1, 0, -1),
        }
    )
    assert_frame_equal(got, expected)


def test_leave_one_out_split():
    _, got = split(SplitSettings(method="leave_one_out"))
    expected = positions(
        {
            "A": (3, 3, 4, 4),
            "B": (2, 2, 3, 3),
            "C": (0, -1, 1, 1),  # two events: test target only
            "D": (0, -1, 0, -1),  # one event: nothing (and no arithmetic underflow)
        }
    )
    assert_frame_equal(got, expected)


def test_leave_last_n_split():
    # A: 5 events -> validation window 1-2, test window 3-4; B: 4 -> 0-1 and 2-3;
    # C: 2 -> both in the test window; D: 1 -> test window, nothing to predict it from
    _, got = split(SplitSettings(method="leave_last_n", holdout_events=2))
    expected = positions(
        {
            "A": (1, 1, 3, 3),
            "B": (0, 1, 2, 2),  # position 0 has no history: the validation target is 1
            "C": (0, -1, 0, 1),
            "D": (0, -1, 0, -1),
        }
    )
    assert_frame_equal(got, expected)


def test_leave_last_n_with_target_behaviors():
    _, got = split(
        SplitSettings(method="leave_last_n", holdout_events=2, target_behaviors=("purchase",))
    )
    expected = positions(
        {
            "A": (1, -1, 3, 3),  # click + view in validation: no target; purchase at 3 is
            "B": (0, -1, 2, 2),
            "C": (0, -1, 0, 1),
            "D": (0, -1, 0, -1),
        }
    )
    assert_frame_equal(got, expected)


@pytest.mark.parametrize("target_behaviors", [None, ("purchase",)])
def test_leave_one_out_is_leave_last_n_with_one_event(target_behaviors):
    _, one_out = split(SplitSettings(method="leave_one_out", target_behaviors=target_behaviors))
    _, last_one = split(
        SplitSettings(method="leave_last_n", holdout_events=1, target_behaviors=target_behaviors)
    )
    assert_frame_equal(one_out, last_one)
    # holdout_events only matters for leave_last_n
    _, ignored = split(
        SplitSettings(method="leave_one_out", holdout_events=3, target_behaviors=target_behaviors)
    )
    assert_frame_equal(ignored, one_out)


def test_leave_one_out_ignores_timestamps_but_not_order():
    # leave-one-out looks at positions only: the same histories give the same answer
    # whatever the absolute times
    settings = SplitSettings(method="leave_one_out")
    lf = tiny_log().with_columns(pl.col(TIMESTAMP) + timedelta(days=400))
    got = split_positions(lf, settings, SplitPoints(None, None)).collect().sort(USER)
    assert_frame_equal(got, split(settings)[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"method": "random"},
            "data.split.method='random': use one of ['temporal', 'leave_one_out', 'leave_last_n']",
        ),
        ({"holdout_events": 0}, "data.split.holdout_events=0 must be an integer >= 1"),
        ({"holdout_events": 1.5}, "data.split.holdout_events=1.5 must be an integer >= 1"),
        ({"val_fraction": 0.0}, "data.split.val_fraction=0.0 must lie in (0, 0.5)"),
        ({"val_fraction": 0.5}, "data.split.val_fraction=0.5 must lie in (0, 0.5)"),
        ({"test_fraction": -0.1}, "data.split.test_fraction=-0.1 must lie in (0, 0.5)"),
        ({"val_fraction": 0.45, "test_fraction": 0.45}, "leaves too little for training"),
        # was taken as null (every behaviour a target), and stats.json said []
        (
            {"target_behaviors": []},
            "data.split.target_behaviors=[] names no behaviour: set null for targets of every "
            "behaviour, or name them, e.g. [purchase]",
        ),
    ],
)
def test_split_settings_validation(kwargs, message):
    with pytest.raises(ValueError) as info:
        SplitSettings(**kwargs)
    assert message in str(info.value)


# -- leakage on a prepared synthetic dataset ------------------------------------------------

MAX_SEQ_LEN = 8
BUCKETS = TimeBuckets(unit_seconds=60, num_buckets=12)


def _synthetic() -> pl.DataFrame:
    return generate_events(num_users=80, num_items=120, num_categories=6, seed=21)


@pytest.fixture(
    scope="module", params=["temporal", "temporal_purchase", "leave_one_out", "leave_last_n"]
)
def prepared(request, tmp_path_factory):
    split_settings = {
        "temporal": SplitSettings(),
        "temporal_purchase": SplitSettings(
            val_fraction=0.2, test_fraction=0.2, target_behaviors=("cart", "purchase")
        ),
        "leave_one_out": SplitSettings(method="leave_one_out"),
        "leave_last_n": SplitSettings(method="leave_last_n", holdout_events=2),
    }[request.param]
    out = tmp_path_factory.mktemp(request.param) / "prep"
    events = _synthetic()
    stats, _ = prepare_dataset(
        events,
        schema=EventSchema(),
        settings=PrepareSettings(split=split_settings, time_buckets=BUCKETS),
        out_dir=out,
    )
    store = SequenceStore.from_parquet(out / SEQUENCES_FILE)
    return stats, store, split_settings, out


@pytest.mark.parametrize("which", ["val", "test"])
def test_evaluation_inputs_precede_their_target(prepared, which):
    stats, store, _, _ = prepared
    target_position = {"val": store.val_target, "test": store.test_target}[which]
    rows = TargetRows(store, target_position, max_seq_len=MAX_SEQ_LEN, time_buckets=BUCKETS)
    assert len(rows) == stats[f"{which}_targets"] > 0
    batch = rows[list(range(len(rows)))]
    for b, user in enumerate(rows.rows):
        first, last = store.offsets[user], store.offsets[user + 1]
        target = rows.target[b]
        assert target == first + target_position[user]
        inputs = np.arange(rows.start[b], rows.end[b])
        assert 1 <= len(inputs) <= MAX_SEQ_LEN
        assert first <= inputs.min() and inputs.max() < target < last
        assert (store.timestamp[inputs] <= store.timestamp[target]).all()
        # what the batch holds is exactly those events, left-padded, and the target
        length = len(inputs)
        np.testing.assert_array_equal(batch.item[b, -length:].numpy(), store.item[inputs])
        assert not batch.padding_mask[b, :-length].any()
        assert batch.padding_mask[b, -length:].all()
        assert batch.target_item[b].item() == store.item[target]
        # the most recent events before the target: no gap between input and target
        assert inputs.max() == target - 1


def test_validation_target_comes_before_test_target(prepared):
    _, store, _, _ = prepared
    both = (store.val_target >= 0) & (store.test_target >= 0)
    assert both.any()
    assert (store.val_target[both] < store.test_target[both]).all()
    valid = store.val_target >= 0
    assert (store.val_target[valid] >= store.train_end[valid]).all()


def test_training_windows_stay_inside_the_training_window(prepared):
    stats, store, _, _ = prepared
    windows = TrainWindows(store, max_seq_len=MAX_SEQ_LEN, time_buckets=BUCKETS)
    assert len(windows) > 0
    user = windows.rows
    train_stop = store.offsets[user] + store.train_end[user]
    assert (windows.start >= store.offsets[user]).all()
    assert (windows.end <= train_stop).all()
    if stats["split"]["val_start"] is not None:
        val_start = int(datetime.fromisoformat(stats["split"]["val_start"]).timestamp())
        for start, end in zip(windows.start, windows.end):
            assert (store.timestamp[start:end] < val_start).all()
    # every input token's target is the next event of the same user, never an evaluation event
    batch = windows[list(range(len(windows)))]
    mask = batch.padding_mask.numpy()
    for b in range(len(windows)):
        inputs = np.arange(windows.start[b], windows.end[b] - 1)
        targets = inputs + 1
        np.testing.assert_array_equal(batch.item[b].numpy()[mask[b]], store.item[inputs])
        np.testing.assert_array_equal(batch.target_item[b].numpy()[mask[b]], store.item[targets])
        assert (store.timestamp[inputs] <= store.timestamp[targets]).all()
        assert (targets < train_stop[b]).all()


def test_split_positions_agree_with_the_method(prepared):
    stats, store, settings, folder = prepared
    lengths = store.lengths
    window_start = pl.read_parquet(folder / SEQUENCES_FILE)[TEST_START].to_numpy()
    assert (store.train_end <= window_start).all() and (window_start <= lengths).all()
    if settings.method != "temporal":
        holdout = 1 if settings.method == "leave_one_out" else settings.holdout_events
        assert stats["split"]["val_start"] is None
        np.testing.assert_array_equal(window_start, np.maximum(lengths - holdout, 0))
        np.testing.assert_array_equal(store.train_end, np.maximum(lengths - 2 * holdout, 0))

        def first_with_history(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
            first = np.maximum(start, 1)
            return np.where(first < stop, first, -1)

        # a target is the first event of its window that has a history, or -1 where its item
        # is unknown (counted in stats)
        for which, got, expected in (
            ("val", store.val_target, first_with_history(store.train_end, window_start)),
            ("test", store.test_target, first_with_history(window_start, lengths)),
        ):
            dropped = (got == -1) & (expected >= 0)
            assert ((got == expected) | dropped).all(), which
            assert dropped.sum() == stats[f"{which}_targets_unknown_item"], which
        return
    val_start = int(datetime.fromisoformat(stats["split"]["val_start"]).timestamp())
    test_start = int(datetime.fromisoformat(stats["split"]["test_start"]).timestamp())
    for user in range(store.num_users):
        ts = store.timestamp[store.offsets[user] : store.offsets[user + 1]]
        train_end, first_test = store.train_end[user], window_start[user]
        assert (ts[:train_end] < val_start).all()
        assert (
            (ts[train_end:first_test] >= val_start) & (ts[train_end:first_test] < test_start)
        ).all()
        assert (ts[first_test:] >= test_start).all()
        if store.val_target[user] >= 0:
            assert train_end <= store.val_target[user] < first_test
            assert val_start <= ts[store.val_target[user]] < test_start
        if store.test_target[user] >= 0:
            assert first_test <= store.test_target[user]
            assert ts[store.test_target[user]] >= test_start


def test_vocabulary_counts_the_training_window_only(prepared):
    stats, store, _, folder = prepared
    vocab = Vocab.load(folder)
    train_items = np.concatenate(
        [
            store.item[store.offsets[u] : store.offsets[u] + store.train_end[u]]
            for u in range(store.num_users)
        ]
    )
    # every training token is a known item, and the vocabulary's counts are training counts
    assert (train_items >= 2).all()
    counted = np.bincount(train_items, minlength=vocab.num_items)[2:]
    np.testing.assert_array_equal(counted, vocab.items[TRAIN_COUNT].to_numpy())
    assert vocab.items[TRAIN_COUNT].sum() == stats["train_events"]
    assert set(vocab.items[ITEM].to_list()) <= set(_synthetic()[ITEM].to_list())


def test_item_first_seen_after_the_cut_is_unknown_and_its_target_dropped(tmp_path):
    events = _synthetic()
    settings = PrepareSettings(time_buckets=BUCKETS)
    base_stats, _ = prepare_dataset(
        events, schema=EventSchema(), settings=settings, out_dir=tmp_path / "base"
    )
    base = SequenceStore.from_parquet(tmp_path / "base" / SEQUENCES_FILE)

    # Replace one user's validation target and another user's test target by brand-new items:
    # timestamps are unchanged, so the cuts and positions stay the same.
    val_user = int(np.flatnonzero(base.val_target >= 0)[0])
    test_user = int(
        np.flatnonzero((base.test_target >= 0) & (np.arange(base.num_users) != val_user))[0]
    )
    sorted_events = events.sort([USER, TIMESTAMP], maintain_order=True).with_row_index("_row")
    by_user = sorted_events.with_columns(pl.int_range(pl.len()).over(USER).alias("_pos"))

    def raw_row(user_index: int, position: int) -> int:
        user_id = base.user_id[user_index]
        hit = by_user.filter((pl.col(USER) == user_id) & (pl.col("_pos") == position))
        assert hit.height == 1
        return int(hit["_row"].item())

    new_val_item, new_test_item = 9_999_001, 9_999_002
    rows = {
        raw_row(val_user, int(base.val_target[val_user])): new_val_item,
        raw_row(test_user, int(base.test_target[test_user])): new_test_item,
    }
    changed = sorted_events.with_columns(
        pl.col("_row")
        .replace_strict(rows, default=pl.col(ITEM), return_dtype=pl.Int64)
        .alias(ITEM),
        pl.when(pl.col("_row").is_in(list(rows)))
        .then(pl.lit("brand-new"))
        .otherwise(pl.col(CATEGORY))
        .alias(CATEGORY),
    ).drop("_row")

    stats, _ = prepare_dataset(
        changed, schema=EventSchema(), settings=settings, out_dir=tmp_path / "changed"
    )
    store = SequenceStore.from_parquet(tmp_path / "changed" / SEQUENCES_FILE)
    vocab = Vocab.load(tmp_path / "changed")

    assert stats["split"]["val_start"] == base_stats["split"]["val_start"]
    assert new_val_item not in vocab.items[ITEM].to_list()
    assert new_test_item not in vocab.items[ITEM].to_list()
    assert "brand-new" not in vocab.attributes[ATTRIBUTE].to_list()
    # the tokens are UNK wherever they occur (also inside later input histories)
    assert store.item[store.offsets[val_user] + base.val_target[val_user]] == UNK_IDX
    assert store.item[store.offsets[test_user] + base.test_target[test_user]] == UNK_IDX
    # their targets are set aside and counted, not ranked
    assert store.val_target[val_user] == -1
    assert store.test_target[test_user] == -1
    assert stats["val_targets_unknown_item"] == base_stats["val_targets_unknown_item"] + 1
    assert stats["test_targets_unknown_item"] == base_stats["test_targets_unknown_item"] + 1
    assert stats["val_targets"] == base_stats["val_targets"] - 1
    assert stats["test_targets"] == base_stats["test_targets"] - 1
    assert load_stats(tmp_path / "changed") == stats
    # no evaluation row has an UNK target
    for target_position in (store.val_target, store.test_target):
        rows_ = TargetRows(store, target_position, max_seq_len=MAX_SEQ_LEN, time_buckets=BUCKETS)
        assert (store.item[rows_.target] != UNK_IDX).all()
