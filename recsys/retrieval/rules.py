"""Business rules of a scoring job (``retrieval.rules``), applied the same way to the model's
recommendations and to the cold-start fallback:

- ``exclude``: ``seen`` (any event of the user), ``none``, or a list of behaviours
  (``[purchase]``: only what the user has already bought);
- ``allow_list`` / ``deny_list``: a file of item ids (CSV or Parquet with an ``item_id`` column
  or a single column, or a text file with one id per line) or an inline list; only allowed
  items are returned, deny-listed ones never. A one-column CSV may lack a header line (its
  first line is then an id of the catalogue); an allow list none of whose ids is in the
  catalogue is refused, as an empty one is;
- ``max_per_category``: at most M items of one category in a user's list (see
  :mod:`recsys.retrieval.catalogue` for what an item's category is);
- ``target_behavior``: the behaviour the ranking is for (``purchase``); it must be one the
  model was trained to predict, and the cold-start popularity counts only its events.
"""

from __future__ import annotations

import logging
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys.data.io import DataError, whole_number_ids
from recsys.retrieval.catalogue import Catalogue
from recsys.schema import ITEM, NUM_RESERVED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rules:
    exclude: str | tuple[str, ...] = "seen"
    allow_list: str | tuple | None = None
    deny_list: str | tuple | None = None
    max_per_category: int | None = None
    target_behavior: str | None = None

    @classmethod
    def from_options(cls, options: dict | None, *, behaviors: Sequence[str]) -> Rules:
        options = dict(options or {})
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"retrieval.rules has unknown keys {sorted(unknown)}; "
                f"allowed: {sorted(cls.__dataclass_fields__)}"
            )
        exclude = options.get("exclude", "seen")
        if isinstance(exclude, str) and exclude not in ("seen", "none"):
            exclude = [exclude]
        if not isinstance(exclude, str):
            exclude = tuple(exclude)
            wrong = [b for b in exclude if b not in behaviors]
            if wrong or not exclude:
                raise ValueError(
                    f"retrieval.rules.exclude={list(exclude)}: use seen, none or a list of the "
                    f"model's behaviours {list(behaviors)}"
                )
        cap = options.get("max_per_category")
        if isinstance(cap, numbers.Integral) and not isinstance(cap, bool):
            cap = int(cap)  # np.int64 from a notebook
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(
                f"retrieval.rules.max_per_category={cap!r} must be a positive integer or null"
            )
        target = options.get("target_behavior")
        if target is not None and target not in behaviors:
            raise ValueError(
                f"retrieval.rules.target_behavior={target!r} is not one of the model's "
                f"behaviours {list(behaviors)}"
            )
        lists = {
            k: _item_list(v, k)
            for k in ("allow_list", "deny_list")
            if (v := options.get(k)) is not None
        }
        if lists.get("allow_list") in ((), ""):
            raise ValueError(
                "retrieval.rules.allow_list is empty, which allows no item: list item ids "
                "(inline or a file), or set it to null to allow every item"
            )
        return cls(
            exclude=exclude,
            max_per_category=cap,
            target_behavior=target,
            **lists,
        )

    def check_list_files(self) -> None:
        """A list given as a file name must name a file (read when the job scores)."""
        for name in ("allow_list", "deny_list"):
            source = getattr(self, name)
            if isinstance(source, str):
                _list_path(source, name)

    def excluded_behaviors(self, behaviors: Sequence[str]) -> list[int] | None:
        """Behaviour indices whose events exclude their item (None: nothing is excluded)."""
        if self.exclude == "none":
            return None
        names = behaviors if self.exclude == "seen" else self.exclude
        return [NUM_RESERVED + list(behaviors).index(b) for b in names]

    def blocked(self, catalogue: Catalogue) -> torch.Tensor:
        """(I_c,) bool: True for items never returned (PAD, UNK, deny-listed, not allowed)."""
        blocked = torch.zeros(catalogue.size, dtype=torch.bool)
        blocked[:NUM_RESERVED] = True
        if self.allow_list is not None:
            allowed = _list_indices(self.allow_list, catalogue, "allow_list")
            keep = torch.zeros_like(blocked)
            keep[allowed] = True
            blocked |= ~keep
        if self.deny_list is not None:
            blocked[_list_indices(self.deny_list, catalogue, "deny_list")] = True
        return blocked


