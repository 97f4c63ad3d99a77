"""Tests for recsys.data.vocab: reserved indices, deterministic ordering, category per item,
encoding, and lossless round trips through Parquet and plain lists."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys.data.synthetic import generate_events
from recsys.data.vocab import CATEGORY_INDEX, FILES, INDEX, ITEM_INDEX, TRAIN_COUNT, Vocab
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, NUM_RESERVED, PAD_IDX, UNK_IDX

BEHAVIORS = ("view", "click", "cart", "purchase")


def train_events(rows: list[tuple[str, str | None]]) -> pl.LazyFrame:
    return pl.DataFrame(rows, schema={ITEM: pl.String, CATEGORY: pl.String}, orient="row").lazy()


# item counts: b 3, a 2, c 2, d 1  -> order b, a, c (tie a/c by id), d
# categories:  b: x x y -> x;  a: y y -> y;  c: y x -> tie -> x (smallest name);  d: none -> UNK
# category sizes by training count: x = 3 (b) + 2 (c) = 5, y = 2 (a) -> x first
ROWS = [
    ("c", "y"),
    ("b", "x"),
    ("a", "y"),
    ("d", None),
    ("b", "x"),
    ("c", "x"),
    ("a", "y"),
    ("b", "y"),
]


@pytest.fixture
def vocab() -> Vocab:
    return Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS)


def test_fit_orders_items_by_train_frequency_then_id(vocab):
    expected = pl.DataFrame(
        {
            ITEM: ["b", "a", "c", "d"],
            INDEX: [2, 3, 4, 5],
            CATEGORY_INDEX: [2, 3, 2, UNK_IDX],
            TRAIN_COUNT: [3, 2, 2, 1],
        },
        schema={ITEM: pl.String, INDEX: pl.Int32, CATEGORY_INDEX: pl.Int32, TRAIN_COUNT: pl.Int64},
    )
    assert_frame_equal(vocab.items, expected)
    assert_frame_equal(
        vocab.categories,
        pl.DataFrame(
            {CATEGORY: ["x", "y"], INDEX: [2, 3]}, schema={CATEGORY: pl.String, INDEX: pl.Int32}
        ),
    )


def test_reserved_indices_and_sizes(vocab):
    assert (PAD_IDX, UNK_IDX, NUM_RESERVED) == (0, 1, 2)
    assert vocab.items[INDEX].min() == NUM_RESERVED
    assert vocab.categories[INDEX].min() == NUM_RESERVED
    assert vocab.num_items == 6
    assert vocab.num_categories == 4
    assert vocab.num_behaviors == 6
    assert vocab.item_category_table() == [PAD_IDX, UNK_IDX, 2, 3, 2, UNK_IDX]
    assert vocab.item_ids() == [None, None, "b", "a", "c", "d"]


def test_fit_is_independent_of_row_order():
    a = Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS)
    b = Vocab.fit(train_events(ROWS[::-1]), behaviors=BEHAVIORS)
    assert_frame_equal(a.items, b.items)
    assert_frame_equal(a.categories, b.categories)
    assert a.content_hash() == b.content_hash()


def test_min_item_count_leaves_rare_items_out():
    vocab = Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS, min_item_count=2)
    assert vocab.items[ITEM].to_list() == ["b", "a", "c"]
    assert vocab.items[INDEX].to_list() == [2, 3, 4]


def test_encode_maps_unknown_items_and_behaviors(vocab):
    events = pl.DataFrame(
        {
            ITEM: ["a", "zzz", "d", "b", None],
            EVENT_TYPE: ["view", "purchase", "cart", "teleport", "click"],
            "keep": [1, 2, 3, 4, 5],
        }
    )
    out = vocab.encode(events.lazy(), behavior_column=EVENT_TYPE).collect()
    assert out["keep"].to_list() == [1, 2, 3, 4, 5]  # row order kept, other columns kept
    assert out[ITEM_INDEX].to_list() == [3, UNK_IDX, 5, 2, UNK_IDX]
    assert out[ITEM_INDEX].dtype == pl.Int32
    assert out["behavior_index"].to_list() == [2, 5, 4, UNK_IDX, 3]


def test_behavior_indices_follow_funnel_order(vocab):
    out = vocab.encode(
        pl.LazyFrame({ITEM: ["a"] * 4, EVENT_TYPE: list(BEHAVIORS)}), behavior_column=EVENT_TYPE
    ).collect()
    assert out["behavior_index"].to_list() == [NUM_RESERVED + i for i in range(len(BEHAVIORS))]


def test_save_load_round_trip(vocab, tmp_path):
    vocab.save(tmp_path / "vocab")
    assert sorted(p.name for p in (tmp_path / "vocab").iterdir()) == sorted(FILES.values())
    loaded = Vocab.load(tmp_path / "vocab")
    assert_frame_equal(loaded.items, vocab.items)
    assert_frame_equal(loaded.categories, vocab.categories)
    assert loaded.behaviors == vocab.behaviors
    assert loaded.content_hash() == vocab.content_hash()


def test_plain_round_trip(vocab):
    plain = vocab.to_plain()
    # only builtin containers and scalars: safe for torch.load(weights_only=True)
    assert all(isinstance(v, list) for v in plain.values())
    back = Vocab.from_plain(plain)
    assert_frame_equal(back.items, vocab.items)
    assert_frame_equal(back.categories, vocab.categories)
    assert back.behaviors == vocab.behaviors
    assert back.content_hash() == vocab.content_hash()


def test_round_trips_on_a_realistic_vocab(tmp_path):
    events = generate_events(num_users=30, num_items=50, num_categories=4, seed=2)
    vocab = Vocab.fit(events.lazy(), behaviors=BEHAVIORS)
    assert vocab.items.height == events[ITEM].n_unique()
    vocab.save(tmp_path)
    for other in (Vocab.load(tmp_path), Vocab.from_plain(vocab.to_plain())):
        assert_frame_equal(other.items, vocab.items)
        assert_frame_equal(other.categories, vocab.categories)
        assert other.content_hash() == vocab.content_hash()
    # every item has the category it carries in the log (one category per synthetic item)
    category_of = dict(zip(vocab.categories[INDEX], vocab.categories[CATEGORY]))
    truth = dict(events.select(ITEM, CATEGORY).unique().iter_rows())
    for item, category_index in zip(vocab.items[ITEM], vocab.items[CATEGORY_INDEX]):
        assert category_of[category_index] == truth[item]


def test_content_hash_sees_every_part(vocab):
    plain = vocab.to_plain()
    changed = [
        {**plain, "item_id": ["b", "a", "c", "e"]},
        {**plain, "item_category_index": [2, 2, 2, 1]},
        {**plain, "item_train_count": [3, 2, 2, 2]},
        {**plain, "category": ["x", "z"]},
        {**plain, "behaviors": ["view", "click", "cart", "buy"]},
    ]
    hashes = {Vocab.from_plain(p).content_hash() for p in changed}
    assert len(hashes) == len(changed)
    assert vocab.content_hash() not in hashes


def test_load_from_incomplete_folder_says_what_to_run(vocab, tmp_path):
    vocab.save(tmp_path)
    (tmp_path / FILES["categories"]).unlink()
    with pytest.raises(FileNotFoundError, match="categories.parquet.*run the prepare step"):
        Vocab.load(tmp_path)
