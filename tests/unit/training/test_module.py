"""The training module's objectives, losses, behaviour weights and evaluation options on a tiny
hand-made batch, and the evaluation helpers against brute-force references."""

from __future__ import annotations

import copy
import math
import warnings
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from recsys.data.batch import SeqBatch
from recsys.model import ATRank
from recsys.model.layers import never_recommended
from recsys.model.outputs import EncoderOutput
from recsys.model.sasrec import SASRec
from recsys.model.transition import TransitionCounts, TransitionPrior
from recsys.retrieval.ranker import apply_seen_policy, exclude_items, seen_mask
from recsys.training import losses
from recsys.training.evaluation import evaluate, pick_device
from recsys.training.metrics import (
    CoverageAccumulator,
    known_target_shares,
    ranking_metrics,
    sampled_ranks,
    target_ranks,
)
from recsys.training.module import SeqRecModule, earlier_items

NUM_ITEMS = 30
BEHAVIORS = ["view", "cart", "purchase"]  # indices 2, 3, 4


def encoder(causal: bool = True, seed_shift: int = 0, **overrides) -> ATRank:
    torch.manual_seed(seed_shift)
    settings = dict(
        num_items=NUM_ITEMS,
        num_attributes=5,
        num_behaviors=2 + len(BEHAVIORS),
        num_time_buckets=6,
        max_seq_len=6,
        d_model=8,
        num_heads=2,
        num_layers=1,
        dropout=0.0,
        causal=causal,
    )
    return ATRank(**{**settings, **overrides})


def batch(seed: int = 0) -> SeqBatch:
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    lengths = torch.tensor([6, 3, 1, 4])
    mask = torch.arange(T)[None, :] >= T - lengths[:, None]
    item = torch.randint(2, NUM_ITEMS, (B, T), generator=g) * mask
    behavior = torch.randint(2, 5, (B, T), generator=g) * mask
    target = torch.randint(2, NUM_ITEMS, (B, T), generator=g) * mask
    target_behavior = torch.randint(2, 5, (B, T), generator=g) * mask
    return SeqBatch(
        item=item,
        behavior=behavior,
        time_bucket=torch.randint(1, 6, (B, T), generator=g) * mask,
        padding_mask=mask,
        query_time_bucket=torch.randint(1, 6, (B, T), generator=g) * mask,
        target_item=target,
        target_behavior=target_behavior,
        user_index=torch.arange(B),
    )


def module(enc=None, **kwargs) -> SeqRecModule:
    counts = torch.arange(NUM_ITEMS)
    counts[:2] = 0
    return SeqRecModule(
        enc or encoder(),
        partial(torch.optim.Adam, lr=1e-3),
        behaviors=BEHAVIORS,
        item_counts=counts,
        **kwargs,
    )


def train_loss(m: SeqRecModule, b: SeqBatch) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        return m.training_step(b, 0)


@pytest.mark.parametrize("depth", [NUM_ITEMS - 2, NUM_ITEMS - 1, NUM_ITEMS, 5000])
def test_the_rerank_loss_never_takes_the_target_or_pad_or_unk_as_a_negative(depth):
    """With training.rerank_top_n at or past the catalogue, the -inf columns (PAD, UNK and the
    target itself) were drawn as negatives: the target competed against itself."""
    m = module(loss="full_softmax", rerank_top_n=depth, rerank_loss_weight=0.5)
    seen = []
    rerank_scores = m.encoder.rerank_scores
    m.encoder.rerank_scores = lambda output, candidates: (
        seen.append(candidates) or rerank_scores(output, candidates)
    )
    train_loss(m, batch())
    (candidates,) = seen
    assert candidates.shape[1] == NUM_ITEMS - 2  # every real item once: the target first
    for row in candidates.tolist():
        assert len(set(row)) == len(row) and min(row) >= 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss": "full_softmax"},
        {"loss": "sampled_softmax", "num_negatives": 5, "negative_sampler": "popularity"},
        {"loss": "sampled_softmax", "num_negatives": 5, "shared_negatives": False},
        {"loss": "bce", "num_negatives": 1, "shared_negatives": False},
        {"loss": "gbce", "num_negatives": 4, "gbce_t": 0.75},
        {"loss": "bce", "num_negatives": 1, "objective": "target_attention"},
        {"loss": "full_softmax", "rerank_top_n": 20, "rerank_loss_weight": 0.5},
        {"loss": "full_softmax", "rerank_top_n": 5000, "rerank_loss_weight": 0.5},
        {"loss": "full_softmax", "attribute_loss_weight": 0.5},
        {"loss": "full_softmax", "input_mask_prob": 0.3},
        {"loss": "full_softmax", "contrastive_weight": 0.1},
    ],
    ids=[
        "ce",
        "ssm-pop",
        "ssm-rows",
        "bce",
        "gbce",
        "target-attention",
        "ce+rerank",
        "ce+rerank-deeper-than-the-catalogue",
        "ce+attr",
        "ce+mask",
        "ce+contrastive",
    ],
)
def test_every_objective_and_loss_trains(kwargs):
    m = module(**kwargs)
    loss = train_loss(m, batch())
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_a_sampled_loss_registered_in_losses_is_the_one_trained(monkeypatch):
    """A loss added to ``losses.LOSSES`` without a case in the module had trained BCE in its
    place, logged as the new loss: ``losses.SAMPLED_LOSSES`` is now both the list of names and
    what each computes."""

    def hinge(positive, negatives, *, target, negative_items, accidental, weight, log_q, beta):
        margins = (1.0 - positive[:, None] + negatives).clamp(min=0).masked_fill(accidental, 0)
        return losses.weighted_mean(margins.sum(dim=1), weight)

    monkeypatch.setitem(losses.SAMPLED_LOSSES, "hinge", hinge)
    monkeypatch.setattr(losses, "LOSSES", ("full_softmax", *losses.SAMPLED_LOSSES))
    m, b = module(loss="hinge", num_negatives=3, shared_negatives=False), batch()
    torch.manual_seed(0)
    got = train_loss(m, b)
    torch.manual_seed(0)  # the same negatives, scored by the loss itself
    output = m(b)
    trained = m._trained_positions(b)
    hidden, target = output.hidden[trained], b.target_item[trained]
    negative_items = m._draw_negatives(len(target))
    positive = m.encoder.score_candidates(hidden, target[:, None])[:, 0]
    negatives = m.encoder.score_candidates(hidden, negative_items)
    accidental = negative_items == target[:, None]
    want = hinge(
        positive,
        negatives,
        target=target,
        negative_items=negative_items,
        accidental=accidental,
        weight=None,
        log_q=None,
        beta=1.0,
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    bce = losses.bce(positive, negatives, accidental=accidental)
    assert got.item() != pytest.approx(bce.item(), rel=1e-3)
    # and the objective that needs a sampled loss offers it
    with pytest.raises(
        ValueError, match=r"set training.loss to one of \[.*'hinge'\] \(ATRank's is bce\)"
    ):
        module(loss="full_softmax", objective="target_attention")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss": "full_softmax"},
        {"loss": "sampled_softmax", "num_negatives": 5},
        {"loss": "gbce", "num_negatives": 4},
        {"loss": "bce", "num_negatives": 1, "objective": "target_attention"},
    ],
    ids=["ce", "ssm", "gbce", "target-attention"],
)
def test_a_batch_without_a_learnable_target_gives_a_zero_loss_not_nan(kwargs):
    """Every target UNK (items rarer than data.min_item_count; e.g. an epoch's last batch of
    one row): nothing to learn, so 0, as behaviour weights that select no target give."""
    m, b = module(**kwargs), batch()
    b.target_item = b.target_item.masked_fill(b.padding_mask, 1)  # UNK
    loss = train_loss(m, b)
    assert loss.item() == 0.0
    loss.backward()


