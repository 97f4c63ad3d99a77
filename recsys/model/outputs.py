"""Named model outputs: a changed contract fails loudly instead of silently."""

from __future__ import annotations

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
