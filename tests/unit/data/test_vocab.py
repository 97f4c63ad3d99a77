"""Tests for recsys.data.vocab: reserved indices, deterministic ordering, the attribute set of
each item (from its training events or an item table), encoding, and lossless round trips
through Parquet and plain lists."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal, assert_series_equal

from recsys.data.pipeline import load_events
from recsys.data.synthetic import generate_events
from recsys.data.vocab import (
    ATTRIBUTE,
    ATTRIBUTE_INDICES,
    FILES,
    INDEX,
    ITEM_INDEX,
    TRAIN_COUNT,
    Vocab,
)
from recsys.schema import (
    ATTRIBUTES,
    CATEGORY,
    EVENT_TYPE,
    ITEM,
    NUM_RESERVED,
    PAD_IDX,
    UNK_IDX,
    EventSchema,
)

BEHAVIORS = ("view", "click", "cart", "purchase")
SIDE = {ITEM: pl.String, ATTRIBUTES: pl.List(pl.String)}


def train_events(rows: list[tuple[str, list[str] | None]]) -> pl.LazyFrame:
    return pl.DataFrame(rows, schema=SIDE, orient="row").lazy()


def items_frame(rows: list[tuple[str, int, list[int], int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            ITEM: pl.String,
            INDEX: pl.Int32,
            ATTRIBUTE_INDICES: pl.List(pl.Int32),
            TRAIN_COUNT: pl.Int64,
        },
        orient="row",
    )


def attributes_frame(names: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {ATTRIBUTE: names, INDEX: list(range(NUM_RESERVED, NUM_RESERVED + len(names)))},
        schema={ATTRIBUTE: pl.String, INDEX: pl.Int32},
    )


# One category per event (a category is an attribute set of one):
# item counts: b 3, a 2, c 2, d 1  -> order b, a, c (tie a/c by id), d
# attribute sets: b: x x y -> x;  a: y y -> y;  c: y x -> tie -> x (smallest);  d: none -> UNK
# attribute sizes by training count: x = 3 (b) + 2 (c) = 5, y = 2 (a) -> x first
ROWS = [
    ("c", ["y"]),
    ("b", ["x"]),
    ("a", ["y"]),
    ("d", None),
    ("b", ["x"]),
    ("c", ["x"]),
    ("a", ["y"]),
    ("b", ["y"]),
]
# Attribute sets of several attributes: q 3 events, r 2, p 1; attribute sizes x = 3 (q) + 1 (p),
# y = 2 (r) + 1 (p), z = 1 (p) -> x, y, z
MULTI_ROWS = [("p", ["z", "x", "y"]), ("q", ["x"]), ("q", ["x"]), ("q", ["x"]), ("r", ["y"])]
MULTI_ROWS.append(("r", ["y"]))


@pytest.fixture
def vocab() -> Vocab:
    return Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS)


def test_fit_orders_items_by_train_frequency_then_id(vocab):
    expected = items_frame(
        [("b", 2, [2], 3), ("a", 3, [3], 2), ("c", 4, [2], 2), ("d", 5, [UNK_IDX], 1)]
    )
    assert_frame_equal(vocab.items, expected)
    assert_frame_equal(vocab.attributes, attributes_frame(["x", "y"]))


def test_reserved_indices_and_sizes(vocab):
    assert (PAD_IDX, UNK_IDX, NUM_RESERVED) == (0, 1, 2)
    assert vocab.items[INDEX].min() == NUM_RESERVED
    assert vocab.attributes[INDEX].min() == NUM_RESERVED
    assert vocab.num_items == 6
    assert vocab.num_attributes == 4
    assert vocab.num_behaviors == 6
    assert vocab.attribute_width == 1
    assert vocab.item_attribute_table() == [[PAD_IDX], [UNK_IDX], [2], [3], [2], [UNK_IDX]]
    assert vocab.item_ids() == [None, None, "b", "a", "c", "d"]


def test_fit_is_independent_of_row_order():
    for rows in (ROWS, MULTI_ROWS):
        a = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
        b = Vocab.fit(train_events(rows[::-1]), behaviors=BEHAVIORS)
        assert_frame_equal(a.items, b.items)
        assert_frame_equal(a.attributes, b.attributes)
        assert a.content_hash() == b.content_hash()


def test_attribute_sets_of_several_attributes():
    vocab = Vocab.fit(train_events(MULTI_ROWS), behaviors=BEHAVIORS)
    expected = items_frame([("q", 2, [2], 3), ("r", 3, [3], 2), ("p", 4, [2, 3, 4], 1)])
    assert_frame_equal(vocab.items, expected)
    assert_frame_equal(vocab.attributes, attributes_frame(["x", "y", "z"]))
    assert vocab.num_attributes == 5
    assert vocab.attribute_width == 3
    # padded with PAD to the widest set; PAD item all PAD, UNK item [UNK]
    assert vocab.item_attribute_table() == [
        [PAD_IDX, PAD_IDX, PAD_IDX],
        [UNK_IDX, PAD_IDX, PAD_IDX],
        [2, PAD_IDX, PAD_IDX],
        [3, PAD_IDX, PAD_IDX],
        [2, 3, 4],
    ]


def test_an_items_most_frequent_attribute_set_wins():
    # p is seen twice with {x, y} and once with {z}: the set, not single attributes, is counted
    rows = [("p", ["y", "x"]), ("p", ["z"]), ("p", ["x", "y"]), ("q", ["z"])]
    vocab = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
    # attribute sizes: x = 3 (p), y = 3 (p), z = 1 (q) -> x, y (tie by name), z
    assert_frame_equal(vocab.attributes, attributes_frame(["x", "y", "z"]))
    assert_frame_equal(vocab.items, items_frame([("p", 2, [2, 3], 3), ("q", 3, [4], 1)]))


def test_an_attribute_set_is_counted_whatever_order_its_events_list_it_in():
    """Events that list one set in other orders (or with a repeat) were counted as other sets:
    p's three events of {x, y} lost to its two of {z}."""
    rows = [("p", ["y", "x"]), ("p", ["x", "y"]), ("p", ["x", "y", "x"]), ("p", ["z"])] + [
        ("p", ["z"])
    ]
    vocab = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
    assert_frame_equal(vocab.attributes, attributes_frame(["x", "y"]))  # z: no item's now
    assert_frame_equal(vocab.items, items_frame([("p", 2, [2, 3], 5)]))


