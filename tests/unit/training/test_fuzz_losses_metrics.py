"""Differential fuzz of the training losses, the module's per-position training and the
evaluation metrics against naive references written from the README / docstrings (plain
Python loops over rows, positions and items). Fixed seeds: every failure is reproducible
with its seed. Three tests pin the bugs this fuzz found (fixed)."""

from __future__ import annotations

import math
import random
import warnings
from functools import partial

import pytest
import torch
from torch import nn

from recsys import allocation
from recsys.data.batch import SeqBatch
from recsys.model import ATRank
from recsys.model.outputs import EncoderOutput
from recsys.model.sasrec import SASRec
from recsys.training import losses as L
from recsys.training import module as module_code
from recsys.training.metrics import CoverageAccumulator
from recsys.training.module import SeqRecModule, earlier_items

BEH = ["view", "cart", "purchase"]  # behaviour indices 2, 3, 4
INF = math.inf


# -- naive references ------------------------------------------------------------------------
def lse(xs):
    xs = [x for x in xs if x != -INF]
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def logsig(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def wmean(per, w):
    if not per:
        return 0.0
    if w is None:
        return sum(per) / len(per)
    return sum(p * x for p, x in zip(per, w)) / sum(w) if sum(w) > 0 else 0.0


def ref_full(row, target, eps):
    z = lse(row)
    nll = z - row[target]
    if eps:
        finite = [x for x in row if x != -INF]
        nll = (1 - eps) * nll + eps * sum(z - x for x in finite) / len(finite)
    return nll


def ref_sampled(kind, sp, sn, tg, negs, q, beta):
    """One row of sampled_softmax (logQ) / bce / gbce; negatives equal to the target dropped."""
    kept = [k for k in range(len(negs)) if negs[k] != tg]
    if kind == "sampled_softmax":
        xs = [sp - math.log(q(tg))] + [sn[k] - math.log(q(negs[k])) for k in kept]
        return lse(xs) - xs[0]
    return -beta * logsig(sp) + sum(-logsig(-sn[k]) for k in kept)


def ref_beta(k, real_items, t):
    a = k / (real_items - 1)
    return a * (t * (1 - 1 / a) + 1 / a)


def quiet_step(m, batch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m.training_step(batch, 0)


# -- (A) the loss functions -------------------------------------------------------------------
@pytest.mark.parametrize("chunk", range(3))
def test_losses_match_naive_references(chunk):
    for seed in range(chunk * 100, chunk * 100 + 100):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        m_rows, items = rng.randint(0, 6), rng.randint(4, 12)
        logits = torch.randn(m_rows, items, generator=g) * rng.choice([0.1, 1, 5])
        logits[:, :2] = -INF  # PAD, UNK
        target = torch.randint(2, items, (m_rows,), generator=g)
        if rng.random() < 0.3:
            logits[:, 3] = logits[:, 2]  # ties
        for r in range(m_rows):  # excluded (seen) items, never the target
            for j in range(2, items):
                if j != target[r] and rng.random() < 0.2:
                    logits[r, j] = -INF
        weight = (
            None
            if rng.random() < 0.4
            else torch.tensor([rng.choice([0, 0.3, 1, 2.0]) for _ in range(m_rows)])
        )
        wl = None if weight is None else weight.tolist()
        eps = rng.choice([0, 0, 0.1, 0.5])
        got = float(L.full_softmax(logits, target, weight, eps))
        exp = wmean([ref_full(logits[r].tolist(), int(target[r]), eps) for r in range(m_rows)], wl)
        assert math.isclose(got, exp, rel_tol=1e-4, abs_tol=1e-5), ("full_softmax", seed)

        k, shared = rng.randint(1, 6), rng.random() < 0.5
        pos = torch.randn(m_rows, generator=g) * 2
        neg = torch.randn(m_rows, k, generator=g) * 2
        drawn = torch.randint(2, items, (k,) if shared else (m_rows, k), generator=g)
        if m_rows and rng.random() < 0.5:  # accidental hits and duplicate negatives
            if shared:
                drawn[0] = target[0]
                drawn[-1] = drawn[0]
            else:
                drawn[:, 0] = target
                drawn[:, -1] = drawn[:, 0]
        full = drawn.expand(m_rows, k) if shared else drawn
        accidental = full == target[:, None]
        counts = torch.tensor([0, 0] + [rng.randint(1, 20) for _ in range(items - 2)])
        kind = rng.choice(["uniform", "popularity"])
        sampler = L.NegativeSampler(items, kind, counts)
        total = counts.sum().item()

        def q(j, kind=kind, counts=counts, total=total, items=items):
            return 1 / (items - 2) if kind == "uniform" else counts[j].item() / total

        got = float(
            L.sampled_softmax(
                pos,
                neg,
                log_q_positive=sampler.log_q(target),
                log_q_negatives=sampler.log_q(drawn),
                accidental=accidental,
                weight=weight,
            )
        )
        per = [
            ref_sampled(
                "sampled_softmax",
                pos[r].item(),
                neg[r].tolist(),
                int(target[r]),
                full[r].tolist(),
                q,
                1.0,
            )
            for r in range(m_rows)
        ]
        assert math.isclose(got, wmean(per, wl), rel_tol=1e-4, abs_tol=1e-4), ("ssm", seed)

        t = rng.choice([0, 0.5, 0.75, 1.0])
        kk = rng.randint(1, items - 3)
        beta = L.gbce_beta(num_negatives=kk, num_items=items - 2, t=t)
        assert math.isclose(beta, ref_beta(kk, items - 2, t), rel_tol=1e-9)
        got = float(L.bce(pos, neg, accidental=accidental, weight=weight, beta=beta))
        per = [
            ref_sampled(
                "bce", pos[r].item(), neg[r].tolist(), int(target[r]), full[r].tolist(), q, beta
            )
            for r in range(m_rows)
        ]
        assert math.isclose(got, wmean(per, wl), rel_tol=1e-4, abs_tol=1e-4), ("bce", seed)


# -- (A) the module's training step -----------------------------------------------------------
def random_batch(rng, g, items, rows, width):
    lengths = [rng.randint(1, width) for _ in range(rows)]
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, width - n :] = True
    item = torch.randint(2, items, (rows, width), generator=g)
    item = torch.where(torch.rand(rows, width, generator=g) < 0.1, 1, item) * mask  # UNK inputs
    target = torch.randint(2, items, (rows, width), generator=g)
    r = torch.rand(rows, width, generator=g)
    target = torch.where(r < 0.15, 1, target)  # UNK targets
    target = torch.where((r > 0.8) & (item > 1), item, target) * mask  # repeats
    return SeqBatch(
        item=item,
        behavior=torch.randint(2, 5, (rows, width), generator=g) * mask,
        time_bucket=torch.randint(1, 6, (rows, width), generator=g) * mask,
        padding_mask=mask,
        query_time_bucket=torch.randint(1, 6, (rows, width), generator=g) * mask,
        target_item=target,
        target_behavior=torch.randint(2, 5, (rows, width), generator=g) * mask,
        user_index=torch.arange(rows),
    )


def random_weights(rng):
    if rng.random() < 0.5:
        return None
    weights = {n: rng.choice([0, 0.3, 1.0]) for n in BEH if rng.random() < 0.8}
    if not any(weights.values()):
        weights["purchase"] = 1.0
    return weights


def weight_of(weights, behavior):
    if behavior < 2:
        return 0.0
    return 1.0 if weights is None else weights.get(BEH[behavior - 2], 0.0)


def recording_sampler(m):
    drawn, original = [], m.sampler.sample

    def sample(shape, generator=None, device="cpu"):
        drawn.append(original(shape, generator=generator, device=device))
        return drawn[-1]

    m.sampler.sample = sample
    return drawn


def tiny_atrank(items: int, width: int, causal: bool) -> ATRank:
    return ATRank(
        num_items=items,
        num_attributes=5,
        num_behaviors=5,
        num_time_buckets=6,
        max_seq_len=width,
        d_model=8,
        num_heads=2,
        num_layers=1,
        dropout=0.0,
        causal=causal,
    )


@pytest.mark.parametrize("logit_chunks", [False, True], ids=["one_logit_table", "logit_chunks"])
@pytest.mark.parametrize("chunk", range(2))
def test_training_step_matches_a_per_position_reference(chunk, logit_chunks, monkeypatch):
    """Retrieval objective: which positions are trained (padding, UNK targets, causal vs last
    position, behaviour weights), exclude_seen_from_loss, label smoothing, sampled losses with
    the negatives actually drawn (shared or per target, uniform or popularity with logQ); with
    ``logit_chunks`` the full softmax's logits go in chunks of one to three rows, as a CPU run
    makes them when they exceed glibc's mmap threshold."""
    if logit_chunks:
        monkeypatch.setattr(allocation, "MMAP_THRESHOLD_MAX", 0)
        monkeypatch.setattr(allocation, "CHUNK_BYTES", 4 * 15 * (1 + chunk * 2))
        monkeypatch.setattr(module_code, "MIN_LOGIT_CHUNK_ROWS", 1)
    checked = 0
    for seed in range(chunk * 60, chunk * 60 + 60):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        items, rows, width = rng.randint(6, 15), rng.randint(1, 4), rng.randint(1, 5)
        causal = rng.random() < 0.7
        if rng.random() < 0.5 or not causal:
            enc = tiny_atrank(items, width, causal)
        else:
            enc = SASRec(
                num_items=items,
                max_seq_len=width,
                d_model=8,
                num_heads=2,
                num_layers=1,
                dropout=0.0,
            )
        loss = rng.choice(["full_softmax", "sampled_softmax", "bce", "gbce"])
        kw = {"loss": loss}
        weights = random_weights(rng)
        if weights:
            kw["behavior_weights"] = weights
        if loss == "full_softmax":
            kw["exclude_seen_from_loss"] = rng.random() < 0.5
            kw["label_smoothing"] = rng.choice([0, 0, 0.2])
        else:
            kw.update(
                num_negatives=rng.randint(1, items - 3),
                gbce_t=rng.choice([0, 0.75, 1.0]),
                shared_negatives=rng.random() < 0.5,
                negative_sampler=rng.choice(["uniform", "popularity"]),
            )
        counts = torch.tensor([0, 0] + [rng.randint(1, 9) for _ in range(items - 2)])
        m = SeqRecModule(
            enc, partial(torch.optim.Adam, lr=1e-3), behaviors=BEH, item_counts=counts, **kw
        )
        batch = random_batch(rng, g, items, rows, width)
        trained_any = any(
            int(batch.target_item[b, t]) > 1
            and (causal or t == width - 1)
            and weight_of(weights, int(batch.target_behavior[b, t])) > 0
            for b in range(rows)
            for t in range(width)
        )
        if (
            kw.get("negative_sampler") == "popularity"
            and not kw["shared_negatives"]
            and not trained_any
        ):
            continue  # test_popularity_per_target_negatives_with_no_trained_position
        drawn = recording_sampler(m)
        got = float(quiet_step(m, batch))
        total = counts.sum().item()

        def q(j, kw=kw, items=items, counts=counts, total=total):
            if kw.get("negative_sampler") == "uniform":
                return 1 / (items - 2)
            return counts[j].item() / total

        per, w, row_index = [], [], 0
        with torch.no_grad():
            out = enc(*batch.model_inputs())
            for b in range(rows):
                for t in range(width):
                    tg = int(batch.target_item[b, t])
                    wt = weight_of(weights, int(batch.target_behavior[b, t]))
                    if tg <= 1 or (not causal and t != width - 1) or wt == 0:
                        continue
                    h = out.hidden[b, t][None]
                    if loss == "full_softmax":
                        s = enc.score_items(h)[0].tolist()
                        if kw["exclude_seen_from_loss"]:
                            for u in range(t + 1):
                                it = int(batch.item[b, u])
                                if batch.padding_mask[b, u] and it > 1 and it != tg:
                                    s[it] = -INF
                        per.append(ref_full(s, tg, kw["label_smoothing"]))
                    else:
                        negs = (
                            drawn[0] if kw["shared_negatives"] else drawn[0][row_index]
                        ).tolist()
                        sp = enc.score_candidates(h, torch.tensor([[tg]]))[0, 0].item()
                        sn = enc.score_candidates(h, torch.tensor([negs]))[0].tolist()
                        beta = (
                            ref_beta(kw["num_negatives"], items - 2, kw["gbce_t"])
                            if loss == "gbce"
                            else 1.0
                        )
                        per.append(ref_sampled(loss, sp, sn, tg, negs, q, beta))
                    row_index += 1
                    w.append(wt)
        exp = wmean(per, w)
        assert math.isclose(got, exp, rel_tol=2e-4, abs_tol=2e-4), (seed, kw, got, exp)
        checked += 1
    assert checked > 50


def test_target_attention_objective_matches_reference():
    for seed in range(60):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        items, rows, width = rng.randint(6, 15), rng.randint(1, 4), rng.randint(1, 5)
        causal = rng.random() < 0.5
        enc = tiny_atrank(items, width, causal)
        loss = rng.choice(["sampled_softmax", "bce", "gbce"])
        kw = dict(
            loss=loss,
            objective="target_attention",
            num_negatives=rng.randint(1, items - 3),
            negative_sampler=rng.choice(["uniform", "popularity"]),
            gbce_t=rng.choice([0, 0.75, 1.0]),
            shared_negatives=rng.random() < 0.5,  # one set for the batch, or one per row
        )
        weights = random_weights(rng)
        if weights:
            kw["behavior_weights"] = weights
        counts = torch.tensor([0, 0] + [rng.randint(1, 9) for _ in range(items - 2)])
        m = SeqRecModule(
            enc, partial(torch.optim.Adam, lr=1e-3), behaviors=BEH, item_counts=counts, **kw
        )
        batch = random_batch(rng, g, items, rows, width)
        drawn = recording_sampler(m)
        got = float(quiet_step(m, batch))
        total = counts.sum().item()

        def q(j, kw=kw, items=items, counts=counts, total=total):
            if kw["negative_sampler"] == "uniform":
                return 1 / (items - 2)
            return counts[j].item() / total

        per, w = [], []
        with torch.no_grad():
            out = enc(*batch.model_inputs())
            for b in range(rows):
                tg = int(batch.target_item[b, -1])
                wt = weight_of(weights, int(batch.target_behavior[b, -1]))
                if tg <= 1 or wt == 0:
                    continue
                negs = (drawn[0] if kw["shared_negatives"] else drawn[0][b]).tolist()
                scores = enc.rerank_scores(out, torch.tensor([[tg] + negs] * rows))[b].tolist()
                beta = (
                    ref_beta(kw["num_negatives"], items - 2, kw["gbce_t"])
                    if loss == "gbce"
                    else 1.0
                )
                per.append(ref_sampled(loss, scores[0], scores[1:], tg, negs, q, beta))
                w.append(wt)
        assert math.isclose(got, wmean(per, w), rel_tol=2e-4, abs_tol=2e-4), (seed, kw)


def test_input_mask_changes_only_real_input_items():
    for seed in range(40):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        batch = random_batch(rng, g, 12, 4, 5)
        enc = SASRec(num_items=12, max_seq_len=5, d_model=8, num_heads=2, num_layers=1, dropout=0.0)
        m = SeqRecModule(enc, partial(torch.optim.Adam, lr=1e-3), input_mask_prob=0.5)
        masked = m._mask_inputs(batch)
        changed = masked.item != batch.item
        assert not (changed & ~batch.padding_mask).any()
        assert (masked.item[changed] == 1).all()
        for name in ("target_item", "target_behavior", "behavior", "padding_mask"):
            assert torch.equal(getattr(masked, name), getattr(batch, name))


# -- (B) evaluation metrics -------------------------------------------------------------------
class FixedScores(nn.Module):
    """An encoder stub whose row b scores the catalogue as S[b] (and re-ranks by R[b])."""

    def __init__(self, scores, rerank=None):
        super().__init__()
        self.S, self.R = scores, rerank
        self.num_items = scores.shape[1]
        self.causal = True
        self.config = {"num_items": self.num_items, "max_seq_len": 4}
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, item, behavior, time_bucket, mask, query_time_bucket):
        rows = item.shape[0]
        q = torch.arange(rows, dtype=torch.float32)[:, None]
        return EncoderOutput(
            hidden=q[:, None, :].expand(rows, item.shape[1], 1), query=q, padding_mask=mask
        )

    def score_items(self, q, keys=None):
        return self.S[q[:, 0].long()].clone()

    def score_candidates(self, q, items):
        return self.S[q[:, 0].long()[:, None], items]

    def rerank_scores(self, output, candidates):
        return self.R[output.query[:, 0].long()[:, None], candidates]


