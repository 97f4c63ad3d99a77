"""Carrying a trained encoder's weights into one built for another vocabulary (init_from a
model of another log): rows matched by id, new ones fresh, every other weight copied."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from recsys.data.vocab import Vocab
from recsys.model import ATRank
from recsys.model.gru4rec import GRU4Rec
from recsys.model.sasrec import SASRec
from recsys.model.transfer import carry_over, vocabulary_rows
from recsys.schema import NUM_RESERVED
from tests.unit.test_export import ENCODERS, make_encoder


def vocab(item_ids: list, attributes: list[str], item_attributes: list[list[int]]) -> Vocab:
    n = len(item_ids)
    items = pl.DataFrame(
        {
            "item_id": item_ids,
            "index": list(range(NUM_RESERVED, NUM_RESERVED + n)),
            "attribute_indices": item_attributes,
            "train_count": [n - i for i in range(n)],
        },
        schema_overrides={"index": pl.Int32, "attribute_indices": pl.List(pl.Int32)},
    )
    table = pl.DataFrame(
        {
            "attribute": attributes,
            "index": list(range(NUM_RESERVED, NUM_RESERVED + len(attributes))),
        },
        schema={"attribute": pl.String, "index": pl.Int32},  # also with no attribute
    )
    return Vocab(items=items, attributes=table, behaviors=("view", "buy"))


# last night: items 10, 11, 12, 13; tonight: 12 and 10 again (in another order), 20, 21 new,
# 11 and 13 gone; attribute "b" again, "c" new, "a" gone
OLD = vocab([10, 11, 12, 13], ["a", "b"], [[2], [3], [2, 3], [3]])
NEW = vocab([12, 20, 10, 21], ["c", "b"], [[3], [2], [3], [2]])


def atrank(v: Vocab, seed: int, **settings) -> ATRank:
    torch.manual_seed(seed)
    model = ATRank(
        **v.encoder_sizes(),
        num_time_buckets=5,
        max_seq_len=6,
        d_model=8,
        item_bias=True,
        **settings,
    )
    model.set_item_attributes(torch.tensor(v.item_attribute_table(), dtype=torch.long))
    with torch.no_grad():
        model.item_bias.normal_()  # (zeros when built: make the rows tell apart)
    return model


def test_rows_follow_the_ids_new_ones_stay_fresh_and_the_rest_is_copied():
    old, new = atrank(OLD, seed=0), atrank(NEW, seed=1)
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    carried = carry_over(old, OLD, new, NEW)
    assert (carried.items, carried.num_items, carried.attributes, carried.num_attributes) == (
        2,
        4,
        1,
        2,
    )
    was, now = old.state_dict(), new.state_dict()
    # item index in OLD / NEW: 10 -> 2 / 4, 12 -> 4 / 2; new items 20, 21 at 3, 5
    for key in ("embedding.item_embedding.weight", "item_bias"):
        torch.testing.assert_close(now[key][[0, 1]], was[key][[0, 1]])  # PAD, UNK
        torch.testing.assert_close(now[key][[4, 2]], was[key][[2, 4]])  # 10, 12 by id
        torch.testing.assert_close(now[key][[3, 5]], fresh[key][[3, 5]])  # 20, 21: as built
    # attribute "b": index 3 in both; "c" (index 2) new
    key = "embedding.attribute_embedding.weight"
    torch.testing.assert_close(now[key][3], was[key][3])
    torch.testing.assert_close(now[key][2], fresh[key][2])
    # this run's item -> attribute lookup stays; every other weight is the trained model's
    torch.testing.assert_close(now["embedding.item_attributes"], fresh["embedding.item_attributes"])
    rows = vocabulary_rows(new)
    for key, value in now.items():
        if key not in rows:
            torch.testing.assert_close(value, was[key])


@pytest.mark.parametrize("cls", [SASRec, GRU4Rec])
def test_the_tied_item_encoders_carry_their_item_table(cls):
    torch.manual_seed(0)
    old = cls(num_items=OLD.num_items, max_seq_len=6, d_model=8)
    new = cls(num_items=NEW.num_items, max_seq_len=6, d_model=8)
    carried = carry_over(old, OLD, new, NEW)
    table = new.item_embedding.weight
    torch.testing.assert_close(table[[4, 2]], old.item_embedding.weight[[2, 4]])
    # no attribute table: no attribute count ("1 of 2 attributes carried" would be untrue)
    assert carried.attributes is None
    assert carried.describe() == "2 of 4 items carried over (the rest start fresh)"


def test_integer_ids_of_another_width_or_sign_carry_by_value():
    """Last night's export wrote Int64 ids, tonight's UInt64 (or the other way round): the
    same items, so their rows carry (they were refused as 'shares no item id')."""
    unsigned = Vocab(
        items=NEW.items.with_columns(pl.col("item_id").cast(pl.UInt64)),
        attributes=NEW.attributes,
        behaviors=NEW.behaviors,
    )
    for old_vocab, new_vocab in ((OLD, unsigned), (unsigned, OLD)):
        old, new = atrank(old_vocab, seed=0), atrank(new_vocab, seed=1)
        carried = carry_over(old, old_vocab, new, new_vocab)
        pairs = old_vocab.items.join(new_vocab.items, on="item_id").select("index", "index_right")
        assert carried.items == pairs.height == 2  # items 10 and 12
        table = "embedding.item_embedding.weight"
        was, now = old.state_dict()[table], new.state_dict()[table]
        torch.testing.assert_close(now[pairs["index_right"]], was[pairs["index"]])


def test_a_saved_vocabulary_of_whole_number_float_ids_carries_by_value():
    """A model trained before whole-number float ids were read as integers (a Parquet log of
    a pandas id column made float by one missing id) saved Float64 ids 10.0, 12.0, ...;
    tonight's preparation of the same log reads them as Int64. Read back, the saved
    vocabulary's ids are Int64 too, so a nightly warm start keeps their rows (it was refused
    as 'shares no item id'); fractional ids stay float and match nothing."""
    plain = OLD.to_plain()
    saved = Vocab.from_plain(
        {**plain, "item_id": [float(i) for i in plain["item_id"]], "item_id_type": "Float64"}
    )
    assert saved.items.schema["item_id"] == pl.Int64 and saved.content_hash() == OLD.content_hash()
    old, new = atrank(saved, seed=0), atrank(NEW, seed=1)
    assert carry_over(old, saved, new, NEW).items == 2  # items 10 and 12
    table = "embedding.item_embedding.weight"
    torch.testing.assert_close(new.state_dict()[table][[4, 2]], old.state_dict()[table][[2, 4]])
    fractional = Vocab.from_plain(
        {**plain, "item_id": [i + 0.5 for i in plain["item_id"]], "item_id_type": "Float64"}
    )
    assert fractional.items.schema["item_id"] == pl.Float64
    with pytest.raises(LookupError, match="shares no item id"):
        carry_over(atrank(fractional, 0), fractional, atrank(NEW, 1), NEW)


def test_weights_either_model_lacks_are_refused_by_name():
    """A two-layer model into a one-layer encoder (or the other way round): a trained layer
    would be left behind, or a layer left untrained, so neither is carried silently."""
    deep = atrank(OLD, seed=0)  # num_layers=2, the default
    shallow = atrank(NEW, seed=1, num_layers=1)
    before = {k: v.clone() for k, v in shallow.state_dict().items()}
    with pytest.raises(ValueError, match=r"weights this run's encoder lacks: \['[^']*\.1\."):
        carry_over(deep, OLD, shallow, NEW)
    for key, value in shallow.state_dict().items():  # refused before touching a weight
        assert torch.equal(value, before[key]), key
    with pytest.raises(ValueError, match=r"the model has no weight '[^']*\.1\."):
        carry_over(shallow, NEW, atrank(OLD, seed=2), OLD)


def test_a_vocabulary_of_other_ids_is_refused_naming_both_id_types():
    other = vocab(["10", "12"], ["b"], [[2], [2]])  # the same ids, read as text
    with pytest.raises(LookupError, match=r"shares no item id.*Int64.*\[10, 11, 12\].*String"):
        carry_over(atrank(OLD, 0), OLD, atrank(other, 1), other)


def test_an_encoder_without_vocabulary_rows_is_refused_by_name():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(6, 4)

    with pytest.raises(TypeError, match=r"Plain does not say.*VOCABULARY_ROWS"):
        carry_over(Plain(), OLD, Plain(), NEW)


@pytest.mark.parametrize("kind", ENCODERS)
def test_every_encoder_names_its_vocabulary_tables(kind):
    """Every encoder variant recsys ships lists state-dict entries it has, and each of them is
    a table of its catalogue's or attributes' size."""
    encoder = make_encoder(kind)
    sizes = {"item": encoder.num_items, "attribute": encoder.config.get("num_attributes")}
    state = encoder.state_dict()
    for key, kind_of_rows in vocabulary_rows(encoder).items():
        if kind_of_rows != "data":
            assert state[key].shape[0] == sizes[kind_of_rows], key
