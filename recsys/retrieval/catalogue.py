"""What a scoring job may recommend: the model's items plus items new in the scoring log.

Catalogue index ``i`` names one item for the whole job:

- ``0`` and ``1`` are PAD and UNK (never recommended);
- ``2 .. num_model_items - 1`` are the model's vocabulary, in the vocabulary's order (the item
  key table's rows), so the model scores them directly;
- ``num_model_items ..`` are items the model has never seen, found in the scoring log. The
  model has no key for them; only the cold-start popularity fallback can recommend them.

Each item has a **category**: its one category, or, for items with an attribute set (the
S3-Rec files: category path nodes and brand), the *least frequent* attribute of its set — the
most specific one. New items take theirs from the item table (``data.items``) where it lists
them, else from the log's events. ``popularity`` counts the
target-behaviour events (every event when no target is set) in the log's last
``popularity_days`` days before ``as_of``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

from recsys.data.vocab import ATTRIBUTE, ATTRIBUTE_INDICES, INDEX, Vocab
from recsys.schema import ATTRIBUTES, EVENT_TYPE, ITEM, NUM_RESERVED, TIMESTAMP

CATALOGUE_INDEX = "catalogue_index"
CATEGORY_INDEX = "category_index"
ITEM_CATEGORY = "item_category"  # output column: the category text


@dataclass
class Catalogue:
    """Shapes: I_c = catalogue size (PAD and UNK included).

    - ``items``: ``item_id, catalogue_index, item_category, category_index, in_model,
      popularity`` (one row per real item);
    - ``category``: (I_c,) long category index (0 = none); ``popularity``: (I_c,) float
      recent event counts; ``num_model_items``: the model's vocabulary size.
    """

    items: pl.DataFrame
    category: torch.Tensor
    popularity: torch.Tensor
    num_model_items: int

    @property
    def size(self) -> int:
        return NUM_RESERVED + self.items.height

    @property
    def num_categories(self) -> int:
        """Category vocabulary size, 0 (none) included."""
        return int(self.category.max()) + 1 if self.size else 1

    def item_ids(self, index: np.ndarray) -> pl.Series:
        """Raw ids of catalogue indices (all >= NUM_RESERVED)."""
        return self.items[ITEM].gather(index - NUM_RESERVED)

    def categories(self, index: np.ndarray) -> pl.Series:
        return self.items[ITEM_CATEGORY].gather(index - NUM_RESERVED)

    @classmethod
    def build(
        cls,
        vocab: Vocab,
        events: pl.DataFrame,
        *,
        target_behavior: str | None,
        popularity_since: int | None,
        item_table: pl.DataFrame | None = None,
    ) -> Catalogue:
        """``events``: the scoring log (``item_id, event_type, timestamp`` as Unix seconds,
        ``attributes``); ``popularity_since``: first second counted in ``popularity``;
        ``item_table``: ``item_id, attributes`` (list), the attribute sets of new items it
        lists (the model's items keep the sets they were trained with)."""
        names = vocab.attributes.select(pl.col(INDEX).alias("_rank"), ATTRIBUTE)
        model_items = (
            vocab.items.select(
                ITEM,
                pl.col(INDEX).alias(CATALOGUE_INDEX),
                # attribute indices run in training-frequency order: the largest is the rarest
                pl.col(ATTRIBUTE_INDICES).list.max().alias("_rank"),
            )
            .join(names, on="_rank", how="left", maintain_order="left")
            .select(
                ITEM,
                CATALOGUE_INDEX,
                pl.col(ATTRIBUTE).alias(ITEM_CATEGORY),
                pl.lit(True).alias("in_model"),
            )
        )
        # new items: the rarest attribute the vocabulary knows, else the first one listed
        new_events = (
            events.lazy()
            .select(pl.col(ITEM).cast(vocab.items.schema[ITEM], strict=False), ATTRIBUTES)
            .drop_nulls(ITEM)
            .join(model_items.lazy().select(ITEM), on=ITEM, how="anti")
        )
        side = new_events
        if item_table is not None:  # a listed item's set is the table's (rows: their union)
            listed = (
                item_table.lazy()
                .select(pl.col(ITEM).cast(vocab.items.schema[ITEM], strict=False), ATTRIBUTES)
                .drop_nulls()
                .join(new_events.select(ITEM), on=ITEM, how="semi")
            )
            side = pl.concat([listed, new_events.join(listed, on=ITEM, how="anti")])
        categories = (
            side.explode(ATTRIBUTES)
            .drop_nulls(ATTRIBUTES)
            .with_columns(pl.int_range(pl.len()).alias("_order"))
            .join(names.lazy(), left_on=ATTRIBUTES, right_on=ATTRIBUTE, how="left")
            .sort(["_rank", "_order"], descending=[True, False], nulls_last=True)
            .group_by(ITEM, maintain_order=True)
            .agg(pl.col(ATTRIBUTES).first().alias(ITEM_CATEGORY))
        )
        new_items = (
            new_events.select(ITEM)
            .unique()
            .join(categories, on=ITEM, how="left")
            .sort(ITEM)
            .collect(engine="in-memory")
        )
        items = pl.concat(
            [
                model_items,
                new_items.with_row_index(CATALOGUE_INDEX, offset=vocab.num_items).select(
                    ITEM,
                    pl.col(CATALOGUE_INDEX).cast(pl.Int32),
                    ITEM_CATEGORY,
                    pl.lit(False).alias("in_model"),
                ),
            ]
        )
        counted = events.lazy().with_columns(pl.col(ITEM).cast(items.schema[ITEM], strict=False))
        if target_behavior is not None:
            counted = counted.filter(pl.col(EVENT_TYPE) == target_behavior)
        if popularity_since is not None:
            counted = counted.filter(pl.col(TIMESTAMP).dt.epoch("s") >= popularity_since)
        counts = counted.group_by(ITEM).agg(pl.len().alias("popularity")).collect()
        items = (
            items.join(counts, on=ITEM, how="left", maintain_order="left")
            .with_columns(pl.col("popularity").fill_null(0).cast(pl.Float32))
            .with_columns(
                pl.col(ITEM_CATEGORY)
                .rank("dense")
                .fill_null(0)
                .cast(pl.Int64)
                .alias(CATEGORY_INDEX)
            )
        )
        reserved = torch.zeros(NUM_RESERVED)
        return cls(
            items=items,
            category=torch.cat(
                [reserved.long(), torch.from_numpy(items[CATEGORY_INDEX].to_numpy().copy())]
            ),
            popularity=torch.cat(
                [reserved, torch.from_numpy(items["popularity"].to_numpy().copy())]
            ),
            num_model_items=vocab.num_items,
        )

    def index_of(self, item_ids: pl.Series) -> np.ndarray:
        """Catalogue index of each raw id (UNK for ids not in the catalogue)."""
        lookup = self.items.select(ITEM, CATALOGUE_INDEX)
        frame = pl.DataFrame({ITEM: item_ids.cast(lookup.schema[ITEM], strict=False)})
        joined = frame.join(lookup, on=ITEM, how="left", maintain_order="left")
        return joined[CATALOGUE_INDEX].fill_null(1).to_numpy().astype(np.int64)
