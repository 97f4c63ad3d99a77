"""ATRank encoder (Zhou et al., AAAI 2018, arXiv 1711.06632) with a two-stage scoring head.

Architecture::

    (item, behaviour, time bucket)      left-padded, most recent event at T-1
      │  BehaviorAwareEmbedding          item ⊕ attribute bag + behaviour + time + position
      │                                  (ATRank: F_behaviour(item ⊕ attribute bag) + ...)
      │  num_layers × TransformerBlock   self-attention over the history, padding masked
      │                                  (+ attribute-bag attention scores, attribute_attention)
      ▼  (final LayerNorm when pre-norm) hidden (B, T, D); query = hidden[:, -1]

    attribute bag: mean of the item's attribute embeddings (PAD entries ignored)

    item key    item_keys:     item ⊕ attribute bag (D/2 each) at the tables' scale, or
                               F_target(item ⊕ attribute bag) with key_projection=True
    retrieval   score_items:   query · keyᵀ (+ item_bias with item_bias=True)   all I items
    re-ranking  rerank_scores: candidate key attends over hidden ("vanilla attention"),
                               retrieval score + Linear(attended) · key         N candidates

Faithful vs modern. The defaults are the modern encoder: pre-norm blocks, output projection,
4·D GELU feed-forward, sinusoidal positions, causal attention (every position is trained to
predict the next event), no item bias, and tokens that are the item features plus a learned
behaviour vector (the same features as the keys) rather than a per-behaviour projection F_g.
ATRank's reference code corresponds to::

    ATRank(..., norm_first=False, qkv_activation="relu", output_projection=False,
           ffn_multiplier=0.25, activation="relu", positional="none", causal=False,
           item_bias=True, behavior_projection=True, query_time=False)

(the reference's candidate vector is the item ⊕ category embedding itself, D/2 each, and its
logit ``item_b + u · i_emb``: no F_target, as in both presets here).

Two deliberate differences from the reference even then: the candidate attention head is one
single-head attention layer with a linear output (the reference stacks num_layers multi-head
blocks over the candidate), and every item also gets a candidate-independent user query vector
so all items can be scored at once before re-ranking.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model.embeddings import (
    POSITIONAL_ENCODINGS,
    BehaviorAwareEmbedding,
    _check_embedding_std,
)
from recsys.model.interface import candidate_scores
from recsys.model.layers import (
    FFN_ACTIVATIONS,
    POSITION_ORIGINS,
    QKV_ACTIVATIONS,
    RESERVED_WHY,
    Dropout,
    TransformerBlock,
    _check_bool,
    _check_choice,
    _check_dropout,
    _check_filter_frequencies,
    _check_filter_mix,
    _check_heads,
    _check_init_std,
    _check_int,
    _check_num_items,
    _check_optional_positive,
    _check_position_std,
    attention_mask,
    init_linear_layers,
    never_recommended,
)
from recsys.model.outputs import EncoderOutput, history_attention
from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX


class ATRank(nn.Module):
    """ATRank sequence encoder with full-catalogue scoring and target-attention re-ranking.

    Arguments (keyword only). Sizes that come from the data (``num_items``, ``num_attributes``,
    ``num_behaviors``, ``num_time_buckets``) are vocabulary sizes with PAD=0 and UNK=1 included.

    - ``item_attribute_width``: A, the number of columns of the item -> attribute-set table
      (the most attributes any item has; 1 for one category per item), fixed at construction so
      a state dict always loads. Install the table with :meth:`set_item_attributes`.
    - ``max_seq_len``: longest history window the model accepts (positional tables are this long).
    - ``d_model``: model width D; ``num_heads`` must divide it.
    - ``ffn_multiplier``: feed-forward width = round(d_model * ffn_multiplier); ATRank uses 0.25.
    - ``item_dim`` / ``attribute_dim``: widths of the item and attribute embeddings.
      Defaults: ``d_model // 2`` for attributes (far fewer than items, so a narrower table
      suffices) and, for items, what fills ``d_model`` beside the attributes (ATRank's
      reference code: D/2 each); ``d_model`` when both projections (``key_projection`` and
      ``behavior_projection``) map the features. An item's attribute vector is the mean over
      its attribute set.
    - ``positional``: "sinusoidal", "learned" or "none" (ATRank relies on time buckets only).
    - ``position_origin``: "last" (the most recent event is always the last position) or
      "first" (the window's first event is position 0); see
      :func:`recsys.model.layers.position_index`.
    - ``norm_first``: pre-norm (True) or ATRank's post-norm (False) blocks.
    - ``qkv_activation``: None or "relu" (ATRank); ``output_projection``: ATRank has none.
    - ``activation``: feed-forward activation, "gelu" or "relu" (ATRank).
    - ``causal``: position t sees only positions <= t (attention and low-pass branch), so
      every position is trained; False trains the last position only.
    - ``causal_attention``: None follows ``causal``; True with ``causal=False`` is BSARec's
      block: causal attention beside a low-pass branch over the whole window.
    - ``token_norm``: a LayerNorm over each summed token before the dropout (BSARec,
      BERT4Rec); False (the default) feeds the sum as it is.
    - ``key_projection``: keys are ``F_target(item ⊕ attribute bag)`` (True) or the features
      themselves at the tables' stored scale (False, the default and ATRank's reference; needs
      item_dim + attribute_dim == d_model). With ``attribute_dim=0`` too, the key table is the
      item embedding, as in SASRec. On Beauty F_target overfit from the 8th epoch (test
      NDCG@10 0.0396 against 0.0493 without it; benchmarks/README.md, "Model quality").
    - ``item_bias``: a learned per-item score bias (True, ATRank's reference) or none (False,
      the default: a zero buffer).
    - ``attribute_dim=0``: items only, no attribute bag in tokens or keys.
    - ``behavior_projection``: tokens are ``F_g(item ⊕ attribute bag)`` with one affine map
      per behaviour (True, ATRank) or the features plus a learned behaviour vector (False, the
      default; needs item_dim + attribute_dim == d_model). On Beauty the features themselves
      scored higher (benchmarks/README.md, "Model quality").
    - ``filter_mix`` / ``filter_frequencies``: BSARec's low-pass branch beside the attention
      in every block (``alpha`` and ``c`` in BSARec; 0.7 and 5 on Beauty), causal when the
      encoder is; 0 (the default) is attention only. See
      :class:`recsys.model.layers.LowPassFilter`.
    - ``attribute_attention``: every block adds to its attention logits a score computed
      from the tokens' attribute bags with its own query and key maps (DIF-SR's decoupled
      side-information fusion; :class:`recsys.model.layers.SideAttentionScores`), so the
      attributes steer where each position attends at every layer, beside their place in the
      tokens. False (the default) leaves the attention to the tokens. Needs attribute_dim > 0.
    - ``score_temperature``: None (the default) scores ``query · key``; τ scores the cosine
      divided by τ (CORE's robust distance, Hou et al. SIGIR 2022): the hidden states and the
      keys are L2-normalised and scaled by τ^-1/2, so every consumer of ``hidden``,
      ``query`` and :meth:`item_keys` (losses, evaluation, retrieval indexes, export) sees the
      same scores. Item biases, if any, are added as before.
    - ``query_time``: add to every token an embedding of the gap from its event to the moment
      its prediction is for (``query_time_bucket``; True, the default). ATRank's reference has
      no such input (False): its only time feature is each token's gap bucket.
    - ``embedding_std``: the std the item and attribute tables are stored at (None:
      dim^-1/2); they are used divided by it, so features start at unit scale whatever it is,
      but a smaller value makes Adam move them faster (BSARec's 0.02 learns several times
      faster per epoch on Beauty: benchmarks/README.md, "Model quality").
    - ``init_std``: None (the default) keeps PyTorch's initialisation of the linear layers;
      a std (0.02: BERT's, as the S3-Rec family's code uses) draws every linear weight from
      N(0, std) with zero biases (:func:`recsys.model.layers.init_linear_layers`).
    - ``position_std``: with ``positional="learned"``, the std the position table is stored
      at (used divided by it, like the item tables); None (the default) stores it at unit
      scale, where it learns far more slowly (see
      :class:`recsys.model.layers.LearnedPositionalEncoding`).

    ``self.config`` holds the resolved arguments as plain Python values: ``ATRank(**config)``
    rebuilds the same architecture, and it can be saved next to a ``weights_only`` checkpoint.
    A config saved before an argument existed rebuilds with
    ``{**ARGUMENTS_BEFORE_THEY_EXISTED, **config}`` (what :func:`recsys.checkpoint.load_checkpoint`
    does).
    """

    # The values the code had before these arguments existed: a checkpoint saved before them
    # has F_target keys and an item bias (before the seventh session), F_g tokens (before
    # the ninth), no low-pass branch (before the tenth) and item / attribute tables stored at
    # std dim^-1/2 (before the eleventh), attention as causal as the encoder and no token
    # LayerNorm (before the twelfth), no attribute attention scores (before the nineteenth)
    # and a query-time embedding (always, before query_time existed).
    ARGUMENTS_BEFORE_THEY_EXISTED = {
        "key_projection": True,
        "item_bias": True,
        "behavior_projection": True,
        "filter_mix": 0.0,
        "filter_frequencies": 5,
        "embedding_std": None,
        "causal_attention": None,
        "token_norm": False,
        "attribute_attention": False,
        "score_temperature": None,
        "query_time": True,
    }
    # the weights indexed by the vocabulary (recsys.model.transfer: init_from another log's
    # model); the item -> attribute lookup is this run's data
    VOCABULARY_ROWS = {
        "item_bias": "item",
        "embedding.item_embedding.weight": "item",
        "embedding.attribute_embedding.weight": "attribute",
        "embedding.item_attributes": "data",
    }

    def __init__(
        self,
        *,
        num_items: int,
        num_attributes: int,
        num_behaviors: int,
        num_time_buckets: int,
        max_seq_len: int,
        item_attribute_width: int = 1,
        d_model: int = 64,
        num_heads: int = 2,
        num_layers: int = 2,
        ffn_multiplier: float = 4.0,
        dropout: float = 0.2,
        item_dim: int | None = None,
        attribute_dim: int | None = None,
        positional: str = "sinusoidal",
        position_origin: str = "last",
        norm_first: bool = True,
        qkv_activation: str | None = None,
        output_projection: bool = True,
        activation: str = "gelu",
        causal: bool = True,
        key_projection: bool = False,
        item_bias: bool = False,
        behavior_projection: bool = False,
        filter_mix: float = 0.0,
        filter_frequencies: int = 5,
        embedding_std: float | None = None,
        causal_attention: bool | None = None,
        token_norm: bool = False,
        attribute_attention: bool = False,
        score_temperature: float | None = None,
        query_time: bool = True,
        init_std: float | None = None,
        position_std: float | None = None,
    ) -> None:
        super().__init__()
        num_items = _check_num_items(num_items)
        num_attributes = _check_int(
            "num_attributes", num_attributes, minimum=NUM_RESERVED, why=RESERVED_WHY
        )
        num_behaviors = _check_int(
            "num_behaviors", num_behaviors, minimum=NUM_RESERVED + 1, why=RESERVED_WHY
        )
        num_time_buckets = _check_int(
            "num_time_buckets", num_time_buckets, minimum=2, why="bucket 0 is PAD"
        )
        max_seq_len = _check_int("max_seq_len", max_seq_len)
        item_attribute_width = _check_int(
            "item_attribute_width",
            item_attribute_width,
            why="the most attributes any item has; shorter sets are padded with PAD",
        )
        d_model = _check_int("d_model", d_model)
        num_heads = _check_int("num_heads", num_heads)
        _check_heads(d_model, num_heads)
        num_layers = _check_int("num_layers", num_layers)
        if (
            isinstance(ffn_multiplier, bool)
            or not isinstance(ffn_multiplier, numbers.Real)
            or not math.isfinite(ffn_multiplier)
            or round(d_model * ffn_multiplier) < 1
        ):
            raise ValueError(
                f"ffn_multiplier={ffn_multiplier!r} gives a feed-forward width of "
                f"round(d_model={d_model} * ffn_multiplier) < 1: pass a positive number such "
                f"as 4.0 (modern) or 0.25 (ATRank)"
            )
        ffn_multiplier = float(ffn_multiplier)
        dropout = _check_dropout("dropout", dropout)
        key_projection = _check_bool("key_projection", key_projection)
        attribute_dim = (
            max(1, d_model // 2)
            if attribute_dim is None
            else _check_int(
                "attribute_dim", attribute_dim, minimum=0, why="0: items only, no attribute bag"
            )
        )
        behavior_projection = _check_bool("behavior_projection", behavior_projection)
        if item_dim is None and not key_projection and attribute_dim >= d_model:
            raise ValueError(
                f"attribute_dim={attribute_dim} leaves no room for the item features in "
                f"d_model={d_model} (item features ⊕ attribute bag = d_model): set attribute_dim "
                f"below {d_model}, e.g. {max(1, d_model // 2)} (the default), or 0 for items only"
            )
        if item_dim is None:  # features used as keys or as tokens fill d_model
            projected = key_projection and behavior_projection
            item_dim = d_model if projected else max(1, d_model - attribute_dim)
        item_dim = _check_int("item_dim", item_dim)
        _check_choice("positional", positional, POSITIONAL_ENCODINGS)
        _check_choice("position_origin", position_origin, POSITION_ORIGINS)
        norm_first = _check_bool("norm_first", norm_first)
        _check_choice("qkv_activation", qkv_activation, QKV_ACTIVATIONS)
        output_projection = _check_bool("output_projection", output_projection)
        _check_choice("activation", activation, FFN_ACTIVATIONS)
        causal = _check_bool("causal", causal)
        causal_attention = (
            causal
            if causal_attention is None
            else _check_bool("causal_attention", causal_attention)
        )
        if causal and not causal_attention:
            raise ValueError(
                "causal_attention=False lets position t attend to later events, so the encoder "
                "cannot be trained at every position: set causal=false as well (the last "
                "position is trained), or causal_attention=null to follow causal"
            )
        token_norm = _check_bool("token_norm", token_norm)
        attribute_attention = _check_bool("attribute_attention", attribute_attention)
        if attribute_attention and attribute_dim == 0:
            raise ValueError(
                "attribute_attention=True scores attention from the attribute bags, but "
                "attribute_dim=0 has none: set attribute_dim > 0 or attribute_attention=false"
            )
        item_bias = _check_bool("item_bias", item_bias)
        query_time = _check_bool("query_time", query_time)
        score_temperature = _check_score_temperature(score_temperature)
        filter_mix = _check_filter_mix(filter_mix)
        filter_frequencies = _check_filter_frequencies(filter_frequencies)
        embedding_std = _check_embedding_std(embedding_std)
        init_std = _check_init_std(init_std)
        position_std = _check_position_std(position_std)
        if not key_projection and item_dim + attribute_dim != d_model:
            raise ValueError(
                f"key_projection=False uses the item features as keys, so item_dim + "
                f"attribute_dim must equal d_model: got {item_dim} + {attribute_dim} != "
                f"{d_model}; set e.g. item_dim={d_model} attribute_dim=0, or "
                f"key_projection=True"
            )

        # Resolved values (item_dim/attribute_dim filled in) so a checkpoint keeps its shapes even
        # if the defaults change later.
        self.config: dict[str, int | float | str | bool | None] = {
            "num_items": num_items,
            "num_attributes": num_attributes,
            "num_behaviors": num_behaviors,
            "num_time_buckets": num_time_buckets,
            "max_seq_len": max_seq_len,
            "item_attribute_width": item_attribute_width,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_layers": num_layers,
            "ffn_multiplier": ffn_multiplier,
            "dropout": dropout,
            "item_dim": item_dim,
            "attribute_dim": attribute_dim,
            "positional": positional,
            "position_origin": position_origin,
            "norm_first": norm_first,
            "qkv_activation": qkv_activation,
            "output_projection": output_projection,
            "activation": activation,
            "causal": causal,
            "key_projection": key_projection,
            "item_bias": item_bias,
            "behavior_projection": behavior_projection,
            "filter_mix": filter_mix,
            "filter_frequencies": filter_frequencies,
            "embedding_std": embedding_std,
            "init_std": init_std,
            "position_std": position_std,
            "causal_attention": causal_attention,
            "token_norm": token_norm,
            "attribute_attention": attribute_attention,
            "score_temperature": score_temperature,
            "query_time": query_time,
        }
        self.num_items = num_items
        self.d_model = d_model
        self.causal = causal
        self.causal_attention = causal_attention
        # cosine scores: hidden states and keys on the sphere of radius τ^-1/2, so that
        # query · key = cos / τ
        self.score_scale = None if score_temperature is None else score_temperature**-0.5

        self.embedding = BehaviorAwareEmbedding(
            num_items=num_items,
            num_attributes=num_attributes,
            num_behaviors=num_behaviors,
            num_time_buckets=num_time_buckets,
            d_model=d_model,
            item_dim=item_dim,
            attribute_dim=attribute_dim,
            item_attribute_width=item_attribute_width,
            positional=positional,
            position_origin=position_origin,
            max_seq_len=max_seq_len,
            dropout=dropout,
            behavior_projection=behavior_projection,
            embedding_std=embedding_std,
            token_norm=token_norm,
            position_std=position_std,
        )
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model=d_model,
                num_heads=num_heads,
                ffn_dim=round(d_model * ffn_multiplier),
                dropout=dropout,
                norm_first=norm_first,
                qkv_activation=qkv_activation,
                output_projection=output_projection,
                activation=activation,
                filter_mix=filter_mix,
                filter_frequencies=filter_frequencies,
                max_seq_len=max_seq_len,
                causal=causal,
                side_dim=attribute_dim if attribute_attention else 0,
            )
            for _ in range(num_layers)
        )
        # DIF-SR normalises its attribute features once and hands them to every layer.
        self.side_norm = nn.LayerNorm(attribute_dim) if attribute_attention else None
        self.side_dropout = Dropout(dropout)
        # Post-norm blocks already end in a LayerNorm; a pre-norm stack needs one at the end.
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

        # F_target: candidate items are mapped into the same space as the history. Without it
        # the keys are the item features at the embedding tables' stored scale (SASRec's tied
        # table when attribute_dim=0).
        self.target_projection = (
            nn.Linear(self.embedding.feature_dim, d_model)
            if key_projection
            else _Scale(self.embedding.feature_dim**-0.5)
        )
        if item_bias:
            self.item_bias = nn.Parameter(torch.zeros(num_items))
        else:  # a zero buffer: every score path (and export) reads it like the parameter
            self.register_buffer("item_bias", torch.zeros(num_items))
        self.register_buffer("never_recommended", never_recommended(num_items), persistent=False)

        # How long after the last event the prediction is for: "continue this session" and
        # "come back next week" call for different items (ATRank measures gaps to the target).
        # (None with query_time=False: ATRank's reference has no such input.)
        self.query_time_embedding = (
            nn.Embedding(num_time_buckets, d_model, padding_idx=0) if query_time else None
        )
        self.rerank_query = nn.Linear(d_model, d_model)
        self.rerank_output = nn.Linear(d_model, d_model)
        init_linear_layers(self, init_std)
        # zero: the correction starts at 0, so an untrained head keeps the retrieval order
        # (scoring with retrieval.rerank_top_n on a checkpoint trained without the head)
        nn.init.zeros_(self.rerank_output.weight)
        nn.init.zeros_(self.rerank_output.bias)

    def set_item_attributes(self, item_attributes: torch.Tensor) -> None:
        """Install each item's attribute set; see BehaviorAwareEmbedding.set_item_attributes.

        Shapes: item_attributes (I, A) integer, PAD (0) padded; or (I,) when A == 1.
        """
        self.embedding.set_item_attributes(item_attributes)

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
        query_time_bucket: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Encode left-padded histories (the most recent event at position T-1).

        Shapes:
            item, behavior, time_bucket: (B, T) long, 0 (PAD) at padding positions.
            padding_mask: (B, T) bool, True = real token.
            query_time_bucket: (B, T) long or None, bucket of the gap from each position to the
            time its prediction is for (0 = unknown); added to the token embeddings, which is
            causal-safe: it reveals when the next event happens, never what it is. Ignored with
            ``query_time=False``.
            returns: EncoderOutput with hidden (B, T, D) (zero rows at padding positions),
            query (B, D) = hidden[:, -1],
            and padding_mask passed through.
        """
        x = self.embedding(item, behavior, time_bucket, padding_mask)  # (B, T, D)
        if query_time_bucket is not None and self.query_time_embedding is not None:
            # Told up front, the attention can pick what matters for that moment: the current
            # session's items for a gap of seconds, long-term interests for a gap of days.
            x = x + self.query_time_embedding(query_time_bucket) * padding_mask[..., None]
        mask = attention_mask(padding_mask, self.causal_attention)  # (B, 1, T, T)
        side = None
        if self.side_norm is not None:
            bags = self.embedding.attribute_bag(self.embedding.item_attributes[item])
            side = self.side_dropout(self.side_norm(bags))  # (B, T, attribute_dim)
        for block in self.blocks:
            x = block(x, mask, padding_mask, side)
        # Padding rows hold throwaway values (see TransformerBlock); zero them once here.
        hidden = self.final_norm(x)
        if self.score_scale is not None:
            hidden = F.normalize(hidden, dim=-1) * self.score_scale
        hidden = hidden.masked_fill(~padding_mask[..., None], 0.0)  # (B, T, D)
        # Left padding puts the most recent event last, whatever the history length.
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)

    def item_keys(self) -> torch.Tensor:
        """The item key table for the whole catalogue: the features ``item ⊕ attribute bag``
        at the tables' stored scale, or ``F_target`` of them with ``key_projection``.

        Shapes: returns (I, D).
        """
        return self._keys()

    def _keys(self, items: torch.Tensor | None = None) -> torch.Tensor:
        """Keys of the chosen items (None: every item), on the sphere with score_temperature.

        Shapes: items (...) long or None -> (..., D), (I, D) for None.
        """
        keys = self.target_projection(self.embedding.item_features(items))
        if self.score_scale is not None:
            keys = F.normalize(keys, dim=-1) * self.score_scale
        return keys

    def score_items(self, query: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Score every item for each query: ``query · keys + item_bias``.

        PAD and UNK columns are -inf: they are never recommended, and cross-entropy stays finite
        because targets are never PAD or UNK. Pass ``keys=self.item_keys()`` computed once when
        scoring users in chunks.

        Shapes:
            query: (..., D); keys: (I, D) or None.
            returns: (..., I).
        """
        if keys is None:
            keys = self.item_keys()
        return query @ keys.T + (self.item_bias + self.never_recommended)  # (..., I)

    @property
    def predicts_attributes(self) -> bool:
        """Whether :meth:`score_attributes` applies: the keys end with the attribute bag (and
        are not normalised, which would mix the item part into the attribute scores)."""
        return (
            not self.config["key_projection"]
            and self.embedding.attribute_dim > 0
            and self.score_scale is None
        )

    def score_attributes(self, query: torch.Tensor) -> torch.Tensor:
        """Score every attribute for each query with the attribute part of the query: an item's
        key ends with the mean of its attribute vectors, so ``query · key`` is the item part's
        score plus the mean of these attribute scores (the auxiliary ``attribute_softmax`` loss
        trains them directly).

        Shapes: query (..., D) -> (..., num_attributes); PAD and UNK columns are -inf.
        """
        embedding = self.embedding
        if not self.predicts_attributes:
            raise ValueError(
                "attribute scores need keys that end with the attribute bag: set "
                "model.key_projection=false, model.attribute_dim > 0 and "
                "model.score_temperature=null (or drop "
                "training.attribute_loss_weight)"
            )
        # the attribute vectors as they enter the keys (stored scale, then the keys' factor)
        table = self.target_projection(
            embedding.attribute_embedding.weight * embedding.attribute_scale
        )  # (N, attribute_dim)
        scores = query[..., -embedding.attribute_dim :] @ table.T  # (..., N)
        reserved = torch.arange(NUM_RESERVED, device=scores.device)  # PAD, UNK
        return scores.index_fill(-1, reserved, -math.inf)

    def item_attribute_sets(self, items: torch.Tensor) -> torch.Tensor:
        """Shapes: items (...) long -> (..., A) attribute indices, PAD padded."""
        return self.embedding.item_attributes[items]

    def score_candidates(self, query: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Retrieval scores ``query · key + bias`` of chosen items only (sampled losses, sampled
        metrics), without building the whole key table.

        Shapes: query (M, D); items (M, K) per-row candidates, or (K,) shared by every row.
        Returns (M, K); PAD and UNK candidates are -inf.
        """
        keys = self._keys(items)  # (..., K, D)
        return candidate_scores(query, keys, items, bias=self.item_bias)

    def rerank_scores(
        self,
        output: EncoderOutput,
        candidates: torch.Tensor,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Score candidates by target attention over the history (ATRank's vanilla attention).

        Each candidate's key ``k_c`` (its row of :meth:`item_keys`) attends over
        ``output.hidden`` (single head, scaled dot product, padding positions excluded); the
        attended vector goes through a linear layer to give the candidate-specific user vector
        ``u_c``, and ``score = item_bias[c] + (query + u_c) · k_c``: the retrieval score plus a
        candidate-specific correction, which is all the head has to learn. Candidates are
        scored independently of each other; PAD/UNK candidates (e.g. padding in a ragged
        candidate list) get -inf.

        Shapes:
            output.hidden: (B, T, D); output.padding_mask: (B, T) bool, True = real token.
            candidates: (B, N) long item indices.
            returns: scores (B, N); with ``return_attention`` also the attention weights
            (B, N, T), which sum to 1 over real positions and are 0 on padding (all 0 for an
            empty history).
        """
        keys = self._keys(candidates)  # (B, N, D)
        weights = history_attention(self.rerank_query(keys), output)  # (B, N, T)
        user = self.rerank_output(weights @ output.hidden)  # (B, N, D)
        user = user + output.query[:, None, :]  # (B, N, D)
        scores = (user * keys).sum(dim=-1) + self.item_bias[candidates]  # (B, N)
        reserved = (candidates == PAD_IDX) | (candidates == UNK_IDX)
        scores = scores.masked_fill(reserved, float("-inf"))
        if return_attention:
            return scores, weights
        return scores

    def explanation_weights(self, output: EncoderOutput, candidates: torch.Tensor) -> torch.Tensor:
        """Which history positions each candidate's score leans on (B, N, T), for scoring's
        ``explain_*`` columns: the target-attention weights once that head is trained (with
        ``training.rerank_top_n`` or the target-attention objective); before, its weights
        change no score (its output layer starts at zero), so the candidate key's match with
        each history state is shown instead, as for SASRec."""
        if self.rerank_head_trained():
            return self.rerank_scores(output, candidates, return_attention=True)[1]
        return history_attention(self._keys(candidates), output)

    def rerank_head_trained(self) -> bool:
        """Whether the target-attention head was trained: its output layer starts at zero and
        stays there unless a re-rank loss trains it (``training.rerank_top_n > 0``, the
        target-attention objective); until then :meth:`rerank_scores` equals retrieval."""
        return any(bool(p.any()) for p in self.rerank_output.parameters())


def _check_score_temperature(value: object) -> float | None:
    """``score_temperature``: None (dot-product scores) or τ > 0 (cosine / τ)."""
    return _check_optional_positive(
        "score_temperature",
        value,
        maximum=10.0,
        hint="pass null for dot-product scores or a temperature in (0, 10] for cosine scores "
        "divided by it (CORE's 0.07)",
    )


class _Scale(nn.Module):
    """Multiply by a constant (the keys without F_target)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor
