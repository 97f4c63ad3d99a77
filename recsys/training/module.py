"""The LightningModule: losses, metric logging and optimiser wiring — the model math lives in
:mod:`recsys.model`, the losses in :mod:`recsys.training.losses`, the ranking in
:mod:`recsys.retrieval`.

Training objective (``objective``):

- ``retrieval`` (default): every position at once (causal encoders; a non-causal one trains its
  last position only) scores its next item with ``query · key + bias``, with any loss of
  :mod:`recsys.training.losses`: ``full_softmax`` over the whole catalogue, or
  ``sampled_softmax`` / ``bce`` / ``gbce`` against ``num_negatives`` sampled items. With
  ``rerank_top_n > 1`` a re-rank loss trains the target-attention head on the last position:
  a softmax over the true next item and the retrieval stage's top ``rerank_top_n - 1`` others.
  With ``attribute_loss_weight > 0`` (encoders with an attribute bag in their keys: ATRank) the
  trained positions also predict their target item's attributes (``attribute_softmax``).
  With ``input_mask_prob > 0`` each real input token's item is replaced by UNK with that
  probability in training (CL4SRec's item mask, used as augmentation alone); targets,
  behaviours and evaluation are untouched. With ``contrastive_weight > 0`` the encoder runs a
  second time on the batch (another dropout draw) and ``info_nce`` pulls each trained
  position's two states together against the batch's other positions (DuoRec's unsupervised
  augmentation; positions with the same target item are not negatives). With
  ``contrastive_positive="same_target"`` the second state is instead that of another training
  row with the same target item, which the data module adds to every batch (DuoRec's
  supervised positive; ``data.loader.train_samples=prefixes``), and the encoder runs once.
  With ``distillation`` ({teachers, weight, temperature}; full softmax only) each trained
  position also learns the distribution that trained models of the same catalogue (the
  teachers, in evaluation mode, their log-probabilities averaged and renormalised) give its
  next item (``losses.distillation``, Hinton et al.'s knowledge distillation; an ensemble
  of runs distilled into one model of the same size).
  With ``exclude_seen_from_loss`` (full softmax only) the items of the input at or before each
  trained position are left out of its softmax (:func:`earlier_items`): they are never pushed
  down as negatives, as evaluation with ``seen_items`` exclude or zero never ranks them.
- ``target_attention`` (ATRank's reference code): the last position's next item and
  ``num_negatives`` sampled items are scored by the target-attention head (candidate as the
  query over the history); a sampled loss, typically ``bce`` with one negative.

``behavior_weights`` ({behaviour name: weight}) weighs each target by its behaviour (0 drops
it): "predict the next purchase from views, carts and purchases" is ``{purchase: 1}``.

Evaluation ranks the whole catalogue; ``seen_items`` says what happens to the items of the
input history: ``keep``, ``exclude`` (score -inf: never ranked) or ``zero`` (score 0: the S3-Rec
family's code, P1). ``sampled_metrics`` adds HR/NDCG against N sampled negatives and ATRank's
AUC, for comparison with papers that used only those. A validation or test target whose item
never occurs in training cannot be ranked (preparation sets it aside): ``unknown_targets="skip"``
averages over the targets that remain, ``"miss"`` counts the set-aside ones as misses (0 in
every per-target metric; coverage is unaffected), as code with every item in its vocabulary
does (the S3-Rec family's, P1). ``target_shares``
(:func:`recsys.training.metrics.known_target_shares` of the data's ``stats.json``) says how
many there are.

Metric names are stable and MLflow-safe: ``train/loss``, ``val/ndcg_at_10``,
``val/retrieval_hr_at_10``, ``test/mrr``, ``val/coverage_at_10``, ``test/sampled_ndcg_at_10``,
``test/auc`` (``retrieval_`` = stage 1 alone, exact full rank; unprefixed = the two-stage ranking
that users get; ``sampled_`` and ``auc`` use the retrieval scores).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from recsys import code_version
from recsys.allocation import cpu_chunk_length, table_chunk_length
from recsys.checkpoint import CHECKPOINT_KEY, encoder_target
from recsys.checkpoint import FORMAT_VERSION as CHECKPOINT_FORMAT
from recsys.data.batch import SeqBatch
from recsys.model.layers import _check_dropout
from recsys.model.transition import TransitionCounts, TransitionPrior, check_prior_settings
from recsys.retrieval.ranker import (
    SEEN_POLICIES,
    apply_seen_policy,
    exclude_items,
    seen_mask,
    two_stage,
)
from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX
from recsys.training import losses
from recsys.training.metrics import (
    UNKNOWN_TARGET_POLICIES,
    CoverageAccumulator,
    rank_in_list,
    ranking_metrics,
    sampled_ranks,
    target_ranks,
)

OBJECTIVES = ("retrieval", "target_attention")
CONTRASTIVE_POSITIVES = ("dropout", "same_target")
MIN_LOGIT_CHUNK_ROWS = 256  # a huge catalogue: few chunks rather than one per handful of rows
MIN_EVAL_CHUNK_ROWS = 16  # evaluation's chunks of rows: at least this many, however wide
# the parts of SeqRecModule.step_memory, as a message names them
PARAMETERS = "parameters, gradients and optimiser state"
KEPT_SCORES = "scores over the catalogue kept for the backward pass"
SCORE_CHUNK = "the chunk of them being made, and its gradient"
RERANK_SCORES = "the re-rank loss's scores over the catalogue"
CONTRASTIVE_SCORES = "the contrastive loss's scores of every trained position against every one"
STEP_PARTS = (PARAMETERS, KEPT_SCORES, SCORE_CHUNK, RERANK_SCORES, CONTRASTIVE_SCORES)


def same_target_partners(contrastive_weight: object, contrastive_positive: object) -> bool:
    """Whether training batches must carry same-target partner rows (the data module's
    ``partners``): the contrastive loss is on and takes them as positives."""
    _choice("training.contrastive_positive", contrastive_positive, CONTRASTIVE_POSITIVES)
    weight = _check_weight("contrastive_weight", contrastive_weight)
    return weight > 0 and contrastive_positive == "same_target"


class SeqRecModule(pl.LightningModule):
    """Wraps an encoder with the encoder interface (:mod:`recsys.model.interface`: ATRank,
    SASRec, GRU4Rec).

    ``optimizer`` / ``scheduler`` are partials (Hydra ``_partial_: true``) called with the
    parameters / optimizer. ``behaviors`` (behaviour names by vocabulary index, from index 2)
    and ``item_counts`` (training count per item index) come from the data; the popularity
    sampler and ``behavior_weights`` need them. ``checkpoint_extra`` (vocabulary, schema,
    time buckets, ...) is stored in every checkpoint under ``"recsys"`` with the encoder's
    class and arguments.
    """

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer] | None,
        scheduler: Callable[..., Any] | None = None,
        *,
        loss: str = "full_softmax",
        num_negatives: int = 256,
        negative_sampler: str = "uniform",
        shared_negatives: bool = True,
        gbce_t: float = 0.75,
        label_smoothing: float = 0.0,
        exclude_seen_from_loss: bool = False,
        objective: str = "retrieval",
        behavior_weights: Mapping[str, float] | None = None,
        behaviors: Sequence[str] = (),
        item_counts: torch.Tensor | None = None,
        metric_ks: Sequence[int] = (5, 10, 20),
        rerank_top_n: int = 0,
        rerank_loss_weight: float = 0.5,
        attribute_loss_weight: float = 0.0,
        input_mask_prob: float = 0.0,
        contrastive_weight: float = 0.0,
        contrastive_temperature: float = 1.0,
        contrastive_positive: str = "dropout",
        distillation: Mapping[str, Any] | None = None,
        seen_items: str = "keep",
        sampled_metrics: Mapping[str, Any] | None = None,
        unknown_targets: str = "skip",
        target_shares: Mapping[str, float] | None = None,
        transition_prior: float | str | None = None,
        transition_window: int = 3,
        transition_recent: int = 3,
        transition_decay: float = 0.75,
        transition_counts: TransitionCounts | None = None,
        checkpoint_extra: dict | None = None,
    ):
        super().__init__()
        _check_optimizer(optimizer)
        _choice("training.loss", loss, losses.LOSSES)
        _choice("training.objective", objective, OBJECTIVES)
        _choice("training.seen_items", seen_items, SEEN_POLICIES)
        _choice("training.unknown_targets", unknown_targets, UNKNOWN_TARGET_POLICIES)
        if unknown_targets == "miss" and target_shares is None:
            raise ValueError(
                "training.unknown_targets=miss needs target_shares, the share of each split's "
                "targets that can be ranked (recsys.training.metrics.known_target_shares of the "
                "prepared data's stats.json): pass it, or use unknown_targets=skip"
            )
        if objective == "target_attention" and loss == "full_softmax":
            raise ValueError(
                "training.objective=target_attention scores candidates one by one, so it needs "
                f"a sampled loss: set training.loss to one of {list(losses.SAMPLED_LOSSES)} "
                "(ATRank's is bce)"
            )
        if (
            isinstance(rerank_top_n, bool)
            or not isinstance(rerank_top_n, int)
            or not isinstance(rerank_loss_weight, (int, float))
            or rerank_top_n < 0
            or not 0 <= rerank_loss_weight < math.inf
        ):
            raise ValueError(
                f"training.rerank_top_n={rerank_top_n!r} and rerank_loss_weight="
                f"{rerank_loss_weight!r} must be >= 0 (a whole number and a finite number)"
            )
        attribute_loss_weight = _check_weight("attribute_loss_weight", attribute_loss_weight)
        contrastive_weight = _check_weight("contrastive_weight", contrastive_weight)
        _choice("training.contrastive_positive", contrastive_positive, CONTRASTIVE_POSITIVES)
        if (
            isinstance(contrastive_temperature, bool)
            or not isinstance(contrastive_temperature, (int, float))
            or not 0 < contrastive_temperature < math.inf
        ):
            raise ValueError(
                f"training.contrastive_temperature={contrastive_temperature!r} must be a number "
                "> 0 (DuoRec: 1.0)"
            )
        if contrastive_weight > 0 and objective != "retrieval":
            raise ValueError(
                "training.contrastive_weight > 0 contrasts the positions the retrieval objective "
                f"trains: it needs objective=retrieval (got {objective!r}), or set it to 0"
            )
        if attribute_loss_weight > 0 and (
            objective != "retrieval" or not getattr(encoder, "predicts_attributes", False)
        ):
            raise ValueError(
                "training.attribute_loss_weight > 0 trains the retrieval query to predict the "
                f"target's attributes: it needs objective=retrieval (got {objective!r}) and an "
                f"encoder whose keys end with an attribute bag (got {type(encoder).__name__}; "
                "use model=atrank with model.attribute_dim > 0, model.key_projection=false and "
                "model.score_temperature=null), "
                "or set it to 0"
            )
        input_mask_prob = _check_dropout("training.input_mask_prob", input_mask_prob)
        label_smoothing = _check_dropout("training.label_smoothing", label_smoothing)
        if label_smoothing and (loss != "full_softmax" or objective != "retrieval"):
            raise ValueError(
                f"training.label_smoothing={label_smoothing} smooths the full-softmax target: it "
                f"needs training.loss=full_softmax and objective=retrieval (got {loss!r}, "
                f"{objective!r}), or set it to 0"
            )
        if not isinstance(shared_negatives, bool):
            raise ValueError(
                f"training.shared_negatives={shared_negatives!r} must be true or false"
            )
        if not isinstance(exclude_seen_from_loss, bool):
            raise ValueError(
                f"training.exclude_seen_from_loss={exclude_seen_from_loss!r} must be true or false"
            )
        if exclude_seen_from_loss and (loss != "full_softmax" or objective != "retrieval"):
            raise ValueError(
                "training.exclude_seen_from_loss=true leaves each trained position's earlier "
                "input items out of the full softmax: it needs training.loss=full_softmax and "
                f"objective=retrieval (got {loss!r}, {objective!r}), or set it to false"
            )
        if (
            isinstance(metric_ks, (str, int))
            or not metric_ks
            or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in metric_ks)
        ):
            raise ValueError(
                f"training.metric_ks={metric_ks!r} must be a list of positive whole cutoffs, "
                "e.g. [5, 10, 20]"
            )
        if rerank_top_n and max(metric_ks) > rerank_top_n:
            raise ValueError(
                f"max(metric_ks)={max(metric_ks)} exceeds rerank_top_n={rerank_top_n}: "
                "metrics of the two-stage ranking need the cutoff inside the re-ranked list"
            )
        num_items = encoder.num_items
        real_items = num_items - NUM_RESERVED
        prior = _transition_prior(
            transition_prior,
            transition_counts,
            num_items,
            rerank_top_n,
            window=transition_window,
            recent=transition_recent,
            decay=transition_decay,
            max_seq_len=dict(getattr(encoder, "config", None) or {}).get("max_seq_len"),
        )
        teachers, distill_weight, distill_temperature = _distillation_settings(
            distillation, num_items
        )
        if getattr(encoder, "causal", True) and not all(
            getattr(t, "causal", True) for t in teachers
        ):
            raise ValueError(
                "training.distillation: a non-causal teacher (model.causal=false) reads the "
                "whole window, so at every position but the last its distribution would know "
                "the next item, which this causal model trains on: distil it into a non-causal "
                "model (model.causal=false, the last position trained), or use causal teachers"
            )
        if teachers and (loss != "full_softmax" or objective != "retrieval"):
            raise ValueError(
                "training.distillation matches the teachers' softmax over the catalogue: it "
                f"needs training.loss=full_softmax and objective=retrieval (got {loss!r}, "
                f"{objective!r}), or set it to null"
            )
        sampled = loss != "full_softmax" or objective == "target_attention"
        if sampled and (
            not isinstance(num_negatives, int) or not 1 <= num_negatives <= real_items - 1
        ):
            raise ValueError(
                f"training.num_negatives={num_negatives!r} must be an integer in "
                f"[1, {real_items - 1}] for this catalogue of {real_items} items"
            )
        self.encoder = encoder
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.loss_name = loss
        self.num_negatives = num_negatives
        self.shared_negatives = bool(shared_negatives)
        self.objective = objective
        self.label_smoothing = label_smoothing
        self.exclude_seen_from_loss = exclude_seen_from_loss
        self.gbce_beta = (
            losses.gbce_beta(num_negatives=num_negatives, num_items=real_items, t=gbce_t)
            if loss == "gbce"
            else 1.0
        )
        self.sampler = losses.NegativeSampler(num_items, negative_sampler, item_counts)
        self.behavior_weight = _behavior_weights(behavior_weights, behaviors)
        self.metric_ks = tuple(int(k) for k in metric_ks)
        self.rerank_top_n = rerank_top_n
        self.rerank_loss_weight = rerank_loss_weight
        self.attribute_loss_weight = attribute_loss_weight
        self.input_mask_prob = input_mask_prob
        self.contrastive_weight = contrastive_weight
        self.contrastive_temperature = float(contrastive_temperature)
        self.partners = same_target_partners(contrastive_weight, contrastive_positive)
        # a plain list, so the teachers are neither trained, averaged nor saved with the model;
        # shared, not copied, by a deepcopy of the module (weight averaging's AveragedModel)
        self._teachers: list[nn.Module] = _Teachers(
            t.eval().requires_grad_(False) for t in teachers
        )
        self.distill_weight = distill_weight
        self.distill_temperature = distill_temperature
        self.seen_items = seen_items
        self.transition_prior = prior
        self.sampled = _sampled_settings(sampled_metrics, num_items, item_counts)
        # per split, the factor that turns means over the ranked targets into means over all
        self.metric_scale = (
            {split: float(share) for split, share in target_shares.items()}
            if unknown_targets == "miss"
            else {}
        )
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self._coverage: dict[str, CoverageAccumulator] = {}
        self.save_hyperparameters(
            {
                "loss": loss,
                "num_negatives": num_negatives,
                "negative_sampler": negative_sampler,
                "shared_negatives": shared_negatives,
                "gbce_t": gbce_t,
                "label_smoothing": label_smoothing,
                "exclude_seen_from_loss": exclude_seen_from_loss,
                "objective": objective,
                "behavior_weights": dict(behavior_weights or {}),
                "metric_ks": list(self.metric_ks),
                "rerank_top_n": rerank_top_n,
                "rerank_loss_weight": rerank_loss_weight,
                "attribute_loss_weight": attribute_loss_weight,
                "input_mask_prob": input_mask_prob,
                "contrastive_weight": contrastive_weight,
                "contrastive_temperature": contrastive_temperature,
                "contrastive_positive": contrastive_positive,
                "distillation": (
                    {
                        "teachers": len(teachers),
                        "weight": distill_weight,
                        "temperature": distill_temperature,
                    }
                    if teachers
                    else None
                ),
                "seen_items": seen_items,
                "sampled_metrics": dict(sampled_metrics or {}),
                "unknown_targets": unknown_targets,
                "transition_prior": transition_prior,
                "transition_window": transition_window,
                "transition_recent": transition_recent,
                "transition_decay": transition_decay,
            }
        )

    def forward(self, batch: SeqBatch):
        return self.encoder(*batch.model_inputs())

    # -- training ---------------------------------------------------------------------------
    def _target_weight(self, behavior: torch.Tensor) -> torch.Tensor | None:
        if self.behavior_weight is None:
            return None
        return self.behavior_weight.to(behavior.device)[behavior]

    def _sampled_loss(
        self,
        positive: torch.Tensor,
        negatives: torch.Tensor,
        target: torch.Tensor,
        negative_items: torch.Tensor,
        weight: torch.Tensor | None,
    ) -> torch.Tensor:
        """Shapes: positive (M,), negatives (M, K) scores of negative_items (M, K) or (K,)."""
        return losses.SAMPLED_LOSSES[self.loss_name](
            positive,
            negatives,
            target=target,
            negative_items=negative_items,
            accidental=negative_items.expand_as(negatives) == target[:, None],
            weight=weight,
            log_q=self.sampler.log_q,
            beta=self.gbce_beta,
        )

    def _draw_negatives(self, rows: int) -> torch.Tensor:
        shape = (self.num_negatives,) if self.shared_negatives else (rows, self.num_negatives)
        return self.sampler.sample(shape, device=self.device)

    def _trained_positions(self, batch: SeqBatch) -> torch.Tensor:
        """(B, T) bool: the positions whose next item the retrieval objective trains."""
        has_target = batch.target_item > UNK_IDX  # (B, T); UNK targets cannot be learned
        if not getattr(self.encoder, "causal", True):
            # a non-causal encoder sees position t+1 from position t: only the last position's
            # target is unseen by every input
            has_target = has_target & (
                torch.arange(has_target.shape[1], device=self.device) == has_target.shape[1] - 1
            )
        if self.behavior_weight is not None:  # weight 0: not a target of this objective
            has_target = has_target & (self._target_weight(batch.target_behavior) > 0)
        return has_target

    def _retrieval_loss(
        self, output, batch: SeqBatch, has_target: torch.Tensor, seen: SeqBatch
    ) -> torch.Tensor:
        """``seen``: the batch whose input items ``exclude_seen_from_loss`` leaves out (the
        batch before ``input_mask_prob`` masked it: a masked item is still the user's)."""
        weight = self._target_weight(batch.target_behavior[has_target])
        hidden = output.hidden[has_target]  # (M, D)
        target = batch.target_item[has_target]  # (M,)
        if self.loss_name == "full_softmax":
            history = earlier_items(seen, has_target) if self.exclude_seen_from_loss else None
            return losses.weighted_mean(self._full_softmax_rows(hidden, target, history), weight)
        negative_items = self._draw_negatives(len(target))
        positive = self.encoder.score_candidates(hidden, target[:, None])[:, 0]
        negatives = self.encoder.score_candidates(hidden, negative_items)
        return self._sampled_loss(positive, negatives, target, negative_items, weight)

    def _full_softmax_rows(
        self, hidden: torch.Tensor, target: torch.Tensor, history: torch.Tensor | None
    ) -> torch.Tensor:
        """Each trained position's cross-entropy over the catalogue (``history``: items left
        out of its softmax, or None). Shapes: hidden (M, D), target (M,), history (M, T) -> (M,).

        On a CPU, logits of 32 MiB or more are made and freed in chunks of rows
        (:func:`recsys.allocation.cpu_chunk_length`: glibc maps such blocks afresh from the
        kernel at every step); chunks give the same losses up to float rounding."""
        chunks = self._logit_chunks(len(target), hidden.device)
        keys = self.encoder.item_keys() if len(chunks) > 1 else None  # once for every chunk
        parts = []
        for part in chunks:
            logits = self.encoder.score_items(hidden[part], keys=keys)  # (chunk, I)
            if history is not None:
                logits = exclude_items(logits, history[part])
            parts.append(losses.full_softmax_rows(logits, target[part], self.label_smoothing))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _logit_chunks(self, rows: int, device: torch.device) -> list[slice]:
        """The row chunks in which a training loss makes its (rows x items) logits: one on an
        accelerator or under 32 MiB, else 16 MiB of rows (at least ``MIN_LOGIT_CHUNK_ROWS``;
        :func:`recsys.allocation.cpu_chunk_length`)."""
        rows = max(rows, 1)
        size = cpu_chunk_length(
            rows, 4 * self.encoder.num_items, device, minimum=MIN_LOGIT_CHUNK_ROWS
        )
        return [slice(start, start + size) for start in range(0, rows, size)]

    def step_memory(self, rows: int, positions: int, device: torch.device) -> dict[str, int]:
        """What one training step of ``rows`` rows that train ``positions`` positions holds at
        once on ``device`` at least, in bytes by part (:data:`STEP_PARTS`), beyond the
        encoder's activations: the parameters with their gradients (and Adam's or AdamW's two
        moments), and the tables as wide as the catalogue. The full softmax keeps each
        position's float32 log-probabilities over every item for the backward pass (label
        smoothing a second table, distillation the student's at τ and the teachers'
        probabilities: two more), while the chunk of rows being made (:meth:`_logit_chunks`:
        every row on an accelerator) has its scores and then their gradient beside them; the
        re-rank loss scores every row's last position against the whole catalogue (twice: the
        scores and their copy without the target). Sampled losses make no such table. The
        contrastive loss (``contrastive_weight > 0``) scores the 2M views of its M trained
        positions against each other and keeps that float32 table and its boolean mask of
        excluded pairs: it grows with the batch, not the catalogue."""
        parameters = sum(p.numel() * p.element_size() for p in self.parameters())
        moments = getattr(self.optimizer_factory, "func", None) in (
            torch.optim.Adam,
            torch.optim.AdamW,
        )
        parts = {PARAMETERS: parameters * (4 if moments else 2)}
        row = 4 * self.encoder.num_items  # one float32 score per item
        if self.loss_name == "full_softmax" and self.objective == "retrieval":
            tables = 1 + (self.label_smoothing > 0) + 2 * bool(self._teachers)
            parts[KEPT_SCORES] = tables * positions * row
            parts[SCORE_CHUNK] = 2 * self._logit_chunks(positions, device)[0].stop * row
        if self.rerank_top_n > 1 and self.rerank_loss_weight > 0:
            parts[RERANK_SCORES] = 2 * rows * row
        if self.contrastive_weight > 0:  # (with partners: the rows' last positions only)
            parts[CONTRASTIVE_SCORES] = (4 + 1) * (2 * positions) ** 2
        return parts

    def _attribute_loss(self, output, batch: SeqBatch, has_target: torch.Tensor) -> torch.Tensor:
        target = batch.target_item[has_target]  # (M,)
        return losses.attribute_softmax(
            self.encoder.score_attributes(output.hidden[has_target]),
            self.encoder.item_attribute_sets(target),
            self._target_weight(batch.target_behavior[has_target]),
        )

    def _target_attention_loss(self, output, batch: SeqBatch) -> torch.Tensor:
        target = batch.target_item[:, -1]  # (B,) the next item after the most recent event
        behavior = batch.target_behavior[:, -1]
        valid = target > UNK_IDX
        if self.behavior_weight is not None:
            valid = valid & (self._target_weight(behavior) > 0)
        # (K,) one set for the batch with shared_negatives, else (B, K): as the retrieval losses
        negative_items = self._draw_negatives(len(target))
        per_row = negative_items.expand(len(target), -1)  # (B, K)
        candidates = torch.cat([target[:, None], per_row], dim=1)  # (B, 1 + K)
        scores = self.encoder.rerank_scores(output, candidates)[valid]
        return self._sampled_loss(
            scores[:, 0],
            scores[:, 1:],
            target[valid],
            negative_items if self.shared_negatives else negative_items[valid],
            self._target_weight(behavior[valid]),
        )

    def _mask_inputs(self, batch: SeqBatch) -> SeqBatch:
        """The batch with each real input item replaced by UNK with ``input_mask_prob``."""
        drawn = torch.rand(batch.item.shape, device=batch.item.device) < self.input_mask_prob
        return dataclasses.replace(
            batch, item=batch.item.masked_fill(drawn & batch.padding_mask, UNK_IDX)
        )

    def training_step(self, batch: SeqBatch, batch_idx: int) -> torch.Tensor:
        unmasked = batch  # what the teachers read: input masking augments the student only
        if self.input_mask_prob > 0:
            batch = self._mask_inputs(batch)
        output = self(batch)
        trained = None
        if self.objective == "target_attention":
            loss = self._target_attention_loss(output, batch)
        else:
            trained = self._trained_positions(batch)  # (B, T), shared with the auxiliary losses
            loss = self._retrieval_loss(output, batch, trained, seen=unmasked)
        self._log_train(f"{self.loss_name}_loss", loss, batch)
        # auxiliary losses: (name, weight, how to compute it); the first two need trained
        # positions, which the constructor guarantees (retrieval objective only)
        auxiliary = (
            ("attribute_loss", self.attribute_loss_weight, self._attribute_loss),
            ("contrastive_loss", self.contrastive_weight, self._contrastive_loss),
            (
                "distillation_loss",
                self.distill_weight,
                partial(self._distillation_loss, teacher_batch=unmasked),
            ),
        )
        for name, weight, compute in auxiliary:
            if weight > 0:
                value = compute(output, batch, trained)
                self._log_train(name, value, batch)
                loss = loss + weight * value
        if self.rerank_top_n > 1 and self.rerank_loss_weight > 0:
            rerank = self._rerank_loss(output, batch)
            self._log_train("rerank_loss", rerank, batch)
            loss = loss + self.rerank_loss_weight * rerank
        self._log_train("loss", loss, batch, prog_bar=True)
        return loss

    def _log_train(
        self, name: str, value: torch.Tensor, batch: SeqBatch, prog_bar: bool = False
    ) -> None:
        """Log ``train/<name>`` as a per-epoch mean: one point per epoch in MLflow, comparable
        with the validation curves."""
        self.log(
            f"train/{name}",
            value,
            prog_bar=prog_bar,
            batch_size=len(batch),
            on_step=False,
            on_epoch=True,
        )

    def _contrastive_loss(self, output, batch: SeqBatch, trained: torch.Tensor) -> torch.Tensor:
        """``info_nce`` between the trained positions' states and their positives: a second
        encoding of the same batch (the encoder in training mode: a new dropout draw is the
        augmentation), or with ``partners`` the last state of each row's partner row."""
        if not self.partners:
            other = self(batch)
            return losses.info_nce(
                output.hidden[trained],
                other.hidden[trained],
                self.contrastive_temperature,
                labels=batch.target_item[trained],
            )
        half = len(batch) // 2  # rows [half, 2 half) are the partners of rows [0, half)
        if len(batch) % 2 or trained[half:].any() or trained[:half, :-1].any():
            raise ValueError(
                "training.contrastive_positive=same_target needs batches of training rows "
                "followed by their same-target partners (TrainPrefixes(partners=True): "
                "data.loader.train_samples=prefixes, built by recsys.tasks.train)"
            )
        rows = trained[:half, -1]
        return losses.info_nce(
            output.hidden[:half, -1][rows],
            output.hidden[half:, -1][rows],
            self.contrastive_temperature,
            labels=batch.target_item[:half, -1][rows],
        )

    def on_fit_start(self) -> None:
        for teacher in self._teachers:
            teacher.to(self.device)

    def _distillation_loss(
        self,
        output,
        batch: SeqBatch,
        trained: torch.Tensor,
        teacher_batch: SeqBatch | None = None,
    ) -> torch.Tensor:
        """``losses.distillation`` of the trained positions against the teachers' averaged
        log-probabilities (a product of experts, renormalised), both over the same items (with
        ``exclude_seen_from_loss`` each position's earlier items are left out of both). The
        teachers read ``teacher_batch`` (the batch before ``input_mask_prob`` masked it: their
        distribution is that of the real history), else ``batch``; its input items are also
        the earlier items left out of both. The (positions x items) tables are made in the
        full softmax's chunks of rows (:meth:`_logit_chunks`)."""
        teacher_batch = batch if teacher_batch is None else teacher_batch
        earlier = earlier_items(teacher_batch, trained) if self.exclude_seen_from_loss else None
        temperature = self.distill_temperature
        with torch.no_grad():
            inputs = teacher_batch.model_inputs()
            teacher_hidden = [t(*inputs).hidden[trained] for t in self._teachers]  # (M, D) each
        hidden = output.hidden[trained]
        chunks = self._logit_chunks(len(hidden), hidden.device)
        models = [self.encoder, *self._teachers]
        # each model's keys once for every chunk (a teacher's: without gradients)
        keys = [None] * len(models)
        if len(chunks) > 1:
            keys[0] = self.encoder.item_keys()
            with torch.no_grad():
                keys[1:] = [t.item_keys() for t in self._teachers]

        def scores(index: int, hidden: torch.Tensor, part: slice) -> torch.Tensor:
            logits = models[index].score_items(hidden[part], keys=keys[index]).float()
            return logits if earlier is None else exclude_items(logits, earlier[part])

        per_row = []
        for part in chunks:
            with torch.no_grad():
                teacher = torch.stack(
                    [
                        torch.log_softmax(scores(i, h, part) / temperature, -1)
                        for i, h in enumerate(teacher_hidden, start=1)
                    ]
                ).mean(0)
                teacher = torch.log_softmax(teacher, -1)
            per_row.append(losses.distillation_rows(scores(0, hidden, part), teacher, temperature))
        weight = self._target_weight(batch.target_behavior[trained])
        return losses.weighted_mean(torch.cat(per_row), weight)

    def _rerank_loss(self, output, batch: SeqBatch) -> torch.Tensor:
        """Cross-entropy of each row's last target among its hardest retrieval candidates,
        weighted by ``training.behavior_weights`` as the retrieval objective is (a target of
        weight 0, e.g. a view when purchases are predicted, is not trained)."""
        target = batch.target_item[:, -1]  # (B,) next item after the most recent event
        weight = self._target_weight(batch.target_behavior[:, -1])  # (B,) or None
        valid = (target > UNK_IDX) & (True if weight is None else weight > 0)
        with torch.no_grad():
            scores = self.encoder.score_items(output.query)  # (B, I)
            scores = scores.scatter(1, target[:, None], -math.inf)
            # at most the catalogue (as the ranker clamps its depth): the target plus the rest,
            # the rest drawn from the real items only (PAD, UNK and the target score -inf)
            depth = min(self.rerank_top_n, scores.shape[1] - NUM_RESERVED)
            negatives = scores.topk(depth - 1, dim=1).indices  # (B, N-1)
        candidates = torch.cat([target[:, None], negatives], dim=1)  # (B, N), true item first
        logits = self.encoder.rerank_scores(output, candidates)
        per_row = F.cross_entropy(  # the true item is candidate 0
            logits[valid].float(), torch.zeros_like(target[valid]), reduction="none"
        )
        if not per_row.numel():  # no target of this objective in the batch: 0, in the graph
            return logits[valid].sum()  # (not logits.sum() * 0: an UNK candidate's -inf -> NaN)
        return losses.weighted_mean(per_row, None if weight is None else weight[valid])

    # -- evaluation -------------------------------------------------------------------------
    def evaluation_metrics(
        self, batch: SeqBatch, coverage: CoverageAccumulator | None = None
    ) -> dict[str, torch.Tensor]:
        """Per-row metrics of one evaluation batch (target = ``batch.target_item`` (B,)); the
        two-stage top K of every row goes into ``coverage`` when given.

        The catalogue's (rows x items) score tables are made for a chunk of rows at a time
        (:func:`recsys.allocation.table_chunk_length`: under 32 MiB on a CPU, 1 GiB on an
        accelerator, but at least ``MIN_EVAL_CHUNK_ROWS`` rows), so that a large catalogue's
        evaluation stays bounded in memory: at 1 M items a 512-row batch made several 2 GiB
        tables at once. Every metric is a function of its own row, so chunks give the same
        values."""
        output = self(batch)
        rows = len(batch)
        chunk = table_chunk_length(
            rows, 4 * self.encoder.num_items, self.device, minimum=MIN_EVAL_CHUNK_ROWS
        )
        if chunk >= rows:
            return self._ranked_metrics(batch, output, None, coverage)
        keys = None
        if hasattr(self.encoder, "item_keys"):  # a model's keys, made once for every chunk
            with torch.autocast(self.device.type, enabled=False):
                keys = self.encoder.item_keys().float()
        parts = [
            self._ranked_metrics(batch.rows(part), output.rows(part), keys, coverage)
            for part in (slice(start, start + chunk) for start in range(0, rows, chunk))
        ]
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    def _ranked_metrics(
        self,
        batch: SeqBatch,
        output,
        keys: torch.Tensor | None,
        coverage: CoverageAccumulator | None,
    ) -> dict[str, torch.Tensor]:
        """:meth:`evaluation_metrics` of rows whose encoder ``output`` is computed (``keys``:
        the encoder's item keys, or None to have ``score_items`` make them)."""
        # the catalogue is scored in float32 even under bf16-mixed autocast (trainer=gpu): bf16
        # keeps ~3 significant digits, so many items would tie with the target, and ties rank
        # in the target's favour
        with torch.autocast(self.device.type, enabled=False):
            given = {} if keys is None else {"keys": keys}
            raw = self.encoder.score_items(output.query.float(), **given).float()  # (B, I)
        if self.transition_prior is not None:  # + weight * log(1 + count(recent item -> item))
            raw = self.transition_prior.add_to(raw, batch.item)
        # the (B, I) mask of each row's history, built once for every rule below that needs it
        seen = seen_mask(raw, batch.seen) if self.seen_items != "keep" else None
        scores = apply_seen_policy(raw, batch.seen, self.seen_items, seen=seen)
        metrics = {
            f"retrieval_{name}": value
            for name, value in ranking_metrics(
                target_ranks(scores, batch.target_item), self.metric_ks
            ).items()
        }
        depth = max(self.metric_ks)
        # seen items scored 0 by the policy keep that score when re-ranked: the P1 rule
        # applies to the ranking users get, not to stage 1 only
        zeroed = self.rerank_top_n and self.seen_items == "zero"
        fixed = seen if zeroed else None
        ranking = two_stage(
            self.encoder,
            output,
            top_k=depth,
            rerank_top_n=self.rerank_top_n,
            scores=scores,
            fixed=fixed,
            favour=batch.target_item,  # ties go to the target, as in stage 1's ranks
        )
        # a list deeper than the rankable items ends in excluded (-inf) ones: not recommended
        listed = ranking.items.masked_fill(torch.isneginf(ranking.scores), PAD_IDX)
        if self.rerank_top_n:
            # the list is the re-ranked head alone (metric_ks <= rerank_top_n): one score order
            ranks = rank_in_list(listed, batch.target_item, ranking.scores)
            metrics.update(
                {k: v for k, v in ranking_metrics(ranks, self.metric_ks).items() if k != "mrr"}
            )
            metrics["mrr"] = metrics["retrieval_mrr"]  # stage 2 only orders the top N
        else:
            metrics.update({k.removeprefix("retrieval_"): v for k, v in metrics.items()})
        if coverage is not None:
            coverage.update(listed[:, :depth])
        if self.sampled is not None:
            metrics.update(self._sampled_metrics(raw, batch))
        return metrics

    def _sampled_metrics(self, scores: torch.Tensor, batch: SeqBatch) -> dict[str, torch.Tensor]:
        """HR/NDCG against ``num_negatives`` sampled items the user has not interacted with
        (before the target: ``batch.seen``), and ATRank's AUC. Each row draws, with
        replacement, from the sampler's distribution over the items it has not had (SASRec's
        protocol redraws a negative that falls in the history), so every row is ranked against
        ``num_negatives`` of them, however long its history. Each row draws from a generator
        seeded by its user row and target item, so every model is evaluated against the same
        negatives, whatever the batch size, the rows' order or their chunks."""
        sampler, count = self.sampled
        probs = sampler.probs  # (I,) on the CPU
        seen, targets = batch.seen.cpu(), batch.target_item.cpu()
        negatives = torch.empty(len(batch), count, dtype=torch.long)
        valid = torch.ones(len(batch), count, dtype=torch.bool)
        for row, (user, target) in enumerate(zip(batch.user_index.tolist(), targets.tolist())):
            weights = probs.clone()
            weights[seen[row]] = 0.0
            weights[target] = 0.0
            if not weights.sum() > 0:
                # a user who has had every item the sampler can draw: rather than rank the
                # target first against no negative (sampled HR 1 beside AUC 0), draw from the
                # items other than the target, history included, uniformly if the sampler
                # gives them no weight (a popularity sampler's items unseen in training)
                weights = probs.clone()
                weights[target] = 0.0
                if not weights.sum() > 0:
                    weights = torch.ones_like(probs)
                    weights[:NUM_RESERVED] = 0.0
                    weights[target] = 0.0
                if not weights.sum() > 0:  # a catalogue of one item: no negative at all
                    weights, valid[row] = probs, False
            generator = torch.Generator().manual_seed(user * 7919 + target)
            negatives[row] = torch.multinomial(weights, count, True, generator=generator)
        ranks, auc = sampled_ranks(
            scores, batch.target_item, negatives.to(scores.device), valid.to(scores.device)
        )
        sampled = ranking_metrics(ranks, self.metric_ks)
        out = {f"sampled_{k}": v for k, v in sampled.items() if k.startswith(("hr", "ndcg"))}
        out["auc"] = auc
        return out

    def per_target_means(self, stage: str, means: Mapping[str, Any]) -> dict[str, Any]:
        """Means of :meth:`evaluation_metrics` over the ``stage`` split's ranked targets, as
        this module reports them: under ``unknown_targets="miss"`` scaled to every target, the
        unrankable ones counted as misses."""
        scale = self.metric_scale.get(stage, 1.0)
        return {name: value * scale for name, value in means.items()}

    def _stage_coverage(self, stage: str) -> CoverageAccumulator:
        if stage not in self._coverage:
            self._coverage[stage] = CoverageAccumulator(self.encoder.num_items, self.metric_ks)
        return self._coverage[stage]

    def _log_evaluation(self, stage: str, batch: SeqBatch) -> None:
        values = self.evaluation_metrics(batch, self._stage_coverage(stage))
        # batch means, each scaled by a constant: the epoch's mean of them scales with it
        means = self.per_target_means(stage, {name: v.mean() for name, v in values.items()})
        for name, value in means.items():
            self.log(
                f"{stage}/{name}",
                value,
                batch_size=len(batch),
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                prog_bar=name == "ndcg_at_10",
            )

    def _log_coverage(self, stage: str) -> None:
        coverage = self._coverage.pop(stage, None)
        if coverage is not None:
            for name, value in coverage.compute().items():
                self.log(f"{stage}/{name}", value, sync_dist=True)

    def validation_step(self, batch: SeqBatch, batch_idx: int) -> None:
        self._log_evaluation("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._log_coverage("val")

    def test_step(self, batch: SeqBatch, batch_idx: int) -> None:
        self._log_evaluation("test", batch)

    def on_test_epoch_end(self) -> None:
        self._log_coverage("test")

    # -- optimisation and checkpoints -------------------------------------------------------
    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ValueError("this module was built for evaluation only (optimizer=None)")
        return self.optimization(steps_per_epoch=self._steps_per_epoch)

    def optimization(self, *, steps_per_epoch: Callable[[], int]) -> Any:
        """The optimiser, with the schedule (stepped once per optimiser step) where one is
        set; ``steps_per_epoch`` is asked only by a schedule set in epochs."""
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        extra = {}
        if "steps_per_epoch" in inspect.signature(self.scheduler_factory).parameters:
            extra["steps_per_epoch"] = steps_per_epoch()
        scheduler = self.scheduler_factory(optimizer=optimizer, **extra)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _steps_per_epoch(self) -> int:
        """Optimiser steps in one training epoch, for schedules set in epochs
        (:mod:`recsys.training.schedules`)."""
        trainer = self.trainer
        trainer.estimated_stepping_batches  # noqa: B018 (sets the training loader up if needed)
        batches = trainer.num_training_batches
        if not 0 < batches < math.inf:
            raise ValueError(
                f"a schedule set in epochs needs a finite training epoch; this one has {batches} "
                "batches (set trainer.max_epochs, and give the training loader a length)"
            )
        return math.ceil(batches / trainer.accumulate_grad_batches)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "format_version": CHECKPOINT_FORMAT,
            "encoder_target": encoder_target(self.encoder),
            "encoder_config": dict(self.encoder.config),
            **self.checkpoint_extra,
            "code": code_version(),  # the code that trained it (recsys version, git commit)
        }
        if self.transition_prior is not None:
            checkpoint[CHECKPOINT_KEY]["transition_prior"] = self.transition_prior.to_plain()


def earlier_items(batch: SeqBatch, trained: torch.Tensor) -> torch.Tensor:
    """(M, T) for the M trained positions (``trained``, (B, T) bool): the input items of the
    row at or before each position, PAD after it and where an item is the position's own
    target (a repeat stays learnable). What ``training.exclude_seen_from_loss`` leaves out of
    the softmax, as evaluation's seen-item policy leaves the history out of the ranking.

    Example (one row, items [0, a, b, c], targets [0, b, c, d], the last two trained):
    position 2 -> [0, a, b, 0] (its target c is later), position 3 -> [0, a, b, c].
    """
    rows, length = batch.item.shape
    position = torch.arange(length, device=batch.item.device)
    later = position[None, :] > position[:, None]  # (T, T): [t, s] = s after t
    items = batch.item[:, None, :].expand(rows, length, length).masked_fill(later, PAD_IDX)
    items = items[trained]  # (M, T)
    return items.masked_fill(items == batch.target_item[trained][:, None], PAD_IDX)


def _check_weight(option: str, value: object) -> float:
    """A loss weight: a finite number >= 0 (0: the loss is off)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"training.{option}={value!r} must be a number >= 0 (0: off)")
    return float(value)


DISTILLATION_KEYS = ("teachers", "weight", "temperature")


def _transition_prior(
    setting: object,
    counts: TransitionCounts | None,
    num_items: int,
    rerank_top_n: int,
    *,
    window: int,
    recent: int,
    decay: float,
    max_seq_len: int | None = None,
) -> TransitionPrior | None:
    """``training.transition_prior`` -> the prior evaluation adds to the model's scores (None:
    off), with ``training.transition_window``, ``_recent`` and ``_decay``. ``auto`` starts at
    weight 0: the train task chooses the weight on validation once the best checkpoint is
    known. The three settings are checked even with the prior off, so that a sweep's absurd
    value is refused before it trains."""
    check_prior_settings(  # the input window bounds the recent items of a prior in use
        window=window,
        recent=recent,
        decay=decay,
        weight=setting,
        max_seq_len=None if setting is None else max_seq_len,
    )
    if setting is None:
        return None
    if rerank_top_n:
        raise ValueError(
            "training.transition_prior adds to the retrieval scores, which the re-rank stage "
            f"(training.rerank_top_n={rerank_top_n}) replaces for its top N: set one of them "
            "to 0/null"
        )
    if counts is None or counts.num_items != num_items or counts.window != window:
        raise ValueError(
            "training.transition_prior needs the training sequences' transition counts for "
            f"the model's {num_items} items, pairs up to {window} apart (transition_counts, "
            "passed by recsys.tasks.train and recsys.tasks.evaluate; got "
            f"{'none' if counts is None else f'{counts.num_items} items, {counts.window}'})"
        )
    return TransitionPrior(counts, 0.0 if setting == "auto" else setting, recent, decay)


class _Teachers(list):
    """The frozen teacher encoders: a list that ``copy.deepcopy`` shares instead of copying,
    so that weight averaging (torch's ``AveragedModel`` deep-copies the whole module) does not
    hold a second copy of every teacher."""

    def __deepcopy__(self, memo: dict) -> _Teachers:
        return self


def _distillation_settings(
    settings: Mapping[str, Any] | None, num_items: int
) -> tuple[list[nn.Module], float, float]:
    """``training.distillation`` -> (teacher encoders, weight, temperature); no teachers: off.
    The teachers arrive as encoders (``recsys.tasks.train`` loads the model references the
    config names)."""
    if not settings:
        return [], 0.0, 1.0
    unknown = sorted(set(settings) - set(DISTILLATION_KEYS))
    if unknown:
        raise ValueError(
            f"training.distillation has unknown keys {unknown}: use {list(DISTILLATION_KEYS)}"
        )
    teachers = list(settings.get("teachers") or [])
    if not teachers:
        raise ValueError(
            "training.distillation.teachers is empty: name the trained models to learn from "
            "(checkpoint paths, MLflow run ids or <name>@<alias>), or set "
            "training.distillation=null"
        )
    if not all(isinstance(t, nn.Module) for t in teachers):
        raise ValueError(
            "training.distillation.teachers must be loaded encoders here: recsys.tasks.train "
            "(pipelines.train, pipelines.run) loads the references the config names"
        )
    for teacher in teachers:
        if teacher.num_items != num_items:
            raise ValueError(
                f"a training.distillation teacher scores {teacher.num_items} items, this model "
                f"{num_items}: teachers must be trained on the same prepared data"
            )
    weight = _check_weight("distillation.weight", settings.get("weight", 1.0))
    if weight == 0:
        raise ValueError(
            "training.distillation.weight=0 distils nothing: give a weight > 0 (1.0: as much "
            "as the main loss), or set training.distillation=null"
        )
    temperature = settings.get("temperature", 1.0)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (0 < temperature < math.inf)
    ):
        raise ValueError(
            f"training.distillation.temperature={temperature!r} must be a number > 0 (1.0: "
            "the teachers' own distribution)"
        )
    return teachers, weight, float(temperature)


def _check_optimizer(optimizer: object) -> None:
    """The learning rate and weight decay of a partial optimizer (Hydra's ``_partial_``), named
    by their config keys: torch refuses a negative learning rate only when training starts,
    without naming the setting, and takes a NaN."""
    keywords = getattr(optimizer, "keywords", None) or {}
    lr = keywords.get("lr")
    number = isinstance(lr, (int, float)) and not isinstance(lr, bool)
    if "lr" in keywords and not isinstance(lr, torch.Tensor) and not (number and 0 < lr < math.inf):
        raise ValueError(f"training.optimizer.lr={lr!r} must be a number > 0 (e.g. 0.001)")
    if "weight_decay" in keywords:
        decay = _check_weight("optimizer.weight_decay", keywords["weight_decay"])
        # AdamW's decay is decoupled: each step multiplies every weight by 1 - lr · decay
        if getattr(optimizer, "func", None) is torch.optim.AdamW and number and lr * decay >= 1:
            raise ValueError(
                f"training.optimizer.lr={lr!r} with weight_decay={keywords['weight_decay']!r}: "
                f"AdamW multiplies every weight by 1 - lr * weight_decay = {1 - lr * decay:g} "
                "at each step, which sets them to 0 or flips their sign instead of decaying "
                "them: lower either so that lr * weight_decay is well below 1 (the defaults: "
                "lr=0.001, weight_decay=0.01)"
            )


def _choice(option: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{option}={value!r} is not supported: choose one of {list(allowed)}")


def _behavior_weights(
    weights: Mapping[str, float] | None, behaviors: Sequence[str]
) -> torch.Tensor | None:
    """{name: weight} -> (NUM_RESERVED + G,) weights by behaviour index; unnamed ones get 0."""
    if not weights:
        return None
    if not isinstance(weights, Mapping):
        raise ValueError(
            f"training.behavior_weights={weights!r} must be a mapping of behaviours to weights, "
            "e.g. {purchase: 1.0, cart: 0.3} (a behaviour left out is not a target)"
        )
    unknown = sorted(set(weights) - set(behaviors))
    if unknown:
        raise ValueError(
            f"training.behavior_weights names {unknown}, which are not behaviours of this data "
            f"{list(behaviors)}: use those names"
        )
    if any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf
        for w in weights.values()
    ) or not any(weights.values()):
        raise ValueError(
            f"training.behavior_weights={dict(weights)} must be non-negative numbers, not all 0"
        )
    table = torch.zeros(NUM_RESERVED + len(behaviors))
    for index, name in enumerate(behaviors):
        table[NUM_RESERVED + index] = float(weights.get(name, 0.0))
    return table


def _sampled_settings(
    settings: Mapping[str, Any] | None, num_items: int, item_counts: torch.Tensor | None
) -> tuple[losses.NegativeSampler, int] | None:
    if not settings:
        return None
    unknown = set(settings) - {"num_negatives", "sampler"}
    if unknown:
        raise ValueError(
            f"training.sampled_metrics has unknown keys {sorted(unknown)}: use num_negatives "
            "and sampler"
        )
    count = settings.get("num_negatives", 100)
    if not isinstance(count, int) or not 1 <= count < num_items - NUM_RESERVED:
        raise ValueError(
            f"training.sampled_metrics.num_negatives={count!r} must be an integer in "
            f"[1, {num_items - NUM_RESERVED - 1}]"
        )
    kind = settings.get("sampler", "uniform")
    if kind not in losses.SAMPLERS:
        raise ValueError(
            f"training.sampled_metrics.sampler={kind!r} is not supported: choose one of "
            f"{list(losses.SAMPLERS)}"
        )
    return losses.NegativeSampler(num_items, kind, item_counts), count
