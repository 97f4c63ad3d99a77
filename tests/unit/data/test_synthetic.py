"""Tests for recsys.data.synthetic: determinism, contract, and the structure the data must carry."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from recsys.data.synthetic import generate_events
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, USER

BEHAVIORS = ("view", "click", "cart", "purchase")


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    return generate_events(seed=0)


def test_same_seed_gives_identical_frame():
    a = generate_events(num_users=100, num_items=200, num_categories=10, seed=7)
    b = generate_events(num_users=100, num_items=200, num_categories=10, seed=7)
    assert a.equals(b)


def test_different_seed_gives_different_frame():
    a = generate_events(num_users=100, num_items=200, num_categories=10, seed=7)
    b = generate_events(num_users=100, num_items=200, num_categories=10, seed=8)
    assert not a.equals(b)


def test_columns_and_dtypes(events):
    assert events.schema == pl.Schema(
        {
            USER: pl.Int64,
            ITEM: pl.Int64,
            CATEGORY: pl.String,
            EVENT_TYPE: pl.String,
            TIMESTAMP: pl.Datetime("us", time_zone="UTC"),
        }
    )


def test_default_size_is_moderate(events):
    assert 50_000 <= events.height <= 120_000
    assert events[USER].n_unique() == 2000


def test_sorted_by_user_then_strictly_increasing_time(events):
    assert events.equals(events.sort([USER, TIMESTAMP]))
    steps = events.select(pl.col(TIMESTAMP).diff().over(USER).alias("step"))["step"].drop_nulls()
    assert (steps > timedelta(0)).all()


def test_no_nulls(events):
    assert events.null_count().sum_horizontal().item() == 0


def test_every_item_has_exactly_one_category(events):
    per_item = events.group_by(ITEM).agg(pl.col(CATEGORY).n_unique().alias("n"))
    assert (per_item["n"] == 1).all()
    assert events[CATEGORY].str.contains(r"^c\d{2}$").all()
    sizes = events.group_by(CATEGORY).agg(pl.col(ITEM).n_unique())[ITEM]
    assert sizes.max() >= 3 * sizes.min()  # uneven category sizes


def test_ids_are_not_vocabulary_indices(events):
    items = events[ITEM].unique()
    users = events[USER].unique()
    assert items.min() >= 10_000
    assert users.min() >= 10_000
    assert set(users.to_list()).isdisjoint(items.to_list())


def test_event_types_and_time_window(events):
    assert set(events[EVENT_TYPE].unique()) == set(BEHAVIORS)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    assert events[TIMESTAMP].min() >= start
    assert events[TIMESTAMP].max() <= start + timedelta(weeks=8, days=1)


def test_funnel_stage_preceded_by_previous_stage_of_same_item(events):
    """Every click/cart/purchase follows the previous stage (hence a view) of the same item,
    by the same user, in the same session (within the hour)."""
    ordered = events.sort(TIMESTAMP)
    for previous, stage in itertools.pairwise(BEHAVIORS):
        later = ordered.filter(pl.col(EVENT_TYPE) == stage).select(USER, ITEM, TIMESTAMP)
        earlier = ordered.filter(pl.col(EVENT_TYPE) == previous).select(
            USER, ITEM, TIMESTAMP, pl.col(TIMESTAMP).alias("previous_time")
        )
        matched = later.join_asof(
            earlier,
            on=TIMESTAMP,
            by=[USER, ITEM],
            strategy="backward",
            tolerance="1h",
            check_sortedness=False,  # both sides are sorted by time, hence within each group
        )
        assert matched.height == later.height
        assert matched["previous_time"].null_count() == 0, f"{stage} without a {previous}"
        views = ordered.filter(pl.col(EVENT_TYPE) == "view").select(
            USER, ITEM, TIMESTAMP, pl.col(TIMESTAMP).alias("view_time")
        )
        matched = later.join_asof(
            views,
            on=TIMESTAMP,
            by=[USER, ITEM],
            strategy="backward",
            tolerance="1h",
            check_sortedness=False,  # both sides are sorted by time, hence within each group
        )
        assert matched["view_time"].null_count() == 0, f"{stage} without a view"


def test_behaviour_counts_decrease_along_funnel(events):
    counts = events[EVENT_TYPE].value_counts()
    by_name = dict(zip(counts[EVENT_TYPE], counts["count"], strict=True))
    observed = [by_name[b] for b in BEHAVIORS]
    assert observed == sorted(observed, reverse=True)
    assert len(set(observed)) == len(observed)
    # click | view follows the funnel probability (0.45) within sampling noise
    assert 0.40 < by_name["click"] / by_name["view"] < 0.50


def test_custom_behaviours_and_funnel():
    df = generate_events(
        num_users=50, num_items=60, num_categories=5, behaviors=("pv", "buy"), funnel=(1.0,)
    )
    counts = df[EVENT_TYPE].value_counts()
    by_name = dict(zip(counts[EVENT_TYPE], counts["count"], strict=True))
    assert set(by_name) == {"pv", "buy"}
    assert by_name["pv"] == by_name["buy"]  # funnel=(1.0,): every view ends in a purchase


def test_popularity_is_skewed(events):
    counts = np.sort(events[ITEM].value_counts()["count"].to_numpy())[::-1]
    top = max(1, len(counts) // 10)
    assert counts[:top].sum() / counts.sum() > 0.40


def test_time_gaps_separate_sessions(events):
    gaps = (
        events.select(pl.col(TIMESTAMP).diff().over(USER).dt.total_seconds().alias("gap"))["gap"]
        .drop_nulls()
        .to_numpy()
    )
    assert (gaps < 600).mean() > 0.5  # within sessions: seconds to minutes
    assert (gaps > 6 * 3600).mean() > 0.05  # between sessions: hours to days
    assert ((gaps >= 3600) & (gaps <= 6 * 3600)).mean() < 0.02  # little in between


def test_sessions_stay_within_few_categories(events):
    views = events.filter(pl.col(EVENT_TYPE) == "view")
    user = views[USER].to_numpy()
    category = views[CATEGORY].to_numpy()
    gap = views.select(pl.col(TIMESTAMP).diff().dt.total_seconds())[TIMESTAMP].to_numpy()
    same_session = (user[1:] == user[:-1]) & (gap[1:] < 3600)
    same_category = (category[1:] == category[:-1])[same_session].mean()
    share = views[CATEGORY].value_counts()["count"].to_numpy() / views.height
    assert same_category > 3 * float((share**2).sum())  # far above chance


def _hit_rates_at_10(df: pl.DataFrame) -> tuple[float, float]:
    """HR@10 of popularity and of first-order transition counts on each user's last view.

    Both are fitted on every view before the targets; transition scores break ties by popularity.
    """
    views = (
        df.filter(pl.col(EVENT_TYPE) == "view")
        .select(USER, ITEM)
        .with_columns(
            pl.int_range(pl.len()).over(USER).alias("position"), pl.len().over(USER).alias("n")
        )
        .filter(pl.col("n") >= 2)
    )
    _, item = np.unique(views[ITEM].to_numpy(), return_inverse=True)
    user = views[USER].to_numpy()
    is_target = (views["position"] == views["n"] - 1).to_numpy()
    num_items = int(item.max()) + 1

    pair = (user[1:] == user[:-1]) & ~is_target[1:]
    transitions = np.zeros((num_items, num_items))
    np.add.at(transitions, (item[:-1][pair], item[1:][pair]), 1.0)
    popularity = np.bincount(item[~is_target], minlength=num_items).astype(float)

    target_rows = np.flatnonzero(is_target)
    target = item[target_rows]
    previous = item[target_rows - 1]
    top_popular = np.argsort(-popularity, kind="stable")[:10]
    hr_popularity = float(np.isin(target, top_popular).mean())
    scores = transitions[previous] + popularity / (popularity.max() + 1.0)  # < 1: tie-break only
    top_transition = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    hr_transition = float((top_transition == target[:, None]).any(axis=1).mean())
    return hr_popularity, hr_transition


def test_sequential_structure_is_learnable(events):
    hr_popularity, hr_transition = _hit_rates_at_10(events)
    assert hr_popularity > 0.02
    assert hr_transition >= 2.0 * hr_popularity


def test_transition_strength_zero_weakens_sequential_signal():
    kwargs = dict(num_users=600, num_items=400, num_categories=20, seed=3)
    _, strong = _hit_rates_at_10(generate_events(**kwargs))
    _, none = _hit_rates_at_10(generate_events(transition_strength=0.0, **kwargs))
    assert strong > none + 0.1


def test_small_and_degenerate_sizes():
    df = generate_events(num_users=1, num_items=1, num_categories=1, seed=1)
    assert df[ITEM].n_unique() == 1
    assert df[CATEGORY].unique().to_list() == ["c00"]
    df = generate_events(
        num_users=3,
        num_items=4,
        num_categories=4,
        behaviors=("view",),
        funnel=(),
        sessions_per_user=1,
        events_per_session=1,
        zipf_exponent=0.0,
    )
    assert df.height == 3
    assert set(df[EVENT_TYPE]) == {"view"}


def test_start_accepts_offset_datetimes():
    df = generate_events(
        num_users=5, num_items=20, num_categories=2, start="2023-06-01T00:00+02:00"
    )
    assert df[TIMESTAMP].min() >= datetime(2023, 5, 31, 22, tzinfo=UTC)


def test_does_not_print(capsys):
    generate_events(num_users=20, num_items=30, num_categories=3)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_users": 0}, "num_users=0"),
        ({"num_items": 2.5}, "num_items=2.5"),
        ({"num_items": 5, "num_categories": 10}, "num_items=5 < num_categories=10"),
        ({"num_categories": 0}, "num_categories=0"),
        ({"weeks": 0}, "weeks=0"),
        ({"sessions_per_user": 0.5}, "sessions_per_user=0.5"),
        ({"events_per_session": float("nan")}, "events_per_session=nan"),
        ({"funnel": (0.5, 0.5)}, "needs len\\(behaviors\\) - 1 = 3"),
        ({"funnel": (0.5, 1.5, 0.5)}, "funnel\\[1\\]=1.5"),
        ({"funnel": (-0.1, 0.5, 0.5)}, "funnel\\[0\\]=-0.1"),
        ({"behaviors": ("view", "view"), "funnel": (0.5,)}, "duplicates"),
        ({"behaviors": (), "funnel": ()}, "non-empty"),
        ({"behaviors": "view"}, "sequence of names"),
        ({"zipf_exponent": -1.0}, "zipf_exponent=-1.0"),
        ({"transition_strength": 1.2}, "transition_strength=1.2"),
        ({"category_drift": -0.1}, "category_drift=-0.1"),
        ({"successors_per_item": 0}, "successors_per_item=0"),
        ({"categories_per_session": 0}, "categories_per_session=0"),
        ({"start": "yesterday"}, "start='yesterday'"),
        ({"seed": -1}, "seed=-1"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_events(**kwargs)
