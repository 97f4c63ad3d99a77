"""Differential fuzz of the ways a model leaves the framework, against ``recommend_frame``:

- the serving export (``export_model`` -> ``load_exported``; the TorchScript encoder read back
  with ``torch.jit.load`` alone), fed raw events turned into inputs with ``vocab.json`` only,
  with exclusion and allow / deny lists applied on top of its scores, ranks the same items with
  the same scores as the model rows of ``recommend_frame`` (ATRank with and without a trained
  re-rank head, served as ``rerank_top_n=0``; SASRec; a transition prior on either; histories
  longer than ``max_seq_len``; items unknown to the model; ``as_of``; time-bucket settings);
- a checkpoint saved and loaded again scores identically, and the export's metadata is the
  model's (vocabulary, behaviours, time buckets, ``max_seq_len``, prior and its counts);
- bad inputs to the exported encoder raise.

Every case is a seed: ``FUZZ_SEEDS=0:200 pytest tests/unit/test_fuzz_export.py`` widens the
run (default 0-4 per model); a failure names its seed."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from fuzzing import fuzz_seeds

from recsys.checkpoint import checkpoint_extra, load_checkpoint, set_transition_prior_weight
from recsys.data.sequences import TimeBuckets
from recsys.export import export_model, load_exported
from recsys.schema import EVENT_TYPE, ITEM, NUM_RESERVED, TIMESTAMP, USER
from recsys.tasks.score import recommend_frame

sys.path.insert(0, str(Path(__file__).parent / "retrieval"))
from test_fuzz_scoring import build_model, random_log  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

KINDS = {
    "atrank_head": dict(kind="atrank", head=True),  # served as rerank_top_n=0 (documented)
    "sasrec": dict(kind="sasrec", head=False),
    "prior": dict(kind="atrank", head=False, prior=(2, 3, 0.5, 1.5)),
    "prior_sasrec": dict(kind="sasrec", head=False, prior=(1, 1, 1.0, 0.75)),
}
TIME_BUCKETS = {
    "atrank_head": TimeBuckets(),
    "sasrec": TimeBuckets(),
    "prior": TimeBuckets(unit_seconds=3600, num_buckets=8, reference="target"),
    "prior_sasrec": TimeBuckets(unit_seconds=1, num_buckets=16),
}


def save_checkpoint(model, path: Path) -> Path:
    """The file SeqRecModule.on_save_checkpoint writes (only what load_checkpoint reads)."""
    encoder = model.encoder
    extra = checkpoint_extra(
        vocab=model.vocab,
        schema=model.schema,
        time_buckets=model.time_buckets,
        max_seq_len=model.max_seq_len,
        data_fingerprint="fuzz",
        target_behaviors=list(model.target_behaviors),
    )
    meta = {
        "encoder_target": f"{type(encoder).__module__}.{type(encoder).__qualname__}",
        "encoder_config": dict(encoder.config),
        **extra,
    }
    if model.transition_prior is not None:
        meta["transition_prior"] = model.transition_prior.to_plain()
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    torch.save({"recsys": meta, "state_dict": state}, path)
    return path


# ------------------------------------------------------------------ the serving side, by hand
def served_inputs(folder: Path, log: pl.DataFrame, as_of):
    """Raw events -> encoder inputs from vocab.json and export.json alone, as scoring builds
    them: events up to as_of, sorted by (user, time, input row), exact repeats dropped, unknown
    items UNK (1), the last max_seq_len events left-padded; time_bucket the gap to the previous
    event of the user (0 for the first; reference=target: to the prediction moment);
    query_time_bucket the gap to the next event, the last position's to the prediction moment
    (as_of, else the log's last event)."""
    vocab = json.loads((folder / "vocab.json").read_text())
    max_len = json.loads((folder / "export.json").read_text())["max_seq_len"]
    tb = vocab["time_buckets"]

    def bucket(gap: np.ndarray) -> np.ndarray:
        units = np.maximum(gap.astype(np.float64), 0) / tb["unit_seconds"]
        return 1 + np.minimum(
            np.floor(np.log2(1.0 + units)).astype(np.int64), tb["num_buckets"] - 1
        )

    item_index = {v: i + NUM_RESERVED for i, v in enumerate(vocab["item_id"])}
    behavior_index = {b: i + NUM_RESERVED for i, b in enumerate(vocab["behaviors"])}
    ev = log.with_row_index("_row")
    if as_of is not None:
        ev = ev.filter(pl.col(TIMESTAMP) <= as_of)
    ev = ev.sort(USER, TIMESTAMP, "_row").unique(
        [USER, ITEM, EVENT_TYPE, TIMESTAMP], keep="first", maintain_order=True
    )
    moment = int(as_of.timestamp()) if as_of is not None else int(ev[TIMESTAMP].dt.epoch("s").max())
    users, rows, seen = [], [], []
    for (user,), hist in ev.group_by(USER, maintain_order=True):
        ts = hist[TIMESTAMP].dt.epoch("s").to_numpy().astype(np.int64)
        gap = moment - ts if tb["reference"] == "target" else np.diff(ts, prepend=ts[0])
        query_gap = np.append(ts[1:], moment) - ts
        items = [item_index.get(i, 1) for i in hist[ITEM].to_list()]
        behaviors = [behavior_index.get(b, 1) for b in hist[EVENT_TYPE].to_list()]
        start = max(0, len(items) - max_len)
        users.append(user)
        rows.append([items, behaviors, bucket(gap), bucket(query_gap)])
        rows[-1] = [np.asarray(r)[start:] for r in rows[-1]]
        seen.append(list(zip(hist[ITEM].to_list(), hist[EVENT_TYPE].to_list())))
    width = max(len(r[0]) for r in rows)
    tensors = [torch.zeros(len(rows), width, dtype=torch.long) for _ in range(4)]
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, row in enumerate(rows):
        n = len(row[0])
        mask[b, width - n :] = True
        for t, values in zip(tensors, row):
            t[b, width - n :] = torch.from_numpy(values.astype(np.int64))
    item, behavior, time_bucket, query_time_bucket = tensors
    return users, (item, behavior, time_bucket, mask, query_time_bucket), seen, vocab


def served_lists(scores: torch.Tensor, users, seen, vocab, *, top_k, exclude, allow, deny):
    ids = vocab["item_id"]
    index = {v: i + NUM_RESERVED for i, v in enumerate(ids)}
    scores = scores.double().clone()
    if allow is not None:
        keep = torch.zeros(scores.shape[1], dtype=torch.bool)
        keep[[index[a] for a in allow if a in index]] = True
        scores[:, ~keep] = -math.inf
    for d in deny or []:
        if d in index:
            scores[:, index[d]] = -math.inf
    excluded = (
        set() if exclude == "none" else set(vocab["behaviors"] if exclude == "seen" else exclude)
    )
    lists = {}
    for b, user in enumerate(users):
        for it, be in seen[b]:
            if be in excluded and it in index:
                scores[b, index[it]] = -math.inf
        s = scores[b]
        order = sorted((i for i in range(len(s)) if math.isfinite(s[i])), key=lambda i: (-s[i], i))
        lists[user] = [(ids[i - NUM_RESERVED], float(s[i])) for i in order[:top_k]]
    return lists


def compare(served: dict, frame: pl.DataFrame, tol=2e-4) -> list[str]:
    """recommend_frame's model rows are the served list's first rows (its fallback rows come
    after; users without a known item get no model row and are skipped)."""
    problems = []
    for user, expected in served.items():
        rows = frame.filter((pl.col(USER) == user) & (pl.col("source") == "model")).sort("rank")
        items, scores = rows[ITEM].to_list(), rows["score"].to_list()
        if not items:
            continue
        if len(items) != len(expected):
            problems.append(f"user {user}: {len(items)} model rows, served {len(expected)}")
            continue
        want = dict(expected)
        if items != [e[0] for e in expected]:
            swaps_of_ties = sorted(items) == sorted(want) and all(
                abs(want[i] - e[1]) < tol for i, e in zip(items, expected)
            )
            if not swaps_of_ties:
                problems.append(f"user {user}: {items} != served {[e[0] for e in expected]}")
                continue
        bad = [
            (i, s, want[i])
            for i, s in zip(items, scores)
            if abs(s - want[i]) > tol * max(1, abs(want[i]))
        ]
        if bad:
            problems.append(f"user {user}: scores differ {bad[:3]}")
    return problems


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-export")
    built = {}
    for name, kw in KINDS.items():
        model, base = build_model(root / "prep", **kw)
        model = dataclasses.replace(model, time_buckets=TIME_BUCKETS[name])
        path = save_checkpoint(model, root / f"{name}.ckpt")
        loaded = load_checkpoint(path)
        folder = root / f"export-{name}"
        export_model(loaded, folder)
        built[name] = (model, loaded, base, folder)
    return built


def random_case(rng: random.Random, model, log):
    items = model.vocab.items[ITEM].to_list()
    exclude = rng.choice(["seen", "none", ["purchase"], ["view", "cart"]])
    allow = rng.sample(items, rng.randint(5, 40)) if rng.random() < 0.25 else None
    deny = rng.sample(items, rng.randint(0, 20)) if rng.random() < 0.3 else None
    as_of = None
    if rng.random() < 0.5:
        ts = log[TIMESTAMP].sort()
        as_of = ts[rng.randint(0, ts.len() - 1)] + timedelta(
            seconds=rng.choice([0, 1, 3600, 3 * 86400])
        )
    return rng.choice([1, 3, 5, 10, 20]), exclude, allow, deny, as_of


@pytest.mark.parametrize("kind", list(KINDS))
def test_export_and_reloaded_checkpoint_match_recommend_frame(models, kind):
    model, loaded, base, folder = models[kind]
    served = load_exported(folder)
    encoder = torch.jit.load(str(folder / "user_encoder.pt"))  # what serving loads, alone
    failures = []
    for seed in fuzz_seeds("0:4"):
        rng = random.Random(seed)
        log = random_log(rng, base, model)
        top_k, exclude, allow, deny, as_of = random_case(rng, model, log)
        rules = {"exclude": exclude}
        if allow is not None:
            rules["allow_list"] = allow
        if deny is not None:
            rules["deny_list"] = deny
        retrieval = {"top_k": top_k, "explanations": 0, "rules": rules}
        frame = recommend_frame(model, log, retrieval=retrieval, as_of=as_of)
        if not frame.equals(recommend_frame(loaded, log, retrieval=retrieval, as_of=as_of)):
            failures.append(f"seed {seed}: the reloaded checkpoint scores otherwise")
        users, inputs, seen, vocab = served_inputs(folder, log, as_of)
        scores = served.score(*inputs)
        by_hand = encoder(*inputs) @ served.keys.T + served.bias
        if served.transition_prior is not None:
            by_hand = served.transition_prior.add_to(by_hand, inputs[0])
        torch.testing.assert_close(by_hand, scores, rtol=0, atol=0)
        lists = served_lists(
            scores, users, seen, vocab, top_k=top_k, exclude=exclude, allow=allow, deny=deny
        )
        problems = compare(lists, frame)
        if problems:
            failures.append(
                f"seed {seed} k={top_k} {rules} as_of={as_of}: " + "; ".join(problems[:3])
            )
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind", list(KINDS))
def test_export_metadata_is_the_models(models, kind):
    _, loaded, _, folder = models[kind]
    meta = json.loads((folder / "export.json").read_text())
    vocab = json.loads((folder / "vocab.json").read_text())
    assert vocab["item_id"] == loaded.vocab.items[ITEM].to_list()
    assert vocab["behaviors"] == list(loaded.vocab.behaviors)
    assert vocab["time_buckets"] == dataclasses.asdict(loaded.time_buckets)
    assert vocab["target_behaviors"] == list(loaded.target_behaviors)
    assert meta["max_seq_len"] == loaded.max_seq_len
    assert meta["num_items"] == loaded.vocab.num_items
    assert meta["encoder_config"] == loaded.encoder.config
    prior = loaded.transition_prior
    assert meta["transition_prior"] == ("none" if prior is None else prior.settings())
    assert meta["rerank_head"].startswith("trained") == (kind == "atrank_head")
    served = load_exported(folder)
    if prior is not None:
        assert served.transition_prior.settings() == prior.settings()
        for name, tensor in prior.counts.to_plain().items():
            assert torch.equal(served.transition_prior.counts.to_plain()[name], tensor)


def test_a_reweighted_prior_is_exported_with_its_new_weight(models, tmp_path):
    model, _, _, _ = models["prior"]
    path = save_checkpoint(model, tmp_path / "model.ckpt")
    set_transition_prior_weight(path, 0.25)
    loaded = load_checkpoint(path)
    export_model(loaded, tmp_path / "export")
    meta = json.loads((tmp_path / "export" / "export.json").read_text())
    assert meta["transition_prior"]["weight"] == 0.25
    assert load_exported(tmp_path / "export").transition_prior.weight == 0.25


def test_bad_inputs_to_the_exported_encoder_raise(models):
    _, _, _, folder = models["prior"]
    served = load_exported(folder)
    z = torch.zeros(1, 3, dtype=torch.long)
    mask = torch.ones(1, 3, dtype=torch.bool)
    item = torch.full((1, 3), NUM_RESERVED)
    for bad, match in [
        ((z[:, :0], z[:, :0], z[:, :0], mask[:, :0]), "B >= 1 and T >= 1"),  # empty history
        ((item.float(), item, item, mask), "item must be int64"),
        ((item, item, item, mask.long()), "padding_mask must be a bool"),
        ((item + 10**6, item, item, mask), "item holds indices outside"),
        ((item, item, item - 10**6, mask), "time_bucket holds indices outside"),  # NaN gap cast
        (
            (
                torch.full((1, 13), 2),
                torch.full((1, 13), 2),
                torch.ones(1, 13, dtype=torch.long),
                torch.ones(1, 13, dtype=torch.bool),
            ),
            "exceeds max_seq_len",
        ),
    ]:
        with pytest.raises(torch.jit.Error, match=match):
            served.score(*bad)


def test_rows_that_break_the_padding_contract_raise(models):
    """A wrongly padded row used to be encoded without error into the bias-only ranking."""
    _, _, _, folder = models["atrank_head"]
    served = load_exported(folder)

    def inputs(item, mask):
        item, mask = torch.tensor([item]), torch.tensor([mask])
        return item, mask.long() * 2, mask.long(), mask

    good = inputs([0, 0, 5], [False, False, True])
    assert served.score(*good).shape[0] == 1
    for bad, match in [
        (inputs([5, 0, 0], [True, False, False]), "last position"),  # right-padded
        (inputs([0, 0, 0], [False, False, False]), "last position"),  # no event
        (inputs([5, 0, 6], [True, False, True]), "padding after a real token"),
        (inputs([0, 5, 6], [False, False, True]), "item and padding_mask disagree"),
        (inputs([0, 0, 6], [False, True, True]), "item and padding_mask disagree"),
    ]:
        with pytest.raises(torch.jit.Error, match=match):
            served.score(*bad)
