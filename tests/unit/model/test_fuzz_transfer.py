"""Differential fuzz of recsys.model.transfer.carry_over against a naive oracle: random old and
new vocabularies (ids as ints or text, items and attributes added, removed and reordered),
random encoders of each kind with random weights, every row checked by the id it stands for."""

from __future__ import annotations

import random
import tempfile

import polars as pl
import pytest
import torch
from fuzzing import fuzz_seeds
from test_transfer import vocab as make_vocab  # the same directory
from unit.test_export import ENCODERS, make_encoder  # tests/ is on pytest's pythonpath

from recsys.data.vocab import Vocab
from recsys.model import ATRank
from recsys.model.gru4rec import GRU4Rec
from recsys.model.sasrec import SASRec
from recsys.model.transfer import carry_over
from recsys.schema import NUM_RESERVED

SEEDS = fuzz_seeds("0:40")  # FUZZ_SEEDS=0:1000 for a longer run
KINDS = ("atrank", "atrank_items_only", "sasrec", "gru4rec")
# the oracle's own list of vocabulary-indexed tables (not read from VOCABULARY_ROWS)
ORACLE_ROWS = {
    "atrank": {
        "item_bias": "item",
        "embedding.item_embedding.weight": "item",
        "embedding.attribute_embedding.weight": "attribute",
    },
    "tied": {"item_embedding.weight": "item"},
}
ITEM_ATTRIBUTES = "embedding.item_attributes"


def random_sets(rng: random.Random, n_items: int, n_attributes: int) -> list[list[int]]:
    if n_attributes == 0:
        return [[1] for _ in range(n_items)]  # UNK: no attribute
    width = rng.randint(1, min(3, n_attributes))
    indices = range(NUM_RESERVED, NUM_RESERVED + n_attributes)
    return [sorted(rng.sample(indices, rng.randint(1, width))) for _ in range(n_items)]


def two_vocabularies(rng: random.Random) -> tuple[Vocab, Vocab]:
    """Old and new: overlapping item and attribute ids, shuffled, some dropped, some added."""
    text = rng.random() < 0.5
    pool = rng.sample(range(1000), 40)
    ids = [f"i{p}" if text else p for p in pool]
    old_ids = ids[: rng.randint(1, 15)]
    kept = [i for i in old_ids if rng.random() < 0.6] or [rng.choice(old_ids)]
    new_ids = kept + ids[len(old_ids) : len(old_ids) + rng.randint(0, 10)]
    rng.shuffle(new_ids)
    names = [f"a{k}" for k in rng.sample(range(100), 20)]
    old_attrs = names[: rng.randint(0, 8)]
    new_attrs = [a for a in old_attrs if rng.random() < 0.6]
    new_attrs += names[len(old_attrs) : len(old_attrs) + rng.randint(0, 6)]
    rng.shuffle(new_attrs)
    old = make_vocab(old_ids, old_attrs, random_sets(rng, len(old_ids), len(old_attrs)))
    new = make_vocab(new_ids, new_attrs, random_sets(rng, len(new_ids), len(new_attrs)))
    return old, new


