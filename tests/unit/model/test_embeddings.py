"""The behaviour-aware token embedding."""

from __future__ import annotations

import pytest
import torch

from recsys.model.embeddings import BehaviorAwareEmbedding
from recsys.schema import PAD_IDX, UNK_IDX

NUM_ITEMS, NUM_ATTRIBUTES = 10, 6


def make_embedding(
    positional: str = "sinusoidal", width: int = 1, **overrides
) -> BehaviorAwareEmbedding:
    torch.manual_seed(0)
    arguments = {
        "num_items": NUM_ITEMS,
        "num_attributes": NUM_ATTRIBUTES,
        "num_behaviors": 4,
        "num_time_buckets": 5,
        "d_model": 8,
        "item_dim": 6,
        "attribute_dim": 3,
        "item_attribute_width": width,
        "positional": positional,
        "max_seq_len": 6,
        "dropout": 0.0,
    }
    return BehaviorAwareEmbedding(**{**arguments, **overrides}).eval()


# Item -> attribute set, width 3, PAD-padded: item 2 has {2, 3}, item 3 none, item 9 {5}, ...
TABLE = torch.tensor(
    [
        [0, 0, 0],  # PAD item
        [1, 0, 0],  # UNK item: the UNK attribute
        [2, 3, 0],
        [0, 0, 0],  # no attributes at all
        [4, 0, 0],
        [2, 3, 4],
        [5, 2, 0],
        [3, 3, 0],  # a repeated attribute counts twice in the mean
        [4, 5, 0],
        [5, 0, 0],
    ]
)


def test_shape_and_zero_padding_rows() -> None:
    embedding = make_embedding()
    item = torch.tensor([[0, 0, 3, 4], [5, 6, 7, 8]])
    behavior = torch.tensor([[0, 0, 2, 3], [2, 2, 3, 3]])
    time_bucket = torch.tensor([[0, 0, 1, 2], [1, 2, 3, 4]])
    padding_mask = item != PAD_IDX
    out = embedding(item, behavior, time_bucket, padding_mask)
    assert out.shape == (2, 4, 8)
    assert torch.equal(out[0, :2], torch.zeros(2, 8))
    assert (out[padding_mask].abs().sum(-1) > 0).all()


def test_same_item_different_behavior_differs() -> None:
    embedding = make_embedding(positional="none")
    item = torch.tensor([[3, 3]])
    time_bucket = torch.tensor([[1, 1]])
    padding_mask = torch.ones(1, 2, dtype=torch.bool)
    same = embedding(item, torch.tensor([[2, 2]]), time_bucket, padding_mask)
    different = embedding(item, torch.tensor([[2, 3]]), time_bucket, padding_mask)
    torch.testing.assert_close(same[0, 0], same[0, 1])
    assert not torch.allclose(different[0, 0], different[0, 1])


def test_time_bucket_adds_its_own_embedding_row() -> None:
    # the gap bucket is part of every real token: changing it moves the token by exactly the
    # difference of the two time-embedding rows, and PAD bucket 0 embeds to zero
    embedding = make_embedding(positional="none")
    item, behavior = torch.tensor([[3, 4]]), torch.tensor([[2, 3]])
    padding_mask = torch.ones(1, 2, dtype=torch.bool)
    with torch.no_grad():
        base = embedding(item, behavior, torch.tensor([[0, 1]]), padding_mask)
        moved = embedding(item, behavior, torch.tensor([[4, 3]]), padding_mask)
        table = embedding.time_embedding.weight
        torch.testing.assert_close(moved[0, 0] - base[0, 0], table[4])
        torch.testing.assert_close(moved[0, 1] - base[0, 1], table[3] - table[1])
    assert table[1:].abs().sum() > 0


def test_projection_is_the_token_own_behavior_map() -> None:
    embedding = make_embedding(positional="none")
    item = torch.tensor([[3, 4, 5]])
    behavior = torch.tensor([[1, 2, 3]])
    time_bucket = torch.tensor([[0, 0, 0]])  # PAD bucket embeds to zero
    out = embedding(item, behavior, time_bucket, torch.ones(1, 3, dtype=torch.bool))
    features = embedding.item_features(item)
    for t in range(3):
        g = behavior[0, t]
        expected = features[0, t] @ embedding.behavior_weight[g] + embedding.behavior_bias[g]
        torch.testing.assert_close(out[0, t], expected)


