"""Tests for recsys.data.io and recsys.data.validate, driven through ``load_events`` and
``prepare_dataset``: every way a log can be malformed gives an actionable error and writes
nothing; every supported way of handing over a log is read to the same canonical frame."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys.data.io import SIDE_BY_SIDE, DataError, read_side_by_side, read_user_list, scan_events
from recsys.data.pipeline import PrepareSettings, load_events, prepare_dataset
from recsys.data.synthetic import generate_events
from recsys.data.validate import BadRowPolicy
from recsys.schema import (
    ATTRIBUTES,
    CATEGORY,
    EVENT_TYPE,
    ITEM,
    SESSION,
    TIMESTAMP,
    USER,
    EventSchema,
)

# A schema without the optional category column: most hand-written logs below have none.
NO_CATEGORY = {USER: USER, ITEM: ITEM, TIMESTAMP: TIMESTAMP, EVENT_TYPE: EVENT_TYPE}
SCHEMA = EventSchema(columns=NO_CATEGORY)
HEADER = "user_id,item_id,timestamp,event_type\n"
BAD_ROWS = "bad rows (row numbers are 0-based, header excluded), nothing was written:"
BEHAVIORS = "['view', 'click', 'cart', 'purchase']"
NULL_ID_FIX = "fix: fill the ids upstream (or delete blank lines), or data.bad_rows.null_id=drop"
TIMESTAMP_FIX = (
    "fix: use Unix seconds (data.timestamp_unit=s), milliseconds (data.timestamp_unit=ms) or "
    "ISO 8601, or data.bad_rows.bad_timestamp=drop"
)
BEHAVIOR_FIX = (
    "fix: add them to data.behaviors or map them with +data.behavior_aliases.<name>=<behavior>, "
    "or data.bad_rows.unknown_behavior=drop"
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def prepare_fails(
    tmp_path: Path, source, schema: EventSchema = SCHEMA, match: str | None = None
) -> str:
    """Run ``prepare_dataset`` expecting a DataError; check that nothing (no output folder, no
    temporary sibling) was written next to the inputs, and return the message."""
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(DataError, match=match) as info:
        prepare_dataset(
            source, schema=schema, settings=PrepareSettings(), out_dir=tmp_path / "prep"
        )
    after = {p.name for p in tmp_path.iterdir()}
    assert after == before, f"a failed prepare left {sorted(after - before)} behind"
    return str(info.value)


def instants(df: pl.DataFrame) -> list[datetime]:
    return df[TIMESTAMP].to_list()


def problem_lines(message: str, source: str) -> list[str]:
    """The per-kind lines of a bad-row error, after checking its header."""
    header, *lines = message.split("\n")
    assert header == f"{source}: {BAD_ROWS}"
    assert all(line.startswith("  - ") for line in lines)
    return [line[4:] for line in lines]


@pytest.fixture(scope="module")
def small_log() -> pl.DataFrame:
    return generate_events(num_users=40, num_items=60, num_categories=5, seed=11)


# -- failures: each names the problem and the fix, and leaves nothing behind ------------------


def test_missing_column_names_file_column_and_mapping_fix(tmp_path):
    path = write(tmp_path / "in", "log.csv", "user_id,item_id,ts,event_type\n1,2,10,view\n")
    message = prepare_fails(tmp_path, path)
    assert str(path) in message
    assert "'timestamp'" in message
    assert "data.columns.timestamp=" in message
    # the columns that *are* there are listed, so the user can pick the right one
    assert "'ts'" in message


def test_missing_category_column_when_mapped(tmp_path):
    path = write(tmp_path / "in", "log.csv", HEADER + "1,2,10,view\n")
    message = prepare_fails(tmp_path, path, schema=EventSchema())
    assert "'category'" in message
    assert "data.columns.category=" in message


def test_empty_csv_file(tmp_path):
    path = write(tmp_path / "in", "log.csv", "")
    message = prepare_fails(tmp_path, path)
    assert str(path) in message
    assert "empty" in message


def test_header_only_csv(tmp_path):
    path = write(tmp_path / "in", "log.csv", HEADER)
    message = prepare_fails(tmp_path, path)
    assert str(path) in message
    assert "no rows" in message


@pytest.mark.parametrize("name", ["log.txt", "log.json", "log"])
def test_unsupported_extension(tmp_path, name):
    path = write(tmp_path / "in", name, HEADER + "1,2,10,view\n")
    message = prepare_fails(tmp_path, path)
    assert str(path) in message
    assert "unsupported file type" in message
    assert ".csv" in message and ".parquet" in message


@pytest.mark.parametrize(
    ("content", "kind"),
    [(b"PAR1\x15\x04", "is a Parquet file.*rename it to .parquet"), (b"\x1f\x8b\x08", "gzip")],
)
def test_a_binary_file_named_csv_is_recognised(tmp_path, content, kind):
    path = tmp_path / "in" / "log.csv"
    path.parent.mkdir()
    path.write_bytes(content + b"\x00" * 64)
    message = prepare_fails(tmp_path, path, match=kind)
    assert str(path) in message


def test_a_folder_file_without_a_mapped_column_is_named(tmp_path):
    folder = tmp_path / "in"
    write(folder, "a.csv", HEADER + "1,2,10,view\n")
    write(folder, "b.csv", "user_id,item_id,ts,event_type\n1,3,11,view\n")
    message = prepare_fails(tmp_path, folder, match="lacks column")
    assert str(folder / "b.csv") in message and "['timestamp']" in message


def test_nonexistent_path(tmp_path):
    path = tmp_path / "in" / "missing.csv"
    message = prepare_fails(tmp_path, path)
    assert str(path) in message
    assert "does not exist: check data.source (a loader's data.source.path)" in message


def test_unparseable_timestamps_are_counted_and_quoted(tmp_path):
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER
        + "1,2,2024-01-01T00:00:00Z,view\n"
        + "1,3,not-a-time,view\n"
        + "2,3,2024-13-45,view\n"
        + "2,4,2024-01-02T00:00:00Z,view\n",
    )
    message = prepare_fails(tmp_path, path)
    assert problem_lines(message, str(path)) == [
        "2 row(s) whose timestamp (column 'timestamp') could not be parsed [bad_timestamp] "
        f"(row 1: 'not-a-time', row 2: '2024-13-45'); {TIMESTAMP_FIX}"
    ]


def test_empty_timestamps_are_named_as_empty_with_their_own_fix(tmp_path):
    """A missing timestamp is not a unit or format problem: the fix says to fill it (a format
    loader reads a probably cut last line's last field as empty)."""
    good = "1,2,2024-01-01T00:00:00Z,view\n2,4,2024-01-02T00:00:00Z,view\n"
    fill = (
        "fix: fill the empty timestamps upstream (a file whose last line has no line end has "
        "that line's last field read as empty: see the warning above, if any)"
    )
    path = write(tmp_path / "in", "log.csv", HEADER + good + "1,3,,view\n")
    assert problem_lines(prepare_fails(tmp_path, path), str(path)) == [
        "1 row(s) with an empty timestamp (column 'timestamp') [bad_timestamp] (row 2: None); "
        f"{fill}, or data.bad_rows.bad_timestamp=drop"
    ]
    path = write(tmp_path / "in2", "log.csv", HEADER + good + "1,3,,view\n2,3,garbage,view\n")
    assert problem_lines(prepare_fails(tmp_path, path), str(path)) == [
        "2 row(s) whose timestamp (column 'timestamp') could not be parsed (1 of them empty) "
        f"[bad_timestamp] (row 2: None, row 3: 'garbage'); {fill}; {TIMESTAMP_FIX[5:]}"
    ]


def test_null_ids_are_counted_and_quoted(tmp_path):
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER + ",2,10,view\n1,,11,view\n,,12,view\n1,3,13,view\n",
    )
    message = prepare_fails(tmp_path, path)
    # a row with both ids null is one bad row
    assert problem_lines(message, str(path)) == [
        "3 row(s) with a null or empty user or item id (columns 'user_id' / 'item_id') [null_id] "
        f"(row 0, row 1, row 2); {NULL_ID_FIX}"
    ]


