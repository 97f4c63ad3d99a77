"""The first-order transition baseline against hand-counted transitions, and the popularity
baseline."""

from __future__ import annotations

import math

import numpy as np
import torch

from recsys.model.popularity import Popularity
from recsys.model.transition import Transition

# users back to back: u0 = [2 3 4 | 2 3] (3 training events), u1 = [2 3 5], u2 = [4]
ITEM = np.array([2, 3, 4, 2, 3, 2, 3, 5, 4])
OFFSETS = np.array([0, 5, 8, 9])
TRAIN_END = np.array([3, 3, 1])
TRAIN_COUNTS = np.array([0, 0, 2, 2, 2, 1])  # PAD, UNK, items 2..5 in training


def model() -> Transition:
    return Transition.from_sequences(ITEM, OFFSETS, TRAIN_END, TRAIN_COUNTS)


def test_counts_only_pairs_inside_training() -> None:
    m = model()
    pairs = {
        (row, int(m.next_item[i]), float(m.count[i]))
        for row in range(6)
        for i in range(int(m.row_start[row]), int(m.row_start[row + 1]))
    }
    # u0's 4 -> 2 and 2 -> 3 reach into validation/test events; u2 has no pair
    assert pairs == {(2, 3, 2.0), (3, 4, 1.0), (3, 5, 1.0)}


def test_scores_follow_the_last_item_with_popularity_tie_break() -> None:
    m = model()
    history = torch.tensor([[0, 2, 3], [0, 0, 5]])  # left-padded; last items 3 and 5
    scores = m.score_items(m(history, None, None, history > 0).query)
    third = 1 / 3  # popularity / (max popularity 2 + 1)
    expected = torch.tensor(
        [
            [-math.inf, -math.inf, 2 * third, 2 * third, 1 + 2 * third, 1 + third],
            [-math.inf, -math.inf, 2 * third, 2 * third, 2 * third, third],  # 5 has no successor
        ]
    )
    torch.testing.assert_close(scores, expected.float())


def test_popularity_ranks_every_user_by_training_count_and_never_pad_or_unk() -> None:
    m = Popularity(torch.as_tensor(TRAIN_COUNTS) * torch.tensor([9, 9, 1, 3, 2, 1]))
    history = torch.tensor([[0, 2, 3], [0, 0, 5]])
    scores = m.score_items(m(history, None, None, history > 0).query)
    assert scores.shape == (2, 6)
    assert torch.equal(scores[0], scores[1])  # the same list for everyone
    assert torch.isneginf(scores[:, :2]).all()  # PAD and UNK, whatever their counts
    assert scores[0].argsort(descending=True)[:4].tolist() == [3, 4, 2, 5]  # counts 6, 4, 2, 1
