"""The notebook API: ``recsys.data.prepare`` takes pandas or polars (eager or lazy) and paths,
returns a :class:`PreparedDataset` that hands back polars or pandas."""

from __future__ import annotations

import pandas as pd
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import recsys.data as rd
from recsys.data.io import DataError
from recsys.data.synthetic import generate_events

OPTIONS = {"columns": {"category": "category"}, "split": {"method": "leave_one_out"}}


@pytest.fixture(scope="module")
def log() -> pl.DataFrame:
    return generate_events(num_users=60, num_items=50, num_categories=5, seed=4)


def test_pandas_polars_lazy_and_path_give_the_same_dataset(log, tmp_path):
    path = tmp_path / "log.parquet"
    log.write_parquet(path)  # one row group: read side by side (io.read_side_by_side)
    results = {
        name: rd.prepare(source, tmp_path / name, **OPTIONS)
        for name, source in {
            "polars": log,
            "lazy": log.lazy(),
            "pandas": log.to_pandas(),
            "path": path,
        }.items()
    }
    reference = results["polars"]
    for name, ds in results.items():
        assert_frame_equal(ds.sequences(), reference.sequences(), check_exact=True)
        assert ds.stats["fingerprint"] == reference.stats["fingerprint"], name


def test_a_pandas_frame_with_integer_column_labels_is_read_by_its_labels(log, tmp_path):
    """pd.read_csv(header=None) labels columns 0, 1, 2, ...: a mapping to label 0 was taken
    for no mapping, another integer crashed on .strip(), and the labels as text called the
    frame empty (an audit's finding). Integer and text labels now name the same columns."""
    names = ["user_id", "item_id", "timestamp", "event_type", "category"]
    frame = log.select(names).to_pandas()
    frame.columns = list(range(len(names)))  # 0 .. 4, as read without a header
    reference = rd.prepare(log.select(names), tmp_path / "named", **OPTIONS)
    for mapping in (
        {name: i for i, name in enumerate(names)},
        {name: str(i) for i, name in enumerate(names)},
    ):
        ds = rd.prepare(frame, tmp_path / f"by_{type(mapping['user_id']).__name__}",
                        **{**OPTIONS, "columns": mapping})  # fmt: skip
        # (the fingerprints differ: they hash the column mapping too)
        assert_frame_equal(ds.sequences(), reference.sequences(), check_exact=True)
        assert ds.stats["events"] == reference.stats["events"]
    with pytest.raises(DataError, match=r"lacks column\(s\) \['7', .* columns are \['0', '1'"):
        rd.prepare(frame, tmp_path / "bad", **{**OPTIONS, "columns": {"user_id": 7}})
    assert list(frame.columns) == list(range(len(names)))  # the caller's frame as it was


def test_outputs_in_both_backends(log, tmp_path):
    ds = rd.prepare(log.to_pandas(), tmp_path / "p", **OPTIONS)
    sequences = ds.sequences(backend="pandas")
    assert isinstance(sequences, pd.DataFrame) and len(sequences) == ds.stats["users"]
    events = ds.events(backend="pandas")
    assert isinstance(events, pd.DataFrame) and len(events) == ds.stats["events"]
    assert set(events["window"]) == {"train", "val", "test"}
    test = ds.events(window="test")
    assert test.height == ds.stats["users"]  # leave-one-out: one test event per user
    assert test["is_target"].sum() == ds.stats["test_targets"]
    assert isinstance(ds.quarantine(backend="pandas"), pd.DataFrame)
    with pytest.raises(ValueError, match="backend='arrow'"):
        ds.sequences(backend="arrow")
    with pytest.raises(ValueError, match="window='later'"):
        ds.events(window="later")
    again = rd.PreparedDataset.load(tmp_path / "p")
    assert again.stats == ds.stats


