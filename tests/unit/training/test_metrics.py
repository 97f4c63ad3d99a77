import math

import pytest
import torch

from recsys.training.metrics import (
    MISS_RANK,
    MeanAccumulator,
    known_target_shares,
    rank_in_list,
    ranking_metrics,
    sampled_ranks,
    target_ranks,
)


def test_target_ranks_by_hand():
    scores = torch.tensor(
        [
            [0.1, 0.9, 0.5, 0.5],  # target 2: only item 1 is higher -> rank 2 (tie not counted)
            [0.4, 0.3, 0.2, 0.1],  # target 0 -> rank 1
            [0.4, 0.3, 0.2, 0.1],  # target 3 -> rank 4
        ]
    )
    ranks = target_ranks(scores, torch.tensor([2, 0, 3]))
    assert ranks.tolist() == [2, 1, 4]


def test_target_scored_minus_inf_is_a_miss():
    scores = torch.tensor([[0.1, -math.inf, -math.inf, -math.inf]])
    # a naive count would say rank 1 (nothing is above -inf); an excluded target is a miss
    assert target_ranks(scores, torch.tensor([2])).tolist() == [MISS_RANK]


def test_ranking_metrics_by_hand():
    ranks = torch.tensor([1, 2, 3, 11])
    m = ranking_metrics(ranks, [1, 3, 10])
    assert m["hr_at_1"].tolist() == [1, 0, 0, 0]
    assert m["hr_at_3"].tolist() == [1, 1, 1, 0]
    assert m["hr_at_10"].tolist() == [1, 1, 1, 0]
    expected_ndcg3 = [1.0, 1 / math.log2(3), 1 / math.log2(4), 0.0]
    assert m["ndcg_at_3"].tolist() == pytest.approx(expected_ndcg3)
    assert m["mrr_at_10"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.0])
    assert m["ndcg_at_1"].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_rank_in_list():
    ranked = torch.tensor([[5, 7, 9], [1, 2, 3]])
    assert rank_in_list(ranked, torch.tensor([9, 4])).tolist() == [3, MISS_RANK]


def test_rank_in_list_by_scores_gives_ties_to_the_target():
    ranked = torch.tensor([[5, 9, 4, 7]]).expand(4, -1)
    scores = torch.tensor([[2.0, 1.0, 1.0, 0.0]]).repeat(4, 1)
    scores[3, 2] = math.nan  # a diverged score: a miss, never rank 1
    ranks = rank_in_list(ranked, torch.tensor([4, 7, 3, 4]), scores)
    assert ranks.tolist() == [2, 4, MISS_RANK, MISS_RANK]


def test_two_stage_puts_a_favoured_item_first_among_its_ties_and_into_the_list():
    from recsys.retrieval.ranker import two_stage

    # items 0..7 scored 3, 2, 1, 1, 1, 1, 0, 0: a list of 3 has room for one of the four 1s
    scores = torch.tensor([[3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]]).repeat(4, 1)
    favour = torch.tensor([2, 3, 5, 0])
    ranking = two_stage(None, None, top_k=3, rerank_top_n=0, scores=scores, favour=favour)
    assert ranking.items[:, :2].tolist() == [[0, 1]] * 4
    assert ranking.items[:3, 2].tolist() == [2, 3, 5]  # whichever tied item topk kept
    assert ranking.items[3, 2].item() in (2, 3, 4, 5)  # an untied item changes nothing
    torch.testing.assert_close(ranking.scores, torch.tensor([[3.0, 2.0, 1.0]]).repeat(4, 1))
    deeper = two_stage(None, None, top_k=6, rerank_top_n=0, scores=scores, favour=favour)
    assert deeper.items[:, 2].tolist()[:3] == [2, 3, 5]  # first of the four 1s
    assert sorted(deeper.items[0, 2:].tolist()) == [2, 3, 4, 5]


def test_metrics_match_a_brute_force_loop():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 50, generator=generator)
    target = torch.randint(0, 50, (64,), generator=generator)
    ranks = target_ranks(scores, target)
    for row in range(64):
        order = sorted(range(50), key=lambda i: -scores[row, i].item())
        assert ranks[row].item() == order.index(target[row].item()) + 1


def test_mean_accumulator():
    acc = MeanAccumulator()
    acc.update({"hr": torch.tensor([1.0, 0.0])})
    acc.update({"hr": torch.tensor([1.0])})
    assert acc.compute() == {"hr": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="no rows"):
        MeanAccumulator().compute()


def test_known_target_shares_from_the_preparation_counts():
    stats = {
        "val_targets": 3,
        "val_targets_unknown_item": 1,
        "test_targets": 10,
        "test_targets_unknown_item": 0,
    }
    assert known_target_shares(stats) == {"val": 0.75, "test": 1.0}
    # no targets at all (or an older stats.json without the counts): nothing to scale
    assert known_target_shares({}) == {"val": 1.0, "test": 1.0}


def test_a_nan_target_score_is_a_miss_not_rank_one():
    # a diverged model scores everything NaN; nothing compares higher than NaN, so a plain
    # count would give every target rank 1 (HR = NDCG = 1) and checkpointing would select it
    scores = torch.full((2, 5), math.nan)
    scores[1] = torch.tensor([0.1, 0.9, 0.5, math.nan, 0.2])
    assert target_ranks(scores, torch.tensor([2, 3])).tolist() == [MISS_RANK] * 2
    negatives = torch.tensor([[3, 4], [2, 4]])
    ranks, auc = sampled_ranks(
        scores, torch.tensor([2, 3]), negatives, torch.ones(2, 2, dtype=bool)
    )
    assert ranks.tolist() == [3, 3]
    assert auc.tolist() == [0.0, 0.0]


def test_mean_accumulator_standard_errors_match_the_sample_formula():
    rows = torch.tensor([0.0, 1.0, 0.5, 0.25, 0.0, 1.0, 0.125])
    totals = MeanAccumulator()
    for part in rows.split(3):  # batches of 3, 3 and 1 rows
        totals.update({"ndcg": part})
    expected = float(rows.double().std(correction=1)) / len(rows) ** 0.5
    assert totals.standard_errors() == {"ndcg": pytest.approx(expected)}
    assert totals.compute() == {"ndcg": pytest.approx(float(rows.mean()))}
    one = MeanAccumulator()
    one.update({"ndcg": torch.tensor([0.5])})
    assert one.standard_errors() == {"ndcg": 0.0}
