"""First-order item transitions: the baseline that ranks by them, and the prior that adds them
to a model's scores.

:class:`TransitionCounts` holds how often each item directly followed each other item in the
training sequences (a sparse (I, I) matrix). Two things read it:

- :class:`Transition`, the baseline of PROTOCOLS.md (P1, "trivial baselines"): an item's score
  is the number of times it directly followed the user's most recent history item, with
  training popularity as the tie-break (a fraction below 1, so it never outranks one more
  transition). A sequence model that does not clear it by a wide margin is not yet trained
  well, and because it has no parameters to select, its validation and test numbers show how
  far apart the two splits lie on the data itself.
- :class:`TransitionPrior` (``training.transition_prior``): a trained model's scores plus
  ``weight * log(1 + count(last item -> item))``, the first-order Markov term of FPMC (Rendle
  et al. 2010) added to a sequence model after training. A model regularised as strongly as
  the P1 recipes are does not memorise every observed pair; the counts do (Beauty, one seed:
  validation NDCG@10 +4 %, test +2.8 %: benchmarks/README.md, "Transition prior").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from recsys.model.layers import never_recommended
from recsys.model.outputs import EncoderOutput
from recsys.schema import NUM_RESERVED, PAD_IDX


@dataclass(frozen=True)
class TransitionCounts:
    """``count[e]`` times item ``next_item[e]`` directly followed item ``r`` in the training
    sequences, for the entries ``e`` in ``row_start[r] : row_start[r + 1]`` (CSR rows by the
    earlier item, columns sorted). Shapes: ``row_start`` (I + 1,), the others (P,) pairs."""

    row_start: torch.Tensor
    next_item: torch.Tensor
    count: torch.Tensor

    def __post_init__(self) -> None:
        size = len(self.row_start) - 1
        if (
            size < 0
            or len(self.next_item) != len(self.count)
            or self.row_start[-1] != len(self.count)
        ):
            raise ValueError(
                f"transition counts of {size} rows and {len(self.next_item)} entries (counts: "
                f"{len(self.count)}, rows end at {int(self.row_start[-1]) if size >= 0 else '-'})"
                " are not a CSR matrix"
            )

    @property
    def num_items(self) -> int:
        return len(self.row_start) - 1

    @classmethod
    def from_sequences(
        cls, item: np.ndarray, offsets: np.ndarray, train_end: np.ndarray, num_items: int
    ) -> TransitionCounts:
        """Count consecutive pairs inside each user's training events.

        ``item`` (N,) holds every user's encoded events back to back, user ``u`` at
        ``offsets[u]:offsets[u+1]``, of which the first ``train_end[u]`` are training events
        (the layout of :class:`recsys.data.dataset.SequenceStore`). Pairs that reach into a
        validation or test event are not counted. UNK (items below ``data.min_item_count``)
        counts as one item, as in PROTOCOLS.md's baseline; the prior reads no UNK row.
        """
        lengths = np.diff(offsets)
        position = np.arange(len(item)) - np.repeat(offsets[:-1], lengths)
        limit = np.repeat(np.minimum(train_end, lengths), lengths)
        pair = np.flatnonzero(position[:-1] + 1 < limit[:-1])  # event i and i+1 both training
        source, target = item[pair].astype(np.int64), item[pair + 1].astype(np.int64)
        key, count = np.unique(source * num_items + target, return_counts=True)
        row_start = np.searchsorted(key // num_items, np.arange(num_items + 1))
        return cls(
            torch.from_numpy(row_start).long(),
            torch.from_numpy(key % num_items).long(),
            torch.from_numpy(count).long(),
        )

    def to_plain(self) -> dict[str, torch.Tensor]:
        """Tensors only: safe inside a ``weights_only`` checkpoint."""
        return {"row_start": self.row_start, "next_item": self.next_item, "count": self.count}

    @classmethod
    def from_plain(cls, plain: dict) -> TransitionCounts:
        return cls(plain["row_start"], plain["next_item"], plain["count"])


def row_entries(
    row_start: torch.Tensor, last: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CSR entries of the rows ``last`` (B,): for each entry its batch row (E,), its index
    into the entry arrays (E,), and its position within its batch row (E,)."""
    start, end = row_start[last], row_start[last + 1]  # (B,)
    size = end - start
    batch_row = torch.repeat_interleave(torch.arange(len(last), device=last.device), size)
    before = torch.cumsum(size, 0) - size  # entries of earlier batch rows
    within = torch.arange(int(size.sum()), device=last.device) - torch.repeat_interleave(
        before, size
    )
    return batch_row, torch.repeat_interleave(start, size) + within, within


