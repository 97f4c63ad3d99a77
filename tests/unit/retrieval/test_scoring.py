"""The scoring job's pieces: index, rules, cold start, explanations (in memory)."""

import copy
import dataclasses
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import polars.selectors as cs
import pyarrow.parquet as pq
import pytest
import torch
from polars.testing import assert_frame_equal

from recsys.checkpoint import LoadedModel
from recsys.data.dataset import SequenceStore, TargetRows
from recsys.data.io import DataError
from recsys.data.pipeline import PrepareSettings, load_events, prepare_dataset, scoring_sequences
from recsys.data.sequences import TimeBuckets
from recsys.data.synthetic import generate_events
from recsys.data.vocab import Vocab
from recsys.model.atrank import ATRank
from recsys.model.sasrec import SASRec
from recsys.retrieval.index import ExactIndex, chunked_topk, mask_items
from recsys.retrieval.ranker import apply_seen_policy, seen_mask, two_stage
from recsys.retrieval.recommend import Recommender, ScoringData, ScoringOptions
from recsys.retrieval.rules import Rules, cap_per_category, take_first
from recsys.retrieval.summary import summarize
from recsys.schema import EVENT_TYPE, ITEM, TIMESTAMP, USER, EventSchema
from recsys.tasks.score import recommend_frame, recommend_kwargs_from_params

TOP_K = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    events = generate_events(num_users=50, num_items=80, num_categories=6, seed=5)
    folder = tmp_path_factory.mktemp("prep") / "p"
    prepare_dataset(events, schema=EventSchema(), settings=PrepareSettings(), out_dir=folder)
    vocab = Vocab.load(folder)
    torch.manual_seed(0)
    encoder = ATRank(
        **vocab.encoder_sizes(),
        num_time_buckets=17,
        max_seq_len=12,
        d_model=16,
        num_layers=1,
    ).eval()
    encoder.set_item_attributes(torch.tensor(vocab.item_attribute_table(), dtype=torch.long))
    model = LoadedModel(
        encoder=encoder,
        vocab=vocab,
        schema=EventSchema(),
        time_buckets=TimeBuckets(),
        max_seq_len=12,
        path=Path("model.ckpt"),
        target_behaviors=tuple(vocab.behaviors),
    )
    return model, events


def _score(model, events, **retrieval):
    return recommend_frame(model, events, retrieval={"top_k": TOP_K, **retrieval})


def test_output_columns_ranks_and_sources(setup):
    model, events = setup
    frame = _score(model, events, rerank_top_n=10)
    assert frame.columns[:5] == [USER, "rank", ITEM, "score", "source"]
    assert frame.columns[-1] == "item_category"
    assert len([c for c in frame.columns if c.startswith("explain_")]) == 12
    assert frame.height == events[USER].n_unique() * TOP_K
    ranks = frame.group_by(USER).agg(pl.col("rank"), pl.col(ITEM).n_unique().alias("n"))
    assert all(r == list(range(1, TOP_K + 1)) for r in ranks["rank"].to_list())
    assert (ranks["n"] == TOP_K).all()
    assert set(frame["source"].to_list()) == {"model"}
    # scores are non-increasing within the list ordered by retrieval (no re-rank here)
    plain = _score(model, events)
    by_user = plain.group_by(USER).agg(pl.col("score"))
    assert all(s == sorted(s, reverse=True) for s in by_user["score"].to_list())


def test_nan_model_scores_are_refused_not_written(setup):
    """Weights that overflow on the scoring histories (finite in the checkpoint, so it loads)
    scored every item NaN: 250 rows of NaN scores in arbitrary order, written without a word
    (NaN ranks first in a top-K). Scoring now stops, naming the model."""
    model, events = setup
    broken = dataclasses.replace(model, encoder=copy.deepcopy(model.encoder))
    with torch.no_grad():
        broken.encoder.final_norm.weight.mul_(1e22)
        broken.encoder.embedding.item_embedding.weight.mul_(1e22)
    assert all(torch.isfinite(w).all() for w in broken.encoder.state_dict().values())
    with pytest.raises(FloatingPointError, match=r"the model model.ckpt scored NaN for \d+ of"):
        _score(broken, events)


def test_seen_items_never_returned_when_excluded(setup):
    model, events = setup
    seen = events.select(USER, ITEM).unique()
    excluded = _score(model, events, rerank_top_n=10)
    assert excluded.join(seen, on=[USER, ITEM], how="inner").height == 0
    kept = _score(model, events, rules={"exclude": "none"})
    assert kept.join(seen, on=[USER, ITEM], how="inner").height > 0  # the rule is doing work


def test_exclude_only_purchased(setup):
    model, events = setup
    bought = events.filter(pl.col(EVENT_TYPE) == "purchase").select(USER, ITEM).unique()
    viewed_only = events.select(USER, ITEM).unique().join(bought, on=[USER, ITEM], how="anti")
    frame = _score(model, events, rules={"exclude": ["purchase"]})
    assert bought.height > 0
    assert frame.join(bought, on=[USER, ITEM], how="inner").height == 0
    assert frame.join(viewed_only, on=[USER, ITEM], how="inner").height > 0


def test_allow_and_deny_lists(setup, tmp_path):
    model, events = setup
    items = model.vocab.items[ITEM].to_list()
    allowed = items[:12]
    frame = _score(model, events, rules={"exclude": "none", "allow_list": allowed})
    assert set(frame[ITEM].to_list()) <= set(allowed)
    popular = _score(model, events, rules={"exclude": "none"})[ITEM].value_counts()
    denied = popular.sort("count", descending=True)[ITEM].head(3).to_list()
    deny_file = tmp_path / "deny.csv"
    pl.DataFrame({ITEM: denied}).write_csv(deny_file)
    frame = _score(model, events, rules={"exclude": "none", "deny_list": str(deny_file)})
    assert not set(frame[ITEM].to_list()) & set(denied)
    assert frame.height == events[USER].n_unique() * TOP_K
    with pytest.raises(DataError, match="no such file"):
        _score(model, events, rules={"deny_list": str(tmp_path / "missing.csv")})


def test_an_empty_deny_list_denies_nothing_and_an_empty_allow_list_is_refused(setup, tmp_path):
    """A nightly deny file of today's out-of-stock items may list none: the job failed."""
    model, events = setup
    expected = _score(model, events)
    (tmp_path / "header.csv").write_text("item_id\n")
    (tmp_path / "blank.csv").write_text("")
    (tmp_path / "blank.txt").write_text("\n")
    for deny in (
        [],
        str(tmp_path / "header.csv"),
        str(tmp_path / "blank.csv"),
        str(tmp_path / "blank.txt"),
    ):
        assert_frame_equal(_score(model, events, rules={"deny_list": deny}), expected)
    with pytest.raises(DataError, match=r"allow_list is empty, which allows no item"):
        _score(model, events, rules={"allow_list": str(tmp_path / "header.csv")})


@pytest.mark.parametrize(
    "as_given",
    [np.array, pl.Series, lambda ids: __import__("pandas").Series(ids), set, "path"],
    ids=["numpy", "polars", "pandas", "set", "path"],
)
@pytest.mark.parametrize("rule", ["allow_list", "deny_list"])
def test_item_lists_as_a_notebook_holds_them(setup, tmp_path, as_given, rule):
    """Allow / deny lists as an array, a Series, a set or a Path work as the list / file name."""
    model, events = setup
    ids = model.vocab.items[ITEM].head(20).to_list()
    expected = _score(model, events, rules={rule: ids})
    if as_given == "path":
        pl.DataFrame({ITEM: ids}).write_csv(tmp_path / "ids.csv")
        given = tmp_path / "ids.csv"
    else:
        given = as_given(ids)
    assert _score(model, events, rules={rule: given}).equals(expected)


def test_a_one_column_csv_without_a_header_loses_no_id(setup, tmp_path):
    """A CSV of ids with no header line: its first line is an id (it was read as the column's
    name, so that item was neither denied nor allowed); a header that is no id stays one."""
    model, events = setup
    ids = model.vocab.items[ITEM].head(3).to_list()
    for rule in ("allow_list", "deny_list"):
        expected = _score(model, events, rules={rule: ids})
        (tmp_path / "bare.csv").write_text("".join(f"{i}\n" for i in ids))
        (tmp_path / "sku.csv").write_text("sku\n" + "".join(f"{i}\n" for i in ids))
        for name in ("bare.csv", "sku.csv"):
            assert_frame_equal(_score(model, events, rules={rule: str(tmp_path / name)}), expected)
    (tmp_path / "one.csv").write_text(f"{ids[0]}\n")  # one line: it was an empty list
    denied = _score(model, events, rules={"deny_list": str(tmp_path / "one.csv")})
    assert_frame_equal(denied, _score(model, events, rules={"deny_list": ids[:1]}))


