"""The bad-row matrix: every kind of bad row under ``error`` and ``drop``, and structural
problems (missing column, empty file, wrong file type, mixed-type ids). Each failure must name
what is wrong and how to fix it, and leave no output (not even a partial quarantine file)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import polars as pl
import pytest

import recsys.data as rd
from recsys.data import DataError
from recsys.data.synthetic import generate_events

COLUMNS = {"user_id": "user", "item_id": "item", "timestamp": "ts", "event_type": "event"}
GOOD_ROWS = 400


@pytest.fixture(scope="module")
def good() -> pl.DataFrame:
    events = generate_events(num_users=25, num_items=40, num_categories=4, seed=9)
    return events.head(GOOD_ROWS).select(
        pl.col("user_id").cast(pl.String).alias("user"),
        pl.col("item_id").cast(pl.String).alias("item"),
        pl.col("timestamp").dt.epoch("s").cast(pl.String).alias("ts"),
        pl.col("event_type").alias("event"),
    )


def bad_row(good: pl.DataFrame, kind: str) -> dict:
    first = good.row(0, named=True)
    return {
        "null_id": {**first, "user": None},
        "bad_timestamp": {**first, "ts": "yesterday"},
        "unknown_behavior": {**first, "event": "clack"},
        "negative_timestamp": {**first, "ts": "-86400"},
        "future_timestamp": {**first, "ts": "4102444800"},  # 2100-01-01
        "duplicate": first,
    }[kind]


EXPECTED_MESSAGE = {
    "null_id": r"1 row\(s\) with a null or empty user or item id \(columns 'user' / 'item'\) "
    r"\[null_id\] \(row 400\); fix: .*data.bad_rows.null_id=drop",
    "bad_timestamp": r"whose timestamp \(column 'ts'\) could not be parsed \[bad_timestamp\] "
    r"\(row 400: 'yesterday'\); fix: use Unix seconds",
    "unknown_behavior": r"outside \['view', 'click', 'cart', 'purchase'\] \[unknown_behavior\] "
    r"\(names \['clack'\]; row 400: 'clack'\); fix: .*data.behavior_aliases",
    "negative_timestamp": r"before 1970-01-01 \(column 'ts'\) \[negative_timestamp\] "
    r"\(row 400: '-86400'\); fix: check the unit",
    "future_timestamp": r"after as_of=2030-01-01T00:00:00\+00:00 .*\[future_timestamp\] "
    r"\(row 400: '4102444800'\); fix: check the unit .*set data.as_of",
    "duplicate": r"1 row\(s\) repeating an earlier identical event .*\[duplicate\] \(row 400\)",
}
KINDS = list(EXPECTED_MESSAGE)


def write_log(tmp_path: Path, frame: pl.DataFrame) -> Path:
    path = tmp_path / "events.csv"
    frame.write_csv(path)
    return path


def assert_nothing_written(parent: Path) -> None:
    leftovers = [p.name for p in parent.iterdir()] if parent.exists() else []
    assert leftovers == [], f"partial output left behind: {leftovers}"


def prepare(source, out: Path, **options):
    return rd.prepare(
        source,
        out,
        columns=COLUMNS,
        as_of="2030-01-01T00:00:00Z",
        split={"method": "leave_one_out"},
        **options,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_error_policy_names_the_problem_and_writes_nothing(good, tmp_path, kind):
    log_file = write_log(tmp_path, pl.concat([good, pl.DataFrame([bad_row(good, kind)])]))
    out_parent = tmp_path / "out"
    with pytest.raises(DataError, match=EXPECTED_MESSAGE[kind]) as raised:
        prepare(log_file, out_parent / "prepared", bad_rows={kind: "error"})
    assert str(log_file) in str(raised.value)
    assert_nothing_written(out_parent)


@pytest.mark.parametrize("kind", KINDS)
def test_drop_policy_quarantines_counts_and_logs(good, tmp_path, kind, caplog):
    log_file = write_log(tmp_path, pl.concat([good, pl.DataFrame([bad_row(good, kind)])]))
    with caplog.at_level(logging.WARNING, logger="recsys.data.validate"):
        ds = prepare(log_file, tmp_path / "prepared", bad_rows={kind: "drop"})
    stats = ds.stats
    assert stats["rows_read"] == GOOD_ROWS + 1
    assert stats["bad_rows"] == {kind: 1}
    assert stats["quarantined"] == 1
    assert stats["events"] == GOOD_ROWS  # the good rows all survive (every user has >= 2)
    quarantine = ds.quarantine()
    assert quarantine.select("row", "problem").rows() == [(GOOD_ROWS, kind)]
    assert f"{kind}=1" in caplog.text and "set aside" in caplog.text
    if kind == "bad_timestamp":
        assert quarantine["raw_timestamp"].to_list() == ["yesterday"]
    if kind == "unknown_behavior":
        assert quarantine["raw_event_type"].to_list() == ["clack"]


def test_several_kinds_are_reported_at_once(good, tmp_path):
    rows = [bad_row(good, kind) for kind in ("null_id", "bad_timestamp", "unknown_behavior")]
    log_file = write_log(tmp_path, pl.concat([good, pl.DataFrame(rows)]))
    with pytest.raises(DataError) as raised:
        prepare(log_file, tmp_path / "out" / "prepared")
    message = str(raised.value)
    for kind in ("null_id", "bad_timestamp", "unknown_behavior"):
        assert f"[{kind}]" in message
    assert "nothing was written" in message
    assert_nothing_written(tmp_path / "out")


def test_an_error_on_rerun_keeps_the_previous_good_output(good, tmp_path):
    out = tmp_path / "prepared"
    first = prepare(write_log(tmp_path, good), out)
    bad = write_log(tmp_path, pl.concat([good, pl.DataFrame([bad_row(good, "null_id")])]))
    with pytest.raises(DataError):
        prepare(bad, out)
    assert rd.PreparedDataset.load(out).stats["fingerprint"] == first.stats["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv", "prepared"]


# -- structural problems -----------------------------------------------------------------------
def test_missing_column_names_file_column_and_fix(good, tmp_path):
    log_file = write_log(tmp_path, good.drop("event"))
    with pytest.raises(DataError) as raised:
        prepare(log_file, tmp_path / "out" / "prepared")
    message = str(raised.value)
    assert str(log_file) in message
    assert "lacks column(s) ['event']" in message
    assert "data.columns.event_type=<your column>" in message
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize("content", ["", "user,item,ts,event\n"], ids=["zero-bytes", "header-only"])
def test_empty_file(tmp_path, content):
    log_file = tmp_path / "events.csv"
    log_file.write_text(content)
    with pytest.raises(DataError, match=r"events\.csv.*(empty|no rows)"):
        prepare(log_file, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize("name", ["events.json", "events.txt", "events"])
def test_wrong_file_type(good, tmp_path, name):
    path = tmp_path / name
    path.write_text(good.write_csv())
    with pytest.raises(DataError, match=r"unsupported file type.*\.csv, \.parquet"):
        prepare(path, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")


def test_parquet_content_with_csv_name_is_a_clear_error(good, tmp_path):
    path = tmp_path / "events.csv"
    good.write_parquet(path)
    with pytest.raises(DataError, match=r"events\.csv"):
        prepare(path, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")


def test_mixed_type_id_column_in_pandas_is_named(good, tmp_path):
    frame = good.to_pandas()
    frame["user"] = frame["user"].astype(object)
    frame.loc[0, "user"] = 12345  # an int among strings
    with pytest.raises(DataError, match=r"column\(s\) \['user'\] mix value types.*astype\(str\)"):
        prepare(frame, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")


def test_id_types_that_differ_across_files_are_unified_as_text_with_a_warning(
    good, tmp_path, caplog
):
    folder = tmp_path / "log"
    folder.mkdir()
    good.head(200).write_parquet(folder / "a.parquet")
    good.tail(200).with_columns(pl.col("user").cast(pl.Int64)).write_parquet(folder / "b.parquet")
    with caplog.at_level(logging.WARNING, logger="recsys.data.io"):
        ds = prepare(folder, tmp_path / "prepared")
    assert "column 'user' has different types across files" in caplog.text
    assert ds.sequences()["user_id"].dtype == pl.String
    assert ds.stats["events"] == GOOD_ROWS
    assert ds.stats["users"] == good["user"].n_unique()


def test_a_folder_whose_files_cannot_be_combined_is_a_clear_error(good, tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    good.head(200).write_parquet(folder / "a.parquet")
    good.tail(200).with_columns(pl.concat_list("event")).write_parquet(folder / "b.parquet")
    with pytest.raises(DataError, match=r"log.*could not be read"):
        prepare(folder, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")


def test_ids_that_mix_digits_and_text_in_a_csv_are_read_as_text(good, tmp_path):
    frame = pl.concat(
        [
            good,
            pl.DataFrame([{**good.row(0, named=True), "user": "u-abc"}]),
            pl.DataFrame([{**good.row(1, named=True), "user": "u-abc"}]),
        ]
    )
    ds = prepare(write_log(tmp_path, frame), tmp_path / "prepared")
    assert ds.stats["events"] == GOOD_ROWS + 2
    assert "u-abc" in ds.sequences()["user_id"].to_list()


def test_absurd_settings_are_refused_before_reading(tmp_path):
    for options, message in (
        ({"min_user_events": 0}, "data.min_user_events=0 must be an integer >= 1"),
        ({"max_user_events": 1}, "data.max_user_events=1 must be an integer >= data.min_user"),
        # a bool is not a count (True ran as 1)
        ({"min_user_events": 1, "max_user_events": True}, "data.max_user_events=True must be"),
        ({"split": {"method": "leave_last_n", "holdout_events": True}}, "holdout_events=True"),
        ({"bad_rows": {"null_id": "ignore"}}, r"data.bad_rows.null_id='ignore'"),
        ({"bad_rows": {"nulls": "drop"}}, r"data.bad_rows has unknown kind"),
        ({"window": {"start": "2024-02-01", "end": "2024-01-01"}}, "is not before"),
        ({"as_of": "tomorrow"}, "data.as_of='tomorrow' is not an ISO 8601 time"),
        ({"session_gap_seconds": -5}, "data.session_gap_seconds=-5 must be > 0"),
        ({"split": {"method": "random"}}, r"data.split.method='random'"),
        ({"colums": {}}, r"unknown data option\(s\) \['colums'\]"),
        # text or None where a number belongs (a command line's abc, a notebook's "0.1")
        ({"split": {"val_fraction": "0.1"}}, r"data.split.val_fraction='0.1' \(str\) must be a n"),
        ({"split": {"val_fraction": None}}, r"data.split.val_fraction=None \(NoneType\)"),
        ({"session_gap_seconds": "thirty"}, r"data.session_gap_seconds='thirty' \(str\)"),
        ({"time_buckets": {"unit_seconds": "60"}}, r"unit_seconds='60' \(str\) must be a n"),
        ({"time_buckets": {"num_buckets": 8.0}}, r"num_buckets=8.0 \(float\) must be an int"),
        ({"split": {"foo": 1}}, r"unknown data.split option\(s\) \['foo'\]"),
        ({"time_buckets": {"unit": 60}}, r"unknown data.time_buckets option\(s\) \['unit'\]"),
        ({"behaviors": ["view", 3]}, r"data.behaviors=\['view', 3\] must be a list of names"),
    ):
        with pytest.raises(ValueError, match=message):
            rd.prepare(pd.DataFrame(), tmp_path / "never", **options)
    assert not (tmp_path / "never").exists()


def test_one_name_where_a_list_belongs_is_a_list_of_one(tmp_path):
    """``data.split.target_behaviors=purchase`` on a command line means ``[purchase]``, not
    the letters p, u, r, ...; a target behaviour outside ``data.behaviors`` is refused."""
    frame = generate_events(num_users=40, num_items=30, num_categories=3, seed=2)
    split = {"method": "leave_one_out", "target_behaviors": "purchase"}
    ds = rd.prepare(frame, tmp_path / "p", split=split)
    assert ds.stats["split"]["target_behaviors"] == ["purchase"]
    assert ds.stats["test_targets"] > 0
    one = rd.prepare(frame, tmp_path / "q", behaviors="view", bad_rows={"unknown_behavior": "drop"})
    assert one.vocab.behaviors == ("view",)
    with pytest.raises(ValueError, match=r"target_behaviors=\['buy'\] names \['buy'\], not among"):
        rd.prepare(frame, tmp_path / "r", split={**split, "target_behaviors": ["buy"]})
    assert not (tmp_path / "r").exists()


def test_target_behaviours_the_log_lacks_are_named(tmp_path):
    """A target behaviour with no event in the log (favourites on a log without any) left 0
    validation and test targets, reported as "the log is too small or the windows too
    narrow"; the message now says the log has none of them, and which behaviours it has."""
    frame = generate_events(num_users=40, num_items=30, num_categories=3, seed=2)
    behaviors = ["view", "click", "cart", "purchase", "fav"]
    with pytest.raises(
        ValueError,
        match=r"none of the log's \d+ events is one of data.split.target_behaviors=\['fav'\] "
        r"\(it has view: \d+, click: \d+, cart: \d+, purchase: \d+\)",
    ):
        rd.prepare(frame, tmp_path / "p", behaviors=behaviors, split={"target_behaviors": ["fav"]})
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"split": {"method": "leave_one_out"}}, "at least 4 events.*data.min_user_events=4"),
        (
            {"split": {"method": "leave_last_n", "holdout_events": 2}},
            "at least 6 events.*min_user_events=6 or lower data.split.holdout_events",
        ),
        ({}, "widen data.split.val_fraction/test_fraction"),
    ],
)
def test_too_few_targets_get_the_fix_of_their_split(tmp_path, options, fix):
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    frame = pl.DataFrame(
        {
            "user_id": [1, 1, 2, 2],
            "item_id": [1, 2, 1, 2],
            "event_type": ["view"] * 4,
            "timestamp": [t0 + timedelta(hours=h) for h in range(4)],
        }
    )
    with pytest.raises(ValueError, match=fix):
        rd.prepare(frame, tmp_path / "p", columns={"category": None}, **options)
    assert not (tmp_path / "p").exists()