def test_full_softmax_loss_is_the_cross_entropy_of_every_real_position():
    m, b = module(), batch()
    output = m(b)
    real = b.target_item > 1
    expected = torch.nn.functional.cross_entropy(
        m.encoder.score_items(output.hidden[real]), b.target_item[real]
    )
    torch.testing.assert_close(train_loss(m, b), expected)


def test_label_smoothing_reaches_the_full_softmax():
    m, b = module(label_smoothing=0.1), batch()
    output = m(b)
    real = b.target_item > 1
    expected = losses.full_softmax(
        m.encoder.score_items(output.hidden[real]), b.target_item[real], label_smoothing=0.1
    )
    torch.testing.assert_close(train_loss(m, b), expected)
    assert not torch.allclose(expected, train_loss(module(), b))


def test_earlier_items_by_hand():
    # one row, items [0, a, b, c] with a, b, c = 5, 6, 7; targets [0, b, c, b]: the last
    # position's target b is a repeat, so b stays in its softmax
    item = torch.tensor([[0, 5, 6, 7]])
    target = torch.tensor([[0, 6, 7, 6]])
    b = SeqBatch(
        item=item,
        behavior=item.clamp(max=1) * 2,
        time_bucket=item.clamp(max=1),
        padding_mask=item > 0,
        query_time_bucket=item.clamp(max=1),
        target_item=target,
        target_behavior=item.clamp(max=1) * 2,
        user_index=torch.tensor([0]),
    )
    trained = torch.tensor([[False, True, True, True]])
    assert earlier_items(b, trained).tolist() == [[0, 5, 0, 0], [0, 5, 6, 0], [0, 5, 0, 7]]


@pytest.mark.parametrize("causal", [True, False])
def test_exclude_seen_from_loss_leaves_earlier_input_items_out_of_the_softmax(causal):
    m, b = module(encoder(causal=causal), exclude_seen_from_loss=True), batch()
    output = m(b)
    trained = b.target_item > 1
    if not causal:  # the last position only
        trained[:, :-1] = False
    rows, positions = trained.nonzero(as_tuple=True)
    expected = []
    for row, position, hidden in zip(rows, positions, output.hidden[trained], strict=True):
        logits = m.encoder.score_items(hidden).clone()
        target = b.target_item[row, position]
        for earlier in b.item[row, : position + 1]:  # brute force: one item at a time
            if earlier > 1 and earlier != target:
                logits[earlier] = -math.inf
        expected.append(torch.nn.functional.cross_entropy(logits[None], target[None]))
    torch.testing.assert_close(train_loss(m, b), torch.stack(expected).mean())
    plain = module(encoder(causal=causal))
    assert not torch.allclose(train_loss(m, b), train_loss(plain, b))


def test_behavior_weights_select_and_weigh_targets():
    m, b = module(behavior_weights={"purchase": 2.0, "cart": 1.0}), batch()
    output = m(b)
    real = b.target_item > 1
    hidden, target, behavior = output.hidden[real], b.target_item[real], b.target_behavior[real]
    weight = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0])[behavior]  # view (2) is not a target
    per_row = torch.nn.functional.cross_entropy(
        m.encoder.score_items(hidden), target, reduction="none"
    )
    expected = (per_row * weight).sum() / weight.sum()
    torch.testing.assert_close(train_loss(m, b), expected)


def test_the_rerank_loss_weighs_targets_as_the_retrieval_loss_does():
    """With behavior_weights the re-rank head learns the same targets as retrieval: a last
    target of weight 0 (a view when carts and purchases are predicted) is not trained."""
    m = module(behavior_weights={"purchase": 2.0, "cart": 1.0}, rerank_top_n=20)
    b = batch()
    b.target_behavior[0, -1] = 2  # a view: weight 0
    output = m(b)
    last, behavior = b.target_item[:, -1], b.target_behavior[:, -1]
    weight = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0])[behavior] * (last > 1)
    torch.manual_seed(0)
    loss = m._rerank_loss(output, b)
    with torch.no_grad():
        scores = m.encoder.score_items(output.query).scatter(1, last[:, None], -float("inf"))
        negatives = scores.topk(19, dim=1).indices
    logits = m.encoder.rerank_scores(output, torch.cat([last[:, None], negatives], dim=1))
    per_row = torch.nn.functional.cross_entropy(logits, torch.zeros_like(last), reduction="none")
    assert weight.sum() > 0 and (weight == 0).any()  # the batch has both kinds of row
    torch.testing.assert_close(loss, (per_row * weight).sum() / weight.sum())
    # no row with a weighted target: nothing to learn, a zero loss (not NaN)
    views_only = module(behavior_weights={"view": 1.0}, rerank_top_n=20)
    b.target_behavior[:, -1] = 3  # every last target a cart
    assert views_only._rerank_loss(views_only(b), b).item() == 0.0


def test_attribute_loss_predicts_each_trained_targets_attributes():
    enc = encoder()
    sets = torch.zeros(NUM_ITEMS, 1, dtype=torch.long)  # PAD: the PAD item has none
    sets[2:, 0] = 2 + torch.arange(NUM_ITEMS - 2) % 3  # real items: one of attributes 2, 3, 4
    sets[5, 0] = 1  # item 5: unknown attribute (UNK), not a target of the attribute loss
    enc.set_item_attributes(sets)
    m, b = module(enc, attribute_loss_weight=0.5), batch()
    output = m(b)
    real = b.target_item > 1
    hidden, target = output.hidden[real], b.target_item[real]
    ce = torch.nn.functional.cross_entropy(m.encoder.score_items(hidden), target)
    # by hand: the attribute part of each query (the last attribute_dim channels) against the
    # attribute table at the keys' scale, softmax over the 3 real attributes
    emb = enc.embedding
    attr_dim = emb.attribute_dim
    key_factor = emb.feature_dim**-0.5  # keys are the features times this (no F_target)
    table = emb.attribute_embedding.weight * emb.attribute_scale * key_factor
    logits = hidden[:, -attr_dim:] @ table[2:].T  # (M, 3)
    known = sets[target, 0] >= 2
    attribute = torch.nn.functional.cross_entropy(logits[known], sets[target, 0][known] - 2)
    torch.testing.assert_close(train_loss(m, b), ce + 0.5 * attribute)
    # an item's score is the item part plus its attribute's score: the same attribute vectors
    items = torch.cat([torch.arange(2, 5), torch.arange(6, NUM_ITEMS)])  # item 5's is UNK: -inf
    item_part = hidden[:, :-attr_dim] @ (emb.item_embedding.weight[items] * emb.item_scale).T
    item_part = item_part * key_factor
    attribute_part = m.encoder.score_attributes(hidden)[:, sets[items, 0]]
    torch.testing.assert_close(m.encoder.score_items(hidden)[:, items], item_part + attribute_part)


