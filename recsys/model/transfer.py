"""Weights of an encoder trained on one vocabulary, carried into an encoder of the same class and
settings built for another (``init_from`` a model of last night's log, say).

Rows of a table indexed by the vocabulary are matched by the raw id they stand for, not by
their index: an item (or attribute) of both vocabularies gets the trained model's row, a new
one keeps the row it was built with, and one the new data lacks is left behind. PAD and UNK
rows are carried as they are. Every other weight must have the same shape in both and is copied.

Which entries of the state dict are such tables, the encoder says in its class attribute
``VOCABULARY_ROWS`` (state-dict key -> ``"item"``, ``"attribute"``, or ``"data"`` for a table
that this run fills from its own data, such as the item -> attribute lookup, which is kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl
import torch

from recsys.data.vocab import ATTRIBUTE, INDEX, Vocab
from recsys.schema import ITEM, NUM_RESERVED

ROW_KINDS = ("item", "attribute", "data")


@dataclass(frozen=True)
class Carried:
    """How many real items and attributes of the new vocabulary got a trained row
    (``attributes`` None: the encoder has no attribute table, e.g. SASRec)."""

    items: int
    num_items: int  # real items of the new vocabulary (PAD and UNK not counted)
    attributes: int | None
    num_attributes: int

    def describe(self) -> str:
        attributes = (
            ""
            if self.attributes is None
            else f" and {self.attributes} of {self.num_attributes} attributes"
        )
        return (
            f"{self.items} of {self.num_items} items{attributes} carried over (the rest start "
            "fresh)"
        )


def vocabulary_rows(encoder: torch.nn.Module) -> Mapping[str, str]:
    """The encoder's ``VOCABULARY_ROWS``, checked: every key an entry of its state dict, every
    kind one of :data:`ROW_KINDS`. Raises TypeError for an encoder without it."""
    name = type(encoder).__name__
    rows = getattr(type(encoder), "VOCABULARY_ROWS", None)
    if rows is None:
        raise TypeError(
            f"{name} does not say which of its weights are indexed by the vocabulary "
            "(class attribute VOCABULARY_ROWS, see recsys.model.transfer), so it can be "
            "initialised only from a model of the same vocabulary"
        )
    state = encoder.state_dict()
    wrong = {key: kind for key, kind in rows.items() if kind not in ROW_KINDS}
    unknown = [key for key in rows if key not in state]
    if wrong or unknown:
        raise TypeError(
            f"{name}.VOCABULARY_ROWS names {unknown or ''} not in its state dict "
            f"{'and kinds ' + repr(wrong) if wrong else ''}: give state-dict keys -> "
            f"one of {ROW_KINDS}"
        )
    return rows


def matching_rows(
    old: pl.DataFrame, new: pl.DataFrame, key: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (old, new) of the entries whose ``key`` (a raw id) both tables hold (also how
    ``pipelines.evaluate other_data=true`` finds a model's items in other data). Integer ids
    match by value whatever their width or sign (an export whose ids became UInt64 keeps its
    rows); ids of another kind (text against integers) match nothing."""
    old_type, new_type = old.schema[key], new.schema[key]
    if old_type != new_type and not (old_type.is_integer() and new_type.is_integer()):
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    pairs = old.select(key, pl.col(INDEX).alias("old")).join(
        new.select(key, pl.col(INDEX).alias("new")), on=key, how="inner"
    )
    return (
        torch.from_numpy(pairs["old"].to_numpy().astype("int64")),
        torch.from_numpy(pairs["new"].to_numpy().astype("int64")),
    )


def carry_over(
    source: torch.nn.Module, source_vocab: Vocab, target: torch.nn.Module, target_vocab: Vocab
) -> Carried:
    """Load ``source``'s weights into ``target`` (same class and settings, sizes from another
    vocabulary), the vocabulary-indexed rows matched by id. Raises LookupError when the two
    vocabularies share no item id (another catalogue, or ids of another type), ValueError when
    another weight's shape differs or either model has a weight the other lacks, TypeError for
    an encoder without ``VOCABULARY_ROWS``."""
    rows = vocabulary_rows(target)
    old_items, new_items = matching_rows(source_vocab.items, target_vocab.items, ITEM)
    if old_items.numel() == 0:
        raise LookupError(
            "the model's vocabulary shares no item id with this run's "
            f"(its ids are {source_vocab.items.schema[ITEM]}, e.g. "
            f"{source_vocab.items[ITEM].head(3).to_list()}; this run's "
            f"{target_vocab.items.schema[ITEM]}, e.g. {target_vocab.items[ITEM].head(3).to_list()})"
        )
    old_attrs, new_attrs = matching_rows(
        source_vocab.attributes, target_vocab.attributes, ATTRIBUTE
    )
    index = {"item": (old_items, new_items), "attribute": (old_attrs, new_attrs)}
    reserved = torch.arange(NUM_RESERVED)
    old_state, state = source.state_dict(), target.state_dict()
    extra = sorted(set(old_state) - set(state))
    if extra:  # (other settings, e.g. another depth) their training would be lost
        raise ValueError(
            f"the model has weights this run's encoder lacks: {extra[:5]}"
            + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        )
    merged = {}
    for key, value in state.items():
        kind = rows.get(key)
        if kind == "data":
            merged[key] = value
            continue
        old = old_state.get(key)
        if old is None:
            raise ValueError(f"the model has no weight {key!r}")
        if kind is None:
            if old.shape != value.shape:
                raise ValueError(
                    f"its weight {key} has shape {tuple(old.shape)}, this run's "
                    f"{tuple(value.shape)}"
                )
            merged[key] = old
            continue
        if old.shape[1:] != value.shape[1:]:
            raise ValueError(
                f"its {kind} table {key} has rows of shape {tuple(old.shape[1:])}, this "
                f"run's {tuple(value.shape[1:])}"
            )
        rows_from, rows_to = index[kind]
        table = value.clone()
        table[reserved] = old[reserved]
        table[rows_to] = old[rows_from]
        merged[key] = table
    target.load_state_dict(merged)
    return Carried(
        items=old_items.numel(),
        num_items=target_vocab.items.height,
        attributes=old_attrs.numel() if "attribute" in rows.values() else None,
        num_attributes=target_vocab.attributes.height,
    )