def test_max_item_attributes_keeps_the_most_frequent():
    vocab = Vocab.fit(train_events(MULTI_ROWS), behaviors=BEHAVIORS, max_item_attributes=2)
    # p loses z, the rarest of its attributes; the others have one attribute each
    expected = items_frame([("q", 2, [2], 3), ("r", 3, [3], 2), ("p", 4, [2, 3], 1)])
    assert_frame_equal(vocab.items, expected)
    assert vocab.attribute_width == 2
    one = Vocab.fit(train_events(MULTI_ROWS), behaviors=BEHAVIORS, max_item_attributes=1)
    assert one.items[ATTRIBUTE_INDICES].to_list() == [[2], [3], [2]]
    assert one.attribute_width == 1


def test_item_table_overrides_event_attributes():
    table = pl.DataFrame(
        {
            ITEM: ["a", "zzz", "c", "c", "d", "d"],
            ATTRIBUTES: [["z", "x"], ["w"], None, [], ["v"], ["x", "v"]],
        },
        schema=SIDE,
    )
    vocab = Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS, item_table=table.lazy())
    # a: the table's {z, x} replaces its events' y; c: the table gives nothing, so its events'
    # x stays; d: no attribute in its events, two table rows -> {v, x}; zzz is not a training
    # item, so w is no attribute. Sizes: x = 3 (b) + 2 (a) + 2 (c) + 1 (d), z = 2, v = 1;
    # y is carried by no item any more
    assert_frame_equal(vocab.attributes, attributes_frame(["x", "z", "v"]))
    expected = items_frame(
        [("b", 2, [2], 3), ("a", 3, [2, 3], 2), ("c", 4, [2], 2), ("d", 5, [2, 4], 1)]
    )
    assert_frame_equal(vocab.items, expected)


def test_items_without_attributes_get_unk():
    rows = [("a", None), ("a", None), ("b", ["x"]), ("c", None)]
    vocab = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
    expected = items_frame([("a", 2, [UNK_IDX], 2), ("b", 3, [2], 1), ("c", 4, [UNK_IDX], 1)])
    assert_frame_equal(vocab.items, expected)
    # a log without any side information: every item is [UNK], no attribute vocabulary
    bare = Vocab.fit(train_events([("a", None), ("b", None)]), behaviors=BEHAVIORS)
    assert bare.items[ATTRIBUTE_INDICES].to_list() == [[UNK_IDX], [UNK_IDX]]
    assert bare.attributes.height == 0
    assert bare.num_attributes == NUM_RESERVED
    assert bare.item_attribute_table() == [[PAD_IDX], [UNK_IDX], [UNK_IDX], [UNK_IDX]]


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