def test_input_mask_turns_real_input_items_into_unk_and_trains_on_the_masked_batch():
    m, b = module(input_mask_prob=0.5), batch()
    torch.manual_seed(3)
    masked = m._mask_inputs(b)
    changed = masked.item != b.item
    assert changed.any() and (~changed & b.padding_mask).any()  # some masked, some kept
    assert not (changed & ~b.padding_mask).any()  # padding stays PAD
    assert (masked.item[changed] == 1).all()  # UNK
    for name in ("behavior", "time_bucket", "padding_mask", "target_item", "target_behavior"):
        assert torch.equal(getattr(masked, name), getattr(b, name))
    # the loss is the plain loss of the masked batch (same draw), and evaluation never masks
    torch.manual_seed(3)
    loss = train_loss(m, b)
    plain = module()
    plain.load_state_dict(m.state_dict())
    torch.testing.assert_close(loss, train_loss(plain, masked))
    assert not torch.equal(loss, train_loss(plain, b))
    torch.testing.assert_close(m(b).query, plain(b).query)


@pytest.mark.parametrize("causal", [True, False])
def test_contrastive_loss_pulls_two_dropout_draws_of_each_trained_position_together(causal):
    enc = encoder(causal=causal, dropout=0.3)
    m, b = module(enc, contrastive_weight=0.1, contrastive_temperature=0.5), batch()
    m.train()
    trained = m._trained_positions(b)
    torch.manual_seed(7)
    first = m(b)
    second = m(b)  # the second draw the training step makes, in the same order
    assert not torch.allclose(first.hidden, second.hidden)  # dropout differs between the two
    ce = torch.nn.functional.cross_entropy(
        m.encoder.score_items(first.hidden[trained]), b.target_item[trained]
    )
    contrastive = losses.info_nce(
        first.hidden[trained], second.hidden[trained], 0.5, labels=b.target_item[trained]
    )
    assert contrastive > 0
    torch.manual_seed(7)
    torch.testing.assert_close(train_loss(m, b), ce + 0.1 * contrastive)
    # off (weight 0): one pass, the plain loss
    plain = module(enc)
    plain.train()
    torch.manual_seed(7)
    torch.testing.assert_close(train_loss(plain, b), ce)


def test_same_target_contrastive_loss_pairs_each_row_with_its_partner_row():
    enc = encoder(causal=False, dropout=0.0)
    m = module(enc, contrastive_weight=0.2, contrastive_positive="same_target")
    assert m.partners
    b = batch()  # 4 rows: 2 training rows (last position only), then their 2 partners
    b.target_item[:, :-1] = 0
    b.target_item[2:] = 0
    b.target_item[1, -1] = b.target_item[0, -1] + 1  # two different targets
    output = m(b)
    ce = torch.nn.functional.cross_entropy(
        m.encoder.score_items(output.hidden[:2, -1]), b.target_item[:2, -1]
    )
    contrastive = losses.info_nce(
        output.hidden[:2, -1], output.hidden[2:, -1], 1.0, labels=b.target_item[:2, -1]
    )
    assert contrastive > 0
    torch.testing.assert_close(train_loss(m, b), ce + 0.2 * contrastive)  # one encoder pass
    # a batch without partner rows (a trained row in the second half) is refused
    with pytest.raises(ValueError, match="followed by their same-target partners"):
        train_loss(m, batch())
    # the weight at 0 turns the partners off: the data module then adds none
    assert not module(enc, contrastive_positive="same_target").partners
    assert not module(enc, contrastive_weight=0.2).partners


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_distillation_adds_the_kl_to_the_teachers_averaged_distribution(exclude_seen):
    student, first, second = encoder(), encoder(seed_shift=1), encoder(seed_shift=2)
    settings = {"teachers": [first, second], "weight": 0.5, "temperature": 2.0}
    m = module(student, distillation=settings, exclude_seen_from_loss=exclude_seen)
    b = batch()
    trained = m._trained_positions(b)
    earlier = earlier_items(b, trained)

    def logits(enc):
        scores = enc.score_items(enc(*b.model_inputs()).hidden[trained])
        return exclude_items(scores, earlier) if exclude_seen else scores

    with torch.no_grad():
        teacher = torch.stack([torch.log_softmax(logits(t) / 2.0, -1) for t in (first, second)])
        teacher = torch.log_softmax(teacher.mean(0), -1)
    student_logits = logits(student)
    ce = torch.nn.functional.cross_entropy(student_logits, b.target_item[trained])
    kd = losses.distillation(student_logits, teacher, 2.0)
    assert kd > 0
    loss = train_loss(m, b)
    torch.testing.assert_close(loss, ce + 0.5 * kd)
    # the teachers learn nothing and are not part of the model that is saved
    loss.backward()
    assert all(p.grad is None for t in (first, second) for p in t.parameters())
    assert not any(p.requires_grad for t in (first, second) for p in t.parameters())
    assert set(m.state_dict()) == set(module(encoder()).state_dict())
    # a teacher identical to the student (no dropout) teaches nothing new: KL 0
    twin = module(student, distillation={"teachers": [copy.deepcopy(student)]})
    twin_ce = torch.nn.functional.cross_entropy(
        student.score_items(student(*b.model_inputs()).hidden[trained]), b.target_item[trained]
    )
    torch.testing.assert_close(train_loss(twin, b), twin_ce)


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_distillation_in_chunks_of_rows_gives_the_same_loss_and_gradients(
    monkeypatch, exclude_seen
):
    """On a CPU the student's and the teachers' logits are made in the full softmax's chunks of
    rows (each new block over glibc's mmap threshold is faulted in afresh); the loss and the
    student's gradients stay those of one table."""
    from recsys import allocation
    from recsys.training import module as module_code

    student, first, second = encoder(), encoder(seed_shift=1), encoder(seed_shift=2)
    settings = {"teachers": [first, second], "weight": 0.5, "temperature": 2.0}
    m = module(student, distillation=settings, exclude_seen_from_loss=exclude_seen)
    b = batch()
    widths = []
    for enc in (student, first, second):
        score = enc.score_items
        monkeypatch.setattr(
            enc,
            "score_items",
            partial(lambda f, q, keys=None: widths.append(len(q)) or f(q, keys), score),
        )

    def loss_and_grads():
        student.zero_grad()
        widths.clear()
        loss = train_loss(m, b)
        loss.backward()
        return loss.detach(), {
            n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None
        }

    whole, whole_grads = loss_and_grads()
    trained = int(m._trained_positions(b).sum())
    assert widths == [trained] * 4 and trained > 4  # the loss's table, then three for the KL
    monkeypatch.setattr(allocation, "MMAP_THRESHOLD_MAX", 0)
    monkeypatch.setattr(allocation, "CHUNK_BYTES", 1)
    monkeypatch.setattr(module_code, "MIN_LOGIT_CHUNK_ROWS", 4)
    chunked, chunked_grads = loss_and_grads()
    parts = [4] * (trained // 4) + ([trained % 4] if trained % 4 else [])
    assert widths == parts + [w for p in parts for w in (p, p, p)]  # per chunk: teachers, student
    torch.testing.assert_close(chunked, whole)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, msg=name)


