"""Tests for recsys.data.transforms: each transform against an exact expected frame."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from recsys.data import transforms
from recsys.data.transforms import POSITION, SESSION_INDEX
from recsys.data.validate import PROBLEM, ROW
from recsys.schema import ATTRIBUTES, EVENT_TYPE, ITEM, SESSION, TIMESTAMP, USER

DTYPES = {
    ROW: pl.UInt32,  # the input row number (``with_row_index``)
    USER: pl.String,
    ITEM: pl.Int64,
    EVENT_TYPE: pl.String,
    TIMESTAMP: pl.Datetime("us", "UTC"),
    ATTRIBUTES: pl.List(pl.String),
}
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def t(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def frame(rows: list[tuple], rows_numbers: list[int] | None = None) -> pl.DataFrame:
    """(user, item, event_type, minute, attributes) tuples -> a canonical event frame whose
    ``_row`` is the tuple's place in ``rows`` (or ``rows_numbers``)."""
    numbers = list(range(len(rows))) if rows_numbers is None else rows_numbers
    return pl.DataFrame(
        [(n, u, i, e, t(m), a) for n, (u, i, e, m, a) in zip(numbers, rows)],
        schema=DTYPES,
        orient="row",
    )


def run(transform, df: pl.DataFrame, **kwargs) -> pl.DataFrame:
    out = df.lazy().pipe(transform, **kwargs)
    assert isinstance(out, pl.LazyFrame), "transforms stay lazy"
    return out.collect()


# -- duplicates --------------------------------------------------------------------------------


def test_dedupe_drops_exact_repeats_and_keeps_the_first():
    events = frame(
        [
            ("u1", 7, "view", 0, ["c1"]),
            ("u2", 7, "view", 0, ["c1"]),
            ("u1", 7, "view", 0, ["c2"]),  # repeat of row 0 (attributes are not part of the key)
            ("u1", 7, "cart", 0, ["c1"]),  # other behaviour: kept
            ("u1", 7, "view", 1, ["c1"]),  # other time: kept
            ("u2", 7, "view", 0, ["c9"]),  # repeat of row 1
            ("u1", 8, "view", 0, ["c1"]),  # other item: kept
        ]
    )
    got = run(lambda lf: lf.pipe(transforms.sort_events).pipe(transforms.dedupe), events)
    assert_frame_equal(got, run(transforms.sort_events, events[[0, 1, 3, 4, 6]]))


def test_dedupe_without_repeats_is_identity():
    events = frame([("u1", 1, "view", 3, None), ("u1", 1, "view", 2, None)])
    got = run(lambda lf: lf.pipe(transforms.sort_events).pipe(transforms.dedupe), events)
    assert_frame_equal(got, run(transforms.sort_events, events))


def test_first_occurrence_marks_all_but_the_first_input_row():
    rows = [
        ("u1", 7, "view", 0, ["a"]),  # _row 9: a repeat of _row 4 although it comes first here
        ("u1", 7, "view", 0, ["b"]),  # _row 4: the first of the three in input order
        ("u2", 7, "view", 0, None),  # other user: not a repeat
        ("u1", 7, "cart", 0, None),  # other behaviour
        ("u1", 7, "view", 0, None),  # _row 12: another repeat of _row 4
        ("u1", 8, "view", 5, None),  # _row 1
        ("u1", 8, "view", 5, None),  # _row 2: a repeat of _row 1
    ]
    events = frame(rows, rows_numbers=[9, 4, 3, 5, 12, 1, 2])
    first = pl.Series("first", [False, True, True, True, False, True, False])
    expected = events.with_columns(first)
    # first_occurrence works on frames in sort_events order (as the pipeline calls it)
    ordered = run(transforms.sort_events, events)
    got = ordered.with_columns(transforms.first_occurrence(ordered))
    assert_frame_equal(got, run(transforms.sort_events, expected))


# -- ordering ----------------------------------------------------------------------------------


def test_sort_events_orders_by_user_then_time_then_input_row():
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
    assert_frame_equal(run(transforms.sort_events, events), events[[3, 1, 2, 6, 5, 0, 4]])


def test_sort_events_ties_follow_the_row_number_not_the_frame_order():
    # a partition read back from several files is not in input order: ``_row`` decides ties
    events = frame(
        [
            ("u1", 1, "cart", 3, None),
            ("u1", 2, "view", 3, None),
            ("u1", 3, "view", 1, None),
        ],
        rows_numbers=[8, 2, 5],
    )
    assert_frame_equal(run(transforms.sort_events, events), events[[2, 1, 0]])


