"""Vocabularies for items, item attributes and behaviours: fitted on the training window only.

Index 0 is PAD and 1 is UNK in every vocabulary; real entries start at 2. Items are ordered by
training frequency (most frequent first, ties by id) so the layout is deterministic. Each item
carries its **attribute set** (side information): the attributes an item table gives it, or
else the most frequent category / attribute set of its training events (listed in any order);
an item with none has ``[UNK]``. A category is an attribute set of one. Attributes are indexed
by the training frequency of the items that carry them. This is how every model finds a
token's side information: ``item_attribute_table()`` is an (items x width) index table, padded
with PAD.

A :class:`Vocab` round-trips through Parquet (the prepared dataset folder) and through plain
Python lists (inside checkpoints loaded with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from recsys.data.io import DataError, whole_number_ids
from recsys.data.validate import (
    ATTRIBUTE_SEPARATOR,
    LOCAL,
    SEPARATOR_EXAMPLE,
    SEPARATOR_ROWS,
    attribute_sets,
    canonical_ids,
)
from recsys.schema import ATTRIBUTES, ITEM, NUM_RESERVED, PAD_IDX, TIMESTAMP, UNK_IDX

log = logging.getLogger(__name__)

INDEX = "index"
ITEM_INDEX = "item_index"
ATTRIBUTE = "attribute"
ATTRIBUTE_INDICES = "attribute_indices"
BEHAVIOR = "behavior"
TRAIN_COUNT = "train_count"
FILES = {
    "items": "items.parquet",
    "attributes": "attributes.parquet",
    "behaviors": "behaviors.parquet",
}
_COLUMNS = {  # what Vocab.load reads from each file
    "items": (ITEM, INDEX, ATTRIBUTE_INDICES, TRAIN_COUNT),
    "attributes": (ATTRIBUTE, INDEX),
    "behaviors": (INDEX, BEHAVIOR),
}
_KEY = "_attribute_key"
EVENTS = "_events"  # training events of one (item, attribute set) pair, counted already
# integer item ids whose range holds at most this many ids per item are encoded by a gather
# from a table over the range (4 bytes per id), not by a join
DENSE_IDS_PER_ITEM = 8


def _attribute_key(events: pl.LazyFrame) -> pl.Expr:
    """Each event's attribute set as one key (attribute lists joined; a key already as is)."""
    side = pl.col(ATTRIBUTES)
    if isinstance(events.collect_schema()[ATTRIBUTES], pl.List):
        side = side.list.join(ATTRIBUTE_SEPARATOR)
    return side.alias(_KEY)


def count_pairs(train: pl.LazyFrame) -> pl.LazyFrame:
    """Training events counted by item and attribute set, with the pair's last event time: all
    that :meth:`Vocab.fit` (which sums such counts) and a dated item table read of them, so
    that each partition of a large log can be counted on its own."""
    return train.group_by(ITEM, _attribute_key(train)).agg(
        pl.len().alias(EVENTS), pl.col(TIMESTAMP).max()
    )


