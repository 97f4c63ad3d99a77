"""Differential fuzz of scoring: random logs x random settings (top K, re-rank depth, item /
user chunk and batch sizes, seen-item exclusion, allow / deny lists inline and as files,
category cap, target behaviour, cold users, new items, as_of) scored by ``recommend_frame``
and compared with a brute-force oracle built from the model's own full score table:
same items in the same order (swaps only between scores equal within 2e-4), scores, sources,
ranks 1..n without gaps, the list length the README promises and each explanation's event.
Every case is a seed: ``FUZZ_SEEDS=0:500 pytest tests/unit/retrieval/test_fuzz_scoring.py``
widens the run; a failure names its seed."""

from __future__ import annotations

import math
import random
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from fuzzing import fuzz_seeds

from recsys.checkpoint import LoadedModel
from recsys.data.pipeline import PrepareSettings, load_events, prepare_dataset
from recsys.data.sequences import TimeBuckets
from recsys.data.synthetic import generate_events
from recsys.data.vocab import Vocab
from recsys.model.atrank import ATRank
from recsys.model.sasrec import SASRec
from recsys.retrieval.recommend import Recommender, ScoringData, ScoringOptions
from recsys.retrieval.rules import Rules
from recsys.schema import EVENT_TYPE, ITEM, NUM_RESERVED, TIMESTAMP, USER, EventSchema
from recsys.tasks.score import recommend_frame

MAX_SEQ_LEN = 12


def build_model(
    folder: Path, *, kind="atrank", seed=0, head=True, num_users=60, num_items=90, prior=None
):
    events = generate_events(num_users=num_users, num_items=num_items, num_categories=6, seed=5)
    if not (folder / "vocab.json").exists() and not folder.exists():
        prepare_dataset(events, schema=EventSchema(), settings=PrepareSettings(), out_dir=folder)
    vocab = Vocab.load(folder)
    torch.manual_seed(seed)
    if kind == "atrank":
        encoder = ATRank(
            **vocab.encoder_sizes(),
            num_time_buckets=17,
            max_seq_len=MAX_SEQ_LEN,
            d_model=16,
            num_layers=1,
        ).eval()
        encoder.set_item_attributes(torch.tensor(vocab.item_attribute_table(), dtype=torch.long))
        with torch.no_grad():
            encoder.item_bias.normal_(0, 0.3)
            if head:
                torch.nn.init.normal_(encoder.rerank_output.weight)
    else:
        encoder = SASRec(
            num_items=vocab.num_items,
            num_behaviors=vocab.num_behaviors,
            max_seq_len=MAX_SEQ_LEN,
            d_model=16,
            num_layers=1,
        ).eval()
    tp = None
    if prior is not None:
        from recsys.data.dataset import SequenceStore
        from recsys.model.transition import TransitionCounts, TransitionPrior

        store = SequenceStore.from_parquet(folder / "sequences.parquet")
        window, recent, decay, weight = prior
        counts = TransitionCounts.from_sequences(
            store.item, store.offsets, store.train_end, vocab.num_items, window
        )
        tp = TransitionPrior(counts, weight, recent, decay)
    model = LoadedModel(
        transition_prior=tp,
        encoder=encoder,
        vocab=vocab,
        schema=EventSchema(),
        time_buckets=TimeBuckets(),
        max_seq_len=MAX_SEQ_LEN,
        path=Path("model.ckpt"),
        target_behaviors=tuple(vocab.behaviors),
    )
    return model, events