def test_without_projection_the_token_is_its_features_plus_a_behavior_vector() -> None:
    embedding = make_embedding(positional="none", item_dim=5, behavior_projection=False)
    assert embedding.behavior_weight is None
    assert not any("behavior_weight" in name for name, _ in embedding.named_parameters())
    item = torch.tensor([[3, 4, 4]])
    behavior = torch.tensor([[1, 2, 3]])
    out = embedding(item, behavior, torch.zeros(1, 3, dtype=torch.long), item != PAD_IDX)
    features = embedding.item_features(item)  # (1, 3, 8)
    torch.testing.assert_close(out, features + embedding.behavior_bias[behavior])
    assert not torch.allclose(out[0, 1], out[0, 2])  # same item, two behaviours


def test_default_table_is_unk_for_real_items_and_pad_for_the_pad_item() -> None:
    embedding = make_embedding(width=3)
    table = embedding.item_attributes
    assert table.shape == (NUM_ITEMS, 3) and table.dtype == torch.long
    assert (table[PAD_IDX] == PAD_IDX).all()
    assert (table[1:, 0] == UNK_IDX).all()
    assert (table[1:, 1:] == PAD_IDX).all()
    assert "item_attributes" in embedding.state_dict()
    unk = embedding.attribute_embedding.weight[UNK_IDX] * embedding.attribute_scale
    torch.testing.assert_close(embedding.item_features()[1:, 6:], unk.expand(NUM_ITEMS - 1, 3))


def test_attribute_bag_is_the_mean_over_non_pad_attributes() -> None:
    embedding = make_embedding(width=3)
    embedding.set_item_attributes(TABLE)
    assert torch.equal(embedding.item_attributes, TABLE)
    # tables are stored at std dim^-1/2 and used times sqrt(dim)
    weight = embedding.attribute_embedding.weight * embedding.attribute_scale
    expected = {
        2: (weight[2] + weight[3]) / 2,
        3: torch.zeros(3),
        4: weight[4],
        5: (weight[2] + weight[3] + weight[4]) / 3,
        7: weight[3],
        8: (weight[4] + weight[5]) / 2,
    }
    whole = embedding.item_features()  # (I, item_dim + attribute_dim)
    assert whole.shape == (NUM_ITEMS, 9)
    batch = embedding.item_features(torch.tensor([[2, 3, 4], [5, 7, 8]]))  # (B, T, F)
    assert batch.shape == (2, 3, 9)
    flat_batch = batch.reshape(6, 9)
    for position, (item, bag) in enumerate(expected.items()):
        torch.testing.assert_close(whole[item, 6:], bag)
        torch.testing.assert_close(
            whole[item, :6], embedding.item_embedding.weight[item] * embedding.item_scale
        )
        torch.testing.assert_close(flat_batch[position], whole[item])
    # The bag helper on its own, any leading shape.
    bags = embedding.attribute_bag(torch.tensor([[[2, 3, 0]], [[0, 0, 0]]]))  # (2, 1, A)
    assert bags.shape == (2, 1, 3)
    torch.testing.assert_close(bags[0, 0] * embedding.attribute_scale, expected[2])
    assert torch.equal(bags[1, 0], torch.zeros(3))


def test_all_pad_attribute_row_gives_zeros_and_still_trains_the_item() -> None:
    embedding = make_embedding(width=3)
    embedding.set_item_attributes(TABLE)
    features = embedding.item_features(torch.tensor([3]))
    assert torch.equal(features[0, 6:], torch.zeros(3))
    assert torch.isfinite(features).all()
    embedding.item_features(torch.tensor([3, 2])).sum().backward()
    assert torch.isfinite(embedding.attribute_embedding.weight.grad).all()
    assert torch.equal(embedding.attribute_embedding.weight.grad[PAD_IDX], torch.zeros(3))
    assert embedding.item_embedding.weight.grad[3].abs().sum() > 0


def test_attributes_follow_set_item_attributes() -> None:
    embedding = make_embedding(width=3)
    item = torch.tensor([[4, 5]])
    kwargs = {
        "behavior": torch.tensor([[2, 2]]),
        "time_bucket": torch.tensor([[1, 1]]),
        "padding_mask": torch.ones(1, 2, dtype=torch.bool),
    }
    before = embedding(item, **kwargs)
    embedding.set_item_attributes(TABLE)
    after = embedding(item, **kwargs)
    assert not torch.allclose(before, after)
    embedding.set_item_attributes(TABLE.tolist())  # a nested list from the data layer
    assert torch.equal(embedding.item_attributes, TABLE)


