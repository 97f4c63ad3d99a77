"""Vectorised full-catalogue ranking metrics over ``(B, I)`` score tensors — no per-row loops.

Rank convention: rank 1 is the best; a target's rank is ``1 + (number of items scoring strictly
higher)``, so ties are resolved in the target's favour (the S3-Rec family's convention). A
target whose own score is ``-inf`` (excluded, e.g. as a seen item) or NaN (a diverged model:
nothing compares higher than NaN, so it would otherwise rank first) is a miss.

Worked example, scores ``[0.1, 0.9, 0.5, 0.5]`` and target item 2 -> rank 2:
HR@1 = 0, HR@2 = 1, NDCG@2 = 1 / log2(3) = 0.631, MRR@2 = 0.5.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from recsys.schema import NUM_RESERVED

UNKNOWN_TARGET_POLICIES = ("skip", "miss")
# the rank of a target that is not ranked (excluded, NaN, absent from a list): beyond every
# cutoff, even one larger than the catalogue, and 0 in the uncut MRR
MISS_RANK = torch.iinfo(torch.long).max


def known_target_shares(stats: Mapping[str, Any]) -> dict[str, float]:
    """Per split (``val``, ``test``), the share of its targets that evaluation can rank.

    Preparation sets aside a validation or test target whose item never occurs in training
    (the vocabulary is fitted on training events only), counting them in ``stats.json`` as
    ``<split>_targets_unknown_item`` beside the ``<split>_targets`` it keeps. Metrics averaged
    over the kept targets times this share are the same metrics with the set-aside targets
    counted as misses (0 for each), which is what code with every item in its vocabulary
    (the S3-Rec family's, P1) reports for them: ``training.unknown_targets=miss``.
    """
    shares = {}
    for split in ("val", "test"):
        kept = int(stats.get(f"{split}_targets", 0))
        unknown = int(stats.get(f"{split}_targets_unknown_item", 0))
        shares[split] = kept / (kept + unknown) if kept + unknown else 1.0
    return shares


def target_ranks(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Shapes: scores (B, I), target (B,) -> ranks (B,) long, 1-based.

    A target scored ``-inf`` or NaN gets ``MISS_RANK`` (outside every cutoff)."""
    target_score = scores.gather(1, target[:, None])  # (B, 1)
    ranks = 1 + (scores > target_score).sum(dim=1)
    unranked = torch.isneginf(target_score[:, 0]) | torch.isnan(target_score[:, 0])
    return torch.where(unranked, MISS_RANK, ranks)


def rank_in_list(
    ranked_items: torch.Tensor, target: torch.Tensor, scores: torch.Tensor | None = None
) -> torch.Tensor:
    """Shapes: ranked_items (B, K) best first, target (B,) -> ranks (B,), ``MISS_RANK`` if
    absent. Without ``scores`` the rank is the target's position; with ``scores`` (B, K), those
    that ordered the list, it is 1 + the listed items scored strictly higher (ties go to the
    target, as in :func:`target_ranks`; a target scored NaN is a miss)."""
    hit = ranked_items == target[:, None]  # (B, K)
    if scores is None:
        rank = hit.float().argmax(dim=1) + 1
    else:
        score = scores.gather(1, hit.float().argmax(dim=1, keepdim=True))  # (B, 1)
        rank = torch.where(torch.isnan(score[:, 0]), MISS_RANK, 1 + (scores > score).sum(dim=1))
    return torch.where(hit.any(dim=1), rank, MISS_RANK)


def ranking_metrics(ranks: torch.Tensor, ks: Iterable[int]) -> dict[str, torch.Tensor]:
    """Per-row HR@K, NDCG@K and MRR@K for each K, and the uncut MRR:
    ``{"hr_at_10": (B,) float, ..., "mrr": (B,)}``; a ``MISS_RANK`` is 0 in each."""
    missed = ranks == MISS_RANK
    ranks = ranks.float()
    out: dict[str, torch.Tensor] = {"mrr": torch.where(missed, 0.0, 1.0 / ranks)}
    for k in ks:
        inside = ranks <= k
        out[f"hr_at_{k}"] = inside.float()
        out[f"ndcg_at_{k}"] = torch.where(inside, 1.0 / torch.log2(ranks + 1.0), 0.0)
        out[f"mrr_at_{k}"] = torch.where(inside, 1.0 / ranks, 0.0)
    return out


# the namespaces evaluation logs metrics under: stage 1 alone, sampled negatives, a user segment
METRIC_PREFIXES = ("retrieval_", "sampled_", "segment_")


def higher_is_better(metric: str) -> bool:
    """Whether ``metric`` (``val/ndcg_at_10``, ``retrieval_mrr``, ...) is one of evaluation's
    metrics, for each of which higher is better: whatever :func:`ranking_metrics` computes (a
    metric added there is one at once), ``coverage_at_K`` and ``auc``, alone or under
    :data:`METRIC_PREFIXES`."""
    name = metric.split("/")[-1]
    while name.startswith(METRIC_PREFIXES):
        name = name.split("_", 1)[1]
    ranking = ranking_metrics(torch.ones(1, dtype=torch.long), (1,))
    names = {re.sub(r"_at_\d+$", "", known) for known in [*ranking, "coverage_at_1", "auc"]}
    return re.sub(r"_at_\d+$", "", name) in names


def sampled_ranks(
    scores: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's rank among itself and sampled negatives, and ATRank's AUC.

    Shapes: scores (B, I) retrieval scores; target (B,); negatives (B, N) item indices;
    valid (B, N) bool (False: a negative that collided with the target or the history and is
    left out). Returns ranks (B,) (1 + valid negatives scoring strictly higher) and auc (B,),
    the share of valid negatives the target outscores (ties count 1/2): ATRank's metric is the
    same comparison with one negative, so its expectation is this AUC. A NaN target score
    outscores nothing (every valid negative counts as higher).
    """
    target_score = scores.gather(1, target[:, None])  # (B, 1)
    negative_scores = scores.gather(1, negatives)  # (B, N)
    higher = ((negative_scores > target_score) | torch.isnan(target_score)) & valid
    ties = (negative_scores == target_score) & valid
    ranks = 1 + higher.sum(dim=1)
    count = valid.sum(dim=1).clamp(min=1)
    auc = ((valid & ~higher & ~ties).sum(dim=1) + 0.5 * ties.sum(dim=1)) / count
    return ranks, auc.float()


class CoverageAccumulator:
    """Catalogue coverage: the share of real items that appear in at least one user's top K."""

    def __init__(self, num_items: int, ks: Iterable[int]) -> None:
        self.ks = tuple(ks)
        self.num_real = num_items - NUM_RESERVED
        self.best_rank = torch.full((num_items,), torch.iinfo(torch.long).max)

    def update(self, top_items: torch.Tensor) -> None:
        """Shapes: top_items (B, K) best first, K >= max(ks)."""
        depth = top_items.shape[1]
        rank = torch.arange(1, depth + 1).expand_as(top_items).reshape(-1)
        items = top_items.reshape(-1).cpu()
        self.best_rank.scatter_reduce_(0, items, rank, reduce="amin")

    def compute(self) -> dict[str, float]:
        real = self.best_rank[NUM_RESERVED:]
        return {f"coverage_at_{k}": float((real <= k).sum()) / self.num_real for k in self.ks}


class MeanAccumulator:
    """Running means of per-row metric tensors, for evaluation loops outside Lightning, and
    their standard errors (how far a mean over few rows, e.g. a small user segment, may be
    from the mean over many)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.squares: dict[str, float] = {}
        self.count = 0

    def update(self, values: dict[str, torch.Tensor]) -> None:
        for name, tensor in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(tensor.sum())
            self.squares[name] = self.squares.get(name, 0.0) + float(tensor.double().square().sum())
        self.count += len(next(iter(values.values()))) if values else 0

    def compute(self) -> dict[str, float]:
        if self.count == 0:
            raise ValueError("no rows were evaluated")
        return {name: total / self.count for name, total in self.sums.items()}

    def standard_errors(self) -> dict[str, float]:
        """Each mean's standard error: the rows' sample standard deviation / sqrt(rows)
        (0 for a single row)."""
        means = self.compute()
        n = self.count
        if n < 2:
            return dict.fromkeys(means, 0.0)
        return {
            name: math.sqrt(max(self.squares[name] / n - mean**2, 0.0) / (n - 1))
            for name, mean in means.items()
        }
