"""Differential fuzzing of the batches a :class:`SeqRecDataModule` yields.

Each seed draws a small random event log (users with 1..30 events, ties in time, repeated
items, several behaviours, duplicate rows, items first seen after the training window, users
whose every event lies in the held-out windows) and random settings (temporal / leave-one-out
/ leave-last-n splits, ``target_behaviors``, ``max_seq_len`` from 1 up, time buckets with
either reference, batch sizes that do not divide the data, ``train_samples`` windows or
prefixes, same-target partners), prepares it with ``recsys.data.prepare`` and compares every
batch of the data module with a plain-Python oracle written from the documented semantics
(README "What happens to the data", :class:`SeqBatch`, :class:`TimeBuckets`,
:class:`TrainWindows`, :class:`TrainPrefixes`, :class:`TargetRows`):

- every field of every training row (as a multiset over one epoch: each training target
  exactly once), and of every validation / test row (in user order, each target once);
- truncation to the ``max_seq_len`` most recent events, left padding, batch width, tie order,
  UNK for items outside the training vocabulary, time-bucket ids (exact rational arithmetic);
- leakage: no training row holds an event at or after ``train_end``; no evaluation input
  holds its target or a later event.

Default run: 100 seeds (~8 s). More: ``FUZZ_SEEDS=0:500 pytest ...`` or
``PYTHONPATH=tests python tests/unit/data/test_fuzz_batches.py 0 500``.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from fuzzing import fuzz_seeds, run_seeds

import recsys.data as rd
from recsys.data.datamodule import SeqRecDataModule

BEHAVIORS = ["view", "click", "cart", "purchase"]
T0 = 1_700_000_000
PAD, UNK = 0, 1


# -- random cases ----------------------------------------------------------------------------
def make_case(seed: int) -> dict:
    rng = random.Random(seed)
    big = rng.random() < 0.06  # more than partition_rows=1000 events: the partitioned path
    n_users = rng.randint(60, 80) if big else rng.randint(1, 9)
    n_items = rng.randint(1, 14)
    span = rng.choice([2, 30, 4000, 2_000_000])  # small spans: many exact ties
    rows = []
    for u in range(n_users):
        t = T0 + rng.randrange(span)
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.6:
                t += rng.choice([0, 0, 1, 59, 60, 61, 179, 180, 3600, rng.randrange(span)])
            rows.append(
                {
                    "user_id": f"u{u}",
                    "item_id": rng.randrange(n_items) + (100 if rng.random() < 0.1 else 0),
                    "timestamp": t,
                    "event_type": rng.choice(BEHAVIORS),
                }
            )
    if rng.random() < 0.3:  # a user whose events all come last (only in the held-out windows)
        t = max(r["timestamp"] for r in rows) + rng.choice([0, 1, 500])
        for k in range(rng.randint(1, 3)):
            rows.append(
                {"user_id": "late", "item_id": k, "timestamp": t + k, "event_type": "purchase"}
            )
    if rng.random() < 0.3:  # a user with one event
        rows.append(
            {"user_id": "single", "item_id": 0, "timestamp": T0 + span // 3, "event_type": "view"}
        )
    for _ in range(rng.choice([0, 0, 3])):  # exact duplicates (dropped by default)
        rows.insert(rng.randrange(len(rows) + 1), dict(rng.choice(rows)))
    order = rng.choice(["shuffled", "time", "user_time"])
    if order == "shuffled":
        rng.shuffle(rows)
    elif order == "time":
        rows.sort(key=lambda r: r["timestamp"])  # stable: ties keep their order
    else:
        rows.sort(key=lambda r: (r["user_id"], r["timestamp"]))

    order_only = rng.random() < 0.15  # data.columns.timestamp=null: input order, no times
    methods = ["leave_one_out", "leave_last_n"]
    method = rng.choice(methods if order_only else ["temporal", "temporal", *methods])
    split: dict = {"method": method}
    if method == "temporal":
        split["val_fraction"] = rng.choice([0.05, 0.1, 0.2, 0.3])
        split["test_fraction"] = rng.choice([0.05, 0.1, 0.2, 0.3])
    if method == "leave_last_n":
        split["holdout_events"] = rng.randint(1, 3)
    if rng.random() < 0.3:
        split["target_behaviors"] = rng.sample(BEHAVIORS, rng.randint(1, 2))
    samples = rng.choice(["windows", "prefixes"])
    min_user_events = rng.choice([1, 2, 2, 3])
    return {
        "rows": rows,
        "order_only": order_only,
        "partition_rows": 1000 if big else 16_000_000,
        "min_item_events": rng.choice([1, 1, 1, 2, 3]),
        "min_item_count": rng.choice([1, 1, 1, 2, 3]),
        "max_user_events": rng.choice([None, None, None, min_user_events + rng.randrange(12)]),
        "split": split,
        "min_user_events": min_user_events,
        "time_buckets": {
            "unit_seconds": rng.choice([60, 60, 1, 7, 3600, 0.5, 13.7]),
            "num_buckets": rng.choice([1, 2, 5, 16, 64]),
            "reference": rng.choice(["previous", "previous", "target"]),
        },
        "max_seq_len": rng.choice([1, 2, 3, 5, 8, 50]),
        "batch_size": rng.randint(1, 7),
        "eval_batch_size": rng.randint(1, 5),
        "train_samples": samples,
        "partners": samples == "prefixes" and rng.random() < 0.5,
        "seed": rng.randrange(1000),
    }


# -- the oracle ------------------------------------------------------------------------------
def bucket(gap, unit: float, num_buckets: int) -> int:
    """``1 + min(floor(log2(1 + gap / unit)), num_buckets - 1)`` in exact arithmetic."""
    x = 1 + Fraction(max(gap, 0)) / Fraction(unit)
    k = 0
    while Fraction(2) ** (k + 1) <= x:
        k += 1
    return 1 + min(k, num_buckets - 1)


def oracle(case: dict) -> dict:
    """Users' sorted histories, split positions and training vocabulary from the raw rows."""
    seen, events = set(), {}
    order_only = case["order_only"]
    for r in case["rows"]:
        ts = 0 if order_only else r["timestamp"]  # an order-only log's times are all 1970
        key = (r["user_id"], r["item_id"], r["event_type"], r["timestamp"])
        if not order_only and key in seen:
            continue  # duplicate of an earlier row (an order-only log has no timestamp)
        seen.add(key)
        events.setdefault(r["user_id"], []).append((ts, r["item_id"], r["event_type"]))
    events = {u: sorted(e, key=lambda x: x[0]) for u, e in events.items()}  # stable: ties
    while True:  # iterative k-core until both hold
        count = Counter(i for e in events.values() for _, i, _ in e)
        kept = {
            u: [x for x in e if count[x[1]] >= case["min_item_events"]] for u, e in events.items()
        }
        kept = {u: e for u, e in kept.items() if len(e) >= case["min_user_events"]}
        if kept == events:
            break
        events = kept
    if case["max_user_events"] is not None:
        events = {u: e[-case["max_user_events"] :] for u, e in events.items()}
    split = case["split"]
    targets = set(split.get("target_behaviors") or BEHAVIORS)
    if split["method"] == "temporal":
        ts = sorted(t for e in events.values() for t, _, _ in e)
        n = max(len(ts), 1)
        ts = ts or [0]
        q_val = 1.0 - split["val_fraction"] - split["test_fraction"]
        q_test = 1.0 - split["test_fraction"]
        cut_val, cut_test = ts[int(q_val * (n - 1))], ts[int(q_test * (n - 1))]

        def window(evs, i):
            t = evs[i][0]
            return "test" if t >= cut_test else "val" if t >= cut_val else "train"
    else:
        h = 1 if split["method"] == "leave_one_out" else split["holdout_events"]

        def window(evs, i):
            n = len(evs)
            return "test" if i >= n - h else "val" if i >= n - 2 * h else "train"

    users = {}
    train_count = Counter()
    for u, evs in events.items():
        w = [window(evs, i) for i in range(len(evs))]
        train_end = sum(x == "train" for x in w)
        assert all(x == "train" for x in w[:train_end])  # training is a prefix

        def first(name, w=w, evs=evs):
            for i, x in enumerate(w):
                if x == name and i >= 1 and evs[i][2] in targets:
                    return i
            return -1

        users[u] = {
            "events": evs,
            "train_end": train_end,
            "val": first("val"),
            "test": first("test"),
        }
        train_count.update(item for _, item, _ in evs[:train_end])
    train_items = {i for i, c in train_count.items() if c >= case["min_item_count"]}
    # a target whose item never occurs in training cannot be ranked: none (README, step 2)
    unknown = Counter()
    for info in users.values():
        for name in ("val", "test"):
            p = info[name]
            if p >= 0 and info["events"][p][1] not in train_items:
                info[name] = -1
                unknown[name] += 1
    return {"users": users, "train_items": train_items, "unknown": unknown}