class Transition(nn.Module):
    """Scores ``count(last item -> item) + popularity(item) / (max popularity + 1)``.

    A batch gathers only the rows of its users' last items. PAD and UNK are never recommended.
    It follows the encoder interface (``forward`` -> :class:`EncoderOutput`, ``score_items``)
    so the same ranking and metric code evaluates it; the query it hands to ``score_items`` is
    the last history item's index.
    """

    def __init__(self, counts: TransitionCounts, train_counts: torch.Tensor):
        super().__init__()
        num_items = len(train_counts)
        if counts.num_items != num_items:
            raise ValueError(
                f"transition counts of {counts.num_items} rows do not fit a catalogue of "
                f"{num_items} items"
            )
        self.num_items = num_items
        popularity = train_counts.double()
        tie_break = popularity / (popularity.max() + 1)  # < 1: never beats one more transition
        self.register_buffer("item_scores", tie_break + never_recommended(num_items).double())
        self.register_buffer("row_start", counts.row_start.long())
        self.register_buffer("next_item", counts.next_item.long())
        self.register_buffer("count", counts.count.double())

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
        batch_row, entry, _ = row_entries(self.row_start, last)
        scores = self.item_scores.expand(len(last), -1).clone()  # (B, I)
        scores[batch_row, self.next_item[entry]] += self.count[entry]
        return scores.float()


class TransitionPrior:
    """``weight * log(1 + count(last item -> item))``, added to a model's scores of every
    item (:meth:`add_to`) or of a candidate list (:meth:`candidates`).

    The term is 0 for every item that never followed the user's last item, so a ranking by
    the sum is exact from the model's own top K plus the (few) items that did follow it: that
    is how scoring applies it on top of any item index. Non-negative, so a rule that scores
    an item 0 (P1's seen items) keeps meaning what it meant without it.

    Example: counts 2 -> 3 twice and 2 -> 5 once, weight 1, last item 2: item 3 gains
    log 3 = 1.10, item 5 log 2 = 0.69, every other item 0.

    A plain object, not a module: it holds no trained parameter, and weight averaging's deep
    copy of the training module shares it instead of copying the counts.
    """

    def __init__(self, counts: TransitionCounts, weight: float):
        if not (isinstance(weight, (int, float)) and not isinstance(weight, bool)) or not (
            0 <= weight < math.inf
        ):
            raise ValueError(f"transition prior weight={weight!r} must be a number >= 0")
        self.counts = counts
        self.weight = float(weight)
        self._on: dict[torch.device, TransitionCounts] = {}

    def __deepcopy__(self, memo: dict) -> TransitionPrior:
        return self

    def _entries(self, last: torch.Tensor):
        """(counts on ``last``'s device, batch row, entry, position in row) of ``last``'s rows;
        UNK's row (the successors of every rare item at once) is read as PAD's, empty."""
        last = last.masked_fill(last < NUM_RESERVED, PAD_IDX)
        counts = self._on.get(last.device)
        if counts is None:
            counts = self._on[last.device] = TransitionCounts(
                *(t.to(last.device) for t in self.counts.to_plain().values())
            )
        return counts, *row_entries(counts.row_start, last)

    def add_to(self, scores: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Shapes: scores (B, I), last (B,) item indices -> (B, I), a new tensor (``scores``
        itself with weight 0)."""
        if not self.weight:
            return scores
        counts, batch_row, entry, _ = self._entries(last)
        boost = torch.zeros_like(scores)
        boost[batch_row, counts.next_item[entry]] = torch.log1p(counts.count[entry].to(scores))
        return scores + self.weight * boost

    def candidates(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: last (B,) -> items (B, M) that followed each row's last item, PAD-padded
        (M: the longest row, at least 1), and their terms (B, M) (0 at padding)."""
        counts, batch_row, entry, within = self._entries(last)
        width = max(1, int(within.max()) + 1) if len(within) else 1
        items = torch.zeros(len(last), width, dtype=torch.long, device=last.device)
        terms = torch.zeros(len(last), width, device=last.device)
        items[batch_row, within] = counts.next_item[entry]
        terms[batch_row, within] = self.weight * torch.log1p(counts.count[entry].float())
        return items, terms

    def to_plain(self) -> dict:
        """Tensors and a number only: safe inside a ``weights_only`` checkpoint."""
        return {"weight": self.weight, **self.counts.to_plain()}

    @classmethod
    def from_plain(cls, plain: dict) -> TransitionPrior:
        return cls(TransitionCounts.from_plain(plain), plain["weight"])
