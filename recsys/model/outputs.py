"""Named model outputs: a changed contract fails loudly instead of silently."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch


@dataclass
class EncoderOutput:
    """What a sequence encoder returns.

    Shapes: B batch, T sequence, D model width.

    - ``hidden``: (B, T, D) encoded history; rows at padding positions are zeros.
    - ``query``: (B, D) the candidate-independent user query vector (state at the last position).
    - ``padding_mask``: (B, T) bool, True = real token (passed through for the heads).
    """

    hidden: torch.Tensor
    query: torch.Tensor
    padding_mask: torch.Tensor

    def rows(self, part: slice | torch.Tensor) -> EncoderOutput:
        """The rows ``part`` (a slice: views; or an index tensor) of every field."""
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name)[part] for f in dataclasses.fields(self)}
        )


def history_attention(probes: torch.Tensor, output: EncoderOutput) -> torch.Tensor:
    """Which history positions each probe matches: a softmax over the real positions of
    ``probe · hidden_t / sqrt(D)``. Shapes: probes (B, N, D) -> weights (B, N, T), summing to
    1 over real positions, 0 on padding (all 0 for an empty history)."""
    logits = probes @ output.hidden.transpose(1, 2) / math.sqrt(probes.shape[-1])  # (B, N, T)
    real = output.padding_mask[:, None, :]  # (B, 1, T)
    # A finite fill, not -inf: a row with no real position then gives uniform weights that
    # the multiplication zeroes, instead of NaN.
    logits = logits.masked_fill(~real, torch.finfo(logits.dtype).min)
    return logits.softmax(dim=-1) * real
