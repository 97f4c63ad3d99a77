"""Each public-format loader prepares its real file from ../shared/data through its Hydra
config (``data=<name>``), with the counts checked against the dataset's PROVENANCE.md and
against independent computations on the staged Parquet copies. Skipped where the shared
folder is absent (a user's fresh clone)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from recsys.data.vocab import ATTRIBUTE_INDICES
from recsys.tasks import prepare
from tests.conftest import SHARED_DATA

TAOBAO = SHARED_DATA / "taobao-userbehavior-sample"
S3REC = SHARED_DATA / "amazon-s3rec"
ML1M = SHARED_DATA / "movielens-1m"


def needs(path):
    return pytest.mark.skipif(
        not path.exists(), reason=f"{path} is absent (real datasets live in ../shared/data)"
    )


def prepared(make_config, tmp_path, overrides):
    cfg = make_config("config", ["logger=none", *overrides])
    out = prepare.run(cfg, tmp_path / "prepared")
    return pl.read_parquet(out / "sequences.parquet"), json.loads((out / "stats.json").read_text())


@needs(TAOBAO)
def test_taobao_prefix(make_config, tmp_path):
    sequences, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=taobao",
            f"data.source.path={TAOBAO / 'raw' / 'UserBehavior_prefix.csv.gz'}",
            "data.bad_rows.bad_timestamp=drop",  # the file's last line is cut mid-row
        ],
    )
    staged = pl.read_parquet(TAOBAO / "events_user_prefix.parquet")
    window = staged.filter(
        pl.col("timestamp").is_between(1511539200, 1512316800, closed="left")  # +08:00 days
    )
    kept = window.filter(pl.len().over("user_id") >= 2)
    assert stats["rows_read"] == 84_476 == staged.height + 1
    assert stats["bad_rows"] == {"bad_timestamp": 1}
    assert stats["events_outside_window"] == staged.height - window.height == 35
    assert stats["events"] == kept.height
    assert stats["users"] == kept["user_id"].n_unique() == sequences.height
    assert stats["items"] == kept["item_id"].n_unique()
    assert stats["num_behaviors"] == 6  # pv, fav, cart, buy + PAD/UNK
    assert stats["attribute_width"] == 1  # one category per item
    behaviors = sequences["behavior"].explode().value_counts().sort("behavior")["count"]
    assert behaviors.sum() == kept.height


@needs(TAOBAO)
def test_taobao_time_slice_clips_the_cut_row(make_config, tmp_path):
    _, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=taobao",
            f"data.source.path={TAOBAO / 'raw' / 'UserBehavior_timeslice.csv.gz'}",
            "data.bad_rows.bad_timestamp=drop",
            "data.split.method=leave_one_out",  # a 2-hour slice: most users have 1-2 events
        ],
    )
    staged = pl.read_parquet(TAOBAO / "events_time_slice.parquet")
    kept = staged.filter(pl.len().over("user_id") >= 2)
    assert stats["rows_read"] == staged.height + 1 == 96_169
    assert stats["bad_rows"] == {"bad_timestamp": 1}
    assert stats["events"] == kept.height
    assert stats["users"] == kept["user_id"].n_unique()


S3REC_COUNTS = {  # PROVENANCE.md: rows, users, items, max attributes per item
    "Beauty": (198_502, 22_363, 12_101, 6),
    "Sports_and_Outdoors": (296_337, 35_598, 18_357, 37),
    "Toys_and_Games": (167_597, 19_412, 11_924, 31),
}


@needs(S3REC)
@pytest.mark.parametrize("name", list(S3REC_COUNTS))
def test_s3rec(make_config, tmp_path, name):
    rows, users, items, max_attributes = S3REC_COUNTS[name]
    sequences, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=amazon_s3rec",
            f"data.source.path={S3REC / 'raw' / f'{name}.txt.gz'}",
            f"data.items.path={S3REC / 'raw' / f'{name}_item2attributes.json.gz'}",
        ],
    )
    assert (stats["rows_read"], stats["events"], stats["users"], stats["items"]) == (
        rows,
        rows,
        users,
        items,
    )
    assert stats["ordered_by"] == "input order"
    # every user has >= 5 items; a target whose item never occurs in training cannot be ranked
    # by a train-fitted vocabulary and is set aside, counted
    for window in ("val", "test"):
        assert stats[f"{window}_targets"] + stats[f"{window}_targets_unknown_item"] == users
        assert stats[f"{window}_targets_unknown_item"] < 0.02 * users
    assert 1 <= stats["attribute_width"] <= max_attributes
    # test targets are each user's last item in the file (leave-one-out)
    staged = pl.read_parquet(S3REC / f"{name.lower()}_interactions.parquet")
    last = staged.sort("user_id", "position").group_by("user_id", maintain_order=True).last()
    lengths = sequences["item"].list.len()
    known = sequences["test_target"] >= 0
    assert (sequences.filter(known)["test_target"] == lengths.filter(known) - 1).all()
    assert dict(zip(last["user_id"], last["position"] + 1)) == dict(
        zip(sequences["user_id"], lengths)
    )


@needs(S3REC)
def test_s3rec_attribute_sets_reach_the_vocabulary(make_config, tmp_path):
    from recsys.data.vocab import Vocab

    cfg = make_config(
        "config",
        [
            "logger=none",
            "data=amazon_s3rec",
            f"data.source.path={S3REC / 'raw' / 'Beauty.txt.gz'}",
            f"data.items.path={S3REC / 'raw' / 'Beauty_item2attributes.json.gz'}",
        ],
    )
    vocab = Vocab.load(prepare.run(cfg, tmp_path / "p"))
    staged = pl.read_parquet(S3REC / "beauty_item_attributes.parquet")
    names = dict(zip(vocab.attributes["index"], vocab.attributes["attribute"]))
    got = vocab.items.select(
        pl.col("item_id"),
        pl.col(ATTRIBUTE_INDICES)
        .list.eval(pl.element().replace_strict(names, return_dtype=pl.String))
        .list.sort()
        .alias("got"),
    )
    expected = staged.select(
        "item_id",
        # a set: the source repeats some category-path nodes within an item
        pl.col("attribute_ids")
        .cast(pl.List(pl.String))
        .list.unique()
        .list.sort()
        .alias("expected"),
    )
    joined = got.join(expected, on="item_id")
    assert joined.height == vocab.items.height  # every vocabulary item has its attribute set
    assert (joined["got"] == joined["expected"]).all()


@needs(ML1M)
def test_movielens_sasrec_copy(make_config, tmp_path):
    sequences, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=movielens_sasrec",
            f"data.source.path={ML1M / 'sasrec_ml1m_interactions.parquet'}",
            f"data.items.path={ML1M / 'raw' / 'movies.dat.gz'}",
        ],
    )
    assert (stats["events"], stats["users"], stats["items"]) == (994_083, 6_040, 3_416)
    assert stats["test_targets"] == 6_040
    staged = pl.read_parquet(ML1M / "sasrec_ml1m_interactions.parquet")
    assert stats["num_attributes"] == 18 + 2  # the 18 genres of movies.dat, PAD, UNK
    lengths = sequences["item"].list.len()
    per_user = staged.group_by("user_sas").len()
    assert dict(zip(per_user["user_sas"], per_user["len"])) == dict(
        zip(sequences["user_id"], lengths)
    )


# -- public formats with no shared copy: tiny files written in exactly their format -----------
def test_movielens_ratings_dat_with_genres(make_config, tmp_path):
    ratings = tmp_path / "ratings.dat"
    movie_ids = (1193, 661, 914, 3408, 2355, 1197)
    rows = [  # each user rates the six movies in a different (rotated) order, a day apart
        (u, m, 4, 978300000 + 86400 * (10 * u + k))
        for u in (1, 2, 3)
        for k, m in enumerate(movie_ids[u:] + movie_ids[:u])
    ]
    ratings.write_text("".join(f"{u}::{m}::{r}::{t}\n" for u, m, r, t in rows))
    movies = tmp_path / "movies.dat"
    movies.write_bytes(
        "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
        "661::James and the Giant Peach (1996)::Animation|Children's|Musical\n"
        "914::My Fair Lady (1964)::Musical|Romance\n"
        "3408::Erin Brockovich (2000)::Drama\n"
        "2355::Bug's Life, A (1998)::Animation|Children's|Comedy\n"
        "1197::Princess Bride, The (1987)::Action|Adventure|Comedy|Romance\n".encode("latin-1")
    )
    sequences, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=movielens",
            f"data.source.path={ratings}",
            f"data.items.path={movies}",
            "data.split.method=leave_one_out",
            "data.as_of=2002-01-01",
        ],
    )
    assert (stats["events"], stats["users"], stats["items"]) == (18, 3, 6)
    assert stats["ordered_by"] == "timestamp"
    assert stats["attribute_width"] == 4  # Princess Bride has four genres
    assert sequences["item"].list.len().to_list() == [6, 6, 6]


def test_retailrocket_events_with_category_properties(make_config, tmp_path):
    events = tmp_path / "events.csv"
    lines = ["timestamp,visitorid,event,itemid,transactionid"]
    t0 = 1433221332117
    for visitor in (257597, 992329, 111016):
        for k, (event, item) in enumerate(
            [
                ("view", 318965),
                ("view", 355908),
                ("view", 248676),
                ("addtocart", 248676),
                ("transaction", 248676),
                ("view", 355908),
            ]
        ):
            transaction = "4000" if event == "transaction" else ""
            lines.append(
                f"{t0 + 60_000 * (k + 10 * visitor % 7)},{visitor},{event},{item},{transaction}"
            )
    events.write_text("\n".join(lines) + "\n")
    properties = tmp_path / "item_properties_part1.csv"
    properties.write_text(
        "timestamp,itemid,property,value\n"
        # dated before the events (2015-06-02): a value recorded after the last training
        # event never reaches the vocabulary (data.item_columns.timestamp)
        "1432263600000,355908,categoryid,1173\n"
        "1432868400000,248676,categoryid,1231\n"
        "1432609200000,248676,categoryid,999\n"  # older value: the latest one wins
        "1431226800000,318965,888,1297729 n6.000\n"
        "1431226800000,318965,categoryid,1338\n"
    )
    sequences, stats = prepared(
        make_config,
        tmp_path,
        [
            "data=retailrocket",
            f"data.source.path={events}",
            f"data.items._args_=[{properties}]",
            "data.split.method=leave_one_out",
        ],
    )
    assert (stats["events"], stats["users"], stats["items"]) == (18, 3, 3)
    assert stats["num_behaviors"] == 5  # view, cart, purchase + PAD/UNK
    from recsys.data.vocab import Vocab

    vocab = Vocab.load(tmp_path / "prepared")
    assert sorted(vocab.attributes["attribute"].to_list()) == ["1173", "1231", "1338"]