@dataclass(frozen=True)
class Vocab:
    """``items``: ``item_id, index, attribute_indices (list[int32]), train_count`` (real items
    only); ``attributes``: ``attribute, index``; ``behaviors``: names in funnel order (index 2,
    3, ...)."""

    items: pl.DataFrame
    attributes: pl.DataFrame
    behaviors: tuple[str, ...]

    # sizes include PAD and UNK
    @property
    def num_items(self) -> int:
        return NUM_RESERVED + self.items.height

    @property
    def num_attributes(self) -> int:
        return NUM_RESERVED + self.attributes.height

    @property
    def num_behaviors(self) -> int:
        return NUM_RESERVED + len(self.behaviors)

    @property
    def attribute_width(self) -> int:
        """Columns of :meth:`item_attribute_table`: the largest attribute set (at least 1)."""
        if self.items.height == 0:
            return 1
        return max(1, int(self.items[ATTRIBUTE_INDICES].list.len().max()))

    def encoder_sizes(self) -> dict[str, int]:
        """The encoder arguments this vocabulary sets (an encoder takes those it has):
        ``num_items``, ``num_attributes``, ``item_attribute_width``, ``num_behaviors``."""
        return {
            "num_items": self.num_items,
            "num_attributes": self.num_attributes,
            "item_attribute_width": self.attribute_width,
            "num_behaviors": self.num_behaviors,
        }

    @classmethod
    def fit(
        cls,
        train: pl.LazyFrame,
        *,
        behaviors: tuple[str, ...],
        min_item_count: int = 1,
        item_table: pl.LazyFrame | None = None,
        max_item_attributes: int = 32,
        refuse_joined: Callable[[Mapping[str, object]], None] | None = None,
    ) -> Vocab:
        """Fit on training events (``item_id`` and ``attributes``: attribute lists or the
        keys of :func:`recsys.data.validate.attribute_key`), or on their :func:`count_pairs`.

        ``item_table`` (``item_id, attributes``) gives items their attribute sets; items it
        does not list fall back to their training events. Items seen fewer than
        ``min_item_count`` times map to UNK; an item keeps its ``max_item_attributes`` most
        frequent attributes. ``refuse_joined`` (for events whose attribute keys are single text
        values, :func:`recsys.data.validate.single_text_side`) is given the training rows and
        one value when a key holds :data:`ATTRIBUTE_SEPARATOR`, which would split it into
        several attributes (:func:`recsys.data.validate.refuse_separator_inside`).
        """
        if EVENTS in train.collect_schema():  # pairs counted already (by count_pairs)
            pairs = train.group_by(ITEM, _KEY).agg(pl.col(EVENTS).sum().alias("_n"))
        else:
            pairs = train.group_by(ITEM, _attribute_key(train)).agg(pl.len().alias("_n"))
        pairs = pairs.collect(engine="streaming").with_columns(  # faster even in memory
            pl.col(_KEY).cast(pl.String)
        )
        joined = pairs[_KEY].str.contains(ATTRIBUTE_SEPARATOR, literal=True)
        if refuse_joined is not None and joined.any():
            held = pairs.filter(joined)
            refuse_joined({SEPARATOR_ROWS: int(held["_n"].sum()), SEPARATOR_EXAMPLE: held[_KEY][0]})
        if joined.any():
            # a set, in whatever order (or with repeats) its events list it: ["y", "x"] and
            # ["x", "y", "x"] are the set {x, y}, counted together (once per distinct pair)
            canonical = attribute_sets(pl.col(_KEY)).list.unique().list.sort()
            pairs = pairs.group_by(ITEM, canonical.list.join(ATTRIBUTE_SEPARATOR).alias(_KEY)).agg(
                pl.col("_n").sum()
            )
        if pairs[ITEM].n_unique() == pairs.height:
            # one attribute set per item (e.g. one category each): nothing to choose (the
            # choice below sorts every pair by its text key: ~3x this step's time at 1 M events)
            counts = pairs.lazy().select(ITEM, pl.col("_n").alias(TRAIN_COUNT), _KEY)
        else:
            # each item's most frequent attribute set in training; ties -> smallest key
            chosen = (
                pairs.lazy()
                .drop_nulls(_KEY)
                .sort(["_n", _KEY], descending=[True, False])
                .unique(ITEM, keep="first")
                .select(ITEM, _KEY)
            )
            counts = (
                pairs.lazy()
                .group_by(ITEM)
                .agg(pl.col("_n").sum().alias(TRAIN_COUNT))
                .join(chosen, on=ITEM, how="left")
            )
        counts = counts.filter(pl.col(TRAIN_COUNT) >= min_item_count)
        if item_table is not None:
            listed = (
                item_table.join(counts.select(ITEM), on=ITEM, how="semi")
                .explode(ATTRIBUTES)
                .drop_nulls(ATTRIBUTES)
                .group_by(ITEM)
                .agg(
                    pl.col(ATTRIBUTES)
                    .unique()
                    .sort()
                    .str.join(ATTRIBUTE_SEPARATOR)
                    .alias("_listed")
                )
            )
            counts = (
                counts.join(listed, on=ITEM, how="left")
                .with_columns(pl.coalesce("_listed", _KEY).alias(_KEY))
                .drop("_listed")
            )
        counts = counts.sort([TRAIN_COUNT, ITEM], descending=[True, False]).collect(engine=LOCAL)
        # Attribute work happens once per distinct attribute set, not once per item.
        sets = (
            counts.lazy()
            .drop_nulls(_KEY)
            .group_by(_KEY)
            .agg(pl.col(TRAIN_COUNT).sum(), pl.len().alias("_items"))
            .with_columns(attribute_sets(pl.col(_KEY)).list.unique().alias(ATTRIBUTES))
            .collect(engine=LOCAL)
        )
        attributes = (
            sets.lazy()
            .select(ATTRIBUTES, TRAIN_COUNT)
            .explode(ATTRIBUTES)
            .group_by(ATTRIBUTES)
            .agg(pl.col(TRAIN_COUNT).sum().alias("_n"))
            .sort(["_n", ATTRIBUTES], descending=[True, False])
            .with_row_index(INDEX, offset=NUM_RESERVED)
            .select(pl.col(ATTRIBUTES).alias(ATTRIBUTE), pl.col(INDEX).cast(pl.Int32))
            .collect(engine=LOCAL)
        )
        set_indices = (
            sets.lazy()
            .select(_KEY, ATTRIBUTES)
            .explode(ATTRIBUTES)
            .join(attributes.lazy(), left_on=ATTRIBUTES, right_on=ATTRIBUTE)
            .group_by(_KEY)
            .agg(pl.col(INDEX).sort().head(max_item_attributes).alias(ATTRIBUTE_INDICES))
            .collect(engine=LOCAL)
        )
        unknown = pl.lit([UNK_IDX], dtype=pl.List(pl.Int32))
        items = (
            counts.lazy()
            .with_row_index(INDEX, offset=NUM_RESERVED)
            .join(set_indices.lazy(), on=_KEY, how="left", maintain_order="left")
            .select(
                ITEM,
                pl.col(INDEX).cast(pl.Int32),
                pl.col(ATTRIBUTE_INDICES).fill_null(unknown),
                pl.col(TRAIN_COUNT).cast(pl.Int64),
            )
            .collect(engine=LOCAL)
        )
        truncated = int(
            sets.filter(pl.col(ATTRIBUTES).list.len() > max_item_attributes)["_items"].sum()
        )
        if truncated:
            log.info(
                "%d item(s) have more than max_item_attributes=%d attributes: kept the most "
                "frequent ones",
                truncated,
                max_item_attributes,
            )
        return cls(items=items, attributes=attributes, behaviors=tuple(behaviors))

    # -- applying ---------------------------------------------------------------------------
    def encode(self, lf: pl.LazyFrame, *, behavior_column: str) -> pl.LazyFrame:
        """Add ``item_index`` (UNK for items outside the vocabulary) and ``behavior_index``.

        Item ids of another type than the vocabulary's are cast to it first (``"42"`` finds
        item 42; ``"abc"`` in an integer vocabulary is UNK)."""
        vocab_dtype, log_dtype = self.items.schema[ITEM], lf.collect_schema()[ITEM]
        if log_dtype != vocab_dtype:
            # An id that cannot be cast (text in an integer vocabulary) cannot be known: UNK.
            log.info("item ids are %s, the vocabulary's %s: casting", log_dtype, vocab_dtype)
            lf = lf.with_columns(pl.col(ITEM).cast(vocab_dtype, strict=False))
        # behaviour names -> codes in the vocabulary's order (unknown names: null -> UNK); the
        # prepared events' Enum of the same behaviours casts for free (a name look-up per row
        # took a quarter of this step at 1 M events)
        behavior = pl.col(behavior_column).cast(pl.Enum(self.behaviors), strict=False)
        behavior_index = (
            (behavior.to_physical().cast(pl.Int8) + NUM_RESERVED)
            .fill_null(UNK_IDX)
            .alias("behavior_index")
        )
        dense = self._dense_item_index
        if dense is not None:
            return lf.with_columns(dense.alias(ITEM_INDEX), behavior_index)
        item_map = self.items.lazy().select(ITEM, pl.col(INDEX).alias(ITEM_INDEX))
        return lf.join(item_map, on=ITEM, how="left", maintain_order="left").with_columns(
            pl.col(ITEM_INDEX).fill_null(UNK_IDX).cast(pl.Int32), behavior_index
        )

    @functools.cached_property  # built once, not once per partition encoded
    def _dense_item_index(self) -> pl.Expr | None:
        """For integer item ids whose range holds at most :data:`DENSE_IDS_PER_ITEM` ids per
        item (catalogue row numbers, most public logs): each event's item index by a gather
        from a table over that range (UNK outside it and for the ids in it that are not
        items), instead of a join (1 M events: ~5 ms against ~11 ms). ``None`` otherwise."""
        ids = self.items[ITEM]
        if not ids.dtype.is_integer() or ids.len() == 0:
            return None
        low, high = ids.min(), ids.max()
        span = high - low + 1
        if span > DENSE_IDS_PER_ITEM * ids.len():
            return None
        table = np.full(span, UNK_IDX, dtype=np.int32)
        table[(ids - low).to_numpy()] = self.items[INDEX].to_numpy()
        item = pl.col(ITEM)
        offset = (item - low).clip(0, span - 1)  # (wraps outside the range: not used there)
        return (
            pl.when(item.is_between(low, high))
            .then(pl.lit(pl.Series(table)).gather(offset))
            .otherwise(UNK_IDX)
            .cast(pl.Int32)
        )

    def item_attribute_array(self) -> np.ndarray:
        """Attribute indices of every item index, padded with PAD to :attr:`attribute_width`
        (PAD item -> all PAD, UNK item -> ``[UNK]``): the models' side-information lookup, an
        (items, width) int64 array filled from the flat attribute lists in one scatter (a
        Python list per item took 0.5 s of a training's setup at 149 k items)."""
        width = self.attribute_width
        table = np.full((NUM_RESERVED + self.items.height, width), PAD_IDX, dtype=np.int64)
        table[UNK_IDX, 0] = UNK_IDX
        lists = self.items[ATTRIBUTE_INDICES]
        lengths = lists.list.len().fill_null(0).cast(pl.Int64).to_numpy()
        row = np.repeat(np.arange(NUM_RESERVED, len(table)), lengths)
        column = np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        table[row, column] = lists.explode().drop_nulls().to_numpy()
        return table

    def item_attribute_table(self) -> list[list[int]]:
        """:meth:`item_attribute_array` as lists."""
        return self.item_attribute_array().tolist()

    def item_train_counts(self) -> list[int]:
        """Training-window event count of every item index (0 for PAD and UNK): popularity
        baselines, popularity-sampled negatives."""
        return [0, 0, *self.items[TRAIN_COUNT].to_list()]

    def item_ids(self) -> list:
        """Raw item id for every item index; PAD and UNK are ``None``."""
        return [None, None, *self.items[ITEM].to_list()]

    def missing_id_indices(self) -> list[int]:
        """Item indices whose id preparation now reads as a missing one
        (:func:`~recsys.data.validate.canonical_ids`: an empty text id ``""``), which a
        vocabulary prepared before that rule holds as an item like any other."""
        ids = canonical_ids(ITEM, self.items.schema[ITEM])
        if ids is None:
            return []
        return self.items.filter(ids.is_null() & pl.col(ITEM).is_not_null())[INDEX].to_list()

    # -- persistence ------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.items.write_parquet(folder / FILES["items"])
        self.attributes.write_parquet(folder / FILES["attributes"])
        pl.DataFrame(
            {INDEX: range(NUM_RESERVED, self.num_behaviors), BEHAVIOR: list(self.behaviors)},
            schema={INDEX: pl.Int32, BEHAVIOR: pl.String},
        ).write_parquet(folder / FILES["behaviors"])

    @classmethod
    def load(cls, folder: str | Path) -> Vocab:
        folder = Path(folder)
        missing = [f for f in FILES.values() if not (folder / f).exists()]
        if missing:
            raise FileNotFoundError(
                f"{folder} lacks vocabulary file(s) {missing}: run the prepare step first"
            )
        frames = {name: _read_vocab_file(folder / file, name) for name, file in FILES.items()}
        return cls(
            items=_ids_as_read_now(frames["items"]),
            attributes=frames["attributes"],
            behaviors=tuple(frames["behaviors"].sort(INDEX)[BEHAVIOR].to_list()),
        )

    def to_plain(self) -> dict:
        """Plain lists only: safe inside a ``weights_only`` checkpoint."""
        return {
            "item_id": self.items[ITEM].to_list(),
            "item_id_type": str(self.items.schema[ITEM]),  # (Python ints: Int64 or UInt64)
            "item_attributes": self.items[ATTRIBUTE_INDICES].to_list(),
            "item_train_count": self.items[TRAIN_COUNT].to_list(),
            "attribute": self.attributes[ATTRIBUTE].to_list(),
            "behaviors": list(self.behaviors),
        }

    @classmethod
    def from_plain(cls, plain: dict) -> Vocab:
        n_items, n_attributes = len(plain["item_id"]), len(plain["attribute"])
        # the ids' type as prepared (a checkpoint written before it was kept: inferred)
        id_type = _ID_TYPES.get(plain.get("item_id_type"))
        items = pl.DataFrame(
            {
                ITEM: pl.Series(plain["item_id"], dtype=id_type),
                INDEX: pl.int_range(NUM_RESERVED, NUM_RESERVED + n_items, eager=True),
                ATTRIBUTE_INDICES: pl.Series(plain["item_attributes"], dtype=pl.List(pl.Int32)),
                TRAIN_COUNT: plain["item_train_count"],
            }
        ).with_columns(pl.col(INDEX).cast(pl.Int32), pl.col(TRAIN_COUNT).cast(pl.Int64))
        items = _ids_as_read_now(items)
        attributes = pl.DataFrame(
            {
                ATTRIBUTE: pl.Series(plain["attribute"], dtype=pl.String),
                INDEX: pl.int_range(NUM_RESERVED, NUM_RESERVED + n_attributes, eager=True),
            }
        ).with_columns(pl.col(INDEX).cast(pl.Int32))
        return cls(items=items, attributes=attributes, behaviors=tuple(plain["behaviors"]))

    def content_hash(self) -> str:
        """sha256 over the vocabulary's contents (stable across runs and machines): every
        column's type, length and values as little-endian bytes (0.01 s for 150 k items,
        where hashing :meth:`to_plain` as JSON took 0.1 s)."""
        digest = hashlib.sha256()
        items = self.items
        for label, series in (
            ("item_id", items[ITEM]),
            ("item_attributes_len", items[ATTRIBUTE_INDICES].list.len()),
            ("item_attributes", items[ATTRIBUTE_INDICES].explode()),
            ("item_train_count", items[TRAIN_COUNT]),
            ("attribute", self.attributes[ATTRIBUTE]),
            ("behaviors", pl.Series(list(self.behaviors), dtype=pl.String)),
        ):
            _feed(digest, label, series)
        return digest.hexdigest()


