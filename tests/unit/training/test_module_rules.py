"""Rules of the training module that its other tests leave open: accidental hits in the
sampled losses, the seen-item policy through the re-rank stage, sampled-metric negatives drawn
from unseen items, and schedules set in epochs under gradient accumulation."""

from __future__ import annotations

import dataclasses
import random
import warnings
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from recsys.data.batch import SeqBatch
from recsys.training.module import SeqRecModule
from tests.unit.training.test_fuzz_losses_metrics import random_batch
from tests.unit.training.test_module import _ByIndex as ByIndex

NUM_ITEMS = 30


class _ByIndex(ByIndex):
    """test_module's ``_ByIndex`` (retrieval scores every item by its index, item 2 lowest of
    the real items) whose target-attention head scores by minus the index, the reverse order."""

    def rerank_scores(self, output, candidates):
        return -candidates.float()


def eval_batch(target: int, seen: torch.Tensor, rows: int = 3) -> SeqBatch:
    item = torch.tensor([[0, 5, 6]]).expand(rows, -1)
    mask = item != 0
    return SeqBatch(
        item=item,
        behavior=mask.long() * 2,
        time_bucket=mask.long(),
        padding_mask=mask,
        query_time_bucket=mask.long(),
        target_item=torch.full((rows,), target),
        target_behavior=torch.full((rows,), 2),
        user_index=torch.arange(rows),
        seen_item=seen.expand(rows, -1),
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss": "sampled_softmax", "negative_sampler": "popularity"},
        {"loss": "bce"},
        {"loss": "gbce"},
    ],
)
def test_a_negative_equal_to_the_target_counts_as_if_it_were_not_drawn(kwargs):
    # row 0 drew its own target (item 7) as its first negative: the accidental hit must add
    # nothing, so the row's loss is that over its other two negatives
    counts = torch.arange(NUM_ITEMS).float()
    m = SeqRecModule(
        _ByIndex(), None, num_negatives=3, item_counts=counts, shared_negatives=False, **kwargs
    )
    positive = torch.tensor([1.0, 0.5])
    negatives = torch.tensor([[1.0, -0.5, 2.0], [0.3, 1.5, -1.0]])
    target = torch.tensor([7, 9])
    items = torch.tensor([[7, 4, 12], [3, 8, 20]])
    loss = m._sampled_loss(positive, negatives, target, items, None)
    row0 = m._sampled_loss(positive[:1], negatives[:1, 1:], target[:1], items[:1, 1:], None)
    row1 = m._sampled_loss(positive[1:], negatives[1:], target[1:], items[1:], None)
    torch.testing.assert_close(loss, (row0 + row1) / 2)


def test_the_sampled_softmax_corrects_the_target_and_the_negatives_by_log_q():
    # popularity sampler: q(i) = count(i) / sum; every score minus log q, the target included
    counts = torch.arange(NUM_ITEMS).float()
    counts[:2] = 0
    m = SeqRecModule(
        _ByIndex(), None, loss="sampled_softmax", negative_sampler="popularity",
        num_negatives=2, item_counts=counts, shared_negatives=False,
    )  # fmt: skip
    positive, negatives = torch.tensor([1.0]), torch.tensor([[0.5, 2.0]])
    target, items = torch.tensor([3]), torch.tensor([[20, 29]])
    log_q = (counts / counts.sum()).log()
    logits = torch.cat([positive - log_q[target], negatives[0] - log_q[items[0]]])
    expected = -torch.log_softmax(logits, dim=0)[0]
    loss = m._sampled_loss(positive, negatives, target, items, None)
    torch.testing.assert_close(loss, expected)


def test_seen_items_zero_keeps_the_rule_score_through_the_rerank_stage():
    # seen_items=zero scores the history 0; the re-rank head orders the rest by -index, all
    # below 0, so the seen target (item 29) must come first in the final list. Re-scored by
    # the head it would be last (-29).
    m = SeqRecModule(_ByIndex(), None, metric_ks=(1, 10), seen_items="zero", rerank_top_n=28)
    metrics = m.eval().evaluation_metrics(eval_batch(29, torch.tensor([[29]])))
    assert metrics["retrieval_hr_at_10"].tolist() == [0.0] * 3  # stage 1: 0 is the lowest
    assert metrics["hr_at_1"].tolist() == [1.0] * 3
    assert metrics["ndcg_at_10"].tolist() == [1.0] * 3