def eval_batch(g, target, hist, width=3):
    rows = len(hist)
    seen = torch.zeros(rows, max(1, max(len(h) for h in hist)), dtype=torch.long)
    for b, h in enumerate(hist):
        seen[b, : len(h)] = torch.tensor(h, dtype=torch.long)
    ones = torch.ones(rows, width, dtype=torch.long)
    return SeqBatch(
        item=ones * 2,
        behavior=ones * 2,
        time_bucket=ones,
        padding_mask=torch.ones(rows, width, dtype=torch.bool),
        query_time_bucket=ones,
        target_item=target,
        target_behavior=torch.full((rows,), 2),
        user_index=torch.arange(rows) * 3 + int(torch.randint(0, 50, (1,), generator=g)),
        seen_item=seen,
    )


def ruled(row, seen, policy):
    row = list(row)
    for j in seen:
        if policy != "keep":
            row[j] = -INF if policy == "exclude" else 0.0
    return row


@pytest.mark.parametrize("chunk", range(2))
def test_full_rank_sampled_metrics_auc_and_coverage_match_brute_force(chunk, monkeypatch):
    """Ties (rounded scores) go to the target: rank = 1 + #strictly higher; seen policy
    keep/exclude/zero over the whole history (repeats of the target included); sampled
    negatives never seen nor the target, ranks and AUC (ties 1/2) from those negatives;
    coverage within the bounds any tie order allows."""
    captured = {}
    original = module_code.sampled_ranks

    def capture(scores, target, negatives, valid):
        captured.update(negatives=negatives.clone(), valid=valid.clone())
        return original(scores, target, negatives, valid)

    monkeypatch.setattr(module_code, "sampled_ranks", capture)
    for seed in range(chunk * 150, chunk * 150 + 150):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        items, rows = rng.randint(4, 40), rng.randint(1, 6)
        scores = torch.randn(rows, items, generator=g)
        if rng.random() < 0.5:
            scores = (scores * rng.choice([1, 2, 3])).round()
        if rng.random() < 0.2:
            scores = -scores.abs()
        scores[:, :2] = -INF
        target = torch.tensor([rng.randrange(2, items) for _ in range(rows)])
        hist = []
        for b in range(rows):
            h = [rng.randrange(2, items) for _ in range(rng.randint(0, items))]
            if rng.random() < 0.3:
                h.append(int(target[b]))
            hist.append(h)
        policy = rng.choice(["keep", "exclude", "zero"])
        ks = sorted(set(rng.sample([1, 2, 3, 5, 10, 20, 50], rng.randint(1, 3))))
        sampled = (
            {
                "num_negatives": rng.randint(1, items - 3),
                "sampler": rng.choice(["uniform", "popularity"]),
            }
            if items >= 5 and rng.random() < 0.6
            else None
        )
        counts = torch.tensor([0, 0] + [rng.randint(0, 5) for _ in range(items - 3)] + [1])
        m = SeqRecModule(
            FixedScores(scores),
            None,
            metric_ks=ks,
            seen_items=policy,
            sampled_metrics=sampled,
            item_counts=counts,
        )
        coverage = CoverageAccumulator(items, ks)
        captured.clear()
        values = m.evaluation_metrics(eval_batch(g, target, hist), coverage)
        sure = {k: set() for k in ks}
        maybe = {k: set() for k in ks}
        for b in range(rows):
            seen = {j for j in hist[b] if j >= 2}
            s = ruled(scores[b].tolist(), seen, policy)
            tg = int(target[b])
            rank = None if s[tg] == -INF else 1 + sum(x > s[tg] for x in s)
            exp = {"mrr": 0.0 if rank is None else 1 / rank}
            for k in ks:
                inside = rank is not None and rank <= k
                exp[f"hr_at_{k}"] = float(inside)
                exp[f"ndcg_at_{k}"] = 1 / math.log2(rank + 1) if inside else 0.0
                exp[f"mrr_at_{k}"] = 1 / rank if inside else 0.0
            for name, value in exp.items():
                for prefix in ("", "retrieval_"):
                    got = values[prefix + name][b].item()
                    assert math.isclose(got, value, rel_tol=1e-5, abs_tol=1e-6), (
                        seed,
                        b,
                        policy,
                        prefix + name,
                        got,
                        value,
                    )
            for k in ks:
                for j in range(2, items):
                    if s[j] == -INF:
                        continue
                    higher = sum(y > s[j] for y in s)
                    if higher + sum(y == s[j] for y in s) <= k:
                        sure[k].add(j)
                    if higher < k:
                        maybe[k].add(j)
            if sampled is None:
                continue
            raw = scores[b].tolist()
            allowed = [
                j
                for j in range(2, items)
                if j not in seen and j != tg and (sampled["sampler"] == "uniform" or counts[j] > 0)
            ]
            if not allowed:  # nothing unseen to draw: the other items, history included
                allowed = [
                    j
                    for j in range(2, items)
                    if j != tg and (sampled["sampler"] == "uniform" or counts[j] > 0)
                ] or [j for j in range(2, items) if j != tg]
            negs = captured["negatives"][b].tolist()
            assert all(captured["valid"][b].tolist()) and set(negs) <= set(allowed), seed
            higher = sum(raw[j] > raw[tg] for j in negs)
            ties = sum(raw[j] == raw[tg] for j in negs)
            srank = 1 + higher
            for k in ks:
                assert values[f"sampled_hr_at_{k}"][b].item() == float(srank <= k), seed
                assert math.isclose(
                    values[f"sampled_ndcg_at_{k}"][b].item(),
                    1 / math.log2(srank + 1) if srank <= k else 0.0,
                    abs_tol=1e-6,
                ), seed
            auc = (len(negs) - higher - ties + 0.5 * ties) / len(negs)
            assert math.isclose(values["auc"][b].item(), auc, abs_tol=1e-6), seed
        for k, share in coverage.compute().items():
            k = int(k.rsplit("_", 1)[1])
            lo, hi = len(sure[k]) / (items - 2), len(maybe[k]) / (items - 2)
            assert lo - 1e-9 <= share <= hi + 1e-9, (seed, k, policy)