class Encoded:
    """A user's history as the indices the batches should hold (vocabulary from the oracle's
    training items; only the order of the indices is taken from the prepared vocabulary)."""

    def __init__(self, evs, item_index: dict, buckets: dict):
        self.ts = [t for t, _, _ in evs]
        self.item = [item_index.get(i, UNK) for _, i, _ in evs]
        self.behavior = [2 + BEHAVIORS.index(b) for _, _, b in evs]
        self.b = buckets

    def bucket(self, gap) -> int:
        return bucket(gap, self.b["unit_seconds"], self.b["num_buckets"])

    def row(self, lo: int, hi: int, moment: int, *, next_targets: bool, last_only: bool = False):
        """The real (unpadded) part of a row whose inputs are events ``lo:hi``; ``moment`` is
        the prediction's time (the last position's query time)."""
        pos = range(lo, hi)
        if self.b["reference"] == "target":
            tb = [self.bucket(moment - self.ts[p]) for p in pos]
        else:
            tb = [self.bucket(self.ts[p] - self.ts[p - 1] if p > 0 else 0) for p in pos]
        nxt = [self.ts[p + 1] if p + 1 < hi else moment for p in pos]
        qb = [self.bucket(n - self.ts[p]) for n, p in zip(nxt, pos)]
        out = {
            "item": tuple(self.item[p] for p in pos),
            "behavior": tuple(self.behavior[p] for p in pos),
            "time_bucket": tuple(tb),
            "query_time_bucket": tuple(qb),
        }
        if next_targets:
            ti = [self.item[p + 1] for p in pos]
            tbh = [self.behavior[p + 1] for p in pos]
            if last_only:
                ti = [0] * (len(ti) - 1) + ti[-1:]
                tbh = [0] * (len(tbh) - 1) + tbh[-1:]
            out["target_item"], out["target_behavior"] = tuple(ti), tuple(tbh)
        return out


