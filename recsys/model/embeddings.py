"""ATRank's behaviour-aware token embedding.

A token is (item, behaviour, time-gap bucket, position); the item also brings its *attribute
set* (category-path nodes, brand, ...: a Taobao item has one category, an Amazon item up to a
few dozen attributes). The item vector and the mean of its attribute vectors (the "attribute
bag") are concatenated and projected into the shared D-dimensional space by a projection *per
behaviour* (ATRank's F_g), so a view and a purchase of the same item start out different; the
time-bucket embedding and the positional encoding are then added.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model.layers import (
    RESERVED_WHY,
    Dropout,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    _check_bool,
    _check_choice,
    _check_int,
    _check_num_items,
    _check_optional_positive,
)
from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX

POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "none")


def _check_embedding_std(value: object) -> float | None:
    """``embedding_std``: None, or the positive std at which embedding tables are stored."""
    return _check_optional_positive(
        "embedding_std",
        value,
        maximum=1.0,
        hint="pass the std the embedding tables are stored at, in (0, 1] (0.02: BSARec's; "
        "smaller learns faster), or null for dim^-1/2",
    )


def _init_table(table: nn.Embedding, std: float | None) -> float:
    """Draw a table at std ``std`` (None: dim^-1/2), zero its PAD row, and return the factor
    that brings its entries to unit scale (1 / std)."""
    std = max(1, table.embedding_dim) ** -0.5 if std is None else std
    nn.init.normal_(table.weight, std=std)
    with torch.no_grad():
        table.weight[PAD_IDX].zero_()
    return 1.0 / std


class BehaviorAwareEmbedding(nn.Module):
    """Token embedding: ``F_behaviour(item ⊕ attribute_bag[item]) + time_bucket + position``.

    ``behavior_projection=False`` replaces ATRank's per-behaviour affine map F_g by the features
    themselves plus a learned behaviour vector (``item ⊕ attribute_bag + b_behaviour``, the
    type-embedding form of BERT-style multi-behaviour models); the features must then be
    ``d_model`` wide.

    Attributes are not an input: each item's attribute set is looked up in the
    ``item_attributes`` buffer (filled by :meth:`set_item_attributes`, saved in the state dict),
    so a token's attributes always equal its item's, at training and at scoring time. The table
    has a fixed width ``item_attribute_width`` (A), chosen at construction so that a state dict
    always loads into a model built from the same config; shorter sets are padded with PAD (0).
    Until it is set every real item has the attribute set {UNK}.

    An item's attribute vector is the mean of ``attribute_embedding`` over its non-PAD entries;
    an item with no attributes (an all-PAD row) gets a zero vector. With A = 1 this is exactly a
    single-category lookup.

    Index 0 is PAD in every vocabulary; the padding rows of the item, attribute and time-bucket
    tables are zero and never trained, and output rows at padding positions are zero.

    Shapes:
        I items (``num_items``), A attributes per item (``item_attribute_width``),
        B batch, T time steps, F = item_dim + attribute_dim, D = d_model.
        item_attributes buffer: (I, A) long.
    """

    def __init__(
        self,
        *,
        num_items: int,
        num_attributes: int,
        num_behaviors: int,
        num_time_buckets: int,
        d_model: int,
        item_dim: int,
        attribute_dim: int,
        item_attribute_width: int = 1,
        positional: str = "sinusoidal",
        position_origin: str = "last",
        max_seq_len: int,
        dropout: float,
        behavior_projection: bool = True,
        embedding_std: float | None = None,
        token_norm: bool = False,
        position_std: float | None = None,
    ) -> None:
        super().__init__()
        self.num_items = _check_num_items(num_items)
        self.num_attributes = _check_int(
            "num_attributes", num_attributes, minimum=NUM_RESERVED, why=RESERVED_WHY
        )
        self.num_behaviors = _check_int(
            "num_behaviors", num_behaviors, minimum=NUM_RESERVED + 1, why=RESERVED_WHY
        )
        num_time_buckets = _check_int(
            "num_time_buckets", num_time_buckets, minimum=2, why="bucket 0 is PAD"
        )
        self.d_model = _check_int("d_model", d_model)
        item_dim = _check_int("item_dim", item_dim)
        self.attribute_dim = _check_int(
            "attribute_dim", attribute_dim, minimum=0, why="0: items only, no attribute bag"
        )
        self.item_attribute_width = _check_int(
            "item_attribute_width",
            item_attribute_width,
            why="the most attributes any item has; shorter sets are padded with PAD",
        )
        _check_choice("positional", positional, POSITIONAL_ENCODINGS)
        max_seq_len = _check_int("max_seq_len", max_seq_len)
        self.feature_dim = item_dim + self.attribute_dim
        self.behavior_projection = _check_bool("behavior_projection", behavior_projection)
        if not self.behavior_projection and self.feature_dim != self.d_model:
            raise ValueError(
                f"behavior_projection=False adds a behaviour vector to the item features "
                f"themselves, so item_dim + attribute_dim must equal d_model: got {item_dim} + "
                f"{self.attribute_dim} != {self.d_model}; set item_dim and attribute_dim to fill "
                f"d_model, or behavior_projection=True"
            )

        self.item_embedding = nn.Embedding(self.num_items, item_dim, padding_idx=PAD_IDX)
        # attribute_dim 0: an (A, 0) table, so the bag is an empty vector and the state dict
        # keeps its keys (an ablation, e.g. model.attribute_dim=0, loads like any checkpoint)
        self.attribute_embedding = nn.Embedding(
            self.num_attributes, self.attribute_dim, padding_idx=PAD_IDX
        )
        # Stored at std s and used divided by s: unit-scale features whatever s is, but
        # Adam's steps (~lr per stored entry whatever its scale) move a feature by ~lr / s, so
        # s sets how fast the tables learn relative to the rest of the network. None: s =
        # dim^-1/2 (the previous default); BSARec's 0.02 learns far faster (benchmarks/README,
        # "Model quality": "Embedding scale").
        self.embedding_std = _check_embedding_std(embedding_std)
        self.item_scale = _init_table(self.item_embedding, self.embedding_std)
        self.attribute_scale = _init_table(self.attribute_embedding, self.embedding_std)
        item_attributes = torch.full(
            (self.num_items, self.item_attribute_width), PAD_IDX, dtype=torch.long
        )  # (I, A)
        item_attributes[:, 0] = UNK_IDX  # every real item: {UNK} until set
        item_attributes[PAD_IDX] = PAD_IDX  # the PAD item: no attributes
        self.register_buffer("item_attributes", item_attributes)

        # F_g: one (feature_dim -> D) affine map per behaviour, stored as stacked tensors so a
        # batch is projected without a Python loop over behaviours or tokens. Without it only
        # the bias is kept: a behaviour vector added to the features.
        bound = 1.0 / math.sqrt(self.feature_dim)  # nn.Linear's default init, per behaviour
        self.behavior_weight: nn.Parameter | None = None
        if self.behavior_projection:
            self.behavior_weight = nn.Parameter(
                torch.empty(self.num_behaviors, self.feature_dim, self.d_model)
            )
            nn.init.uniform_(self.behavior_weight, -bound, bound)
        self.behavior_bias = nn.Parameter(torch.empty(self.num_behaviors, self.d_model))
        nn.init.uniform_(self.behavior_bias, -bound, bound)

        self.time_embedding = nn.Embedding(num_time_buckets, self.d_model, padding_idx=PAD_IDX)
        self.positional: nn.Module | None
        if positional == "sinusoidal":
            self.positional = SinusoidalPositionalEncoding(
                max_seq_len=max_seq_len, d_model=self.d_model, origin=position_origin
            )
        elif positional == "learned":
            self.positional = LearnedPositionalEncoding(
                max_seq_len=max_seq_len,
                d_model=self.d_model,
                origin=position_origin,
                std=position_std,
            )
        else:
            self.positional = None
        # BSARec / BERT4Rec: LayerNorm over the summed token (features + behaviour + time +
        # position) before the dropout; None keeps the sum as it is.
        self.token_norm = (
            nn.LayerNorm(self.d_model) if _check_bool("token_norm", token_norm) else None
        )
        self.dropout = Dropout(dropout)

    @torch.no_grad()
    def set_item_attributes(self, item_attributes: torch.Tensor) -> None:
        """Install each item's attribute set (an item-vocab-aligned table from the data layer).

        ``item_attributes[i]`` lists the attribute indices of item ``i``, padded with PAD (0) to
        the table width; row 0 (the PAD item) should be all PAD. A 1-D table (one attribute per
        item) is accepted when ``item_attribute_width == 1``. Raises ValueError when the shape,
        the dtype or a value does not fit the model.

        Shapes:
            item_attributes: (I, A) integer, or (I,) when A == 1.
        """
        table = torch.as_tensor(item_attributes)
        width = self.item_attribute_width
        expected = (self.num_items, width)
        if table.dim() == 1 and width == 1:
            table = table[:, None]  # (I,) -> (I, 1)
        if table.shape != expected:
            got = tuple(table.shape)
            if table.dim() == 2 and got[0] == self.num_items:
                fix = f"build the model with item_attribute_width={got[1]}"
            else:
                fix = (
                    f"pass one row per item of the item vocabulary (num_items={self.num_items}, "
                    f"PAD and UNK included), padded with PAD ({PAD_IDX}) to "
                    f"item_attribute_width={width} columns, or build the model with "
                    f"item_attribute_width=<A> for a table of A columns"
                )
            raise ValueError(
                f"item_attributes has shape {got}, expected {expected} "
                f"(num_items, item_attribute_width): {fix}"
            )
        if table.dtype.is_floating_point or table.dtype.is_complex or table.dtype == torch.bool:
            raise ValueError(
                f"item_attributes has dtype {table.dtype}: pass integer attribute indices "
                f"(e.g. torch.long)"
            )
        low, high = int(table.min()), int(table.max())
        if low < 0 or high >= self.num_attributes:
            raise ValueError(
                f"item_attributes holds indices in [{low}, {high}] but num_attributes="
                f"{self.num_attributes}: values must lie in [0, {self.num_attributes - 1}] "
                f"(PAD={PAD_IDX} pads short sets); build the model with the attribute "
                f"vocabulary the table was made with"
            )
        self.item_attributes.copy_(table.to(self.item_attributes.device))

    def attribute_bag(self, attributes: torch.Tensor) -> torch.Tensor:
        """Mean attribute vector of each attribute set, ignoring PAD entries.

        An all-PAD set gives a zero vector. ``F.embedding_bag`` computes the same
        ``sum / count.clamp(min=1)`` as embedding the (..., A) indices and averaging over the
        non-PAD ones, without materialising the (..., A, attribute_dim) tensor, which matters
        for the whole catalogue (I * A vectors) that retrieval scores at every step.

        Shapes:
            attributes: (..., A) long attribute indices, PAD (0) = no attribute.
            returns: (..., attribute_dim).
        """
        flat = attributes.reshape(-1, attributes.shape[-1])  # (N, A), N = prod(...)
        bag = F.embedding_bag(
            flat, self.attribute_embedding.weight, mode="mean", padding_idx=PAD_IDX
        )  # (N, attribute_dim); PAD entries excluded from both the sum and the count
        return bag.reshape(*attributes.shape[:-1], self.attribute_dim)  # (..., attribute_dim)

    def item_features(self, items: torch.Tensor | None = None) -> torch.Tensor:
        """``item_embedding ⊕ attribute_bag(item_attributes[item])`` (before any projection).

        Shapes:
            items: (...) long item indices, e.g. (B, T), or None for the whole catalogue.
            returns: (..., item_dim + attribute_dim), or (I, item_dim + attribute_dim) for None.
        """
        if items is None:
            item_vectors = self.item_embedding.weight  # (I, item_dim)
            attributes = self.item_attributes  # (I, A)
        else:
            item_vectors = self.item_embedding(items)  # (..., item_dim)
            attributes = self.item_attributes[items]  # (..., A)
        return torch.cat(
            [
                item_vectors * self.item_scale,
                self.attribute_bag(attributes) * self.attribute_scale,
            ],
            dim=-1,
        )

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
        x = self.item_features(item)  # (B, T, F)
        if self.behavior_weight is not None:
            # Projecting with every behaviour's F_g and keeping the token's own costs G times
            # one projection, which is cheap for the handful of behaviours a funnel has and,
            # unlike indexing the weight per token, never materialises a (B, T, F, D) tensor.
            every_projection = torch.einsum("btf,gfd->btgd", x, self.behavior_weight)
            own = behavior[..., None, None]  # (B, T, 1, 1): index into the G axis
            x = torch.take_along_dim(every_projection, own, dim=2).squeeze(2)  # (B, T, D)
        x = x + self.behavior_bias[behavior] + self.time_embedding(time_bucket)
        if self.positional is not None:
            x = x + self.positional(padding_mask)  # (T, D) or (B, T, D)
        if self.token_norm is not None:
            x = self.token_norm(x)
        x = self.dropout(x)
        return x.masked_fill(~padding_mask[..., None], 0.0)