def test_an_item_list_of_whole_number_floats_names_the_integer_ids(setup, tmp_path):
    """An id list written from a float id column (pandas' to_csv of ids made float by a NaN,
    an earlier recsys's outputs: 109500.0) named a model's items while its ids were floats;
    since they read as integers, such a deny list denied nothing (a warning, status 0, the
    out-of-stock items recommended). Its ids read as the log's do: whole numbers as integers
    (a fractional one names no item)."""
    model, events = setup
    ids = model.vocab.items[ITEM].head(3).to_list()
    for rule in ("allow_list", "deny_list"):
        expected = _score(model, events, rules={rule: ids})
        (tmp_path / "ids.csv").write_text("item_id\n" + "".join(f"{i}.0\n" for i in ids))
        (tmp_path / "ids.txt").write_text("".join(f"{i}.0\n" for i in ids))
        for name in ("ids.csv", "ids.txt"):
            assert_frame_equal(_score(model, events, rules={rule: str(tmp_path / name)}), expected)
    (tmp_path / "half.csv").write_text(f"item_id\n{ids[0]}.5\n")
    with pytest.raises(DataError, match=r"allow_list: none of its 1 ids"):
        _score(model, events, rules={"allow_list": str(tmp_path / "half.csv")})


def test_an_allow_list_of_no_catalogue_item_is_refused(setup):
    """It allowed no item, so every user got nothing, after a warning that its ids 'have no
    effect'; an empty allow list was already refused."""
    model, events = setup
    with pytest.raises(DataError, match=r"allow_list: none of its 2 ids .*\[-5, -6\].*null"):
        _score(model, events, rules={"allow_list": [-5, -6]})


def test_an_item_list_that_is_no_list_is_named(setup):
    model, events = setup
    with pytest.raises(ValueError, match=r"retrieval.rules.deny_list=5: .* list of item ids"):
        _score(model, events, rules={"deny_list": 5})


def test_max_per_category(setup):
    model, events = setup
    unlimited = _score(model, events, rules={"exclude": "none"})
    worst = unlimited.group_by(USER, "item_category").len()["len"].max()
    assert worst > 1  # without the cap some list repeats a category
    capped = _score(model, events, rules={"exclude": "none", "max_per_category": 1})
    assert capped.group_by(USER, "item_category").len()["len"].max() == 1
    assert capped.height == events[USER].n_unique() * TOP_K  # the cap looks deeper, not shorter


def _tiny_model(
    events: pl.DataFrame, schema: EventSchema, tmp_path: Path, items: pl.DataFrame | None = None
) -> LoadedModel:
    """An untrained ATRank over ``events`` prepared with ``schema`` (and item table ``items``)."""
    prepare_dataset(
        events, schema=schema, settings=PrepareSettings(), out_dir=tmp_path / "p", items=items
    )
    vocab = Vocab.load(tmp_path / "p")
    torch.manual_seed(0)
    encoder = ATRank(
        **vocab.encoder_sizes(), num_time_buckets=17, max_seq_len=8, d_model=8, num_layers=1
    ).eval()
    encoder.set_item_attributes(torch.tensor(vocab.item_attribute_table(), dtype=torch.long))
    return LoadedModel(
        encoder=encoder,
        vocab=vocab,
        schema=schema,
        time_buckets=TimeBuckets(),
        max_seq_len=8,
        path=Path("model.ckpt"),
        target_behaviors=tuple(vocab.behaviors),
    )


def test_a_text_list_keeps_ids_written_with_spaces(setup, tmp_path):
    """Text ids are kept as written (' item 1' and 'item 1' are two items of the log): a .txt
    deny list of such ids denies them, as a CSV does, where its stripped lines had matched
    nothing (a warning, and the items recommended anyway). A line that is not an id as written
    still matches without its surrounding spaces (' 12 ' in a list for integer ids)."""
    events = generate_events(num_users=20, num_items=30, num_categories=3, seed=2)
    events = events.with_columns((" item " + pl.col(ITEM).cast(pl.String)).alias(ITEM))
    model = _tiny_model(events, EventSchema(), tmp_path)
    plain = _score(model, events, rules={"exclude": "none"})
    top = plain.filter(pl.col("rank") == 1)[ITEM].unique().to_list()
    assert all(item.startswith(" item ") for item in top)
    (tmp_path / "deny.txt").write_text("\n".join(top) + "\n")
    (tmp_path / "deny.csv").write_text(ITEM + "\n" + "\n".join(top) + "\n")
    for deny in ("deny.txt", "deny.csv"):
        frame = _score(model, events, rules={"exclude": "none", "deny_list": str(tmp_path / deny)})
        assert not set(frame[ITEM].to_list()) & set(top), deny
    # stray blanks around ids of an integer catalogue still match
    int_model, int_events = setup
    ids = int_model.vocab.items[ITEM].head(2).to_list()
    (tmp_path / "allow.txt").write_text(f"  {ids[0]}  \n\t{ids[1]}\n")
    frame = _score(
        int_model, int_events, rules={"exclude": "none", "allow_list": str(tmp_path / "allow.txt")}
    )
    assert set(frame[ITEM].to_list()) == set(ids)


def test_max_per_category_without_categories_warns_that_it_caps_nothing(tmp_path, caplog):
    """A model trained without a category column (or attributes, or an item table) has no
    category for any item: the cap cannot apply, and a warning says so instead of the lists
    coming out uncapped in silence."""
    events = generate_events(num_users=20, num_items=30, num_categories=3, seed=2)
    events = events.drop("category")
    schema = EventSchema(columns={c: c for c in (USER, ITEM, TIMESTAMP, EVENT_TYPE)})
    model = _tiny_model(events, schema, tmp_path)
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        frame = _score(model, events, rules={"max_per_category": 1})
    assert frame.height == events[USER].n_unique() * TOP_K
    assert "retrieval.rules.max_per_category=1 has no effect" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        _score(model, events)
    assert "max_per_category" not in caplog.text


def test_max_per_category_with_categories_does_not_warn(setup, caplog):
    model, events = setup
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        _score(model, events, rules={"max_per_category": 1})
    assert "max_per_category" not in caplog.text


def test_max_per_category_that_leaves_every_list_short_of_top_k_warns(setup, caplog):
    """Too few categories for top_k under the cap: every list comes out short (the fallback
    obeys the cap too), and a warning says how short instead of leaving it to be found."""
    model, events = setup
    categories = int(events["category"].n_unique())
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        frame = _score(model, events, top_k=20, rules={"max_per_category": 1, "exclude": "none"})
    assert frame.group_by(USER).len()["len"].max() <= categories
    assert (
        f"retrieval.rules.max_per_category=1 over the {categories} categories of the items "
        f"this job may recommend leaves at most {categories} items per list, under "
        "retrieval.top_k=20"
    ) in caplog.text


COLD_USERS = [900_001, 900_002]