def test_a_split_that_leaves_no_training_target_is_refused(tmp_path):
    """Three events per user under leave-one-out give every user a validation and a test
    target but a training window of one event: nothing to train on (the log used to prepare,
    and training yielded no batch)."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    frame = pl.DataFrame(
        {
            "user_id": [1] * 3 + [2] * 3,
            "item_id": [1, 2, 1, 2, 1, 2],
            "event_type": ["view"] * 6,
            "timestamp": [t0 + timedelta(minutes=m) for m in (0, 1, 2) * 2],
        }
    )
    split = {"method": "leave_one_out"}
    with pytest.raises(
        ValueError, match="no training target: no user has two events.*min_user_events=4"
    ):
        rd.prepare(frame, tmp_path / "p", columns={"category": None}, split=split)
    assert not (tmp_path / "p").exists()
    longer = pl.concat(
        [frame, frame.head(1).with_columns(pl.col("timestamp") - timedelta(hours=1))]
    )
    ds = rd.prepare(longer, tmp_path / "q", columns={"category": None}, split=split)
    assert ds.stats["train_users"] == 1


def test_order_only_log_refuses_a_temporal_split(tmp_path):
    frame = pl.DataFrame({"user_id": [1, 1, 1], "item_id": [1, 2, 3]})
    with pytest.raises(DataError, match="no timestamp column.*leave_one_out or leave_last_n"):
        rd.prepare(frame, tmp_path / "p", columns={"timestamp": None, "event_type": None})


@pytest.mark.parametrize("source", ["csv", "parquet", "pandas", "polars categorical"])
def test_an_empty_text_id_is_a_missing_id_whatever_the_source(good, tmp_path, source):
    """A warehouse export that writes "" for an anonymous visitor (or a lost item id) would
    make one user (item) of every such event; the empty id is a missing one, as a CSV's empty
    field reads, in every source alike, and the item table's too."""
    frame = pl.concat([good, good.head(3).with_columns(user=pl.lit("")), good.head(2)])
    last = pl.int_range(pl.len()) == GOOD_ROWS + 3
    frame = frame.with_columns(item=pl.when(last).then(pl.lit("")).otherwise("item"))
    if source == "csv":  # "" quoted, so that the CSV reader keeps it as text
        path = tmp_path / "events.csv"
        frame.write_csv(path, quote_style="always")
    elif source == "parquet":
        path = tmp_path / "events.parquet"
        frame.write_parquet(path)
    else:
        path = frame.to_pandas() if source == "pandas" else frame.with_columns(
            pl.col("user", "item").cast(pl.Categorical)
        )  # fmt: skip
    with pytest.raises(DataError, match=r"4 row\(s\) with a null or empty user or item id"):
        prepare(path, tmp_path / "out" / "prepared")
    assert_nothing_written(tmp_path / "out")
    ds = prepare(path, tmp_path / "prepared", bad_rows={"null_id": "drop"})
    assert ds.stats["bad_rows"]["null_id"] == 4
    assert ds.quarantine().filter(pl.col("problem") == "null_id")["row"].to_list() == [
        GOOD_ROWS, GOOD_ROWS + 1, GOOD_ROWS + 2, GOOD_ROWS + 3
    ]  # fmt: skip
    assert "" not in ds.sequences()["user_id"].to_list()
    assert "" not in ds.vocab.item_ids()
