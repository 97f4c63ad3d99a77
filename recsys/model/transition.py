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
  ``weight * sum_j decay^(j-1) * log(1 + count(j-th most recent item -> item))`` over the
  user's ``recent`` most recent items, with pairs counted up to ``window`` steps apart. With
  ``recent`` and ``window`` 1 it is the first-order Markov term of FPMC (Rendle et al. 2010)
  added to a sequence model after training; wider, it is an item-to-item co-occurrence score
  of the recent history (item-based neighbourhood methods). A model regularised as strongly as
  the P1 recipes are does not memorise every observed pair; the counts do (benchmarks/README.md,
  "Transition prior").
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
    """``count[e]`` times item ``next_item[e]`` followed item ``r`` at most ``window`` events
    later (1: directly) in the training sequences, for the entries ``e`` in ``row_start[r] :
    row_start[r + 1]`` (CSR rows by the earlier item, columns sorted). Shapes: ``row_start``
    (I + 1,), the others (P,) pairs."""

    row_start: torch.Tensor
    next_item: torch.Tensor
    count: torch.Tensor
    window: int = 1

    def __post_init__(self) -> None:
        size = len(self.row_start) - 1
        _check_whole("window", self.window)
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
        cls,
        item: np.ndarray,
        offsets: np.ndarray,
        train_end: np.ndarray,
        num_items: int,
        window: int = 1,
        ends: np.ndarray | None = None,
    ) -> TransitionCounts:
        """Count the pairs inside each user's training events at most ``window`` events apart
        (1: consecutive), each distance once: ``a b c`` with window 2 counts a -> b, b -> c
        and a -> c. ``ends`` (N,) bool, when given: the events a pair may end in (those of the
        behaviours evaluated as targets, e.g. purchases); every event still starts pairs.

        ``item`` (N,) holds every user's encoded events back to back, user ``u`` at
        ``offsets[u]:offsets[u+1]``, of which the first ``train_end[u]`` are training events
        (the layout of :class:`recsys.data.dataset.SequenceStore`). Pairs that reach into a
        validation or test event are not counted. UNK (items below ``data.min_item_count``)
        counts as one item, as in PROTOCOLS.md's baseline; the prior reads no UNK row.
        """
        _check_whole("window", window)
        lengths = np.diff(offsets)
        position = np.arange(len(item)) - np.repeat(offsets[:-1], lengths)
        limit = np.repeat(np.minimum(train_end, lengths), lengths)  # a user's training events
        keys, counts = [], []
        for distance in range(1, min(window, max(len(item) - 1, 1)) + 1):
            head = len(item) - distance
            both_training = position[:head] + distance < limit[:head]
            if ends is not None:
                both_training &= ends[distance:]
            pair = np.flatnonzero(both_training)
            source = item[pair].astype(np.int64)
            key, count = np.unique(source * num_items + item[pair + distance], return_counts=True)
            keys.append(key)
            counts.append(count)
        key, where = np.unique(np.concatenate(keys), return_inverse=True)  # sorted: CSR order
        count = np.bincount(where, weights=np.concatenate(counts), minlength=len(key))
        row_start = np.searchsorted(key // num_items, np.arange(num_items + 1))
        return cls(
            torch.from_numpy(row_start).long(),
            torch.from_numpy(key % num_items).long(),
            torch.from_numpy(count.astype(np.int64)).long(),
            window,
        )

    def to_plain(self) -> dict[str, torch.Tensor]:
        """The CSR tensors (safe inside a ``weights_only`` checkpoint and an export's table);
        :attr:`window` goes beside them (:meth:`TransitionPrior.to_plain`)."""
        return {"row_start": self.row_start, "next_item": self.next_item, "count": self.count}

    @classmethod
    def from_plain(cls, plain: dict, window: int = 1) -> TransitionCounts:
        return cls(plain["row_start"], plain["next_item"], plain["count"], window)


def row_entries(row_start: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR entries of the rows ``last`` (B,): for each entry its batch row (E,) and its
    index into the entry arrays (E,)."""
    start, end = row_start[last], row_start[last + 1]  # (B,)
    size = end - start
    batch_row = torch.repeat_interleave(torch.arange(len(last), device=last.device), size)
    return batch_row, torch.repeat_interleave(start, size) + positions_in_runs(size)


def positions_in_runs(size: torch.Tensor) -> torch.Tensor:
    """0, 1, ... within each of the back-to-back runs of ``size`` (B,) entries: (sum(size),)."""
    before = torch.cumsum(size, 0) - size  # entries of earlier runs
    return torch.arange(int(size.sum()), device=size.device) - torch.repeat_interleave(before, size)


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
        batch_row, entry = row_entries(self.row_start, last)
        scores = self.item_scores.expand(len(last), -1).clone()  # (B, I)
        scores[batch_row, self.next_item[entry]] += self.count[entry]
        return scores.float()


class TransitionPrior:
    """``weight * sum_j decay^(j-1) * log(1 + count(h_j -> item))``, ``h_1`` the user's most
    recent item, ``h_2`` the one before, up to ``h_recent``, added to a model's scores of every
    item (:meth:`add_to`) or of a candidate list (:meth:`candidates`). The counts are
    :class:`TransitionCounts` (pairs at most ``counts.window`` events apart).

    The term is 0 for every item that never followed one of the user's recent items, so a
    ranking by the sum is exact from the model's own top K plus the (few) items that did
    follow them: that is how scoring applies it on top of any item index. Non-negative, so a
    rule that scores an item 0 (P1's seen items) keeps meaning what it meant without it.

    Example: counts 2 -> 3 twice and 2 -> 5 once, weight 1, last item 2: item 3 gains
    log 3 = 1.10, item 5 log 2 = 0.69, every other item 0. With ``recent=2``, ``decay=0.5``
    and 4 -> 5 once, history ``[4, 2]`` gives item 5 log 2 + 0.5 log 2 = 1.04.

    A plain object, not a module: it holds no trained parameter, and weight averaging's deep
    copy of the training module shares it instead of copying the counts.
    """

    def __init__(
        self, counts: TransitionCounts, weight: float, recent: int = 1, decay: float = 1.0
    ):
        if not _is_number(weight) or not 0 <= weight < math.inf:
            raise ValueError(f"transition prior weight={weight!r} must be a number >= 0")
        check_prior_settings(window=counts.window, recent=recent, decay=decay)
        self.counts = counts
        self.weight = float(weight)
        self.recent = int(recent)
        self.decay = float(decay)
        self._on: dict[torch.device, TransitionCounts] = {}

    def __deepcopy__(self, memo: dict) -> TransitionPrior:
        return self

    def _terms(self, history: torch.Tensor):
        """The prior's nonzero terms for ``history`` (B, T) items, most recent last (left
        padding is PAD): (batch row, item, term) (E,) each, one entry per (row, item), sorted
        by row then item. UNK's row (the successors of every rare item at once) is read as
        PAD's, empty."""
        recent = history[:, -self.recent :]
        recent = recent.masked_fill(recent < NUM_RESERVED, PAD_IDX)
        counts = self._on.get(recent.device)
        if counts is None:
            counts = self._on[recent.device] = TransitionCounts(
                *(t.to(recent.device) for t in self.counts.to_plain().values()),
                self.counts.window,
            )
        rows, items, terms = [], [], []
        for back in range(1, recent.shape[1] + 1):  # back 1: the most recent item
            batch_row, entry = row_entries(counts.row_start, recent[:, -back])
            rows.append(batch_row)
            items.append(counts.next_item[entry])
            terms.append(self.decay ** (back - 1) * torch.log1p(counts.count[entry].float()))
        row, item, term = torch.cat(rows), torch.cat(items), torch.cat(terms)
        if recent.shape[1] == 1:  # one source row per batch row: already one entry per item
            return row, item, self.weight * term
        # the same item after several recent items: one entry, the terms summed
        key, where = torch.unique(row * counts.num_items + item, return_inverse=True)
        summed = torch.zeros(len(key), device=term.device).index_add_(0, where, term)
        return key // counts.num_items, key % counts.num_items, self.weight * summed

    def add_to(self, scores: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """Shapes: scores (B, I), history (B, T) items, most recent last -> (B, I), a new
        tensor (``scores`` itself with weight 0)."""
        if not self.weight:
            return scores
        row, item, term = self._terms(history)
        boost = torch.zeros_like(scores)
        boost[row, item] = term.to(scores)
        return scores + boost

    def candidates(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: history (B, T) -> items (B, M) with a term, each once, PAD-padded (M: the
        longest row, at least 1), and their terms (B, M) (0 at padding)."""
        row, item, term = self._terms(history)
        size = torch.bincount(row, minlength=len(history))  # entries come sorted by row
        within = positions_in_runs(size)
        width = max(1, int(size.max())) if len(row) else 1
        items = torch.zeros(len(history), width, dtype=torch.long, device=history.device)
        terms = torch.zeros(len(history), width, device=history.device)
        items[row, within] = item
        terms[row, within] = term
        return items, terms

    def to_plain(self) -> dict:
        """Tensors and numbers only: safe inside a ``weights_only`` checkpoint."""
        return {**self.settings(), **self.counts.to_plain()}

    def settings(self) -> dict:
        """The numbers that say what the prior adds (an export's metadata)."""
        return {"weight": self.weight, **self.shape()}

    def shape(self) -> dict:
        """Which terms it adds, whatever their weight: ``training.transition_window``,
        ``_recent`` and ``_decay``."""
        return {"window": self.counts.window, "recent": self.recent, "decay": self.decay}

    @classmethod
    def from_plain(cls, plain: dict) -> TransitionPrior:
        """Also reads a prior saved before ``window``, ``recent`` and ``decay`` (all 1)."""
        counts = TransitionCounts.from_plain(plain, int(plain.get("window", 1)))
        return cls(counts, plain["weight"], plain.get("recent", 1), plain.get("decay", 1.0))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_prior_settings(
    *,
    window: object,
    recent: object,
    decay: object,
    weight: object = None,
    max_seq_len: int | None = None,
) -> None:
    """``training.transition_window``, ``_recent`` and ``_decay``, refused with their names;
    with ``weight``, ``training.transition_prior`` (auto or a number >= 0) too; with the
    ``max_seq_len`` of the model the prior goes with, a ``recent`` beyond the events that
    model reads (the prior takes its recent items from the model's input)."""
    if weight not in (None, "auto") and not (_is_number(weight) and 0 <= weight < math.inf):
        raise ValueError(
            f"training.transition_prior={weight!r} must be null (off), auto (the weight "
            "chosen on validation after training) or a number >= 0 (the weight)"
        )
    _check_whole("window", window)
    _check_whole("recent", recent)
    if max_seq_len is not None and recent > max_seq_len:
        raise ValueError(
            f"training.transition_recent={recent} exceeds the {max_seq_len} events the model "
            f"reads (data.max_seq_len={max_seq_len}): the prior takes its recent items from the "
            f"model's input, so at most {max_seq_len} of them count; set it to at most "
            f"{max_seq_len}"
        )
    if not _is_number(decay) or not 0 < decay <= 1:
        raise ValueError(
            f"training.transition_decay={decay!r} must be a number in (0, 1]: the weight of "
            "each older recent item relative to the one after it"
        )


def _check_whole(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"training.transition_{name}={value!r} must be a whole number >= 1")
