"""ATRank's behaviour-aware token embedding.

A token is (item, category, behaviour, time-gap bucket, position). Item and category vectors
are concatenated and projected into the shared D-dimensional space by a projection *per
behaviour* (ATRank's F_g), so a view and a purchase of the same item start out different;
the time-bucket embedding and the positional encoding are then added.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from recsys.model.layers import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    _check_choice,
    _check_dropout,
    _check_int,
)
from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX

POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "none")


class BehaviorAwareEmbedding(nn.Module):
    """Token embedding: ``F_behaviour(item ⊕ category[item]) + time_bucket + position``.

    Categories are not an input: each item's category is looked up in the ``item_category``
    buffer (filled by :meth:`set_item_categories`, saved in the state dict), so a token's
    category always equals its item's category, at training and at scoring time. Until it is
    set every real item has the UNK category.

    Index 0 is PAD in every vocabulary; the padding rows of the item, category and time-bucket
    tables are zero and never trained, and output rows at padding positions are zero.
    """

    def __init__(
        self,
        *,
        num_items: int,
        num_categories: int,
        num_behaviors: int,
        num_time_buckets: int,
        d_model: int,
        item_dim: int,
        category_dim: int,
        positional: str = "sinusoidal",
        max_seq_len: int,
        dropout: float,
    ) -> None:
        super().__init__()
        reserved = "indices 0 (PAD) and 1 (UNK) are reserved; pass the vocabulary size"
        self.num_items = _check_int("num_items", num_items, minimum=NUM_RESERVED + 1, why=reserved)
        self.num_categories = _check_int(
            "num_categories", num_categories, minimum=NUM_RESERVED, why=reserved
        )
        self.num_behaviors = _check_int(
            "num_behaviors", num_behaviors, minimum=NUM_RESERVED + 1, why=reserved
        )
        num_time_buckets = _check_int(
            "num_time_buckets", num_time_buckets, minimum=2, why="bucket 0 is PAD"
        )
        self.d_model = _check_int("d_model", d_model)
        item_dim = _check_int("item_dim", item_dim)
        category_dim = _check_int("category_dim", category_dim)
        _check_choice("positional", positional, POSITIONAL_ENCODINGS)
        max_seq_len = _check_int("max_seq_len", max_seq_len)
        self.feature_dim = item_dim + category_dim

        self.item_embedding = nn.Embedding(self.num_items, item_dim, padding_idx=PAD_IDX)
        self.category_embedding = nn.Embedding(
            self.num_categories, category_dim, padding_idx=PAD_IDX
        )
        item_category = torch.full((self.num_items,), UNK_IDX, dtype=torch.long)
        item_category[PAD_IDX] = PAD_IDX
        self.register_buffer("item_category", item_category)

        # F_g: one (feature_dim -> D) affine map per behaviour, stored as stacked tensors so a
        # batch is projected without a Python loop over behaviours or tokens.
        self.behavior_weight = nn.Parameter(
            torch.empty(self.num_behaviors, self.feature_dim, self.d_model)
        )
        self.behavior_bias = nn.Parameter(torch.empty(self.num_behaviors, self.d_model))
        bound = 1.0 / math.sqrt(self.feature_dim)  # nn.Linear's default init, per behaviour
        nn.init.uniform_(self.behavior_weight, -bound, bound)
        nn.init.uniform_(self.behavior_bias, -bound, bound)

        self.time_embedding = nn.Embedding(num_time_buckets, self.d_model, padding_idx=PAD_IDX)
        self.positional: nn.Module | None
        if positional == "sinusoidal":
            self.positional = SinusoidalPositionalEncoding(
                max_seq_len=max_seq_len, d_model=self.d_model
            )
        elif positional == "learned":
            self.positional = LearnedPositionalEncoding(
                max_seq_len=max_seq_len, d_model=self.d_model
            )
        else:
            self.positional = None
        self.dropout = nn.Dropout(_check_dropout("dropout", dropout))

    @torch.no_grad()
    def set_item_categories(self, item_category: torch.Tensor) -> None:
        """Install each item's category index (an item-vocab-aligned table from the data layer).

        ``item_category[i]`` is the category index of item ``i``; row 0 (the PAD item) should be
        PAD. Raises ValueError when the shape or a value does not fit the vocabularies.

        Shapes: item_category (I,) integer.
        """
        item_category = torch.as_tensor(item_category)
        if item_category.shape != (self.num_items,):
            raise ValueError(
                f"item_category has shape {tuple(item_category.shape)}, expected "
                f"({self.num_items},): one category index per item of the item vocabulary "
                f"(num_items={self.num_items}, PAD and UNK included)"
            )
        if item_category.dtype.is_floating_point or item_category.dtype == torch.bool:
            raise ValueError(
                f"item_category has dtype {item_category.dtype}: pass integer category indices"
            )
        low, high = int(item_category.min()), int(item_category.max())
        if low < 0 or high >= self.num_categories:
            raise ValueError(
                f"item_category holds indices in [{low}, {high}] but num_categories="
                f"{self.num_categories}: values must lie in [0, {self.num_categories - 1}]; "
                f"build the model with the category vocabulary the table was made with"
            )
        self.item_category.copy_(item_category.to(self.item_category.device))

    def item_features(self, items: torch.Tensor | None = None) -> torch.Tensor:
        """``item_embedding ⊕ category_embedding[item_category[item]]`` (before any projection).

        Shapes:
            items: (...) long item indices, or None for the whole catalogue.
            returns: (..., item_dim + category_dim), or (I, item_dim + category_dim) for None.
        """
        if items is None:
            item_vectors = self.item_embedding.weight  # (I, item_dim)
            categories = self.item_category  # (I,)
        else:
            item_vectors = self.item_embedding(items)  # (..., item_dim)
            categories = self.item_category[items]  # (...)
        return torch.cat([item_vectors, self.category_embedding(categories)], dim=-1)

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Embed a batch of left-padded token sequences.

        Shapes:
            item, behavior, time_bucket: (B, T) long.
            padding_mask: (B, T) bool, True = real token.
            returns: (B, T, D), zero rows at padding positions.
        """
        features = self.item_features(item)  # (B, T, F)
        # Projecting with every behaviour's F_g and keeping the token's own costs G times one
        # projection, which is cheap for the handful of behaviours a funnel has and, unlike
        # indexing the weight per token, never materialises a (B, T, F, D) tensor.
        every_projection = torch.einsum("btf,gfd->btgd", features, self.behavior_weight)
        own = behavior[..., None, None]  # (B, T, 1, 1): index into the G axis
        x = torch.take_along_dim(every_projection, own, dim=2)  # (B, T, 1, D)
        x = x.squeeze(2)  # (B, T, D)
        x = x + self.behavior_bias[behavior] + self.time_embedding(time_bucket)
        if self.positional is not None:
            x = x + self.positional(item.shape[1])  # (T, D) broadcast over B
        x = self.dropout(x)
        return x.masked_fill(~padding_mask[..., None], 0.0)
