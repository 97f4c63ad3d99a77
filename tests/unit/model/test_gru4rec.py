"""The GRU4Rec encoder: shapes, left padding, causality, scoring, rebuild; and the encoder
interface check that every encoder passes and an incomplete one fails by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys.model import ATRank
from recsys.model.gru4rec import GRU4Rec
from recsys.model.interface import ENCODER_INTERFACE, check_encoder
from recsys.model.outputs import EncoderOutput
from recsys.model.sasrec import SASRec
from recsys.schema import PAD_IDX

NUM_ITEMS = 30


def make_model(**overrides: object) -> GRU4Rec:
    torch.manual_seed(0)
    kwargs = {"num_items": NUM_ITEMS, "max_seq_len": 8, "d_model": 8, "num_layers": 2}
    return GRU4Rec(**{**kwargs, **overrides}).eval()


def left_padded(rows: list[list[int]], seq_len: int) -> torch.Tensor:
    return torch.tensor([[PAD_IDX] * (seq_len - len(r)) + r for r in rows])


def test_shapes_and_zero_padding_rows() -> None:
    model = make_model(hidden_size=12)
    item = left_padded([[5, 6, 7], [2, 3, 4, 5, 6, 9]], seq_len=6)
    out = model(item)
    assert out.hidden.shape == (2, 6, 8) and out.query.shape == (2, 8)
    assert torch.equal(out.query, out.hidden[:, -1])
    assert torch.equal(out.padding_mask, item != PAD_IDX)
    assert torch.equal(out.hidden[0, :3], torch.zeros(3, 8))
    assert model.gru.hidden_size == 12 and make_model().gru.hidden_size == 16  # null: 2 D


def test_left_padding_changes_no_state() -> None:
    """The same history with more left padding, or with junk items under the padding mask,
    gives the same states at its real positions: the bias-free GRU stays at zero through
    zeroed inputs."""
    model = make_model()
    history = [[4, 9, 2, 11]]
    with torch.no_grad():
        bare = model(left_padded(history, seq_len=4))
        padded = model(left_padded(history, seq_len=8))
        item = left_padded(history, seq_len=8)
        mask = item != PAD_IDX
        junk = model(torch.where(mask, item, 17), None, None, mask)
    torch.testing.assert_close(padded.hidden[:, 4:], bare.hidden, atol=1e-6, rtol=0)
    torch.testing.assert_close(padded.query, bare.query, atol=1e-6, rtol=0)
    torch.testing.assert_close(junk.hidden, padded.hidden, atol=0, rtol=0)


def test_causal_position_t_sees_nothing_after_t() -> None:
    model = make_model()
    assert GRU4Rec.causal is True  # every position is trained
    item = left_padded([[5, 6, 7, 8, 9], [3, 4, 5, 6, 7]], seq_len=6)
    changed = item.clone()
    changed[:, 4] = torch.where(item[:, 4] == 7, 8, 7)
    with torch.no_grad():
        before, after = model(item).hidden, model(changed).hidden
    torch.testing.assert_close(before[:, :4], after[:, :4], atol=0, rtol=0)
    assert not torch.allclose(before[:, 4:], after[:, 4:])
    # each position's state is the query of the prefix ending there
    with torch.no_grad():
        for end in range(2, 6):
            prefix = model(left_padded([item[0, 1 : end + 1].tolist()], seq_len=6))
            torch.testing.assert_close(before[0, end], prefix.query[0], atol=1e-6, rtol=0)


def test_score_items_and_score_candidates_agree() -> None:
    model = make_model()
    query = torch.randn(3, 8)
    full = model.score_items(query)
    assert full.shape == (3, NUM_ITEMS) and torch.isneginf(full[:, :2]).all()
    per_row = torch.tensor([[2, 5, 9], [3, 3, 1], [29, 7, 0]])
    torch.testing.assert_close(model.score_candidates(query, per_row), full.gather(1, per_row))
    shared = torch.tensor([4, 8, 1])
    torch.testing.assert_close(model.score_candidates(query, shared), full[:, shared])
    output = model(left_padded([[5, 6], [7, 8], [9, 10]], seq_len=3))
    # no re-rank head: stage 2 keeps the retrieval scores; explanations are over real positions
    scores, weights = model.rerank_scores(output, per_row, return_attention=True)
    torch.testing.assert_close(scores, model.score_candidates(output.query, per_row))
    assert weights.shape == (3, 3, 3) and torch.equal(weights[:, :, 0], torch.zeros(3, 3))
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 3))


def test_rebuilds_from_its_config_and_trains() -> None:
    model = make_model(dropout=0.1).train()
    item = left_padded([[5, 6, 7], [2, 3, 4, 5]], seq_len=4)
    loss = torch.nn.functional.cross_entropy(
        model.score_items(model(item).hidden[:, -2]), item[:, -1]
    )
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters())
    rebuilt = GRU4Rec(**model.config)
    rebuilt.load_state_dict(model.state_dict())  # strict
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(item).query, model.eval()(item).query)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"d_model": 0}, "d_model=0"),
        ({"hidden_size": 0}, "hidden_size=0"),
        ({"dropout": 1}, "dropout=1"),
    ],
)
def test_bad_settings_are_refused(setting: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_model(**setting)


@pytest.mark.parametrize("kind", ["atrank", "sasrec", "gru4rec"])
def test_every_encoder_has_the_interface(kind: str) -> None:
    sizes = {"num_items": NUM_ITEMS, "max_seq_len": 8, "d_model": 8}
    encoder = {
        "atrank": lambda: ATRank(
            **sizes, num_attributes=5, num_behaviors=4, num_time_buckets=6, num_heads=2
        ),
        "sasrec": lambda: SASRec(**sizes, num_heads=2),
        "gru4rec": lambda: GRU4Rec(**sizes),
    }[kind]()
    check_encoder(encoder)


class _Incomplete(nn.Module):
    """What the README's four-method interface used to suggest was enough."""

    def __init__(self, num_items: int = NUM_ITEMS, max_seq_len: int = 8) -> None:
        super().__init__()
        self.config = {"num_items": num_items, "max_seq_len": max_seq_len}
        self.table = nn.Embedding(num_items, 4)

    def forward(self, item, behavior=None, time_bucket=None, padding_mask=None, qt=None):
        hidden = self.table(item)
        return EncoderOutput(hidden, hidden[:, -1], item != PAD_IDX)

    def score_items(self, query, keys=None):
        return query @ self.table.weight.T

    def score_candidates(self, query, items):
        return (self.table(items) * query[:, None]).sum(-1)

    def rerank_scores(self, output, candidates, return_attention=False):
        return self.score_candidates(output.query, candidates)


def test_an_incomplete_encoder_is_refused_naming_what_it_lacks() -> None:
    encoder = _Incomplete()
    with pytest.raises(TypeError) as raised:
        check_encoder(encoder)
    message = str(raised.value)
    for member in ("num_items", "item_keys", "explanation_weights"):
        assert member in message and ENCODER_INTERFACE[member] in message
    encoder.num_items = NUM_ITEMS
    encoder.item_keys = lambda: encoder.table.weight
    encoder.explanation_weights = lambda output, candidates: None
    with pytest.raises(TypeError, match=r"must score PAD \(0\) and UNK \(1\) -inf"):
        check_encoder(encoder)
    encoder.config = {"num_items": NUM_ITEMS}
    with pytest.raises(TypeError, match=r"lacks \['max_seq_len'\]"):
        check_encoder(encoder)