def test_sort_events_stability_on_many_ties():
    # two users interleaved, every event at the same instant, the frame shuffled: each user's
    # events must come out in input-row order
    n = 400
    events = pl.DataFrame(
        {
            ROW: list(range(n)),
            USER: ["u", "v"] * (n // 2),
            ITEM: list(range(n)),
            EVENT_TYPE: ["view"] * n,
            TIMESTAMP: [t(0)] * n,
            ATTRIBUTES: [None] * n,
        },
        schema=DTYPES,
    )
    expected = pl.concat([events.filter(pl.col(USER) == "u"), events.filter(pl.col(USER) == "v")])
    shuffled = events.sample(fraction=1.0, shuffle=True, seed=3)
    assert_frame_equal(run(transforms.sort_events, shuffled), expected)


@pytest.mark.parametrize(
    "order",
    [
        [0, 1, 2, 3, 4, 5],  # in event order already: returned as it is
        [3, 4, 5, 0, 1, 2],  # users out of order
        [1, 0, 2, 3, 4, 5],  # times out of order
        [0, 2, 1, 3, 4, 5],  # a tie (same user and time) out of input-row order
    ],
)
def test_in_event_order_sorts_only_what_is_out_of_order(order):
    events = frame(
        [
            ("u1", 1, "view", 1, None),
            ("u1", 2, "cart", 3, None),
            ("u1", 3, "view", 3, None),
            ("u2", 4, "view", 1, None),
            ("u2", 5, "view", 2, None),
            ("u2", 6, "view", 2, None),
        ]
    )
    got = transforms.in_event_order(events[order])
    assert_frame_equal(got, events)
    assert got[USER].flags["SORTED_ASC"]


def numbered_log(n: int, user: Callable[[int], str], second: Callable[[int], int]) -> pl.DataFrame:
    """``n`` views in input-row order: row ``i`` is ``user(i)``'s event at second ``second(i)``."""
    return pl.DataFrame(
        {
            ROW: list(range(n)),
            USER: [user(i) for i in range(n)],
            ITEM: list(range(n)),
            EVENT_TYPE: ["view"] * n,
            TIMESTAMP: [t(second(i)) for i in range(n)],
            ATTRIBUTES: [None] * n,
        },
        schema=DTYPES,
    )


def test_in_event_order_matches_sort_events_on_a_shuffled_log():
    events = numbered_log(600, lambda i: f"u{i % 7}", lambda i: i % 5)
    events = events.sample(fraction=1.0, shuffle=True, seed=5)
    expected = run(transforms.sort_events, events)
    assert_frame_equal(transforms.in_event_order(events), expected)
    assert_frame_equal(transforms.in_event_order(expected), expected)


def test_in_event_order_of_a_time_ordered_log_keeps_ties_in_input_order():
    # recorded in time order, ties (same second) in input order, users interleaved: the
    # stable sort by user alone must give exactly sort_events' order
    events = numbered_log(600, lambda i: f"u{(i * 7) % 11}", lambda i: i // 4)
    assert_frame_equal(transforms.in_event_order(events), run(transforms.sort_events, events))
    # large enough for polars to group in parallel threads
    many = numbered_log(300_000, lambda i: f"u{(i * 7919) % 5003}", lambda i: i // 3)
    assert_frame_equal(transforms.in_event_order(many), run(transforms.sort_events, many))
    # one tie out of input order: no longer "time-ordered", still sorted correctly
    swapped = events[[1, 0, *range(2, events.height)]]
    assert_frame_equal(transforms.in_event_order(swapped), run(transforms.sort_events, events))


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


# -- time window -------------------------------------------------------------------------------


def test_clip_window_keeps_start_inclusive_end_exclusive():
    events = frame([("u1", i, "view", i, None) for i in range(6)])
    assert_frame_equal(run(transforms.clip_window, events, start=t(1), end=t(4)), events[1:4])
    assert_frame_equal(run(transforms.clip_window, events, start=t(4)), events[4:])
    assert_frame_equal(run(transforms.clip_window, events, end=t(1)), events[:1])
    assert_frame_equal(run(transforms.clip_window, events), events)


# -- k-core ------------------------------------------------------------------------------------

# u1: i1 i2 i4   u2: i1 i2   u3: i1 i9   u4: i4      (min 2 events per user and per item)
# round 1: u4 has 1 event, i9 has 1 event -> both out; u3 (2 events) and i4 (2 events) stay
# round 2: without i9, u3 has 1 event -> out (an item's removal drops a user);
#          without u4, i4 has 1 event -> out (a user's removal drops an item)
# round 3: u1, u2 x i1, i2 all have 2 events: stable
KCORE_LOG = [
    ("u1", 1, "view", 0, None),
    ("u3", 9, "view", 1, None),
    ("u2", 1, "view", 2, None),
    ("u1", 2, "view", 3, None),
    ("u4", 4, "view", 4, None),
    ("u3", 1, "view", 5, None),
    ("u2", 2, "view", 6, None),
    ("u1", 4, "view", 7, None),
]


def members(df: pl.DataFrame, **kwargs) -> tuple[list, list, int]:
    users, items, iterations = transforms.kcore_members(df.lazy(), **kwargs)
    return sorted(users[USER].to_list()), sorted(items[ITEM].to_list()), iterations


def test_kcore_iterates_until_users_and_items_both_hold():
    events = frame(KCORE_LOG)
    assert members(events, min_user_events=2, min_item_events=2) == (["u1", "u2"], [1, 2], 3)
    kept = run(
        transforms.filter_members,
        events,
        users=pl.DataFrame({USER: ["u1", "u2"]}),
        items=pl.DataFrame({ITEM: [1, 2]}),
    )
    assert_frame_equal(kept, events[[0, 2, 3, 6]])


def test_kcore_single_thresholds():
    events = frame(KCORE_LOG)
    # users only: one round removes u4; items are not filtered
    assert members(events, min_user_events=2, min_item_events=1) == (
        ["u1", "u2", "u3"],
        [1, 2, 4, 9],
        2,
    )
    # items only: i9 goes, u3 keeps its other event
    assert members(events, min_user_events=1, min_item_events=2) == (
        ["u1", "u2", "u3", "u4"],
        [1, 2, 4],
        2,
    )
    # nothing to remove: stable at once
    assert members(events, min_user_events=1, min_item_events=1) == (
        ["u1", "u2", "u3", "u4"],
        [1, 2, 4, 9],
        1,
    )
    # too strict: everything goes
    assert members(events, min_user_events=4, min_item_events=1)[:2] == ([], [])


def test_kcore_that_does_not_converge_in_time_says_so():
    with pytest.raises(ValueError, match="did not converge in 2 rounds"):
        transforms.kcore_members(
            frame(KCORE_LOG).lazy(), min_user_events=2, min_item_events=2, max_iterations=2
        )


def test_filter_members_keeps_the_sorted_order_with_large_member_tables():
    # a partition holds fewer events than there are kept users / items in the whole log;
    # keep_last_events, sessionize and add_position rely on the sorted order surviving
    n = 1000
    events = pl.DataFrame(
        {
            ROW: list(range(n)),
            USER: [f"u{k // 4:04d}" for k in range(n)],
            ITEM: [(k * 7919) % 3000 for k in range(n)],
            EVENT_TYPE: ["view"] * n,
            TIMESTAMP: [t(k % 4) for k in range(n)],
            ATTRIBUTES: [None] * n,
        },
        schema=DTYPES,
    )
    users = pl.DataFrame({USER: [f"u{k:04d}" for k in range(0, 3000, 2)]})
    items = pl.DataFrame({ITEM: list(range(1, 3000))})
    expected = events.filter(
        pl.col(USER).is_in(users[USER].implode()) & pl.col(ITEM).is_in(items[ITEM].implode())
    )
    kept = run(transforms.filter_members, events, users=users, items=items)
    assert_frame_equal(kept, expected)


# -- truncation and sessions -------------------------------------------------------------------


def test_keep_last_events_keeps_each_users_most_recent():
    events = frame(
        [
            ("u1", 1, "view", 0, None),
            ("u1", 2, "view", 1, None),
            ("u1", 3, "view", 2, None),
            ("u1", 4, "view", 3, None),
            ("u3", 6, "view", 0, None),
            ("u3", 7, "view", 9, None),
        ]
    )
    assert_frame_equal(run(transforms.keep_last_events, events, max_events=2), events[[2, 3, 4, 5]])
    assert_frame_equal(run(transforms.keep_last_events, events, max_events=1), events[[3, 5]])
    assert_frame_equal(run(transforms.keep_last_events, events, max_events=None), events)


def test_keep_last_events_keeps_shorter_histories_whole():
    events = frame(
        [
            ("u1", 1, "view", 0, None),
            ("u1", 2, "view", 1, None),
            ("u1", 3, "view", 2, None),
            ("u2", 5, "view", 0, None),
            ("u3", 6, "view", 0, None),
            ("u3", 7, "view", 9, None),
        ]
    )
    assert_frame_equal(
        run(transforms.keep_last_events, events, max_events=2), events[[1, 2, 3, 4, 5]]
    )


def session_log() -> pl.DataFrame:
    """u1: 10:00 10:20 12:00 12:05 (ids a a b b); u2: one event the day before (id a);
    u3: 10:00 10:30 11:01 (ids null null x)."""
    base = datetime(2024, 1, 1, 10, tzinfo=UTC)
    minutes = [0, 20, 120, 125, -24 * 60, 0, 30, 61]
    return pl.DataFrame(
        {
            ROW: list(range(8)),
            USER: ["u1"] * 4 + ["u2"] + ["u3"] * 3,
            TIMESTAMP: [base + timedelta(minutes=m) for m in minutes],
            SESSION: ["a", "a", "b", "b", "a", None, None, "x"],
        },
        schema={ROW: pl.UInt32, USER: pl.String, TIMESTAMP: DTYPES[TIMESTAMP], SESSION: pl.String},
    )


def test_sessionize_by_inactivity_gap():
    events = session_log()
    # 30 minutes: u1 10:20 -> 12:00 starts a new session; u3's gap of exactly 30 min does not
    # (only a longer one does), 31 min does; u2's first event is a new user, not a gap
    expected = events.with_columns(
        pl.Series(SESSION_INDEX, [0, 0, 1, 1, 0, 0, 0, 1], dtype=pl.Int32)
    )
    got = run(transforms.sessionize, events, gap_seconds=30 * 60, has_session_id=False)
    assert_frame_equal(got, expected)
    # a gap longer than every other: one session per user
    one = run(transforms.sessionize, events, gap_seconds=10 * 3600, has_session_id=False)
    assert one[SESSION_INDEX].to_list() == [0] * 8


def test_sessionize_by_session_id_and_without_sessions():
    events = session_log()
    # a new session where the id changes within a user (u2's "a" is not u1's "a")
    expected = events.with_columns(
        pl.Series(SESSION_INDEX, [0, 0, 1, 1, 0, 0, 0, 1], dtype=pl.Int32)
    )
    got = run(transforms.sessionize, events, gap_seconds=None, has_session_id=True)
    assert_frame_equal(got, expected)
    # the user's ids win over a gap; an id that comes back is a new session
    returning = events.with_columns(pl.Series(SESSION, ["a", "b", "b", "a", "a", "y", "y", "y"]))
    got = run(transforms.sessionize, returning, gap_seconds=60.0, has_session_id=True)
    assert got[SESSION_INDEX].to_list() == [0, 1, 1, 2, 0, 0, 0, 0]
    # neither ids nor a gap: no session column
    assert_frame_equal(
        run(transforms.sessionize, events, gap_seconds=None, has_session_id=False), events
    )


# -- the pipeline's order of steps -------------------------------------------------------------


def test_chain_sort_label_filter_kcore_truncate_position():
    events = frame(
        [
            ("u2", 1, "view", 4, None),
            ("u1", 1, "view", 2, None),
            ("u1", 1, "view", 2, None),  # duplicate: u1 then has one event and is filtered out
            ("u2", 2, "cart", 1, None),
            ("u2", 3, "view", 0, None),  # u2's oldest event: truncated by max_events=2
        ]
    )
    clean = events.lazy().pipe(transforms.sort_events).pipe(transforms.dedupe).collect()
    users, items, _ = transforms.kcore_members(clean.lazy(), min_user_events=2, min_item_events=1)
    out = (
        clean.lazy()
        .pipe(transforms.filter_members, users, items)
        .pipe(transforms.keep_last_events, max_events=2)
        .pipe(transforms.add_position)
        .collect()
    )
    expected = events[[3, 0]].with_columns(pl.Series(POSITION, [0, 1], dtype=pl.Int32))
    assert_frame_equal(out, expected)


@pytest.mark.parametrize(
    ("transform", "kwargs"),
    [
        (transforms.dedupe, {}),
        (transforms.sort_events, {}),
        (transforms.add_position, {}),
        (transforms.clip_window, {"start": T0, "end": t(5)}),
        (transforms.keep_last_events, {"max_events": 2}),
        (transforms.sessionize, {"gap_seconds": 60.0, "has_session_id": False}),
    ],
)
def test_transforms_on_empty_frame(transform, kwargs):
    empty = frame([]).with_columns(pl.lit(None, dtype=pl.String).alias(PROBLEM))
    assert run(transform, empty, **kwargs).height == 0


def test_dedupe_matches_a_plain_first_distinct_on_many_ties():
    """The tie-run shortcut gives exactly the rows a first-distinct over every row's key
    gives, on a log made almost entirely of same-second ties and interleaved repeats."""
    import random

    rng = random.Random(7)
    rows = [
        (
            f"u{rng.randrange(4)}",
            rng.randrange(3),
            rng.choice(["view", "cart"]),
            rng.randrange(3),
            None,
        )
        for _ in range(400)
    ]
    events = frame(rows).lazy().pipe(transforms.sort_events).collect()
    expected = events.filter(pl.struct(transforms.DUPLICATE_KEY).is_first_distinct())
    assert 0 < expected.height < events.height
    assert_frame_equal(run(transforms.dedupe, events), expected)