def test_events_round_trip_to_the_input(log, tmp_path):
    """The long view gives back the input events (raw ids, behaviours, seconds) in order."""
    ds = rd.prepare(log, tmp_path / "p", **OPTIONS)
    events = ds.events().select("user_id", "item_id", "event_type", "timestamp")
    expected = (
        log.with_row_index("_r")
        .sort("user_id", "timestamp", "_r")
        .select(
            "user_id",
            "item_id",
            "event_type",
            pl.col("timestamp").dt.truncate("1s"),
        )
    )
    known = events["item_id"].is_not_null()
    assert_frame_equal(
        events.filter(known).sort("user_id", maintain_order=True),
        expected.filter(known).sort("user_id", maintain_order=True),
    )


def test_item_table_with_attribute_sets(tmp_path):
    events = pl.DataFrame(
        {
            "user": [1] * 4 + [2] * 4 + [3] * 4,
            "item": [10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12],
        }
    )
    items = pd.DataFrame({"item": [10, 11, 12], "tags": ["a|b", "b", "c|a|b"]})
    ds = rd.prepare(
        events,
        tmp_path / "p",
        items=items,
        columns={"user_id": "user", "item_id": "item", "timestamp": None, "event_type": None},
        item_columns={"item_id": "item", "attributes": "tags"},
        attribute_separator="|",
        split={"method": "leave_one_out"},
        min_user_events=3,
    )
    vocab = ds.vocab
    assert ds.stats["ordered_by"] == "input order"
    names = dict(zip(vocab.attributes["index"], vocab.attributes["attribute"]))
    sets = {
        item: sorted(names[i] for i in indices)
        for item, indices in zip(vocab.items["item_id"], vocab.items["attribute_indices"])
    }
    assert sets == {10: ["a", "b"], 11: ["b"], 12: ["a", "b", "c"]}
    assert vocab.attribute_width == 3
    table = vocab.item_attribute_table()
    assert len(table) == vocab.num_items and all(len(row) == 3 for row in table)
    # order-only log: every user's events keep the input order, and have no time
    assert ds.events()["item_id"].to_list() == events["item"].to_list()
    assert not ds.timed and ds.events()["timestamp"].null_count() == len(events)


def test_side_information_holding_the_key_separator_is_refused(tmp_path):
    """recsys joins an item's attribute set into one key with the control character \\x1f, and
    a category holding it (``"A\\x1fB"``) became the two attributes ``A`` and ``B`` without a
    word (an audit's finding). Such a value is refused by column, with an example, in the log
    (a category, attribute lists, a separated string), in an item table and in a scored log;
    with \\x1f as ``attribute_separator`` the values are split on it, as asked."""
    from recsys.data.pipeline import load_events
    from recsys.schema import EventSchema

    events = pl.DataFrame(
        {
            "user": [1] * 6 + [2] * 6,
            "item": [10, 11, 12] * 4,
            "cat": ["A\x1fB", "C", "D"] * 4,
        }
    )
    options = {
        "columns": {"user_id": "user", "item_id": "item", "timestamp": None, "event_type": None},
        "split": {"method": "leave_one_out"},
    }
    category = {"columns": {**options["columns"], "category": "cat"}}
    with pytest.raises(DataError, match=r"4 row\(s\) whose column 'cat' \(data.columns.category\) "
                       r"holds the control character \\x1f \(e.g. 'A\\x1fB'\)"):  # fmt: skip
        rd.prepare(events, tmp_path / "category", **{**options, **category})
    assert not (tmp_path / "category").exists()
    lists = events.with_columns(pl.col("cat").str.split("|"))
    attributes = {"columns": {**options["columns"], "attributes": "cat"}}
    with pytest.raises(DataError, match=r"column 'cat' \(data.columns.attributes\)"):
        rd.prepare(lists, tmp_path / "lists", **{**options, **attributes})
    with pytest.raises(DataError, match=r"column 'cat' \(data.columns.attributes\)"):
        rd.prepare(events, tmp_path / "split", attribute_separator="|", **{**options, **attributes})
    schema = EventSchema(columns={"user_id": "user", "item_id": "item", "category": "cat"})
    with pytest.raises(DataError, match=r"column 'cat' \(data.columns.category\)"):
        load_events(events, schema)  # as scoring reads a log
    table = pl.DataFrame({"item": [10, 11, 12], "tags": ["a", "b\x1fc", "c"]})
    with pytest.raises(DataError, match=r"1 row\(s\) whose column 'tags' \(data.item_columns"):
        rd.prepare(events.drop("cat"), tmp_path / "items", items=table,
                   item_columns={"item_id": "item", "attributes": "tags"}, **options)  # fmt: skip
    # the character as the separator: split on it
    ds = rd.prepare(
        events, tmp_path / "sep", attribute_separator="\x1f", **{**options, **attributes}
    )
    assert sorted(ds.vocab.attributes["attribute"]) == ["A", "B", "C", "D"]
    clean = events.with_columns(pl.col("cat").str.replace("\x1f", "/"))
    ds = rd.prepare(clean, tmp_path / "clean", **{**options, **category})
    assert sorted(ds.vocab.attributes["attribute"]) == ["A/B", "C", "D"]


