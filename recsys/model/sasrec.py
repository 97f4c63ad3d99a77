"""SASRec (Kang & McAuley, ICDM 2018, arXiv 1808.09781): the item-only baseline.

Architecture (the reference code, pmixer/SASRec.pytorch)::

    item embedding / s + learned position            left-padded, most recent event at T-1
                                                     (s: the table's stored std, embedding_std)
      │  dropout, num_layers × pre-norm TransformerBlock (causal), final LayerNorm
      ▼  hidden (B, T, D); query = hidden[:, -1]
    score(item) = hidden · key[item]        key = the input table, rescaled to std D^-1/2 at init

Behaviours, attributes and time gaps are ignored: SASRec sees item ids only, which is what
makes it the baseline ATRank's side information is measured against. The loss decides between
the original (``bce``, one negative per position) and SASRec+ (``full_softmax``, Klenitskiy &
Vasilev 2023); see :mod:`recsys.training.losses`.

The interface is :data:`recsys.model.interface.ENCODER_INTERFACE`, so the training module,
evaluation and scoring take any encoder. The scoring side is
:class:`recsys.model.interface.TiedItemScores` (shared with GRU4Rec): no target-attention head,
``rerank_scores`` is the retrieval score, so a two-stage ranking keeps the retrieval order.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.model.embeddings import _check_embedding_std
from recsys.model.interface import TiedItemScores
from recsys.model.layers import (
    Dropout,
    LearnedPositionalEncoding,
    TransformerBlock,
    _check_dropout,
    _check_filter_frequencies,
    _check_filter_mix,
    _check_heads,
    _check_init_std,
    _check_int,
    _check_num_items,
    _check_position_std,
    attention_mask,
    init_linear_layers,
)
from recsys.model.outputs import EncoderOutput
from recsys.schema import PAD_IDX


class SASRec(TiedItemScores, nn.Module):
    """Self-attentive sequential recommendation over item ids.

    Data sizes (``num_items`` with PAD/UNK, ``max_seq_len``) come from the data; the other
    vocabulary sizes ATRank takes (``num_attributes``, ``num_behaviors``, ``num_time_buckets``,
    ``item_attribute_width``) are accepted and ignored so both encoders are built the same way.
    ``filter_mix`` / ``filter_frequencies`` add BSARec's low-pass branch beside the attention
    (its alpha and c; 0, the default, is SASRec): see :class:`recsys.model.layers.LowPassFilter`.
    ``embedding_std`` is the std the item table is stored at (None: D^-1/2); it is used divided
    by it, so only how fast Adam moves it changes (see :class:`ATRank`). ``init_std`` draws the
    linear weights from N(0, std) with zero biases (None: PyTorch's defaults; see
    :class:`ATRank`). ``position_std`` stores the position table at that std (see
    :class:`recsys.model.layers.LearnedPositionalEncoding`).
    """

    causal = True

    def __init__(
        self,
        *,
        num_items: int,
        max_seq_len: int,
        d_model: int = 64,
        num_heads: int = 2,
        num_layers: int = 2,
        dropout: float = 0.2,
        position_origin: str = "last",
        filter_mix: float = 0.0,
        filter_frequencies: int = 5,
        embedding_std: float | None = None,
        init_std: float | None = None,
        position_std: float | None = None,
        num_attributes: int | None = None,
        num_behaviors: int | None = None,
        num_time_buckets: int | None = None,
        item_attribute_width: int | None = None,
    ) -> None:
        super().__init__()
        num_items = _check_num_items(num_items)
        max_seq_len = _check_int("max_seq_len", max_seq_len)
        d_model = _check_int("d_model", d_model)
        num_heads = _check_int("num_heads", num_heads)
        _check_heads(d_model, num_heads)
        num_layers = _check_int("num_layers", num_layers)
        dropout = _check_dropout("dropout", dropout)
        filter_mix = _check_filter_mix(filter_mix)
        filter_frequencies = _check_filter_frequencies(filter_frequencies)
        embedding_std = _check_embedding_std(embedding_std)
        init_std = _check_init_std(init_std)
        position_std = _check_position_std(position_std)
        self.config: dict[str, int | float | None] = {
            "num_items": num_items,
            "max_seq_len": max_seq_len,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_layers": num_layers,
            "dropout": dropout,
            "position_origin": position_origin,
            "filter_mix": filter_mix,
            "filter_frequencies": filter_frequencies,
            "embedding_std": embedding_std,
            "init_std": init_std,
            "position_std": position_std,
        }
        self.d_model = d_model
        # the item table (stored at embedding_std, used at unit scale) and its keys
        self._init_item_table(num_items, d_model, embedding_std)
        self.position = LearnedPositionalEncoding(
            max_seq_len=max_seq_len, d_model=d_model, origin=position_origin, std=position_std
        )
        self.dropout = Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model=d_model,
                num_heads=num_heads,
                ffn_dim=d_model,  # the reference code's point-wise FFN keeps width D
                dropout=dropout,
                norm_first=True,
                activation="relu",
                filter_mix=filter_mix,
                filter_frequencies=filter_frequencies,
                max_seq_len=max_seq_len,
            )
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        init_linear_layers(self, init_std)

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor | None = None,
        time_bucket: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        query_time_bucket: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Shapes: item (B, T) long (0 = PAD); padding_mask (B, T) bool, True = real token
        (default: ``item != PAD``). Behaviour and time inputs are ignored.
        Returns hidden (B, T, D) with zero padding rows and query (B, D) = hidden[:, -1]."""
        if padding_mask is None:
            padding_mask = item != PAD_IDX
        x = self.item_embedding(item) * self.item_scale
        x = self.dropout(x + self.position(padding_mask))
        x = x.masked_fill(~padding_mask[..., None], 0.0)
        mask = attention_mask(padding_mask, causal=True)
        for block in self.blocks:
            x = block(x, mask, padding_mask)
        hidden = self.final_norm(x).masked_fill(~padding_mask[..., None], 0.0)
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)
