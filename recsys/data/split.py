"""Leakage-free splits, expressed as positions in each user's time-ordered history.

A split never copies events. For every user it yields three numbers over the sorted history:

- ``train_end``: events at positions ``< train_end`` are training data;
- ``val_target`` / ``test_target``: the position of the one evaluation target (``-1``: none).
  The model input for a target at position ``p`` is the events at positions ``< p`` only, so no
  target and no later event is ever visible in an input history.

Methods:

- ``temporal`` (default for timestamped logs): two global cut times split the timeline into
  train / validation / test windows by event-count quantiles. Training uses events before the
  validation cut; each user's validation target is their first target-behaviour event in the
  validation window, their test target the first one in the test window.
- ``leave_one_out`` (files without timestamps, paper protocols): the last event is the test
  target, the second-to-last the validation target, the rest is training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from recsys.data.transforms import POSITION
from recsys.schema import EVENT_TYPE, TIMESTAMP, USER

TRAIN_END = "train_end"
VAL_TARGET = "val_target"
TEST_TARGET = "test_target"
METHODS = ("temporal", "leave_one_out")


@dataclass(frozen=True)
class SplitSettings:
    method: str = "temporal"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    target_behaviors: tuple[str, ...] | None = None  # None: any behaviour can be a target

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"data.split.method={self.method!r}: use one of {list(METHODS)}")
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if not 0.0 < value < 0.5:
                raise ValueError(f"data.split.{name}={value} must lie in (0, 0.5)")
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"data.split.val_fraction + test_fraction = "
                f"{self.val_fraction + self.test_fraction} leaves too little for training (<10%)"
            )


@dataclass(frozen=True)
class SplitPoints:
    """Global cut times of a temporal split (``None`` for leave-one-out)."""

    val_start: datetime | None
    test_start: datetime | None


def temporal_cuts(lf: pl.LazyFrame, settings: SplitSettings) -> SplitPoints:
    """The validation and test cut times: quantiles of the event timestamps."""
    train_fraction = 1.0 - settings.val_fraction - settings.test_fraction
    cuts = lf.select(
        pl.col(TIMESTAMP).quantile(train_fraction, "lower").alias("val"),
        pl.col(TIMESTAMP).quantile(1.0 - settings.test_fraction, "lower").alias("test"),
    ).collect()
    return SplitPoints(val_start=cuts["val"][0], test_start=cuts["test"][0])


def split_positions(lf: pl.LazyFrame, settings: SplitSettings, points: SplitPoints) -> pl.LazyFrame:
    """One row per user: ``user_id, train_end, val_target, test_target`` (lazy).

    ``lf`` must be sorted by user and time and carry ``position``.
    """
    is_target = (
        pl.col(EVENT_TYPE).is_in(list(settings.target_behaviors))
        if settings.target_behaviors
        else pl.lit(True)
    )
    has_history = pl.col(POSITION) >= 1
    if settings.method == "leave_one_out":
        n = pl.len().cast(pl.Int32)  # signed: n - 2 must not wrap around for one-event users
        return lf.group_by(USER, maintain_order=True).agg(
            (n - 2).clip(lower_bound=0).cast(pl.Int32).alias(TRAIN_END),
            pl.when(n >= 3).then(n - 2).otherwise(-1).cast(pl.Int32).alias(VAL_TARGET),
            pl.when(n >= 2).then(n - 1).otherwise(-1).cast(pl.Int32).alias(TEST_TARGET),
        )
    ts = pl.col(TIMESTAMP)
    in_val = (ts >= points.val_start) & (ts < points.test_start)
    in_test = ts >= points.test_start

    def first_position(window: pl.Expr) -> pl.Expr:
        return pl.col(POSITION).filter(window & is_target & has_history).min()

    return lf.group_by(USER, maintain_order=True).agg(
        (ts < points.val_start).sum().cast(pl.Int32).alias(TRAIN_END),
        first_position(in_val).fill_null(-1).cast(pl.Int32).alias(VAL_TARGET),
        first_position(in_test).fill_null(-1).cast(pl.Int32).alias(TEST_TARGET),
    )