def expected_train_rows(enc: dict, ora: dict, case: dict) -> Counter:
    """(user row, fields) of every training row of one epoch."""
    L = case["max_seq_len"]
    rows = Counter()
    for u, info in ora["users"].items():
        e, n = enc[u], info["train_end"]
        if case["train_samples"] == "windows":
            end = n
            while end >= 2:  # windows of L+1 events from the most recent end, stride L
                start = max(end - L - 1, 0)
                rows[freeze(u, e.row(start, end - 1, e.ts[end - 1], next_targets=True))] += 1
                end -= L
        else:
            for t in range(1, n):  # one row per training target
                r = e.row(max(t - L, 0), t, e.ts[t], next_targets=True, last_only=True)
                rows[freeze(u, r)] += 1
    return rows


def freeze(u, fields: dict):
    return (u, tuple(sorted(fields.items())))


def real_part(batch, b: int, *, train: bool) -> dict:
    """Row ``b`` without its padding (asserting the padding is left, contiguous and PAD)."""
    mask = batch.padding_mask[b].tolist()
    k = sum(mask)
    width = len(mask)
    assert mask == [False] * (width - k) + [True] * k, f"not left-padded: {mask}"
    names = ["item", "behavior", "time_bucket", "query_time_bucket"]
    if train:
        names += ["target_item", "target_behavior"]
    out = {}
    for name in names:
        values = getattr(batch, name)[b].tolist()
        assert values[: width - k] == [0] * (width - k), f"{name} padding not PAD: {values}"
        out[name] = tuple(values[width - k :])
    return out


