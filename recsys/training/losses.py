"""Next-item losses over a target's score and the scores of other items.

Every loss takes scores already computed by the model (``score = query · key + bias``) and
returns the weighted mean over rows, ``Σ w_m · loss_m / Σ w_m`` (``weight=None``: all 1), so
per-behaviour loss weights apply to any loss; with no row (a batch whose targets are all UNK)
it is 0, as with weights that are all 0, not the NaN of an empty mean.

- ``full_softmax``: cross-entropy over the whole catalogue (Klenitskiy & Vasilev 2023, SASRec+).
- ``sampled_softmax``: cross-entropy over the target and K sampled negatives with the logQ
  correction ``s - log q(item)`` (Yi et al. 2019), so that popularity-sampled negatives do not
  bias the model against popular items; a negative equal to the target ("accidental hit") is
  removed.
- ``bce``: ``-log σ(s⁺) - Σ_k log(1 - σ(s⁻_k))``: SASRec's and ATRank's loss (k = 1 there).
- ``gbce``: gSASRec's generalised BCE (Petrov & Macdonald 2023): the positive term is raised to
  ``β = α (t (1 - 1/α) + 1/α)`` with ``α = K / (I_real - 1)``, which counters the
  overconfidence that sampling negatives causes; ``t = 0`` is plain BCE.

The sampled ones are listed, with what each computes, in :data:`SAMPLED_LOSSES` (a new one is a
function and an entry there); :data:`LOSSES` adds ``full_softmax`` to them.

An auxiliary loss, ``attribute_softmax``, asks the same query for the target item's attributes
(category-path nodes, brand, ...): the mean over the item's attribute set of
``-log softmax(attribute scores)``, S3-Rec's idea of learning from side information, here as one
softmax over the attribute vocabulary. Worked example (one row, scores [0, ln 2, 0] over three
real attributes, target set {a1, a2}): ``-(log(1/4) + log(2/4)) / 2 = 1.0397``.

A second auxiliary loss, ``info_nce``, is DuoRec's and CL4SRec's contrastive objective: two
views of the same rows (the encoder run twice, so two dropout draws) should be closer to each
other than to the other rows' views. Worked example (τ = 1, view a = view b = the rows
[1, 0] and [0, 1]): every one of the 4 vectors has its positive at similarity 1 and two
negatives at 0, so the loss is ``-log(e / (e + 2)) = 0.5514``.

A third, ``distillation``, is Hinton et al.'s (2015) knowledge distillation: the cross-entropy of
the model's softmax at temperature τ against a teacher's (or an ensemble of teachers')
distribution at the same temperature, minus that distribution's entropy (so the KL divergence,
0 when the two agree), times τ² so that its gradients keep their scale as τ changes. Items a
row leaves out (score -inf in both) carry no term. Worked example (τ = 1, one row, model scores
[0, 0], teacher log-probabilities [log 0.75, log 0.25]): ``0.75 log(0.75/0.5) + 0.25
log(0.25/0.5) = 0.1308``.

``full_softmax`` takes an optional label smoothing ε (Szegedy et al. 2016). Worked example
(one row, scores [0, ln 2, -inf] with the target the first item, ε = 0.1): p = [1/3, 2/3],
``0.9 · log 3 + 0.1 · (log 3 + log 1.5) / 2 = 1.0640``, as torch's own option gives over the
two finite scores.

Worked example (one row, s⁺ = 2, one negative s⁻ = 0):
``bce = -log σ(2) - log(1 - σ(0)) = 0.1269 + 0.6931 = 0.8201``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from recsys.schema import NUM_RESERVED


def weighted_mean(per_row: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    if weight is None:
        return per_row.mean() if per_row.numel() else per_row.sum()
    return (per_row * weight).sum() / weight.sum().clamp(min=1e-12)


def full_softmax(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy over the catalogue, the weighted mean of :func:`full_softmax_rows`.

    Shapes: logits (M, I) over the catalogue, target (M,), weight (M,) or None -> ().
    """
    return weighted_mean(full_softmax_rows(logits, target, label_smoothing), weight)