def test_two_stage_list_position_matches_reference():
    """With a re-rank stage the unprefixed metrics are the target's position in the list: the
    retrieval top max(K, N), the first N re-ordered by the re-rank score (excluded items and,
    under zero, seen items keep their stage-1 score); the uncut mrr stays stage 1's."""
    for seed in range(250):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        items, rows = rng.randint(4, 30), rng.randint(1, 5)
        scores = torch.randn(rows, items, generator=g)
        rerank = torch.randn(rows, items, generator=g)
        if rng.random() < 0.3:
            scores = -scores.abs()
        scores[:, :2] = -INF
        target = torch.tensor([rng.randrange(2, items) for _ in range(rows)])
        hist = [
            [rng.randrange(2, items) for _ in range(rng.randint(0, items))]
            + ([int(target[b])] if rng.random() < 0.3 else [])
            for b in range(rows)
        ]
        policy = rng.choice(["keep", "exclude", "zero"])
        n = rng.randint(1, items + 3)
        ks = sorted({k for k in rng.sample([1, 2, 3, 5, 10], rng.randint(1, 3)) if k <= n}) or [n]
        m = SeqRecModule(
            FixedScores(scores, rerank), None, metric_ks=ks, seen_items=policy, rerank_top_n=n
        )
        values = m.evaluation_metrics(eval_batch(g, target, hist))
        for b in range(rows):
            seen = set(hist[b])
            s = ruled(scores[b].tolist(), seen, policy)
            tg = int(target[b])
            outcomes = set()
            for _ in range(30):  # any order of tied items (the zero rule's 0s) is allowed
                tie = [rng.random() for _ in range(items)]
                order = sorted(range(items), key=lambda j: (-s[j], tie[j]))
                depth = min(max(max(ks), n), items)
                top = order[:depth]
                head_n = min(n, depth)

                def head_score(j, b=b, s=s, seen=seen, policy=policy, rerank=rerank):
                    if s[j] == -INF or (policy == "zero" and j in seen):
                        return s[j]
                    return rerank[b, j].item()

                head = sorted(top[:head_n], key=lambda j: (-head_score(j), tie[j]))
                listed = [j if s[j] != -INF else 0 for j in head + top[head_n:]]
                rank = listed.index(tg) + 1 if tg in listed else None
                outcomes.add(tuple(float(rank is not None and rank <= k) for k in ks))
            got = tuple(values[f"hr_at_{k}"][b].item() for k in ks)
            assert got in outcomes, (seed, b, policy, n, ks, got, outcomes)
            stage1 = None if s[tg] == -INF else 1 + sum(x > s[tg] for x in s)
            assert math.isclose(
                values["mrr"][b].item(), 0 if stage1 is None else 1 / stage1, abs_tol=1e-6
            )