def test_distillation_teachers_read_the_batch_before_input_masking():
    """input_mask_prob augments the student's input; the teachers' distribution is that of the
    real history (a teacher fed the masked history would teach a corrupted target)."""
    student, teacher = encoder(), encoder(seed_shift=1)
    m = module(student, distillation={"teachers": [teacher]}, input_mask_prob=0.5)
    b = batch()
    torch.manual_seed(3)
    masked = m._mask_inputs(b)
    assert not torch.equal(masked.item, b.item)
    trained = m._trained_positions(masked)

    def logits(enc, inputs):
        return enc.score_items(enc(*inputs.model_inputs()).hidden[trained])

    with torch.no_grad():
        taught = torch.log_softmax(logits(teacher, b), -1)
    student_logits = logits(student, masked)
    ce = torch.nn.functional.cross_entropy(student_logits, masked.target_item[trained])
    expected = ce + losses.distillation(student_logits, taught)
    torch.manual_seed(3)
    torch.testing.assert_close(train_loss(m, b), expected)


def test_a_deep_copy_of_the_module_shares_its_frozen_teachers():
    """Weight averaging deep-copies the whole module (torch's AveragedModel): the teachers,
    neither trained nor averaged, are shared, not held twice."""
    from torch.optim.swa_utils import AveragedModel

    teachers = [encoder(seed_shift=1), encoder(seed_shift=2)]
    m = module(encoder(), distillation={"teachers": teachers})
    copied = copy.deepcopy(m)
    assert copied.encoder is not m.encoder
    assert all(a is b for a, b in zip(copied._teachers, teachers, strict=True))
    averaged = AveragedModel(m, use_buffers=False)
    assert all(a is b for a, b in zip(averaged.module._teachers, teachers, strict=True))


def test_a_non_causal_model_learns_from_non_causal_and_causal_teachers():
    teachers = [encoder(causal=False, seed_shift=1), encoder(causal=True, seed_shift=2)]
    m = module(encoder(causal=False), distillation={"teachers": teachers})
    b = batch()
    assert m._trained_positions(b)[:, :-1].sum() == 0  # the last position only: no leak
    assert torch.isfinite(train_loss(m, b))


def test_non_causal_encoder_trains_its_last_position_only():
    m, b = module(encoder(causal=False)), batch()
    output = m(b)
    expected = torch.nn.functional.cross_entropy(
        m.encoder.score_items(output.hidden[:, -1]), b.target_item[:, -1]
    )
    torch.testing.assert_close(train_loss(m, b), expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "hinge"}, "training.loss='hinge'"),
        ({"objective": "target_attention"}, "needs a sampled loss"),
        ({"loss": "bce", "num_negatives": 0}, "num_negatives=0"),
        ({"loss": "bce", "num_negatives": 10_000}, "num_negatives=10000"),
        ({"behavior_weights": {"click": 1.0}}, "click"),
        ({"behavior_weights": {"view": 0.0}}, "not all 0"),
        ({"seen_items": "drop"}, "seen_items='drop'"),
        ({"unknown_targets": "drop"}, "unknown_targets='drop'"),
        ({"unknown_targets": "miss"}, "unknown_targets=miss needs target_shares"),
        ({"sampled_metrics": {"num_negatives": 100_000}}, "num_negatives=100000"),
        ({"attribute_loss_weight": -1.0}, "attribute_loss_weight=-1.0"),
        ({"attribute_loss_weight": math.inf}, "attribute_loss_weight=inf"),
        ({"input_mask_prob": 1.0}, "input_mask_prob=1.0"),
        ({"input_mask_prob": -0.1}, "input_mask_prob=-0.1"),
        ({"input_mask_prob": True}, "input_mask_prob=True"),
        ({"contrastive_weight": -0.1}, "contrastive_weight=-0.1"),
        ({"contrastive_weight": "0.1"}, "contrastive_weight='0.1'"),
        ({"contrastive_temperature": 0.0}, "contrastive_temperature=0.0"),
        ({"contrastive_temperature": math.nan}, "contrastive_temperature=nan"),
        ({"contrastive_positive": "augment"}, "contrastive_positive='augment'"),
        ({"label_smoothing": 1.0}, "label_smoothing=1.0"),
        ({"label_smoothing": 0.1, "loss": "bce", "num_negatives": 1}, "needs training.loss"),
        ({"exclude_seen_from_loss": 1}, "exclude_seen_from_loss=1 must be true or false"),
        (
            {"exclude_seen_from_loss": True, "loss": "bce", "num_negatives": 1},
            "exclude_seen_from_loss=true leaves",
        ),
        (
            {"contrastive_weight": 0.1, "objective": "target_attention", "loss": "bce"},
            "contrastive_weight > 0 contrasts the positions the retrieval objective trains",
        ),
        (
            {"attribute_loss_weight": 1.0, "objective": "target_attention", "loss": "bce"},
            "needs objective=retrieval",
        ),
        ({"distillation": {"teachers": []}}, "distillation.teachers is empty"),
        ({"distillation": {"teacher": [encoder()]}}, "distillation has unknown keys ['teacher']"),
        ({"distillation": {"teachers": ["best.ckpt"]}}, "must be loaded encoders here"),
        (
            {"distillation": {"teachers": [encoder(num_items=NUM_ITEMS + 1)]}},
            "teacher scores 31 items, this model 30",
        ),
        ({"distillation": {"teachers": [encoder()], "weight": 0}}, "distillation.weight=0"),
        ({"distillation": {"teachers": [encoder()], "weight": -1}}, "distillation.weight=-1"),
        (
            {"distillation": {"teachers": [encoder()], "temperature": 0}},
            "distillation.temperature=0",
        ),
        (
            {"distillation": {"teachers": [encoder()]}, "loss": "bce", "num_negatives": 1},
            "distillation matches the teachers' softmax",
        ),
        (
            {"distillation": {"teachers": [encoder(causal=False)]}},
            "a non-causal teacher (model.causal=false) reads the whole window",
        ),
    ],
)
def test_bad_settings_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=re_escape(message)):
        module(**kwargs)


