"""The behaviour-aware token embedding."""

from __future__ import annotations

import pytest
import torch

from recsys.model.embeddings import BehaviorAwareEmbedding
from recsys.schema import PAD_IDX, UNK_IDX

NUM_ITEMS, NUM_CATEGORIES = 10, 4


def make_embedding(positional: str = "sinusoidal") -> BehaviorAwareEmbedding:
    torch.manual_seed(0)
    return BehaviorAwareEmbedding(
        num_items=NUM_ITEMS,
        num_categories=NUM_CATEGORIES,
        num_behaviors=4,
        num_time_buckets=5,
        d_model=8,
        item_dim=6,
        category_dim=3,
        positional=positional,
        max_seq_len=6,
        dropout=0.0,
    ).eval()


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


def test_categories_follow_set_item_categories() -> None:
    embedding = make_embedding()
    assert embedding.item_category[PAD_IDX] == PAD_IDX
    assert (embedding.item_category[1:] == UNK_IDX).all()

    table = torch.tensor([0, 1, 2, 2, 3, 3, 2, 3, 2, 1])
    item = torch.tensor([[4, 5]])
    kwargs = {
        "behavior": torch.tensor([[2, 2]]),
        "time_bucket": torch.tensor([[1, 1]]),
        "padding_mask": torch.ones(1, 2, dtype=torch.bool),
    }
    before = embedding(item, **kwargs)
    embedding.set_item_categories(table)
    after = embedding(item, **kwargs)
    assert torch.equal(embedding.item_category, table)
    assert not torch.allclose(before, after)
    embedding.set_item_categories(table.tolist())  # e.g. Vocab.item_category_table()
    assert torch.equal(embedding.item_category, table)

    features = embedding.item_features(torch.tensor([4]))
    expected = torch.cat(
        [embedding.item_embedding.weight[4], embedding.category_embedding.weight[3]]
    )
    torch.testing.assert_close(features[0], expected)
    whole = embedding.item_features()
    assert whole.shape == (NUM_ITEMS, 9)
    torch.testing.assert_close(whole[4], expected)


def test_set_item_categories_validation() -> None:
    embedding = make_embedding()
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(10,\)"):
        embedding.set_item_categories(torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[0, 4\] but num_categories=4"):
        embedding.set_item_categories(torch.tensor([0, 1, 2, 2, 4, 3, 2, 3, 2, 1]))
    with pytest.raises(ValueError, match="integer category indices"):
        embedding.set_item_categories(torch.zeros(NUM_ITEMS))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("num_items", 2, r"num_items=2 is invalid: pass an integer >= 3"),
        ("positional", "rotary", r"positional='rotary' is not supported"),
        ("dropout", -0.1, r"dropout=-0.1 is invalid"),
    ],
)
def test_constructor_validation(name: str, value: object, message: str) -> None:
    kwargs = {
        "num_items": NUM_ITEMS,
        "num_categories": NUM_CATEGORIES,
        "num_behaviors": 4,
        "num_time_buckets": 5,
        "d_model": 8,
        "item_dim": 6,
        "category_dim": 3,
        "positional": "none",
        "max_seq_len": 6,
        "dropout": 0.0,
    }
    kwargs[name] = value
    with pytest.raises(ValueError, match=message):
        BehaviorAwareEmbedding(**kwargs)