@pytest.mark.parametrize("dtype", [pl.Int64, pl.Int32, pl.Int16, pl.UInt64, pl.UInt8])
@pytest.mark.parametrize("ids", [[5, 9, 7, 20], [5, 9, 7, 200]])  # a dense range, a sparse one
def test_integer_ids_encode_as_the_join_does(dtype, ids, monkeypatch):
    # integer ids over a short range are looked up in a table (vocab._dense_item_index), the
    # others joined: both must give every id, in or out of the range, the same index
    items = pl.DataFrame(
        {
            ITEM: pl.Series(ids, dtype=dtype),
            INDEX: pl.Series([2, 3, 4, 5], dtype=pl.Int32),
            ATTRIBUTE_INDICES: [[UNK_IDX]] * 4,
            TRAIN_COUNT: [4, 3, 2, 1],
        }
    )
    attributes = pl.DataFrame(schema={ATTRIBUTE: pl.String, INDEX: pl.Int32})
    vocab = Vocab(items=items, attributes=attributes, behaviors=("view",))
    low = -32768 if dtype in (pl.Int16, pl.Int32, pl.Int64) else 0
    high = 255 if dtype == pl.UInt8 else 30_000
    values = [*ids, 6, None, 0, 1, 4, 21, 199, 201, low, high]
    events = pl.LazyFrame({ITEM: pl.Series(values, dtype=dtype), EVENT_TYPE: ["view"] * 14})
    dense = vocab.encode(events, behavior_column=EVENT_TYPE).collect()
    assert (vocab._dense_item_index is not None) == (ids[-1] == 20)
    monkeypatch.setattr("recsys.data.vocab.DENSE_IDS_PER_ITEM", 0)  # always the join
    vocab = Vocab(items=items, attributes=attributes, behaviors=("view",))  # (the table is cached)
    assert vocab._dense_item_index is None
    joined = vocab.encode(events, behavior_column=EVENT_TYPE).collect()
    assert_frame_equal(dense, joined)
    assert dense[ITEM_INDEX].to_list()[:4] == [2, 3, 4, 5]
    assert set(dense[ITEM_INDEX].to_list()[4:]) == {UNK_IDX}


def test_behavior_indices_follow_funnel_order(vocab):
    out = vocab.encode(
        pl.LazyFrame({ITEM: ["a"] * 4, EVENT_TYPE: list(BEHAVIORS)}), behavior_column=EVENT_TYPE
    ).collect()
    assert out["behavior_index"].to_list() == [NUM_RESERVED + i for i in range(len(BEHAVIORS))]
    # an Enum column (as prepared events carry) maps by name, whatever its category order
    names = pl.Series(list(BEHAVIORS), dtype=pl.Enum(["teleport", *reversed(BEHAVIORS)]))
    enum = vocab.encode(
        pl.LazyFrame({ITEM: ["a"] * 4, EVENT_TYPE: names}), behavior_column=EVENT_TYPE
    )
    assert_series_equal(enum.collect()["behavior_index"], out["behavior_index"])


@pytest.mark.parametrize("rows", [ROWS, MULTI_ROWS], ids=["one", "several"])
def test_save_load_round_trip(rows, tmp_path):
    vocab = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
    vocab.save(tmp_path / "vocab")
    assert sorted(p.name for p in (tmp_path / "vocab").iterdir()) == sorted(FILES.values())
    loaded = Vocab.load(tmp_path / "vocab")
    assert_frame_equal(loaded.items, vocab.items)
    assert_frame_equal(loaded.attributes, vocab.attributes)
    assert loaded.behaviors == vocab.behaviors
    assert loaded.item_attribute_table() == vocab.item_attribute_table()
    assert loaded.content_hash() == vocab.content_hash()
    # a folder given as text works the same (notebooks pass strings)
    assert Vocab.load(str(tmp_path / "vocab")).content_hash() == vocab.content_hash()