def test_attribute_loss_needs_attributes_in_the_keys():
    sasrec = SASRec(num_items=NUM_ITEMS, max_seq_len=6, d_model=8, num_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="use model=atrank"):
        module(sasrec, attribute_loss_weight=1.0)
    items_only = encoder(attribute_dim=0)
    with pytest.raises(ValueError, match="attribute_dim > 0"):
        module(items_only, attribute_loss_weight=1.0)
    with pytest.raises(ValueError, match="attribute_dim > 0"):
        items_only.score_attributes(torch.zeros(1, 8))
    cosine = encoder(score_temperature=0.1)  # normalised keys: the halves no longer add up
    with pytest.raises(ValueError, match="score_temperature=null"):
        module(cosine, attribute_loss_weight=1.0)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_evaluation_reports_mrr_coverage_sampled_metrics_and_auc():
    m = module(sampled_metrics={"num_negatives": 10, "sampler": "uniform"}).eval()
    b = batch()
    eval_batch = SeqBatch(**{**b.__dict__, "target_item": b.target_item[:, -1].clamp(min=2)})
    eval_batch.target_behavior = b.target_behavior[:, -1]
    coverage = CoverageAccumulator(NUM_ITEMS, m.metric_ks)
    with torch.no_grad():
        metrics = m.evaluation_metrics(eval_batch, coverage)
    for name in (
        "mrr",
        "ndcg_at_10",
        "retrieval_mrr",
        "sampled_ndcg_at_10",
        "sampled_hr_at_5",
        "auc",
    ):
        assert metrics[name].shape == (4,), name
    assert ((metrics["auc"] >= 0) & (metrics["auc"] <= 1)).all()
    assert (metrics["sampled_hr_at_10"] >= metrics["hr_at_10"]).all()  # fewer competitors
    covered = coverage.compute()
    assert 0 < covered["coverage_at_5"] <= covered["coverage_at_20"] <= 1


def test_sampled_ranks_match_a_brute_force_count():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(6, 40, generator=g).round(decimals=1)  # ties happen
    target = torch.randint(0, 40, (6,), generator=g)
    negatives = torch.randint(0, 40, (6, 12), generator=g)
    valid = torch.rand(6, 12, generator=g) > 0.2
    ranks, auc = sampled_ranks(scores, target, negatives, valid)
    for row in range(6):
        t = scores[row, target[row]].item()
        kept = [scores[row, n].item() for n, v in zip(negatives[row], valid[row]) if v]
        assert ranks[row].item() == 1 + sum(s > t for s in kept)
        wins = sum(1.0 if t > s else 0.5 if t == s else 0.0 for s in kept)
        assert auc[row].item() == pytest.approx(wins / max(len(kept), 1))


def test_coverage_by_hand():
    coverage = CoverageAccumulator(8, [1, 2])  # real items 2..7
    coverage.update(torch.tensor([[2, 3], [2, 4]]))
    assert coverage.compute() == {"coverage_at_1": 1 / 6, "coverage_at_2": 3 / 6}


def test_seen_policies():
    scores = torch.tensor([[-math.inf, -math.inf, 2.0, -1.0, 0.5]])
    history = torch.tensor([[0, 3, 4]])  # PAD, then items 3 and 4
    assert apply_seen_policy(scores, history, "keep") is scores
    excluded = apply_seen_policy(scores, history, "exclude")
    assert excluded[0, 2:].tolist() == [2.0, -math.inf, -math.inf]
    zeroed = apply_seen_policy(scores, history, "zero")
    # the S3-Rec family's rule: seen items score 0, so item 3 (score -1) moves *up*
    assert zeroed[0].tolist() == [-math.inf, -math.inf, 2.0, 0.0, 0.0]
    # a mask the caller built already gives the same scores
    seen = seen_mask(scores, history)
    for policy in ("keep", "exclude", "zero"):
        assert torch.equal(
            apply_seen_policy(scores, history, policy, seen=seen),
            apply_seen_policy(scores, history, policy),
        )
    with pytest.raises(ValueError, match="seen_items='drop' is not supported"):
        apply_seen_policy(scores, history, "drop")


@pytest.mark.parametrize("policy", ["exclude", "zero"])
def test_evaluation_sets_aside_the_whole_history_not_only_the_input_window(policy):
    """An item the user saw before the model's window (``seen_item``, from the evaluation rows)
    is set aside like the window's own items: the anchors' evaluation code does the same."""
    m = module(seen_items=policy, metric_ks=(1, 5)).eval()
    b = batch()
    b.target_item = b.target_item[:, -1].clamp(min=2)
    b.target_behavior = b.target_behavior[:, -1]
    with torch.no_grad():
        raw = m.encoder.score_items(m(b).query)
        raw[:, :2] = -math.inf
        best = raw.argmax(dim=1)  # each row's top item
    b.target_item = torch.where(
        best == b.target_item, (best + 1 - 2) % (NUM_ITEMS - 2) + 2, b.target_item
    )
    with torch.no_grad():
        window_only = m.evaluation_metrics(b)
    # the top item was seen before the window: it leaves the ranking, the target moves up
    b.seen_item = torch.cat([b.item, best[:, None]], dim=1)
    with torch.no_grad():
        whole = m.evaluation_metrics(b)
    expected = apply_seen_policy(raw, b.seen_item, policy)
    ranks = 1 + (expected > expected.gather(1, b.target_item[:, None])).sum(1)
    torch.testing.assert_close(whole["retrieval_mrr"], 1 / ranks.float())
    assert (whole["retrieval_mrr"] >= window_only["retrieval_mrr"]).all()


@pytest.mark.parametrize("model", ["atrank", "sasrec"])
def test_score_candidates_agree_with_score_items(model):
    enc = (
        encoder()
        if model == "atrank"
        else SASRec(num_items=NUM_ITEMS, max_seq_len=6, d_model=8, num_heads=2, num_layers=1)
    ).eval()
    query = torch.randn(3, 8)
    full = enc.score_items(query)
    per_row = torch.tensor([[2, 5, 9], [3, 3, 1], [29, 7, 0]])
    torch.testing.assert_close(enc.score_candidates(query, per_row), full.gather(1, per_row))
    shared = torch.tensor([4, 8, 1])
    torch.testing.assert_close(enc.score_candidates(query, shared), full[:, shared])


