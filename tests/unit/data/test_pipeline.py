"""Tests for recsys.data.pipeline: the prepared folder and its statistics, the quarantine file,
k-core / window / truncation / sessions, the fingerprint, atomic replacement, and scoring
sequences built with a saved vocabulary."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal, assert_series_equal

import recsys.data.pipeline as pipeline_module
from recsys.data import PreparedDataset
from recsys.data.dataset import SequenceStore
from recsys.data.io import DataError
from recsys.data.pipeline import (
    FORMAT_VERSION,
    QUARANTINE_FILE,
    SEQUENCES_FILE,
    STATS_FILE,
    PrepareSettings,
    events_fingerprint,
    load_events,
    load_stats,
    prepare_dataset,
    scoring_sequences,
)
from recsys.data.sequences import BEHAVIORS, ITEMS, SEQUENCE_COLUMNS, TIMES, TimeBuckets
from recsys.data.split import TEST_START, TEST_TARGET, TRAIN_END, VAL_TARGET, SplitSettings
from recsys.data.synthetic import generate_events
from recsys.data.transforms import SESSION_INDEX
from recsys.data.validate import BadRowPolicy
from recsys.data.vocab import ATTRIBUTE, ATTRIBUTE_INDICES, FILES, INDEX, Vocab
from recsys.schema import (
    ATTRIBUTES,
    CATEGORY,
    EVENT_TYPE,
    ITEM,
    TIMESTAMP,
    UNK_IDX,
    USER,
    EventSchema,
)

SCHEMA = EventSchema()
SETTINGS = PrepareSettings()
FOLDER_FILES = sorted([SEQUENCES_FILE, STATS_FILE, QUARANTINE_FILE, *FILES.values()])


def synthetic(seed: int = 4) -> pl.DataFrame:
    return generate_events(num_users=50, num_items=70, num_categories=5, seed=seed)


def with_noise(events: pl.DataFrame) -> tuple[pl.DataFrame, int, int, int]:
    """Add 7 exact duplicates and 3 users who end up with one event each (one of them only
    after dedupe); return the log, duplicates, small users and their events."""
    duplicates = events[[0, 5, 9, 100, 101, 102, 400]]
    t = datetime(2024, 1, 10, tzinfo=UTC)
    small = pl.DataFrame(
        {
            USER: [1, 2, 3, 3],
            ITEM: [events[ITEM][0]] * 4,
            CATEGORY: [events[CATEGORY][0]] * 4,
            EVENT_TYPE: ["view"] * 4,
            TIMESTAMP: [t, t, t, t],  # user 3's two rows are one event twice
        },
        schema=events.schema,
    )
    return pl.concat([events, duplicates, small]), 7 + 1, 3, 3


def prepare(source, out, settings: PrepareSettings = SETTINGS, schema: EventSchema = SCHEMA):
    stats, vocab = prepare_dataset(source, schema=schema, settings=settings, out_dir=out)
    # what is returned is what was written: no caller needs to read the folder back
    assert stats == json.loads((Path(out) / "stats.json").read_text())
    on_disk = Vocab.load(out)
    assert vocab.behaviors == on_disk.behaviors
    assert_frame_equal(vocab.items, on_disk.items)
    assert_frame_equal(vocab.attributes, on_disk.attributes)
    return stats


def test_folder_contents_and_stats_file(tmp_path):
    events, _, _, _ = with_noise(synthetic())
    stats = prepare(events, tmp_path / "prep")
    assert sorted(p.name for p in (tmp_path / "prep").iterdir()) == FOLDER_FILES
    assert [p.name for p in tmp_path.iterdir()] == ["prep"]  # no temporary folder left
    assert load_stats(tmp_path / "prep") == json.loads(json.dumps(stats, default=str))
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    assert tuple(sequences.columns) == SEQUENCE_COLUMNS
    assert sequences.schema[ITEMS] == pl.List(pl.Int32)
    assert sequences.schema[BEHAVIORS] == pl.List(pl.Int8)
    assert sequences.schema[TIMES] == pl.List(pl.Int64)


def test_stats_counts_add_up(tmp_path):
    clean_events = synthetic()
    events, duplicates, small_users, small_events = with_noise(clean_events)
    stats = prepare(events, tmp_path / "prep")
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    vocab = Vocab.load(tmp_path / "prep")

    assert stats["rows_read"] == events.height
    assert stats["bad_rows"] == {"duplicate": duplicates}
    assert stats["bad_rows_policy"] == {
        "null_id": "error",
        "bad_timestamp": "error",
        "unknown_behavior": "error",
        "negative_timestamp": "error",
        "future_timestamp": "error",
        "duplicate": "drop",
    }
    assert stats["quarantined"] == stats["duplicates_removed"] == duplicates
    assert stats["events_outside_window"] == 0
    # the small users (one event each after dedupe) go in round 1 of the k-core; round 2 is stable
    assert stats["kcore_iterations"] == 1  # no item threshold: one per-user pass
    assert stats["events_removed_by_kcore"] == small_events
    assert stats["events_removed_by_max_user_events"] == 0
    assert stats["events"] == clean_events.height
    assert stats["rows_read"] == (
        stats["events"]
        + stats["quarantined"]
        + stats["events_outside_window"]
        + stats["events_removed_by_kcore"]
        + stats["events_removed_by_max_user_events"]
    )
    assert stats["users"] == sequences.height == clean_events[USER].n_unique()
    assert stats["users"] + small_users == events[USER].n_unique()
    assert stats["items"] == clean_events[ITEM].n_unique()
    assert "sessions" not in stats  # sessions are not derived by default
    assert stats["events"] == sequences[ITEMS].list.len().sum()
    assert stats["train_events"] == sequences[TRAIN_END].sum()
    assert stats["train_users"] == (sequences[TRAIN_END] >= 2).sum()
    assert stats["val_targets"] == (sequences[VAL_TARGET] >= 0).sum() > 0
    assert stats["test_targets"] == (sequences[TEST_TARGET] >= 0).sum() > 0
    assert stats["num_items"] == vocab.num_items
    assert stats["num_attributes"] == vocab.num_attributes == clean_events[CATEGORY].n_unique() + 2
    assert stats["attribute_width"] == vocab.attribute_width == 1
    assert stats["num_behaviors"] == vocab.num_behaviors == 6
    assert stats["vocab_hash"] == vocab.content_hash()
    assert stats["source"] == "<in-memory polars frame>"
    assert stats["schema"] == SCHEMA.to_dict()
    assert stats["time_buckets"] == {
        "unit_seconds": 60.0,
        "num_buckets": 16,
        "reference": "previous",
    }
    assert stats["settings"]["min_user_events"] == 2 and stats["settings"]["min_item_count"] == 1
    assert datetime.fromisoformat(stats["first_event"]) == clean_events[TIMESTAMP].min()
    assert datetime.fromisoformat(stats["last_event"]) == clean_events[TIMESTAMP].max()
    val_start = datetime.fromisoformat(stats["split"]["val_start"])
    assert stats["train_events"] == (clean_events[TIMESTAMP] < val_start).sum()
    assert stats["split"]["method"] == "temporal"
    assert stats["split"]["target_behaviors"] is None
    assert stats["settings"] == SETTINGS.to_dict()
    assert stats["ordered_by"] == "timestamp"
    assert stats["partitions"] == 1


def test_quarantine_file_holds_the_rows_set_aside(tmp_path):
    clean_events = synthetic()
    events, duplicates, _, _ = with_noise(clean_events)
    prepare(events, tmp_path / "prep")
    quarantine = pl.read_parquet(tmp_path / "prep" / QUARANTINE_FILE)
    assert quarantine.columns == [
        "row",
        "problem",
        USER,
        ITEM,
        TIMESTAMP,
        EVENT_TYPE,
        ATTRIBUTES,
        "raw_timestamp",
        "raw_event_type",
    ]
    # the 7 appended copies, and user 3's second identical row: the later input row goes
    n = clean_events.height
    rows = [*range(n, n + 7), n + 7 + 3]
    expected = events.with_row_index("row")[rows].select(
        "row",
        pl.lit("duplicate").alias("problem"),
        USER,
        ITEM,
        TIMESTAMP,
        EVENT_TYPE,
        pl.concat_list(CATEGORY).alias(ATTRIBUTES),
    )
    assert len(rows) == duplicates
    assert_frame_equal(quarantine.select(expected.columns), expected)
    # a duplicate's typed values are exact: raw values are kept for unreadable ones only
    assert quarantine["raw_event_type"].null_count() == quarantine.height
    assert quarantine["raw_timestamp"].null_count() == quarantine.height


def test_quarantine_file_of_a_clean_log_is_empty_and_typed(tmp_path):
    prepare(synthetic(), tmp_path / "prep")
    quarantine = pl.read_parquet(tmp_path / "prep" / QUARANTINE_FILE)
    assert quarantine.height == 0
    assert quarantine.schema["row"] == pl.UInt32
    assert quarantine.schema[ATTRIBUTES] == pl.List(pl.String)


def test_dropped_bad_rows_are_counted_quarantined_and_kept_out(tmp_path):
    events = synthetic()
    bad = events[:3].with_columns(
        pl.Series(EVENT_TYPE, ["teleport", "teleport", "view"]),
        pl.Series(USER, [1, 2, None], dtype=events.schema[USER]),
    )
    policy = BadRowPolicy(null_id="drop", unknown_behavior="drop")
    stats = prepare(pl.concat([events, bad]), tmp_path / "prep", replace(SETTINGS, bad_rows=policy))
    assert stats["bad_rows"] == {"null_id": 1, "unknown_behavior": 2}
    assert stats["quarantined"] == 3 and stats["duplicates_removed"] == 0
    assert stats["events"] == events.height
    quarantine = pl.read_parquet(tmp_path / "prep" / QUARANTINE_FILE)
    assert quarantine["row"].to_list() == [events.height + k for k in range(3)]
    assert quarantine["problem"].to_list() == ["unknown_behavior", "unknown_behavior", "null_id"]
    assert quarantine["raw_event_type"].to_list() == ["teleport", "teleport", "view"]
    assert quarantine[EVENT_TYPE].to_list() == [None, None, "view"]


def kcore(events: pl.DataFrame, min_user_events: int, min_item_events: int) -> pl.DataFrame:
    """A plain re-implementation of the iterative k-core filter."""
    while True:
        users = events.group_by(USER).len().filter(pl.col("len") >= min_user_events)[USER]
        items = events.group_by(ITEM).len().filter(pl.col("len") >= min_item_events)[ITEM]
        kept = events.filter(
            pl.col(USER).is_in(users.implode()) & pl.col(ITEM).is_in(items.implode())
        )
        if kept.height == events.height:
            return kept
        events = kept


def test_kcore_removes_rare_items_and_users_together(tmp_path):
    events = synthetic()
    settings = replace(SETTINGS, min_user_events=5, min_item_events=12)
    stats = prepare(events, tmp_path / "prep", settings)
    kept = kcore(events, 5, 12)
    assert 0 < kept.height < events.height
    assert stats["kcore_iterations"] >= 2
    assert stats["events_removed_by_kcore"] == events.height - kept.height
    assert stats["events"] == kept.height
    assert stats["users"] == kept[USER].n_unique()
    assert stats["items"] == kept[ITEM].n_unique()
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    expected = (
        kept.sort(USER, TIMESTAMP, maintain_order=True)
        .group_by(USER, maintain_order=True)
        .agg(pl.col(TIMESTAMP).dt.epoch("s").alias(TIMES))
    )
    assert_frame_equal(sequences.select(USER, TIMES).sort(USER), expected)


def test_time_window_keeps_start_inclusive_end_exclusive(tmp_path):
    events = synthetic()
    times = events[TIMESTAMP].sort()
    start, end = times[events.height // 4], times[3 * events.height // 4]
    inside = events.filter((pl.col(TIMESTAMP) >= start) & (pl.col(TIMESTAMP) < end))
    settings = replace(SETTINGS, window_start=start, window_end=end, min_user_events=1)
    stats = prepare(events, tmp_path / "prep", settings)
    assert stats["events_outside_window"] == events.height - inside.height
    assert stats["events"] == inside.height
    assert datetime.fromisoformat(stats["first_event"]) == start
    assert datetime.fromisoformat(stats["last_event"]) == inside[TIMESTAMP].max()
    assert stats["settings"]["window_start"] == start.isoformat()


def test_max_user_events_keeps_each_users_most_recent(tmp_path):
    events = synthetic()
    stats = prepare(events, tmp_path / "prep", replace(SETTINGS, max_user_events=20))
    lengths = events.group_by(USER).len()["len"]
    assert lengths.min() < 20 < lengths.max()
    assert stats["users"] == events[USER].n_unique()
    assert stats["events"] == lengths.clip(upper_bound=20).sum()
    assert stats["events_removed_by_max_user_events"] == events.height - stats["events"]
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    expected = (
        events.sort(USER, TIMESTAMP, maintain_order=True)
        .group_by(USER, maintain_order=True)
        .agg(pl.col(TIMESTAMP).dt.epoch("s").tail(20).alias(TIMES))
    )
    assert_frame_equal(sequences.select(USER, TIMES).sort(USER), expected)


def test_sessions_by_inactivity_gap(tmp_path):
    events = synthetic()
    gap = 30 * 60
    stats = prepare(events, tmp_path / "prep", replace(SETTINGS, session_gap_seconds=gap))
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    assert sequences.columns == [
        USER,
        ITEMS,
        BEHAVIORS,
        TIMES,
        SESSION_INDEX,
        *SEQUENCE_COLUMNS[4:],
    ]
    assert sequences.schema[SESSION_INDEX] == pl.List(pl.Int32)
    for times, sessions in zip(sequences[TIMES], sequences[SESSION_INDEX]):
        starts = np.diff(np.asarray(times)) > gap
        np.testing.assert_array_equal(sessions, np.concatenate([[0], np.cumsum(starts)]))
    assert stats["sessions"] == sum(s[-1] + 1 for s in sequences[SESSION_INDEX].to_list())
    assert stats["users"] < stats["sessions"] < stats["events"]


def test_sequences_hold_each_users_sorted_encoded_history(tmp_path):
    events = synthetic()
    shuffled = events.sample(fraction=1.0, shuffle=True, seed=1)
    prepare(shuffled, tmp_path / "prep")
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    vocab = Vocab.load(tmp_path / "prep")
    index_of = dict(zip(vocab.items[ITEM], vocab.items[INDEX]))
    behavior_of = {b: 2 + i for i, b in enumerate(SCHEMA.behaviors)}
    for row in sequences.head(10).iter_rows(named=True):
        # equal timestamps keep their input order (the tie rule)
        history = shuffled.filter(pl.col(USER) == row[USER]).sort(TIMESTAMP, maintain_order=True)
        assert row[TIMES] == history[TIMESTAMP].dt.epoch("s").to_list()
        assert row[ITEMS] == [index_of.get(i, UNK_IDX) for i in history[ITEM]]
        assert row[BEHAVIORS] == [behavior_of[b] for b in history[EVENT_TYPE]]


def test_fingerprint_is_stable_and_sees_data_and_settings(tmp_path):
    events = synthetic()
    first = prepare(events, tmp_path / "a")["fingerprint"]
    assert prepare(events.clone(), tmp_path / "b")["fingerprint"] == first
    assert prepare(events.to_pandas(), tmp_path / "c")["fingerprint"] == first

    one_second_later = events.with_columns(
        pl.when(pl.int_range(pl.len()) == 17)
        .then(pl.col(TIMESTAMP) + timedelta(seconds=1))
        .otherwise(pl.col(TIMESTAMP))
        .alias(TIMESTAMP)
    )
    other_behavior = events.with_columns(
        pl.when(pl.int_range(pl.len()) == 3)
        .then(pl.lit("purchase"))
        .otherwise(pl.col(EVENT_TYPE))
        .alias(EVENT_TYPE)
    )
    changed = {
        "timestamp": prepare(one_second_later, tmp_path / "d")["fingerprint"],
        "behaviour": prepare(other_behavior, tmp_path / "e")["fingerprint"],
        "val_fraction": prepare(
            events, tmp_path / "f", replace(SETTINGS, split=SplitSettings(val_fraction=0.15))
        )["fingerprint"],
        "method": prepare(
            events, tmp_path / "g", replace(SETTINGS, split=SplitSettings(method="leave_one_out"))
        )["fingerprint"],
        "target_behaviors": prepare(
            events,
            tmp_path / "h",
            replace(SETTINGS, split=SplitSettings(target_behaviors=("click", "cart", "purchase"))),
        )["fingerprint"],
        "time_buckets": prepare(
            events, tmp_path / "i", replace(SETTINGS, time_buckets=TimeBuckets(3600, 12))
        )["fingerprint"],
        "row_order": prepare(events[::-1], tmp_path / "j")["fingerprint"],
        "min_item_events": prepare(events, tmp_path / "k", replace(SETTINGS, min_item_events=2))[
            "fingerprint"
        ],
        "session_gap_seconds": prepare(
            events, tmp_path / "l", replace(SETTINGS, session_gap_seconds=600.0)
        )["fingerprint"],
        "bad_rows": prepare(
            events, tmp_path / "m", replace(SETTINGS, bad_rows=BadRowPolicy(null_id="drop"))
        )["fingerprint"],
        "as_of": prepare(
            events, tmp_path / "n", replace(SETTINGS, as_of=datetime(2030, 1, 1, tzinfo=UTC))
        )["fingerprint"],
        "max_item_attributes": prepare(
            events, tmp_path / "o", replace(SETTINGS, max_item_attributes=4)
        )["fingerprint"],
    }
    assert first not in changed.values()
    assert len(set(changed.values())) == len(changed)
    # the work layout is not part of the data
    assert (
        prepare(events, tmp_path / "p", replace(SETTINGS, partition_rows=1_000))["fingerprint"]
        == first
    )


def test_fingerprint_sees_the_schema(tmp_path):
    """A behaviour added to data.behaviors that no row uses leaves every typed row (and so the
    row digest) as it was, yet the prepared data differ (one more behaviour embedding): the
    fingerprint, which resumed trainings check, must differ too."""
    events = synthetic()
    first = prepare(events, tmp_path / "a")
    wider = replace(SCHEMA, behaviors=(*SCHEMA.behaviors, "share"))
    second = prepare(events, tmp_path / "b", schema=wider)
    assert second["num_behaviors"] == first["num_behaviors"] + 1
    assert second["rows_read"] == first["rows_read"]
    assert second["fingerprint"] != first["fingerprint"]


def test_fingerprint_does_not_depend_on_how_a_number_setting_is_written(tmp_path):
    # conf/data/base.yaml writes time_buckets.unit_seconds: 60, the Python API's default is
    # 60.0, and a command line may write session_gap_seconds=1800 or 1800.0: the same settings
    events = synthetic()
    first = prepare(events, tmp_path / "a", replace(SETTINGS, session_gap_seconds=1800.0))
    second = prepare(
        events,
        tmp_path / "b",
        replace(SETTINGS, time_buckets=TimeBuckets(unit_seconds=60), session_gap_seconds=1800),
    )
    assert second["fingerprint"] == first["fingerprint"]


@pytest.mark.parametrize("partition_rows", [SETTINGS.partition_rows, 1_000])
def test_category_text_is_cleaned_once_per_value(tmp_path, partition_rows):
    # surrounding whitespace is stripped and a blank category is null, in memory and through
    # work files: the padded log prepares into the same data as the clean one
    events = synthetic()
    blank = events[CATEGORY] == events[CATEGORY][0]
    clean = events.with_columns(pl.when(blank).then(None).otherwise(pl.col(CATEGORY)))
    padded = events.with_columns(
        pl.when(blank).then(pl.lit(" ")).otherwise(" " + pl.col(CATEGORY) + "\t")
    )
    settings = replace(SETTINGS, partition_rows=partition_rows)
    prepare(clean, tmp_path / "clean", settings)
    prepare(padded, tmp_path / "padded", settings)
    want, got = Vocab.load(tmp_path / "clean"), Vocab.load(tmp_path / "padded")
    assert_frame_equal(got.attributes, want.attributes)
    assert_frame_equal(got.items, want.items)
    assert " " not in got.attributes["attribute"].str.join("")
    assert_frame_equal(
        pl.read_parquet(tmp_path / "padded" / SEQUENCES_FILE),
        pl.read_parquet(tmp_path / "clean" / SEQUENCES_FILE),
    )
    # the same for the in-memory reader of scoring jobs
    assert load_events(padded, SCHEMA)[ATTRIBUTES].to_list() == (
        load_events(clean, SCHEMA)[ATTRIBUTES].to_list()
    )
    # a repeat that differs only by padding is a repeat
    rows = [int((~blank).arg_true()[0]), 0]  # padded and blank: repeat a category and a null
    stats = prepare(pl.concat([clean, padded[rows]]), tmp_path / "twice", settings)
    assert stats["duplicates_removed"] == 2


def test_rerun_replaces_the_folder(tmp_path):
    out = tmp_path / "prep"
    first = prepare(synthetic(seed=4), out)
    (out / QUARANTINE_FILE).unlink()  # an older layout with fewer files is replaced too
    second = prepare(synthetic(seed=5), out)
    assert sorted(p.name for p in out.iterdir()) == FOLDER_FILES
    assert [p.name for p in tmp_path.iterdir()] == ["prep"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes it, not mkdtemp's 0700
    assert first["fingerprint"] != second["fingerprint"]
    assert load_stats(out)["fingerprint"] == second["fingerprint"]
    assert SequenceStore.from_parquet(out / SEQUENCES_FILE).num_users == second["users"]


@pytest.mark.parametrize("where", ["source inside", "other files", "a file"])
def test_a_folder_holding_anything_else_is_not_replaced(tmp_path, where):
    """Preparing replaces the whole output folder: one that holds a raw log, a notebook or
    another tool's output is refused before any work, and keeps every file."""
    out = tmp_path / "project"
    if where == "a file":
        out.write_text("not a folder")
        match = "is a file"
    else:
        prepare(synthetic(seed=4), out) if where == "other files" else out.mkdir()
        (out / "notebook.ipynb").write_text("{}")
        match = r"holds .*notebook\.ipynb.*choose a new folder"
    source = out / "raw" / "events.parquet" if where == "source inside" else tmp_path / "e.pq"
    if where != "a file":
        source.parent.mkdir(exist_ok=True)
    synthetic(seed=5).write_parquet(source)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(DataError, match=match):
        prepare(source, out)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_failed_write_keeps_the_old_folder_and_leaves_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "prep"
    first = prepare(synthetic(seed=4), out)

    def broken_save(self, folder):
        (folder / "items.parquet").write_text("half written")
        raise OSError("disk full")

    monkeypatch.setattr(Vocab, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        prepare(synthetic(seed=5), out)
    assert [p.name for p in tmp_path.iterdir()] == ["prep"]
    assert load_stats(out) == json.loads(json.dumps(first, default=str))
    monkeypatch.undo()
    assert Vocab.load(out).content_hash() == first["vocab_hash"]


def test_too_small_log_says_how_to_fix_and_writes_nothing(tmp_path):
    t = datetime(2024, 1, 1, tzinfo=UTC)
    events = pl.DataFrame(
        {
            USER: [1, 1, 2, 2],
            ITEM: [1, 2, 1, 2],
            CATEGORY: ["a"] * 4,
            EVENT_TYPE: ["view"] * 4,
            TIMESTAMP: [t, t + timedelta(hours=1), t + timedelta(hours=2), t + timedelta(hours=3)],
        }
    )
    with pytest.raises(ValueError, match="leave_one_out") as info:
        prepare(events, tmp_path / "prep")
    assert "val_fraction" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_failed_prepare_leaves_no_parent_folders(tmp_path):
    bad = synthetic().with_columns(pl.lit("teleport").alias(EVENT_TYPE))
    with pytest.raises(DataError, match="unknown_behavior"):
        prepare(bad, tmp_path / "outputs" / "run" / "prepared")
    assert list(tmp_path.iterdir()) == []


def test_leave_one_out_with_single_event_users(tmp_path):
    events, _, _, _ = with_noise(synthetic())
    settings = PrepareSettings(split=SplitSettings(method="leave_one_out"), min_user_events=1)
    stats = prepare(events, tmp_path / "prep", settings)
    assert stats["kcore_iterations"] == 0  # min_user_events = min_item_events = 1: no k-core
    assert stats["events_removed_by_kcore"] == 0
    store = SequenceStore.from_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    single = store.lengths == 1
    assert single.sum() == 3
    np.testing.assert_array_equal(store.train_end[single], 0)
    np.testing.assert_array_equal(store.val_target[single], -1)
    np.testing.assert_array_equal(store.test_target[single], -1)


@pytest.mark.parametrize("partition_rows", [SETTINGS.partition_rows, 1_000])
def test_min_item_count_turns_rare_training_items_into_unk(tmp_path, partition_rows):
    events = synthetic()
    settings = replace(SETTINGS, min_item_count=5, partition_rows=partition_rows)
    stats = prepare(events, tmp_path / "prep", settings)
    vocab = Vocab.load(tmp_path / "prep")
    assert vocab.items["train_count"].min() >= 5
    # distinct items count every item, in the vocabulary or not
    assert stats["items"] == events[ITEM].n_unique() > vocab.items.height
    store = SequenceStore.from_parquet(tmp_path / "prep" / SEQUENCES_FILE)
    in_train = np.concatenate(
        [
            store.item[store.offsets[u] : store.offsets[u] + store.train_end[u]]
            for u in range(store.num_users)
        ]
    )
    assert (in_train == UNK_IDX).sum() == stats["train_events"] - vocab.items["train_count"].sum()
    assert (in_train == UNK_IDX).any()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_user_events": 0}, "data.min_user_events=0 must be an integer >= 1"),
        ({"min_item_events": 0}, "data.min_item_events=0 must be an integer >= 1"),
        ({"min_item_count": 0}, "data.min_item_count=0 must be an integer >= 1"),
        ({"min_user_events": 2.5}, "data.min_user_events=2.5 must be an integer >= 1"),
        ({"min_user_events": True}, "data.min_user_events=True must be an integer >= 1"),
        ({"max_item_attributes": 0}, "data.max_item_attributes=0 must be an integer >= 1"),
        ({"partition_rows": 999}, "data.partition_rows=999 must be an integer >= 1000"),
        (
            {"max_user_events": 1},
            "data.max_user_events=1 must be an integer >= data.min_user_events=2",
        ),
        ({"session_gap_seconds": 0}, "data.session_gap_seconds=0 must be > 0 (or null)"),
        (
            {
                "window_start": datetime(2024, 2, 1, tzinfo=UTC),
                "window_end": datetime(2024, 1, 1, tzinfo=UTC),
            },
            "data.window.start=2024-02-01T00:00:00+00:00 is not before "
            "data.window.end=2024-01-01T00:00:00+00:00",
        ),
    ],
)
def test_prepare_settings_validation(kwargs, message):
    with pytest.raises(ValueError) as info:
        PrepareSettings(**kwargs)
    assert message in str(info.value)


