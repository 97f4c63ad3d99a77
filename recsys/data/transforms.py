"""Pure, lazy event-log transforms: ``(lf, ...) -> lf``, chained with ``.pipe``.

Each works on canonical column names (:mod:`recsys.schema`) and collects nothing.
"""

from __future__ import annotations

import polars as pl

from recsys.schema import EVENT_TYPE, ITEM, TIMESTAMP, USER

POSITION = "position"  # 0-based index of an event within its user's time-ordered history


def dedupe(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Drop repeated identical events (same user, item, event type and timestamp), keeping the
    first. Example: two ``(u1, i7, view, 10:00)`` rows become one."""
    return lf.unique(subset=[USER, ITEM, EVENT_TYPE, TIMESTAMP], keep="first", maintain_order=True)


def sort_events(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Order by user then time. The sort is stable: events with equal timestamps keep the
    order they had in the input (so a view logged before a cart at the same second stays first)."""
    return lf.sort([USER, TIMESTAMP], maintain_order=True)


def filter_min_user_events(lf: pl.LazyFrame, *, min_events: int) -> pl.LazyFrame:
    """Keep users with at least ``min_events`` events (one pass, on the whole log)."""
    if min_events <= 1:
        return lf
    return lf.filter(pl.len().over(USER) >= min_events)


def add_position(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Number each user's events 0, 1, 2, ... in (already sorted) time order."""
    return lf.with_columns(pl.int_range(pl.len()).over(USER).cast(pl.Int32).alias(POSITION))
