"""Per-user token sequences and the time-gap buckets of their tokens.

A prepared dataset stores **one row per user** (``sequences.parquet``) with the whole
time-ordered history as list columns plus the split positions of :mod:`recsys.data.split`:

==============  ==================  ==================================================
column          type                meaning
==============  ==================  ==================================================
user_id         raw id              the user's id as in the event log
item            list[int32]         item index per event (UNK=1 for unseen items)
behavior        list[int8]          behaviour index per event
timestamp       list[int64]         Unix seconds per event
session         list[int32]         session number per event (only when sessions are
                                    derived or given; see transforms.sessionize)
train_end       int32               events before this position are training data
val_target      int32               position of the validation target, -1 = none
test_start      int32               first position of the test window
test_target     int32               position of the test target, -1 = none
==============  ==================  ==================================================

Lists are read back as flat Arrow buffers plus offsets (:class:`recsys.data.dataset.SequenceStore`),
never as Python lists per user.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from recsys.data.split import SPLIT_COLUMNS
from recsys.data.transforms import SESSION_INDEX
from recsys.data.validate import check_number
from recsys.data.vocab import ITEM_INDEX
from recsys.schema import TIMESTAMP, USER

ITEMS = "item"
BEHAVIORS = "behavior"
TIMES = "timestamp"
SEQUENCE_COLUMNS = (USER, ITEMS, BEHAVIORS, TIMES, *SPLIT_COLUMNS)


# The bucket of a gap as a Python expression over ``gap`` (seconds, between whole Unix seconds),
# ``unit_seconds`` and ``num_buckets`` (``floor``, ``log2`` from math): what a server copies
# (the export's vocab.json carries it); TimeBuckets.__call__ computes it.
BUCKET_RULE = "1 + min(floor(log2(1 + max(gap, 0) / unit_seconds)), num_buckets - 1)"


@dataclass(frozen=True)
class TimeBuckets:
    """ATRank's log2 time-gap buckets with a configurable unit.

    ``bucket = 1 + min(floor(log2(1 + gap / unit_seconds)), num_buckets - 1)``; 0 is PAD.
    Gaps are between the stored times, whole Unix seconds (a millisecond log's are rounded
    down to the second before they are subtracted).
    With ``unit_seconds=60``: gaps of 0-59 s -> 1, 60-179 s -> 2, 180-419 s -> 3, ...
    ``reference`` says what a token's gap is measured to:

    - ``previous`` (default): the previous event of the same user (0 for the first), which
      keeps training at every position causal: no token's bucket depends on a later event;
    - ``target``: the moment of the prediction (the target's time; ``as_of`` when scoring),
      as ATRank's reference code does (days before the target). Every token then knows when
      the last target happens, so use it with models trained on their last position only.
    """

    unit_seconds: float = 60.0
    num_buckets: int = 16
    reference: str = "previous"

    def __post_init__(self) -> None:
        check_number("data.time_buckets.unit_seconds", self.unit_seconds)
        check_number("data.time_buckets.num_buckets", self.num_buckets, integer=True)
        if not self.unit_seconds > 0:
            raise ValueError(f"data.time_buckets.unit_seconds={self.unit_seconds} must be > 0")
        if not 1 <= self.num_buckets <= 64:
            raise ValueError(f"data.time_buckets.num_buckets={self.num_buckets} must be in [1, 64]")
        if self.reference not in ("previous", "target"):
            raise ValueError(
                f"data.time_buckets.reference={self.reference!r} must be previous or target"
            )
        # 60 (conf/data/base.yaml) and 60.0 (the default here) are one setting: one fingerprint
        object.__setattr__(self, "unit_seconds", float(self.unit_seconds))

    @property
    def num_embeddings(self) -> int:
        """Embedding table size: the buckets plus PAD."""
        return self.num_buckets + 1

    def __call__(self, gap_seconds: np.ndarray) -> np.ndarray:
        # capped before the cast: with a tiny unit a long gap overflows to inf, whose int64
        # cast is the most negative integer (a negative bucket)
        with np.errstate(over="ignore"):
            gap_units = np.maximum(gap_seconds, 0) / self.unit_seconds
        bucket = np.minimum(np.floor(np.log2(1.0 + gap_units)), self.num_buckets - 1)
        return 1 + bucket.astype(np.int64)


def build_sequences(encoded: pl.LazyFrame, split: list[pl.Expr]) -> pl.LazyFrame:
    """Aggregate encoded, time-sorted events into one row per user, with the split columns.

    ``encoded`` has ``user_id, item_index, behavior_index, timestamp`` (and ``session`` when
    sessions were derived) sorted by user and time; ``split`` are the per-user aggregations
    giving the split columns of :mod:`recsys.data.split` (e.g. its
    :func:`~recsys.data.split.split_aggregations`, over its ``with_windows`` flags), computed
    in the same pass as the lists.
    """
    has_sessions = SESSION_INDEX in encoded.collect_schema().names()
    lists = encoded.group_by(USER, maintain_order=True).agg(
        pl.col(ITEM_INDEX).cast(pl.Int32).alias(ITEMS),
        pl.col("behavior_index").cast(pl.Int8).alias(BEHAVIORS),
        pl.col(TIMESTAMP).dt.epoch("s").cast(pl.Int64).alias(TIMES),
        *([pl.col(SESSION_INDEX).cast(pl.Int32)] if has_sessions else []),
        *split,
    )
    columns = [*SEQUENCE_COLUMNS[:4], *([SESSION_INDEX] if has_sessions else []), *SPLIT_COLUMNS]
    return lists.select(columns)