def test_sasrec_is_causal_and_ignores_padding():
    enc = SASRec(num_items=NUM_ITEMS, max_seq_len=6, d_model=8, num_heads=2, num_layers=2).eval()
    item = torch.tensor([[0, 0, 5, 6, 7, 8]])
    out = enc(item)
    assert out.hidden.shape == (1, 6, 8) and out.query.shape == (1, 8)
    assert torch.equal(out.hidden[0, :2], torch.zeros(2, 8))
    changed = enc(torch.tensor([[0, 0, 5, 6, 7, 9]]))
    torch.testing.assert_close(out.hidden[:, :5], changed.hidden[:, :5])  # the past is unmoved
    narrower = enc(item[:, 2:])  # the same history without padding columns
    torch.testing.assert_close(narrower.query, out.query)
    scores = enc.score_items(out.query)
    assert torch.isneginf(scores[0, :2]).all()


def test_gbce_module_uses_the_catalogue_beta():
    m = module(loss="gbce", num_negatives=4, gbce_t=0.5)
    assert m.gbce_beta == pytest.approx(
        losses.gbce_beta(num_negatives=4, num_items=NUM_ITEMS - 2, t=0.5)
    )


def test_unknown_targets_miss_counts_the_set_aside_targets_as_misses():
    """Targets set aside at preparation (their item never occurs in training) count as 0 in
    every per-target metric under ``miss``: the means over the ranked rows times their share,
    checked against a brute-force mean over ranked and set-aside targets. Coverage (of the
    ranked rows' lists) and ``skip`` are unchanged."""
    b = batch()
    b.target_item = b.target_item[:, -1].clamp(min=2)
    b.target_behavior = b.target_behavior[:, -1]
    # 4 ranked test targets and 4 set aside; validation has none set aside
    stats = {
        "val_targets": 4,
        "val_targets_unknown_item": 0,
        "test_targets": 4,
        "test_targets_unknown_item": 4,
    }
    shares = known_target_shares(stats)
    skip = module(metric_ks=(1, 5), target_shares=shares).eval()
    miss = module(metric_ks=(1, 5), unknown_targets="miss", target_shares=shares).eval()
    miss.load_state_dict(skip.state_dict())
    cpu = torch.device("cpu")
    kept = evaluate(skip, [b], device=cpu, split="test")
    counted = evaluate(miss, [b], device=cpu, split="test")
    with torch.no_grad():
        rows = skip.evaluation_metrics(b)
    for name, per_row in rows.items():
        everything = torch.cat([per_row, torch.zeros(4)])  # the set-aside targets: misses
        assert counted[name] == pytest.approx(float(everything.mean())), name
        assert kept[name] == pytest.approx(float(per_row.mean())), name
    assert kept["mrr"] > 0  # the check above is not 0 == 0
    for name in ("coverage_at_1", "coverage_at_5"):
        assert counted[name] == kept[name]
    # a split with nothing set aside reports the same either way
    assert evaluate(miss, [b], device=cpu, split="val") == kept
    assert miss.hparams["unknown_targets"] == "miss"


def test_lightning_validation_reports_the_same_means_as_evaluate():
    """The validation loop (early stopping, checkpoints, MLflow) logs what ``evaluate`` gives:
    under ``miss`` the per-target means scaled by the split's share, coverage as it is."""
    b = batch()
    b.target_item = b.target_item[:, -1].clamp(min=2)
    b.target_behavior = b.target_behavior[:, -1]
    shares = {"val": 0.5, "test": 1.0}
    reported = {}
    for policy in ("skip", "miss"):
        m = module(metric_ks=(1, 5), unknown_targets=policy, target_shares=shares)
        trainer = pl.Trainer(
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tiny loader: Lightning suggests more workers
            (logged,) = trainer.validate(m, DataLoader([b], batch_size=None), verbose=False)
        expected = evaluate(m, [b], device=torch.device("cpu"), split="val")
        for name, value in expected.items():
            assert logged[f"val/{name}"] == pytest.approx(value), name
        reported[policy] = logged
    assert reported["miss"]["val/mrr"] == pytest.approx(0.5 * reported["skip"]["val/mrr"])
    assert reported["skip"]["val/mrr"] > 0
    assert reported["miss"]["val/coverage_at_5"] == reported["skip"]["val/coverage_at_5"]


def test_pick_device_refuses_unknown_names_and_a_missing_gpu(monkeypatch):
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"retrieval.accelerator='tpu': use one of \['auto'"):
        pick_device("tpu", option="retrieval.accelerator")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="trainer.accelerator=gpu: this machine has no CUDA GPU"):
        pick_device("gpu", option="trainer.accelerator")


class _TwoKeys(torch.nn.Module):
    """Scores ``query @ keys.T`` with keys 1.0 (item 2) and 1.001 (item 3): distinct in float32,
    one value in bfloat16."""

    num_items = 4
    config: dict = {}

    def __init__(self):
        super().__init__()
        self.keys = torch.nn.Parameter(torch.tensor([[0.0], [0.0], [1.0], [1.001]]))

    def forward(self, item, behavior, time_bucket, padding_mask, query_time_bucket=None):
        hidden = torch.ones(*item.shape, 1)
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)

    def score_items(self, query):
        return query @ self.keys.T + never_recommended(self.num_items)


def test_evaluation_under_bf16_autocast_scores_the_catalogue_in_float32():
    # trainer=gpu validates under bf16-mixed autocast: scored in bf16, item 3 would tie with
    # the target (item 2) and the tie would rank the target first
    m = SeqRecModule(_TwoKeys(), None, metric_ks=(1,)).eval()
    b = batch()
    b.target_item = torch.full((len(b),), 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        metrics = m.evaluation_metrics(b)
    assert metrics["retrieval_hr_at_1"].tolist() == [0.0] * len(b)
    assert metrics["mrr"].tolist() == [0.5] * len(b)


class _ByIndex(torch.nn.Module):
    """Scores every item by its index: item 2 lowest of the real items."""

    num_items = NUM_ITEMS
    config: dict = {}

    def forward(self, item, behavior, time_bucket, padding_mask, query_time_bucket=None):
        hidden = torch.ones(*item.shape, 1)
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)

    def score_items(self, query):
        scores = torch.arange(self.num_items, dtype=torch.float32).expand(len(query), -1)
        return scores + never_recommended(self.num_items)

    def rerank_scores(self, output, candidates):
        return candidates.float()  # the retrieval order


def test_sampled_metrics_rank_against_num_negatives_unseen_items_however_long_the_history():
    # each row has had 25 of the 28 real items; its target (item 2) scores below the other
    # two, so against 10 negatives drawn from those it ranks 11th. Negatives drawn from the
    # whole catalogue with the seen ones dropped would leave ~1 negative and rank it 1st-2nd.
    m = SeqRecModule(_ByIndex(), None, metric_ks=(10,), sampled_metrics={"num_negatives": 10})
    b = batch()
    b.target_item = torch.full((len(b),), 2)
    b.seen_item = torch.arange(5, NUM_ITEMS).expand(len(b), -1)
    metrics = m.eval().evaluation_metrics(b)
    assert metrics["sampled_hr_at_10"].tolist() == [0.0] * len(b)
    assert metrics["auc"].tolist() == [0.0] * len(b)


