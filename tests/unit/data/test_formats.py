"""Tests for recsys.data.formats: loaders for public dataset formats.

Where a real copy of a format is staged in ``../shared/data`` the loader is checked against the
counts in that folder's PROVENANCE.md and against the staged Parquet conversions (skipped with a
reason where the folder is absent). Formats with no staged file (MovieLens ratings.dat,
RetailRocket) are written by hand into ``tmp_path`` in exactly the public format.
"""

from __future__ import annotations

import gzip
import logging
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from conftest import CONF_DIR, SHARED_DATA
from hydra.utils import instantiate
from polars.testing import assert_frame_equal

from recsys.data import prepare
from recsys.data.formats import (
    read_movielens_movies,
    read_movielens_ratings,
    read_movielens_sasrec_copy,
    read_recbole,
    read_recbole_items,
    read_retailrocket,
    read_retailrocket_categories,
    read_s3rec,
    read_s3rec_attributes,
    read_sasrec,
    read_taobao,
)
from recsys.data.io import DataError

I64 = pl.Int64
STR = pl.String
TAOBAO_SCHEMA = {
    "user_id": I64,
    "item_id": I64,
    "category": I64,
    "event_type": STR,
    "timestamp": I64,
}
PAIR_SCHEMA = {"user_id": I64, "item_id": I64}
ITEM_ATTRIBUTES_SCHEMA = {"item_id": I64, "attributes": pl.List(STR)}


