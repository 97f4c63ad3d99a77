"""Vectorised full-catalogue ranking metrics over ``(B, I)`` score tensors — no per-row loops.

Rank convention: rank 1 is the best; a target's rank is ``1 + (number of items scoring strictly
higher)``, so ties are resolved in the target's favour (the S3-Rec family's convention). A
target whose own score is ``-inf`` (excluded, e.g. as a seen item) is a miss.

Worked example, scores ``[0.1, 0.9, 0.5, 0.5]`` and target item 2 -> rank 2:
HR@1 = 0, HR@2 = 1, NDCG@2 = 1 / log2(3) = 0.631, MRR@2 = 0.5.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def target_ranks(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Shapes: scores (B, I), target (B,) -> ranks (B,) long, 1-based.

    A target scored ``-inf`` gets rank ``I + 1`` (outside every cutoff)."""
    target_score = scores.gather(1, target[:, None])  # (B, 1)
    ranks = 1 + (scores > target_score).sum(dim=1)
    return torch.where(torch.isneginf(target_score[:, 0]), scores.shape[1] + 1, ranks)


def rank_in_list(ranked_items: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Shapes: ranked_items (B, K) best first, target (B,) -> ranks (B,), ``K + 1`` if absent."""
    hit = ranked_items == target[:, None]  # (B, K)
    position = hit.float().argmax(dim=1) + 1
    return torch.where(hit.any(dim=1), position, ranked_items.shape[1] + 1)


def ranking_metrics(ranks: torch.Tensor, ks: Iterable[int]) -> dict[str, torch.Tensor]:
    """Per-row HR@K, NDCG@K and MRR@K for each K: ``{"hr_at_10": (B,) float, ...}``."""
    ranks = ranks.float()
    out: dict[str, torch.Tensor] = {}
    for k in ks:
        inside = ranks <= k
        out[f"hr_at_{k}"] = inside.float()
        out[f"ndcg_at_{k}"] = torch.where(inside, 1.0 / torch.log2(ranks + 1.0), 0.0)
        out[f"mrr_at_{k}"] = torch.where(inside, 1.0 / ranks, 0.0)
    return out


class MeanAccumulator:
    """Running means of per-row metric tensors, for evaluation loops outside Lightning."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def update(self, values: dict[str, torch.Tensor]) -> None:
        for name, tensor in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(tensor.sum())
        self.count += len(next(iter(values.values()))) if values else 0

    def compute(self) -> dict[str, float]:
        if self.count == 0:
            raise ValueError("no rows were evaluated")
        return {name: total / self.count for name, total in self.sums.items()}