# -- bugs this fuzz found (fixed) -------------------------------------
def _one_row(target_item, target_behavior):
    t = lambda v: torch.tensor([v])  # noqa: E731
    return SeqBatch(
        item=t([0, 3, 4]),
        behavior=t([0, 2, 2]),
        time_bucket=t([0, 1, 1]),
        padding_mask=t([False, True, True]),
        query_time_bucket=t([0, 1, 1]),
        target_item=t(target_item),
        target_behavior=t(target_behavior),
        user_index=torch.tensor([0]),
    )


def test_popularity_per_target_negatives_with_no_trained_position():
    """losses' docstring: with no row the loss is 0 (the uniform sampler gives 0 here)."""
    enc = SASRec(num_items=10, max_seq_len=3, d_model=8, num_heads=2, num_layers=1, dropout=0.0)
    m = SeqRecModule(
        enc,
        partial(torch.optim.Adam, lr=1e-3),
        loss="sampled_softmax",
        num_negatives=3,
        shared_negatives=False,
        negative_sampler="popularity",
        behaviors=["view", "purchase"],
        item_counts=torch.tensor([0, 0] + [1] * 8),
        behavior_weights={"purchase": 1.0},
    )
    assert float(quiet_step(m, _one_row([0, 4, 5], [0, 2, 2]))) == 0.0