def shared(relative: str) -> Path:
    """A file under ../shared/data, or skip the test when it is not there."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"real dataset file {path} is absent (../shared/data is not checked out here)")
    return path


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    data = text.encode(encoding)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def frame(rows: list[tuple], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row")


# ---------------------------------------------------------------------------------------------
# Real files in ../shared/data
# ---------------------------------------------------------------------------------------------

TAOBAO = "taobao-userbehavior-sample"


@pytest.mark.parametrize(
    ("raw", "staged", "users", "items", "categories", "cut_row"),
    [
        # the prefix's last line is "100370,1968385,1875258,pv": the timestamp is missing and
        # "pv" may itself be cut, so both are null; its item already occurs earlier
        ("UserBehavior_prefix", "events_user_prefix", 815, 55_368, 2_914,
         (100370, 1968385, 1875258, None, None)),
        # the time slice's last line is "301780,543546,4181361,pv,15": the timestamp was cut to
        # "15" (it would read as 1970-01-01); its item occurs nowhere else (75,384 + 1)
        ("UserBehavior_timeslice", "events_time_slice", 58_732, 75_385, 3_757,
         (301780, 543546, 4181361, "pv", None)),
    ],
)  # fmt: skip
def test_taobao_raw_files_are_the_staged_rows_plus_the_cut_last_row(
    raw, staged, users, items, categories, cut_row, caplog
):
    path = shared(f"{TAOBAO}/raw/{raw}.csv.gz")
    reference = pl.read_parquet(shared(f"{TAOBAO}/{staged}.parquet"))
    with caplog.at_level(logging.WARNING, logger="recsys.data.formats"):
        lf = read_taobao(path)
    assert "cut mid-row" in caplog.text and raw in caplog.text

    assert isinstance(lf, pl.LazyFrame)
    df = lf.collect()
    assert df.schema == pl.Schema(TAOBAO_SCHEMA)
    assert df.height == reference.height + 1  # 84,475 + 1 / 96,168 + 1
    expected = reference.select(
        "user_id",
        "item_id",
        pl.col("category_id").alias("category"),
        pl.col("behavior").cast(pl.String).alias("event_type"),
        "timestamp",
    )
    assert_frame_equal(df.head(reference.height), expected)  # every good row, in file order
    assert df.row(-1) == cut_row
    assert df.null_count().sum_horizontal().item() == sum(v is None for v in cut_row)
    assert df["user_id"].n_unique() == users
    assert df["item_id"].n_unique() == items
    assert df["category"].n_unique() == categories


S3REC = [
    # name, rows, users, items, distinct attribute ids, attributes per item (min, max)
    ("Beauty", 198_502, 22_363, 12_101, 637, (1, 6)),
    ("Sports_and_Outdoors", 296_337, 35_598, 18_357, 2_277, (2, 37)),
    ("Toys_and_Games", 167_597, 19_412, 11_924, 1_027, (2, 31)),
]


@pytest.mark.parametrize(("name", "rows", "users", "items", "n_attr", "per_item"), S3REC)
def test_s3rec_sequences_in_file_order(name, rows, users, items, n_attr, per_item):
    path = shared(f"amazon-s3rec/raw/{name}.txt.gz")
    df = read_s3rec(path).collect()
    assert df.schema == pl.Schema(PAIR_SCHEMA)
    assert (df.height, df["user_id"].n_unique(), df["item_id"].n_unique()) == (rows, users, items)
    # file order = each user's chronological order, as the staged conversion's `position`
    staged = pl.read_parquet(shared(f"amazon-s3rec/{name.lower()}_interactions.parquet"))
    expected = staged.sort("user_id", "position").select(pl.col("user_id", "item_id").cast(I64))
    assert_frame_equal(df, expected)
    with gzip.open(path, "rt") as f:
        user, *items_of_user = map(int, f.readline().split())
    assert df.head(len(items_of_user)).rows() == [(user, item) for item in items_of_user]


@pytest.mark.parametrize(("name", "rows", "users", "items", "n_attr", "per_item"), S3REC)
def test_s3rec_attributes(name, rows, users, items, n_attr, per_item):
    df = read_s3rec_attributes(shared(f"amazon-s3rec/raw/{name}_item2attributes.json.gz")).collect()
    assert df.schema == pl.Schema(ITEM_ATTRIBUTES_SCHEMA)
    assert df.height == df["item_id"].n_unique() == items  # every item has attributes
    assert df["attributes"].explode().n_unique() == n_attr
    sizes = df["attributes"].list.len()
    assert (sizes.min(), sizes.max()) == per_item
    staged = pl.read_parquet(shared(f"amazon-s3rec/{name.lower()}_item_attributes.parquet"))
    expected = staged.select(
        "item_id", pl.col("attribute_ids").cast(pl.List(STR)).alias("attributes")
    )
    assert_frame_equal(df.sort("item_id"), expected.sort("item_id"))


def test_s3rec_attribute_item_ids_join_the_sequences():
    events = read_s3rec(shared("amazon-s3rec/raw/Beauty.txt.gz"))
    attributes = read_s3rec_attributes(shared("amazon-s3rec/raw/Beauty_item2attributes.json.gz"))
    assert events.join(attributes, on="item_id", how="anti").collect().height == 0


def test_movielens_movies_dat():
    df = read_movielens_movies(shared("movielens-1m/raw/movies.dat.gz")).collect()
    assert df.schema == pl.Schema(ITEM_ATTRIBUTES_SCHEMA)
    assert df.height == df["item_id"].n_unique() == 3_883
    assert df["attributes"].explode().n_unique() == 18  # the 18 ML-1M genres
    assert df.row(0) == (1, ["Animation", "Children's", "Comedy"])
    staged = pl.read_parquet(shared("movielens-1m/movies.parquet"))
    expected = staged.select(
        pl.col("movie_id").alias("item_id"), pl.col("genres").str.split("|").alias("attributes")
    )
    assert_frame_equal(df, expected)


def test_movielens_sasrec_copy():
    path = shared("movielens-1m/sasrec_ml1m_interactions.parquet")
    df = read_movielens_sasrec_copy(path).collect()
    assert df.schema == pl.Schema(PAIR_SCHEMA)
    assert (df.height, df["user_id"].n_unique(), df["item_id"].n_unique()) == (
        994_083,
        6_040,
        3_416,
    )
    staged = pl.read_parquet(path).sort("user_sas", "position")
    assert_frame_equal(
        df,
        staged.select(
            pl.col("user_sas").alias("user_id"), pl.col("movie_id").alias("item_id")
        ).cast(I64),
    )
    # the last event of every user is SASRec's test target
    last = df.group_by("user_id", maintain_order=True).last()
    targets = staged.filter(pl.col("role") == "test_target")
    assert last["item_id"].to_list() == targets["movie_id"].cast(I64).to_list()
    # item ids are MovieIDs: every one has genres in movies.dat
    movies = read_movielens_movies(shared("movielens-1m/raw/movies.dat.gz"))
    assert df.lazy().join(movies, on="item_id", how="anti").collect().height == 0


# ---------------------------------------------------------------------------------------------
# Hand-written files in the public formats
# ---------------------------------------------------------------------------------------------


def test_movielens_sasrec_copy_follows_position_not_file_order(tmp_path):
    """The copy's rows need not be stored in SASRec order: each user's items come back in
    ``position`` order (the chronological order a leave-one-out split relies on: the last item
    is the test target), users in ``user_sas`` order."""
    path = tmp_path / "sasrec_ml1m_interactions.parquet"
    pl.DataFrame(
        {
            "user_sas": [2, 1, 1, 2, 1],
            "position": [1, 2, 0, 0, 1],
            "movie_id": [22, 13, 11, 21, 12],
        },
        schema={"user_sas": pl.Int32, "position": pl.Int32, "movie_id": pl.Int32},
    ).write_parquet(path)
    df = read_movielens_sasrec_copy(path).collect()
    assert_frame_equal(df, frame([(1, 11), (1, 12), (1, 13), (2, 21), (2, 22)], PAIR_SCHEMA))


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_taobao_tiny_plain_and_gzip(tmp_path, suffix):
    path = write(
        tmp_path / f"UserBehavior{suffix}",
        "1,2268318,2520377,pv,1511544070\n"
        "1,2333346,2520771,cart,1511561733\r\n"  # CRLF
        "\n"  # a blank line: a row of nulls (this fast loader reads every line)
        "2,x,149192,buy,1511572885\n"  # not an integer -> null
        "2,5,6,fav,\n"  # empty field -> null
        "3,7,8,,1511600000\n",
    )
    expected = frame(
        [
            (1, 2268318, 2520377, "pv", 1511544070),
            (1, 2333346, 2520771, "cart", 1511561733),
            (None, None, None, None, None),
            (2, None, 149192, "buy", 1511572885),
            (2, 5, 6, "fav", None),
            (3, 7, 8, None, 1511600000),
        ],
        TAOBAO_SCHEMA,
    )
    assert_frame_equal(read_taobao(path).collect(), expected)
    assert_frame_equal(read_taobao(str(path)).collect(), expected)  # str or PathLike


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
@pytest.mark.parametrize("end", ["\n\n", "\r\n\r\n", "\n\n \n\n", "\n \t"])
def test_taobao_blank_lines_at_the_end_are_no_rows(tmp_path, suffix, end):
    """A final empty line (an editor's, ``echo >>`` once too often) holds no record: it is not
    a row of nulls that stops preparation (bad_rows.null_id); a blank line inside still is."""
    text = "1,2,3,pv,1511544070\n\n4,5,6,buy,1511544071" + end
    df = read_taobao(write(tmp_path / f"UserBehavior{suffix}", text)).collect()
    assert df.rows() == [
        (1, 2, 3, "pv", 1511544070),
        (None, None, None, None, None),
        (4, 5, 6, "buy", 1511544071),
    ]


def test_taobao_plain_file_with_a_cut_last_line(tmp_path, caplog):
    path = write(tmp_path / "UserBehavior.csv", "1,2,3,pv,1511544070\n4,5,6,buy,15115")
    with caplog.at_level(logging.WARNING):
        df = read_taobao(path).collect()
    assert df.rows() == [(1, 2, 3, "pv", 1511544070), (4, 5, 6, "buy", None)]
    assert "line 2" in caplog.text and "echo >>" in caplog.text


def test_s3rec_and_sasrec_tiny(tmp_path):
    s3rec = write(tmp_path / "Beauty.txt.gz", "1 1 2 3\n2 4 x 1\n\n3\n4 9 8")  # cut last line
    assert_frame_equal(
        read_s3rec(s3rec).collect(),
        frame(
            # a non-integer item and a line without items are rows with nulls; the blank line
            # holds no record; the cut last item ("8" may be "8…") is null
            [(1, 1), (1, 2), (1, 3), (2, 4), (2, None), (2, 1), (3, None), (4, 9), (4, None)],
            PAIR_SCHEMA,
        ),
    )
    sasrec = write(tmp_path / "ml-1m.txt", "1 3\n1 1\n2 2\n1 2\n2 x\n")
    assert_frame_equal(
        read_sasrec(sasrec).collect(),
        frame([(1, 3), (1, 1), (2, 2), (1, 2), (2, None)], PAIR_SCHEMA),  # file order kept
    )


def test_s3rec_user_on_two_lines_is_refused(tmp_path):
    """A duplicated line (a file appended to itself) must not silently double a sequence: the
    leave-one-out test item would then sit in its own input history."""
    text = "1 1 2 3\n2 4 5 6\n"
    path = write(tmp_path / "Beauty.txt", text + text)
    with pytest.raises(
        DataError, match=r"Beauty.txt: user 1 has more than one line \(lines \[1, 3\]\)"
    ):
        read_s3rec(path)


def test_movielens_ratings_dat(tmp_path):
    path = write(
        tmp_path / "ratings.dat",
        "1::1193::5::978300760\n"
        "1::661::3::978302109\n"
        "2::1357::4.5::978298709\n"  # ML-10M half stars
        "3::12::x::978300000\n"  # bad rating -> null, the row stays
        "4::12::3::978300000::9\n"  # surplus field: stays in the timestamp -> null
        "5::7::2::9783",  # cut last line: the timestamp is null
    )
    schema = {"user_id": I64, "item_id": I64, "rating": pl.Float64, "timestamp": I64}
    expected = frame(
        [
            (1, 1193, 5.0, 978300760),
            (1, 661, 3.0, 978302109),
            (2, 1357, 4.5, 978298709),
            (3, 12, None, 978300000),
            (4, 12, 3.0, None),
            (5, 7, 2.0, None),
        ],
        schema,
    )
    assert_frame_equal(read_movielens_ratings(path).collect(), expected)


def test_movielens_movies_latin1_and_colons_in_titles(tmp_path):
    path = write(
        tmp_path / "movies.dat",
        "1::Toy Story (1995)::Animation|Children's|Comedy\n"
        "73::Misérables, Les (1995)::Drama|Musical\n"  # latin-1 é
        "1196::Star Wars: Episode V - The Empire Strikes Back (1980)::Action|Sci-Fi\n"
        "9::Title ending in a colon:::Comedy\n"  # ":::" -> title "...colon:", genres Comedy
        "10::Title with :: inside (1999)::Drama\n"
        "11::No genres (2000)::\n",
        encoding="latin-1",
    )
    expected = frame(
        [
            (1, ["Animation", "Children's", "Comedy"]),
            (73, ["Drama", "Musical"]),
            (1196, ["Action", "Sci-Fi"]),
            (9, ["Comedy"]),
            (10, ["Drama"]),
            (11, None),
        ],
        ITEM_ATTRIBUTES_SCHEMA,
    )
    assert_frame_equal(read_movielens_movies(path).collect(), expected)


@pytest.mark.parametrize("name", ["movies.dat", "movies.dat.gz"])
def test_movielens_movies_with_a_byte_order_mark(tmp_path, name):
    """movies.dat saved as UTF-8 with a BOM (an editor's "UTF-8 with BOM"): the mark is not
    read as latin-1 text ("ï»¿73" is no MovieID), so the first record is not refused."""
    text = "\ufeff73::Misérables, Les (1995)::Drama|Musical\r\n1::Toy Story (1995)::Animation\r\n"
    path = write(tmp_path / name, text)
    assert read_movielens_movies(path).collect().rows() == [
        (73, ["Drama", "Musical"]),
        (1, ["Animation"]),
    ]


def test_s3rec_attributes_tiny(tmp_path):
    path = write(
        tmp_path / "Beauty_item2attributes.json",
        '{"4": [1, 2, 3], "83": [4], "x": [5], "7": "oops", "4": [9]}',
    )
    expected = frame(
        # a repeated key is kept twice, not silently replaced
        [(4, ["1", "2", "3"]), (83, ["4"]), (None, ["5"]), (7, None), (4, ["9"])],
        ITEM_ATTRIBUTES_SCHEMA,
    )
    assert_frame_equal(read_s3rec_attributes(path).collect(), expected)


EVENTS_CSV = (
    "timestamp,visitorid,event,itemid,transactionid\n"
    "1433221332117,257597,view,355908,\n"
    "1433224214164,992329,addtocart,248676,\n"
    "1433223203944,599528,transaction,356475,4000\n"
    "1433222276276,abc,view,1,\n"
)


def test_retailrocket_events(tmp_path):
    path = write(tmp_path / "events.csv", EVENTS_CSV)
    schema = {
        "user_id": I64,
        "item_id": I64,
        "event_type": STR,
        "timestamp": I64,
        "transaction_id": I64,
    }
    expected = frame(
        [
            (257597, 355908, "view", 1433221332117, None),
            (992329, 248676, "addtocart", 1433224214164, None),
            (599528, 356475, "transaction", 1433223203944, 4000),
            (None, 1, "view", 1433222276276, None),
        ],
        schema,
    )
    assert_frame_equal(read_retailrocket(path).collect(), expected)


PROPERTIES_HEADER = "timestamp,itemid,property,value\n"
PROPERTIES_1 = PROPERTIES_HEADER + (
    "1435460400000,460429,categoryid,1338\n"
    "1441508400000,206783,888,1116713 960601 n277.200\n"
    "1439089200000,395014,400,n552.000 639502 n720.000 424566\n"
    "1431831600000,460429,categoryid,1277\n"
)
PROPERTIES_2 = PROPERTIES_HEADER + (
    "1433041200000,395014,categoryid,491\n"
    "1442113200000,460429,categoryid,999\n"
    "1433041200000,395014,categoryid,492\n"
    "1431226800000,59481,available,1\n"
)


def test_retailrocket_categories_latest_value_wins(tmp_path):
    part1 = write(tmp_path / "item_properties_part1.csv", PROPERTIES_1)
    part2 = write(tmp_path / "item_properties_part2.csv.gz", PROPERTIES_2)
    expected = frame(
        # 460429: 1277 -> 1338 -> 999 (latest, in part 2); 395014: two values at the same
        # moment, the later row wins; items without a categoryid row are absent
        [(395014, "492"), (460429, "999")],
        {"item_id": I64, "category": STR},
    )
    assert_frame_equal(read_retailrocket_categories(part1, part2).collect(), expected)
    only_part1 = read_retailrocket_categories(part1).collect()
    assert only_part1.rows() == [(460429, "1338")]


def test_retailrocket_category_set_after_the_training_cut_is_not_used(make_config, tmp_path):
    """Item 460429's category changes from 1338 to 999 after the last event: training (and so
    the vocabulary) must see 1338, the value in force then, as data=retailrocket configures."""
    t0 = 1433221332117
    day = 86_400_000
    lines = [
        f"{t0 + (10 * u + k) * day},{u},view,{(u + k) % 4 + 460426},\n"
        for u in range(4)
        for k in range(6)
    ]
    events = write(tmp_path / "events.csv", EVENTS_CSV.splitlines(True)[0] + "".join(lines))
    properties = (
        PROPERTIES_HEADER
        + "".join(f"{t0 - day},{item},categoryid,1338\n" for item in range(460426, 460430))
        + f"{t0 + 100 * day},460429,categoryid,999\n"
    )  # after every event
    part1 = write(tmp_path / "item_properties_part1.csv", properties)
    part2 = write(tmp_path / "item_properties_part2.csv", PROPERTIES_HEADER)
    cfg = make_config(
        "config",
        ["data=retailrocket", f"data.source.path={events}", f"data.items._args_=[{part1},{part2}]"],
    )
    prepare(
        instantiate(cfg.data.source),
        tmp_path / "prepared",
        items=instantiate(cfg.data["items"]),
        item_columns=dict(cfg.data.item_columns),
        columns=dict(cfg.data.columns),
        behaviors=list(cfg.data.behaviors),
        behavior_aliases=dict(cfg.data.behavior_aliases),
        timestamp_unit="ms",
    )
    attributes = pl.read_parquet(tmp_path / "prepared" / "attributes.parquet")
    assert attributes["attribute"].to_list() == ["1338"]


# RecBole atomic files, written exactly as RecBole's Amazon conversions lay them out: the
# header of RecSysDatasets' Amazon_Beauty.inter / .item, tab-separated, token_seq split on spaces.
RECBOLE_INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "A1YJEY40YUW4SE\t7806397051\t1.0\t1391040000.0\n"
    "A1YJEY40YUW4SE\tB00004TMFE\t5.0\t1.3e9\n"  # before the row above: file order is no time
    "A1YJEY40YUW4SE\t9759091062\t4.0\t1391126400\n"
    "A1YJEY40YUW4SE\tB00004TUBL\t3.0\t1391212800.5\n"
    "A60XNB876KYML\tB00004TUBL\t3.0\t1367193600.0\n"
    "A60XNB876KYML\t9759091062\t5.0\t1367280000.0\n"
    "A60XNB876KYML\t7806397051\t4.0\t1367366400.0\n"
    "A60XNB876KYML\tB00004TMFE\t2.0\t1367452800.0\n"
)
RECBOLE_ITEM = (
    "item_id:token\tcategories:token_seq\ttitle:token\tprice:float\tsales_type:token\t"
    "sales_rank:float\tbrand:token\n"
    "7806397051\tBeauty Makeup Face\tMoisturizing Cream\t12.5\tBeauty\t1042.0\tAcme\n"
    '9759091062\tBeauty  Skin\t"Fresh" Face Wash\t\t\t\t\n'  # a double space, a quote, empty fields
    "B00004TMFE\tBeauty\tLip Gloss\t3.99\tBeauty\t88.0\tFoo\n"
    'B00004TUBL\t\t"Hair Dryer, 12 in\t29.0\tBeauty\t5.0\tBar\n'  # no category; " unclosed
)


def recbole_dataset(folder: Path) -> Path:
    """A RecBole dataset folder: <data_path>/<dataset>/<dataset>.inter and .item."""
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / f"{folder.name}.inter", RECBOLE_INTER)
    write(folder / f"{folder.name}.item", RECBOLE_ITEM)
    return folder


def test_recbole_atomic_files_are_read_and_typed_as_recbole_types_them(tmp_path):
    folder = recbole_dataset(tmp_path / "Amazon_Beauty")
    for path in (folder, folder / "Amazon_Beauty.inter"):  # the folder or the file
        inter = read_recbole(path).collect()
        assert inter.schema == {
            "user_id": STR,
            "item_id": STR,
            "rating": pl.Float64,
            "timestamp": pl.Float64,
        }
        assert inter.height == 8
        assert inter["timestamp"][:4].to_list() == [1391040000.0, 1.3e9, 1391126400.0, 1391212800.5]
    # data=recbole passes the source's path on to the items: a .inter file names its .item
    for path in (folder, folder / "Amazon_Beauty.item", folder / "Amazon_Beauty.inter"):
        items = read_recbole_items(path).collect()
        assert items.schema == {
            "item_id": STR,
            "categories": pl.List(STR),
            "title": STR,
            "price": pl.Float64,
            "sales_type": STR,
            "sales_rank": pl.Float64,
            "brand": STR,
        }
        assert items["categories"].to_list() == [
            ["Beauty", "Makeup", "Face"],
            ["Beauty", "Skin"],  # RecBole leaves out the empty token between two spaces
            ["Beauty"],
            [],
        ]
        assert (
            items["title"][1] == '"Fresh" Face Wash'
        )  # a quote inside a field, as pandas reads it
        assert items.row(1)[3:] == (None, None, None, None)
    ml = tmp_path / "ml-100k"
    ml.mkdir()
    write(
        ml / "ml-100k.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t881250949\n",
    )
    assert read_recbole(ml).collect().rows() == [(196, 242, 3.0, 881250949.0)]  # integer ids


def test_recbole_dataset_prepares_with_data_recbole(make_config, tmp_path):
    """data=recbole data.source.path=<dataset folder>: float timestamps order each user's
    events (not the file), categories become the attribute sets, every row one behaviour."""
    from recsys.tasks import prepare as prepare_task

    folder = recbole_dataset(tmp_path / "Amazon_Beauty")
    out = tmp_path / "prepared"
    cfg = make_config(
        "config", ["data=recbole", f"data.source.path={folder}", f"data.prepared_dir={out}"]
    )
    prepare_task.run(cfg)
    from recsys.data import PreparedDataset

    events = PreparedDataset.load(out).events()
    first = events.filter(pl.col("user_id") == "A1YJEY40YUW4SE")
    assert first["item_id"].to_list() == ["B00004TMFE", "7806397051", "9759091062", "B00004TUBL"]
    assert first["window"].to_list() == ["train", "train", "val", "test"]
    assert set(events["event_type"]) == {"interaction"}
    assert first["timestamp"][0] == datetime(2011, 3, 13, 7, 6, 40, tzinfo=UTC)
    attributes = pl.read_parquet(out / "attributes.parquet")["attribute"].to_list()
    assert {"Beauty", "Makeup", "Face", "Skin"} <= set(attributes)


def test_recbole_files_refused_by_name(tmp_path):
    folder = recbole_dataset(tmp_path / "Amazon_Beauty")
    plain = write(tmp_path / "plain.inter", "user_id\titem_id\n1\t2\n")
    with pytest.raises(DataError, match=r"header field 'user_id' is not RecBole's 'name:type'"):
        read_recbole(plain)
    bad_type = write(tmp_path / "x.inter", "user_id:token\titem_id:int\n1\t2\n")
    with pytest.raises(DataError, match=r"header field 'item_id:int' is not"):
        read_recbole(bad_type)
    (folder / "Amazon_Beauty.item").unlink()
    with pytest.raises(DataError, match=r"without Amazon_Beauty\.item.*data\.items=null"):
        read_recbole_items(folder)
    with pytest.raises(DataError, match=r"no Amazon_Beauty\.item beside .*data\.items=null"):
        read_recbole_items(folder / "Amazon_Beauty.inter")
    with pytest.raises(DataError, match=r"without other\.inter.*'Amazon_Beauty\.inter'"):
        read_recbole(folder.rename(tmp_path / "other"))
    # the CSV reader refuses atomic files, naming the preset that reads them
    with pytest.raises(DataError, match=r"unsupported file type '\.inter'.*data=recbole"):
        prepare(tmp_path / "other" / "Amazon_Beauty.inter", tmp_path / "out")
    with pytest.raises(DataError, match=r"recsys does not read.*data=recbole"):
        prepare(tmp_path / "other", tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Structural problems -> DataError naming the file
# ---------------------------------------------------------------------------------------------


def test_missing_file_empty_file_and_folder(tmp_path):
    missing = tmp_path / "UserBehavior.csv"
    with pytest.raises(DataError, match=r"UserBehavior\.csv does not exist"):
        read_taobao(missing)
    with pytest.raises(DataError, match=r"ratings\.dat does not exist"):
        read_movielens_ratings(tmp_path / "ratings.dat")
    with pytest.raises(DataError, match=r"empty \(0 bytes\)"):
        read_s3rec(write(tmp_path / "Beauty.txt", ""))
    with pytest.raises(DataError, match="is a folder"):
        read_sasrec(tmp_path)
    with pytest.raises(DataError, match="only blank lines"):
        read_sasrec(write(tmp_path / "blank.txt", "\n \n"))
    with pytest.raises(DataError, match="at least one"):
        read_retailrocket_categories()


def test_wrong_file_types(tmp_path):
    parquet = tmp_path / "events.parquet"
    pl.DataFrame({"user_id": [1], "item_id": [2]}).write_parquet(parquet)
    with pytest.raises(DataError, match=r"events\.parquet is a Parquet file"):
        read_taobao(parquet)
    zipped = tmp_path / "ml-1m.zip"
    zipped.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    with pytest.raises(DataError, match=r"ml-1m\.zip is a zip archive.*unzip"):
        read_movielens_ratings(zipped)
    broken = tmp_path / "Beauty.txt.gz"
    broken.write_bytes(gzip.compress(b"1 2 3\n" * 100)[:-20])
    with pytest.raises(DataError, match=r"Beauty\.txt\.gz is a damaged or truncated gzip"):
        read_s3rec(broken)
    text = write(tmp_path / "interactions.csv", "a,b\n1,2\n")
    with pytest.raises(DataError, match=r"interactions\.csv is not a Parquet file"):
        read_movielens_sasrec_copy(text)
    with pytest.raises(DataError, match=r"events\.parquet lacks column\(s\)"):
        read_movielens_sasrec_copy(parquet)
    with pytest.raises(DataError, match=r"Beauty_item2attributes\.json: expected a JSON object"):
        read_s3rec_attributes(write(tmp_path / "Beauty_item2attributes.json", "[1, 2]"))
    with pytest.raises(DataError, match=r"broken\.json is not valid JSON"):
        read_s3rec_attributes(write(tmp_path / "broken.json", '{"1": [1, 2'))
    sequences = write(tmp_path / "Beauty.txt", "1 1 2 3\n2 4 5\n")  # the files swapped
    with pytest.raises(DataError, match=r"Beauty\.txt is not valid JSON.*is this the S3-Rec"):
        read_s3rec_attributes(sequences)


def test_wrong_formats(tmp_path):
    ratings = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n")
    with pytest.raises(DataError, match=r"ratings\.dat: the first line .* has 1 field\(s\)"):
        read_taobao(ratings)
    with_header = write(
        tmp_path / "UserBehavior.csv", "user,item,category,behavior,ts\n1,2,3,pv,4\n"
    )
    with pytest.raises(DataError, match=r"UserBehavior\.csv: .*no header line"):
        read_taobao(with_header)
    taobao = write(tmp_path / "taobao.csv", "1,2,3,pv,4\n")
    with pytest.raises(DataError, match=r"taobao\.csv: .*not an S3-Rec sequence"):
        read_s3rec(taobao)
    with pytest.raises(DataError, match=r"taobao\.csv: .*MovieID::Title::Genres"):
        read_movielens_movies(taobao)
    # ratings.dat / users.dat have "::" and an integer first field too: not movies.dat
    with pytest.raises(DataError, match=r"ratings\.dat: .* looks like ratings\.dat.*movies\.dat"):
        read_movielens_movies(ratings)
    users = write(tmp_path / "users.dat", "1::F::1::10::48067\n2::M::56::16::70072\n")
    with pytest.raises(DataError, match=r"users\.dat: .* not a MovieLens movies\.dat record"):
        read_movielens_movies(users)
    with pytest.raises(DataError, match=r"taobao\.csv: header .* is not the RetailRocket"):
        read_retailrocket(taobao)
    events = write(tmp_path / "events.csv", EVENTS_CSV)
    with pytest.raises(DataError, match=r"events\.csv: header .* item_properties"):
        read_retailrocket_categories(events)
    # ML-20M / ML-25M ship ratings.csv (a header, commas): named, with the events_file route
    csv = write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n1,296,5.0,1147880044\n")
    with pytest.raises(DataError, match=r"ratings\.csv is a MovieLens ratings\.csv .*events_file"):
        read_movielens_ratings(csv)


# ---------------------------------------------------------------------------------------------
# Hydra: every conf/data/<format>.yaml composes and its source/items instantiate
# ---------------------------------------------------------------------------------------------


def _tiny_files(tmp_path: Path) -> dict[str, list[str]]:
    """Per yaml: the overrides pointing its source (and items) at tiny files."""
    sasrec_copy = tmp_path / "sasrec_ml1m_interactions.parquet"
    pl.DataFrame(
        {
            "user_sas": [2, 1, 1],
            "user_id": [20, 10, 10],
            "position": [0, 1, 0],
            "item_sas": [3, 2, 1],
            "movie_id": [1196, 73, 1],
        }
    ).write_parquet(sasrec_copy)
    movies = write(
        tmp_path / "movies.dat",
        "1::Toy Story (1995)::Comedy\n73::Misérables, Les (1995)::Drama\n"
        "1196::Star Wars: Episode V (1980)::Action\n",
        encoding="latin-1",
    )
    part1 = write(tmp_path / "item_properties_part1.csv", PROPERTIES_1)
    part2 = write(tmp_path / "item_properties_part2.csv", PROPERTIES_2)
    taobao = write(tmp_path / "UserBehavior.csv", "1,2,3,pv,1511544070\n")
    s3rec = write(tmp_path / "Beauty.txt", "1 4 83\n")
    attributes = write(tmp_path / "Beauty_item2attributes.json", '{"4": [1], "83": [2]}')
    ratings = write(tmp_path / "ratings.dat", "1::1::5::978300760\n")
    events = write(tmp_path / "events.csv", EVENTS_CSV)
    recbole = recbole_dataset(tmp_path / "Amazon_Beauty")
    return {
        "recbole": [f"data.source.path={recbole}"],
        "taobao": [f"data.source.path={taobao}"],
        "amazon_s3rec": [f"data.source.path={s3rec}", f"data.items.path={attributes}"],
        "movielens": [f"data.source.path={ratings}", f"data.items.path={movies}"],
        "movielens_sasrec": [f"data.source.path={sasrec_copy}", f"data.items.path={movies}"],
        "retailrocket": [
            f"data.source.path={events}",
            f"data.items._args_.0={part1}",
            f"data.items._args_.1={part2}",
        ],
    }


# every conf/data/<format>.yaml but the options base, the generator and a file of your own
FORMATS = sorted(
    path.stem
    for path in (Path(CONF_DIR) / "data").glob("*.yaml")
    if path.stem not in ("base", "synthetic", "events_file")
)


@pytest.mark.parametrize("name", FORMATS)
def test_yaml_composes_and_instantiates(make_config, tmp_path, name):
    files = _tiny_files(tmp_path)
    assert name in files, f"conf/data/{name}.yaml: add a tiny file of its format to _tiny_files"
    cfg = make_config("config", [f"data={name}", *files[name]])
    data = cfg.data
    assert data.name == name
    events = instantiate(data.source)
    assert isinstance(events, pl.LazyFrame)
    mapped = [column for column in data.columns.values() if column]
    assert set(mapped) <= set(events.collect_schema().names()), mapped
    assert events.collect().height > 0
    for raw in data.behavior_aliases or {}:
        assert data.behavior_aliases[raw] in data.behaviors
    if data["items"] is not None:
        items = instantiate(data["items"])
        assert isinstance(items, pl.LazyFrame)
        item_mapped = [column for column in data.item_columns.values() if column]
        assert set(item_mapped) <= set(items.collect_schema().names()), item_mapped
        assert items.collect().height > 0
    if data.columns.timestamp is None:
        assert data.split.method == "leave_one_out" and data.min_user_events == 3


def test_yaml_needs_the_path(make_config):
    cfg = make_config("config", ["data=taobao"])
    with pytest.raises(Exception, match="path"):
        instantiate(cfg.data.source)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("data.columns.category=cat", r"^read_taobao\(.*UserBehavior.csv\) lacks column\(s\) "),
        (
            "data.item_columns.attributes=attrs",
            r"^read_s3rec_attributes\(.*Beauty_item2attributes.json\) lacks column\(s\) ",
        ),
    ],
)
def test_a_mapping_a_loaders_frame_lacks_names_the_loader(make_config, tmp_path, override, named):
    """A column mapping that a loader's frame (a conf/data/<format>.yaml's source or items)
    does not fit named '<in-memory polars frame>', where the bad-row messages and stats.json
    name the loader call."""
    from recsys.tasks import prepare

    name = "taobao" if override.startswith("data.columns") else "amazon_s3rec"
    files = _tiny_files(tmp_path)[name]
    write(tmp_path / "Beauty.txt", "1 4 83 4 83\n2 83 4 83 4\n")  # users the k-core keeps
    cfg = make_config("config", [f"data={name}", *files, override])
    with pytest.raises(DataError, match=named):
        prepare.run(cfg)


def test_a_loader_argument_it_lacks_is_named_with_the_override_that_drops_it(make_config, tmp_path):
    """experiment=tiny (the README's smoke run) with a loader's format stopped with Hydra's
    "read_taobao() got an unexpected keyword argument 'num_users'", naming neither the overlay
    that set it nor how to drop it (nor the other two sizes behind it)."""
    from recsys.tasks import prepare

    files = _tiny_files(tmp_path)["taobao"]
    cfg = make_config("config", ["data=taobao", *files, "experiment=tiny"])
    with pytest.raises(
        ValueError,
        match=r"^data.source.num_users, data.source.num_items, data.source.num_categories: not "
        r"arguments of recsys.data.formats.read_taobao \(an experiment= overlay .*\); drop them "
        r"with ~data.source.num_users ~data.source.num_items ~data.source.num_categories, ",
    ):
        prepare.run(cfg)
    cfg = make_config("config", ["data=taobao", *files, "+data.source.sep=x"])
    with pytest.raises(
        ValueError, match=r"^data.source.sep: not an argument of .* ~data.source.sep"
    ):
        prepare.run(cfg)