def full_softmax_rows(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Each row's cross-entropy over the catalogue; with ``label_smoothing`` ε the target
    distribution is ``(1 - ε) · one-hot + ε · uniform`` over the items that can be scored
    (finite logits, so PAD and UNK at -inf are left out, where torch's own option would give an
    infinite loss): ``(1 - ε) · (-log p_target) + ε · mean_j(-log p_j)``.

    Shapes: logits (M, I), target (M,) -> (M,).
    """
    if not label_smoothing:
        return F.cross_entropy(logits.float(), target, reduction="none")
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (M, I)
    nll = -log_p.gather(1, target[:, None]).squeeze(1)  # (M,)
    finite = torch.isfinite(logits)
    uniform = -log_p.masked_fill(~finite, 0.0).sum(dim=1) / finite.sum(dim=1)  # (M,)
    return (1.0 - label_smoothing) * nll + label_smoothing * uniform


def distillation(
    logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    temperature: float = 1.0,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``τ² · KL(teacher ‖ softmax(logits / τ))``, the weighted mean of
    :func:`distillation_rows`. Shapes: logits (M, I), teacher_log_probs (M, I), weight (M,)
    or None -> ()."""
    return weighted_mean(distillation_rows(logits, teacher_log_probs, temperature), weight)


def distillation_rows(
    logits: torch.Tensor, teacher_log_probs: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``τ² · KL(teacher ‖ softmax(logits / τ))`` of each row. Shapes: logits (M, I) raw
    scores, teacher_log_probs (M, I) the teacher's log-probabilities at temperature τ (-inf:
    left out, as the logits there must be too) -> (M,)."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    teacher = teacher_log_probs.float()
    kept = torch.isfinite(teacher)
    terms = torch.where(kept, teacher.exp() * (teacher - log_probs), 0.0)
    return terms.sum(-1) * temperature**2


def attribute_softmax(
    logits: torch.Tensor, attributes: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy of each target item's attribute set: per row, the mean of
    ``-log softmax(logits)`` over the set's real attributes (PAD and UNK entries ignored).
    Rows whose set holds no real attribute are left out; with none left the loss is 0.

    Shapes: logits (M, N) over the attribute vocabulary (PAD/UNK columns may be -inf),
    attributes (M, A) long attribute indices padded with PAD, weight (M,) or None -> ().
    """
    real = attributes >= NUM_RESERVED  # (M, A)
    count = real.sum(dim=1)  # (M,)
    keep = count > 0
    if not keep.any():
        return logits.new_zeros((), dtype=torch.float32)
    log_p = torch.log_softmax(logits[keep].float(), dim=1)  # (M', N)
    picked = log_p.gather(1, attributes[keep]).masked_fill(~real[keep], 0.0)  # (M', A)
    per_row = -picked.sum(dim=1) / count[keep]
    return weighted_mean(per_row, None if weight is None else weight[keep])


def info_nce(
    view_a: torch.Tensor,
    view_b: torch.Tensor,
    temperature: float = 1.0,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Contrastive loss between two views of M rows (DuoRec, Qiu et al. 2022; CL4SRec).

    The 2M vectors are scored against each other by ``dot / temperature`` (DuoRec's ``dot``
    similarity); each one's positive is the same row's other view, and the loss is the mean
    cross-entropy of picking it among every other vector. With ``labels`` (e.g. the rows'
    target items), rows that share a label are not negatives of each other: DuoRec's point
    that sequences with the same next item are semantically alike. Fewer than two rows: 0.

    Shapes: view_a, view_b (M, D); labels (M,) or None -> ().
    """
    rows = view_a.shape[0]
    if rows < 2:
        return view_a.new_zeros((), dtype=torch.float32)
    vectors = torch.cat([view_a, view_b]).float()  # (2M, D)
    logits = vectors @ vectors.T / temperature  # (2M, 2M)
    index = torch.arange(2 * rows, device=logits.device)
    positive = (index + rows) % (2 * rows)  # row i's other view
    if labels is None:
        excluded = index[:, None] == index[None, :]  # itself
    else:
        both = labels.repeat(2)  # (2M,)
        excluded = both[:, None] == both[None, :]  # itself, its other view, same-label rows
        excluded[index, positive] = False
    return F.cross_entropy(logits.masked_fill(excluded, -math.inf), positive)


def sampled_softmax(
    positive: torch.Tensor,
    negatives: torch.Tensor,
    *,
    log_q_positive: torch.Tensor,
    log_q_negatives: torch.Tensor,
    accidental: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax cross-entropy over ``[target, negatives]`` with the logQ correction.

    Shapes: positive (M,), negatives (M, K); log_q_positive (M,); log_q_negatives (M, K) or
    (K,) (shared negatives); accidental (M, K) bool, True where a negative is the target
    (excluded); weight (M,) or None -> ().
    """
    corrected_negatives = (negatives - log_q_negatives).masked_fill(accidental, -math.inf)
    logits = torch.cat([(positive - log_q_positive)[:, None], corrected_negatives], dim=1)
    per_row = -torch.log_softmax(logits.float(), dim=1)[:, 0]
    return weighted_mean(per_row, weight)


def bce(
    positive: torch.Tensor,
    negatives: torch.Tensor,
    *,
    accidental: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    beta: float = 1.0,
) -> torch.Tensor:
    """``-β log σ(s⁺) - Σ_k log(1 - σ(s⁻_k))`` per row (``β = 1``: plain BCE); accidental hits
    contribute nothing.

    Shapes: positive (M,), negatives (M, K), accidental (M, K) bool or None, weight (M,) -> ().
    """
    positive_term = -beta * F.logsigmoid(positive.float())
    negative_terms = -F.logsigmoid(-negatives.float())  # -log(1 - σ(s)) = -log σ(-s)
    if accidental is not None:
        negative_terms = negative_terms.masked_fill(accidental, 0.0)
    return weighted_mean(positive_term + negative_terms.sum(dim=1), weight)


def gbce_beta(*, num_negatives: int, num_items: int, t: float) -> float:
    """gSASRec's β for ``num_negatives`` negatives out of ``num_items`` real items (PAD/UNK
    excluded): ``α = K / (I - 1)``, ``β = α (t (1 - 1/α) + 1/α)``; t = 0 -> 1 (plain BCE),
    t = 1 -> α."""
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"gbce_t={t} must lie in [0, 1] (gSASRec uses 0.75)")
    if num_items < 2 or not 1 <= num_negatives <= num_items - 1:
        raise ValueError(
            f"num_negatives={num_negatives} must lie in [1, {num_items - 1}] for {num_items} items"
        )
    alpha = num_negatives / (num_items - 1)
    return alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)


def _corrected_softmax(
    positive, negatives, *, target, negative_items, accidental, weight, log_q, beta
) -> torch.Tensor:
    return sampled_softmax(
        positive,
        negatives,
        log_q_positive=log_q(target),
        log_q_negatives=log_q(negative_items),
        accidental=accidental,
        weight=weight,
    )


def _binary(
    positive, negatives, *, target, negative_items, accidental, weight, log_q, beta
) -> torch.Tensor:
    return bce(positive, negatives, accidental=accidental, weight=weight, beta=beta)


# The losses over sampled negatives, by their ``training.loss`` name; ``full_softmax`` (over the
# whole catalogue) is the other choice. This mapping is the one list of them: the module calls
# ``SAMPLED_LOSSES[name](positive, negatives, target=, negative_items=, accidental=, weight=,
# log_q=, beta=)`` with the target's score (M,), the negatives' scores (M, K), the target items
# (M,), the negative items (M, K) or shared (K,), ``accidental`` (M, K) bool (a negative that
# is the target), the behaviour weights (M,) or None, the sampler's ``log_q(items)`` and
# gSASRec's β (1.0 but for gbce), and takes the () loss. A new sampled loss is a function here
# and an entry in this mapping.
SAMPLED_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "sampled_softmax": _corrected_softmax,
    "bce": _binary,
    "gbce": _binary,  # with β from gbce_beta
}
LOSSES = ("full_softmax", *SAMPLED_LOSSES)


def _uniform_weights(num_items: int, counts: torch.Tensor | None) -> torch.Tensor:
    return torch.ones(num_items, dtype=torch.float64)


def _popularity_weights(num_items: int, counts: torch.Tensor | None) -> torch.Tensor:
    if counts is None or counts.shape != (num_items,):
        raise ValueError(
            f"a popularity sampler needs the training count of each of the {num_items} "
            "items (the item vocabulary's train_count)"
        )
    weights = counts.double().clamp(min=0)
    if weights[NUM_RESERVED:].sum() <= 0:
        raise ValueError("every training count is 0: use the uniform sampler")
    return weights


# The negative samplers by their name (``training.negative_sampler``,
# ``training.sampled_metrics.sampler``): each gives the (I,) weights its draws follow from the
# catalogue size and the items' training counts (``counts``, aligned with the item vocabulary,
# or None); PAD and UNK get 0 whatever it says. This mapping is the one list of them: a new
# sampler is a function here and an entry in it.
SAMPLERS: dict[str, Callable[[int, torch.Tensor | None], torch.Tensor]] = {
    "uniform": _uniform_weights,
    "popularity": _popularity_weights,
}


class NegativeSampler:
    """Draws negative items from the real items (indices ``>= 2``: PAD and UNK never).

    ``kind="uniform"``: ``q(i) = 1 / (I - 2)``; ``kind="popularity"``: ``q(i) ∝`` the item's
    training count (``counts``, aligned with the item vocabulary); any other kind of
    :data:`SAMPLERS`: ``q(i) ∝`` its weights. ``log_q`` gives the log probabilities for the
    logQ correction. Draws are with replacement.
    """

    def __init__(self, num_items: int, kind: str = "uniform", counts: torch.Tensor | None = None):
        if kind not in SAMPLERS:
            raise ValueError(
                f"training.negative_sampler={kind!r} is not supported: choose one of "
                f"{list(SAMPLERS)}"
            )
        if num_items <= NUM_RESERVED:
            raise ValueError(f"num_items={num_items} leaves no real item to sample")
        self.kind = kind
        self.num_items = num_items
        probs = SAMPLERS[kind](num_items, counts).double().clone()
        probs[:NUM_RESERVED] = 0
        if not (probs.shape == (num_items,) and probs.min() >= 0 and probs.sum() > 0):
            raise ValueError(
                f"the {kind!r} sampler's weights must be {num_items} numbers >= 0, not all 0 "
                "over the real items (losses.SAMPLERS)"
            )
        self.probs = (probs / probs.sum()).float()  # (I,)
        self._log_q = self.probs.log()  # -inf for PAD/UNK (never drawn)

    def sample(
        self,
        shape: tuple[int, ...],
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Item indices of ``shape`` (long), on ``device``."""
        count = math.prod(shape)
        if count == 0:  # a batch with no trained position (torch.multinomial refuses 0)
            drawn = torch.zeros(0, dtype=torch.long)
        elif self.kind == "uniform":  # the same draws as multinomial's, faster
            drawn = torch.randint(NUM_RESERVED, self.num_items, (count,), generator=generator)
        else:
            drawn = torch.multinomial(self.probs, count, replacement=True, generator=generator)
        return drawn.reshape(shape).to(device)

    def log_q(self, items: torch.Tensor) -> torch.Tensor:
        """Shapes: items (...) -> (...) float, log of each item's sampling probability."""
        return self._log_q.to(items.device)[items]