@pytest.mark.parametrize("target", [3, 7, 12])
@pytest.mark.parametrize("rerank_top_n", [19, 25])
def test_a_seen_target_tied_at_zero_wins_its_ties_through_the_rerank_stage(target, rerank_top_n):
    """seen_items=zero scores the history (items 3..12, the target among them) 0, below the
    18 unseen items, so ten items tie at 0 for rank 19: stage 1 ranks the target 19th (ties go
    to the target). The head of 19 (or 25) has room for one (or seven) of them, and re-ranked
    they keep their 0, above the head's other scores (-index). Which tied items entered the
    list, and in which order, was left to topk, so the target could miss a list that had room
    for it, or come after items it ties with (an audit's finding)."""
    m = SeqRecModule(
        _ByIndex(), None, metric_ks=(1, rerank_top_n), seen_items="zero", rerank_top_n=rerank_top_n
    )
    metrics = m.eval().evaluation_metrics(eval_batch(target, torch.arange(3, 13)[None, :]))
    assert metrics["retrieval_mrr"].tolist() == pytest.approx([1 / 19] * 3)
    assert metrics["hr_at_1"].tolist() == [1.0] * 3


def test_sampled_negatives_are_never_items_the_user_has_had():
    # the user has had items 2..19, all scoring below the target (item 20); the items they
    # have not had (21..29) all score above it. Negatives from the unseen items only: the
    # target is beaten by every one (AUC 0, rank 11 of 11); seen negatives would give AUC > 0.
    m = SeqRecModule(_ByIndex(), None, metric_ks=(10,), sampled_metrics={"num_negatives": 10})
    metrics = m.eval().evaluation_metrics(eval_batch(20, torch.arange(2, 20)[None, :]))
    assert metrics["auc"].tolist() == [0.0] * 3
    assert metrics["sampled_hr_at_10"].tolist() == [0.0] * 3


@pytest.mark.parametrize(("batches", "accumulate", "expected"), [(5, 1, 5), (5, 2, 3), (8, 4, 2)])
def test_a_schedule_set_in_epochs_counts_optimizer_steps_not_batches(batches, accumulate, expected):
    seen = {}

    def scheduler(optimizer, *, steps_per_epoch):
        seen["steps_per_epoch"] = steps_per_epoch
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    class _Tiny(_ByIndex):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

    m = SeqRecModule(_Tiny(), partial(torch.optim.SGD, lr=0.1), scheduler)
    m.trainer = SimpleNamespace(
        estimated_stepping_batches=None,
        num_training_batches=batches,
        accumulate_grad_batches=accumulate,
    )
    config = m.configure_optimizers()
    assert seen["steps_per_epoch"] == expected
    assert config["lr_scheduler"]["interval"] == "step"


def atrank_eval_batch(rows: int = 7) -> SeqBatch:
    """test_fuzz_losses_metrics' random batch as an evaluation batch: one real target per row,
    user rows from 10, and a history of 9 items beyond the window."""
    g = torch.Generator().manual_seed(5)
    batch = random_batch(random.Random(5), g, NUM_ITEMS, rows, 6)
    return dataclasses.replace(
        batch,
        target_item=torch.randint(2, NUM_ITEMS, (rows,), generator=g),
        target_behavior=torch.full((rows,), 2),
        user_index=torch.arange(10, 10 + rows),
        seen_item=torch.randint(2, NUM_ITEMS, (rows, 9), generator=g),
    )


