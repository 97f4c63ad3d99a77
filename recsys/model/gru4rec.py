"""GRU4Rec (Hidasi et al., ICLR 2016, arXiv 1511.06939): the recurrent session baseline, in
its modern full-softmax form (RecBole's ``GRU4Rec``)::

    item embedding / s                               left-padded, most recent event at T-1
      │  dropout, num_layers × GRU (hidden_size, no biases), Linear to d_model
      ▼  hidden (B, T, D); query = hidden[:, -1]
    score(item) = hidden · key[item]        key = the input table, rescaled to std D^-1/2 at init

Item ids only, like SASRec; the loss is chosen in ``training`` (``full_softmax`` by default,
over the whole catalogue as RecBole trains it). A GRU reads left to right, so position t sees
nothing after t and every position is trained at once.

Padding: the GRU has no bias terms (as RecBole's), so a zero input from the zero initial
state leaves the state at exactly zero: the left padding of a window (its inputs zeroed by
``padding_mask``) does not change any real position's state. That holds for *left* padding
only, which is what every batch in recsys is; a hole inside a window would decay the state.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.model.embeddings import _check_embedding_std
from recsys.model.interface import TiedItemScores
from recsys.model.layers import Dropout, _check_dropout, _check_int, _check_num_items
from recsys.model.outputs import EncoderOutput
from recsys.schema import PAD_IDX


class GRU4Rec(TiedItemScores, nn.Module):
    """Recurrent sequential recommendation over item ids.

    ``num_items`` (with PAD/UNK) and ``max_seq_len`` come from the data (the GRU reads any
    length; ``max_seq_len`` is kept for checkpoints and the export). ``hidden_size`` is the
    GRU's width (None: 2 × d_model, RecBole's 128 for 64); a linear layer maps it back to
    ``d_model``, the width of the item keys. ``embedding_std`` is the std the item table is
    stored at (None: D^-1/2; see :class:`recsys.model.interface.TiedItemScores`).
    """

    causal = True

    def __init__(
        self,
        *,
        num_items: int,
        max_seq_len: int,
        d_model: int = 64,
        hidden_size: int | None = None,
        num_layers: int = 1,
        dropout: float = 0.3,
        embedding_std: float | None = None,
    ) -> None:
        super().__init__()
        num_items = _check_num_items(num_items)
        max_seq_len = _check_int("max_seq_len", max_seq_len)
        d_model = _check_int("d_model", d_model)
        if hidden_size is not None:
            hidden_size = _check_int("hidden_size", hidden_size)
        num_layers = _check_int("num_layers", num_layers)
        dropout = _check_dropout("dropout", dropout)
        embedding_std = _check_embedding_std(embedding_std)
        self.config: dict[str, int | float | None] = {
            "num_items": num_items,
            "max_seq_len": max_seq_len,
            "d_model": d_model,
            "hidden_size": hidden_size,
            "num_layers": num_layers,
            "dropout": dropout,
            "embedding_std": embedding_std,
        }
        self.d_model = d_model
        self._init_item_table(num_items, d_model, embedding_std)
        self.dropout = Dropout(dropout)
        width = 2 * d_model if hidden_size is None else hidden_size
        self.gru = nn.GRU(d_model, width, num_layers, bias=False, batch_first=True)
        self.dense = nn.Linear(width, d_model)

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor | None = None,
        time_bucket: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        query_time_bucket: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Shapes: item (B, T) long, left-padded (0 = PAD); padding_mask (B, T) bool, True =
        real token (default: ``item != PAD``). Behaviour and time inputs are ignored.
        Returns hidden (B, T, D) with zero padding rows and query (B, D) = hidden[:, -1]."""
        if padding_mask is None:
            padding_mask = item != PAD_IDX
        real = padding_mask[..., None]
        x = self.dropout(self.item_embedding(item) * self.item_scale).masked_fill(~real, 0.0)
        states, _ = self.gru(x)  # (B, T, hidden_size); zero through the left padding
        hidden = self.dense(states).masked_fill(~real, 0.0)
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)
