"""Bounded-memory preparation: splitting the work into user partitions must not change the
result. The same log prepared in one partition and in many gives identical sequences (up to
user order), vocabularies, quarantine and statistics."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import recsys.data as rd
from recsys.data.synthetic import generate_events

OPTIONS = {
    "columns": {"category": "category"},
    "min_user_events": 3,
    "min_item_events": 3,  # iterative k-core across partitions
    "max_user_events": 40,
    "session_gap_seconds": 1800,
    "bad_rows": {"duplicate": "drop", "future_timestamp": "drop"},
}


@pytest.fixture(scope="module")
def log() -> pl.DataFrame:
    events = generate_events(num_users=150, num_items=120, num_categories=8, seed=17)
    future = events.sample(4, seed=2).with_columns(
        pl.col("timestamp").dt.offset_by("100y")  # bad rows: set aside before the sort
    )
    return pl.concat([events, events.sample(25, seed=1), future])  # repeats to quarantine


@pytest.mark.parametrize("split", ["temporal", "leave_one_out"])
def test_many_partitions_equal_one(log, tmp_path, split):
    one = rd.prepare(log, tmp_path / "one", split={"method": split}, **OPTIONS)
    many = rd.prepare(
        log, tmp_path / "many", split={"method": split}, partition_rows=1000, **OPTIONS
    )
    for ds in (one, many):  # every history is in time order
        times = ds.sequences()["timestamp"]
        assert (times.list.eval(pl.element().diff().min()).explode().fill_null(0) >= 0).all()
    assert one.stats["partitions"] == 1
    assert many.stats["partitions"] == -(-log.height // 1000)
    assert_frame_equal(one.sequences().sort("user_id"), many.sequences().sort("user_id"))
    assert_frame_equal(one.vocab.items, many.vocab.items)
    assert_frame_equal(one.vocab.attributes, many.vocab.attributes)
    assert_frame_equal(one.quarantine(), many.quarantine())
    different = {k for k in one.stats if one.stats[k] != many.stats[k] and k not in ("as_of",)}
    assert different == {"partitions", "settings"}
    assert one.stats["fingerprint"] != ""
    assert one.stats["duplicates_removed"] == 25
    assert one.stats["bad_rows"] == {"future_timestamp": 4, "duplicate": 25}
    assert one.quarantine().height == 29
    assert one.stats["sessions"] > one.stats["users"]
    assert one.stats["events_removed_by_kcore"] > 0


@pytest.mark.parametrize("split", ["temporal", "leave_one_out"])
def test_frames_in_several_chunks_equal_one(log, tmp_path, monkeypatch, split):
    """polars 1.43's in-memory engine handed back a partition's final events in several
    chunks, on which the positional split's streamed run lengths panicked (``assertion failed:
    chunks.len() == 1``; a floors audit's finding). A stage's frame kept in memory is one chunk
    again: the same result as from frames of one chunk."""
    from recsys.data import pipeline

    one = rd.prepare(log, tmp_path / "one", split={"method": split}, **OPTIONS)
    write = pipeline._Partitions.write

    def in_pieces(self, frame, stage, index):
        pieces = [frame.slice(start, 100) for start in range(0, frame.height, 100)]
        write(self, pl.concat(pieces, rechunk=False) if pieces else frame, stage, index)

    monkeypatch.setattr(pipeline._Partitions, "write", in_pieces)
    pieces = rd.prepare(log, tmp_path / "pieces", split={"method": split}, **OPTIONS)
    assert_frame_equal(one.sequences(), pieces.sequences())
    assert_frame_equal(one.vocab.items, pieces.vocab.items)
    assert {k: v for k, v in one.stats.items() if k != "as_of"} == {
        k: v for k, v in pieces.stats.items() if k != "as_of"
    }


def test_sequences_are_flat_arrow_lists(log, tmp_path):
    """Training reads flat buffers + offsets, never Python lists per user."""
    import pyarrow.parquet as pq

    from recsys.data.dataset import SequenceStore

    ds = rd.prepare(log, tmp_path / "p", split={"method": "leave_one_out"}, **OPTIONS)
    table = pq.read_table(ds.path / "sequences.parquet")
    store = SequenceStore.from_table(table)
    assert store.item.ndim == 1 and len(store.item) == ds.stats["events"]
    assert store.offsets[-1] == ds.stats["events"]


def test_duplicates_refused_count_every_partition(log, tmp_path):
    """duplicate=error counts the repeats of the whole log, as one partition does, and quotes
    the log's first ones (it stopped at the first partition that had any)."""
    options = {**OPTIONS, "bad_rows": {"duplicate": "error", "future_timestamp": "drop"}}
    messages = []
    for name, rows in (("one", {}), ("many", {"partition_rows": 1000})):
        with pytest.raises(
            rd.DataError, match=r"25 row\(s\) repeating an earlier identical"
        ) as info:
            rd.prepare(log, tmp_path / name, **options, **rows)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("split", ["leave_one_out", "leave_last_n"])
def test_positional_training_window_is_found_per_partition(log, tmp_path, monkeypatch, split):
    """A positional split's training window (each user's events but the last ones) needs
    per-user counts: found over the whole log at once, it held every event in memory (100 M
    events: 3.4 GiB peak against 2.1 GiB for a temporal split). It is found one partition at a
    time, each holding users of its own, and the vocabulary is the same as with one partition."""
    from recsys.data import pipeline

    seen: list[set] = []

    def spy(lf, settings, points):
        seen.append(set(lf.select("user_id").collect()["user_id"].to_list()))
        return training_events(lf, settings, points)

    training_events = pipeline.training_events
    monkeypatch.setattr(pipeline, "training_events", spy)
    options = {**OPTIONS, "split": {"method": split}}
    many = rd.prepare(log, tmp_path / "many", partition_rows=1000, **options)
    assert len(seen) == many.stats["partitions"] > 1
    assert sum(len(users) for users in seen) == len(set().union(*seen)) == many.stats["users"]
    monkeypatch.undo()
    one = rd.prepare(log, tmp_path / "one", **options)
    assert_frame_equal(one.vocab.items, many.vocab.items)
    assert_frame_equal(one.vocab.attributes, many.vocab.attributes)
    assert_frame_equal(one.sequences().sort("user_id"), many.sequences().sort("user_id"))
