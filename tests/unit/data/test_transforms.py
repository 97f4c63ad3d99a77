"""Tests for recsys.data.transforms: each pure lazy transform against an exact expected frame."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys.data import transforms
from recsys.data.transforms import POSITION
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, USER

COLUMNS = (USER, ITEM, EVENT_TYPE, TIMESTAMP, CATEGORY)
DTYPES = {
    USER: pl.String,
    ITEM: pl.Int64,
    EVENT_TYPE: pl.String,
    TIMESTAMP: pl.Datetime("us", "UTC"),
    CATEGORY: pl.String,
}


def t(minute: int) -> datetime:
    return datetime(2024, 1, 1, 0, minute, tzinfo=UTC)


def frame(rows: list[tuple]) -> pl.DataFrame:
    """(user, item, event_type, minute, category) tuples -> a canonical event frame."""
    return pl.DataFrame([(u, i, e, t(m), c) for u, i, e, m, c in rows], schema=DTYPES, orient="row")


def run(transform, df: pl.DataFrame, **kwargs) -> pl.DataFrame:
    out = df.lazy().pipe(transform, **kwargs)
    assert isinstance(out, pl.LazyFrame), "transforms stay lazy"
    return out.collect()


def test_dedupe_drops_exact_repeats_and_keeps_the_first():
    events = frame(
        [
            ("u1", 7, "view", 0, "c1"),
            ("u2", 7, "view", 0, "c1"),
            ("u1", 7, "view", 0, "c2"),  # repeat of row 0 (category is not part of the key)
            ("u1", 7, "cart", 0, "c1"),  # other behaviour: kept
            ("u1", 7, "view", 1, "c1"),  # other time: kept
            ("u2", 7, "view", 0, "c9"),  # repeat of row 1
            ("u1", 8, "view", 0, "c1"),  # other item: kept
        ]
    )
    expected = frame(
        [
            ("u1", 7, "view", 0, "c1"),
            ("u2", 7, "view", 0, "c1"),
            ("u1", 7, "cart", 0, "c1"),
            ("u1", 7, "view", 1, "c1"),
            ("u1", 8, "view", 0, "c1"),
        ]
    )
    assert_frame_equal(run(transforms.dedupe, events), expected)


def test_dedupe_without_repeats_is_identity():
    events = frame([("u1", 1, "view", 3, None), ("u1", 1, "view", 2, None)])
    assert_frame_equal(run(transforms.dedupe, events), events)


def test_sort_events_orders_by_user_then_time_and_is_stable():
    events = frame(
        [
            ("u2", 1, "view", 5, None),
            ("u1", 2, "cart", 3, None),  # same user and second as the next row: stays first
            ("u1", 2, "view", 3, None),
            ("u1", 9, "view", 1, None),
            ("u2", 3, "purchase", 5, None),
            ("u2", 4, "view", 2, None),
            ("u1", 5, "click", 3, None),
        ]
    )
    expected = frame(
        [
            ("u1", 9, "view", 1, None),
            ("u1", 2, "cart", 3, None),
            ("u1", 2, "view", 3, None),
            ("u1", 5, "click", 3, None),
            ("u2", 4, "view", 2, None),
            ("u2", 1, "view", 5, None),
            ("u2", 3, "purchase", 5, None),
        ]
    )
    assert_frame_equal(run(transforms.sort_events, events), expected)


def test_sort_events_stability_on_many_ties():
    # two users interleaved, every event at the same instant: each user's events must come out
    # in input order (an unstable multi-key sort scrambles them)
    n = 400
    users = ["u", "v"] * (n // 2)
    events = pl.DataFrame(
        {
            USER: users,
            ITEM: list(range(n)),
            EVENT_TYPE: ["view"] * n,
            TIMESTAMP: [t(0)] * n,
            CATEGORY: [None] * n,
        },
        schema=DTYPES,
    )
    expected = pl.concat([events.filter(pl.col(USER) == "u"), events.filter(pl.col(USER) == "v")])
    assert_frame_equal(run(transforms.sort_events, events), expected)


def test_filter_min_user_events_counts_whole_history():
    events = frame(
        [
            ("u1", 1, "view", 0, None),
            ("u2", 1, "view", 0, None),
            ("u1", 2, "view", 1, None),
            ("u3", 1, "view", 0, None),
            ("u3", 2, "view", 1, None),
            ("u3", 3, "view", 2, None),
            ("u1", 3, "view", 2, None),
        ]
    )
    expected = frame(
        [
            ("u1", 1, "view", 0, None),
            ("u1", 2, "view", 1, None),
            ("u3", 1, "view", 0, None),
            ("u3", 2, "view", 1, None),
            ("u3", 3, "view", 2, None),
            ("u1", 3, "view", 2, None),
        ]
    )
    assert_frame_equal(run(transforms.filter_min_user_events, events, min_events=3), expected)
    assert_frame_equal(run(transforms.filter_min_user_events, events, min_events=1), events)
    assert_frame_equal(run(transforms.filter_min_user_events, events, min_events=4), events.clear())


def test_add_position_numbers_each_users_events():
    events = frame(
        [
            ("u1", 1, "view", 0, None),
            ("u1", 2, "view", 1, None),
            ("u1", 3, "view", 1, None),
            ("u2", 4, "view", 0, None),
            ("u3", 5, "view", 0, None),
            ("u3", 6, "view", 9, None),
        ]
    )
    expected = events.with_columns(pl.Series(POSITION, [0, 1, 2, 0, 0, 1], dtype=pl.Int32))
    assert_frame_equal(run(transforms.add_position, events), expected)


def test_chain_dedupe_filter_sort_position():
    events = frame(
        [
            ("u2", 1, "view", 4, None),
            ("u1", 1, "view", 2, None),
            ("u1", 1, "view", 2, None),  # duplicate: u1 then has one event and is filtered out
            ("u2", 2, "cart", 1, None),
        ]
    )
    out = (
        events.lazy()
        .pipe(transforms.dedupe)
        .pipe(transforms.filter_min_user_events, min_events=2)
        .pipe(transforms.sort_events)
        .pipe(transforms.add_position)
        .collect()
    )
    expected = frame([("u2", 2, "cart", 1, None), ("u2", 1, "view", 4, None)]).with_columns(
        pl.Series(POSITION, [0, 1], dtype=pl.Int32)
    )
    assert_frame_equal(out, expected)


@pytest.mark.parametrize(
    "transform", [transforms.dedupe, transforms.sort_events, transforms.add_position]
)
def test_transforms_on_empty_frame(transform):
    empty = frame([])
    assert run(transform, empty).height == 0