@pytest.mark.parametrize("sampler", ["uniform", "popularity"])
def test_a_user_who_has_had_every_other_item_is_ranked_against_history_negatives(sampler):
    # a small catalogue (or a popularity sampler whose only drawable items the user has had):
    # no unseen item is left to draw. The target (item 2) scores below every other item; it
    # used to rank 1st against no negative (sampled HR 1) while its AUC read 0
    counts = torch.zeros(NUM_ITEMS, dtype=torch.long)
    counts[[2, 5]] = 3  # popularity: only the target and a seen item can be drawn
    m = SeqRecModule(
        _ByIndex(),
        None,
        metric_ks=(1,),
        sampled_metrics={"num_negatives": 4, "sampler": sampler},
        item_counts=counts,
    )
    b = batch()
    b.target_item = torch.full((len(b),), 2)
    b.seen_item = torch.arange(3, NUM_ITEMS).expand(len(b), -1)  # every real item but 2
    metrics = m.eval().evaluation_metrics(b)
    assert metrics["sampled_hr_at_1"].tolist() == [0.0] * len(b)
    assert metrics["sampled_ndcg_at_1"].tolist() == [0.0] * len(b)
    assert metrics["auc"].tolist() == [0.0] * len(b)


@pytest.mark.parametrize("rerank_top_n", [0, 20])
def test_an_excluded_target_is_a_miss_at_cutoffs_beyond_the_catalogue(rerank_top_n):
    # 28 real items, cutoff 20: the user has had 25 of them, excluded (-inf), the target among
    # them; a list of 20 then ends in excluded items, which are no recommendation and no hit
    m = SeqRecModule(
        _ByIndex(), None, metric_ks=(20,), seen_items="exclude", rerank_top_n=rerank_top_n
    )
    b = batch()
    b.target_item = torch.full((len(b),), 7)
    b.seen_item = torch.arange(5, NUM_ITEMS).expand(len(b), -1)
    coverage = CoverageAccumulator(NUM_ITEMS, (20,))
    metrics = m.eval().evaluation_metrics(b, coverage)
    for name in ("hr_at_20", "ndcg_at_20", "mrr", "retrieval_hr_at_20", "retrieval_mrr"):
        assert metrics[name].tolist() == [0.0] * len(b), name
    assert coverage.compute() == {"coverage_at_20": 3 / 28}  # items 2, 3, 4


def test_a_missed_target_is_outside_a_cutoff_larger_than_the_catalogue():
    scores = torch.tensor([[-math.inf, -math.inf, 0.3, -math.inf]])
    ranks = target_ranks(scores, torch.tensor([3]))
    assert ranking_metrics(ranks, [10])["hr_at_10"].tolist() == [0.0]


def _counts_with_each_item_followed_by_its_next(window: int = 3) -> TransitionCounts:
    """Three users of items 2, 3, ..., in order: pairs up to ``window`` apart (the module's
    default ``transition_window``)."""
    item = torch.cat([torch.arange(2, NUM_ITEMS)] * 3).numpy()
    offsets = torch.tensor([0, NUM_ITEMS - 2, 2 * (NUM_ITEMS - 2), 3 * (NUM_ITEMS - 2)]).numpy()
    return TransitionCounts.from_sequences(
        item, offsets, offsets[1:] - offsets[:-1], NUM_ITEMS, window
    )


@pytest.mark.parametrize("policy", ["keep", "zero"])
def test_evaluation_ranks_the_model_scores_plus_the_transition_prior(policy):
    """training.transition_prior at the default shape: each row's ranking is by the encoder's
    score plus weight * sum_j 0.75^(j-1) log(1 + count(h_j -> item)) over the 3 most recent
    items, before the seen-item rule (which still scores 0)."""
    counts = _counts_with_each_item_followed_by_its_next()
    m = module(
        seen_items=policy, metric_ks=(1, 5), transition_prior=2.0, transition_counts=counts
    ).eval()
    b = batch()
    b.target_item = b.target_item[:, -1].clamp(min=2)
    b.target_behavior = b.target_behavior[:, -1]
    with torch.no_grad():
        raw = m.encoder.score_items(m(b).query)
        found = m.evaluation_metrics(b)
    fused = TransitionPrior(counts, 2.0, recent=3, decay=0.75).add_to(raw, b.item)
    assert not torch.equal(fused, raw)
    expected = apply_seen_policy(fused, b.item, policy)
    ranks = 1 + (expected > expected.gather(1, b.target_item[:, None])).sum(1)
    torch.testing.assert_close(found["retrieval_mrr"], 1 / ranks.float())


def test_transition_prior_auto_starts_at_weight_zero_and_is_saved_with_the_checkpoint():
    counts = _counts_with_each_item_followed_by_its_next()
    m = module(transition_prior="auto", transition_counts=counts)
    assert m.transition_prior.weight == 0.0
    saved = {}
    m.on_save_checkpoint(saved)
    plain = saved["recsys"]["transition_prior"]
    assert plain["weight"] == 0.0 and torch.equal(plain["count"], counts.count)
    assert copy.deepcopy(m).transition_prior is m.transition_prior  # weight averaging shares it


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"transition_prior": -1}, "must be null (off), auto"),
        ({"transition_prior": "yes"}, "must be null (off), auto"),
        ({"transition_prior": True}, "must be null (off), auto"),
        ({"transition_prior": 1.0, "rerank_top_n": 20}, "set one of them to 0/null"),
        ({"transition_prior": 1.0, "transition_counts": None}, "needs the training sequences"),
        ({"transition_prior": 1.0, "transition_window": 2}, "pairs up to 2 apart"),
        ({"transition_prior": 1.0, "transition_window": 1}, "pairs up to 1 apart"),
        ({"transition_window": 0}, "training.transition_window=0 must be a whole number"),
        ({"transition_recent": -1}, "training.transition_recent=-1 must be a whole number"),
        ({"transition_decay": 2}, "training.transition_decay=2 must be a number in (0, 1]"),
        ({"transition_prior": 1.0, "transition_recent": 10**6}, "=1000000 exceeds the"),
    ],
)
def test_bad_transition_prior_settings_name_the_option(kwargs, message):
    kwargs = {"transition_counts": _counts_with_each_item_followed_by_its_next(), **kwargs}
    with pytest.raises(ValueError, match=re_escape(message)):
        module(**kwargs)


