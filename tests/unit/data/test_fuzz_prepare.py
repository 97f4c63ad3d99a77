"""Differential / property fuzzing of ``recsys.data.prepare``.

Each seed draws a small random event log (ties, duplicates, bad rows under ``drop``, optional
categories) and random preparation settings, then checks:

- the in-memory path against the partitioned path (several user partitions);
- both against an independent plain-Python oracle written from the README's semantics
  (bad rows, dedupe, tie order, window, k-core fixed point, truncation, sessions, splits,
  train-only vocabulary and counts, unknown targets);
- leakage invariants on the tensors of ``TrainWindows`` / ``TargetRows``;
- (some seeds) polars vs pandas vs CSV vs Parquet sources.

Default run: 80 seeds (~15 s). More: ``FUZZ_SEEDS=0:500 pytest ...`` or
``PYTHONPATH=tests python tests/unit/data/test_fuzz_prepare.py 0 500``.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from fuzzing import fuzz_seeds, run_seeds
from polars.testing import assert_frame_equal as _afe

import recsys.data as rd
from recsys.data import options as _options
from recsys.data.dataset import SequenceStore, TargetRows, TrainWindows
from recsys.data.pipeline import load_events, prepare_dataset, scoring_sequences
from recsys.data.sequences import TimeBuckets

BEHAVIORS = ["view", "click", "cart", "purchase"]
T0 = 1_700_000_000  # Unix seconds
AS_OF = "2030-01-01T00:00:00+00:00"
AS_OF_US = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- random cases ----------------------------------------------------------------------------
def make_case(seed: int) -> dict:
    """A random log (rows of raw values + what each value means) and random options."""
    rng = random.Random(seed)
    n_users = rng.randint(2, 14)
    n_items = rng.randint(2, 18)
    n = rng.randint(10, 260)
    span = rng.choice([3, 20, 600, 50_000])  # small spans: many exact ties
    order_only = rng.random() < 0.12
    unit = rng.choice(["s", "s", "ms", "iso", "iso_offset", "datetime"])
    string_users = rng.random() < 0.25
    string_items = rng.random() < 0.25
    side = rng.choice([None, None, "category", "category", "attr_list", "attr_sep"])
    with_session = rng.random() < 0.15
    no_event_type = rng.random() < 0.1
    alias = not no_event_type and rng.random() < 0.3
    users = [f"{rng.choice(['', '0', '00'])}{u}" if string_users else u for u in range(n_users)]
    users = list(dict.fromkeys(users))
    attrs = ["a", "b", "c", "d", "e"]

    def side_value():
        if side == "category":
            return rng.choice(
                ["c0", "c1", "c2", "c3", " c1", "", None]
                if rng.random() < 0.2
                else ["c0", "c1", "c2", "c3"]
            )
        if side is None:
            return None
        k = rng.randint(0, 3)
        values = [rng.choice(attrs) for _ in range(k)]
        if side == "attr_list":
            return values if values or rng.random() < 0.5 else None
        return "|".join(values) if values or rng.random() < 0.5 else None

    def item_id(k: int):
        k = k * rng.choice([1, 1, 1, 7]) if not string_items else k
        return f"i{k:0{rng.choice([1, 2])}d}" if string_items else k

    rows = []
    for _ in range(n):
        behavior = rng.choice(BEHAVIORS)
        if alias and behavior == "view" and rng.random() < 0.5:
            behavior = "pv"
        rows.append(
            {
                "user": rng.choice(users),
                "item": item_id(rng.randrange(n_items)),
                "ts_us": (T0 + rng.randrange(span)) * 1_000_000
                + (rng.randrange(1000) * 1000 if unit == "ms" else 0),
                "event": behavior if not no_event_type else "view",
                "side": side_value(),
                "session": rng.choice(["s1", "s2", "s3", None]) if with_session else None,
                "ts_bad": None,  # None, or an unparseable timestamp
            }
        )
    # exact repeats (and repeats that differ only in side information / session)
    for _ in range(rng.choice([0, 0, 2, 10])):
        copy = dict(rng.choice(rows))
        if rng.random() < 0.3:
            copy["side"] = side_value()
            copy["session"] = rng.choice(["s1", "s9", None]) if with_session else None
        rows.insert(rng.randrange(len(rows) + 1), copy)
    # bad rows (policy drop)
    bad_kinds = []
    if rng.random() < 0.4:
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(["null_user", "null_item", "unknown", "future", "negative", "bad"])
            if kind == "bad" and not unit.startswith("iso"):
                kind = "future"
            if kind == "negative" and unit == "datetime":
                kind = "future"
            if order_only and kind in ("future", "negative", "bad"):
                kind = "null_item"
            if no_event_type and kind == "unknown":
                kind = "null_user"
            row = dict(rng.choice(rows))
            if kind == "null_user":
                row["user"] = None
            elif kind == "null_item":
                row["item"] = None
            elif kind == "unknown":
                row["event"] = "zzz"
            elif kind == "future":
                row["ts_us"] = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
            elif kind == "negative":
                row["ts_us"] = -86400 * 1_000_000
            elif kind == "bad":
                row["ts_bad"] = "not a time"
            bad_kinds.append(kind)
            rows.insert(rng.randrange(len(rows) + 1), row)
    if rng.random() < 0.5:
        rng.shuffle(rows)
    else:  # a time-ordered log (the stable-by-user fast path)
        rows.sort(key=lambda r: r["ts_us"])
    if rng.random() < 0.15:  # a per-user export (the already-in-order fast path)
        rows.sort(key=lambda r: (r["user"] is None, r["user"] or users[0], r["ts_us"]))
    if order_only:
        for index, r in enumerate(rows):
            r["ts_us"] = index  # the documented order-only time: the input row in microseconds

    columns: dict = {}
    options: dict = {"as_of": AS_OF}
    if order_only:
        columns["timestamp"] = None
    if no_event_type:
        columns["event_type"] = None
    if side == "category":
        columns["category"] = "category"
    elif side:
        columns["attributes"] = "attributes"
        if side == "attr_sep":
            options["attribute_separator"] = "|"
    if with_session:
        columns["session_id"] = "session_id"
    if columns:
        options["columns"] = columns
    if alias:
        options["behavior_aliases"] = {"pv": "view"}
    if unit == "ms":
        options["timestamp_unit"] = "ms"
    if bad_kinds or rng.random() < 0.2:
        options["bad_rows"] = {
            k: "drop"
            for k in (
                "null_id",
                "bad_timestamp",
                "unknown_behavior",
                "negative_timestamp",
                "future_timestamp",
            )
        }
    mue = rng.choice([1, 2, 2, 3, 5])
    options["min_user_events"] = mue
    options["min_item_events"] = rng.choice([1, 1, 2, 3])
    if rng.random() < 0.3:
        options["max_user_events"] = rng.randint(mue, mue + 8)
    if rng.random() < 0.3 and not order_only:
        options["session_gap_seconds"] = rng.choice([1, 5, 30, 600, 0.5])
    if rng.random() < 0.25 and not order_only:
        lo = rng.randrange(span)
        start = datetime.fromtimestamp(T0 + lo, UTC) if rng.random() < 0.5 else None
        end = datetime.fromtimestamp(T0 + lo + 1 + rng.randrange(span), UTC)
        if rng.random() < 0.5:
            end = None
        window = {}
        if start:
            window["start"] = start.isoformat()
        if end:
            window["end"] = end.isoformat()
        if window:
            options["window"] = window
    if rng.random() < 0.2:
        options["min_item_count"] = 2
    if rng.random() < 0.15:
        options["max_item_attributes"] = 1
    methods = ["leave_one_out", "leave_last_n"] + ([] if order_only else ["temporal"])
    method = rng.choice(methods)
    split: dict = {"method": method}
    if method == "temporal":
        split["val_fraction"] = rng.choice([0.1, 0.2, 0.3])
        split["test_fraction"] = rng.choice([0.1, 0.2, 0.3])
    if method == "leave_last_n":
        split["holdout_events"] = rng.randint(1, 3)
    if rng.random() < 0.25 and not no_event_type:
        split["target_behaviors"] = rng.choice([["purchase"], ["cart", "purchase"]])
    options["split"] = split
    # an item side table: undated (an item may have several rows: their union) or dated
    items = None
    if side != "attr_sep" and rng.random() < 0.3:
        ids = sorted({r["item"] for r in rows if r["item"] is not None}, key=str)
        dated = not order_only and rng.random() < 0.4
        items = []
        for item in rng.sample(ids, k=rng.randint(1, len(ids))):
            for _ in range(rng.randint(1, 3)):
                values = [rng.choice(attrs + ["x", "y"]) for _ in range(rng.randint(0, 3))]
                moment = None
                if dated and rng.random() < 0.85:
                    moment = (T0 + rng.randrange(-10, span + 10)) * 1_000_000
                items.append({"item": item, "attributes": values or None, "moment": moment})
        options["item_columns"] = {"timestamp": "moment"} if dated else {}
        if rng.random() < 0.5:
            rng.shuffle(items)
    return {
        "seed": seed,
        "rows": rows,
        "unit": unit,
        "options": options,
        "side": side,
        "order_only": order_only,
        "no_event_type": no_event_type,
        "session": with_session,
        "items": items,
        "string_users": string_users,
        "string_items": string_items,
    }


def _ts_raw(row: dict, unit: str):
    if row["ts_bad"] is not None:
        return row["ts_bad"]
    us = row["ts_us"]
    if unit == "s":
        return us // 1_000_000
    if unit == "ms":
        return us // 1000
    instant = EPOCH + timedelta(microseconds=us)
    if unit == "iso":
        return instant.strftime("%Y-%m-%dT%H:%M:%S") + "Z"
    if unit == "iso_offset":
        return instant.astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat()
    return instant  # aware datetime


def to_polars(case: dict) -> pl.DataFrame:
    rows, unit = case["rows"], case["unit"]
    data = {
        "user_id": pl.Series(
            [r["user"] for r in rows], dtype=pl.String if case["string_users"] else pl.Int64
        ),
        "item_id": pl.Series(
            [r["item"] for r in rows], dtype=pl.String if case["string_items"] else pl.Int64
        ),
    }
    if not case["order_only"]:
        data["timestamp"] = pl.Series(
            [_ts_raw(r, unit) for r in rows],
            dtype={"s": pl.Int64, "ms": pl.Int64}.get(
                unit, pl.String if unit.startswith("iso") else pl.Datetime("us", "UTC")
            ),
        )
    if not case["no_event_type"]:
        data["event_type"] = pl.Series([r["event"] for r in rows], dtype=pl.String)
    if case["side"] == "category":
        data["category"] = pl.Series([r["side"] for r in rows], dtype=pl.String)
    elif case["side"] == "attr_list":
        data["attributes"] = pl.Series([r["side"] for r in rows], dtype=pl.List(pl.String))
    elif case["side"] == "attr_sep":
        data["attributes"] = pl.Series([r["side"] for r in rows], dtype=pl.String)
    if case["session"]:
        data["session_id"] = pl.Series([r["session"] for r in rows], dtype=pl.String)
    return pl.DataFrame(data)


def items_frame(case: dict) -> pl.DataFrame | None:
    if case["items"] is None:
        return None
    rows = case["items"]
    data = {
        "item_id": pl.Series(
            [r["item"] for r in rows], dtype=pl.String if case["string_items"] else pl.Int64
        ),
        "attributes": pl.Series([r["attributes"] for r in rows], dtype=pl.List(pl.String)),
    }
    if case["options"].get("item_columns", {}).get("timestamp"):
        data["moment"] = pl.Series(
            [
                None if r["moment"] is None else EPOCH + timedelta(microseconds=r["moment"])
                for r in rows
            ],
            dtype=pl.Datetime("us", "UTC"),
        )
    return pl.DataFrame(data)


# -- the oracle ------------------------------------------------------------------------------
class Refused(Exception):
    pass


SEP = "\x1f"


def side_key(case: dict, value) -> str | None:
    """The documented side information of one event: a category (stripped; empty = none) or an
    attribute set (a list, or a string split on the separator; in any order), as one key."""
    if value is None:
        return None
    if case["side"] == "category":
        value = [value]
    elif case["side"] == "attr_sep":
        value = value.split("|")
    cleaned = sorted({v.strip() for v in value if v is not None and v.strip()})
    return SEP.join(cleaned) if cleaned else None


def oracle(case: dict) -> dict:
    """Plain-Python preparation from the documented semantics."""
    opts = case["options"]
    aliases = {b: b for b in BEHAVIORS} | opts.get("behavior_aliases", {})
    # 1. bad rows (first problem wins)
    good, bad = [], Counter()
    for index, r in enumerate(case["rows"]):
        behavior = aliases.get(r["event"])
        if r["user"] is None or r["item"] is None:
            bad["null_id"] += 1
        elif r["ts_bad"] is not None:
            bad["bad_timestamp"] += 1
        elif behavior is None:
            bad["unknown_behavior"] += 1
        elif r["ts_us"] < 0:
            bad["negative_timestamp"] += 1
        elif r["ts_us"] > AS_OF_US:
            bad["future_timestamp"] += 1
        else:
            good.append(
                (
                    r["user"],
                    r["ts_us"],
                    index,
                    r["item"],
                    behavior,
                    side_key(case, r["side"]),
                    r["session"],
                )
            )
    # 2. order: user, time, input row; duplicates: same user/item/behaviour/time as earlier row
    good.sort(key=lambda e: (e[0], e[1], e[2]))
    seen, events = set(), []
    for e in good:
        key = (e[0], e[3], e[4], e[1])
        if key in seen:
            bad["duplicate"] += 1
            continue
        seen.add(key)
        events.append(e)
    dups = bad["duplicate"]
    # 3. window
    window = opts.get("window", {})
    start = window.get("start") and int(datetime.fromisoformat(window["start"]).timestamp() * 1e6)
    end = window.get("end") and int(datetime.fromisoformat(window["end"]).timestamp() * 1e6)
    before = len(events)
    events = [e for e in events if (start is None or e[1] >= start) and (end is None or e[1] < end)]
    outside = before - len(events)
    if not events:
        raise Refused("no events after bad rows / window")
    # 4. k-core to a fixed point
    mue, mie = opts["min_user_events"], opts["min_item_events"]
    before = len(events)
    while True:
        uc = Counter(e[0] for e in events)
        ic = Counter(e[3] for e in events)
        kept = [e for e in events if uc[e[0]] >= mue and ic[e[3]] >= mie]
        if len(kept) == len(events):
            break
        events = kept
    kcore = before - len(events)
    if not events:
        raise Refused("nothing survives k-core")
    # 5. truncation
    by_user = defaultdict(list)
    for e in events:
        by_user[e[0]].append(e)
    mx = opts.get("max_user_events")
    truncated = 0
    if mx is not None:
        for u in by_user:
            truncated += max(0, len(by_user[u]) - mx)
            by_user[u] = by_user[u][-mx:] if len(by_user[u]) > mx else by_user[u]
    # 6. sessions (your session_id column wins over a gap)
    gap = opts.get("session_gap_seconds")
    sessions = {}
    for u, evs in by_user.items():
        s, out = 0, []
        for k, e in enumerate(evs):
            if k and case["session"]:
                s += e[6] != evs[k - 1][6]
            elif k and gap:
                s += e[1] - evs[k - 1][1] > gap * 1_000_000
            out.append(s)
        sessions[u] = out
    has_sessions = bool(gap) or case["session"]
    # 7. split
    split = opts["split"]
    method = split["method"]
    targets = split.get("target_behaviors")
    windows = {}  # user -> list of 'train' | 'val' | 'test'
    cuts = (None, None)
    if method == "temporal":
        vf, tf = split["val_fraction"], split["test_fraction"]
        all_ts = sorted(e[1] for evs in by_user.values() for e in evs)
        n = len(all_ts)
        qs = [1.0 - vf - tf, 1.0 - tf]
        cuts = tuple(all_ts[int(math.floor(q * (n - 1)))] for q in qs)
        for u, evs in by_user.items():
            windows[u] = [
                "test" if e[1] >= cuts[1] else "val" if e[1] >= cuts[0] else "train" for e in evs
            ]
    else:
        h = 1 if method == "leave_one_out" else split["holdout_events"]
        for u, evs in by_user.items():
            n = len(evs)
            windows[u] = [
                "test" if p >= n - h else "val" if p >= n - 2 * h else "train" for p in range(n)
            ]
    # 8. vocabulary on training events only
    train_items = Counter()
    item_keys = defaultdict(Counter)
    train_max = None
    for u, evs in by_user.items():
        for e, w in zip(evs, windows[u]):
            if w == "train":
                train_items[e[3]] += 1
                train_max = e[1] if train_max is None else max(train_max, e[1])
                if e[5] is not None:
                    item_keys[e[3]][e[5]] += 1
    mic = opts.get("min_item_count", 1)
    vocab_items = sorted(
        (i for i, c in train_items.items() if c >= mic), key=lambda i: (-train_items[i], i)
    )
    if not vocab_items:
        raise Refused("no training items")
    index_of = {i: k + 2 for k, i in enumerate(vocab_items)}
    item_attr = {}  # item -> its attribute set
    for i in vocab_items:
        keys = item_keys.get(i)
        if keys:
            best = max(keys.values())
            item_attr[i] = set(min(k for k, c in keys.items() if c == best).split(SEP))
    if case["items"] is not None:
        table = case["items"]
        listed: dict = {}
        if opts["item_columns"].get("timestamp"):
            last: dict = {}
            for row_index, r in enumerate(table):
                if r["moment"] is not None and r["moment"] > train_max:
                    continue
                order = (-1 if r["moment"] is None else 0, r["moment"] or 0, row_index)
                if r["item"] not in last or order > last[r["item"]][0]:
                    last[r["item"]] = (order, r)
            for item, (_, r) in last.items():
                values = {v for v in (r["attributes"] or []) if v.strip()}
                if values:
                    listed[item] = values
        else:
            for r in table:
                values = {v for v in (r["attributes"] or []) if v.strip()}
                if values:
                    listed.setdefault(r["item"], set()).update(values)
        for i in vocab_items:
            if i in listed:
                item_attr[i] = listed[i]
    attr_count = Counter()
    for i, a in item_attr.items():
        for x in a:
            attr_count[x] += train_items[i]
    attributes = sorted(attr_count, key=lambda a: (-attr_count[a], a))
    attr_index = {a: k + 2 for k, a in enumerate(attributes)}
    max_attrs = opts.get("max_item_attributes", 32)
    item_attr_indices = {
        i: sorted(attr_index[a] for a in item_attr[i])[:max_attrs] if i in item_attr else [1]
        for i in vocab_items
    }
    behaviors = BEHAVIORS
    beh_index = {b: k + 2 for k, b in enumerate(behaviors)}
    # 9. sequences
    seqs = {}
    unknown = {"val_targets_unknown_item": 0, "test_targets_unknown_item": 0}
    for u, evs in by_user.items():
        ws = windows[u]

        def first(win, evs=evs, ws=ws):
            for p, (e, w) in enumerate(zip(evs, ws)):
                if w == win and p >= 1 and (not targets or e[4] in targets):
                    return p
            return -1

        vt, tt = first("val"), first("test")
        items = [index_of.get(e[3], 1) for e in evs]
        if vt >= 0 and items[vt] == 1:
            unknown["val_targets_unknown_item"] += 1
            vt = -1
        if tt >= 0 and items[tt] == 1:
            unknown["test_targets_unknown_item"] += 1
            tt = -1
        seqs[u] = {
            "item": items,
            "behavior": [beh_index[e[4]] for e in evs],
            "timestamp": [math.floor(e[1] / 1_000_000) for e in evs],
            "session": sessions[u] if has_sessions else None,
            "train_end": ws.count("train"),
            "val_target": vt,
            "test_start": ws.count("train") + ws.count("val"),
            "test_target": tt,
        }
    stats = {
        "bad_rows": {k: v for k, v in bad.items() if v},
        "duplicates_removed": dups,
        "events_outside_window": outside,
        "events_removed_by_kcore": kcore,
        "events_removed_by_max_user_events": truncated,
        "events": sum(len(s["item"]) for s in seqs.values()),
        "users": len(seqs),
        "items": len({e[3] for evs in by_user.values() for e in evs}),
        "train_events": sum(s["train_end"] for s in seqs.values()),
        "train_users": sum(s["train_end"] >= 2 for s in seqs.values()),
        "val_targets": sum(s["val_target"] >= 0 for s in seqs.values()),
        "test_targets": sum(s["test_target"] >= 0 for s in seqs.values()),
        "num_items": len(vocab_items) + 2,
        "num_attributes": len(attributes) + 2,
        **unknown,
    }
    if has_sessions:
        stats["sessions"] = sum(s["session"][-1] + 1 for s in seqs.values())
    if stats["val_targets"] == 0 or stats["test_targets"] == 0:
        raise Refused("no val/test targets")
    if stats["train_users"] == 0:
        raise Refused("no training target")
    return {
        "seqs": seqs,
        "stats": stats,
        "vocab_items": vocab_items,
        "train_counts": [train_items[i] for i in vocab_items],
        "item_attr_indices": item_attr_indices,
        "attributes": attributes,
        "cuts": cuts,
    }


# -- running the implementation ---------------------------------------------------------------
def run_prepare(source, out: Path, options: dict, *, partition_rows: int | None = None, items=None):
    """``rd.prepare``; with ``partition_rows`` the settings' minimum (1000) is bypassed so that a
    small log spreads over several partitions (the documented result: the same for any count)."""
    if partition_rows is None:
        return rd.prepare(source, out, items=items, **options)
    settings = _options.prepare_settings(options)
    object.__setattr__(settings, "partition_rows", partition_rows)
    stats, vocab = prepare_dataset(
        source,
        schema=_options.event_schema(options),
        settings=settings,
        out_dir=out,
        items=items,
        item_columns=_options.item_columns(options),
    )
    return rd.PreparedDataset(path=out, stats=stats, vocab=vocab)


def assert_frame_equal(a, b, *, obj: str) -> None:
    try:
        _afe(a, b)
    except AssertionError as err:
        raise AssertionError(f"{obj}: {err}") from None


def attempt(fn):
    try:
        return fn(), None
    except (rd.DataError, ValueError) as err:
        return None, err


VOLATILE = {"as_of", "partitions", "settings", "source"}


def compare_datasets(a, b, what: str, *, stats_skip=frozenset(), raw_tz=False) -> None:
    problems = []

    def check(fn, *args, **kw):
        try:
            fn(*args, **kw)
        except AssertionError as err:
            problems.append(str(err)[:400])

    sa, sb = a.sequences().sort("user_id"), b.sequences().sort("user_id")
    check(assert_frame_equal, sa, sb, obj="sequences")
    check(assert_frame_equal, a.vocab.items, b.vocab.items, obj="vocab.items")
    check(assert_frame_equal, a.vocab.attributes, b.vocab.attributes, obj="vocab.attributes")
    if a.vocab.behaviors != b.vocab.behaviors:
        problems.append("behaviours")
    qa, qb = a.quarantine(), b.quarantine()
    if raw_tz:  # pandas' aware datetimes are read as naive UTC (io.py): the raw text drops +00:00
        qa = qa.with_columns(pl.col("raw_timestamp").str.replace(r"\+00:00$", ""))
    check(assert_frame_equal, qa, qb, obj="quarantine")
    skip = VOLATILE | set(stats_skip)
    diff = {
        k: (a.stats.get(k), b.stats.get(k))
        for k in set(a.stats) | set(b.stats)
        if k not in skip and a.stats.get(k) != b.stats.get(k)
    }
    if diff:
        problems.append(f"stats differ {diff}")
    assert not problems, f"{what}: " + " | ".join(problems)


def compare_oracle(ds, expected: dict, case: dict) -> None:
    st = ds.stats
    for key, value in expected["stats"].items():
        got = st.get(key, {} if key == "bad_rows" else None)
        assert got == value, f"stats[{key}] = {got}, oracle {value}"
    vocab_ids = ds.vocab.items["item_id"].to_list()
    assert vocab_ids == expected["vocab_items"], (vocab_ids, expected["vocab_items"])
    assert ds.vocab.items["train_count"].to_list() == expected["train_counts"]
    attrs = ds.vocab.attributes["attribute"].to_list()
    assert attrs == expected["attributes"], (attrs, expected["attributes"])
    got_attr = dict(
        zip(ds.vocab.items["item_id"].to_list(), ds.vocab.items["attribute_indices"].to_list())
    )
    for item in expected["vocab_items"]:
        want = expected["item_attr_indices"][item]
        assert got_attr[item] == want, ("attribute_indices", item, got_attr[item], want)
    seqs = ds.sequences()
    got_users = seqs["user_id"].to_list()
    assert sorted(got_users) == sorted(expected["seqs"]), "users differ"
    for row in seqs.iter_rows(named=True):
        want = expected["seqs"][row["user_id"]]
        for col in (
            "item",
            "behavior",
            "timestamp",
            "train_end",
            "val_target",
            "test_start",
            "test_target",
        ):
            assert row[col] == want[col], (row["user_id"], col, row[col], want[col])
        if want["session"] is not None:
            assert row["session"] == want["session"], (row["user_id"], row["session"], want)
    cuts = expected["cuts"]
    if cuts[0] is not None:
        val_start = datetime.fromisoformat(st["split"]["val_start"])
        assert int(val_start.timestamp() * 1_000_000) == cuts[0]


def check_events_view(ds, expected: dict) -> None:
    """``PreparedDataset.events()`` (long format) agrees with the sequences and the oracle."""
    events = ds.events()
    assert events.height == expected["stats"]["events"]
    for user, want in expected["seqs"].items():
        mine = events.filter(pl.col("user_id") == user).sort("position")
        assert mine["position"].to_list() == list(range(len(want["item"])))
        ids = [None if x == 1 else ds.vocab.item_ids()[x] for x in want["item"]]
        assert mine["item_id"].to_list() == ids, ("events() item_id", user)
        windows = [
            "train" if p < want["train_end"] else "val" if p < want["test_start"] else "test"
            for p in range(len(want["item"]))
        ]
        assert mine["window"].to_list() == windows
        targets = [p in (want["val_target"], want["test_target"]) for p in range(len(windows))]
        assert mine["is_target"].to_list() == targets
        names = [BEHAVIORS[b - 2] for b in want["behavior"]]
        assert mine["event_type"].to_list() == names


def check_scoring(case: dict, df: pl.DataFrame, ds) -> None:
    """The scoring path (load_events + scoring_sequences, same rules, a saved vocabulary) sees
    each user's history as prepare does when no filter applies."""
    opts = case["options"]
    if (
        opts.get("window")
        or opts["min_user_events"] > 1
        or opts["min_item_events"] > 1
        or opts.get("max_user_events")
    ):
        return
    events = load_events(
        df,
        _options.event_schema(opts),
        bad_rows=_options.prepare_settings(opts).bad_rows,
        as_of=datetime.fromisoformat(AS_OF),
    )
    scored = scoring_sequences(events, vocab=ds.vocab).sort("user_id")
    prepared = ds.sequences().sort("user_id")
    assert scored["user_id"].to_list() == prepared["user_id"].to_list()
    assert scored["item"].to_list() == prepared["item"].to_list(), "scoring items differ"
    assert scored["behavior"].to_list() == prepared["behavior"].to_list()
    assert scored["timestamp"].to_list() == prepared["timestamp"].to_list()


