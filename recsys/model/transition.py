"""The first-order transition baseline: the items that most often followed the user's last item.

PROTOCOLS.md (P1, "trivial baselines") defines it and gives its numbers on the S3-Rec files:
an item's score is the number of times it directly followed the user's most recent history item
in the training sequences, with training popularity as the tie-break (a fraction below 1, so it
never outranks one more transition). A sequence model that does not clear it by a wide margin is
not yet trained well, and because it has no parameters to select, its validation and test
numbers show how far apart the two splits lie on the data itself.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from recsys.model.layers import never_recommended
from recsys.model.outputs import EncoderOutput


class Transition(nn.Module):
    """Scores ``count(last item -> item) + popularity(item) / (max popularity + 1)``.

    The counts are a sparse (I, I) matrix in CSR form (``row_start``, ``next_item``,
    ``count``); a batch gathers only the rows of its users' last items. PAD and UNK are never
    recommended. It follows the encoder interface (``forward`` -> :class:`EncoderOutput`,
    ``score_items``) so the same ranking and metric code evaluates it; the query it hands to
    ``score_items`` is the last history item's index.
    """

    def __init__(
        self,
        row_start: torch.Tensor,
        next_item: torch.Tensor,
        count: torch.Tensor,
        train_counts: torch.Tensor,
    ):
        super().__init__()
        num_items = len(train_counts)
        if len(row_start) != num_items + 1 or len(next_item) != len(count):
            raise ValueError(
                f"transition matrix of {len(row_start) - 1} rows and {len(next_item)} entries "
                f"(counts: {len(count)}) does not fit a catalogue of {num_items} items"
            )
        self.num_items = num_items
        popularity = train_counts.double()
        tie_break = popularity / (popularity.max() + 1)  # < 1: never beats one more transition
        self.register_buffer("item_scores", tie_break + never_recommended(num_items).double())
        self.register_buffer("row_start", row_start.long())
        self.register_buffer("next_item", next_item.long())
        self.register_buffer("count", count.double())

    @classmethod
    def from_sequences(
        cls,
        item: np.ndarray,
        offsets: np.ndarray,
        train_end: np.ndarray,
        train_counts: np.ndarray,
    ) -> Transition:
        """Count consecutive pairs inside each user's training events.

        ``item`` (N,) holds every user's encoded events back to back, user ``u`` at
        ``offsets[u]:offsets[u+1]``, of which the first ``train_end[u]`` are training events
        (the layout of :class:`recsys.data.dataset.SequenceStore`). Pairs that reach into a
        validation or test event are not counted.
        """
        num_items = len(train_counts)
        position = np.arange(len(item)) - np.repeat(offsets[:-1], np.diff(offsets))
        limit = np.repeat(np.minimum(train_end, np.diff(offsets)), np.diff(offsets))
        pair = np.flatnonzero(position[:-1] + 1 < limit[:-1])  # event i and i+1 both training
        source, target = item[pair], item[pair + 1]
        key, count = np.unique(source.astype(np.int64) * num_items + target, return_counts=True)
        rows = key // num_items
        row_start = np.searchsorted(rows, np.arange(num_items + 1))
        return cls(
            torch.from_numpy(row_start),
            torch.from_numpy(key % num_items),
            torch.from_numpy(count),
            torch.as_tensor(np.asarray(train_counts)),
        )

    def forward(
        self, item, behavior, time_bucket, padding_mask, query_time_bucket=None
    ) -> EncoderOutput:
        """Shapes: item (B, T), left-padded; the query is the last item's index (B, 1)."""
        last = item[:, -1:].double()  # (B, 1)
        hidden = item[..., None].double()  # (B, T, 1)
        return EncoderOutput(hidden=hidden, query=last, padding_mask=padding_mask)

    def score_items(self, query: torch.Tensor) -> torch.Tensor:
        """Shapes: query (B, 1) last item indices -> (B, I) float32 scores."""
        last = query[:, 0].long()
        start, end = self.row_start[last], self.row_start[last + 1]  # (B,)
        size = end - start
        row = torch.repeat_interleave(torch.arange(len(last), device=last.device), size)
        first = torch.repeat_interleave(start - (torch.cumsum(size, 0) - size), size)
        entry = torch.arange(int(size.sum()), device=last.device) + first
        scores = self.item_scores.expand(len(last), -1).clone()  # (B, I)
        scores[row, self.next_item[entry]] += self.count[entry]
        return scores.float()