# ----------------------------------------------------------------------------- random cases
def random_log(rng: random.Random, base: pl.DataFrame, model: LoadedModel) -> pl.DataFrame:
    users = base[USER].unique().sort().to_list()
    chosen = rng.sample(users, rng.randint(1, min(len(users), 25)))
    log = base.filter(pl.col(USER).is_in(chosen))
    # random truncation per user (keep first n events)
    keep = {u: rng.randint(1, 40) for u in chosen}
    log = (
        log.sort(USER, TIMESTAMP, maintain_order=True)
        .with_columns(pl.int_range(pl.len()).over(USER).alias("_n"))
        .filter(pl.col("_n") < pl.col(USER).replace_strict(keep, default=0))
        .drop("_n")
    )
    last = base[TIMESTAMP].max()
    cats = base["category"].unique().sort().to_list()
    extra = []
    new_items = [700_000 + i for i in range(rng.randint(0, 6))]
    new_cat = {i: rng.choice(cats + ["brand-new", "other-new", None]) for i in new_items}
    behaviors = list(model.vocab.behaviors)
    # cold users: only new items (or none at all known)
    for c in range(rng.randint(0, 3)):
        if not new_items:
            break
        for _ in range(rng.randint(1, 4)):
            it = rng.choice(new_items)
            extra.append(
                (
                    900_000 + c,
                    it,
                    new_cat[it],
                    rng.choice(behaviors),
                    last - timedelta(hours=rng.randint(0, 200)),
                )
            )
    # warm users with events on new items
    for u in chosen:
        if new_items and rng.random() < 0.3:
            it = rng.choice(new_items)
            extra.append(
                (
                    u,
                    it,
                    new_cat[it],
                    rng.choice(behaviors),
                    last - timedelta(hours=rng.randint(0, 100)),
                )
            )
    # exact duplicate rows
    if log.height and rng.random() < 0.5:
        log = pl.concat([log, log.sample(min(5, log.height), seed=rng.randint(0, 10**6))])
    if extra:
        log = pl.concat([log, pl.DataFrame(extra, schema=log.schema, orient="row")])
    return log


def random_settings(rng: random.Random, model: LoadedModel, log: pl.DataFrame, tmp: Path, head):
    items = model.vocab.items[ITEM].to_list() + sorted(
        set(log[ITEM].to_list()) - set(model.vocab.items[ITEM].to_list())
    )
    rules: dict = {}
    rules["exclude"] = rng.choice(["seen", "none", ["purchase"], ["view", "cart"], "seen"])
    r = rng.random()
    if r < 0.25:
        allow = rng.sample(items, rng.randint(1, min(len(items), 30)))
        rules["allow_list"] = _maybe_file(rng, allow, tmp, "allow")
    if rng.random() < 0.35:
        deny = rng.sample(items, rng.randint(0, min(len(items), 30)))
        rules["deny_list"] = _maybe_file(rng, deny, tmp, "deny")
    if rng.random() < 0.5:
        rules["max_per_category"] = rng.choice([1, 1, 2, 3])
    if rng.random() < 0.25:
        rules["target_behavior"] = rng.choice(list(model.vocab.behaviors))
    sizes = [1, 2, 3, 7, 100_000]
    retrieval = {
        "top_k": rng.choice([1, 2, 3, 5, 10, 40, 200]),
        "rerank_top_n": rng.choice([0, 0, 3, 10, 50]) if head else 0,
        "item_chunk_size": rng.choice(sizes),
        "user_chunk_size": rng.choice(sizes),
        "batch_size": rng.choice(sizes),
        "explanations": rng.choice([0, 1, 2, 3]),
        "min_history": rng.choice([1, 1, 2, 5]),
        "popularity_days": rng.choice([None, 1, 5, 30]),
        "rules": rules,
    }
    as_of = None
    if rng.random() < 0.4:
        ts = log[TIMESTAMP].sort()
        as_of = ts[rng.randint(0, ts.len() - 1)] + timedelta(seconds=rng.choice([0, 1, 3600]))
        if rng.random() < 0.3:
            as_of = ts[-1] + timedelta(days=rng.choice([2, 10, 40, 400]))
    return retrieval, as_of