def test_rerank_loss_is_zero_not_nan_without_a_valid_last_target():
    torch.manual_seed(0)
    enc = ATRank(
        num_items=10,
        num_attributes=5,
        num_behaviors=4,
        num_time_buckets=6,
        max_seq_len=3,
        d_model=8,
        num_heads=2,
        num_layers=1,
        dropout=0.0,
    )
    m = SeqRecModule(
        enc,
        partial(torch.optim.Adam, lr=1e-3),
        behaviors=["view", "purchase"],
        rerank_top_n=5,
        rerank_loss_weight=0.5,
        metric_ks=[5],
    )
    loss = quiet_step(m, _one_row([0, 4, 1], [0, 2, 2]))  # the last target is UNK
    assert torch.isfinite(loss)


def test_exclude_seen_from_loss_is_untouched_by_the_input_mask():
    torch.manual_seed(0)
    enc = SASRec(num_items=10, max_seq_len=3, d_model=8, num_heads=2, num_layers=1, dropout=0.0)
    m = SeqRecModule(
        enc, partial(torch.optim.Adam, lr=1e-3), exclude_seen_from_loss=True, input_mask_prob=0.99
    )
    t = lambda v: torch.tensor([v])  # noqa: E731
    batch = SeqBatch(
        item=t([3, 4, 5]),
        behavior=t([2, 2, 2]),
        time_bucket=t([1, 1, 1]),
        padding_mask=t([True, True, True]),
        query_time_bucket=t([1, 1, 1]),
        target_item=t([4, 5, 6]),
        target_behavior=t([2, 2, 2]),
        user_index=torch.tensor([0]),
    )
    captured = []
    original = module_code.exclude_items
    module_code.exclude_items = lambda s, i: captured.append(i) or original(s, i)
    try:
        quiet_step(m, batch)
    finally:
        module_code.exclude_items = original
    assert (
        captured[0][-1].tolist() == earlier_items(batch, m._trained_positions(batch))[-1].tolist()
    )
