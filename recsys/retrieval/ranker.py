"""Two-stage ranking shared by evaluation and scoring.

Stage 1 (retrieval): the candidate-independent user query vector against the item key table,
``score = q_u · K^T + bias``, over the whole catalogue. Stage 2 (re-rank): target attention —
each of the top-N candidates attends over the encoded history — orders those N. Items past N
keep their retrieval order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from recsys.model.outputs import EncoderOutput
from recsys.model.transition import TransitionPrior
from recsys.schema import NUM_RESERVED


@dataclass
class Ranking:
    """Shapes: ``items`` (B, K) item indices best first, ``scores`` (B, K) the score that
    ordered them (re-rank score inside the top N, retrieval score after), ``reranked`` (B, K)
    bool, True where the position was ordered by target attention."""

    items: torch.Tensor
    scores: torch.Tensor
    reranked: torch.Tensor


SEEN_POLICIES = ("keep", "exclude", "zero")


def exclude_items(scores: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Set the scores of ``items`` (B, T), e.g. a user's history, to ``-inf`` (PAD entries are
    harmless: PAD is never recommended). Returns a new tensor."""
    return scores.scatter(1, items, -math.inf)


def apply_seen_policy(
    scores: torch.Tensor,
    history: torch.Tensor,
    policy: str,
    *,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """What happens to the scores (B, I) of the items in each row's ``history`` (B, T):
    ``keep``; ``exclude`` (-inf: never ranked); ``zero`` (0, as the S3-Rec family's evaluation
    code does: items with negative scores still rank below them). PAD and UNK stay -inf.
    ``seen``: ``seen_mask(scores, history)`` when the caller has built it already."""
    if policy == "keep":
        return scores
    if policy not in SEEN_POLICIES:
        raise ValueError(f"seen_items={policy!r} is not supported: choose one of {SEEN_POLICIES}")
    seen = seen_mask(scores, history) if seen is None else seen
    ruled = scores.masked_fill(seen, -math.inf if policy == "exclude" else 0.0)
    ruled[:, :NUM_RESERVED] = -math.inf
    return ruled


def seen_mask(scores: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """(B, I) bool: True at the real items of each row's ``history`` (B, T)."""
    seen = torch.zeros_like(scores, dtype=torch.bool).scatter(1, history, True)
    seen[:, :NUM_RESERVED] = False
    return seen


def retrieval_scores(
    model: torch.nn.Module, output: EncoderOutput, *, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """Shapes: -> (B, I). ``exclude`` (B, T) item indices set to ``-inf`` (e.g. seen items)."""
    scores = model.score_items(output.query)
    return scores if exclude is None else exclude_items(scores, exclude)


def two_stage(
    model: torch.nn.Module,
    output: EncoderOutput,
    *,
    top_k: int,
    rerank_top_n: int,
    exclude: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    fixed: torch.Tensor | None = None,
    favour: torch.Tensor | None = None,
) -> Ranking:
    """Rank ``max(top_k, rerank_top_n)`` items per row; the first ``rerank_top_n`` retrieved
    are re-ordered by ``model.rerank_scores`` (0 turns stage 2 off). ``scores`` (B, I): stage
    1 scores already computed (and adjusted), instead of ``retrieval_scores(..., exclude)``.
    ``fixed`` (B, I) bool: items whose stage-1 score a rule set (the history under
    ``seen_items=zero``: score 0) keep it in stage 2 too, as excluded (-inf) ones do.
    ``favour`` (B,): one item per row that stage 1 places before the items it ties with, in
    the list and at its cut (evaluation's target: ties go to the target)."""
    if top_k < 1 or rerank_top_n < 0:
        raise ValueError(f"top_k={top_k} must be >= 1 and rerank_top_n={rerank_top_n} >= 0")
    if scores is None:
        scores = retrieval_scores(model, output, exclude=exclude)
    depth = min(max(top_k, rerank_top_n), scores.shape[1])
    top_scores, top_items = scores.topk(depth, dim=1)  # (B, depth)
    if favour is not None:
        top_items, top_scores = _favoured_first(scores, top_items, top_scores, favour)
    reranked = torch.zeros_like(top_items, dtype=torch.bool)
    n = min(rerank_top_n, depth)
    keep = None if fixed is None else fixed.gather(1, top_items)
    top_items, top_scores = rerank_head(model, output, top_items, top_scores, n, keep=keep)
    reranked[:, :n] = True
    return Ranking(items=top_items, scores=top_scores, reranked=reranked)


def _favoured_first(
    scores: torch.Tensor, items: torch.Tensor, top: torch.Tensor, favour: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``items`` (B, D), the best of ``scores`` (B, I) with their scores ``top``, with each
    row's ``favour`` item first among those of its score: swapped in for the list's last item
    when it ties with it but ``topk`` left it out, and moved before its ties in the list."""
    score = scores.gather(1, favour[:, None])  # (B, 1)
    present = (items == favour[:, None]).any(dim=1)
    swap = ~present & (score[:, 0] == top[:, -1]) & ~torch.isneginf(score[:, 0])
    items = items.clone()
    items[swap, -1] = favour[swap]  # the same score: the list stays in order
    later = (items != favour[:, None]).to(torch.int8)  # the favoured item first, then by score
    order = later.argsort(dim=1, stable=True)
    order = order.gather(1, top.gather(1, order).argsort(dim=1, descending=True, stable=True))
    return items.gather(1, order), top.gather(1, order)


def rerank_head(
    model: torch.nn.Module,
    output: EncoderOutput,
    items: torch.Tensor,
    scores: torch.Tensor,
    n: int,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2: re-order the first ``n`` of ``items`` (B, D), retrieved best first with
    ``scores`` (B, D), by ``model.rerank_scores``; the rest keep their retrieval order.
    ``-inf`` candidates (excluded, none left) stay at the bottom, and candidates marked in
    ``keep`` (B, D) bool keep their stage-1 score (a rule's, e.g. a seen item's 0)."""
    n = min(n, items.shape[1])
    if n <= 0:
        return items, scores
    head = items[:, :n]  # (B, N)
    head_scores = model.rerank_scores(output, head)
    stands = torch.isneginf(scores[:, :n])
    if keep is not None:
        stands = stands | keep[:, :n]
    head_scores = torch.where(stands, scores[:, :n], head_scores)
    order = head_scores.argsort(dim=1, descending=True, stable=True)
    items = torch.cat([head.gather(1, order), items[:, n:]], dim=1)
    scores = torch.cat([head_scores.gather(1, order), scores[:, n:]], dim=1)
    return items, scores


def with_prior(
    model: torch.nn.Module,
    output: EncoderOutput,
    prior: TransitionPrior,
    history: torch.Tensor,
    items: torch.Tensor,
    scores: torch.Tensor,
    *,
    blocked: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``D`` items by ``model score + prior`` from the model's best ``items`` (B, D)
    with ``scores`` (B, D) (an index's search, rules applied), and the items the prior gives a
    term after each row's ``history`` (B, T), most recent last (the successors of its recent
    items: :meth:`TransitionPrior.candidates`). Exact: every other item gains 0, so none of
    them can pass the D-th of the model's own. ``blocked`` (I,) bool and ``exclude`` (B, T)
    items keep their rule for the prior's candidates too. Memory grows with B x (D + M), M the
    longest list of candidates (no (B, D, M) comparison). Returns (scores, items), best
    first."""
    candidates, terms = prior.candidates(history)  # (B, M)
    valid = candidates >= NUM_RESERVED
    if blocked is not None:
        valid &= ~blocked[candidates]
    if exclude is not None:
        excluded = exclude.sort(dim=1).values
        valid &= ~_found(excluded, candidates)
    # each row's admissible candidates in ascending order, the others last (as `none`)
    none = torch.iinfo(candidates.dtype).max
    candidates, order = candidates.masked_fill(~valid, none).sort(dim=1)
    terms = terms.gather(1, order).masked_fill(candidates == none, 0.0)
    position = torch.searchsorted(candidates, items).clamp(max=candidates.shape[1] - 1)
    hit = candidates.gather(1, position) == items  # (B, D): the item gains its term
    scores = scores + torch.where(hit, terms.gather(1, position), 0.0)  # -inf stays -inf
    listed = _found(items.sort(dim=1).values, candidates)  # (B, M): counted above
    admissible = candidates != none
    extra = model.score_candidates(output.query, candidates.masked_fill(~admissible, 0))
    extra = (extra.float() + terms).masked_fill(~admissible | listed, -math.inf)
    pooled_scores = torch.cat([scores, extra], dim=1)
    pooled_items = torch.cat([items, candidates.masked_fill(~admissible, 0)], dim=1)
    top, where = pooled_scores.topk(items.shape[1], dim=1)
    return top, pooled_items.gather(1, where)


def _found(ascending: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(B, K) bool: whether each of ``values`` (B, K) is in its row of ``ascending`` (B, N)."""
    position = torch.searchsorted(ascending, values).clamp(max=ascending.shape[1] - 1)
    return ascending.gather(1, position) == values