def test_load_stats_of_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the prepare step first"):
        load_stats(tmp_path / "nowhere")


# -- scoring ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("scoring") / "prep"
    events = synthetic()
    prepare(events, out)
    return load_events(events, SCHEMA), Vocab.load(out)


def test_scoring_sequences_respect_as_of(fitted):
    events, vocab = fitted
    as_of = events[TIMESTAMP].sort()[events.height // 2]
    scored = scoring_sequences(events, vocab=vocab, as_of=as_of)
    earlier = events.filter(pl.col(TIMESTAMP) <= as_of)
    assert scored[TIMES].explode().max() <= int(as_of.timestamp())
    assert scored[ITEMS].list.len().sum() == earlier.height
    assert scored[USER].sort().to_list() == earlier[USER].unique().sort().to_list()
    assert (scored[TRAIN_END] == scored[ITEMS].list.len()).all()
    assert (scored[TEST_START] == scored[ITEMS].list.len()).all()
    assert tuple(scored.columns) == SEQUENCE_COLUMNS
    assert (scored[VAL_TARGET] == -1).all() and (scored[TEST_TARGET] == -1).all()
    # the boundary is inclusive: an event exactly at as_of is in
    assert scored[TIMES].explode().max() == int(as_of.timestamp())
    # naive as_of means UTC
    naive = scoring_sequences(events, vocab=vocab, as_of=as_of.replace(tzinfo=None))
    assert_frame_equal(naive, scored)
    everything = scoring_sequences(events, vocab=vocab)
    assert everything[ITEMS].list.len().sum() == events.height


def test_scoring_drops_repeated_events_as_preparation_does(fitted):
    """load_events keeps exact repeats (same user, item, behaviour, time); the scoring
    sequences drop them, as preparation does, so that a repeat never shows up in a history at
    scoring time that training never saw. A repeat's time tie keeps the first copy's place."""
    events, vocab = fitted
    repeated = pl.concat([events, events[[0, 7, 7, 42]]])
    assert_frame_equal(
        scoring_sequences(repeated, vocab=vocab), scoring_sequences(events, vocab=vocab)
    )


def test_scoring_never_refits_the_vocabulary(fitted):
    events, vocab = fitted
    before = vocab.content_hash()
    last = events[TIMESTAMP].max()
    new_user = pl.DataFrame(
        {
            USER: [10**9, 10**9, 10**9],
            ITEM: [123_456_789, vocab.items[ITEM][0], 123_456_789],
            TIMESTAMP: [last, last + timedelta(seconds=1), last + timedelta(seconds=1)],
            EVENT_TYPE: ["view", "purchase", "view"],
            ATTRIBUTES: [["new"], None, ["new"]],
        },
        schema=events.schema,
    )
    scored = scoring_sequences(pl.concat([events, new_user]), vocab=vocab)
    row = scored.filter(pl.col(USER) == 10**9).row(0, named=True)
    assert row[ITEMS] == [UNK_IDX, 2, UNK_IDX]  # unseen item -> UNK; most frequent item -> 2
    assert row[BEHAVIORS] == [2, 5, 2]
    assert vocab.content_hash() == before
    assert 123_456_789 not in vocab.items[ITEM].to_list()


def test_scoring_fingerprint_sees_the_input_order_that_orders_ties(fitted):
    """events_fingerprint names a scoring job's input (its resume manifest, its MLflow tag).
    Events of one user at one moment keep their input order, so two logs that differ only in
    that order give other histories: they must not share a fingerprint (the job would have
    been taken for done, or resumed over the other log's parts)."""
    events, vocab = fitted
    tied = events.with_columns(pl.col(TIMESTAMP).dt.truncate("1d"))  # many ties per user
    reordered = tied.reverse()
    assert not scoring_sequences(tied, vocab=vocab).equals(
        scoring_sequences(reordered, vocab=vocab)
    )
    assert events_fingerprint(tied) != events_fingerprint(reordered)
    assert events_fingerprint(tied) == events_fingerprint(tied.clone())


def test_scoring_fingerprint_is_the_sum_of_row_hashes_whatever_the_slices(fitted, monkeypatch):
    """The digest hashes the rows a slice at a time (bounded memory on a large log); slices
    that end anywhere, and a frame in many chunks, give the whole frame's sum of row hashes,
    so a job's fingerprint (its resume manifest's key) is the one it always was."""
    events, _ = fitted
    whole = pipeline_module.events_fingerprint(events)
    with_index = events.with_row_index(pipeline_module.ROW)
    one_sum = int(np.sum(with_index.hash_rows(seed=0).to_numpy(), dtype=np.uint64))
    assert pipeline_module._frame_digest(with_index) == one_sum
    chunked = pl.concat([events.slice(o, 5) for o in range(0, events.height, 5)], rechunk=False)
    assert chunked.n_chunks() > 1
    for rows in (1, 7, events.height - 1, events.height, events.height + 1):
        monkeypatch.setattr(pipeline_module, "DIGEST_SLICE_ROWS", rows)
        assert pipeline_module.events_fingerprint(events) == whole
        assert pipeline_module.events_fingerprint(chunked) == whole


def test_scoring_with_as_of_before_every_event_fails_clearly(fitted):
    events, vocab = fitted
    with pytest.raises(ValueError, match="nothing to score"):
        scoring_sequences(events, vocab=vocab, as_of=datetime(2000, 1, 1, tzinfo=UTC))


def test_a_sigterm_while_preparing_leaves_nothing_behind(tmp_path):
    """A scheduler's kill (SIGTERM) ends the preparation as SystemExit(143) with the staging
    folder and its work files removed (by default SIGTERM ends the process on the spot)."""
    import signal
    import time

    from recsys.data.pipeline import _staging

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(SystemExit) as info, _staging(tmp_path / "out") as stage:
        (stage / "_work").mkdir()
        (stage / "_work" / "part-00000.parquet").write_text("half written")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode
    assert info.value.code == 143
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the default is back


def test_what_a_killed_preparation_left_is_removed_by_the_next_one(tmp_path):
    """SIGKILL (or a power cut) runs no cleanup: the staging folder, with the dataset so far
    and its work files, stayed beside the output, hidden, for good. The next preparation into
    that folder removes it, and an old dataset moved aside to delete; a running preparation's
    staging folder (held) and another folder's are left alone."""
    import subprocess
    import sys
    import uuid

    from recsys import locks

    killed = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from recsys.data.pipeline import _staging\n"
        "with _staging(Path(sys.argv[1])) as stage:\n"
        "    (stage / '_work').mkdir()\n"
        "    (stage / '_work' / 'part-00000.parquet').write_text('half written')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", killed, str(out)], capture_output=True)
    assert done.returncode == -9, done.stderr
    (dead,) = tmp_path.iterdir()  # the killed job's staging folder
    old = tmp_path / f".out.old-{uuid.uuid4().hex}"
    running = tmp_path / f".out.{uuid.uuid4().hex}"
    other = tmp_path / f".other.{uuid.uuid4().hex}"
    for folder in (old, running, other):
        folder.mkdir()
        (folder / "stats.json").write_text("{}")
    held = locks.hold_folder(running)
    try:
        prepare(synthetic(), out)
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name, "out"])


