"""The LightningModule: losses, metric logging and optimiser wiring — the model math lives in
:mod:`recsys.model`, the ranking in :mod:`recsys.retrieval`.

Training trains every position at once: the full-softmax cross-entropy of each position's next
item over the whole catalogue (Klenitskiy & Vasilev 2023), plus — when ``rerank_top_n > 1`` —
a re-rank loss for the target attention head on the last position: a softmax over the true
next item and the retrieval stage's top ``rerank_top_n - 1`` other items (the hard candidates
it will face at inference).

Metric names are stable and MLflow-safe: ``train/loss``, ``val/ndcg_at_10``,
``val/retrieval_hr_at_10``, ``test/mrr_at_20``, ... (``retrieval_`` = stage 1 alone, exact full
rank; unprefixed = the two-stage ranking that users get).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from recsys.checkpoint import CHECKPOINT_KEY
from recsys.data.batch import SeqBatch
from recsys.retrieval.ranker import retrieval_scores, two_stage
from recsys.schema import UNK_IDX
from recsys.training.metrics import rank_in_list, ranking_metrics, target_ranks


class SeqRecModule(pl.LightningModule):
    """Wraps an encoder with the ``ATRank`` interface (``forward``, ``score_items``,
    ``rerank_scores``, ``config``).

    ``optimizer`` / ``scheduler`` are partials (Hydra ``_partial_: true``) called with the
    parameters / optimizer. ``checkpoint_extra`` (vocabulary, schema, time buckets, ...) is
    stored in every checkpoint under ``"recsys"`` with the encoder's class and arguments.
    """

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        *,
        metric_ks: Sequence[int] = (5, 10, 20),
        rerank_top_n: int = 50,
        rerank_loss_weight: float = 0.5,
        exclude_seen: bool = False,
        checkpoint_extra: dict | None = None,
    ):
        super().__init__()
        if rerank_top_n < 0 or rerank_loss_weight < 0:
            raise ValueError(
                f"rerank_top_n={rerank_top_n} and rerank_loss_weight={rerank_loss_weight} "
                "must be >= 0"
            )
        if not metric_ks or min(metric_ks) < 1:
            raise ValueError(f"metric_ks={list(metric_ks)} must be positive cutoffs")
        if rerank_top_n and max(metric_ks) > rerank_top_n:
            raise ValueError(
                f"max(metric_ks)={max(metric_ks)} exceeds rerank_top_n={rerank_top_n}: "
                "metrics of the two-stage ranking need the cutoff inside the re-ranked list"
            )
        self.encoder = encoder
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.metric_ks = tuple(int(k) for k in metric_ks)
        self.rerank_top_n = rerank_top_n
        self.rerank_loss_weight = rerank_loss_weight
        self.exclude_seen = exclude_seen
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.save_hyperparameters(
            {
                "metric_ks": list(self.metric_ks),
                "rerank_top_n": rerank_top_n,
                "rerank_loss_weight": rerank_loss_weight,
                "exclude_seen": exclude_seen,
            }
        )

    def forward(self, batch: SeqBatch):
        return self.encoder(*batch.model_inputs())

    # -- training ---------------------------------------------------------------------------
    def training_step(self, batch: SeqBatch, batch_idx: int) -> torch.Tensor:
        output = self(batch)
        has_target = batch.target_item > UNK_IDX  # (B, T); UNK targets cannot be learned
        if not getattr(self.encoder, "causal", True):
            # a non-causal encoder sees position t+1 from position t: only the last position's
            # target is unseen by every input
            has_target = has_target & (
                torch.arange(has_target.shape[1], device=self.device) == has_target.shape[1] - 1
            )
        logits = self.encoder.score_items(output.hidden[has_target])  # (M, I)
        loss = F.cross_entropy(logits.float(), batch.target_item[has_target])
        self.log("train/ce_loss", loss, batch_size=len(batch), on_step=False, on_epoch=True)
        if self.rerank_top_n > 1 and self.rerank_loss_weight > 0:
            rerank = self._rerank_loss(output, batch)
            self.log(
                "train/rerank_loss", rerank, batch_size=len(batch), on_step=False, on_epoch=True
            )
            loss = loss + self.rerank_loss_weight * rerank
        # per-epoch means: one point per epoch in MLflow, comparable with the val curves
        self.log(
            "train/loss", loss, prog_bar=True, batch_size=len(batch), on_step=False, on_epoch=True
        )
        return loss

    def _rerank_loss(self, output, batch: SeqBatch) -> torch.Tensor:
        target = batch.target_item[:, -1]  # (B,) next item after the most recent event
        valid = target > UNK_IDX
        with torch.no_grad():
            scores = self.encoder.score_items(output.query)  # (B, I)
            scores = scores.scatter(1, target[:, None], -math.inf)
            negatives = scores.topk(self.rerank_top_n - 1, dim=1).indices  # (B, N-1)
        candidates = torch.cat([target[:, None], negatives], dim=1)  # (B, N), true item first
        logits = self.encoder.rerank_scores(output, candidates)
        labels = torch.zeros_like(target)
        return F.cross_entropy(logits[valid].float(), labels[valid])

    # -- evaluation -------------------------------------------------------------------------
    def evaluation_metrics(self, batch: SeqBatch) -> dict[str, torch.Tensor]:
        """Per-row metrics of one evaluation batch (target = ``batch.target_item`` (B,))."""
        output = self(batch)
        exclude = batch.item if self.exclude_seen else None
        scores = retrieval_scores(self.encoder, output, exclude=exclude).float()
        metrics = {
            f"retrieval_{name}": value
            for name, value in ranking_metrics(
                target_ranks(scores, batch.target_item), self.metric_ks
            ).items()
        }
        if self.rerank_top_n:
            ranking = two_stage(
                self.encoder,
                output,
                top_k=max(self.metric_ks),
                rerank_top_n=self.rerank_top_n,
                exclude=exclude,
            )
            ranks = rank_in_list(ranking.items, batch.target_item)
            metrics.update(ranking_metrics(ranks, self.metric_ks))
        else:
            metrics.update({k.removeprefix("retrieval_"): v for k, v in metrics.items()})
        return metrics

    def _log_evaluation(self, stage: str, batch: SeqBatch) -> None:
        for name, values in self.evaluation_metrics(batch).items():
            self.log(
                f"{stage}/{name}",
                values.mean(),
                batch_size=len(batch),
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                prog_bar=name == "ndcg_at_10",
            )

    def validation_step(self, batch: SeqBatch, batch_idx: int) -> None:
        self._log_evaluation("val", batch)

    def test_step(self, batch: SeqBatch, batch_idx: int) -> None:
        self._log_evaluation("test", batch)

    # -- optimisation and checkpoints -------------------------------------------------------
    def configure_optimizers(self):
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "encoder_target": f"{type(self.encoder).__module__}.{type(self.encoder).__qualname__}",
            "encoder_config": dict(self.encoder.config),
            **self.checkpoint_extra,
        }