def check_leakage(ds) -> None:
    store = SequenceStore.from_parquet(ds.path / "sequences.parquet")
    seqs = ds.sequences()
    test_start = seqs["test_start"].to_numpy().astype(np.int64)
    n = store.lengths
    tb = TimeBuckets()
    # split positions are ordered and inside the history
    assert (store.train_end <= test_start).all() and (test_start <= n).all()
    v, t = store.val_target, store.test_target
    assert ((v == -1) | ((v >= store.train_end) & (v < test_start) & (v >= 1))).all()
    assert ((t == -1) | ((t >= test_start) & (t < n) & (t >= 1))).all()
    # windows by time: every training event precedes (or ties) every later window's event
    for u in range(store.num_users):
        lo, hi = store.offsets[u], store.offsets[u + 1]
        ts = store.timestamp[lo:hi]
        assert (np.diff(ts) >= 0).all(), "history not in time order"
    # training windows read training events only; every target once
    for max_len in (1, 3, 50):
        windows = TrainWindows(store, max_seq_len=max_len, time_buckets=tb)
        if len(windows) == 0:
            continue
        local_end = windows.end - store.offsets[windows.rows]
        assert (local_end <= store.train_end[windows.rows]).all()
        assert (windows.start >= store.offsets[windows.rows]).all()
        batch = windows[list(range(len(windows)))]
        targets = batch.target_item[batch.padding_mask].numpy()
        expected = np.concatenate(
            [
                store.item[store.offsets[u] + 1 : store.offsets[u] + min(store.train_end[u], n[u])]
                for u in range(store.num_users)
                if min(store.train_end[u], n[u]) >= 2
            ]
            or [[]]
        )
        assert sorted(targets.tolist()) == sorted(expected.astype(np.int64).tolist())
    # evaluation inputs end strictly before their target
    for target in (v, t):
        rows = TargetRows(store, target, max_seq_len=4, time_buckets=tb, seen=True)
        if len(rows) == 0:
            continue
        batch = rows[list(range(len(rows)))]
        for b, u in enumerate(rows.rows):
            first = store.offsets[u]
            p = target[u]
            hist = store.item[max(first, first + p - 4) : first + p]
            got = batch.item[b][batch.padding_mask[b]].numpy()
            assert got.tolist() == hist.tolist()
            assert int(batch.target_item[b]) == store.item[first + p]
            seen = batch.seen_item[b].numpy()
            assert seen[seen > 0].tolist() == [x for x in store.item[first : first + p] if x > 0]