def test_examples_are_the_first_three_rows_of_a_kind(tmp_path):
    body = "".join(f"{u},{i},{t},view\n" for u, i, t in [(1, 2, 10), (1, "", 11)] * 4)
    path = write(tmp_path / "in", "log.csv", HEADER + body)
    message = prepare_fails(tmp_path, path)
    assert problem_lines(message, str(path)) == [
        "4 row(s) with a null or empty user or item id (columns 'user_id' / 'item_id') [null_id] "
        f"(row 1, row 3, row 5); {NULL_ID_FIX}"
    ]


def test_null_ids_message_names_the_users_column(tmp_path):
    schema = EventSchema(
        columns={USER: "visitor", ITEM: "sku", TIMESTAMP: "ts", EVENT_TYPE: "event"}
    )
    frame = pl.DataFrame(
        {"visitor": [None, 1], "sku": [1, 2], "ts": [10, 11], "event": ["view", "view"]}
    )
    message = prepare_fails(tmp_path, frame, schema=schema)
    assert problem_lines(message, "<in-memory polars frame>") == [
        "1 row(s) with a null or empty user or item id (columns 'visitor' / 'sku') [null_id] "
        "(row 0); " + NULL_ID_FIX
    ]


def test_unknown_event_types_are_listed_with_alias_hint(tmp_path):
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER + "1,2,10,view\n1,3,11,wishlist\n2,3,12,share\n2,4,13,wishlist\n",
    )
    message = prepare_fails(tmp_path, path)
    assert problem_lines(message, str(path)) == [
        f"3 row(s) with an event type (column 'event_type') outside {BEHAVIORS} "
        "[unknown_behavior] (names ['share', 'wishlist']; row 1: 'wishlist', row 2: 'share', "
        f"row 3: 'wishlist'); {BEHAVIOR_FIX}"
    ]


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER + ",2,2024-01-01,view\n1,3,garbage,view\n1,4,2024-01-01,teleport\n",
    )
    message = prepare_fails(tmp_path, path)
    # one line per kind, in the documented order, each with its fix
    assert problem_lines(message, str(path)) == [
        "1 row(s) with a null or empty user or item id (columns 'user_id' / 'item_id') [null_id] "
        f"(row 0); {NULL_ID_FIX}",
        "1 row(s) whose timestamp (column 'timestamp') could not be parsed [bad_timestamp] "
        f"(row 1: 'garbage'); {TIMESTAMP_FIX}",
        f"1 row(s) with an event type (column 'event_type') outside {BEHAVIORS} "
        f"[unknown_behavior] (names ['teleport']; row 2: 'teleport'); {BEHAVIOR_FIX}",
    ]


def test_timestamps_before_1970_and_after_as_of(tmp_path):
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER + "1,1,1969-12-31T23:59:59Z,view\n1,2,2024-01-01,view\n1,3,2024-06-02,view\n",
    )
    as_of = utc(2024, 6, 1)
    with pytest.raises(DataError) as info:
        load_events(path, SCHEMA, as_of=as_of)
    assert problem_lines(str(info.value), str(path)) == [
        "1 row(s) with a timestamp before 1970-01-01 (column 'timestamp') [negative_timestamp] "
        "(row 0: '1969-12-31T23:59:59Z'); fix: check the unit (data.timestamp_unit) and the "
        "sign, or data.bad_rows.negative_timestamp=drop",
        "1 row(s) with a timestamp after as_of=2024-06-01T00:00:00+00:00 (column 'timestamp') "
        "[future_timestamp] (row 2: '2024-06-02'); fix: check the unit (data.timestamp_unit: s "
        "or ms), set data.as_of to the log's end, or data.bad_rows.future_timestamp=drop",
    ]
    # with the policy set to drop, the same rows are set aside and the rest is read
    policy = BadRowPolicy(negative_timestamp="drop", future_timestamp="drop")
    events = load_events(path, SCHEMA, bad_rows=policy, as_of=as_of)
    assert events[ITEM].to_list() == [2]


def test_an_event_at_as_of_or_at_the_epoch_is_not_a_bad_row(tmp_path):
    """The bounds are exclusive: "after as_of" and "before 1970-01-01" leave an event at
    exactly as_of, or exactly at the epoch, in the log."""
    path = write(
        tmp_path / "in",
        "log.csv",
        HEADER + "1,1,1970-01-01T00:00:00Z,view\n1,2,2024-06-01T00:00:00Z,view\n",
    )
    events = load_events(path, SCHEMA, as_of=utc(2024, 6, 1))
    assert events[ITEM].to_list() == [1, 2]
    assert instants(events) == [utc(1970, 1, 1), utc(2024, 6, 1)]


def test_future_rows_without_as_of_name_the_moment_used(tmp_path):
    path = write(tmp_path / "in", "log.csv", HEADER + "1,1,2024-01-01,view\n1,2,2999-01-01,view\n")
    with pytest.raises(DataError) as info:
        load_events(path, SCHEMA)
    assert "[future_timestamp]" in str(info.value)
    assert "as_of=None" not in str(info.value)


def test_empty_in_memory_frame(tmp_path):
    frame = pl.DataFrame(
        {USER: [], ITEM: [], TIMESTAMP: [], EVENT_TYPE: []},
        schema={USER: pl.Int64, ITEM: pl.Int64, TIMESTAMP: pl.Int64, EVENT_TYPE: pl.String},
    )
    message = prepare_fails(tmp_path, frame)
    assert "in-memory polars frame" in message
    assert "no rows" in message


def test_unsupported_source_type():
    with pytest.raises(DataError, match="cannot read events from dict"):
        load_events({"user_id": [1]}, SCHEMA)


def test_schema_rejects_unmapped_required_column():
    message = r"data.columns must map \['item_id'\]: set data\.columns\.<name>="
    with pytest.raises(ValueError, match=message):
        EventSchema(columns={USER: "u", TIMESTAMP: "t", EVENT_TYPE: "e"})
    with pytest.raises(ValueError, match=r"must map \['user_id', 'item_id'\]"):
        EventSchema(columns={TIMESTAMP: "t"})
    # timestamp and event type are optional: order-only logs, a single behaviour
    assert EventSchema(columns={USER: "u", ITEM: "i"}).has(TIMESTAMP) is False


def test_schema_rejects_unknown_canonical_names():
    with pytest.raises(ValueError, match=r"unknown keys \['price'\]"):
        EventSchema(columns={USER: "u", ITEM: "i", "price": "p"})


def test_folder_of_mixed_file_types(tmp_path):
    folder = tmp_path / "in"
    write(folder, "a.csv", HEADER + "1,2,10,view\n")
    pl.DataFrame({USER: [1], ITEM: [2], TIMESTAMP: [11], EVENT_TYPE: ["view"]}).write_parquet(
        folder / "b.parquet"
    )
    message = prepare_fails(tmp_path, folder)
    assert "mixes file types" in message


def test_a_folder_file_of_another_type_is_refused_by_name_not_left_out(tmp_path, small_log):
    """A compressed part beside plain ones (``.csv.bz2``, pandas' ``.parquet.gzip``) would
    drop its rows unseen: refused, naming it and the glob that reads the rest on purpose."""
    folder = tmp_path / "in"
    folder.mkdir()
    half = small_log.height // 2
    small_log[:half].write_csv(folder / "part-0.csv")
    small_log[half:].write_csv(folder / "part-1.csv.bz2")  # (its content does not matter)
    message = prepare_fails(tmp_path, folder, schema=EventSchema(), match="does not read")
    assert "['part-1.csv.bz2']" in message and str(folder / "*.csv") in message
    assert load_events(str(folder / "*.csv"), EventSchema()).height == half


def test_a_linked_subfolder_is_read_like_a_linked_file(tmp_path, small_log):
    folder, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    half = small_log.height // 2
    small_log[:half].write_parquet(folder / "part-0.parquet")
    small_log[half:].write_parquet(elsewhere / "part-1.parquet")
    (folder / "z-linked").symlink_to(elsewhere, target_is_directory=True)  # read after
    (elsewhere / "back").symlink_to(folder, target_is_directory=True)  # a loop: read once
    assert_frame_equal(load_events(folder, EventSchema()), load_events(small_log, EventSchema()))


