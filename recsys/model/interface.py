"""The encoder interface: what training, evaluation, scoring, checkpoints and the export call
on an encoder, listed once and checked when a model is built, plus the scoring side shared by
the encoders whose item keys are their input item table (SASRec, GRU4Rec).

An encoder is a plain ``nn.Module`` under :mod:`recsys.model` (checkpoints load classes from
there only) whose constructor takes keyword arguments; ``conf/model/<name>.yaml`` names it with
``_target_``. The data sizes are injected at build time (``recsys.tasks.train._encoder``):
``num_items`` and ``max_seq_len`` always, ``num_attributes``, ``item_attribute_width``,
``num_behaviors`` and ``num_time_buckets`` only to a constructor that takes them (by name or
``**kwargs``). An encoder whose ``config`` holds ``num_time_buckets`` is taken to read time
buckets (:func:`reads_time_buckets`: ``data.time_buckets.reference=target`` is then refused
with causal training, and a model trained on an order-only log refuses a timed scoring log).

Inputs are left-padded: the most recent event at position T-1, PAD (0) and ``padding_mask``
False before the first real event. :func:`check_encoder` names whatever of
:data:`ENCODER_INTERFACE` an encoder lacks.
"""

from __future__ import annotations

import torch

from recsys.model.embeddings import _init_table
from recsys.model.layers import never_recommended
from recsys.model.outputs import EncoderOutput, history_attention
from recsys.schema import NUM_RESERVED, PAD_IDX

# name -> what it is and who needs it
ENCODER_INTERFACE: dict[str, str] = {
    "num_items": "int attribute: catalogue size I, PAD and UNK included (training, metrics)",
    "config": "dict attribute: the constructor's keyword arguments, num_items and max_seq_len "
    "included; a checkpoint rebuilds the encoder as cls(**config)",
    "forward": "forward(item, behavior, time_bucket, padding_mask, query_time_bucket) -> "
    "EncoderOutput, inputs (B, T) passed positionally; an encoder may ignore all but item "
    "and padding_mask",
    "item_keys": "item_keys() -> (I, D): the key table (scoring's index, the export)",
    "score_items": "score_items(query (..., D), keys=None) -> (..., I) = query @ keys.T + bias, "
    "-inf for PAD and UNK",
    "score_candidates": "score_candidates(query (M, D), items (M, K) or (K,)) -> (M, K): "
    "score_items at those items, -inf for PAD and UNK (sampled losses)",
    "rerank_scores": "rerank_scores(output, candidates (B, N), return_attention=False) -> "
    "(B, N): stage 2 (the retrieval scores for an encoder without a re-rank head)",
    "explanation_weights": "explanation_weights(output, candidates (B, N)) -> (B, N, T): "
    "weights over history positions (scoring's explain_* columns)",
}

# optional members, read with getattr where they are used
OPTIONAL_MEMBERS: dict[str, str] = {
    "causal": "attribute, True when absent: position t reads nothing after t, so every "
    "position is trained; False trains the last position only",
    "set_item_attributes": "set_item_attributes(table (I, A) long): the item -> attribute "
    "table, given once after the encoder is built for training",
    "predicts_attributes": "with score_attributes and item_attribute_sets: "
    "training.attribute_loss_weight > 0",
    "rerank_head_trained": "rerank_head_trained() -> bool: the export warns that a trained "
    "re-rank head is not exported",
    "ARGUMENTS_BEFORE_THEY_EXISTED": "class dict: values of constructor arguments added after "
    "checkpoints were written",
    "VOCABULARY_ROWS": "class dict: state-dict key -> 'item', 'attribute' or 'data' for "
    "the tables indexed by the vocabulary (recsys.model.transfer), so that init_from may name "
    "a model of another log; without it only a model of the same vocabulary",
}


def reads_time_buckets(encoder: torch.nn.Module) -> bool:
    """Whether ``encoder`` reads its inputs' time buckets: its ``config`` holds
    ``num_time_buckets`` (ATRank does; SASRec and GRU4Rec take none and ignore them)."""
    return "num_time_buckets" in dict(getattr(encoder, "config", None) or {})