def _maybe_file(rng, ids, tmp: Path, name):
    form = rng.choice(["inline", "csv", "txt", "parquet"])
    if form == "inline":
        return ids
    path = tmp / f"{name}-{rng.randint(0, 10**9)}.{form}"
    frame = pl.DataFrame({ITEM: pl.Series(ids, dtype=pl.Int64)})
    if form == "csv":
        frame.write_csv(path)
    elif form == "parquet":
        frame.write_parquet(path)
    else:
        path.write_text("\n".join(str(i) for i in ids) + "\n")
    return str(path)


def _ids(value):
    if value is None:
        return None
    if isinstance(value, str):
        p = Path(value)
        if p.suffix == ".parquet":
            return set(pl.read_parquet(p)[ITEM].to_list())
        if p.suffix == ".csv":
            return set(pl.read_csv(p)[ITEM].to_list()) if p.stat().st_size else set()
        return {int(x) for x in p.read_text().split()}
    return set(value)


# ----------------------------------------------------------------------------- oracle
def oracle(model: LoadedModel, log: pl.DataFrame, retrieval: dict, as_of):
    """Expected output rows per user: dict user -> list of (item, score, source, expl)."""
    opts = ScoringOptions(**{k: v for k, v in retrieval.items() if k != "rules"})
    rules = Rules.from_options(retrieval.get("rules"), behaviors=model.vocab.behaviors)
    # the project's catalogue only for item index <-> category (checked elsewhere)
    loaded = load_events(log, model.schema)
    data = ScoringData.build(model, loaded, rules=rules, options=opts, as_of=as_of)
    cat = data.catalogue
    rec = Recommender(model, data, rules=rules, options=opts)
    enc = model.encoder
    id_to_index = dict(zip(cat.items[ITEM].to_list(), cat.items["catalogue_index"].to_list()))
    category = cat.category.numpy()
    size = cat.size
    num_model = cat.num_model_items

    # my own event list: filter, sort (user, ts, input row), dedupe
    ev = log.with_row_index("_row")
    if as_of is not None:
        ev = ev.filter(pl.col(TIMESTAMP) <= as_of)
    ev = ev.sort(USER, TIMESTAMP, "_row").unique(
        [USER, ITEM, EVENT_TYPE, TIMESTAMP], keep="first", maintain_order=True
    )
    query_time = (
        int(as_of.timestamp()) if as_of is not None else int(ev[TIMESTAMP].max().timestamp())
    )
    # blocked
    blocked = np.zeros(size, bool)
    blocked[:NUM_RESERVED] = True
    allow = _ids(rules.allow_list)
    deny = _ids(rules.deny_list)
    for it, ix in id_to_index.items():
        if allow is not None and it not in allow:
            blocked[ix] = True
        if deny is not None and it in deny:
            blocked[ix] = True
    # popularity
    pop_ev = ev
    if rules.target_behavior is not None:
        pop_ev = pop_ev.filter(pl.col(EVENT_TYPE) == rules.target_behavior)
    if opts.popularity_days is not None:
        since = query_time - int(opts.popularity_days * 86400)
        pop_ev = pop_ev.filter(pl.col(TIMESTAMP).dt.epoch("s") >= since)
    counts = np.zeros(size)
    for it, n in pop_ev.group_by(ITEM).len().iter_rows():
        counts[id_to_index[it]] = n
    lp = np.log1p(counts)
    popularity = torch.from_numpy(lp / (lp.max() + 1.0)).float().numpy()

    behaviors = list(model.vocab.behaviors)
    excluded = (
        set()
        if rules.exclude == "none"
        else set(behaviors if rules.exclude == "seen" else rules.exclude)
    )
    keys = enc.item_keys()
    expected = {}
    store_users = data.store.user_id.to_list()
    with torch.no_grad():
        for row, (user, hist) in enumerate(ev.group_by(USER, maintain_order=True)):
            user = user[0]
            assert store_users[row] == user, (row, user, store_users[row])
            items_h = [id_to_index.get(i, 1) for i in hist[ITEM].to_list()]
            known = sum(1 for i in items_h if NUM_RESERVED <= i < num_model)
            excl = {
                id_to_index.get(i, 1)
                for i, b in zip(hist[ITEM].to_list(), hist[EVENT_TYPE].to_list())
                if b in excluded
            }
            model_list = []  # (item, score)
            output = None
            if known >= opts.min_history:
                batch = rec.rows[[row]]
                output = enc(*batch.model_inputs())
                s = enc.score_items(output.query, keys)
                if model.transition_prior is not None:
                    s = model.transition_prior.add_to(s, batch.item)
                s = s[0].double().numpy().copy()
                for i in range(num_model):
                    if blocked[i] or i in excl:
                        s[i] = -math.inf
                order = sorted(
                    (i for i in range(num_model) if np.isfinite(s[i])), key=lambda i: (-s[i], i)
                )
                sc = [float(s[i]) for i in order]
                n = min(opts.rerank_top_n, len(order))
                if n:
                    head = torch.tensor([order[:n]])
                    hs = enc.rerank_scores(output, head)[0].double().numpy()
                    o2 = sorted(range(n), key=lambda j: -hs[j])  # stable
                    order = [order[j] for j in o2] + order[n:]
                    sc = [float(hs[j]) for j in o2] + sc[n:]
                model_list = list(zip(order, sc, [0] * len(order)))
            # fallback
            cc = np.zeros(int(category.max()) + 1)
            for i in items_h:
                if i >= NUM_RESERVED:
                    cc[category[i]] += 1
            cc[0] = 0
            in_model = {i for i, _, _ in model_list}
            fb = [
                i
                for i in range(NUM_RESERVED, size)
                if not blocked[i] and i not in excl and i not in in_model
            ]
            fb.sort(key=lambda i: (-cc[category[i]], -popularity[i], i))
            fb_list = [
                (i, float(cc[category[i]] + popularity[i]), 1 if cc[category[i]] > 0 else 2)
                for i in fb
            ]
            chosen = []
            per_cat: dict = {}
            for i, sc, src in model_list + fb_list:
                c = category[i]
                if rules.max_per_category is not None and c != 0:
                    if per_cat.get(c, 0) >= rules.max_per_category:
                        continue
                    per_cat[c] = per_cat.get(c, 0) + 1
                chosen.append((i, sc, src))
                if len(chosen) == opts.top_k:
                    break
            # explanations (model rows)
            expl = []
            if output is not None and opts.explanations:
                start = max(0, hist.height - model.max_seq_len)
                window = hist[start:]
                for i, _sc, src in chosen:
                    if src != 0:
                        expl.append(None)
                        continue
                    w = enc.explanation_weights(output, torch.tensor([[i]]))[0, 0].numpy()
                    top = np.argsort(-w, kind="stable")[: opts.explanations]
                    T = w.shape[0]
                    e = []
                    for p in top:
                        if w[p] <= 0:
                            continue
                        ev_i = p - (T - window.height)
                        r = window.row(ev_i, named=True)
                        e.append((r[ITEM], r[EVENT_TYPE], r[TIMESTAMP], float(w[p])))
                    expl.append(e)
            else:
                expl = [None] * len(chosen)
            expected[user] = [
                (
                    cat.items[ITEM][i - NUM_RESERVED],
                    sc,
                    ("model", "category_popularity", "popularity")[src],
                    category[i],
                    e,
                )
                for (i, sc, src), e in zip(chosen, expl)
            ]
    return expected


