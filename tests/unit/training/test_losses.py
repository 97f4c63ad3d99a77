"""Each loss against values computed by hand on a tiny batch, and the negative samplers."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.training import losses


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_full_softmax_matches_hand_computed_cross_entropy():
    logits = torch.tensor(
        [[-math.inf, -math.inf, 1.0, 2.0, 0.0], [-math.inf, -math.inf, 0.0, 0.0, 0.0]]
    )
    target = torch.tensor([3, 2])
    row0 = -(2.0 - math.log(math.e**1 + math.e**2 + math.e**0))
    row1 = math.log(3.0)
    assert losses.full_softmax(logits, target).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # weights: row 1 counts three times as much as row 0
    weighted = losses.full_softmax(logits, target, torch.tensor([1.0, 3.0]))
    assert weighted.item() == pytest.approx((row0 + 3 * row1) / 4, rel=1e-6)


def test_full_softmax_label_smoothing_matches_the_worked_example():
    logits = torch.tensor([[0.0, math.log(2.0), -math.inf]])  # PAD-like column left out
    target = torch.tensor([0])
    expected = 0.9 * math.log(3.0) + 0.1 * (math.log(3.0) + math.log(1.5)) / 2
    smoothed = losses.full_softmax(logits, target, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(1.0640, abs=1e-4)
    # over finite scores only it is torch's own label smoothing
    finite = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]])
    torch.testing.assert_close(
        losses.full_softmax(finite, torch.tensor([1, 0]), label_smoothing=0.2),
        torch.nn.functional.cross_entropy(finite, torch.tensor([1, 0]), label_smoothing=0.2),
    )
    assert losses.full_softmax(logits, target, label_smoothing=0.0).item() == pytest.approx(
        math.log(3.0), rel=1e-6
    )


def test_distillation_matches_the_worked_example():
    teacher = torch.tensor([[math.log(0.75), math.log(0.25)]])
    value = losses.distillation(torch.zeros(1, 2), teacher)
    assert value.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-6)
    assert value.item() == pytest.approx(0.1308, abs=1e-4)
    # the same distributions give 0; τ scales the logits and multiplies the result by τ²
    same = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.5]]), -1)
    assert losses.distillation(torch.tensor([[1.0, 2.0, 0.5]]), same).item() == pytest.approx(0)
    hot = losses.distillation(torch.zeros(1, 2) * 2.0, teacher, temperature=2.0)
    assert hot.item() == pytest.approx(4 * value.item(), abs=1e-6)


def test_distillation_leaves_out_items_both_exclude_and_weighs_rows():
    teacher = torch.tensor([[math.log(0.75), math.log(0.25), -math.inf]])
    logits = torch.tensor([[0.0, 0.0, -math.inf]])
    value = losses.distillation(logits, teacher)
    assert torch.isfinite(value) and value.item() == pytest.approx(0.1308, abs=1e-4)
    rows = torch.cat([teacher, torch.log_softmax(torch.zeros(1, 3), -1)])  # row 2: KL 0
    both = losses.distillation(torch.zeros(2, 3), rows, weight=torch.tensor([1.0, 3.0]))
    first = losses.distillation(torch.zeros(1, 3), rows[:1])
    assert both.item() == pytest.approx(first.item() / 4, abs=1e-6)
    # no row at all: 0, not NaN
    assert losses.distillation(torch.zeros(0, 3), torch.zeros(0, 3)).item() == 0


def test_info_nce_matches_the_worked_example():
    rows = torch.eye(2)  # [1, 0] and [0, 1], both views the same
    expected = -math.log(math.e / (math.e + 2))  # positive at 1, two negatives at 0
    assert losses.info_nce(rows, rows).item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.5514, abs=1e-4)
    assert losses.info_nce(rows[:1], rows[:1]).item() == 0.0  # one row: nothing to contrast


def _info_nce_brute_force(a, b, temperature, labels):
    """Vector by vector: the other view is the positive, every vector of another label (or of
    any other row without labels) a negative."""
    vectors = torch.cat([a, b]).double()
    rows = len(a)
    both = None if labels is None else labels.repeat(2)
    total = 0.0
    for i in range(2 * rows):
        positive = (i + rows) % (2 * rows)
        candidates = [positive] + [
            j
            for j in range(2 * rows)
            if j not in (i, positive) and (both is None or both[j] != both[i])
        ]
        sims = torch.stack([vectors[i] @ vectors[j] / temperature for j in candidates])
        total += -(sims[0] - torch.logsumexp(sims, 0)).item()
    return total / (2 * rows)


@pytest.mark.parametrize("labels", [None, torch.tensor([5, 7, 5, 9, 7])])
@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_info_nce_matches_a_brute_force_reference(labels, temperature):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    got = losses.info_nce(a, b, temperature, labels)
    assert got.item() == pytest.approx(_info_nce_brute_force(a, b, temperature, labels), rel=1e-5)


def test_attribute_softmax_matches_the_worked_example():
    # columns: PAD, UNK, a1, a2, a3; scores [0, ln 2, 0] over the real ones
    logits = torch.tensor(
        [
            [-math.inf, -math.inf, 0.0, math.log(2.0), 0.0],
            [-math.inf, -math.inf, 0.0, 0.0, 0.0],
            [-math.inf, -math.inf, 5.0, 0.0, 0.0],
        ]
    )
    attributes = torch.tensor([[2, 3, 0], [4, 1, 0], [1, 0, 0]])  # {a1, a2}, {a3, UNK}, {UNK}
    row0 = -(math.log(1 / 4) + math.log(2 / 4)) / 2  # the module docstring's 1.0397
    row1 = math.log(3.0)  # UNK ignored: one real attribute of three equal scores
    assert row0 == pytest.approx(1.0397, abs=1e-4)
    # the third row has no real attribute: left out of the mean
    got = losses.attribute_softmax(logits, attributes)
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    weighted = losses.attribute_softmax(logits, attributes, torch.tensor([1.0, 3.0, 100.0]))
    assert weighted.item() == pytest.approx((row0 + 3 * row1) / 4, rel=1e-6)
    assert losses.attribute_softmax(logits[2:], attributes[2:]).item() == 0.0
    # finite gradients despite the -inf columns
    trainable = logits.clone().requires_grad_()
    losses.attribute_softmax(trainable, attributes).backward()
    assert torch.isfinite(trainable.grad).all()


def test_bce_matches_the_worked_example_and_sums_negatives():
    positive = torch.tensor([2.0])
    assert losses.bce(positive, torch.tensor([[0.0]])).item() == pytest.approx(
        -math.log(sigmoid(2.0)) - math.log(1 - sigmoid(0.0)), rel=1e-6
    )
    two = losses.bce(positive, torch.tensor([[0.0, -1.0]])).item()
    expected = -math.log(sigmoid(2.0)) - math.log(1 - sigmoid(0.0)) - math.log(1 - sigmoid(-1.0))
    assert two == pytest.approx(expected, rel=1e-6)


def test_bce_ignores_accidental_hits():
    got = losses.bce(
        torch.tensor([1.0]), torch.tensor([[0.5, 3.0]]), accidental=torch.tensor([[False, True]])
    ).item()
    assert got == pytest.approx(-math.log(sigmoid(1.0)) - math.log(1 - sigmoid(0.5)), rel=1e-6)


def test_gbce_beta_and_loss():
    # alpha = 2 / (5 - 1) = 0.5; beta = 0.5 * (0.75 * (1 - 2) + 2) = 0.625
    beta = losses.gbce_beta(num_negatives=2, num_items=5, t=0.75)
    assert beta == pytest.approx(0.625)
    assert losses.gbce_beta(num_negatives=2, num_items=5, t=0.0) == pytest.approx(1.0)
    assert losses.gbce_beta(num_negatives=2, num_items=5, t=1.0) == pytest.approx(0.5)
    got = losses.bce(torch.tensor([1.5]), torch.tensor([[0.2, -0.3]]), beta=beta).item()
    expected = (
        -0.625 * math.log(sigmoid(1.5)) - math.log(1 - sigmoid(0.2)) - math.log(1 - sigmoid(-0.3))
    )
    assert got == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="t=1.5"):
        losses.gbce_beta(num_negatives=2, num_items=5, t=1.5)


def test_sampled_softmax_applies_log_q_and_drops_accidental_hits():
    positive = torch.tensor([1.0])
    negatives = torch.tensor([[0.5, 2.0, 1.0]])
    log_q_pos = torch.tensor([math.log(0.5)])
    log_q_neg = torch.tensor([math.log(0.25), math.log(0.5), math.log(0.125)])  # shared (K,)
    accidental = torch.tensor([[False, True, False]])
    got = losses.sampled_softmax(
        positive,
        negatives,
        log_q_positive=log_q_pos,
        log_q_negatives=log_q_neg,
        accidental=accidental,
    ).item()
    corrected = [1.0 - math.log(0.5), 0.5 - math.log(0.25), 1.0 - math.log(0.125)]
    expected = -(corrected[0] - math.log(sum(math.exp(c) for c in corrected)))
    assert got == pytest.approx(expected, rel=1e-6)


def test_uniform_sampler_never_draws_pad_or_unk():
    sampler = losses.NegativeSampler(6, "uniform")
    drawn = sampler.sample((10_000,), generator=torch.Generator().manual_seed(0))
    assert drawn.min() >= 2 and drawn.max() <= 5
    assert sampler.log_q(torch.tensor([2, 5])).tolist() == pytest.approx([math.log(0.25)] * 2)


def test_a_sampler_registered_in_losses_draws_by_its_own_weights(monkeypatch):
    """A name added to ``losses.SAMPLERS`` without a case in ``NegativeSampler`` had drawn
    uniformly under the new name: ``SAMPLERS`` now maps each name to the weights it draws by."""

    def last_items(num_items, counts):
        return (torch.arange(num_items) >= num_items - 2).double()  # the two last items only

    monkeypatch.setitem(losses.SAMPLERS, "last_items", last_items)
    sampler = losses.NegativeSampler(6, "last_items")
    drawn = sampler.sample((1_000,), generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {4, 5}
    assert sampler.log_q(torch.tensor([3, 4])).tolist() == pytest.approx([-math.inf, math.log(0.5)])
    monkeypatch.setitem(losses.SAMPLERS, "none", lambda num_items, counts: torch.zeros(num_items))
    with pytest.raises(ValueError, match="'none' sampler's weights must be 6 numbers >= 0"):
        losses.NegativeSampler(6, "none")


def test_popularity_sampler_follows_the_counts():
    counts = torch.tensor([0, 0, 1, 3])
    sampler = losses.NegativeSampler(4, "popularity", counts)
    drawn = sampler.sample((40_000,), generator=torch.Generator().manual_seed(0))
    share = (drawn == 3).float().mean().item()
    assert share == pytest.approx(0.75, abs=0.02)
    assert sampler.log_q(torch.tensor([2, 3])).tolist() == pytest.approx(
        [math.log(0.25), math.log(0.75)], rel=1e-5
    )
    with pytest.raises(ValueError, match="training count"):
        losses.NegativeSampler(4, "popularity")
    with pytest.raises(ValueError, match="not supported"):
        losses.NegativeSampler(4, "zipf")