def random_settings(rng: random.Random, kind: str) -> dict:
    if kind == "gru4rec":
        return {"d_model": rng.choice([4, 6]), "num_layers": rng.randint(1, 2)}
    if kind == "sasrec":
        return {"d_model": 4, "num_heads": rng.choice([1, 2]), "num_layers": rng.randint(1, 2)}
    d_model = rng.choice([4, 8])
    settings = {
        "d_model": d_model,
        "num_heads": rng.choice([1, 2]),
        "num_layers": rng.randint(1, 2),
        "ffn_multiplier": 1.0,
        "item_bias": rng.random() < 0.5,
        "key_projection": rng.random() < 0.5,
        "behavior_projection": rng.random() < 0.5,
        "positional": rng.choice(["sinusoidal", "learned", "none"]),
        "query_time": rng.random() < 0.5,
        "token_norm": rng.random() < 0.5,
    }
    if kind == "atrank_items_only":
        settings["attribute_dim"] = 0
    else:
        settings["attribute_dim"] = rng.choice([1, d_model // 2])
        settings["attribute_attention"] = rng.random() < 0.5
    return settings


def build(kind: str, vocab: Vocab, settings: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "gru4rec":
        return GRU4Rec(num_items=vocab.num_items, max_seq_len=5, **settings)
    if kind == "sasrec":
        return SASRec(num_items=vocab.num_items, max_seq_len=5, **settings)
    model = ATRank(
        **vocab.encoder_sizes(),
        num_time_buckets=4,
        max_seq_len=5,
        **settings,
    )
    model.set_item_attributes(torch.tensor(vocab.item_attribute_table(), dtype=torch.long))
    return model


def scramble(model: torch.nn.Module, seed: int) -> None:
    """Random values in every float entry (a trained model's rows all differ)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for value in model.state_dict().values():
            if value.is_floating_point():
                value.copy_(torch.randn(value.shape, generator=generator))


def id_rows(vocab: Vocab, kind: str) -> dict:
    """Raw id -> row, by hand."""
    if kind == "item":
        return {i: NUM_RESERVED + k for k, i in enumerate(vocab.items["item_id"].to_list())}
    names = vocab.attributes["attribute"].to_list()
    return {a: NUM_RESERVED + k for k, a in enumerate(names)}


def oracle_check(kind, old_model, old_vocab, new_model, new_vocab, fresh, carried, same=None):
    """``fresh``: the new model's state before the carry (None: new rows not checked)."""
    same = same or torch.equal
    was, now = old_model.state_dict(), new_model.state_dict()
    rows = ORACLE_ROWS["atrank" if kind.startswith("atrank") else "tied"]
    maps = {k: (id_rows(old_vocab, k), id_rows(new_vocab, k)) for k in ("item", "attribute")}
    shared = {k: [i for i in new_map if i in old_map] for k, (old_map, new_map) in maps.items()}
    assert (carried.items, carried.num_items) == (len(shared["item"]), new_vocab.items.height)
    has_attributes = any(kind == "attribute" and key in now for key, kind in rows.items())
    assert (carried.attributes, carried.num_attributes) == (
        len(shared["attribute"]) if has_attributes else None,  # None: no attribute table
        new_vocab.attributes.height,
    )
    assert fresh is None or now.keys() == fresh.keys()
    for key, value in now.items():
        if key == ITEM_ATTRIBUTES:  # this run's lookup, for the NEW vocabulary
            expected = torch.tensor(new_vocab.item_attribute_table(), dtype=torch.long)
            assert torch.equal(value, expected), key
            continue
        row_kind = rows.get(key)
        if row_kind is None:  # not indexed by the vocabulary: copied exactly
            assert same(value, was[key]), key
            continue
        old_map, new_map = maps[row_kind]
        assert value.shape[0] == NUM_RESERVED + len(new_map), key
        assert same(value[:NUM_RESERVED], was[key][:NUM_RESERVED]), (key, "PAD/UNK")
        for raw_id, row in new_map.items():
            if raw_id in old_map:
                assert same(value[row], was[key][old_map[raw_id]]), (key, raw_id)
            elif fresh is not None:
                assert torch.equal(value[row], fresh[key][row]), (key, raw_id, "fresh")


def case(seed: int):
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    old_vocab, new_vocab = two_vocabularies(rng)
    settings = random_settings(rng, kind)
    old = build(kind, old_vocab, settings, seed)
    scramble(old, seed)
    new = build(kind, new_vocab, settings, seed + 10_000)
    return kind, old_vocab, new_vocab, old, new, settings


@pytest.mark.parametrize("seed", SEEDS)
def test_carry_over_matches_the_oracle(seed):
    kind, old_vocab, new_vocab, old, new, settings = case(seed)
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    carried = carry_over(old, old_vocab, new, new_vocab)
    oracle_check(kind, old, old_vocab, new, new_vocab, fresh, carried)
    # the new weights are copies: the old model training on leaves them as they are
    now = {k: v.clone() for k, v in new.state_dict().items()}
    scramble(old, seed + 1)
    for key, value in new.state_dict().items():
        assert torch.equal(value, now[key]), key


def fitted_events(rng: random.Random, ids: list, names: list[str], dtype) -> pl.LazyFrame:
    n = rng.randint(len(ids), 4 * len(ids))
    sets = [rng.sample(names, rng.randint(0, min(2, len(names)))) for _ in range(n)]
    return pl.LazyFrame(
        {
            "item_id": pl.Series([rng.choice(ids) for _ in range(n)], dtype=dtype),
            "attributes": pl.Series(sets, dtype=pl.List(pl.String)),
        }
    )


ID_TYPES = {
    "Int64": (pl.Int64, lambda p: p),
    "UInt64": (pl.UInt64, lambda p: p + 2**63 if p % 3 == 0 else p),
    "String": (pl.String, lambda p: f"s{p}"),
    "Float64": (pl.Float64, lambda p: p + 0.5),
}


@pytest.mark.parametrize("seed", SEEDS[:24])
def test_fitted_vocabularies_of_every_id_type_through_a_checkpoint(seed):
    """Vocabularies as the data layer fits them (frequency order, attribute sets), the old one
    as a checkpoint holds it (plain lists), the new one as prepared (Parquet)."""
    rng = random.Random(seed)
    dtype, make_id = ID_TYPES[list(ID_TYPES)[seed % len(ID_TYPES)]]
    ids = [make_id(p) for p in rng.sample(range(2**20), 30)]
    names = [str(c) for c in rng.sample(range(50), 10)]
    old_ids, old_names = ids[: rng.randint(1, 15)], names[: rng.randint(0, 6)]
    new_ids = [i for i in old_ids if rng.random() < 0.6] + ids[15 : 15 + rng.randint(0, 10)]
    new_names = [c for c in old_names if rng.random() < 0.6] + names[6 : 6 + rng.randint(0, 4)]
    fit = {"behaviors": ("view", "buy")}
    old_vocab = Vocab.fit(fitted_events(rng, old_ids, old_names, dtype), **fit)
    new_vocab = Vocab.fit(fitted_events(rng, new_ids or old_ids[:1], new_names, dtype), **fit)
    old_vocab = Vocab.from_plain(old_vocab.to_plain())
    with tempfile.TemporaryDirectory() as folder:
        new_vocab.save(folder)
        new_vocab = Vocab.load(folder)
    kind = KINDS[seed % len(KINDS)]
    settings = random_settings(rng, kind)
    old = build(kind, old_vocab, settings, seed)
    scramble(old, seed)
    new = build(kind, new_vocab, settings, seed + 1)
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    shared = set(old_vocab.items["item_id"].to_list()) & set(new_vocab.items["item_id"].to_list())
    if not shared:
        with pytest.raises(LookupError, match="shares no item id"):
            carry_over(old, old_vocab, new, new_vocab)
        return
    carried = carry_over(old, old_vocab, new, new_vocab)
    oracle_check(kind, old, old_vocab, new, new_vocab, fresh, carried)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_a_vocabulary_sharing_no_item_id_is_refused(seed):
    kind, old_vocab, new_vocab, old, new, settings = case(seed)
    ids = old_vocab.items["item_id"]
    # the same ids read as the other type, or disjoint ids of the same type
    if seed % 2:
        other_ids = [str(i) if ids.dtype == pl.Int64 else 10_000 + k for k, i in enumerate(ids)]
    else:
        other_ids = [f"x{i}" if ids.dtype == pl.String else i + 10_000 for i in ids]
    other = make_vocab(
        other_ids,
        old_vocab.attributes["attribute"].to_list(),
        old_vocab.items["attribute_indices"].to_list(),
    )
    target = build(kind, other, settings, seed)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(LookupError, match="shares no item id"):
        carry_over(old, old_vocab, target, other)
    for key, value in target.state_dict().items():  # refused before touching a weight
        assert torch.equal(value, before[key]), key


# -- through recsys.tasks.train.initialise_from (what init_from runs), on stand-ins -----------
def loaded(encoder: torch.nn.Module, vocab: Vocab, **data):
    from recsys.checkpoint import LoadedModel
    from recsys.data.sequences import TimeBuckets

    return LoadedModel(
        encoder=encoder,
        vocab=vocab,
        schema=None,
        time_buckets=data.get("time_buckets", TimeBuckets()),
        max_seq_len=data.get("max_seq_len", 5),
        path=None,
    )


class Data:
    """The parts of a SeqRecDataModule that initialise_from reads."""

    def __init__(self, vocab: Vocab, **data):
        from recsys.data.sequences import TimeBuckets

        self.vocab = vocab
        self.max_seq_len = data.get("max_seq_len", 5)
        self.time_buckets = data.get("time_buckets", TimeBuckets())


@pytest.mark.parametrize("seed", SEEDS[:12])
def test_initialise_from_tags_the_counts_the_oracle_gives(seed):
    from recsys.tasks.train import Reference, initialise_from

    kind, old_vocab, new_vocab, old, new, settings = case(seed)
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    # the model as a checkpoint holds its vocabulary (plain lists)
    source_vocab = Vocab.from_plain(old_vocab.to_plain())
    reference = Reference("old.ckpt", loaded(old, source_vocab), {})
    done = initialise_from(reference, new, Data(new_vocab))
    tags = done.run_tags("train.initialised_from")
    old_items = set(old_vocab.items["item_id"].to_list())
    old_attrs = set(old_vocab.attributes["attribute"].to_list())
    new_items = new_vocab.items["item_id"].to_list()
    new_attrs = new_vocab.attributes["attribute"].to_list()
    items = sum(i in old_items for i in new_items)
    attrs = sum(a in old_attrs for a in new_attrs)
    assert tags["train.initialised_from"] == "old.ckpt"
    assert tags["train.initialised_from.carried_items"] == f"{items}/{len(new_items)}"
    if "embedding.attribute_embedding.weight" in new.state_dict():
        assert tags["train.initialised_from.carried_attributes"] == f"{attrs}/{len(new_attrs)}"
    else:  # SASRec, GRU4Rec, ATRank over item ids alone: no attribute table, no count
        assert "train.initialised_from.carried_attributes" not in tags
        attrs = None
    counts = type("C", (), {"items": items, "num_items": len(new_items)})
    counts.attributes, counts.num_attributes = attrs, len(new_attrs)
    oracle_check(kind, old, old_vocab, new, new_vocab, fresh, counts)


def other_data_cases():
    from recsys.data.sequences import TimeBuckets

    return [
        ("behaviours", {"behaviors": ("view", "cart")}, {}),
        ("behaviours", {"behaviors": ("buy", "view")}, {}),
        ("data.max_seq_len", {}, {"max_seq_len": 7}),
        ("data.time_buckets", {}, {"time_buckets": TimeBuckets(unit_seconds=3600.0)}),
        ("data.time_buckets", {}, {"time_buckets": TimeBuckets(num_buckets=8)}),
        ("data.time_buckets", {}, {"time_buckets": TimeBuckets(reference="target")}),
    ]


@pytest.mark.parametrize(("what", "vocab_change", "data_change"), other_data_cases())
def test_initialise_from_refuses_other_behaviours_window_and_buckets(
    what, vocab_change, data_change
):
    import dataclasses

    from recsys.tasks.train import Reference, initialise_from

    kind, old_vocab, new_vocab, old, new, _ = case(0)
    new_vocab = dataclasses.replace(new_vocab, **vocab_change)
    reference = Reference("old.ckpt", loaded(old, old_vocab), {})
    before = {k: v.clone() for k, v in new.state_dict().items()}
    with pytest.raises(ValueError, match=rf"init_from=old\.ckpt: .*{what}"):
        initialise_from(reference, new, Data(new_vocab, **data_change))
    for key, value in new.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_initialise_from_refuses_another_catalogue_and_other_settings(seed):
    from recsys.tasks.train import Reference, initialise_from

    kind, old_vocab, new_vocab, old, _, settings = case(seed)
    ids = old_vocab.items["item_id"].to_list()
    text = [str(i) for i in ids] if isinstance(ids[0], int) else [f"{i}x" for i in ids]
    other = make_vocab(text, ["z"], [[2]] * len(ids))
    target = build(kind, other, settings, seed)
    reference = Reference("old.ckpt", loaded(old, old_vocab), {})
    with pytest.raises(ValueError, match=r"init_from=old\.ckpt: .*shares no item id.*catalogue"):
        initialise_from(reference, target, Data(other))
    wider = build(kind, new_vocab, {**settings, "d_model": 2 * settings["d_model"]}, seed)
    with pytest.raises(ValueError, match=r"init_from=old\.ckpt: .*model\.d_model"):
        initialise_from(reference, wider, Data(new_vocab))


@pytest.mark.parametrize("variant", ENCODERS)
def test_every_shipped_variant_carries_over_to_a_smaller_and_a_larger_vocabulary(variant):
    """The variants tests/unit/test_export.py ships (faithful, F_g, low-pass, ...), rebuilt
    from their config for two other vocabularies."""
    rng = random.Random(variant)
    old_vocab, new_vocab = two_vocabularies(rng)
    kind = "atrank" if variant.startswith("atrank") else "tied"
    models = []
    for vocab, seed in ((old_vocab, 1), (new_vocab, 2)):
        config = dict(make_encoder(variant).config, num_items=vocab.num_items)
        if kind == "atrank":
            config.update(
                num_attributes=vocab.num_attributes, item_attribute_width=vocab.attribute_width
            )
        torch.manual_seed(seed)
        model = type(make_encoder(variant))(**config)
        if kind == "atrank":
            table = torch.tensor(vocab.item_attribute_table(), dtype=torch.long)
            model.set_item_attributes(table)
        models.append(model)
    old, new = models
    scramble(old, 3)
    fresh = {k: v.clone() for k, v in new.state_dict().items()}
    carried = carry_over(old, old_vocab, new, new_vocab)
    oracle_check(kind, old, old_vocab, new, new_vocab, fresh, carried)