# -- one case --------------------------------------------------------------------------------
def run_case(seed: int, root: Path) -> str:
    case = make_case(seed)
    ora = oracle(case)
    frame = pl.DataFrame(case["rows"])
    out = root / "prepared"
    try:
        rd.prepare(
            frame,
            out,
            columns={"timestamp": None} if case["order_only"] else {},
            split=case["split"],
            time_buckets=case["time_buckets"],
            min_user_events=case["min_user_events"],
            min_item_events=case["min_item_events"],
            min_item_count=case["min_item_count"],
            max_user_events=case["max_user_events"],
            partition_rows=case["partition_rows"],
        )
    except (rd.DataError, ValueError) as err:
        # refused logs: no users, no training event or target, no validation or test target
        msg = str(err)
        assert any(s in msg for s in ("the split leaves", "no events survive", "holds no items")), (
            msg
        )
        users = ora["users"].values()
        if "no events survive" in msg:
            assert not users
        elif "holds no items" in msg:
            assert not ora["train_items"]
        elif "no training target" in msg:  # no training window of two events
            assert not any(u["train_end"] >= 2 for u in users)
        else:  # the oracle agrees that a window is left without a target
            assert not any(u["val"] >= 1 for u in users) or not any(u["test"] >= 1 for u in users)
        return "refused"
    dm = SeqRecDataModule(
        out,
        max_seq_len=case["max_seq_len"],
        batch_size=case["batch_size"],
        eval_batch_size=case["eval_batch_size"],
        seed=case["seed"],
        train_samples=case["train_samples"],
        partners=case["partners"],
        num_workers=int(os.environ.get("FUZZ_WORKERS", "0")),  # 1: batches gathered in a worker
    )
    dm.setup()
    store = dm.store
    user_of = store.user_id.to_list()
    assert sorted(user_of) == sorted(ora["users"]), "users differ"
    row_of = {u: i for i, u in enumerate(user_of)}

    # vocabulary: exactly the training items, PAD/UNK reserved
    vocab = dm.vocab.items
    item_index = dict(zip(vocab["item_id"].to_list(), vocab["index"].to_list()))
    assert set(item_index) == ora["train_items"]
    assert sorted(item_index.values()) == list(range(2, 2 + len(item_index)))
    assert dm.vocab.behaviors == tuple(BEHAVIORS)

    enc = {
        row_of[u]: Encoded(info["events"], item_index, case["time_buckets"])
        for u, info in ora["users"].items()
    }
    ora_rows = {"users": {row_of[u]: info for u, info in ora["users"].items()}}
    # split positions as stored
    for u, info in ora["users"].items():
        r = row_of[u]
        assert store.train_end[r] == info["train_end"], (u, "train_end")
        assert store.val_target[r] == info["val"], (u, "val_target")
        assert store.test_target[r] == info["test"], (u, "test_target")

    L = case["max_seq_len"]
    # -- training: two epochs, each the full multiset --------------------------------------
    expected = expected_train_rows(enc, ora_rows, case)
    loader = dm.train_dataloader()
    for _epoch in range(2):
        got = Counter()
        for batch in loader:
            B_all = len(batch)
            B = B_all // 2 if case["partners"] else B_all
            assert case["batch_size"] >= B
            assert batch.item.shape == batch.target_item.shape
            lengths = batch.padding_mask.sum(1)
            assert batch.item.shape[1] == min(L, max(1, int(lengths.max()))), "width"
            for b in range(B):
                u = int(batch.user_index[b])
                fields = real_part(batch, b, train=True)
                got[freeze(u, fields)] += 1
            if case["partners"]:
                check_partners(batch, B, enc, ora_rows, L)
        if got != expected:
            missing, extra = expected - got, got - expected
            raise AssertionError(
                f"training rows differ: {sum(missing.values())} missing, "
                f"{sum(extra.values())} extra; e.g. missing {list(missing)[:1]} "
                f"extra {list(extra)[:1]}"
            )

    # a data module restored from the state after epoch 2 yields epoch 3's batch order
    if not case["partners"]:
        state = dm.state_dict()
        dm2 = SeqRecDataModule(
            out,
            max_seq_len=L,
            batch_size=case["batch_size"],
            seed=case["seed"],
            train_samples=case["train_samples"],
        )
        torch.manual_seed(0)

        def order(loader):
            return [b.user_index.tolist() + b.target_item[:, -1].tolist() for b in loader]

        first = order(loader)  # epoch 3 of the original
        dm2.load_state_dict(state)
        assert order(dm2.train_dataloader()) == first, "resumed batch order differs"

    # -- evaluation -----------------------------------------------------------------------
    for split in ("val", "test"):
        want = [r for r in range(len(user_of)) if ora_rows["users"][r][split] >= 1]
        got_users = []
        for batch in dm.target_loader(split):
            assert len(batch) <= case["eval_batch_size"]
            assert batch.target_item.shape == (len(batch),)
            lengths = batch.padding_mask.sum(1)
            assert batch.item.shape[1] == min(L, max(1, int(lengths.max()))), "width"
            for b in range(len(batch)):
                r = int(batch.user_index[b])
                got_users.append(r)
                p = ora_rows["users"][r][split]
                e = enc[r]
                want_fields = e.row(max(p - L, 0), p, e.ts[p], next_targets=False)
                assert real_part(batch, b, train=False) == want_fields, (split, r)
                assert int(batch.target_item[b]) == e.item[p]
                assert int(batch.target_behavior[b]) == e.behavior[p]
                seen = batch.seen_item[b].tolist()
                assert seen == e.item[:p] + [0] * (len(seen) - p), (split, r, "seen")
            assert batch.seen_item.shape[1] == max(
                1, max(ora_rows["users"][int(r)][split] for r in batch.user_index)
            )
        assert got_users == want, f"{split} rows {got_users} != {want}"
        # every counted target is evaluated once; unknown-item ones are counted aside
        assert dm.stats[f"{split}_targets"] == len(want)
        assert dm.stats[f"{split}_targets_unknown_item"] == ora["unknown"][split]
        # only some users' rows
        pick = np.array([(r * 7 + case["seed"]) % 3 == 0 for r in range(len(user_of))])
        sub = [int(r) for b in dm.target_loader(split, pick) for r in b.user_index]
        assert sub == [r for r in want if pick[r]]
    return "ok"