def test_width_one_table_is_the_single_category_lookup() -> None:
    embedding = make_embedding(width=1)
    categories = torch.tensor([0, 1, 2, 2, 3, 3, 2, 3, 2, 1])
    embedding.set_item_attributes(categories)  # (I,) is accepted as (I, 1) when A == 1
    assert torch.equal(embedding.item_attributes, categories[:, None])
    embedding.set_item_attributes(categories[:, None])
    assert torch.equal(embedding.item_attributes, categories[:, None])

    items = torch.tensor([[0, 4, 9], [2, 6, 1]])  # (B, T), PAD item included
    lookup = torch.cat(
        [
            embedding.item_embedding(items) * embedding.item_scale,
            embedding.attribute_embedding(categories[items]) * embedding.attribute_scale,
        ],
        dim=-1,
    )  # the old ``item ⊕ category_embedding[item_category[item]]``
    torch.testing.assert_close(embedding.item_features(items), lookup)
    torch.testing.assert_close(
        embedding.item_features(),
        torch.cat(
            [
                embedding.item_embedding.weight * embedding.item_scale,
                embedding.attribute_embedding(categories) * embedding.attribute_scale,
            ],
            dim=-1,
        ),
    )


def test_padding_positions_give_zero_rows_with_attribute_sets() -> None:
    embedding = make_embedding(width=3)
    embedding.set_item_attributes(TABLE)
    item = torch.tensor([[0, 0, 5, 3], [2, 7, 8, 9]])  # item 3 has no attributes: still real
    behavior = torch.tensor([[0, 0, 2, 3], [2, 2, 3, 3]])
    time_bucket = torch.tensor([[0, 0, 1, 2], [1, 2, 3, 4]])
    padding_mask = item != PAD_IDX
    out = embedding(item, behavior, time_bucket, padding_mask)
    assert out.shape == (2, 4, 8)
    assert torch.equal(out[~padding_mask], torch.zeros(2, 8))
    assert (out[padding_mask].abs().sum(-1) > 0).all()
    # Junk at padding positions (a real item with attributes) changes nothing.
    junk = torch.where(padding_mask, item, torch.full_like(item, 5))
    torch.testing.assert_close(embedding(junk, behavior, time_bucket, padding_mask), out)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            torch.zeros(NUM_ITEMS, 2, dtype=torch.long),
            r"shape \(10, 2\), expected \(10, 3\).*item_attribute_width=2",
        ),
        (
            torch.zeros(4, 3, dtype=torch.long),
            r"shape \(4, 3\), expected \(10, 3\).*num_items=10.*item_attribute_width=<A>",
        ),
        (torch.zeros(NUM_ITEMS, dtype=torch.long), r"shape \(10,\), expected \(10, 3\)"),
        (torch.zeros(NUM_ITEMS, 3), r"dtype torch.float32: pass integer attribute indices"),
        (torch.zeros(NUM_ITEMS, 3, dtype=torch.bool), r"dtype torch.bool"),
        (
            torch.where(TABLE == 5, 6, TABLE),
            r"indices in \[0, 6\] but num_attributes=6: values must lie in \[0, 5\]",
        ),
        (torch.where(TABLE == 5, -1, TABLE), r"indices in \[-1, 4\]"),
    ],
    ids=["width", "rows", "1-d", "float", "bool", "too-high", "negative"],
)
def test_set_item_attributes_validation(table: torch.Tensor, message: str) -> None:
    embedding = make_embedding(width=3)
    before = embedding.item_attributes.clone()
    with pytest.raises(ValueError, match=message):
        embedding.set_item_attributes(table)
    assert torch.equal(embedding.item_attributes, before)  # a rejected table changes nothing