def test_an_output_folder_inside_the_log_folder_is_refused(tmp_path, small_log):
    """Every file under a log folder is read: a second run would read the prepared files."""
    folder = tmp_path / "in"
    folder.mkdir()
    small_log.write_parquet(folder / "events.parquet")
    with pytest.raises(DataError, match="inside the event log's folder") as info:
        prepare_dataset(
            folder, schema=EventSchema(), settings=PrepareSettings(), out_dir=folder / "prep"
        )
    assert "Choose an output folder outside" in str(info.value)
    assert [p.name for p in folder.iterdir()] == ["events.parquet"]


def test_a_mapped_pandas_column_named_twice_is_refused_and_unmapped_extras_are_ignored(tmp_path):
    frame = generate_events(num_users=20, num_items=60, num_categories=5, seed=3).to_pandas()
    twice = pd.concat([frame, frame[[EVENT_TYPE]]], axis=1)
    message = prepare_fails(tmp_path, twice, schema=EventSchema(), match="several columns named")
    assert "['event_type']" in message
    # unmapped columns, repeated or of no single type, are not the log's business
    extras = frame.assign(notes=[{"a": 1}, "text"] * (len(frame) // 2) + [1] * (len(frame) % 2))
    extras = pd.concat([extras, extras[["notes"]]], axis=1)  # two columns named notes
    assert_frame_equal(load_events(extras, EventSchema()), load_events(frame, EventSchema()))


def test_fixed_utc_offsets_in_parquet_and_arrow_backed_pandas_are_utc_instants(tmp_path):
    """pandas writes "...+05:30" strings as timestamp[us, tz=+05:30]; polars' Parquet reader
    panics on such a zone in any column, and its frame conversion refuses it."""
    import pyarrow as pa

    frame = generate_events(num_users=20, num_items=60, num_categories=5, seed=3).to_pandas()
    reference = load_events(frame, EventSchema())
    offset = frame.assign(
        timestamp=frame[TIMESTAMP].dt.tz_convert("+05:30"),
        created=frame[TIMESTAMP].dt.tz_convert("-03:00"),  # not mapped: must not stop the read
    )
    offset.to_parquet(tmp_path / "offset.parquet")
    assert_frame_equal(load_events(tmp_path / "offset.parquet", EventSchema()), reference)
    arrow = frame.assign(
        timestamp=frame[TIMESTAMP].astype(pd.ArrowDtype(pa.timestamp("us", tz="+05:30")))
    )
    assert_frame_equal(load_events(arrow, EventSchema()), reference)


def test_a_blank_line_is_called_one_in_the_null_id_message(tmp_path):
    path = write(tmp_path / "in", "log.csv", HEADER + "1,2,10,view\n,,,\n1,3,11,view\n\n")
    message = prepare_fails(tmp_path, path, match="null or empty user or item id")
    assert "row 1 (every mapped column empty: a blank line?)" in message


def test_a_log_that_falls_before_1980_is_named_with_the_unit(tmp_path, small_log, caplog):
    """Seconds read as milliseconds: valid instants in January 1970, so no bad row; the log
    says so. A log of today says nothing."""
    seconds = small_log.with_columns(pl.col(TIMESTAMP).dt.epoch("s"))
    settings = PrepareSettings()
    with caplog.at_level("WARNING"):
        prepare_dataset(
            seconds,
            schema=EventSchema(timestamp_unit="ms"),
            settings=settings,
            out_dir=tmp_path / "a",
        )
    assert "every event falls before 1980" in caplog.text
    assert "read as Unix milliseconds (data.timestamp_unit=ms)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare_dataset(small_log, schema=EventSchema(), settings=settings, out_dir=tmp_path / "b")
    assert "falls before" not in caplog.text


def test_a_bad_row_of_a_folder_is_named_by_its_file_and_its_row_there(tmp_path):
    folder = tmp_path / "in"
    write(folder, "a.csv", HEADER + "1,2,10,view\n1,3,11,view\n")
    write(folder, "b.csv", HEADER + "2,2,10,view\n2,3,2023-02-30,view\n")
    message = prepare_fails(tmp_path, folder, match="could not be parsed")
    assert "(row 1 of b.csv: '2023-02-30')" in message


def test_datetimes_in_one_file_and_numbers_in_another_are_refused(tmp_path, small_log):
    folder = tmp_path / "in"
    folder.mkdir()
    small_log[:10].write_parquet(folder / "a.parquet")
    small_log[10:].with_columns(pl.col(TIMESTAMP).dt.epoch("s")).write_parquet(folder / "b.parquet")
    message = prepare_fails(tmp_path, folder, schema=EventSchema(), match="holds datetimes in")
    assert "a.parquet but numbers (Int64 in b.parquet)" in message


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("1,2,10,view\n1,3,11,view,extra\n", "line 3 has 5 fields where the header has 4"),
        ('1,2,10,view\n1,"3,11,view\n1,4,12,view\n', "a quote opened on line 3 is never closed"),
    ],
    ids=["extra field", "open quote"],
)
def test_a_malformed_csv_line_is_named(tmp_path, body, where):
    path = write(tmp_path / "in", "log.csv", HEADER + body)
    message = prepare_fails(tmp_path, path, match="could not be read as CSV")
    assert where in message