def row_target(fields: dict, e: Encoded, n: int, L: int) -> int:
    """The training target position of a prefix row (its fields identify it)."""
    for t in range(1, n):
        r = e.row(max(t - L, 0), t, e.ts[t], next_targets=True, last_only=True)
        if r == fields:
            return t
    raise AssertionError("no such prefix row")


def check_partners(batch, B: int, enc: dict, ora_rows: dict, L: int) -> None:
    """Rows B+i: another training row with row i's target item (itself if none), cut to the
    batch's widest first-half row, with no target."""
    width = int(batch.padding_mask[:B].sum(1).max())
    assert (batch.target_item[B:] == 0).all() and (batch.target_behavior[B:] == 0).all()
    group = Counter()
    for u, info in ora_rows["users"].items():
        group.update(enc[u].item[t] for t in range(1, info["train_end"]))
    for i in range(B):
        target = int(batch.target_item[i, -1])
        ui = int(batch.user_index[i])
        ti = row_target(
            real_part(batch, i, train=True), enc[ui], ora_rows["users"][ui]["train_end"], L
        )
        u = int(batch.user_index[B + i])
        fields = real_part(batch, B + i, train=False)
        e = enc[u]
        n = ora_rows["users"][u]["train_end"]
        candidates = []
        for t in range(1, n):
            if e.item[t] != target:
                continue
            lo = max(t - L, 0, t - width)
            if e.row(lo, t, e.ts[t], next_targets=False) == fields:
                candidates.append(t)
        assert candidates, f"partner row {B + i} is no training row with target {target}"
        if group[target] > 1:  # another row of the group, not the row itself
            assert any((u, t) != (ui, ti) for t in candidates), "partner is the row itself"
        else:
            assert (u, candidates[0]) == (ui, ti)


@pytest.mark.parametrize("seed", fuzz_seeds("0:100"))
def test_fuzz_batches(seed, tmp_path):
    run_case(seed, tmp_path)


if __name__ == "__main__":
    # (quiet for a long run from the command line; under pytest, logging stays as it is: a
    # process-wide disable here had silenced every later test's INFO and WARNING records)
    logging.disable(logging.WARNING)
    run_seeds(run_case, int(sys.argv[1]), int(sys.argv[2]))