@pytest.mark.parametrize("where", ["log", "item table"])
def test_a_category_and_attributes_both_mapped_are_refused(tmp_path, where):
    """An item's side information is one set, read from the category or from the attributes:
    with both mapped the attributes silently replaced the category (in the log, and in an
    item table that has an attributes column beside the mapped category)."""
    events = pl.DataFrame(
        {
            "user_id": [1] * 6 + [2] * 6,
            "item_id": [10, 11, 12] * 4,
            "cat": ["c", "d", "c"] * 4,
        }
    ).with_columns(pl.concat_list(pl.lit("tag")).alias("tags"))
    options = {"split": {"method": "leave_one_out"}, "min_user_events": 3}
    options["columns"] = {"timestamp": None, "event_type": None}
    if where == "log":
        options["columns"] |= {"category": "cat", "attributes": "tags"}
        option = "data.columns"
    else:
        table = events.select(
            "item_id", pl.col("cat").alias("category"), pl.col("tags").alias("attributes")
        )
        options |= {"items": table.unique("item_id"), "item_columns": {"category": "category"}}
        option = "data.item_columns"
    with pytest.raises(
        DataError,
        match=rf"{option} maps both category .* and attributes .* set "
        rf"{option}.attributes=null or {option}.category=null",
    ):
        rd.prepare(events, tmp_path / "p", **options)
    assert not (tmp_path / "p").exists()
    # mapped alone, the category is the side information
    if where == "log":
        options["columns"]["attributes"] = None
    else:
        options["item_columns"]["attributes"] = None
    ds = rd.prepare(events, tmp_path / "p", **options)
    assert sorted(ds.vocab.attributes["attribute"].to_list()) == ["c", "d"]


def test_an_item_table_whose_attribute_lists_mix_types_is_named(tmp_path):
    """A pandas item table whose attribute lists mix numbers and strings cannot be converted:
    the message names the column (it said only "check the column types")."""
    events = pl.DataFrame({"user_id": [1, 1, 1], "item_id": [10, 11, 12]})
    items = pd.DataFrame({"item_id": [10, 11], "tags": [[1, "x"], ["2"]]})
    with pytest.raises(DataError, match=r"column\(s\) \['tags'\] hold values of several types"):
        rd.prepare(
            events,
            tmp_path / "p",
            items=items,
            columns={"timestamp": None, "event_type": None},
            item_columns={"attributes": "tags"},
            split={"method": "leave_one_out"},
        )
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("where", "column"),
    [("log", "data.columns.attributes"), ("item table", "data.item_columns.attributes")],
)
def test_attribute_lists_of_lists_are_refused_by_column(tmp_path, where, column):
    """Attributes must be ids: lists of lists were cast by polars, whose failure the item
    table's message blamed on its ids ("item ids of type Int64 do not match the event log's
    Int64")."""
    nested = [[["a"]], [["b"]], [["a"]]]
    events = pl.DataFrame({"user_id": [1, 1, 1], "item_id": [10, 11, 12], "tags": nested})
    options = {"columns": {"timestamp": None, "event_type": None}}
    options["split"] = {"method": "leave_one_out"}
    if where == "log":
        options["columns"]["attributes"] = "tags"
    else:
        options |= {
            "items": events.select("item_id", "tags"),
            "item_columns": {"attributes": "tags"},
        }
    with pytest.raises(DataError, match=rf"^{column} column has type List\(List\(String\)\)"):
        rd.prepare(events, tmp_path / "p", **options)