@pytest.mark.parametrize("seen_items", ["keep", "zero", "exclude"])
def test_evaluation_in_chunks_of_rows_gives_every_rows_metrics_and_coverage(
    monkeypatch, seen_items
):
    """A large catalogue's (rows x items) tables are made a chunk of rows at a time; every
    metric (two-stage, sampled, AUC) and the coverage stay those of the whole batch."""
    from recsys.training import module as module_code
    from recsys.training.metrics import CoverageAccumulator
    from tests.unit.training.test_module import encoder

    m = SeqRecModule(
        encoder(num_items=NUM_ITEMS),
        None,
        behaviors=["view", "cart", "purchase"],
        metric_ks=(1, 5),
        seen_items=seen_items,
        rerank_top_n=6,
        sampled_metrics={"num_negatives": 8, "sampler": "uniform"},
    ).eval()
    batch = atrank_eval_batch()

    def metrics():
        coverage = CoverageAccumulator(NUM_ITEMS, m.metric_ks)
        with torch.no_grad():
            return m.evaluation_metrics(batch, coverage), coverage.compute()

    whole, whole_coverage = metrics()
    widths = []
    score_items = m.encoder.score_items
    monkeypatch.setattr(
        m.encoder, "score_items", lambda q, keys=None: widths.append(len(q)) or score_items(q)
    )
    monkeypatch.setattr(module_code, "table_chunk_length", lambda rows, *a, **k: 3)
    chunked, chunked_coverage = metrics()
    assert widths[:3] == [3, 3, 1]  # stage 1 scored the catalogue for 3, 3 and 1 rows
    assert chunked.keys() == whole.keys() and {"auc", "sampled_ndcg_at_5", "mrr"} <= whole.keys()
    for name, value in whole.items():
        torch.testing.assert_close(chunked[name], value, msg=name)
    assert chunked_coverage == whole_coverage


def test_a_rows_sampled_negatives_do_not_depend_on_the_rest_of_its_batch():
    """Each row's negatives come from a generator of its own (its user row and target), so a
    model is evaluated against the same negatives whatever the batch size or row order."""
    from tests.unit.training.test_module import encoder

    m = SeqRecModule(
        encoder(num_items=NUM_ITEMS),
        None,
        behaviors=["view", "cart", "purchase"],
        metric_ks=(5,),
        sampled_metrics={"num_negatives": 5, "sampler": "popularity"},
        item_counts=torch.arange(NUM_ITEMS),
    ).eval()
    batch = atrank_eval_batch()
    order = torch.tensor([4, 0, 6, 2, 1, 5, 3])
    with torch.no_grad():
        whole = m.evaluation_metrics(batch)
        shuffled = m.evaluation_metrics(batch.rows(order))
        halves = [m.evaluation_metrics(batch.rows(slice(a, b))) for a, b in [(0, 2), (2, 7)]]
    for name in ("auc", "sampled_hr_at_5", "sampled_ndcg_at_5"):
        torch.testing.assert_close(shuffled[name], whole[name][order], msg=name)
        torch.testing.assert_close(torch.cat([h[name] for h in halves]), whole[name], msg=name)
    assert 0 < whole["auc"].mean() < 1  # the comparison is not degenerate


@pytest.mark.parametrize("shared", [True, False])
def test_the_target_attention_objective_draws_negatives_as_shared_negatives_says(shared):
    """training.shared_negatives was accepted and ignored under objective=target_attention,
    which always drew a set per row (an audit's finding)."""
    from tests.unit.training.test_module import encoder

    m = SeqRecModule(
        encoder(num_items=NUM_ITEMS),
        None,
        behaviors=["view", "cart", "purchase"],
        objective="target_attention",
        loss="bce",
        num_negatives=4,
        shared_negatives=shared,
    )
    drawn = []
    sample = m.sampler.sample
    m.sampler.sample = lambda shape, **kw: drawn.append(tuple(shape)) or sample(shape, **kw)
    batch = random_batch(random.Random(3), torch.Generator().manual_seed(3), NUM_ITEMS, 5, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        loss = m.training_step(batch, 0)
    assert drawn == [(4,) if shared else (5, 4)]
    assert torch.isfinite(loss) and loss > 0