def test_state_dict_round_trip_with_attribute_sets() -> None:
    embedding = make_embedding(width=3)
    embedding.set_item_attributes(TABLE)
    torch.manual_seed(99)
    fresh = BehaviorAwareEmbedding(
        num_items=NUM_ITEMS,
        num_attributes=NUM_ATTRIBUTES,
        num_behaviors=4,
        num_time_buckets=5,
        d_model=8,
        item_dim=6,
        attribute_dim=3,
        item_attribute_width=3,
        max_seq_len=6,
        dropout=0.0,
    ).eval()
    fresh.load_state_dict(embedding.state_dict())
    assert torch.equal(fresh.item_attributes, TABLE)
    torch.testing.assert_close(fresh.item_features(), embedding.item_features(), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("num_items", 2, r"num_items=2 is invalid: pass an integer >= 3"),
        ("positional", "rotary", r"positional='rotary' is not supported"),
        ("dropout", -0.1, r"dropout=-0.1 is invalid"),
        ("num_attributes", 1, r"num_attributes=1 is invalid: pass an integer >= 2"),
        ("attribute_dim", -1, r"attribute_dim=-1 is invalid: pass an integer >= 0"),
        ("item_attribute_width", 0, r"item_attribute_width=0 is invalid: pass an integer >= 1"),
        ("item_attribute_width", 2.0, r"item_attribute_width=2.0 is invalid"),
        ("behavior_projection", 1, r"behavior_projection=1 is invalid: pass True or False"),
        # without F_g the features (6 + 3 wide) are the token: they must fill d_model=8
        ("behavior_projection", False, r"behavior_projection=False .* 6 \+ 3 != 8"),
        ("embedding_std", 0.0, r"embedding_std=0.0 is invalid: pass the std"),
        ("embedding_std", -0.02, r"embedding_std=-0.02 is invalid"),
        ("embedding_std", "0.02", r"embedding_std='0.02' is invalid"),
        ("embedding_std", True, r"embedding_std=True is invalid"),
    ],
)
def test_constructor_validation(name: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_embedding(**{"positional": "none", name: value})


@pytest.mark.parametrize("std", [None, 0.02, 0.3])
def test_embedding_std_sets_the_stored_scale_not_the_feature_scale(std: float | None) -> None:
    torch.manual_seed(0)
    embedding = make_embedding(num_items=4000, num_attributes=3000, embedding_std=std)
    stored = embedding.item_embedding.weight[2:]
    expected = 6**-0.5 if std is None else std  # None: dim^-1/2 (item_dim 6)
    assert stored.std().item() == pytest.approx(expected, rel=0.05)
    features = embedding.item_features()[2:]  # item ⊕ attribute bag, both at unit scale
    assert features[:, :6].std().item() == pytest.approx(1.0, rel=0.05)
    assert embedding.attribute_embedding.weight[2:].std().item() * embedding.attribute_scale == (
        pytest.approx(1.0, rel=0.05)
    )
    assert torch.all(embedding.item_embedding.weight[PAD_IDX] == 0)


def test_a_smaller_embedding_std_moves_the_features_faster_under_adam() -> None:
    """Adam moves every stored entry by ~lr whatever its scale; features are stored / std,
    so one step moves them by ~lr / std: 0.02 learns ~8x faster than 1/sqrt(6) ~ 0.41."""
    moved = {}
    for std in (None, 0.02):
        embedding = make_embedding(embedding_std=std, positional="none")
        optimizer = torch.optim.Adam(embedding.parameters(), lr=1e-3)
        before = embedding.item_features().detach().clone()
        embedding.item_features().sum().backward()
        optimizer.step()
        moved[std] = (embedding.item_features().detach() - before)[2:, :6].abs().mean().item()
    assert moved[None] == pytest.approx(1e-3 * 6**0.5, rel=0.01)
    assert moved[0.02] == pytest.approx(1e-3 / 0.02, rel=0.01)


@pytest.mark.parametrize(
    ("model", "reads"),
    [
        (["model=atrank"], True),
        (["model=atrank", "model.attribute_dim=0"], False),
        (["model=sasrec"], False),
        (["model=gru4rec"], False),
    ],
)
def test_an_encoder_that_reads_no_item_side_information_says_so(make_config, caplog, model, reads):
    """Categories, attributes or an item table are prepared for every encoder, but only
    ATRank's attribute bag reads them: SASRec, GRU4Rec and ATRank with attribute_dim=0 train on
    item ids alone, which the training log now says rather than dropping them in silence."""
    from types import SimpleNamespace

    import polars as pl

    from recsys.data.sequences import TimeBuckets
    from recsys.data.vocab import Vocab
    from recsys.tasks.train import build_encoder

    vocab = Vocab(
        items=pl.DataFrame(
            {"item_id": [7, 8], "index": [2, 3], "attribute_indices": [[2], [2, 3]]},
            schema_overrides={"index": pl.Int32, "attribute_indices": pl.List(pl.Int32)},
        ).with_columns(pl.lit(1, dtype=pl.Int64).alias("train_count")),
        attributes=pl.DataFrame({"attribute": ["shoes", "brand"], "index": [2, 3]}).cast(
            {"index": pl.Int32}
        ),
        behaviors=("view",),
    )
    cfg = make_config("config", ["experiment=tiny", *model])
    data = SimpleNamespace(vocab=vocab, time_buckets=TimeBuckets())
    with caplog.at_level("INFO", logger="recsys.tasks.train"):
        build_encoder(cfg, data)
    said = "reads item ids only: the 2 categories / attributes of the data" in caplog.text
    assert said is not reads