def compare(expected: dict, got: pl.DataFrame, retrieval: dict, tol=2e-4):
    """Return list of problem strings."""
    problems = []
    users = got[USER].unique().to_list()
    extra = set(users) - set(expected)
    if extra:
        problems.append(f"users in output not expected: {sorted(extra)[:5]}")
    E = retrieval.get("explanations", 3)
    for user, exp in expected.items():
        rows = got.filter(pl.col(USER) == user).sort("rank")
        if not exp:
            if rows.height:
                problems.append(f"user {user}: expected no rows, got {rows.height}")
            continue
        if rows["rank"].to_list() != list(range(1, rows.height + 1)):
            problems.append(f"user {user}: ranks {rows['rank'].to_list()}")
        gi = rows[ITEM].to_list()
        ei = [e[0] for e in exp]
        gs = rows["score"].to_list()
        es = [e[1] for e in exp]
        gsrc = rows["source"].cast(pl.String).to_list()
        esrc = [e[2] for e in exp]
        if gi != ei:
            # allow swaps only between near-equal scores
            ok = len(gi) == len(ei) and sorted(gi) == sorted(ei)
            if ok:
                d = dict(zip(ei, es))
                ok = all(abs(d[a] - b) < tol for a, b in zip(gi, es))
            if not ok:
                problems.append(
                    f"user {user}: items {gi} != expected {ei}\n   got scores {gs}\n   exp scores "
                    f"{es}\n   got src {gsrc}\n   exp src {esrc}"
                )
                continue
        if any(abs(a - b) > tol * max(1, abs(b)) for a, b in zip(gs, es)):
            problems.append(f"user {user}: scores {gs} != {es}")
        if gsrc != esrc:
            problems.append(f"user {user}: sources {gsrc} != {esrc}")
        if E:
            for r, e in zip(rows.iter_rows(named=True), exp):
                expl = e[4]
                got_e = [
                    (
                        r[f"explain_{j}_item_id"],
                        r[f"explain_{j}_behavior"],
                        r[f"explain_{j}_timestamp"],
                        r[f"explain_{j}_weight"],
                    )
                    for j in range(1, E + 1)
                ]
                for g in got_e:
                    if g[3] is not None and not (0 <= g[3] <= 1 + 1e-6):
                        problems.append(f"user {user}: weight out of [0,1] {g}")
                if expl is None:
                    if any(g[0] is not None for g in got_e):
                        problems.append(f"user {user} item {e[0]}: explanation on non-model row")
                    continue
                got_nn = [g for g in got_e if g[0] is not None]
                if len(got_nn) != len(expl):
                    problems.append(
                        f"user {user} item {e[0]}: {len(got_nn)} explanations, expected "
                        f"{len(expl)}: {got_nn} vs {expl}"
                    )
                    continue
                for g, x in zip(got_nn, expl):
                    same = (g[0], str(g[1]), g[2]) == (x[0], x[1], x[2])
                    if abs(g[3] - x[3]) > 1e-4 or (not same and abs(g[3] - x[3]) > 0):
                        # allow ties in weight to swap
                        if not same and any(
                            (y[0], y[1], y[2]) == (g[0], str(g[1]), g[2])
                            and abs(y[3] - g[3]) < 1e-5
                            for y in expl
                        ):
                            continue
                        problems.append(f"user {user} item {e[0]}: explanation {g} != {x}")
    return problems


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz") / "prep"
    built = {"atrank": build_model(folder, kind="atrank", head=True)}
    built["sasrec"] = build_model(folder, kind="sasrec", head=False)
    built["prior"] = build_model(folder, kind="atrank", head=False, prior=(2, 3, 0.5, 1.5))
    return built


@pytest.mark.parametrize(
    "kind, seeds",
    [("atrank", fuzz_seeds("0:14")), ("sasrec", fuzz_seeds("0:5")), ("prior", fuzz_seeds("0:5"))],
)
def test_scoring_matches_a_brute_force_oracle(models, tmp_path, kind, seeds):
    model, base = models[kind]
    head = kind == "atrank"
    failures = []
    for seed in seeds:
        rng = random.Random(seed)
        log = random_log(rng, base, model)
        retrieval, as_of = random_settings(rng, model, log, tmp_path, head)
        got = recommend_frame(model, log, retrieval=retrieval, as_of=as_of)
        problems = compare(oracle(model, log, retrieval, as_of), got, retrieval)
        if problems:
            failures.append(f"seed {seed} {retrieval} as_of={as_of}: " + "; ".join(problems[:3]))
    assert not failures, "\n".join(failures)