def test_a_session_gap_on_an_order_only_log_is_refused(tmp_path, small_log):
    """Its times are row numbers a microsecond apart: every user would be one session."""
    schema = EventSchema(columns={USER: USER, ITEM: ITEM, TIMESTAMP: None, EVENT_TYPE: None})
    settings = PrepareSettings(session_gap_seconds=1800)
    with pytest.raises(ValueError, match="the log is order-only"):
        prepare_dataset(small_log, schema=schema, settings=settings, out_dir=tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_failure_keeps_an_existing_prepared_folder(tmp_path, small_log):
    out = tmp_path / "prep"
    prepare_dataset(small_log, schema=EventSchema(), settings=PrepareSettings(), out_dir=out)
    before = sorted(p.name for p in out.iterdir())
    bad = small_log.with_columns(pl.lit("teleport").alias(EVENT_TYPE))
    with pytest.raises(DataError):
        prepare_dataset(bad, schema=EventSchema(), settings=PrepareSettings(), out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["prep"]


# -- reading: mappings, aliases, timestamps ---------------------------------------------------


def test_renamed_columns_are_mapped_and_extra_columns_dropped():
    schema = EventSchema(
        columns={
            USER: "visitorid",
            ITEM: "itemid",
            TIMESTAMP: "ts",
            EVENT_TYPE: "event",
            CATEGORY: "cat",
        }
    )
    frame = pl.DataFrame(
        {
            "ts": [100, 200],
            "visitorid": ["u1", "u2"],
            "junk": [1.5, 2.5],
            "itemid": [7, 8],
            "event": ["view", "cart"],
            "cat": [3, None],
        }
    )
    expected = pl.DataFrame(
        {
            USER: ["u1", "u2"],
            ITEM: [7, 8],
            TIMESTAMP: [utc(1970, 1, 1, 0, 1, 40), utc(1970, 1, 1, 0, 3, 20)],
            EVENT_TYPE: ["view", "cart"],
            ATTRIBUTES: [["3"], None],  # a category is an attribute set of one
        },
        schema={
            USER: pl.String,
            ITEM: pl.Int64,
            TIMESTAMP: pl.Datetime("us", "UTC"),
            EVENT_TYPE: pl.String,
            ATTRIBUTES: pl.List(pl.String),
        },
    )
    assert_frame_equal(load_events(frame, schema), expected)


def test_order_only_log_without_timestamp_and_event_type():
    # e.g. the S3-Rec files: each user's events in input order, one behaviour
    schema = EventSchema(columns={USER: "u", ITEM: "i"})
    frame = pl.DataFrame({"u": ["b", "a", "b"], "i": [3, 1, 2], "ignored": [0, 0, 0]})
    epoch = utc(1970, 1, 1)
    expected = pl.DataFrame(
        {
            USER: ["b", "a", "b"],
            ITEM: [3, 1, 2],
            # 1970-01-01 + the input row number in microseconds: input order, no time gaps
            TIMESTAMP: [epoch + timedelta(microseconds=k) for k in range(3)],
            EVENT_TYPE: ["view"] * 3,
            ATTRIBUTES: [None, None, None],
        },
        schema={
            USER: pl.String,
            ITEM: pl.Int64,
            TIMESTAMP: pl.Datetime("us", "UTC"),
            EVENT_TYPE: pl.String,
            ATTRIBUTES: pl.List(pl.String),
        },
    )
    assert_frame_equal(load_events(frame, schema), expected)


def test_attribute_lists_separated_strings_and_session_ids():
    schema = EventSchema(
        columns={USER: "u", ITEM: "i", ATTRIBUTES: "genres", SESSION: "visit"},
        attribute_separator="|",
    )
    frame = pl.DataFrame(
        {
            "u": [1, 1, 2, 2],
            "i": [5, 6, 7, 8],
            "genres": ["Action|Comedy", " Drama | |War ", None, "|"],
            "visit": [10, 10, None, 11],
        }
    )
    out = load_events(frame, schema)
    assert out.columns == [USER, ITEM, TIMESTAMP, EVENT_TYPE, ATTRIBUTES, SESSION]
    # split, stripped, empty parts dropped; nothing left -> null
    assert out[ATTRIBUTES].to_list() == [["Action", "Comedy"], ["Drama", "War"], None, None]
    assert out[SESSION].to_list() == ["10", "10", None, "11"]  # session ids become strings
    # a list column stays a list (no separator needed)
    lists = pl.DataFrame({"u": [1, 1], "i": [5, 6], "genres": [["a", " b"], []]})
    schema = EventSchema(columns={USER: "u", ITEM: "i", ATTRIBUTES: "genres"})
    assert load_events(lists, schema)[ATTRIBUTES].to_list() == [["a", "b"], None]


def test_swapped_column_names_are_renamed_simultaneously():
    # the user's "item_id" column holds users and vice versa
    schema = EventSchema(
        columns={USER: ITEM, ITEM: USER, TIMESTAMP: TIMESTAMP, EVENT_TYPE: EVENT_TYPE}
    )
    frame = pl.DataFrame({ITEM: ["u1"], USER: ["i9"], TIMESTAMP: [0], EVENT_TYPE: ["view"]})
    out = load_events(frame, schema)
    assert out[USER].to_list() == ["u1"]
    assert out[ITEM].to_list() == ["i9"]


def test_one_column_may_feed_two_canonical_columns():
    # e.g. a log without categories whose items double as their own category
    schema = EventSchema(
        columns={USER: "u", ITEM: "sku", TIMESTAMP: "t", EVENT_TYPE: "e", CATEGORY: "sku"}
    )
    frame = pl.DataFrame({"u": [1], "sku": [42], "t": [0], "e": ["view"]})
    out = load_events(frame, schema)
    assert out.columns == [USER, ITEM, TIMESTAMP, EVENT_TYPE, ATTRIBUTES]
    assert out.row(0) == (1, 42, utc(1970, 1, 1), "view", ["42"])


def test_behavior_aliases_map_raw_names():
    schema = EventSchema(columns=NO_CATEGORY, behavior_aliases={"pv": "view", "buy": "purchase"})
    frame = pl.DataFrame(
        {
            USER: [1, 1, 1, 1],
            ITEM: [1, 2, 3, 4],
            TIMESTAMP: [1, 2, 3, 4],
            EVENT_TYPE: ["pv", "view", "buy", "cart"],
        }
    )
    assert load_events(frame, schema)[EVENT_TYPE].to_list() == ["view", "view", "purchase", "cart"]


def test_numeric_event_codes_map_through_aliases():
    schema = EventSchema(columns=NO_CATEGORY, behavior_aliases={1: "view", 2: "purchase"})
    frame = pl.DataFrame({USER: [1, 1], ITEM: [1, 2], TIMESTAMP: [1, 2], EVENT_TYPE: [1, 2]})
    assert load_events(frame, schema)[EVENT_TYPE].to_list() == ["view", "purchase"]


@pytest.mark.parametrize(
    ("overrides", "aliases"),
    [  # the README's form, and the one the unknown_behavior error suggests, on every dataset
        (["data.behavior_aliases={addtocart: cart}"], {"addtocart": "cart"}),
        (["+data.behavior_aliases.addtocart=cart"], {"addtocart": "cart"}),
        (
            ["data=taobao", "+data.behavior_aliases.addtocart=cart"],
            {"pv": "view", "buy": "purchase", "addtocart": "cart"},
        ),
    ],
)
def test_behavior_aliases_from_the_command_line(make_config, overrides, aliases):
    cfg = make_config("config", overrides)
    assert dict(cfg.data.behavior_aliases) == aliases


def test_alias_to_unknown_behavior_is_rejected():
    with pytest.raises(ValueError, match="behavior_aliases"):
        EventSchema(columns=NO_CATEGORY, behavior_aliases={"pv": "glance"})


def test_unix_seconds_integer_and_float():
    frame = pl.DataFrame(
        {USER: [1, 1], ITEM: [1, 2], TIMESTAMP: [0, 1_700_000_000], EVENT_TYPE: ["view"] * 2}
    )
    assert instants(load_events(frame, SCHEMA)) == [utc(1970, 1, 1), utc(2023, 11, 14, 22, 13, 20)]
    floats = frame.with_columns(pl.Series(TIMESTAMP, [0.25, 1_700_000_000.5]))
    assert instants(load_events(floats, SCHEMA)) == [
        datetime(1970, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC),
        datetime(2023, 11, 14, 22, 13, 20, 500_000, tzinfo=UTC),
    ]


def test_fractional_unix_seconds_are_the_instants_they_write(tmp_path):
    """1115390794.735 s is 1115390794735000 us: a float product truncated to an integer read it
    1 us early (1115390794734999), so the same event written as seconds and as ISO text got
    two instants: no duplicate found, ties ordered by the writing, another fingerprint."""
    exact = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=1_115_390_794_735_000)
    iso = exact.isoformat()
    numbers = write(tmp_path, "numbers.csv", HEADER + "1,1,1115390794.735,view\n")
    assert instants(load_events(numbers, SCHEMA)) == [exact]
    mixed = write(tmp_path, "mixed.csv", HEADER + f"1,1,1115390794.735,view\n1,1,{iso},view\n")
    assert instants(load_events(mixed, SCHEMA)) == [exact, exact]  # one instant, as text too
    millis = pl.DataFrame(
        {USER: [1], ITEM: [1], TIMESTAMP: [1115390794735.4], EVENT_TYPE: ["view"]}
    )
    schema = EventSchema(columns=NO_CATEGORY, timestamp_unit="ms")
    assert instants(load_events(millis, schema)) == [exact + timedelta(microseconds=400)]


def test_unix_milliseconds(tmp_path):
    path = write(tmp_path, "log.csv", HEADER + "1,1,1700000000123,view\n1,2,1000,view\n")
    events = load_events(path, EventSchema(columns=NO_CATEGORY, timestamp_unit="ms"))
    assert instants(events) == [
        datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC),
        utc(1970, 1, 1, 0, 0, 1),
    ]