def test_a_full_disk_is_not_blamed_on_the_log(tmp_path, monkeypatch):
    """ENOSPC while the first pass sinks its work files names the output's disk, not the log
    ("could not be read"); nothing is left behind."""
    from recsys.data import pipeline

    def full(self, typed, stage):
        raise pl.exceptions.ComputeError("parquet: No space left on device (os error 28)")

    monkeypatch.setattr(pipeline._Partitions, "distribute", full)
    with pytest.raises(OSError, match=r"no space left on the device of .* larger disk"):
        prepare(synthetic(), tmp_path / "prep")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", ["polars", "python"])
def test_a_full_disk_while_writing_the_output_is_named(tmp_path, monkeypatch, error):
    """The same for the later writes (the sequences' sink, the vocabulary's files): an OSError
    naming the disk, not a bare polars ComputeError; nothing is left behind."""
    from recsys.data import pipeline

    def full(*args, **kwargs):
        if error == "polars":
            raise pl.exceptions.ComputeError("parquet: No space left on device (os error 28)")
        raise OSError(errno.ENOSPC, "No space left on device")

    target = (pl.LazyFrame, "sink_parquet") if error == "polars" else (pipeline.Vocab, "save")
    monkeypatch.setattr(*target, full)
    with pytest.raises(OSError, match=r"no space left on the device of .* larger disk"):
        prepare(synthetic(), tmp_path / "prep")
    assert list(tmp_path.iterdir()) == []