# -- one case --------------------------------------------------------------------------------
def run_case(seed: int, root: Path, *, formats: bool = False) -> None:
    case = make_case(seed)
    df = to_polars(case)
    try:
        expected, refused = oracle(case), None
    except Refused as err:
        expected, refused = None, err
    items = items_frame(case)
    one, err_one = attempt(lambda: run_prepare(df, root / "one", case["options"], items=items))
    parts = max(3, len(case["rows"]) // random.Random(seed).choice([3, 4, 10]))
    many, err_many = attempt(
        lambda: run_prepare(df, root / "many", case["options"], partition_rows=parts, items=items)
    )
    assert (err_one is None) == (err_many is None), (seed, err_one, err_many)
    if err_one is not None:
        assert type(err_one) is type(err_many) and str(err_one) == str(err_many), (seed,)
        assert refused is not None, f"seed {seed}: refused {err_one!r}, oracle has a result"
        return
    assert refused is None, f"seed {seed}: oracle refuses ({refused}), prepare gave a result"
    assert many.stats["partitions"] > 1
    compare_datasets(one, many, f"seed {seed} one vs many partitions")
    compare_oracle(one, expected, case)
    check_leakage(one)
    check_events_view(one, expected)
    check_scoring(case, df, one)
    if formats:
        check_formats(case, df, one, root)
        check_folders(case, df, one, root)


def check_formats(case: dict, df: pl.DataFrame, one, root: Path) -> None:
    options = case["options"]
    pq_path = root / "log.parquet"
    df.write_parquet(pq_path)
    variants = {"parquet": pq_path, "lazy": df.lazy()}
    if case["unit"] != "datetime" or True:
        pdf = df.to_pandas()
        variants["pandas"] = pdf
    if case["unit"] != "datetime" and case["side"] != "attr_list":
        csv_path = root / "log.csv"
        df.write_csv(csv_path)
        variants["csv"] = csv_path
    for name, source in variants.items():
        other = run_prepare(source, root / f"fmt_{name}", options, items=items_frame(case))
        compare_datasets(
            one,
            other,
            f"seed {case['seed']} polars vs {name}",
            raw_tz=name == "pandas" and case["unit"] == "datetime",
        )


def check_folders(case: dict, df: pl.DataFrame, one, root: Path) -> None:
    """The log split into a folder of files (path order = input order, columns reordered, an
    extra column, a ``_SUCCESS`` marker) gives what the one frame gives."""
    rng = random.Random(case["seed"] * 7 + 1)
    options = case["options"]
    n = df.height
    cuts = sorted(rng.sample(range(1, n), k=min(n - 1, rng.randint(1, 4))))
    pieces = [df.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, n])]
    kinds = ["parquet"]
    if case["unit"] != "datetime" and case["side"] != "attr_list":
        kinds.append("csv")
    for kind in kinds:
        folder = root / f"folder_{kind}"
        hive = rng.random() < 0.5  # all files in dt=... folders (path order = their order)
        for k, piece in enumerate(pieces):
            columns = piece.columns[:]
            rng.shuffle(columns)
            piece = piece.select(columns).with_columns(pl.lit(k).alias("extra"))
            sub = folder / f"dt=2026-01-0{k + 1}" if hive else folder
            sub.mkdir(parents=True, exist_ok=True)
            path = sub / f"part-{k:05d}.{kind}"
            if kind == "csv":
                piece.write_csv(path)
            else:
                piece.write_parquet(path)
        (folder / "_SUCCESS").write_text("")
        other = run_prepare(folder, root / f"out_{kind}", options, items=items_frame(case))
        compare_datasets(one, other, f"seed {case['seed']} frame vs {kind} folder")


@pytest.mark.parametrize("seed", fuzz_seeds("0:80"))
def test_fuzz_prepare(seed, tmp_path):
    run_case(seed, tmp_path, formats=seed % 4 == 0)


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    formats = len(sys.argv) > 3  # a third argument: also the file formats' round trips
    run_seeds(partial(run_case, formats=formats), int(sys.argv[1]), int(sys.argv[2]))
