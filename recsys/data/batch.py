"""The one batch type that flows from the data layer into every model."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class SeqBatch:
    """A batch of left-padded token sequences (the most recent event sits at position T-1).

    Shapes: B batch, T sequence length.

    - ``item``, ``behavior``, ``time_bucket``: (B, T) long; 0 (PAD) at padding positions.
    - ``padding_mask``: (B, T) bool, **True = a real token**.
    - ``query_time_bucket``: (B, T) long, the time-gap bucket from each position's event to the
      moment its prediction is for, i.e. to the next event; at the last position that is the
      target's time in evaluation and ``as_of`` in scoring (0 = unknown).
    - ``target_item``: (B, T) for training (the item of the next event at every position,
      0 where there is none) or (B,) for evaluation/scoring (one target per row, 0 = unknown).
    - ``target_behavior``: same shape as ``target_item``.
    - ``user_index``: (B,) long, the row of each sequence in the prepared user table.
    - ``seen_item``: (B, H) long or None: in evaluation batches, every item of the user's
      history before the target (left-aligned, 0 = PAD), not only the T the model reads: what
      the seen-item policy sets aside. None elsewhere (the policy then takes ``item``).

    Example (T=4, one user with events a, b, c; training row)::

        item          = [0, a, b, c][:-1] shifted -> [0, 0, a, b]
        target_item   = [0, 0, b, c]
        padding_mask  = [F, F, T, T]
    """

    item: torch.Tensor
    behavior: torch.Tensor
    time_bucket: torch.Tensor
    padding_mask: torch.Tensor
    query_time_bucket: torch.Tensor
    target_item: torch.Tensor
    target_behavior: torch.Tensor
    user_index: torch.Tensor
    seen_item: torch.Tensor | None = None

    @property
    def seen(self) -> torch.Tensor:
        """The items the seen-item policy applies to: ``seen_item``, else the input window."""
        return self.item if self.seen_item is None else self.seen_item

    def model_inputs(self) -> tuple[torch.Tensor, ...]:
        """The encoder's positional arguments, in order."""
        return self.item, self.behavior, self.time_bucket, self.padding_mask, self.query_time_bucket

    def _map(self, fn) -> SeqBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return SeqBatch(**{k: None if v is None else fn(v) for k, v in values.items()})

    def rows(self, part: slice | torch.Tensor) -> SeqBatch:
        """The rows ``part`` (a slice: views; or an index tensor) of every field."""
        return self._map(lambda t: t[part])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SeqBatch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> SeqBatch:
        return self._map(lambda t: t.pin_memory())

    def __len__(self) -> int:
        return self.item.shape[0]