def test_stats_count_unknown_targets_only_where_there_is_a_target(tmp_path):
    """A late user whose every event falls in the test window, on items never seen in
    training, has no validation target: it adds nothing to val_targets_unknown_item (its UNK
    first event is no target), and its test target (an unknown item) is counted and set aside.
    12 events at distinct hours with 0.2 / 0.2 fractions: cuts at hours 6 and 8."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [  # (user, item, hour)
        (1, 1, 0), (1, 2, 1), (1, 1, 6), (1, 2, 9),
        (2, 2, 2), (2, 1, 3), (2, 2, 7), (2, 1, 8),
        (3, 1, 4), (3, 2, 5),
        (4, 9, 10), (4, 8, 11),
    ]  # fmt: skip
    events = pl.DataFrame(
        {
            USER: [u for u, _, _ in rows],
            ITEM: [i for _, i, _ in rows],
            CATEGORY: ["c"] * len(rows),
            EVENT_TYPE: ["view"] * len(rows),
            TIMESTAMP: [t0 + timedelta(hours=h) for _, _, h in rows],
        }
    )
    settings = replace(SETTINGS, split=SplitSettings(val_fraction=0.2, test_fraction=0.2))
    stats = prepare(events, tmp_path / "prep", settings)
    sequences = pl.read_parquet(tmp_path / "prep" / SEQUENCES_FILE).sort(USER)
    assert sequences[VAL_TARGET].to_list() == [2, 2, -1, -1]
    assert sequences[TEST_TARGET].to_list() == [3, 3, -1, -1]  # user 4's target: unknown item
    assert sequences.filter(pl.col(USER) == 4)[ITEMS].to_list() == [[UNK_IDX, UNK_IDX]]
    assert (stats["val_targets"], stats["val_targets_unknown_item"]) == (2, 0)
    assert (stats["test_targets"], stats["test_targets_unknown_item"]) == (2, 1)


def test_dated_item_table_takes_each_items_value_at_the_last_training_event(tmp_path):
    """A time-versioned item table: each item gets its latest value dated at or before the
    last training event (that moment included), a value without a date counts as the oldest,
    and of values dated alike the later row wins. Leave-one-out on 4 events per user: the
    training events are each user's first two, the last of them at hour 1."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [(1, 10, 0), (1, 11, 1), (1, 12, 2), (1, 13, 3)]
    rows += [(2, 12, 0), (2, 13, 1), (2, 10, 2), (2, 11, 3)]
    events = pl.DataFrame(
        {
            USER: [u for u, _, _ in rows],
            ITEM: [i for _, i, _ in rows],
            CATEGORY: ["from_events"] * len(rows),
            EVENT_TYPE: ["view"] * len(rows),
            TIMESTAMP: [t0 + timedelta(hours=h) for _, _, h in rows],
        }
    )
    day_before = t0 - timedelta(days=1)
    ties = [f"tie{k:02d}" for k in range(40)]
    table = [
        (10, "old", day_before),
        (10, "at_cut", t0 + timedelta(hours=1)),  # the last training event's moment: in force
        (10, "later", t0 + timedelta(hours=2)),  # after it: never seen
        (11, "dated", day_before),
        (11, "undated", None),  # no date: the oldest value, overridden by any dated one
        *[(12, name, day_before) for name in ties],  # one moment: the last row wins
    ]
    items = pl.DataFrame(
        {
            ITEM: [i for i, _, _ in table],
            CATEGORY: [c for _, c, _ in table],
            "valid_from": [t for _, _, t in table],
        },
        schema={ITEM: pl.Int64, CATEGORY: pl.String, "valid_from": pl.Datetime("us", "UTC")},
    )
    settings = replace(SETTINGS, split=SplitSettings(method="leave_one_out"))
    prepare_dataset(
        events,
        schema=SCHEMA,
        settings=settings,
        out_dir=tmp_path / "prep",
        items=items,
        item_columns={ITEM: ITEM, CATEGORY: CATEGORY, TIMESTAMP: "valid_from"},
    )
    vocab = Vocab.load(tmp_path / "prep")
    name_of = dict(zip(vocab.attributes[INDEX], vocab.attributes[ATTRIBUTE]))
    got = {
        item: [name_of[i] for i in indices]
        for item, indices in zip(vocab.items[ITEM], vocab.items[ATTRIBUTE_INDICES])
    }
    assert got == {10: ["at_cut"], 11: ["dated"], 12: ["tie39"], 13: ["from_events"]}