def check_encoder(encoder: torch.nn.Module) -> None:
    """Raise TypeError naming every member of :data:`ENCODER_INTERFACE` that ``encoder``
    lacks, a ``config`` without the data sizes, or ``score_items`` that does not score PAD
    and UNK -inf (they would be recommended). Cheap: one zero query against the key table."""
    name = type(encoder).__name__
    missing = [member for member in ENCODER_INTERFACE if not hasattr(encoder, member)]
    if missing:
        listed = "; ".join(f"{member}: {ENCODER_INTERFACE[member]}" for member in missing)
        raise TypeError(
            f"{name} lacks the encoder interface's {', '.join(missing)} ({listed}); see "
            "recsys.model.interface and the README's 'Adding an encoder'"
        )
    config = encoder.config
    absent = [key for key in ("num_items", "max_seq_len") if key not in dict(config or {})]
    if not isinstance(config, dict) or absent:
        raise TypeError(
            f"{name}.config must be a dict of its constructor's keyword arguments, holding "
            f"num_items and max_seq_len (lacks {absent or 'a dict'}): checkpoints rebuild the "
            "encoder from it"
        )
    with torch.no_grad():
        keys = encoder.item_keys()
        scores = encoder.score_items(keys.new_zeros(1, keys.shape[-1]))
    if tuple(scores.shape) != (1, encoder.num_items):
        raise TypeError(
            f"{name}.score_items returned shape {tuple(scores.shape)} for one query: it must "
            f"return (..., num_items) = (1, {encoder.num_items})"
        )
    if not torch.isneginf(scores[0, :NUM_RESERVED]).all():
        raise TypeError(
            f"{name}.score_items must score PAD (0) and UNK (1) -inf, or they are ranked and "
            "recommended: add recsys.model.layers.never_recommended(num_items) to the scores"
        )


def candidate_scores(
    query: torch.Tensor, keys: torch.Tensor, items: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Shapes: query (M, D); items (M, K) with keys (M, K, D), or items (K,) with keys (K, D)
    shared by every row -> scores (M, K), -inf for PAD/UNK candidates."""
    if items.dim() == 1:
        scores = query @ keys.T  # (M, K)
        items = items.expand(query.shape[0], -1)
    else:
        scores = torch.bmm(keys, query[:, :, None]).squeeze(-1)  # (M, K)
    if bias is not None:
        scores = scores + bias[items]
    return scores.masked_fill(items < NUM_RESERVED, float("-inf"))


class TiedItemScores:
    """The scoring side of an encoder whose keys are its input item table, without a re-rank
    head (SASRec, GRU4Rec): mix it in before ``nn.Module`` and call :meth:`_init_item_table`
    in ``__init__``. ``score = query · key``; ``rerank_scores`` is the retrieval score, so a
    two-stage ranking keeps the retrieval order."""

    VOCABULARY_ROWS = {"item_embedding.weight": "item"}  # see recsys.model.transfer

    def _init_item_table(self, num_items: int, d_model: int, embedding_std: float | None) -> None:
        """``item_embedding`` (I, D) stored at std ``embedding_std`` (None: D^-1/2) and used
        divided by it (``item_scale``: unit-scale inputs), its keys at std D^-1/2
        (``key_scale``) so initial logits are O(1); ``never_recommended``; ``num_items``.
        (nn.Embedding's N(0, 1) keys start the softmax at logits of ~sqrt(D) spread and
        train far slower; see recsys.model.embeddings.BehaviorAwareEmbedding.)"""
        self.num_items = num_items
        self.item_embedding = torch.nn.Embedding(num_items, d_model, padding_idx=PAD_IDX)
        self.item_scale = _init_table(self.item_embedding, embedding_std)
        self.key_scale = self.item_scale * d_model**-0.5
        self.register_buffer("never_recommended", never_recommended(num_items), persistent=False)

    def item_keys(self) -> torch.Tensor:
        """Shapes: returns (I, D), the input embedding table (at std D^-1/2 when built)."""
        return self.item_embedding.weight * self.key_scale

    def item_keys_of(self, items: torch.Tensor) -> torch.Tensor:
        """Shapes: items (...) long -> (..., D), those items' rows of :meth:`item_keys`."""
        return self.item_embedding(items) * self.key_scale

    def score_items(self, query: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: query (..., D) -> (..., I); PAD and UNK are -inf."""
        keys = self.item_keys() if keys is None else keys
        return query @ keys.T + self.never_recommended

    def score_candidates(self, query: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Scores of chosen items: query (M, D), items (M, K) or (K,) -> (M, K), -inf for
        PAD/UNK candidates."""
        return candidate_scores(query, self.item_keys_of(items), items, bias=None)

    def rerank_scores(
        self, output: EncoderOutput, candidates: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """No target attention: the candidates' retrieval scores (B, N). With
        ``return_attention``, also :meth:`explanation_weights` (which does not change the
        score)."""
        scores = self.score_candidates(output.query, candidates)
        if not return_attention:
            return scores
        return scores, self.explanation_weights(output, candidates)

    def explanation_weights(self, output: EncoderOutput, candidates: torch.Tensor) -> torch.Tensor:
        """Which history positions each candidate matches (B, N, T): a softmax over real
        positions of ``key_c · hidden_t / sqrt(D)`` (scoring's ``explain_*`` columns)."""
        return history_attention(self.item_keys_of(candidates), output)