def test_an_item_table_that_lists_no_training_item_is_reported(tmp_path, caplog):
    """A side table of other ids (another numbering, the wrong file) would leave every item
    without its attributes silently: the log says so and stats.json counts the listed items."""
    events = pl.DataFrame({"user": [1] * 4 + [2] * 4, "item": [10, 11, 12, 13, 10, 11, 12, 13]})
    rotated = pl.DataFrame({"user": [3] * 4 + [4] * 4, "item": [12, 13, 10, 11] * 2})
    events = pl.concat([events, rotated])  # every item in some user's training events
    options = {
        "columns": {"user_id": "user", "item_id": "item", "timestamp": None, "event_type": None},
        "item_columns": {"item_id": "item", "attributes": "tags"},
        "split": {"method": "leave_one_out"},
    }
    other = pd.DataFrame({"item": [1, 2], "tags": [["a"], ["b"]]})
    with caplog.at_level("WARNING", logger="recsys.data.pipeline"):
        ds = rd.prepare(events, tmp_path / "none", items=other, **options)
    assert ds.stats["items_listed"] == 0
    assert "lists none of the 4 training items" in caplog.text
    assert "data.item_columns.item_id" in caplog.text
    some = pd.DataFrame({"item": [10, 99], "tags": [["a"], ["b"]]})  # 99: no event has it
    assert rd.prepare(events, tmp_path / "some", items=some, **options).stats["items_listed"] == 1


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            pd.DataFrame({"item": [10.0, None, 12.0], "tags": ["a", "b", "c"]}),
            "1 row(s) without an item id (null or empty; column 'item')",
        ),
        (  # an export's "" for a lost id: missing, as a CSV's empty field reads
            pd.DataFrame({"item": ["10", ""], "tags": ["a", "b"]}),
            "1 row(s) without an item id (null or empty; column 'item')",
        ),
        (
            pd.DataFrame({"item": [10.0, 11.5], "tags": ["a", "b"]}),
            "1 item id(s) that change as the event log's Int64 ids (column 'item', e.g. ['11.5']",
        ),
        (
            pd.DataFrame({"item": ["10", "011"], "tags": ["a", "b"]}),
            "e.g. ['011']; '007' would become the item 7",
        ),
        (
            pd.DataFrame({"item": [10, 11], "tags": ["a", "b"], "since": ["2020-01-01", "soon"]}),
            "1 moment(s) that do not parse (column 'since', e.g. ['soon'])",
        ),
    ],
    ids=["null id", "empty id", "fractional id", "leading zero", "bad moment"],
)
def test_an_item_table_row_that_would_be_lost_or_merged_is_refused(tmp_path, table, message):
    """A null id, an id the log's type would change (19.5 -> 19; '011' -> 11, merging with
    '11'), an undated moment (it would count as the oldest): refused, nothing written."""
    events = pl.DataFrame(
        {"user": [1, 1, 1, 2, 2, 2], "item": [10, 11, 12, 10, 11, 12], "ts": [1, 2, 3, 4, 5, 6]}
    )
    columns = {"item_id": "item", "attributes": "tags"}
    if "since" in table:
        columns["timestamp"] = "since"
    with pytest.raises(DataError, match="item table") as info:
        rd.prepare(
            events.with_columns(pl.from_epoch("ts").dt.replace_time_zone("UTC")),
            tmp_path / "p",
            items=table,
            columns={"user_id": "user", "item_id": "item", "timestamp": "ts", "event_type": None},
            item_columns=columns,
            split={"method": "leave_one_out"},
        )
    assert message in str(info.value)
    assert not (tmp_path / "p").exists()