@pytest.mark.parametrize("rows", [ROWS, MULTI_ROWS], ids=["one", "several"])
def test_plain_round_trip(rows):
    vocab = Vocab.fit(train_events(rows), behaviors=BEHAVIORS)
    plain = vocab.to_plain()
    # only builtin containers and scalars: safe for torch.load(weights_only=True)
    assert all(isinstance(v, list) for k, v in plain.items() if k != "item_id_type")
    assert plain["item_id_type"] == str(vocab.items.schema[ITEM])  # a str: safe too
    assert all(isinstance(v, list) for v in plain["item_attributes"])
    back = Vocab.from_plain(plain)
    assert_frame_equal(back.items, vocab.items)
    assert_frame_equal(back.attributes, vocab.attributes)
    assert back.behaviors == vocab.behaviors
    assert back.item_attribute_table() == vocab.item_attribute_table()
    assert back.content_hash() == vocab.content_hash()


def test_plain_round_trip_of_an_empty_attribute_vocabulary(tmp_path):
    vocab = Vocab.fit(train_events([("a", None), ("b", None)]), behaviors=BEHAVIORS)
    vocab.save(tmp_path)
    for other in (Vocab.load(tmp_path), Vocab.from_plain(vocab.to_plain())):
        assert_frame_equal(other.items, vocab.items)
        assert_frame_equal(other.attributes, vocab.attributes)
        assert other.content_hash() == vocab.content_hash()


def test_round_trips_on_a_realistic_vocab(tmp_path):
    raw = generate_events(num_users=30, num_items=50, num_categories=4, seed=2)
    events = load_events(raw, EventSchema())  # the category becomes a one-element attribute list
    vocab = Vocab.fit(events.lazy(), behaviors=BEHAVIORS)
    assert vocab.items.height == events[ITEM].n_unique()
    assert vocab.attributes.height == raw[CATEGORY].n_unique()
    vocab.save(tmp_path)
    for other in (Vocab.load(tmp_path), Vocab.from_plain(vocab.to_plain())):
        assert_frame_equal(other.items, vocab.items)
        assert_frame_equal(other.attributes, vocab.attributes)
        assert other.content_hash() == vocab.content_hash()
    # every item has the category it carries in the log (one category per synthetic item)
    category_of = dict(zip(vocab.attributes[INDEX], vocab.attributes[ATTRIBUTE]))
    truth = dict(raw.select(ITEM, CATEGORY).unique().iter_rows())
    for item, indices in zip(vocab.items[ITEM], vocab.items[ATTRIBUTE_INDICES]):
        assert [category_of[i] for i in indices] == [truth[item]]


def test_content_hash_sees_every_part(vocab):
    plain = vocab.to_plain()
    changed = [
        {**plain, "item_id": ["b", "a", "c", "e"]},
        {**plain, "item_attributes": [[2], [2], [2], [1]]},
        {**plain, "item_attributes": [[2], [2, 3], [2], [1]]},
        {**plain, "item_train_count": [3, 2, 2, 2]},
        {**plain, "attribute": ["x", "z"]},
        {**plain, "behaviors": ["view", "click", "cart", "buy"]},
    ]
    hashes = {Vocab.from_plain(p).content_hash() for p in changed}
    assert len(hashes) == len(changed)
    assert vocab.content_hash() not in hashes


def test_load_from_incomplete_folder_says_what_to_run(vocab, tmp_path):
    vocab.save(tmp_path)
    (tmp_path / FILES["attributes"]).unlink()
    with pytest.raises(FileNotFoundError, match="attributes.parquet.*run the prepare step"):
        Vocab.load(tmp_path)


@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("items.parquet", "cut"),
        ("behaviors.parquet", "text"),
        ("attributes.parquet", "another table"),
    ],
)
def test_a_damaged_vocabulary_file_is_named_with_the_fix(tmp_path, file, damage):
    """A vocabulary file cut short or replaced failed with polars' "File out of specification:
    The file must end with PAR1", naming no file, or (another table) later with a bare
    ColumnNotFoundError."""
    from recsys.data.io import DataError

    Vocab.fit(train_events(ROWS), behaviors=BEHAVIORS).save(tmp_path)
    path = tmp_path / file
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "text":
        path.write_text("index,behavior\n2,view\n")
    else:
        pl.DataFrame({"user_id": ["u1"]}).write_parquet(path)
    with pytest.raises(DataError, match="prepare the log again") as info:
        Vocab.load(tmp_path)
    assert str(path) in str(info.value)
