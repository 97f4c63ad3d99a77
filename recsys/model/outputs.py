"""Named model outputs: a changed contract fails loudly instead of silently."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EncoderOutput:
    """What a sequence encoder returns.

    Shapes: B batch, T sequence, D model width.

    - ``hidden``: (B, T, D) encoded history; rows at padding positions are zeros.
    - ``queries``: (B, T, D) the candidate-independent query vector at every position: the
      state there, told how long after it the prediction is made (query time gap).
    - ``query``: (B, D) the user query vector, ``queries[:, -1]`` (the most recent position).
    - ``padding_mask``: (B, T) bool, True = real token (passed through for the heads).
    """

    hidden: torch.Tensor
    queries: torch.Tensor
    query: torch.Tensor
    padding_mask: torch.Tensor