def _item_list(value, name: str) -> str | tuple:
    """A list rule as given: a file name (``str`` or path) or ids in any collection (a list, a
    set, a numpy array, a pandas / polars Series), kept as a tuple."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return tuple(value)
    raise ValueError(
        f"retrieval.rules.{name}={value!r}: give a file of item ids (.csv, .parquet, .txt) or a "
        f"list of item ids (e.g. [{value!r}])"
    )


def _list_path(source: str, name: str) -> Path:
    path = Path(source).expanduser()
    if not path.is_file():
        raise DataError(f"retrieval.rules.{name}={source!r}: no such file")
    return path


def read_item_list(source: str | Sequence, name: str) -> tuple[pl.Series, str | None]:
    """Item ids from an inline list or a file (see the module docstring), and the header of a
    one-column CSV without an ``item_id`` column (``None`` otherwise): an id itself when the
    file has no header, which only the catalogue can tell (:func:`_list_indices`)."""
    if not isinstance(source, str):
        return pl.Series(ITEM, list(source)), None
    path = _list_path(source, name)
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        frame = pl.read_parquet(path)
    elif suffix == ".csv":
        try:
            frame = pl.read_csv(path, infer_schema_length=0)  # ids as text: cast to the catalogue's
        except pl.exceptions.NoDataError:  # an empty file: no ids
            frame = pl.DataFrame({ITEM: pl.Series([], dtype=pl.String)})
    elif suffix in (".txt", ""):
        # ids as written (' 042 ' may be an id of a text catalogue); a line that is not one
        # is matched without its surrounding spaces (_list_indices)
        lines = [x for x in path.read_text().splitlines() if x.strip()]
        frame = pl.DataFrame({ITEM: pl.Series(lines, dtype=pl.String)})
    else:
        raise DataError(
            f"retrieval.rules.{name}: {path} is a {suffix} file; use .csv, .parquet or .txt"
        )
    if ITEM in frame.columns:
        return frame[ITEM], None
    if frame.width == 1:
        return frame.to_series().alias(ITEM), frame.columns[0] if suffix == ".csv" else None
    raise DataError(
        f"retrieval.rules.{name}: {path} has columns {frame.columns}; give it an {ITEM!r} "
        "column (or a single column of ids)"
    )


def _list_indices(source, catalogue: Catalogue, name: str) -> torch.Tensor:
    ids, header = read_item_list(source, name)
    if header is not None and catalogue.index_of(pl.Series(ITEM, [header]))[0] >= NUM_RESERVED:
        # a one-column CSV of ids without a header line: its first line is an id too
        log.info("retrieval.rules.%s: %s has no header line; its first line is an id", name, source)
        ids = pl.concat([pl.Series(ITEM, [header], dtype=ids.dtype), ids])
    if ids.len() == 0 and name == "deny_list":  # a nightly file of nothing out of stock
        log.info("retrieval.rules.deny_list lists no item today: nothing is denied")
        return torch.zeros(0, dtype=torch.long)
    if ids.len() == 0:
        raise DataError(
            f"retrieval.rules.{name} is empty, which allows no item: list at least one item id, "
            "or set it to null to allow every item"
        )
    found = catalogue.index_of(ids)
    if ids.dtype == pl.String and (found < NUM_RESERVED).any():
        # an id as written first, so ' 7' and '7' stay two ids of a text catalogue, as in the
        # log; else without the spaces around it (a hand-written list's stray blanks)
        found = np.where(found < NUM_RESERVED, catalogue.index_of(ids.str.strip_chars()), found)
    unmatched = found < NUM_RESERVED
    if ids.dtype == pl.String and unmatched.any() and catalogue.items.schema[ITEM].is_integer():
        # a whole number written as a float (109500.0: a pandas id column made float by a NaN,
        # an earlier recsys's outputs) names the integer id, as in the log (whole_number_ids)
        written = ids.filter(unmatched).str.strip_chars().cast(pl.Float64, strict=False)
        whole = whole_number_ids(written.to_frame().lazy(), [ITEM]).collect()[ITEM]
        if whole.dtype == pl.Int64:
            found[unmatched] = catalogue.index_of(whole)
    index = torch.from_numpy(found)
    unknown = int((index < NUM_RESERVED).sum())
    if unknown == ids.len() and name == "allow_list":
        raise DataError(
            f"retrieval.rules.allow_list: none of its {ids.len()} ids (e.g. "
            f"{ids.head(3).to_list()}) is in the catalogue (model vocabulary + scoring log), "
            "which allows no item: list ids of the catalogue (as the log writes them), or set "
            "it to null to allow every item"
        )
    if unknown:
        log.warning(
            "retrieval.rules.%s: %d of %d ids are not in the catalogue (model vocabulary + "
            "scoring log) and have no effect",
            name,
            unknown,
            ids.len(),
        )
    return index[index >= NUM_RESERVED]


def cap_per_category(
    items: torch.Tensor, category: torch.Tensor, valid: torch.Tensor, cap: int | None
) -> torch.Tensor:
    """Which candidates survive "at most ``cap`` per category", taking them best first.

    Shapes: items (B, D) catalogue indices best first; category (I_c,) long (0 = none: no
    cap); valid (B, D) bool. Returns keep (B, D) bool.
    """
    if cap is None:
        return valid
    depth = items.shape[1]
    cats = torch.where(valid, category[items], -1)  # (B, D); invalid never counted
    # rank of each candidate within its category: sort by (category, position), stable
    key = cats * depth + torch.arange(depth, device=items.device)  # (B, D)
    order = key.argsort(dim=1)
    sorted_cats = cats.gather(1, order)
    first = torch.ones_like(sorted_cats, dtype=torch.bool)
    first[:, 1:] = sorted_cats[:, 1:] != sorted_cats[:, :-1]
    position = torch.arange(depth, device=items.device).expand_as(order)
    group_start = torch.where(first, position, 0).cummax(dim=1).values
    rank_sorted = position - group_start  # (B, D)
    rank = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    return valid & ((rank < cap) | (cats == 0))


def take_first(keep: torch.Tensor, k: int) -> torch.Tensor:
    """Positions (B, k) of the first ``k`` True entries per row (-1 where a row has fewer,
    also when there are fewer than ``k`` candidates: D < k).

    Shapes: keep (B, D) bool."""
    depth = keep.shape[1]
    position = torch.arange(depth, device=keep.device).expand_as(keep)
    ranked = torch.where(keep, position, depth + position)  # kept first, in order
    chosen = ranked.argsort(dim=1)[:, :k]
    chosen = torch.where(keep.gather(1, chosen), chosen, -1)
    return torch.nn.functional.pad(chosen, (0, k - chosen.shape[1]), value=-1)