def test_iso_strings_with_and_without_offsets(tmp_path):
    values = [
        "2024-03-10T12:00:00Z",  # trailing Z = UTC
        "2024-03-10T12:00:00z",
        "2024-03-10T12:00:00+02:00",  # east of UTC: earlier instant
        "2024-03-10T12:00:00-05:30",
        "2024-03-10 12:00:00",  # naive = UTC
        "2024-03-10T12:00:00.250",
        "2024-03-10T12:00:00.000001+00:00",
        "2024-03-10T12:00",
        "2024-03-10T12:00+02:00",  # minutes only, with an offset or Z
        "2024-03-10 12:00Z",
        "2024-03-10",
        " 2024-03-10T12:00:00Z ",
    ]
    body = "".join(f'1,{i},"{v}",view\n' for i, v in enumerate(values))
    events = load_events(write(tmp_path, "log.csv", HEADER + body), SCHEMA)
    assert events.schema[TIMESTAMP] == pl.Datetime("us", "UTC")
    assert instants(events) == [
        utc(2024, 3, 10, 12),
        utc(2024, 3, 10, 12),
        utc(2024, 3, 10, 10),
        utc(2024, 3, 10, 17, 30),
        utc(2024, 3, 10, 12),
        datetime(2024, 3, 10, 12, 0, 0, 250_000, tzinfo=UTC),
        datetime(2024, 3, 10, 12, 0, 0, 1, tzinfo=UTC),
        utc(2024, 3, 10, 12),
        utc(2024, 3, 10, 10),
        utc(2024, 3, 10, 12),
        utc(2024, 3, 10),
        utc(2024, 3, 10, 12),
    ]


def test_iso_offsets_of_whole_hours_without_minutes(tmp_path):
    """PostgreSQL writes a timestamptz as text with an offset of hours alone (``+01``, ``-08``;
    ``+05:30`` where there are minutes): ISO 8601 allows it, and Python's fromisoformat reads
    it, so a ``COPY ... TO ... CSV`` export is read, not refused as unparseable."""
    values = [
        "2024-03-31 01:30:00+01",  # Berlin before the DST change (CET)
        "2024-03-31 03:30:00+02",  # Berlin after it (CEST): one hour later, not two
        "2024-03-31 01:30:00.25-08",
        "2024-03-31T01:30+05",
        "2024-03-31 01:30:00+05:30",
    ]
    body = "".join(f'1,{i},"{v}",view\n' for i, v in enumerate(values))
    events = load_events(write(tmp_path, "log.csv", HEADER + body), SCHEMA)
    assert instants(events) == [
        utc(2024, 3, 31, 0, 30),
        utc(2024, 3, 31, 1, 30),
        datetime(2024, 3, 31, 9, 30, 0, 250_000, tzinfo=UTC),
        utc(2024, 3, 30, 20, 30),
        utc(2024, 3, 30, 20),
    ]


def test_timestamps_ending_in_utc_as_bigquery_exports_them(tmp_path):
    """BigQuery writes a TIMESTAMP to CSV as ``2024-03-10 12:00:00 UTC`` (microseconds when
    there are any): read as UTC, like a trailing ``Z``, not refused as unparseable (which
    refused a whole warehouse export, every row a bad_timestamp)."""
    values = [
        "2024-03-10 12:00:00 UTC",
        "2024-03-10 12:00:00.123456 UTC",
        "2024-03-10T12:00:00UTC",
        "2024-03-10 12:00 UTC",
    ]
    body = "".join(f'1,{i},"{v}",view\n' for i, v in enumerate(values))
    events = load_events(write(tmp_path, "log.csv", HEADER + body), SCHEMA)
    assert instants(events) == [
        utc(2024, 3, 10, 12),
        datetime(2024, 3, 10, 12, 0, 0, 123_456, tzinfo=UTC),
        utc(2024, 3, 10, 12),
        utc(2024, 3, 10, 12),
    ]
    # another zone's name is no offset: refused with the row, not read as UTC
    bad = write(tmp_path, "cet.csv", HEADER + '1,0,"2024-03-10 12:00:00 CET",view\n')
    with pytest.raises(DataError, match=r"bad_timestamp.*2024-03-10 12:00:00 CET"):
        load_events(bad, SCHEMA)


def test_polars_datetimes_aware_and_naive():
    naive = pl.DataFrame(
        {USER: [1], ITEM: [1], TIMESTAMP: [datetime(2024, 6, 1, 8)], EVENT_TYPE: ["view"]}
    )
    assert instants(load_events(naive, SCHEMA)) == [utc(2024, 6, 1, 8)]
    berlin = naive.with_columns(
        pl.col(TIMESTAMP).cast(pl.Datetime("ns")).dt.replace_time_zone("Europe/Berlin")
    )
    # 08:00 in Berlin in summer (CEST, UTC+2) is 06:00 UTC
    events = load_events(berlin, SCHEMA)
    assert events.schema[TIMESTAMP] == pl.Datetime("us", "UTC")
    assert instants(events) == [utc(2024, 6, 1, 6)]


def test_polars_dates_are_midnight_utc():
    frame = pl.DataFrame(
        {USER: [1], ITEM: [1], TIMESTAMP: [datetime(2024, 6, 1).date()], EVENT_TYPE: ["view"]}
    )
    assert instants(load_events(frame, SCHEMA)) == [utc(2024, 6, 1)]


def test_pandas_frames_aware_naive_and_strings():
    eastern = pd.DataFrame(
        {
            USER: ["a", "b"],
            ITEM: [1, 2],
            TIMESTAMP: pd.to_datetime(["2024-01-15 09:00", "2024-07-15 09:00"]).tz_localize(
                "America/New_York"
            ),
            EVENT_TYPE: ["view", "pv"],
        }
    )
    schema = EventSchema(columns=NO_CATEGORY, behavior_aliases={"pv": "view"})
    events = load_events(eastern, schema)
    # EST is UTC-5 in January, EDT UTC-4 in July
    assert instants(events) == [utc(2024, 1, 15, 14), utc(2024, 7, 15, 13)]
    assert events[USER].to_list() == ["a", "b"]
    assert events[EVENT_TYPE].to_list() == ["view", "view"]

    naive = eastern.assign(**{TIMESTAMP: pd.to_datetime(["2024-01-15 09:00", "2024-07-15 09:00"])})
    assert instants(load_events(naive, schema)) == [utc(2024, 1, 15, 9), utc(2024, 7, 15, 9)]

    strings = eastern.assign(**{TIMESTAMP: ["2024-01-15T09:00:00Z", "2024-07-15T09:00:00-04:00"]})
    assert instants(load_events(strings, schema)) == [utc(2024, 1, 15, 9), utc(2024, 7, 15, 13)]

    # a fixed offset, as pd.to_datetime parses "+05:30" (polars knows no such zone name)
    offset = pd.to_datetime(["2024-01-15T09:00:00+05:30", "2024-07-15T09:00:00+05:30"])
    fixed = eastern.assign(**{TIMESTAMP: offset})
    dtype = str(fixed[TIMESTAMP].dtype)  # [us, ...] on pandas 3, [ns, ...] on pandas 2
    assert dtype.endswith(", UTC+05:30]")
    assert instants(load_events(fixed, schema)) == [
        utc(2024, 1, 15, 3, 30),
        utc(2024, 7, 15, 3, 30),
    ]
    assert str(fixed[TIMESTAMP].dtype) == dtype  # the caller's frame kept


def test_pandas_nan_ids_are_null_ids(tmp_path):
    frame = pd.DataFrame(
        {USER: [1.0, float("nan")], ITEM: [1, 2], TIMESTAMP: [0, 1], EVENT_TYPE: ["view"] * 2}
    )
    message = prepare_fails(tmp_path, frame)
    assert problem_lines(message, "<in-memory pandas frame>") == [
        "1 row(s) with a null or empty user or item id (columns 'user_id' / 'item_id') "
        "[null_id] (row 1); " + NULL_ID_FIX
    ]


