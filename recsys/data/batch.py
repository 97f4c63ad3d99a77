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

    def model_inputs(self) -> tuple[torch.Tensor, ...]:
        """The encoder's positional arguments, in order."""
        return self.item, self.behavior, self.time_bucket, self.padding_mask, self.query_time_bucket

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SeqBatch:
        return SeqBatch(
            **{
                f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                for f in fields(self)
            }
        )

    def pin_memory(self) -> SeqBatch:
        return SeqBatch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})

    def __len__(self) -> int:
        return self.item.shape[0]
