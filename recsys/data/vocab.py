"""Vocabularies for items, categories and behaviours: fitted on the training window only.

Index 0 is PAD and 1 is UNK in every vocabulary; real entries start at 2. Items are ordered by
training frequency (most frequent first, ties by id) so the layout is deterministic. Each item
carries the index of its category (its most frequent category in training), which is how every
model finds a token's category.

A :class:`Vocab` round-trips through Parquet (the prepared dataset folder) and through plain
Python lists (inside checkpoints loaded with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recsys.schema import CATEGORY, ITEM, NUM_RESERVED, PAD_IDX, UNK_IDX

INDEX = "index"
ITEM_INDEX = "item_index"
CATEGORY_INDEX = "category_index"
BEHAVIOR = "behavior"
TRAIN_COUNT = "train_count"
FILES = {
    "items": "items.parquet",
    "categories": "categories.parquet",
    "behaviors": "behaviors.parquet",
}


@dataclass(frozen=True)
class Vocab:
    """``items``: ``item_id, index, category_index, train_count`` (real items only);
    ``categories``: ``category, index``; ``behaviors``: names in funnel order (index 2, 3, ...)."""

    items: pl.DataFrame
    categories: pl.DataFrame
    behaviors: tuple[str, ...]

    # sizes include PAD and UNK
    @property
    def num_items(self) -> int:
        return NUM_RESERVED + self.items.height

    @property
    def num_categories(self) -> int:
        return NUM_RESERVED + self.categories.height

    @property
    def num_behaviors(self) -> int:
        return NUM_RESERVED + len(self.behaviors)

    @classmethod
    def fit(
        cls, train: pl.LazyFrame, *, behaviors: tuple[str, ...], min_item_count: int = 1
    ) -> Vocab:
        """Fit on training events (canonical columns). Items seen fewer than ``min_item_count``
        times map to UNK."""
        counts = (
            train.group_by(ITEM)
            .agg(
                pl.len().alias(TRAIN_COUNT),
                # most frequent category; ties go to the smallest name for determinism
                pl.col(CATEGORY).drop_nulls().mode().sort().first().alias(CATEGORY),
            )
            .filter(pl.col(TRAIN_COUNT) >= min_item_count)
            .sort([TRAIN_COUNT, ITEM], descending=[True, False])
            .collect()
        )
        categories = (
            counts.lazy()
            .drop_nulls(CATEGORY)
            .group_by(CATEGORY)
            .agg(pl.col(TRAIN_COUNT).sum().alias("_n"))
            .sort(["_n", CATEGORY], descending=[True, False])
            .with_row_index(INDEX, offset=NUM_RESERVED)
            .select(CATEGORY, pl.col(INDEX).cast(pl.Int32))
            .collect()
        )
        items = (
            counts.with_row_index(INDEX, offset=NUM_RESERVED)
            .join(categories.rename({INDEX: CATEGORY_INDEX}), on=CATEGORY, how="left")
            .select(
                ITEM,
                pl.col(INDEX).cast(pl.Int32),
                pl.col(CATEGORY_INDEX).fill_null(UNK_IDX).cast(pl.Int32),
                pl.col(TRAIN_COUNT).cast(pl.Int64),
            )
            .sort(INDEX)
        )
        return cls(items=items, categories=categories, behaviors=tuple(behaviors))

    # -- applying ---------------------------------------------------------------------------
    def encode(self, lf: pl.LazyFrame, *, behavior_column: str) -> pl.LazyFrame:
        """Add ``item_index`` (UNK for items outside the vocabulary) and ``behavior_index``."""
        item_map = self.items.lazy().select(ITEM, pl.col(INDEX).alias(ITEM_INDEX))
        behavior_map = {b: NUM_RESERVED + i for i, b in enumerate(self.behaviors)}
        return lf.join(item_map, on=ITEM, how="left", maintain_order="left").with_columns(
            pl.col(ITEM_INDEX).fill_null(UNK_IDX).cast(pl.Int32),
            pl.col(behavior_column)
            .replace_strict(behavior_map, default=UNK_IDX, return_dtype=pl.Int8)
            .alias("behavior_index"),
        )

    def item_category_table(self) -> list[int]:
        """Category index for every item index (PAD -> PAD, UNK -> UNK): the model's lookup."""
        return [PAD_IDX, UNK_IDX, *self.items[CATEGORY_INDEX].to_list()]

    def item_ids(self) -> list:
        """Raw item id for every item index; PAD and UNK are ``None``."""
        return [None, None, *self.items[ITEM].to_list()]

    # -- persistence ------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.items.write_parquet(folder / FILES["items"])
        self.categories.write_parquet(folder / FILES["categories"])
        pl.DataFrame(
            {INDEX: range(NUM_RESERVED, self.num_behaviors), BEHAVIOR: list(self.behaviors)},
            schema={INDEX: pl.Int32, BEHAVIOR: pl.String},
        ).write_parquet(folder / FILES["behaviors"])

    @classmethod
    def load(cls, folder: Path) -> Vocab:
        missing = [f for f in FILES.values() if not (folder / f).exists()]
        if missing:
            raise FileNotFoundError(
                f"{folder} lacks vocabulary file(s) {missing}: run the prepare step first"
            )
        behaviors = pl.read_parquet(folder / FILES["behaviors"]).sort(INDEX)[BEHAVIOR]
        return cls(
            items=pl.read_parquet(folder / FILES["items"]),
            categories=pl.read_parquet(folder / FILES["categories"]),
            behaviors=tuple(behaviors.to_list()),
        )

    def to_plain(self) -> dict:
        """Plain lists only: safe inside a ``weights_only`` checkpoint."""
        return {
            "item_id": self.items[ITEM].to_list(),
            "item_category_index": self.items[CATEGORY_INDEX].to_list(),
            "item_train_count": self.items[TRAIN_COUNT].to_list(),
            "category": self.categories[CATEGORY].to_list(),
            "behaviors": list(self.behaviors),
        }

    @classmethod
    def from_plain(cls, plain: dict) -> Vocab:
        n_items, n_categories = len(plain["item_id"]), len(plain["category"])
        items = pl.DataFrame(
            {
                ITEM: plain["item_id"],
                INDEX: pl.int_range(NUM_RESERVED, NUM_RESERVED + n_items, eager=True),
                CATEGORY_INDEX: plain["item_category_index"],
                TRAIN_COUNT: plain["item_train_count"],
            }
        ).with_columns(
            pl.col(INDEX).cast(pl.Int32),
            pl.col(CATEGORY_INDEX).cast(pl.Int32),
            pl.col(TRAIN_COUNT).cast(pl.Int64),
        )
        categories = pl.DataFrame(
            {
                CATEGORY: pl.Series(plain["category"], dtype=pl.String),
                INDEX: pl.int_range(NUM_RESERVED, NUM_RESERVED + n_categories, eager=True),
            }
        ).with_columns(pl.col(INDEX).cast(pl.Int32))
        return cls(items=items, categories=categories, behaviors=tuple(plain["behaviors"]))

    def content_hash(self) -> str:
        """sha256 over the vocabulary's contents (stable across runs and machines)."""
        payload = json.dumps(self.to_plain(), sort_keys=True, default=str).encode()
        return hashlib.sha256(payload).hexdigest()