@pytest.mark.parametrize("dtype", [pl.Int32, pl.UInt32, pl.UInt64, pl.Categorical])
def test_ids_of_any_export_type_prepare_hash_and_round_trip_like_their_values(dtype, tmp_path):
    """User and item ids as Int32 / UInt32 (a Spark IntegerType) or Categorical (a pandas
    category column) prepare like the same ids as Int64 / text: the same fingerprint and
    vocabulary hash. For every type, UInt64 included, a checkpoint's vocabulary (to_plain /
    from_plain) hashes as the prepared folder's, which evaluation and init_from compare (an
    Int32 log's model was refused on its own data). Found by test_fuzz_prepare.py's audit."""
    import recsys.data as rd

    plain = pl.String if dtype == pl.Categorical else pl.Int64
    events = pl.DataFrame(
        {
            "user_id": pl.Series([1] * 4 + [2] * 4).cast(plain),
            "item_id": pl.Series([10, 11, 12, 10, 11, 12, 10, 11]).cast(plain),
            "timestamp": [1_700_000_000 + k for k in range(8)],
            "event_type": ["view"] * 8,
        }
    )
    typed = events.with_columns(pl.col("user_id", "item_id").cast(dtype))
    split = {"method": "leave_one_out"}
    expected = rd.prepare(events, tmp_path / "plain", split=split)
    typed.write_parquet(tmp_path / "typed.parquet")  # (a frame and its Parquet file alike)
    for name, source in (("frame", typed), ("file", tmp_path / "typed.parquet")):
        got = rd.prepare(source, tmp_path / name, split=split)
        if dtype != pl.UInt64:  # (a wider type than Int64: kept, so hashed as itself)
            assert got.stats["fingerprint"] == expected.stats["fingerprint"]
            assert got.stats["vocab_hash"] == expected.stats["vocab_hash"]
        saved = Vocab.load(tmp_path / name)
        assert Vocab.from_plain(saved.to_plain()).content_hash() == saved.content_hash()