def test_int_ids_pandas_made_float_for_a_nan_are_ints_again(tmp_path):
    """One missing id turns a pandas int column into float64: with the row dropped, the ids
    stayed floats in the vocabulary, the prepared data and every recommendation (1041569.0).
    Whole-number floats of an id column are read as integers; other floats stay floats."""
    from recsys.data import prepare

    log = generate_events(num_users=20, num_items=15, num_categories=3, seed=2)
    frame = log.to_pandas()
    frame.loc[0, USER] = None  # float64 now
    frame[ITEM] = frame[ITEM].astype("Float64")  # pandas' nullable float, all whole
    assert frame[USER].dtype == "float64"
    ds = prepare(frame, tmp_path / "p", bad_rows={"null_id": "drop"})
    assert ds.events().schema[USER] == pl.Int64 and ds.vocab.items.schema[ITEM] == pl.Int64
    assert ds.quarantine().height == 1
    halves = frame.dropna().assign(**{ITEM: frame[ITEM].dropna() + 0.5})
    assert prepare(halves, tmp_path / "h").vocab.items.schema[ITEM] == pl.Float64
    # the same frame written to Parquet (or as a polars frame: NaN, not null) is the same data
    # as the frame: Int64 ids and the same fingerprint (the Parquet file's ids stayed Float64)
    frame.to_parquet(tmp_path / "log.parquet")
    first = pl.int_range(pl.len()) == 0
    nan = log.with_columns(
        pl.when(first).then(float("nan")).otherwise(pl.col(USER).cast(pl.Float64)).alias(USER),
        pl.col(ITEM).cast(pl.Float32),
    )
    for i, source in enumerate([tmp_path / "log.parquet", nan]):
        other = prepare(source, tmp_path / f"o{i}", bad_rows={"null_id": "drop"})
        assert other.events().schema[USER] == pl.Int64, source
        assert other.vocab.items.schema[ITEM] == pl.Int64, source
        assert other.stats["fingerprint"] == ds.stats["fingerprint"], source
        assert other.quarantine().height == 1


def test_same_log_from_csv_parquet_pandas_and_polars(tmp_path, small_log):
    schema = EventSchema()
    csv = tmp_path / "log.csv"
    parquet = tmp_path / "log.parquet"
    pq_suffix = tmp_path / "log.pq"
    small_log.write_csv(csv)
    small_log.write_parquet(parquet)
    small_log.write_parquet(pq_suffix)
    reference = load_events(small_log, schema)
    expected = small_log.select(
        USER, ITEM, TIMESTAMP, EVENT_TYPE, pl.concat_list(CATEGORY).alias(ATTRIBUTES)
    )
    assert_frame_equal(reference, expected)
    for source in (csv, str(csv), parquet, pq_suffix, small_log.lazy(), small_log.to_pandas()):
        assert_frame_equal(load_events(source, schema), reference)