def test_recent_items_beyond_the_input_window_are_refused_only_with_the_prior_on():
    """The prior reads its recent items from the model's input, so a transition_recent over
    max_seq_len was cut to it without a word; with the prior off the setting is unused."""
    counts = _counts_with_each_item_followed_by_its_next()
    width = encoder().config["max_seq_len"]
    module(transition_counts=counts, transition_recent=width + 1)  # off: nothing to refuse
    module(transition_counts=counts, transition_prior=1.0, transition_recent=width)
    with pytest.raises(ValueError, match=rf"exceeds the {width} events the model reads"):
        module(transition_counts=counts, transition_prior=1.0, transition_recent=width + 1)


def test_a_large_full_softmax_on_cpu_goes_in_chunks_with_the_same_loss_and_gradients(
    monkeypatch,
):
    """Logits over glibc's mmap threshold are made chunk by chunk on a CPU (each new block of
    that size is mapped and faulted in afresh); the loss and every gradient stay the same."""
    from recsys import allocation
    from recsys.training import module as module_code

    torch.manual_seed(0)
    items, rows, width = 50, 6, 8
    encoder = ATRank(
        num_items=items, num_attributes=4, num_behaviors=4, num_time_buckets=5,
        max_seq_len=width, d_model=8, num_heads=2, num_layers=1, dropout=0.0,
    )  # fmt: skip
    mask = torch.ones(rows, width, dtype=torch.bool)
    mask[0, :3] = False
    item = torch.randint(2, items, (rows, width)) * mask
    batch = SeqBatch(
        item=item,
        behavior=torch.randint(2, 4, (rows, width)) * mask,
        time_bucket=torch.randint(1, 5, (rows, width)) * mask,
        padding_mask=mask,
        query_time_bucket=torch.randint(1, 5, (rows, width)) * mask,
        target_item=torch.roll(item, -1, dims=1) * mask,
        target_behavior=torch.randint(2, 4, (rows, width)) * mask,
        user_index=torch.arange(rows),
    )
    module = SeqRecModule(
        encoder,
        partial(torch.optim.Adam, lr=1e-3),
        behaviors=["view", "purchase"],
        exclude_seen_from_loss=True,
        label_smoothing=0.1,
        behavior_weights={"view": 0.5, "purchase": 1.0},
    )
    calls = []
    score_items = encoder.score_items
    monkeypatch.setattr(
        encoder, "score_items", lambda q, keys=None: calls.append(len(q)) or score_items(q, keys)
    )

    def loss_and_grads():
        encoder.zero_grad()
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log outside a Trainer
            loss = module.training_step(batch, 0)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        return loss.detach(), grads

    whole, whole_grads = loss_and_grads()
    trained = int(module._trained_positions(batch).sum())
    assert calls == [trained] and trained * 4 * items > 1000 and trained % 10 and trained % 16

    def chunks(size):
        return [size] * (trained // size) + [trained % size]

    monkeypatch.setattr(allocation, "MMAP_THRESHOLD_MAX", 1000)
    monkeypatch.setattr(allocation, "CHUNK_BYTES", 10 * 4 * items)
    monkeypatch.setattr(module_code, "MIN_LOGIT_CHUNK_ROWS", 4)
    chunked, chunked_grads = loss_and_grads()
    assert calls == chunks(10)
    torch.testing.assert_close(chunked, whole)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, msg=name)
    monkeypatch.setattr(module_code, "MIN_LOGIT_CHUNK_ROWS", 16)  # a huge catalogue's floor
    loss_and_grads()
    assert calls == chunks(16)


@pytest.mark.parametrize(
    ("settings", "tables"),
    [
        ({}, 1),
        ({"label_smoothing": 0.1}, 2),
        ({"exclude_seen_from_loss": True}, 1),
        ({"distillation": True}, 3),
        ({"loss": "sampled_softmax"}, 0),
        ({"loss": "bce", "num_negatives": 1}, 0),
    ],
)
def test_the_step_memory_counts_the_catalogue_wide_scores_autograd_keeps(settings, tables):
    """What recsys.tasks.train refuses a training against: the (positions x items) float32
    tables the step keeps for its backward pass, exactly those autograd saves (never more, or a
    training that fits would be refused), none for the sampled losses."""
    from recsys.training.module import KEPT_SCORES, PARAMETERS

    items = 3000
    if settings.get("distillation"):
        teacher = encoder(num_items=items, seed_shift=1)
        settings = {"distillation": {"teachers": [teacher], "weight": 1.0}}
    m = module(encoder(num_items=items), **settings)
    b = batch()
    positions = int(m._trained_positions(b).sum())
    saved = {}

    def pack(tensor):
        if tensor.shape == (positions, items) and tensor.is_floating_point():
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        train_loss(m, b)
    parts = m.step_memory(len(b), positions, torch.device("cpu"))
    assert sum(saved.values()) == parts.get(KEPT_SCORES, 0) == tables * positions * items * 4
    weights = sum(p.numel() for p in m.parameters()) * 4
    assert parts[PARAMETERS] == 4 * weights  # with Adam's two moments


@pytest.mark.parametrize("loss", ["full_softmax", "sampled_softmax"])
def test_the_step_memory_counts_the_contrastive_loss_scores_autograd_keeps(loss):
    """The contrastive loss scores the 2M views of its M trained positions against each other:
    a (2M x 2M) table that grows with the batch, not the catalogue (a default batch's 6,400
    positions: 0.8 GiB with its mask), which the memory check left out. Counted as exactly
    what autograd saves: the float32 scores and the boolean mask of excluded pairs."""
    from recsys.training.module import CONTRASTIVE_SCORES

    negatives = {"num_negatives": 5} if loss == "sampled_softmax" else {}
    m = module(encoder(), loss=loss, contrastive_weight=0.5, **negatives)
    b = batch()
    positions = int(m._trained_positions(b).sum())
    saved = {}

    def pack(tensor):
        if tensor.shape == (2 * positions, 2 * positions):
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        train_loss(m, b)
    parts = m.step_memory(len(b), positions, torch.device("cpu"))
    assert sum(saved.values()) == parts[CONTRASTIVE_SCORES] == 5 * (2 * positions) ** 2
    assert CONTRASTIVE_SCORES not in module().step_memory(len(b), positions, torch.device("cpu"))


def test_the_step_memory_counts_the_chunk_of_scores_being_made():
    """On a CPU a large table of scores is made a chunk of rows at a time (256 at least), on an
    accelerator at once: beside the kept tables, the chunk's scores and their gradient."""
    from recsys.training.module import SCORE_CHUNK

    items = 100_000
    m = module(encoder(num_items=items, d_model=2, num_heads=1, attribute_dim=0))
    row = 4 * items
    assert m.step_memory(128, 6400, torch.device("cpu"))[SCORE_CHUNK] == 2 * 256 * row
    assert m.step_memory(128, 6400, torch.device("meta"))[SCORE_CHUNK] == 2 * 6400 * row
    assert m.step_memory(2, 10, torch.device("cpu"))[SCORE_CHUNK] == 2 * 10 * row
