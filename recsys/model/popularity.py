"""The popularity baseline: every user gets the items most frequent in the training window."""

from __future__ import annotations

import torch
from torch import nn

from recsys.model.layers import never_recommended
from recsys.model.outputs import EncoderOutput


class Popularity(nn.Module):
    """Scores each item by its training-window event count; PAD and UNK are never recommended.

    It follows the encoder interface (``forward`` -> :class:`EncoderOutput`, ``score_items``)
    so the same ranking and metric code evaluates it.
    """

    def __init__(self, train_counts: torch.Tensor):
        super().__init__()
        self.num_items = len(train_counts)
        scores = train_counts.double().log1p().float() + never_recommended(len(train_counts))
        self.register_buffer("item_scores", scores)

    def forward(
        self, item, behavior, time_bucket, padding_mask, query_time_bucket=None
    ) -> EncoderOutput:
        empty = torch.zeros(*item.shape, 1, device=item.device)  # (B, T, 1): no user state
        return EncoderOutput(hidden=empty, query=empty[:, -1], padding_mask=padding_mask)

    def score_items(self, query: torch.Tensor) -> torch.Tensor:
        """Shapes: query (B, D) -> (B, I), the same row for everyone."""
        return self.item_scores.expand(query.shape[0], -1)