def test_float_categories_name_the_categories_of_the_logs_integers(tmp_path):
    """A category column that pandas made float to hold a null, written to Parquet (or a polars
    Float64 column), gave ``3.0`` where the log's integers give ``3``: an item table of such
    categories, covering some of the items, made two attributes of each category. Whole
    numbers read as the integers they are (as the same pandas frame does), NaN as none."""
    events = pl.DataFrame(
        {"user_id": [1] * 6 + [2] * 6, "item_id": [10, 11, 12, 13, 10, 11, 12, 13] + [10, 11] * 2}
    ).with_columns(category=pl.col("item_id") % 3)
    options = {
        "columns": {"timestamp": None, "event_type": None, "category": "category"},
        "item_columns": {"category": "category", "attributes": None},
        "split": {"method": "leave_one_out"},
    }
    table = pl.DataFrame({"item_id": [10, 11, 12], "category": [1.0, None, 2.5]})
    table.write_parquet(tmp_path / "items.parquet")
    frames = {
        "parquet": {"items": tmp_path / "items.parquet"},
        "pandas": {"items": table.to_pandas()},
        "float log": {"events": events.with_columns(pl.col("category").cast(pl.Float64))},
        "float lists": {
            "events": events.with_columns(
                pl.concat_list(pl.col("category").cast(pl.Float32), pl.lit(float("nan")))
            ),
            "columns": {"timestamp": None, "event_type": None, "attributes": "category"},
        },
    }
    for name, given in frames.items():
        ds = rd.prepare(
            given.get("events", events),
            tmp_path / name,
            **{**options, "columns": given.get("columns", options["columns"])},
            items=given.get("items"),
        )
        names = dict(zip(ds.vocab.attributes["index"], ds.vocab.attributes["attribute"]))
        sets = {
            item: [names[i] for i in indices]
            for item, indices in ds.vocab.items.select("item_id", "attribute_indices").rows()
        }
        expected = {10: ["1"], 11: ["2"], 12: ["0"], 13: ["1"]}
        if "items" in given:  # the table's, where it has one (11: none, so its events')
            expected[12] = ["2.5"]
        assert sets == expected, name


def test_an_item_table_of_item_and_category_needs_only_the_category_mapped(tmp_path):
    """``item_columns={"category": ...}`` on a table of item_id and category failed on the
    default ``attributes: attributes`` mapping; a misspelt key was not named."""
    from recsys.data.synthetic import generate_events

    log = generate_events(num_users=30, num_items=20, num_categories=4, seed=3)
    items = log.select("item_id", "category").unique("item_id").to_pandas()
    ds = rd.prepare(
        log.drop("category"), tmp_path / "p", items=items, item_columns={"category": "category"}
    )
    assert ds.vocab.num_attributes > 2  # the categories, beside PAD and UNK
    with pytest.raises(ValueError, match=r"unknown data.item_columns option\(s\) \['categry'\]"):
        rd.prepare(log, tmp_path / "q", items=items, item_columns={"categry": "category"})