def test_preparations_into_one_folder_at_once_each_succeed(tmp_path):
    """Two preparations into one folder at the same moment (a scheduler starting the same
    command twice): each succeeds and one's dataset stays, with no ``.old`` folder left beside
    it (the swap raised a bare OSError "Directory not empty" / FileNotFoundError)."""
    import threading

    from recsys.data.pipeline import _staging

    out, errors, barrier = tmp_path / "prepared", [], threading.Barrier(4)

    def prepare_repeatedly(worker):
        for round in range(25):
            barrier.wait()
            try:
                with _staging(out) as stage:
                    (stage / "stats.json").write_text(f"{worker} {round}")
            except Exception as err:
                errors.append(err)

    threads = [threading.Thread(target=prepare_repeatedly, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]
    assert [p.name for p in out.iterdir()] == ["stats.json"]


@pytest.mark.parametrize(
    "content", ["", '{"fingerprint": ', "[1, 2]"], ids=["empty", "cut", "list"]
)
def test_a_damaged_stats_file_is_named_with_the_fix(tmp_path, content):
    """A stats.json left empty or cut short (a full disk) raised a bare JSONDecodeError ("Expecting
    value: line 1 column 1"), naming no file; one that is not a JSON object an AttributeError
    further on."""
    (tmp_path / "stats.json").write_text(content)
    with pytest.raises(DataError, match="prepare the log again") as info:
        load_stats(tmp_path)
    assert str(tmp_path / "stats.json") in str(info.value)


@pytest.mark.parametrize(
    "version, says",
    [
        (None, "from before prepared folders recorded their format"),
        (FORMAT_VERSION + 1, "or read it with the newer recsys that prepared it"),
    ],
    ids=["older", "newer"],
)
def test_a_folder_of_another_format_is_refused_by_name(tmp_path, version, says):
    """A folder prepared by another version of recsys was read as if it were this one's: one
    prepared before Int32 ids were prepared as Int64 trained a whole model, whose evaluation
    then refused its own data ('prepared with another vocabulary', the same fingerprint on
    both sides); one prepared before CSV categories were read as written (007 as 7.0) trained
    on merged categories, silently. stats.json records the folder's format, and another (or
    none) is refused, naming the folder and the fix, before anything reads it."""
    out = tmp_path / "prep"
    prepare(synthetic(), out)
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["format_version"] == FORMAT_VERSION
    if version is None:
        del stats["format_version"]
    else:
        stats["format_version"] = version
    (out / STATS_FILE).write_text(json.dumps(stats))
    with pytest.raises(DataError, match=says) as info:
        load_stats(out)
    fix = f"prepare the log again into it (python -m pipelines.prepare data.prepared_dir={out})"
    assert f"{out} was prepared" in str(info.value) and fix in str(info.value)
    with pytest.raises(DataError, match=says):
        PreparedDataset.load(out)
    prepare(synthetic(), out)  # the fix it names: prepared again, the folder is read
    assert load_stats(out)["format_version"] == FORMAT_VERSION


def test_paths_starting_with_a_tilde_are_the_home_folders(tmp_path, monkeypatch):
    """recsys took "~/..." literally where polars, which expands it, read and wrote the home
    folder's: an event log there "does not exist", and an output folder "~/prep" was staged in
    a folder named "~" under the working directory, then polars' writes into the home's
    failed with a bare FileNotFoundError. Every data path now means the home folder's."""
    from omegaconf import OmegaConf

    from recsys.data import io
    from recsys.tasks.prepare import prepared

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home" / "logs").mkdir(parents=True)
    synthetic().write_parquet(tmp_path / "home" / "logs" / "a.parquet")
    synthetic(seed=5).write_parquet(tmp_path / "home" / "logs" / "b.parquet")
    stats, _ = prepare_dataset(
        "~/logs/a.parquet", schema=SCHEMA, settings=SETTINGS, out_dir="~/prep"
    )
    assert stats["source"] == "~/logs/a.parquet"  # (as the user named it)
    assert sorted(os.listdir(tmp_path)) == ["home"]  # no folder named "~"
    assert sorted(os.listdir(tmp_path / "home")) == ["logs", "prep"]
    assert PreparedDataset.load("~/prep").stats == stats
    cfg = OmegaConf.create({"data": {"prepared_dir": "~/missing"}})
    with pytest.raises(FileNotFoundError, match="home/missing holds no prepared dataset"):
        prepared(cfg)
    locate = io.row_locator("~/logs/*.parquet", SCHEMA)  # (the rows of a glob's files)
    assert locate(0) == "row 0 of a.parquet"


def test_a_folder_an_earlier_recsys_prepared_with_empty_ids_is_named_as_it_is_read(
    tmp_path, monkeypatch, caplog
):
    """Before an empty text id read as missing, a log's "" ids (an anonymous visitor, a lost
    item id) were prepared as one user and one item like any other. Such a folder, reused with
    data.prepared_dir (or a run folder resumed), was trained and evaluated on without a word,
    though a preparation of the same log now sets those rows aside. Reading it now warns,
    naming the folder, both ids and the fix."""
    from recsys.data import validate
    from recsys.data.datamodule import SeqRecDataModule

    events = synthetic().with_columns(pl.col(USER).cast(pl.String), pl.col(ITEM).cast(pl.String))
    first_user, first_item = events[USER][0], events[ITEM][0]
    events = events.with_columns(
        pl.when(pl.col(USER) == first_user).then(pl.lit("")).otherwise(pl.col(USER)).alias(USER),
        pl.when(pl.col(ITEM) == first_item).then(pl.lit("")).otherwise(pl.col(ITEM)).alias(ITEM),
    )
    with monkeypatch.context() as earlier:  # the earlier rule: "" is an id like any other
        earlier.setattr(
            validate, "canonical_ids", lambda column, dtype: pl.col(column).cast(pl.String)
        )
        prepare(events, tmp_path / "old")
    module = SeqRecDataModule(tmp_path / "old", max_seq_len=8)
    with caplog.at_level("WARNING"):
        module.setup()
    assert "" in module.store.user_id.to_list()  # (read as it is: a model trained there)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert str(tmp_path / "old") in warned[0]
    assert 'user id ""' in warned[0] and 'item id ""' in warned[0]
    assert "null_id" in warned[0] and "prepare" in warned[0]
    caplog.clear()
    prepare(events, tmp_path / "new", replace(SETTINGS, bad_rows=BadRowPolicy(null_id="drop")))
    with caplog.at_level("WARNING"):
        SeqRecDataModule(tmp_path / "new", max_seq_len=8).setup()
    assert 'id ""' not in caplog.text


def test_a_folder_an_earlier_recsys_prepared_with_float_user_ids_reads_them_as_integers(
    tmp_path, monkeypatch
):
    """Before whole-number float ids were read as integers, a log of user ids that pandas made
    float (one missing id) was prepared with Float64 user ids (1030940.0). The folder's
    vocabulary reads back with today's rule (Int64 item ids), but its user ids stayed Float64:
    a per-target file of pipelines.evaluate on the folder, ds.events() and ds.sequences() named
    users 1030940.0 beside items 98066, and another dtype than the same log prepared now."""
    from recsys.data import io

    events = synthetic().with_columns(pl.col(USER).cast(pl.Float64) + 1_000_000)
    with monkeypatch.context() as earlier:  # the earlier rule: float ids stay float
        earlier.setattr(io, "whole_number_ids", lambda lf, columns: lf)
        prepare(events, tmp_path / "old")
    assert pl.read_parquet_schema(tmp_path / "old" / SEQUENCES_FILE)[USER] == pl.Float64
    prepare(events, tmp_path / "new")
    now = SequenceStore.from_parquet(tmp_path / "new" / SEQUENCES_FILE).user_id
    assert now.dtype == pl.Int64
    store = SequenceStore.from_parquet(tmp_path / "old" / SEQUENCES_FILE)
    assert_series_equal(store.user_id, now)
    old, new = PreparedDataset.load(tmp_path / "old"), PreparedDataset.load(tmp_path / "new")
    assert_frame_equal(old.events(), new.events())
    assert_frame_equal(old.sequences(), new.sequences())