def test_parquet_of_one_row_group_reads_its_columns_side_by_side(tmp_path, small_log):
    # polars decodes one row group's columns on one core; read_side_by_side scans each group
    # of columns on its own, and the rows must come out as the plain scan's, in order
    schema = EventSchema()
    file = tmp_path / "log.parquet"
    small_log.write_parquet(file)  # one row group
    folder = tmp_path / "one"
    folder.mkdir()
    small_log.write_parquet(folder / "part-0.parquet")
    threads = pl.thread_pool_size()
    for source in (file, str(file), folder, str(folder / "*.parquet")):
        raw = scan_events(source, schema)
        split = read_side_by_side(raw, source, schema)
        assert_frame_equal(split.collect(optimizations=SIDE_BY_SIDE), raw.collect())
        if threads >= 2:
            plan = split.explain(optimizations=SIDE_BY_SIDE)
            assert "HCONCAT" in plan and plan.count("Parquet SCAN") == min(threads, 5), plan
    # left as they are: CSV (every group would parse the whole text), frames, files whose row
    # groups polars reads in parallel already, folders of as many files as threads
    csv = tmp_path / "log.csv"
    small_log.write_csv(csv)
    row_groups = tmp_path / "row_groups.parquet"
    small_log.write_parquet(row_groups, row_group_size=-(-small_log.height // max(threads, 2)))
    many = tmp_path / "many"
    many.mkdir()
    for part in range(max(threads, 2)):
        small_log.write_parquet(many / f"part-{part}.parquet")
    for source in (csv, small_log, small_log.to_pandas(), row_groups, many):
        raw = scan_events(source, schema)
        assert read_side_by_side(raw, source, schema) is raw


def test_folder_of_parquet_files_is_read_as_one_log(tmp_path, small_log):
    folder = tmp_path / "parts"
    folder.mkdir()
    half = small_log.height // 2
    small_log[:half].write_parquet(folder / "part-0.parquet")
    small_log[half:].write_parquet(folder / "part-1.parquet")
    assert_frame_equal(load_events(folder, EventSchema()), load_events(small_log, EventSchema()))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_folder_files_may_order_columns_differently_and_carry_others(tmp_path, small_log, suffix):
    folder = tmp_path / "parts"
    folder.mkdir()
    half = small_log.height // 2
    first = small_log[:half]
    second = small_log[half:].select(reversed(small_log.columns)).with_columns(price=pl.lit(1.5))
    for name, part in (("part-0", first), ("part-1", second)):
        getattr(part, "write_csv" if suffix == ".csv" else "write_parquet")(
            folder / f"{name}{suffix}"
        )
    assert_frame_equal(load_events(folder, EventSchema()), load_events(small_log, EventSchema()))


@pytest.mark.parametrize(
    ("name", "separator", "gzipped"),
    [("log.csv", ";", False), ("log.csv", "\t", False), ("log.csv.gz", ",", True)],
)
def test_semicolon_tab_and_gzip_csv_read_like_a_plain_csv(
    tmp_path, small_log, name, separator, gzipped
):
    """A warehouse's CSV export: ';' or tab separated (found from the header), or gzip."""
    text = small_log.write_csv(separator=separator).encode()
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(text) if gzipped else text)
    reference = load_events(small_log, EventSchema())
    assert_frame_equal(load_events(path, EventSchema()), reference)
    assert_frame_equal(load_events(path.parent, EventSchema()), reference)  # in a folder too


def test_a_csv_cut_mid_row_is_not_read_as_a_whole_row(tmp_path, caplog):
    """A CSV whose copy stopped mid-row ends in a line without a line end whose last field may
    be part of a value: "1708506391" cut to "170850" was prepared without a word as an event
    on 2 January 1970. That field is read as null, so the bad-row policy stops on it, and a
    warning names the file (as the public formats' loaders do)."""
    rows = [f"{u},{i},view,{1708506391 + 60 * i}\n" for u in (1, 2) for i in range(3)]
    text = "user_id,item_id,event_type,timestamp\n" + "".join(rows) + "3,7,view,170850"
    path = write(tmp_path / "in", "log.csv", text)
    message = prepare_fails(tmp_path, path, match="empty timestamp")
    assert "row 6" in message and "line end" in message
    assert any("no line end" in r.message and str(path) in r.message for r in caplog.records)


def test_a_gzip_csv_cut_short_is_named_with_the_fix(tmp_path, small_log):
    """A .csv.gz whose download or copy did not finish failed with a bare "OSError: unexpected
    end of file", naming no file."""
    path = tmp_path / "in" / "log.csv.gz"
    path.parent.mkdir()
    whole = gzip.compress(small_log.write_csv().encode())
    path.write_bytes(whole[: len(whole) // 2])
    message = prepare_fails(tmp_path, path, match="damaged or cut short")
    assert str(path) in message and "export or copy it again" in message


def test_spark_output_folder_and_glob_leave_out_hidden_files(tmp_path, small_log):
    """A Spark write: part files, _SUCCESS, .crc files; an unfinished attempt's _temporary/
    parts and hidden files are not the log's rows (read, they would be extra events)."""
    folder = tmp_path / "export"
    (folder / "_temporary" / "0").mkdir(parents=True)
    half = small_log.height // 2
    small_log[:half].write_parquet(folder / "part-00000-a1.snappy.parquet")
    small_log[half:].write_parquet(folder / "part-00001-a1.snappy.parquet")
    small_log[:5].write_parquet(folder / "_temporary" / "0" / "part-00000-a1.snappy.parquet")
    small_log[:5].write_parquet(folder / ".part-00002-a1.snappy.parquet")
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000-a1.snappy.parquet.crc").write_bytes(b"crc")
    reference = load_events(small_log, EventSchema())
    assert_frame_equal(load_events(folder, EventSchema()), reference)
    assert_frame_equal(load_events(str(folder / "part-*.parquet"), EventSchema()), reference)
    stats, _ = prepare_dataset(
        str(folder / "part-*.parquet"),
        schema=EventSchema(),
        settings=PrepareSettings(),
        out_dir=tmp_path / "prep",
    )
    assert stats["rows_read"] == small_log.height
    message = prepare_fails(tmp_path, str(folder / "nothing-*.parquet"), match="matches no")
    assert "nothing-*.parquet" in message


def test_parquet_parts_with_and_without_time_zone_combine(tmp_path, small_log):
    """One part's timestamps timestamp[us, tz=UTC], another's naive timestamp[ns] (= UTC),
    a third's dates: polars finds no common type for the first two."""
    folder = tmp_path / "parts"
    folder.mkdir()
    third = small_log.height // 3
    small_log[:third].write_parquet(folder / "part-0.parquet")
    naive = pl.col(TIMESTAMP).dt.replace_time_zone(None).dt.cast_time_unit("ns")
    small_log[third : 2 * third].with_columns(naive).write_parquet(folder / "part-1.parquet")
    dates = small_log[2 * third :].with_columns(pl.col(TIMESTAMP).dt.date())
    dates.write_parquet(folder / "part-2.parquet")
    midnight = small_log[2 * third :].with_columns(pl.col(TIMESTAMP).dt.truncate("1d"))
    expected = pl.concat([small_log[: 2 * third], midnight])
    assert_frame_equal(load_events(folder, EventSchema()), load_events(expected, EventSchema()))


def test_text_ids_in_one_file_and_float_ids_in_another_are_refused(tmp_path, small_log):
    """Their common type, text, would read the id 100 as '100' from one file and as '100.0'
    from the other: two items for one."""
    folder = tmp_path / "in"
    folder.mkdir()
    small_log[:10].with_columns(pl.col(ITEM).cast(pl.String)).write_parquet(folder / "a.parquet")
    small_log[10:].with_columns(pl.col(ITEM).cast(pl.Float64)).write_parquet(folder / "b.parquet")
    message = prepare_fails(tmp_path, folder, schema=EventSchema(), match="'item_id'")
    assert "a.parquet" in message and "b.parquet" in message
    assert "export the ids with one type" in message


def test_a_csv_that_is_not_utf8_names_the_line_and_the_fix(tmp_path):
    path = tmp_path / "in" / "log.csv"
    path.parent.mkdir()
    path.write_bytes((HEADER + "1,2,10,view\n3,4,11,vue d\u00e9tail\n").encode("cp1252"))
    message = prepare_fails(tmp_path, path, match="is not UTF-8 text")
    assert str(path) in message
    assert "(line 3: 3,4,11,vue d\\xe9tail)" in message
    assert "export it as UTF-8" in message and "iconv" in message


def test_a_missing_column_suggests_the_one_differing_in_case_or_spaces(tmp_path):
    path = write(tmp_path / "in", "log.csv", "User_ID, item_id,timestamp,event_type\n1,2,10,view\n")
    message = prepare_fails(tmp_path, path)
    assert "data.columns.user_id='User_ID'" in message
    assert "data.columns.item_id=' item_id'" in message


def test_ids_in_a_pandas_index_are_named(tmp_path):
    frame = pd.DataFrame(
        {USER: [1, 1], ITEM: [1, 2], TIMESTAMP: [0, 1], EVENT_TYPE: ["view"] * 2}
    ).set_index(USER)
    message = prepare_fails(tmp_path, frame)
    assert "['user_id'] are the frame's index" in message and "df.reset_index()" in message


def test_csv_ids_are_read_as_written(tmp_path):
    """Integer ids stay integers (as in Parquet); ids that integers would change (a leading
    zero, a sign, a decimal point) keep their text, so ``007`` and ``7`` stay two users."""
    rows = [("007", "1", 10), ("7", "1", 11), ("007", "2", 12), ("7", "2", 13)]
    text = HEADER + "".join(f"{u},{i},{t},view\n" for u, i, t in rows)
    events = load_events(write(tmp_path / "in", "log.csv", text), SCHEMA)
    assert events.schema[USER] == pl.String and events.schema[ITEM] == pl.Int64
    assert sorted(events[USER].unique()) == ["007", "7"]
    for ids in (["+7", "7"], ["1.0", "2.0"], ["-0", "0"]):
        text = HEADER + "".join(f"{u},1,{10 + n},view\n" for n, u in enumerate(ids))
        events = load_events(write(tmp_path / "in", "log.csv", text), SCHEMA)
        assert events[USER].to_list() == ids
    text = HEADER + "-12,9223372036854775807,10,view\n"
    events = load_events(write(tmp_path / "in", "log.csv", text), SCHEMA)
    assert events.schema[USER] == pl.Int64 and events[ITEM].to_list() == [2**63 - 1]


def test_csv_ids_past_int64_are_read_as_uint64_as_in_parquet(tmp_path):
    """A CSV's ids up to 2**64 - 1 stayed text where the same ids of a Parquet file or a frame
    are UInt64: another fingerprint and vocabulary, so a model trained on the Parquet log was
    refused the CSV export of the same log ('prepared with another vocabulary'; an audit's
    finding). They are read as UInt64; a folder whose other files hold smaller integer ids
    reads them as UInt64 too, and ids past Int64 beside negative ones are refused by name."""
    users, items = [2**64 - 1, 2**63, 5], [2**64 - 2, 2**63 + 1, 3]
    rows = [(u, items[k % 3], 10 + k) for u in users for k in range(6)]
    csv = write(
        tmp_path / "csv", "log.csv", HEADER + "".join(f"{u},{i},{t},view\n" for u, i, t in rows)
    )
    events = load_events(csv, SCHEMA)
    assert events.schema[USER] == pl.UInt64 and events.schema[ITEM] == pl.UInt64
    assert set(events[USER]) == set(users) and set(events[ITEM]) == set(items)
    frame = pl.DataFrame(
        rows, schema={USER: pl.UInt64, ITEM: pl.UInt64, TIMESTAMP: pl.Int64}, orient="row"
    ).with_columns(pl.lit("view").alias(EVENT_TYPE))
    frame.write_parquet(tmp_path / "log.parquet")
    prepared = {
        source.suffix: prepare_dataset(
            source,
            schema=SCHEMA,
            settings=PrepareSettings(),
            out_dir=tmp_path / f"prepared{source.suffix}",
        )
        for source in (csv, tmp_path / "log.parquet")
    }
    assert prepared[".csv"][0]["fingerprint"] == prepared[".parquet"][0]["fingerprint"]
    # a folder: one file of small ids (Int64 alone), one past Int64
    write(tmp_path / "mixed", "b.csv", HEADER + "1,3,20,view\n1,5,21,view\n")
    (tmp_path / "mixed" / "a.csv").write_text(csv.read_text())
    events = load_events(tmp_path / "mixed", SCHEMA)
    assert events.schema[USER] == pl.UInt64 and set(events[USER]) == {*users, 1}
    write(tmp_path / "mixed", "b.csv", HEADER + "-1,3,20,view\n")
    message = prepare_fails(tmp_path, tmp_path / "mixed")
    assert "'user_id' holds ids past Int64 in a.csv (UInt64) and negative ids in b.csv" in message
    assert "export the ids as text in every file" in message


def test_csv_event_types_and_categories_are_read_as_written(tmp_path):
    """Event types and categories are names, as ids are: a CSV's ``01`` stays ``01`` (not
    event ``1``, which no alias maps), and categories ``1.1``, ``1.10`` and ``007`` stay three
    categories (not two floats ``1.1`` and ``7.0``), as in a frame of the same text."""
    schema = EventSchema(
        columns={**NO_CATEGORY, CATEGORY: CATEGORY}, behavior_aliases={"01": "view"}
    )
    rows = [(1, 1, "1.1"), (1, 2, "1.10"), (2, 3, "007")]
    text = "user_id,item_id,timestamp,event_type,category\n" + "".join(
        f"{u},{i},{10 + i},01,{c}\n" for u, i, c in rows
    )
    events = load_events(write(tmp_path / "in", "log.csv", text), schema)
    assert events[EVENT_TYPE].to_list() == ["view"] * 3
    assert events[ATTRIBUTES].to_list() == [["1.1"], ["1.10"], ["007"]]


def test_enum_categories_and_categorical_timestamps_read_as_their_text():
    """A polars ``Enum`` category (or attribute) column was refused ("column has type Enum:
    give a list of ids, a string ...") where a ``Categorical`` one is read as its text, and a
    timestamp column of text held as ``Categorical`` / ``Enum`` (a pandas ``category`` of ISO
    strings) was refused as no timestamp (an audit's finding). Each reads as its text."""
    schema = EventSchema(columns={**NO_CATEGORY, CATEGORY: CATEGORY})
    text = pl.DataFrame(
        {
            USER: [1, 1, 2],
            ITEM: [1, 2, 3],
            TIMESTAMP: ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"],
            EVENT_TYPE: ["view"] * 3,
            CATEGORY: ["shoes", "hats", "shoes"],
        }
    )
    expected = load_events(text, schema)
    categories = pl.Enum(["hats", "shoes", "unused"])
    for changed in (
        text.with_columns(pl.col(CATEGORY).cast(categories)),
        text.with_columns(pl.col(TIMESTAMP).cast(pl.Categorical)),
        text.with_columns(pl.col(TIMESTAMP).cast(pl.Enum(text[TIMESTAMP].to_list()))),
        text.to_pandas().astype({TIMESTAMP: "category", CATEGORY: "category"}),
    ):
        assert_frame_equal(load_events(changed, schema), expected)
    attributes = EventSchema(columns={**NO_CATEGORY, ATTRIBUTES: CATEGORY})
    assert_frame_equal(
        load_events(text.with_columns(pl.col(CATEGORY).cast(categories)), attributes),
        load_events(text, attributes),
    )


def prepare_file_and_frame(tmp_path: Path, log: pl.DataFrame, suffix: str) -> tuple[dict, dict]:
    path = tmp_path / f"log{suffix}"
    getattr(log, "write_csv" if suffix == ".csv" else "write_parquet")(path)
    settings = PrepareSettings(as_of=utc(2030, 1, 1))
    from_file, _ = prepare_dataset(
        path, schema=EventSchema(), settings=settings, out_dir=tmp_path / "a"
    )
    in_memory, _ = prepare_dataset(
        log, schema=EventSchema(), settings=settings, out_dir=tmp_path / "b"
    )
    assert from_file["source"] == str(path)
    return from_file, in_memory


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_prepare_from_files_matches_in_memory(tmp_path, small_log, suffix):
    from_file, in_memory = prepare_file_and_frame(tmp_path, small_log, suffix)
    for name in ("sequences.parquet", "items.parquet", "attributes.parquet", "quarantine.parquet"):
        assert_frame_equal(
            pl.read_parquet(tmp_path / "a" / name), pl.read_parquet(tmp_path / "b" / name)
        )
    ignore = {"source", "fingerprint"}
    assert {k: v for k, v in from_file.items() if k not in ignore} == {
        k: v for k, v in in_memory.items() if k not in ignore
    }


@pytest.mark.parametrize(
    "suffix",
    [
        ".csv",
        ".parquet",
    ],
)
def test_fingerprint_does_not_depend_on_the_file_format(tmp_path, small_log, suffix):
    from_file, in_memory = prepare_file_and_frame(tmp_path, small_log, suffix)
    assert from_file["fingerprint"] == in_memory["fingerprint"]


def test_a_user_list_is_its_user_id_column_or_its_only_column(tmp_path):
    pl.DataFrame({"user_id": [3, 1], "note": ["a", "b"]}).write_csv(tmp_path / "named.csv")
    assert read_user_list(tmp_path / "named.csv").to_list() == [3, 1]
    pl.DataFrame({"customer": ["u7", "u9"]}).write_parquet(tmp_path / "only.parquet")
    ids = read_user_list(tmp_path / "only.parquet")
    assert ids.name == "user_id" and ids.to_list() == ["u7", "u9"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"user list .*missing.csv does not exist: check users"),
        ("", r"empty \(0 bytes\): export the user list again"),
        ("user_id\n", r"lists no users: write one user id per row \(users\)"),
        ("a,b\n1,2\n", r"columns \['a', 'b'\] and none is 'user_id'"),
        ("user_id,name\n1,a\n,b\n2,c\n", r"1 of its 3 rows have no user id in column 'user_id'"),
    ],
)
def test_a_bad_user_list_is_refused_naming_the_file_and_the_fix(tmp_path, content, message):
    path = tmp_path / ("missing.csv" if content is None else "users.csv")
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=message):
        read_user_list(path)
    with pytest.raises(DataError, match=r"unsupported file type '\.txt'"):
        (tmp_path / "users.txt").write_text("1\n2\n")
        read_user_list(tmp_path / "users.txt")