def test_a_handle_of_a_folder_prepared_again_refuses_to_read_it(log, tmp_path):
    """A notebook cell re-run with another frame into the same folder: the first handle's
    in-memory vocabulary decoded the new folder's item indices, every id wrong and no word
    (an audit's finding). It now refuses, naming both fingerprints; the new handle reads."""
    first = rd.prepare(log, tmp_path / "p", **OPTIONS)
    other = generate_events(num_users=60, num_items=50, num_categories=5, seed=9)
    second = rd.prepare(other, tmp_path / "p", **OPTIONS)
    for read in (first.events, first.sequences, first.quarantine):
        with pytest.raises(DataError, match=r"was prepared again since this PreparedDataset"):
            read()
    assert second.events()["item_id"].null_count() < second.events().height
    again = rd.prepare(log, tmp_path / "q", **OPTIONS)  # the same data again: the same folder
    assert_frame_equal(rd.prepare(log, tmp_path / "q", **OPTIONS).events(), again.events())


def test_the_prepared_line_counts_items_as_the_scoring_line_does(tmp_path, caplog):
    """The log line names the log's distinct items and the vocabulary's (without its reserved
    PAD/UNK rows, which ``num_items`` counts), the numbers scoring's "N of M item ids of the
    log are in the model's vocabulary" uses, and the targets of items outside it."""
    log = pl.DataFrame(
        {
            "user_id": [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
            "item_id": ["a", "b", "a", "c", "b", "a", "b", "d", "a", "b", "a", "b"],
            "timestamp": [1_700_000_000 + i for i in range(12)],
            "event_type": ["view"] * 12,
        }
    )
    with caplog.at_level("INFO", logger="recsys.data.pipeline"):
        ds = rd.prepare(log, tmp_path / "p", split={"method": "leave_one_out"})
    assert ds.stats["items"] == 4 and ds.stats["num_items"] == 2 + 2  # a, b + PAD, UNK
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("prepared"))
    assert "4 items (2 in the vocabulary)" in line, line
    assert "val/test targets 3/1 (+0/2 of items outside the vocabulary)" in line, line


def test_pandas_outputs_keep_integer_ids_with_nulls_exact(tmp_path):
    """An integer column that holds a null (the item id of an event outside the vocabulary, the
    user id of a quarantined ``null_id`` row) came back as pandas' float64: ids read 23.0, and
    UInt64 ids beyond 2**53 were rounded to other ids (an audit's finding). They are now pandas'
    nullable integers of the same width; a column without nulls keeps its numpy type."""
    big = 2**63 + 3
    users = [big] * 5 + [big + 1] * 4 + [big + 2] * 4 + [None]
    items = [0, 1, 0, 1, 3, 0, 1, 0, 1, 1, 0, 1, 0, 0]  # item 3: only a test target (no index)
    log = pl.DataFrame(
        {
            "user_id": pl.Series(users, dtype=pl.UInt64),
            "item_id": pl.Series([big + i for i in items], dtype=pl.UInt64),
            "timestamp": [1_700_000_000 + i for i in range(len(users))],
            "event_type": ["view"] * len(users),
        }
    )
    log = pl.concat([log, log.slice(1, 1)])  # a duplicate of a big id's row: quarantined too
    ds = rd.prepare(log, tmp_path / "p", split={"method": "leave_one_out"},
                    bad_rows={"null_id": "drop"})  # fmt: skip
    events = ds.events(backend="pandas")
    assert events["item_id"].dtype == "UInt64" and events["item_id"].isna().any()
    assert events["item_id"].dropna().tolist() == ds.events()["item_id"].drop_nulls().to_list()
    assert events["user_id"].dtype == "uint64"  # no null: numpy's type, as before
    quarantine = ds.quarantine(backend="pandas")
    assert quarantine["user_id"].dtype == "UInt64"
    assert quarantine["user_id"].dropna().tolist() == [big]  # the duplicate's user, exactly