def _ids_as_read_now(items: pl.DataFrame) -> pl.DataFrame:
    """A saved vocabulary's items with their ids as preparation reads such ids now
    (:func:`~recsys.data.io.whole_number_ids`): whole-number float ids, which a vocabulary
    prepared before that rule holds (``10.0``), as Int64. So a model or prepared folder of
    that time scores, evaluates, teaches and warm-starts on a new preparation of its log,
    whose vocabulary is the same but for that type."""
    if not items.schema[ITEM].is_float():
        return items
    return whole_number_ids(items.lazy(), [ITEM]).collect()


# the types prepared ids come in (recsys.data.validate.canonical_id_type), by name
_ID_TYPES = {str(dtype): dtype for dtype in (pl.Int64, pl.UInt64, pl.String, pl.Float64)}


def _feed(digest, label: str, series: pl.Series) -> None:
    """Add ``series`` to ``digest`` unambiguously: label, type, length, null mask, values
    (numbers as little-endian bytes; anything else as UTF-8 text with each value's length)."""
    digest.update(f"{label}:{series.dtype}:{series.len()}:{series.null_count()}\n".encode())
    if series.null_count():
        digest.update(np.packbits(series.is_null().to_numpy()).tobytes())
    if series.dtype.is_numeric():
        values = series.fill_null(0).to_numpy()
        digest.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
        return
    text = series.cast(pl.String).fill_null("")
    digest.update(text.str.len_bytes().to_numpy().astype("<u4").tobytes())
    digest.update(text.str.join("").item().encode())


def _read_vocab_file(path: Path, name: str) -> pl.DataFrame:
    """One vocabulary file of a prepared folder. A file cut short (a full disk, a killed copy)
    fails in polars with "File out of specification", naming no file, and another table put
    in its place fails later on a missing column: both are named here with the fix."""
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as err:
        problem = unreadable_parquet(err)
    else:
        absent = [column for column in _COLUMNS[name] if column not in frame.columns]
        if not absent:
            return frame
        problem = f"lacks the column(s) {absent} of the {name} vocabulary"
    raise damaged(path, problem)


def unreadable_parquet(err: Exception) -> str:
    """Why a prepared folder's Parquet file could not be read, in one line (polars' and
    pyarrow's messages run over several and name no file)."""
    first = next((line for line in str(err).splitlines() if line.strip()), "")
    return f"cannot be read as Parquet ({type(err).__name__}: {first.strip()[:200]})"


def damaged(path: Path, problem: str) -> DataError:
    """The error for a file of a prepared folder that is cut short or replaced (``problem``
    says how), with the command that prepares the folder again."""
    return DataError(
        f"{path} {problem}: the prepared folder is damaged; prepare the log again into it "
        f"(python -m pipelines.prepare data.prepared_dir={path.parent})"
    )