def with_cold_users(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` plus two users whose events are only on items the model never saw: 900_001
    (two events in a known category) and 900_002 (one in a new category)."""
    last = events[TIMESTAMP].max()
    known_category = events["category"][0]
    new_events = pl.DataFrame(
        {
            USER: [900_001, 900_001, 900_002],
            ITEM: [777_001, 777_002, 777_003],  # items the model never saw
            "category": [known_category, known_category, "brand-new"],
            EVENT_TYPE: ["view", "purchase", "view"],
            TIMESTAMP: [last - timedelta(hours=1), last, last],
        },
        schema=events.schema,
    )
    return pl.concat([events, new_events])


def test_cold_start_rows_are_labelled(setup):
    model, events = setup
    known_category = events["category"][0]
    frame = _score(model, with_cold_users(events))
    cold = frame.filter(pl.col(USER).is_in([900_001, 900_002]))
    assert cold.height == 2 * TOP_K
    assert set(cold["source"].to_list()) <= {"category_popularity", "popularity"}
    first = cold.filter(pl.col(USER) == 900_001)
    # the user's category comes first, from the category-popularity fallback
    assert first["source"][0] == "category_popularity"
    assert first["item_category"][0] == known_category
    assert cold["explain_1_item_id"].null_count() == cold.height  # nothing to explain
    assert frame.filter(~pl.col(USER).is_in([900_001, 900_002]))["source"].unique().to_list() == [
        "model"
    ]


def _first_events(events: pl.DataFrame, count: int) -> pl.DataFrame:
    """Each user's first ``count`` events."""
    return events.sort(TIMESTAMP).filter(pl.int_range(pl.len()).over(USER) < count)


def _rows_per_user(frame: pl.DataFrame) -> dict:
    return dict(frame.group_by(USER).len().iter_rows())


def _items_left(model, log: pl.DataFrame, allowed=None, cap=None) -> dict:
    """Per user of ``log``: how many items of the catalogue (the model's and the log's new
    ones; only ``allowed`` ones when given) the user has not seen, at most ``cap`` of each
    category (the log's ``category`` of the item)."""
    catalogue = set(model.vocab.items[ITEM].to_list()) | set(log[ITEM].to_list())
    if allowed is not None:
        catalogue &= set(allowed)
    category = dict(log.group_by(ITEM).agg(pl.col("category").first()).iter_rows())
    assert cap is None or catalogue <= set(category)  # every item's category is known here
    seen = log.group_by(USER).agg(pl.col(ITEM).unique())
    left = {}
    for user, items in seen.iter_rows():
        per_category = Counter(category.get(item) for item in catalogue - set(items))
        left[user] = sum(min(n, cap or n) for n in per_category.values())
    return left


@pytest.mark.parametrize(
    "retrieval",
    [
        {},
        {"top_k": 20, "rules": {"max_per_category": 2}},
        # most users cold: fallback lists, where items of equal popularity tie
        {"min_history": 40, "rules": {"max_per_category": 2}},
    ],
    ids=["plain", "capped", "mostly-cold"],
)
def test_lists_do_not_depend_on_the_batch(setup, retrieval):
    """A user's list is the same scored alone, beside a few users or beside all of them: a
    cold user's fallback once lost the items the model would have offered it (computed for
    its row, then masked), and items tied in the fallback's score went to whichever the
    search depth (set by the batch's other rows) made torch.topk pick."""
    model, events = setup
    log = with_cold_users(events)
    alone, *others = (
        _score(model, log, batch_size=size, explanations=0, **retrieval) for size in (1, 7, 512)
    )
    for frame in others:
        assert frame.drop("score").equals(alone.drop("score"))
        # the encoder's float noise between batch shapes, nothing more
        np.testing.assert_allclose(frame["score"], alone["score"], rtol=1e-5, atol=1e-5)
    cap = retrieval.get("rules", {}).get("max_per_category")
    left = _items_left(model, log, cap=cap)
    top_k = retrieval.get("top_k", TOP_K)
    assert all(_rows_per_user(alone)[user] == min(top_k, left[user]) for user in COLD_USERS)


@pytest.mark.parametrize("batch_size", [1, 512])
def test_every_user_gets_the_items_left_when_top_k_or_an_allow_list_asks_for_more(
    setup, batch_size, caplog
):
    """top_k beyond the catalogue, or an allow list shorter than top_k: each user (cold ones
    too) gets every item the rules leave, and a user left with none is named in a warning."""
    model, events = setup
    log = with_cold_users(events)
    frame = _score(model, log, top_k=200, batch_size=batch_size, explanations=0)
    assert _rows_per_user(frame) == _items_left(model, log)
    ranks = frame.group_by(USER).agg("rank")["rank"].to_list()
    assert all(r == list(range(1, len(r) + 1)) for r in ranks)
    allowed = model.vocab.items[ITEM].head(5).to_list()
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        frame = _score(model, log, rules={"allow_list": allowed}, batch_size=batch_size)
    left = _items_left(model, log, allowed)
    assert _rows_per_user(frame) == {u: min(n, TOP_K) for u, n in left.items() if n}
    assert all(_rows_per_user(frame)[user] == len(allowed) for user in COLD_USERS)
    empty = sum(n == 0 for n in left.values())
    assert empty > 0 and f"{empty} of {len(left)} users got no recommendation" in caplog.text


def test_a_batch_of_cold_users_only_with_top_k_beyond_the_catalogue(setup, caplog):
    """min_history above every user's history: all fallback, and a warning says so (it had
    shown only as fallback_share 1.0 in the summary)."""
    model, events = setup
    short = _first_events(events, 2)
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        frame = _score(model, short, top_k=200, min_history=5, explanations=0)
    assert set(frame["source"].to_list()) <= {"category_popularity", "popularity"}
    assert _rows_per_user(frame) == _items_left(model, short)
    assert "retrieval.min_history=5: no user of this log has that many" in caplog.text
    assert "(the most is 2)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="recsys.retrieval.recommend"):
        _score(model, short, min_history=2, explanations=0)
    assert "min_history" not in caplog.text


def test_new_items_come_only_from_the_fallback(setup):
    model, events = setup
    last = events[TIMESTAMP].max()
    # a new item everyone buys now: the most popular item of the log's recent days
    buyers = events[USER].unique().head(30).to_list()
    new = pl.DataFrame(
        {
            USER: buyers,
            ITEM: [555_555] * len(buyers),
            "category": ["c00"] * len(buyers),
            EVENT_TYPE: ["purchase"] * len(buyers),
            TIMESTAMP: [last] * len(buyers),
        },
        schema=events.schema,
    )
    cold_user = new.head(1).with_columns(
        pl.lit(424_242, dtype=pl.Int64).alias(USER), pl.lit(1, dtype=pl.Int64).alias(ITEM)
    )
    frame = _score(model, pl.concat([events, new, cold_user]), rules={"exclude": "none"})
    assert frame.filter(pl.col(ITEM) == 555_555)["source"].unique().to_list() != ["model"]
    cold = frame.filter(pl.col(USER) == 424_242)
    assert 555_555 in cold[ITEM].to_list()


def test_new_items_take_their_category_from_the_item_table(tmp_path):
    """A model whose attributes came from an item table (the log has no category column, as
    the S3-Rec files): the scoring log's items new to the model take their attribute set from
    the table given to scoring (the rarest attribute the model knows is the category), so
    max_per_category caps them and the output names it. Without the table they had no
    category: never capped, item_category null."""
    events = generate_events(num_users=30, num_items=30, num_categories=3, seed=2)
    table = events.group_by(ITEM).agg(pl.col("category").first())
    table = table.select(ITEM, pl.concat_list(pl.lit("shop"), "category").alias("attributes"))
    events = events.drop("category")
    schema = EventSchema(columns={c: c for c in (USER, ITEM, TIMESTAMP, EVENT_TYPE)})
    model = _tiny_model(events, schema, tmp_path, items=table)
    known = table[ITEM].head(1).item()
    category = table.filter(pl.col(ITEM) == known)["attributes"].item()[1]
    # two new items everyone buys now, of one category the model knows; a third in none
    a, b, c = (int(events[ITEM].max()) + k for k in (1, 2, 3))
    new = pl.DataFrame({ITEM: [a, b, c], "attributes": [["shop", category]] * 2 + [["x"]]})
    last = events[TIMESTAMP].max()
    users = events[USER].unique().to_list()
    bought = pl.DataFrame(
        {
            USER: users * 3,
            ITEM: [a] * len(users) + [b] * len(users) + [c] * len(users),
            EVENT_TYPE: "purchase",
            TIMESTAMP: last,
        },
        schema=events.schema,
    )
    log = pl.concat([events, bought])
    retrieval = {"top_k": TOP_K, "min_history": 10_000, "rules": {"exclude": "none"}}
    items = pl.concat([table, new])
    every = {**retrieval, "top_k": 40}  # (the whole catalogue)
    frame = recommend_frame(model, log, schema=schema, retrieval=every, items=items)
    shown = dict(frame.filter(pl.col(ITEM) >= a).select(ITEM, "item_category").unique().rows())
    assert shown == {a: category, b: category, c: "x"}
    capped = {**retrieval, "rules": {"exclude": "none", "max_per_category": 1}}
    frame = recommend_frame(model, log, schema=schema, retrieval=capped, items=items)
    assert frame.group_by(USER, "item_category").len()["len"].max() == 1
    assert not frame.filter(pl.col(ITEM).is_in([a, b]))[USER].is_duplicated().any()
    # an item's rows in the table are united; an item the table does not list keeps its events'
    split = pl.DataFrame({ITEM: [a, a], "attributes": [["shop"], ["x"]]})
    frame = recommend_frame(model, log, schema=schema, retrieval=every, items=split)
    shown = dict(frame.filter(pl.col(ITEM) >= a).select(ITEM, "item_category").unique().rows())
    assert shown[a] == "shop" and shown.get(b) is None


def test_explanations_point_to_events_in_the_users_history(setup):
    model, events = setup
    frame = _score(model, events, rerank_top_n=10)
    history = events.select(
        pl.col(USER), pl.col(ITEM), pl.col(EVENT_TYPE), pl.col(TIMESTAMP)
    ).unique()
    for j in (1, 2, 3):
        explained = frame.filter(pl.col(f"explain_{j}_item_id").is_not_null()).select(
            USER,
            pl.col(f"explain_{j}_item_id").alias(ITEM),
            pl.col(f"explain_{j}_behavior").cast(pl.String).alias(EVENT_TYPE),
            pl.col(f"explain_{j}_timestamp").alias(TIMESTAMP),
        )
        assert explained.height > 0
        assert (
            explained.join(history, on=[USER, ITEM, EVENT_TYPE, TIMESTAMP], how="anti").height == 0
        )
    weights = frame.select(pl.col("^explain_._weight$").fill_null(0)).to_numpy()
    assert np.all(weights[:, :-1] >= weights[:, 1:] - 1e-6)  # strongest first
    assert np.all(weights.sum(axis=1) <= 1 + 1e-5)
    short = _score(model, events, explanations=1)
    assert [c for c in short.columns if c.startswith("explain_")][-1] == "explain_1_weight"


@pytest.mark.parametrize("batch_size", [1, 512])
def test_users_with_fewer_events_than_explanations_get_null_explanations(setup, batch_size):
    """Every user of a batch with fewer events than ``explanations`` (3): the missing
    explanations are nulls, and the columns are those of any other batch."""
    model, events = setup
    short = _first_events(events, 2)
    frame = _score(model, short, batch_size=batch_size)
    assert frame.schema == _score(model, events).schema
    assert frame.height == short[USER].n_unique() * TOP_K
    assert frame["explain_1_item_id"].null_count() < frame.height
    third = frame.select(pl.col("^explain_3_.*$").null_count())
    assert third.row(0) == (frame.height,) * 4


def test_sasrec_scores_and_explains(setup):
    model, events = setup
    torch.manual_seed(1)
    sasrec = SASRec(num_items=model.vocab.num_items, max_seq_len=12, d_model=16).eval()
    frame = _score(LoadedModel(**{**model.__dict__, "encoder": sasrec}), events, explanations=2)
    assert frame["explain_1_weight"].null_count() == 0


def test_target_behavior_must_be_learned(setup):
    model, events = setup
    narrow = LoadedModel(**{**model.__dict__, "target_behaviors": ("purchase",)})
    _score(narrow, events, rules={"target_behavior": "purchase"})
    with pytest.raises(ValueError, match="trained to predict"):
        _score(narrow, events, rules={"target_behavior": "view"})
    with pytest.raises(ValueError, match="not one of the model's behaviours"):
        _score(model, events, rules={"target_behavior": "wishlist"})


@pytest.mark.parametrize(
    "retrieval, message",
    [
        ({"top_k": 0}, "top_k"),
        ({"item_chunk_size": -5}, "item_chunk_size"),
        ({"explanations": 7}, "explanations"),
        ({"rules": {"max_per_category": 0}}, "max_per_category"),
        ({"rules": {"exclude": ["teleport"]}}, "exclude"),
        ({"rules": {"colour": "red"}}, "unknown keys"),
        ({"topk": 3}, "unknown keys"),
        # inf had stopped the job with a bare OverflowError from deep in the catalogue
        ({"popularity_days": float("inf")}, "popularity_days=inf must be a finite number"),
        ({"popularity_days": float("nan")}, "popularity_days=nan must be a finite number"),
    ],
)
def test_absurd_settings_are_refused(setup, retrieval, message):
    model, events = setup
    with pytest.raises(ValueError, match=message):
        recommend_frame(model, events, retrieval=retrieval)


def test_a_popularity_window_longer_than_the_log_counts_every_event(setup):
    """A finite ``popularity_days`` reaching back before 1970 (1e300) scores as null (all),
    where it had failed in polars on an integer too large."""
    model, events = setup
    cold = {"min_history": 10**6}  # every row from the fallback, which popularity orders
    everything = _score(model, events, popularity_days=None, **cold)
    assert_frame_equal(_score(model, events, popularity_days=1e300, **cold), everything)


def test_the_summary_names_every_source_even_when_it_gave_no_row(setup):
    """``_summary.json`` had listed only the sources that gave rows (a job of model rows alone
    had no ``source_share.popularity``), and a job that recommended nothing had
    ``fallback_share`` 1.0. Every source is named, 0.0 where it gave none."""
    model, events = setup
    options = ScoringOptions(top_k=TOP_K)
    data = ScoringData.build(
        model, load_events(events, EventSchema()), rules=Rules(), options=options
    )
    recommender = Recommender(model, data, rules=Rules(), options=options)
    counts = {"train_counts": model.vocab.item_train_counts(), "recommendable": 10}
    frame = recommender.recommend(np.arange(data.store.num_users))
    assert set(frame["source"]) == {"model"}  # every user of the log has a history
    summary = summarize(frame.lazy(), data.catalogue, **counts)
    assert summary["source_share"] == {"model": 1.0, "category_popularity": 0.0, "popularity": 0.0}
    assert summary["fallback_share"] == 0.0
    nothing = summarize(recommender.empty().lazy(), data.catalogue, **counts)
    assert nothing["rows"] == 0
    assert nothing["source_share"] == dict.fromkeys(summary["source_share"], 0.0)
    assert nothing["fallback_share"] == 0.0


def test_every_part_has_the_same_parquet_schema_and_rows_in_user_and_rank_order(setup, tmp_path):
    """What the README promises a warehouse load: a part of fallback rows alone, or of no
    rows, has the columns and Parquet types of a part of model rows (no null-typed column),
    and the rows run by user id, then rank."""
    model, events = setup
    parts = {
        "model": _score(model, events),
        "fallback": _score(model, events, min_history=10**6),
        "empty": _score(model, events).head(0),
    }
    schemas = {}
    for name, frame in parts.items():
        frame.write_parquet(tmp_path / f"{name}.parquet", statistics=False)
        schemas[name] = pq.read_schema(tmp_path / f"{name}.parquet")
    assert set(parts["fallback"]["source"]) != {"model"}
    assert parts["fallback"]["explain_1_item_id"].null_count() == parts["fallback"].height
    assert all(schemas[name].equals(schemas["model"]) for name in schemas)
    for frame in parts["model"], parts["fallback"]:
        assert_frame_equal(frame, frame.sort(USER, "rank", maintain_order=True))


def test_numpy_integers_are_integers(setup):
    """Settings computed in a notebook (``np.int64``) are taken as the integers they are."""
    model, events = setup
    expected = _score(model, events, rerank_top_n=8, rules={"max_per_category": 2})
    frame = recommend_frame(
        model,
        events,
        retrieval={
            "top_k": np.int64(TOP_K),
            "rerank_top_n": np.int32(8),
            "explanations": np.int64(3),
            "rules": {"max_per_category": np.int64(2)},
        },
    )
    assert frame.equals(expected)


def test_log_of_another_shop_is_refused(setup):
    model, events = setup
    other = events.with_columns((pl.col(ITEM) + 10_000_000).alias(ITEM))
    with pytest.raises(DataError, match="none of its .* item ids are in the model's vocabulary"):
        _score(model, other)


def test_an_empty_item_id_of_an_earlier_vocabulary_is_never_recommended(setup, caplog):
    """A model trained before an empty text id was read as a missing one (an export's lost
    item id, "") holds "" as an item of its vocabulary; after the upgrade the log's "" rows are
    null_id bad rows, but scoring recommended the "" item to every user whose list reached it,
    an id recsys itself now reads as missing. It is now never recommended, with a warning
    naming it and the fix."""
    model, events = setup
    plain = model.vocab.to_plain()
    lost = plain["item_id"][0]
    ids = ["" if i == lost else str(i) for i in plain["item_id"]]
    old = dataclasses.replace(
        model, vocab=Vocab.from_plain({**plain, "item_id": ids, "item_id_type": "String"})
    )
    log = events.filter(pl.col(ITEM) != lost).with_columns(pl.col(ITEM).cast(pl.String))
    everything = {"top_k": len(ids), "rules": {"exclude": "none"}}
    with caplog.at_level("WARNING"):
        frame = recommend_frame(old, log, retrieval=everything)
    assert frame.height and frame.filter(pl.col(ITEM) == "").is_empty()
    assert frame.filter(pl.col(ITEM).is_null()).is_empty()
    denied = recommend_frame(
        old, log, retrieval={**everything, "rules": {"exclude": "none", "deny_list": [""]}}
    )
    assert_frame_equal(frame, denied)  # as if deny-listed: the other items' lists unchanged
    assert 'item id ""' in caplog.text and "retrain" in caplog.text


@pytest.mark.parametrize("frame", ["polars", "pandas"])
def test_categorical_item_ids_score_as_their_ids(setup, frame):
    """An item column of categories (pandas ``category``, a dictionary-encoded Parquet column)
    is matched with an integer vocabulary by its values, like the same ids as text."""
    model, events = setup
    if frame == "polars":
        log = events.with_columns(pl.col(ITEM).cast(pl.String).cast(pl.Categorical))
    else:
        log = events.to_pandas()
        log[ITEM] = log[ITEM].astype(str).astype("category")
    assert _score(model, log).equals(_score(model, events))


def first_rows(model, events, count: int):
    """The scoring batch of the first ``count`` users' whole histories."""
    store = SequenceStore.from_frame(
        scoring_sequences(load_events(events, EventSchema()), vocab=model.vocab)
    )
    rows = TargetRows(
        store,
        store.lengths,
        max_seq_len=12,
        time_buckets=model.time_buckets,
        has_target=False,
        query_time=int(store.timestamp.max()),
    )
    return rows[list(range(count))]


def test_two_stage_reorders_only_the_head_and_respects_exclusion(setup):
    model, events = setup
    batch = first_rows(model, events, 8)
    with torch.no_grad():
        output = model.encoder(*batch.model_inputs())
        retrieval = model.encoder.score_items(output.query)
        ranking = two_stage(model.encoder, output, top_k=15, rerank_top_n=10, exclude=batch.item)
    top15 = retrieval.scatter(1, batch.item, -torch.inf).topk(15).indices
    # the first 10 are the same set as retrieval's first 10, the rest in retrieval order
    assert torch.equal(ranking.items[:, :10].sort().values, top15[:, :10].sort().values)
    assert torch.equal(ranking.items[:, 10:], top15[:, 10:])
    assert ranking.reranked[:, :10].all() and not ranking.reranked[:, 10:].any()
    for row in range(8):
        assert not set(ranking.items[row].tolist()) & set(batch.item[row].tolist())


def test_two_stage_keeps_the_score_a_rule_gave_seen_items(setup):
    """seen_items=zero (P1): the history is scored 0, and re-ranking must not give those items
    the model's score back. Every other item here scores far below 0, so the history fills
    the head of the retrieval list."""
    model, events = setup
    batch = first_rows(model, events, 8)
    with torch.no_grad():
        output = model.encoder(*batch.model_inputs())
        raw = model.encoder.score_items(output.query) - 100.0
        scores = apply_seen_policy(raw, batch.item, "zero")
        seen = seen_mask(raw, batch.item)
        ranking = two_stage(
            model.encoder, output, top_k=15, rerank_top_n=10, scores=scores, fixed=seen
        )
        unfixed = two_stage(model.encoder, output, top_k=15, rerank_top_n=10, scores=scores)
    head_seen = seen.gather(1, ranking.items[:, :10])
    assert head_seen.any()
    assert (ranking.scores[:, :10][head_seen] == 0).all()
    assert (ranking.scores[:, :10].diff(dim=1) <= 0).all()  # the head is in score order
    # without the mask the model's re-rank scores replace the rule's 0
    assert (unfixed.scores[:, :10][seen.gather(1, unfixed.items[:, :10])] != 0).any()


def test_a_trained_rerank_head_reorders_the_scored_lists(setup):
    """The fixture's head is untrained (its output layer is 0: re-ranking keeps retrieval's
    order), so train it by hand: scoring with rerank_top_n must then give other lists than
    retrieval alone, each drawn from the user's first rerank_top_n retrieved items."""
    model, events = setup
    encoder = copy.deepcopy(model.encoder)
    torch.manual_seed(1)
    with torch.no_grad():
        torch.nn.init.normal_(encoder.rerank_output.weight)
    trained = dataclasses.replace(model, encoder=encoder)
    reranked = _score(trained, events, rerank_top_n=10)
    assert not reranked[ITEM].equals(_score(trained, events)[ITEM])
    head = recommend_frame(trained, events, retrieval={"top_k": 10}).group_by(USER).agg(ITEM)
    lists = reranked.group_by(USER).agg(ITEM).join(head, on=USER, suffix="_head")
    for items, candidates in zip(lists[ITEM].to_list(), lists[f"{ITEM}_head"].to_list()):
        assert set(items) <= set(candidates)


def test_as_of_limits_history(setup):
    model, events = setup
    events = load_events(events, EventSchema())
    cut = events["timestamp"].sort()[events.height // 2]
    early = scoring_sequences(events, vocab=model.vocab, as_of=cut)
    n_events = early["timestamp"].list.len().sum()
    assert n_events == events.filter(pl.col("timestamp") <= cut).height
    assert early["timestamp"].explode().max() <= int(cut.timestamp())


def test_users_with_no_event_before_as_of_are_counted_in_the_log(setup, caplog):
    model, events = setup
    first = events.group_by(USER).agg(pl.col(TIMESTAMP).min())[TIMESTAMP].sort()
    cut = first[first.len() // 2]  # about half the users start after it
    later = int((first > cut).sum())
    with caplog.at_level("INFO", logger="recsys.retrieval.recommend"):
        recs = recommend_frame(model, events, as_of=cut)
    assert recs[USER].n_unique() == events[USER].n_unique() - later
    assert f"{later} users of the log have no event before retrieval.as_of" in caplog.text
    # the same moment given among the retrieval keys, as conf/retrieval names it
    assert recommend_frame(model, events, retrieval={"as_of": cut.isoformat()}).equals(recs)
    with pytest.raises(ValueError, match="retrieval.accelerator='tpu'"):
        recommend_frame(model, events, retrieval={"accelerator": "tpu"})


# -- building blocks ---------------------------------------------------------------------------
def test_chunked_exact_index_matches_brute_force():
    torch.manual_seed(0)
    keys, bias, query = torch.randn(103, 8), torch.randn(103), torch.randn(6, 8)
    blocked = torch.zeros(103, dtype=torch.bool)
    blocked[:2] = True
    blocked[50] = True
    exclude = torch.randint(0, 103, (6, 4))
    scores, items = ExactIndex(keys, bias, blocked, item_chunk_size=17).search(query, 10, exclude)
    full = query @ keys.T + bias
    full[:, blocked] = -torch.inf
    full.scatter_(1, exclude, -torch.inf)
    expected_scores, expected_items = full.topk(10)
    torch.testing.assert_close(scores, expected_scores)
    assert torch.equal(items, expected_items)


def test_chunked_topk_pads_when_too_few_items_remain():
    blocked = torch.tensor([True, True, False, False])
    scores, items = chunked_topk(
        lambda s, e: torch.ones(1, e - s), 4, 3, blocked=blocked, item_chunk_size=2
    )
    assert torch.isneginf(scores[0, 2]) and items[0, 2] == 0
    assert sorted(items[0, :2].tolist()) == [2, 3]


def test_chunked_topk_lists_padding_for_blocked_items_it_had_to_take():
    # 2 of 4 items blocked, 3 asked for: the third place is -inf and names no blocked item
    blocked = torch.tensor([False, True, True, False])
    scores, items = chunked_topk(lambda s, e: torch.ones(1, e - s), 4, 3, blocked=blocked)
    assert torch.isneginf(scores[0, 2]) and items[0, 2] == 0
    assert sorted(items[0, :2].tolist()) == [0, 3]


class _ReversingHead(torch.nn.Module):
    """Retrieval had scored items by index; the re-rank head scores them by minus it."""

    def rerank_scores(self, output, candidates):
        return -candidates.float()


def test_two_stage_reranks_rerank_top_n_candidates_even_beyond_top_k():
    # retrieval's top 4 of items 2..7 is 7, 6, 5, 4; the head reverses them. With top_k=1
    # and rerank_top_n=4 the head must see all four, so item 4 comes first
    scores = torch.arange(8.0)[None, :].clone()
    scores[:, :2] = -torch.inf
    ranking = two_stage(_ReversingHead(), None, top_k=1, rerank_top_n=4, scores=scores)
    assert ranking.items.tolist() == [[4, 5, 6, 7]]
    assert ranking.reranked.all()


def test_cap_per_category_never_caps_items_without_a_category():
    category = torch.tensor([0, 0, 1, 0, 0, 1])  # items 3 and 4 have no category (0)
    items = torch.tensor([[3, 2, 4, 5]])
    keep = cap_per_category(items, category, torch.ones(1, 4, dtype=torch.bool), cap=1)
    assert keep.tolist() == [[True, True, True, False]]


def test_mask_items_only_touches_its_chunk():
    scores = torch.zeros(2, 3)  # items 10, 11, 12
    mask_items(scores, torch.tensor([[11, 4, 0], [12, 12, 30]]), start=10)
    assert torch.isneginf(scores).tolist() == [[False, True, False], [False, False, True]]


def test_cap_per_category_keeps_the_best_of_each_category():
    category = torch.tensor([0, 0, 1, 1, 1, 2, 0])  # items 0..6; item 6 has no category
    items = torch.tensor([[2, 3, 5, 4, 6, 6]])
    valid = torch.tensor([[True, True, True, True, True, False]])
    keep = cap_per_category(items, category, valid, cap=1)
    assert keep.tolist() == [[True, False, True, False, True, False]]
    assert take_first(keep, 4).tolist() == [[0, 2, 4, -1]]
    assert take_first(keep, 8).tolist() == [[0, 2, 4] + [-1] * 5]  # fewer candidates than k


def test_faiss_flat_index_agrees_with_exact():
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    keys, bias, query = torch.randn(60, 8), torch.randn(60), torch.randn(4, 8)
    blocked = torch.zeros(60, dtype=torch.bool)
    blocked[:2] = True
    exclude = torch.randint(2, 60, (4, 3))
    exact = ExactIndex(keys, bias, blocked).search(query, 5, exclude)
    approx = FaissIndex(keys, bias, blocked, kind="flat").search(query, 5, exclude)
    assert torch.equal(exact[1], approx[1])
    torch.testing.assert_close(exact[0], approx[0], rtol=1e-4, atol=1e-4)
    hnsw = FaissIndex(keys, bias, blocked, kind="hnsw").search(query, 5, exclude)
    assert not (set(hnsw[1].flatten().tolist()) & {0, 1})


def test_equal_norms_turn_the_largest_inner_product_into_the_nearest_neighbour():
    from recsys.retrieval.index import _equal_norms

    rng = np.random.default_rng(0)
    vectors = (rng.normal(size=(500, 9)) * rng.lognormal(0, 1, size=(500, 1))).astype(np.float32)
    queries = rng.normal(size=(20, 9)).astype(np.float32)
    indexed = _equal_norms(vectors)
    np.testing.assert_allclose(
        np.linalg.norm(indexed, axis=1), np.linalg.norm(vectors, axis=1).max(), rtol=1e-5
    )
    padded = np.column_stack([queries, np.zeros(len(queries), np.float32)])
    distance = ((padded[:, None, :] - indexed[None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(
        np.argsort(distance, axis=1)[:, :10], np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    )


@pytest.mark.parametrize("metric", ["l2", "inner_product"])
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_faiss_finds_the_top_10_and_returns_exact_scores(kind, metric):
    """Keys that share their attribute half (ATRank's default layout), queries near items: both
    forms find nearly all of the exact top 10, and the scores are ``query · key + bias``."""
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    items, categories, half = 20_000, 50, 16
    category = torch.randint(0, categories, (items,))
    keys = torch.cat([torch.randn(items, half), torch.randn(categories, half)[category]], 1)
    bias = 0.5 * torch.randn(items)
    near = keys[torch.randint(0, items, (256,))]
    query = 3 * near / near.norm(dim=1, keepdim=True) + 0.3 * torch.randn(256, 2 * half)
    blocked = torch.zeros(items, dtype=torch.bool)
    blocked[:2] = True
    exclude = torch.randint(2, items, (256, 5))
    _, exact_items = ExactIndex(keys, bias, blocked).search(query, 10, exclude)
    settings = {"nlist": 128, "nprobe": 32} if kind == "ivf" else {}
    index = FaissIndex(keys, bias, blocked, kind=kind, metric=metric, **settings)
    scores, found = index.search(query, 10, exclude)
    recall = np.mean(
        [len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(found, exact_items)]
    )
    assert recall >= 0.9, recall
    torch.testing.assert_close(scores, (query[:, None, :] * keys[found]).sum(-1) + bias[found])
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # best first
    assert not (found[:, :, None] == exclude[:, None, :]).any()
    with pytest.raises(ValueError, match="retrieval.faiss.metric='cosine'"):
        FaissIndex(keys[:50], bias[:50], blocked[:50], kind=kind, metric="cosine")


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_faiss_index_is_kept_in_the_cache_and_loaded_by_the_next_job(tmp_path, caplog, kind):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    keys, bias, query = torch.randn(200, 8), torch.randn(200), torch.randn(6, 8)
    blocked = torch.zeros(200, dtype=torch.bool)
    blocked[:2] = True
    settings = {"kind": kind, "nlist": 4, "cache_dir": tmp_path}
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        first = FaissIndex(keys, bias, blocked, **settings)
    assert "built" in caplog.text and [p.name for p in tmp_path.iterdir()] == [
        first.cache_file.name
    ]  # one file, no partial one left beside it
    caplog.clear()
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        again = FaissIndex(keys, bias, blocked, **settings, ef_search=64, nprobe=2)
    assert "loaded from the cache" in caplog.text and "built" not in caplog.text
    assert again.cache_file == first.cache_file  # query-time settings share the file ...
    if kind == "hnsw":  # ... and are applied to the loaded index
        assert again.index.hnsw.efSearch == 64
    else:
        assert again.index.nprobe == 2
    expected = FaissIndex(keys, bias, blocked, kind=kind, nlist=4, ef_search=64, nprobe=2)
    for got, want in zip(again.search(query, 5), expected.search(query, 5), strict=True):
        assert torch.equal(got, want)

    # another model's keys, other rules (blocked items) or other build settings: other files
    changed = [
        FaissIndex(keys + 1, bias, blocked, **settings),
        FaissIndex(keys, bias, blocked.roll(1), **settings),
        FaissIndex(keys, bias, blocked, **{**settings, "hnsw_m": 8, "nlist": 5}),
        FaissIndex(keys, bias, blocked, **settings, metric="inner_product"),
    ]
    assert len({first.cache_file, *(index.cache_file for index in changed)}) == 5


def test_an_unreadable_faiss_cache_file_is_rebuilt_and_replaced(tmp_path, caplog):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    keys, bias = torch.randn(50, 8), torch.randn(50)
    blocked = torch.zeros(50, dtype=torch.bool)
    path = FaissIndex(keys, bias, blocked, cache_dir=tmp_path).cache_file
    path.write_bytes(path.read_bytes()[:100])  # e.g. a disk that filled up before the rename
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        index = FaissIndex(keys, bias, blocked, cache_dir=tmp_path)
    assert "could not be read" in caplog.text and "built" in caplog.text
    assert index.index.ntotal == 50 and path.stat().st_size > 100
    # a readable index of other vectors under that name (copied by hand, say) is not used
    other = FaissIndex(keys[:40], bias[:40], blocked[:40], cache_dir=tmp_path / "other")
    path.write_bytes(other.cache_file.read_bytes())
    caplog.clear()
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        index = FaissIndex(keys, bias, blocked, cache_dir=tmp_path)
    assert "holds 40 x 10 vectors" in caplog.text and index.index.ntotal == 50


def test_a_faiss_cache_that_cannot_be_written_is_named_and_scoring_goes_on(tmp_path, caplog):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    keys, bias, query = torch.randn(50, 8), torch.randn(50), torch.randn(2, 8)
    blocked = torch.zeros(50, dtype=torch.bool)
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    with caplog.at_level("WARNING", logger="recsys.retrieval.index"):
        index = FaissIndex(keys, bias, blocked, kind="flat", cache_dir=not_a_folder)
    assert "not saved to the cache" in caplog.text and "retrieval.faiss.cache_dir" in caplog.text
    assert index.search(query, 3)[1].shape == (2, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]


def test_the_faiss_cache_keeps_the_most_recently_used_files(tmp_path, caplog):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    import os

    from recsys.retrieval.index import FaissIndex

    torch.manual_seed(0)
    keys, bias = torch.randn(30, 8), torch.randn(30)
    blocked = torch.zeros(30, dtype=torch.bool)

    def job(shift: float, **settings) -> Path:
        return FaissIndex(keys + shift, bias, blocked, kind="flat", cache_dir=tmp_path, **settings)

    (tmp_path / "notes.txt").write_text("not an index: never deleted")
    a = job(0.0, cache_keep=2).cache_file
    os.utime(a, (100, 100))  # built long ago ...
    b = job(1.0, cache_keep=2).cache_file
    os.utime(b, (200, 200))
    assert job(0.0, cache_keep=2).cache_file == a  # ... but loaded (used) again just now
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        c = job(2.0, cache_keep=2).cache_file
    # the least recently used file went, not the oldest build
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, c.name, "notes.txt"])
    assert f"{b} deleted (retrieval.faiss.cache_keep=2)" in caplog.text
    job(3.0, cache_keep=None)  # null: nothing is deleted
    assert len(list(tmp_path.glob("faiss-*.index"))) == 3
    job(4.0, cache_keep=1)  # keep 1: only the index this job used
    assert [p.name for p in tmp_path.glob("faiss-*.index")] == [job(4.0).cache_file.name]
    for wrong in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="retrieval.faiss.cache_keep"):
            job(0.0, cache_keep=wrong)


def test_bad_row_policies_are_given_to_recommend_frame(setup):
    """The message of a bad row names data.bad_rows.<kind>; a notebook passes the same policy
    as ``bad_rows``, and the rows it drops are the only difference."""
    model, events = setup
    odd = events.head(1).with_columns(pl.lit("wishlist").alias("event_type"))
    with pytest.raises(DataError, match=r"data.bad_rows.unknown_behavior"):
        recommend_frame(model, pl.concat([events, odd]), retrieval={"top_k": TOP_K})
    dropped = recommend_frame(
        model,
        pl.concat([events, odd]),
        retrieval={"top_k": TOP_K},
        bad_rows={"unknown_behavior": "drop"},
    )
    assert_frame_equal(dropped, _score(model, events))
    with pytest.raises(ValueError, match=r"data.bad_rows.unknown_behavior='skip': use one of"):
        recommend_frame(model, events, bad_rows={"unknown_behavior": "skip"})


def test_mlflow_params_carry_bad_row_policies_to_recommend_frame(setup):
    """The MLflow model's flat params (recsys.mlflow_model) reach the bad-row policies a
    message names as data.bad_rows.<kind>: ``bad_rows='unknown_behavior=drop,...'``."""
    from recsys.tasks.score import recommend_kwargs_from_params

    model, events = setup
    odd = events.head(1).with_columns(pl.lit("wishlist").alias("event_type"))
    kwargs = recommend_kwargs_from_params(
        {"top_k": TOP_K, "bad_rows": " unknown_behavior=drop, duplicate = drop"}
    )
    assert kwargs["bad_rows"] == {"unknown_behavior": "drop", "duplicate": "drop"}
    assert kwargs["as_of"] is None and kwargs["retrieval"]["top_k"] == TOP_K
    dropped = recommend_frame(model, pl.concat([events, odd]), **kwargs)
    assert_frame_equal(dropped, _score(model, events))
    assert recommend_kwargs_from_params({})["bad_rows"] is None
    with pytest.raises(ValueError, match="kind=policy pairs"):
        recommend_kwargs_from_params({"bad_rows": "drop"})
    with pytest.raises(ValueError, match=r"data.bad_rows has unknown kind\(s\) \['wishlist'\]"):
        recommend_frame(
            model, events, **recommend_kwargs_from_params({"bad_rows": "wishlist=drop"})
        )
    with pytest.raises(ValueError, match=r"unknown params \['bad_row'\]"):
        recommend_kwargs_from_params({"bad_row": "duplicate=drop"})


def test_a_user_whose_every_row_is_dropped_is_named_in_a_warning(setup, caplog):
    """A ``drop`` policy that sets aside all of a user's rows leaves that user without a
    history and without a list: the rows were counted, and now the user is named too."""
    model, events = setup
    lost = events.head(2).with_columns(
        pl.lit(-7).cast(events.schema["user_id"]).alias("user_id"),
        pl.lit("wishlist").alias("event_type"),
    )
    with caplog.at_level("WARNING", logger="recsys.data.pipeline"):
        recommend_frame(
            model,
            pl.concat([events, lost]),
            retrieval={"top_k": TOP_K},
            bad_rows={"unknown_behavior": "drop"},
        )
    assert "1 user(s) had every row set aside by data.bad_rows, so they get no list (e.g. -7)" in (
        caplog.text
    )


def test_recommend_frame_takes_a_device_by_name_or_refuses_it_by_name(setup):
    """``device=`` went to torch unchecked: "auto" or "gpu" failed with torch's own error."""
    model, events = setup
    expected = recommend_frame(model, events)  # the CPU
    assert_frame_equal(recommend_frame(model, events, device=torch.device("cpu")), expected)
    assert_frame_equal(recommend_frame(model, events, device="cpu"), expected)
    with pytest.raises(ValueError, match=r"^device='tpu': use one of"):
        recommend_frame(model, events, device="tpu")
    if not torch.cuda.is_available():  # (auto: the GPU where there is one)
        assert_frame_equal(recommend_frame(model, events, device="auto"), expected)
        with pytest.raises(ValueError, match=r"^device=gpu: this machine has no CUDA GPU"):
            recommend_frame(model, events, device="gpu")


def test_a_log_later_than_now_scores_up_to_a_later_as_of(setup):
    """Events after the wall clock but before the scoring ``as_of`` (a log of simulated or
    shifted times) are not future_timestamp rows; those after both still are."""
    model, events = setup
    shift = pl.duration(days=365 * 40)
    later = events.with_columns(pl.col("timestamp") + shift)
    end = later["timestamp"].max()
    moved = recommend_frame(model, later, as_of=end)
    assert_frame_equal(
        moved.drop(cs.starts_with("explain_") & cs.ends_with("timestamp")),
        recommend_frame(model, events, as_of=events["timestamp"].max()).drop(
            cs.starts_with("explain_") & cs.ends_with("timestamp")
        ),
    )
    with pytest.raises(DataError, match=r"\[future_timestamp\]"):
        recommend_frame(model, later, as_of=events["timestamp"].max())


def test_scoring_applies_the_duplicate_policy(setup, caplog):
    """Scoring applies data.bad_rows to the log it scores, duplicates included: a repeated
    event was removed silently whatever data.bad_rows.duplicate said (``error`` did not stop
    the job, and ``drop``'s warning did not count the repeats preparation counts)."""
    model, events = setup
    repeated = pl.concat([events, events.slice(7, 2)])  # rows 7 and 8 again, at the end
    with pytest.raises(DataError, match=r"2 row\(s\) .*\[duplicate\] \(row \d+, row \d+\)"):
        recommend_frame(model, repeated, bad_rows={"duplicate": "error"})
    with caplog.at_level("WARNING", logger="recsys.data.validate"):
        dropped = recommend_frame(model, repeated)  # the default policy: drop
    assert "2 bad row(s) set aside by data.bad_rows policy: duplicate=2" in caplog.text
    assert_frame_equal(dropped, recommend_frame(model, events))


def test_a_log_whose_every_row_is_set_aside_says_so(setup):
    model, events = setup
    odd = events.head(5).with_columns(pl.lit("wishlist").alias("event_type"))
    with pytest.raises(DataError, match=r"no events left after setting aside bad rows \{'unknown"):
        recommend_frame(model, odd, bad_rows={"unknown_behavior": "drop"})


def test_an_order_only_log_s_explanations_have_no_time(setup):
    """An order-only log's times are its row numbers (1970-01-01 plus microseconds): they
    were shown as the explained events' times."""
    model, events = setup
    columns = {k: v for k, v in EventSchema().columns.items() if k != "timestamp"}
    order_only = dataclasses.replace(model, schema=EventSchema(columns=columns))
    ordered = events.sort("user_id", "timestamp", maintain_order=True).drop("timestamp")
    frame = recommend_frame(order_only, ordered, retrieval={"top_k": TOP_K})
    assert frame.height == events["user_id"].n_unique() * TOP_K
    assert frame["explain_1_item_id"].null_count() < frame.height  # explained, ...
    for j in (1, 2, 3):  # ... without a time
        assert frame[f"explain_{j}_timestamp"].null_count() == frame.height


def test_an_order_only_log_refuses_an_as_of(setup):
    """An order-only log's times are microseconds after 1970: scored ``as_of`` a real date,
    every user's last position was told a gap of decades (the top time bucket, never trained
    there) and the lists changed, silently."""
    model, events = setup
    columns = {k: v for k, v in EventSchema().columns.items() if k != "timestamp"}
    order_only = dataclasses.replace(model, schema=EventSchema(columns=columns))
    ordered = events.sort("user_id", "timestamp", maintain_order=True).drop("timestamp")
    for given in ({"as_of": "2024-03-01T00:00:00Z"}, {"retrieval": {"as_of": "2024-03-01"}}):
        with pytest.raises(ValueError, match=r"retrieval.as_of=2024-03-01.*the log is order-only"):
            recommend_frame(order_only, ordered, **given)


def test_a_log_mapped_otherwise_than_the_model_is_refused_with_the_overrides_to_set(setup):
    """A scoring job's data settings that differ from the model's were refused with a generic
    hint: other behaviours asked to map the log's event types with data.behavior_aliases
    (the fix is data.behaviors, the model's list), and a column left unmapped to set
    ``data.columns.<name>=<your column>``; the message now names the overrides."""
    model, events = setup
    trained = dataclasses.replace(
        model,
        schema=EventSchema(
            columns={**EventSchema().columns, "category": "category_path"},
            behaviors=("view", "cart", "purchase"),
            behavior_aliases={"page_view": "view", "checkout": "purchase"},
        ),
    )
    with pytest.raises(DataError) as info:
        recommend_frame(trained, events, schema=EventSchema(columns={USER: USER, ITEM: ITEM}))
    message = str(info.value)
    assert "data.behaviors=[view,cart,purchase]" in message
    assert "trained with 'data.behavior_aliases={page_view: view, checkout: purchase}'" in message
    assert "data.columns.category=category_path" in message
    assert "data.columns.timestamp=timestamp" in message


def test_a_model_trained_order_only_refuses_a_timed_log_if_it_reads_time(setup):
    """A model of an order-only log learned one time bucket (no gap); scoring a log with
    timestamps gave its tokens real gaps (buckets up to the last), whose rows it never
    trained, silently. SASRec reads no time, so it may score the log in its time order."""
    model, events = setup
    columns = {k: v for k, v in EventSchema().columns.items() if k != "timestamp"}
    order_only = dataclasses.replace(model, schema=EventSchema(columns=columns))
    with pytest.raises(DataError, match=r"trained on an order-only log .*'timestamp'"):
        recommend_frame(order_only, events, schema=EventSchema())
    ordered = events.sort("user_id", "timestamp", maintain_order=True).drop("timestamp")
    assert _score(order_only, ordered).height == events["user_id"].n_unique() * TOP_K
    sasrec = SASRec(num_items=model.encoder.num_items, max_seq_len=12, d_model=16, num_layers=1)
    items_only = dataclasses.replace(order_only, encoder=sasrec.eval())
    frame = recommend_frame(items_only, events, schema=EventSchema(), retrieval={"top_k": TOP_K})
    assert frame.height == events["user_id"].n_unique() * TOP_K


def test_the_model_digest_covers_the_settings_that_shape_scores(setup):
    """A resumed scoring job takes parts written under the same model digest as its own: the
    same weights with another window, time buckets or target behaviours score otherwise."""
    from dataclasses import replace

    from recsys.checkpoint import model_digest

    model, _ = setup
    digest = model_digest(model)
    assert model_digest(replace(model)) == digest
    for change in (
        {"max_seq_len": 8},
        {"time_buckets": TimeBuckets(unit_seconds=86_400)},
        {"target_behaviors": ("purchase",)},
    ):
        assert model_digest(replace(model, **change)) != digest, change
    # a transition prior, and its weight, shape the scores too
    from recsys.model.transition import TransitionCounts, TransitionPrior

    num_items = model.vocab.num_items
    counts = TransitionCounts(
        torch.tensor([0] * 3 + [1] * (num_items - 2)), torch.tensor([3]), torch.tensor([4])
    )
    weighted = {
        w: model_digest(replace(model, transition_prior=TransitionPrior(counts, w)))
        for w in (0.5, 1.0)
    }
    assert len({digest, *weighted.values()}) == 3
    # ... and so does its shape (the recent items it reads, their decay)
    shaped = model_digest(replace(model, transition_prior=TransitionPrior(counts, 1.0, 3, 0.75)))
    assert shaped not in {digest, *weighted.values()}


def test_a_log_whose_items_the_model_mostly_lacks_is_warned_about(caplog):
    """One known id is enough not to refuse, but another shop's model scores nearly every user
    by the fallback: said at WARNING, with the share, not as a routine INFO line."""
    from types import SimpleNamespace

    from recsys.tasks.score import check_vocabulary

    vocab = SimpleNamespace(
        items=pl.DataFrame({"item_id": [1, 2, 3]}), attributes=pl.DataFrame({"attribute": []})
    )
    model = SimpleNamespace(vocab=vocab)
    with caplog.at_level("INFO", logger="recsys.tasks.score"):
        check_vocabulary(model, pl.DataFrame({"item_id": [1, 2, 3, 4]}), "log.csv")
        assert [r.levelname for r in caplog.records] == ["INFO"]
        caplog.clear()
        check_vocabulary(model, pl.DataFrame({"item_id": [1, 10, 11, 12]}), "log.csv")
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "1 of 4 item ids" in record.message
    assert "(25.0%)" in record.message and "fallback" in record.message


def test_text_ids_that_the_models_integer_ids_would_rewrite_are_named(setup, caplog):
    """'042' in a log scored by a model of integer ids is read as item 42 (an audit's finding:
    silently, while the README keeps ids as written). Canonical text ids ('42') pass quietly."""
    model, events = setup
    padded = events.with_columns(("0" + pl.col(ITEM).cast(pl.String)).alias(ITEM))
    with caplog.at_level("WARNING", logger="recsys.tasks.score"):
        frame = _score(model, padded, explanations=0)
    assert "item id(s) of the log change when read as the model's Int64 ids (e.g. '0" in caplog.text
    caplog.clear()
    plain = events.with_columns(pl.col(ITEM).cast(pl.String))
    with caplog.at_level("WARNING", logger="recsys.tasks.score"):
        assert _score(model, plain, explanations=0).equals(frame)
    assert "change when read" not in caplog.text


def test_mlflow_predict_returns_explanation_ids_as_integers_not_floats(setup):
    """``predict`` (recsys.mlflow_model) returned polars' ``to_pandas()``: an explanation item
    id column with a null (a history shorter than ``explanations``, a fallback row) became
    float64, so ids read ``23765.0`` and UInt64 ids beyond 2**53 were rounded to other ids (an
    audit's finding). They are pandas' nullable integers now, equal to recommend_frame's."""
    from recsys.mlflow_model import RecsysModel

    model, events = setup
    newcomer = events.head(1).with_columns(pl.lit(-1).cast(events.schema[USER]).alias(USER))
    pyfunc = RecsysModel()
    pyfunc.model = model
    params = {"top_k": TOP_K, "as_of": "2030-01-01T00:00:00Z"}
    predicted = pyfunc.predict(None, pl.concat([events, newcomer]).to_pandas(), params=params)
    expected = recommend_frame(
        model, pl.concat([events, newcomer]), **recommend_kwargs_from_params(params)
    )
    column = "explain_2_item_id"
    assert expected[column].null_count() > 0  # the newcomer's history is one event
    assert predicted[column].dtype == "Int64"
    assert predicted[column].tolist() == [pd.NA if v is None else v for v in expected[column]]
    assert predicted[USER].dtype == "int64"  # no null: numpy's type