def test_an_object_column_of_integers_beyond_int64_is_read_as_uint64(tmp_path):
    """UInt64 ids held as Python integers in an object column (as a database driver or JSON
    gives them) failed in the conversion to polars with a bare ``OverflowError: Python int too
    large to convert to C long`` (an audit's finding). They are read as UInt64 now, the same
    dataset as the UInt64 column; an integer beyond UInt64 is refused naming its column."""
    big = 2**63 + 3
    users = [big + u for u in (0, 0, 0, 0, 1, 1, 1, 1)]
    frame = pd.DataFrame(
        {
            "user_id": pd.Series(users, dtype="UInt64"),
            "item_id": [1, 2, 1, 2, 2, 1, 2, 1],
            "timestamp": [1_700_000_000 + i for i in range(8)],
            "event_type": ["view"] * 8,
        }
    )
    options = {"split": {"method": "leave_one_out"}}
    reference = rd.prepare(frame, tmp_path / "uint64", **options)
    held = frame.astype({"user_id": object})
    assert type(held["user_id"].iloc[0]) is int
    ds = rd.prepare(held, tmp_path / "object", **options)
    assert_frame_equal(ds.sequences(), reference.sequences(), check_exact=True)
    assert ds.sequences()["user_id"].to_list() == [big, big + 1]
    held.loc[0, "user_id"] = 2**64
    with pytest.raises(DataError, match=r"\['user_id'\].*beyond.*UInt64"):
        rd.prepare(held, tmp_path / "bad", **options)


def test_column_labels_taken_from_the_frame_map_its_columns(log, tmp_path):
    """A mapping written as ``frame.columns[0]`` is numpy's int64 (a float label numpy's
    float64), not ``int``: it failed with AttributeError ``'numpy.int64' object has no attribute
    'strip'``; and ``item_columns`` took no integer label at all (``item_id: 0`` read as "not
    set", another integer as a missing column) (an audit's finding). Both map by label now."""
    names = ["user_id", "item_id", "timestamp", "event_type"]
    frame = log.select(names).to_pandas()
    frame.columns = [0, 1, 2.5, 3]  # labels of pandas' Index: numpy scalars
    assert type(frame.columns[0]).__module__ == "numpy"
    table = log.select("item_id", "category").unique("item_id", maintain_order=True)
    items = table.to_pandas()
    items.columns = [0, 1]
    split = {"method": "leave_one_out"}
    reference = rd.prepare(log.select(names), tmp_path / "named", items=table,
                           item_columns={"category": "category"}, split=split)  # fmt: skip
    ds = rd.prepare(
        frame,
        tmp_path / "labels",
        columns={name: frame.columns[i] for i, name in enumerate(names)},
        items=items,
        item_columns={"item_id": items.columns[0], "category": 1},
        split=split,
    )
    assert_frame_equal(ds.sequences(), reference.sequences(), check_exact=True)
    assert ds.vocab.attributes.height == reference.vocab.attributes.height


def test_an_arrow_string_view_column_is_read_as_text(log, tmp_path):
    """A pandas column of ``pd.ArrowDtype(pa.string_view())`` (what pyarrow's newer readers can
    hand over) failed with a bare ``NotImplementedError: string_view`` from polars' conversion
    (an audit's finding). It is read as the same text as a ``str`` column."""
    import pyarrow as pa

    if not hasattr(pa, "string_view"):
        pytest.skip(f"pyarrow {pa.__version__} has no string_view (added in 16)")
    frame = log.to_pandas()
    frame["user_id"] = frame["user_id"].astype(str)
    reference = rd.prepare(frame, tmp_path / "str", **OPTIONS)
    view = pd.ArrowDtype(pa.string_view())
    viewed = frame.astype({"user_id": view, "event_type": view, "category": view})
    viewed.index = [0] * len(viewed)  # an index of repeated labels: nothing aligns on it
    ds = rd.prepare(viewed, tmp_path / "view", **OPTIONS)
    assert_frame_equal(ds.sequences(), reference.sequences(), check_exact=True)
    assert ds.stats["fingerprint"] == reference.stats["fingerprint"]