def test_instants_in_a_named_time_zone_are_taken_as_utc(tmp_path):
    """``as_of`` / ``window`` given as datetimes in a named zone (Europe/Berlin, as a notebook's
    pandas Timestamps often are) crashed polars' comparison with the UTC log; they are the same
    instants in UTC."""
    from zoneinfo import ZoneInfo

    from recsys.data import prepare
    from recsys.data.validate import parse_instant

    berlin = ZoneInfo("Europe/Berlin")
    summer = datetime(2024, 6, 1, 2, 0, tzinfo=berlin)  # 2024-06-01T00:00Z (CEST, +02:00)
    assert parse_instant(summer, option="as_of") == utc(2024, 6, 1)
    assert parse_instant(pd.Timestamp("2024-01-01 01:00", tz="Europe/Berlin"), option="x") == (
        utc(2024, 1, 1)
    )
    events = generate_events(num_users=30, num_items=20, num_categories=3, seed=0)
    start = events["timestamp"].sort()[len(events) // 4].replace(tzinfo=None)
    local = start.replace(tzinfo=UTC).astimezone(berlin)
    later = summer.replace(year=2030)
    ds = prepare(events, tmp_path / "zoned", window={"start": local}, as_of=later)
    ds_utc = prepare(events, tmp_path / "utc", window={"start": start})
    assert ds.stats["fingerprint"] != "" and ds.events().height == ds_utc.events().height
    assert ds.events().height < events.height


def test_text_timestamps_take_the_first_format_that_parses_each_row():
    """Each ISO format is tried only on the rows no earlier one parsed (a coalesce of all nine
    formats parsed every row nine times): the result must be the coalesce's, row by row, for
    numbers, every format, offsets, "Z", broken forms and nulls, in one column."""
    from recsys.data.validate import _ISO_FORMATS, _UTC_SUFFIX, TIMESTAMP_DTYPE, timestamp_expr

    values = [
        "1511544070", " 1511544070 ", "1115390794.735", "nan", "inf", "-5", "", " ", None, "abc",
        "2017-11-25", "2017-11-25T10:00", "2017-11-25 10:00", "2017-11-25T10:00+01",
        "2017-11-25 10:00+0100", "2017-11-25T10:00:00", "2017-11-25 10:00:00.123456",
        "2017-11-25T10:00:00Z", "2017-11-25T10:00:00.5z", "2017-11-25T10:00:00-05:30",
        "2017-11-25 10:00:00+01:00", "2017-11-25t10:00", "2017-13-25", "2017-11-25T25:00",
        "2017-11-25  10:00", "2017-11-25T10:00:00 UTC", "2017-11-25 10:00 CET", "2017-1-5 1:2",
        "1e9",
    ]  # fmt: skip
    frame = pl.DataFrame({"timestamp": pl.Series(values * 3, dtype=pl.String)})
    text = pl.col("timestamp").str.strip_chars()
    iso = text.str.replace(_UTC_SUFFIX, "+00:00")
    for unit, scale in (("s", 1_000_000), ("ms", 1_000)):
        reference = pl.coalesce(
            (text.cast(pl.Float64, strict=False) * scale)
            .round()
            .cast(pl.Int64, strict=False)
            .cast(TIMESTAMP_DTYPE),
            *(
                iso.str.to_datetime(f, strict=False, time_unit="us", time_zone="UTC")
                for f in _ISO_FORMATS
            ),
        )
        got = frame.lazy().select(timestamp_expr(pl.String, unit)).collect(engine="streaming")
        expected = frame.select(reference)
        assert got.to_series().to_list() == expected.to_series().to_list()
        assert got.to_series().null_count() < len(frame) // 2  # most of them parse
