"""Synthetic customer-journey event logs: the project's embedded default data.

:func:`generate_events` simulates users browsing a catalogue over a few weeks and returns an
event log in recsys' canonical columns. The log is small, deterministic by seed and built with
numpy in well under a second, yet it carries the structure a sequential recommender should find,
so that a sequence model measurably beats a popularity ranking:

- **Catalogue.** Every item has exactly one category; category sizes are uneven (log-normal
  shares). Item popularity is Zipf-like over a random ranking of the items.
- **Sessions.** Each user has a few sessions (gamma-Poisson count, so some users are heavy)
  whose starts are spread at random over ``weeks`` weeks, at least ``MIN_SESSION_GAP_S`` apart.
  Inside a session consecutive events are seconds to minutes apart (log-normal gaps, at most
  ``MAX_EVENT_GAP_S``), so the time gap separates "same session" from "new session".
- **Funnel.** Each item visited in a session is first viewed; then, with the probabilities in
  ``funnel``, the user moves on to the next behaviour for *the same item* (view -> click -> cart
  -> purchase by default), each at a later timestamp, before moving to the next item.
- **Sequential structure.** Every item has ``successors_per_item`` likely successors (mostly in
  its own category, otherwise in a "related" category). The next item of a session follows the
  previous item's successors with probability ``transition_strength``; otherwise it is drawn
  from one of the session's few focus categories (Zipf popularity inside the category), or with
  probability ``popularity_mix`` from the global popularity.
- **Drifting interests.** Each user has a category affinity that drifts slowly: every session
  mixes the previous affinity with a new random category (weight ``category_drift``). A session
  enters through one category drawn from the affinity and focuses on at most
  ``categories_per_session`` categories.
- **Purchases.** After a session with a purchase, the next session enters through a category
  complementary to the purchased item's category with probability ``complement_after_purchase``.
  The last name in ``behaviors`` is taken to be the purchase.

Example::

    >>> from recsys.data.synthetic import generate_events
    >>> df = generate_events(num_users=50, num_items=200, num_categories=10, seed=1)
    >>> df.columns
    ['user_id', 'item_id', 'category', 'event_type', 'timestamp']
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, USER

__all__ = ["generate_events"]

logger = logging.getLogger(__name__)

# Time structure (seconds). Within-session gaps are log-normal around these medians.
BROWSE_GAP_MEDIAN_S = 45.0  # last event of one item -> view of the next item
FUNNEL_GAP_MEDIAN_S = 15.0  # view -> next behaviour; each later stage takes 2.5x longer
MAX_EVENT_GAP_S = 1200  # no within-session gap exceeds 20 minutes
MIN_SESSION_GAP_S = 3 * 3600  # a session starts at least 3 hours after the previous one ends

ITEM_ID_BASE = 10_000  # raw ids never look like vocabulary indices 0..n-1
USER_ID_BASE = 1_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def generate_events(
    *,
    num_users: int = 2000,
    num_items: int = 1000,
    num_categories: int = 40,
    weeks: float = 8.0,
    sessions_per_user: float = 6.0,
    events_per_session: float = 6.0,
    behaviors: Sequence[str] = ("view", "click", "cart", "purchase"),
    funnel: Sequence[float] = (0.45, 0.35, 0.5),
    zipf_exponent: float = 1.1,
    transition_strength: float = 0.5,
    successors_per_item: int = 3,
    same_category_successor: float = 0.7,
    interest_concentration: float = 0.5,
    category_drift: float = 0.05,
    categories_per_session: int = 3,
    popularity_mix: float = 0.1,
    complement_after_purchase: float = 0.5,
    start: str | datetime = "2024-01-01",
    seed: int = 0,
) -> pl.DataFrame:
    """Generate a deterministic synthetic event log of customer journeys.

    Args:
        num_users: number of users; each has at least one session.
        num_items: catalogue size; must be at least ``num_categories``.
        num_categories: number of item categories (named ``"c00"``, ``"c01"``, ...); every
            category holds at least one item.
        weeks: length of the period over which session starts are spread.
        sessions_per_user: mean number of sessions per user (>= 1; gamma-Poisson spread).
        events_per_session: mean number of events per session (>= 1), funnel events included;
            the mean number of items visited per session is this divided by the expected funnel
            depth (at least one item per session).
        behaviors: event type names in funnel order; the first is the view that starts every
            item visit, the last is treated as the purchase.
        funnel: ``P(behaviors[k+1] | behaviors[k])`` for each step of the funnel, each in
            [0, 1]; ``len(funnel) == len(behaviors) - 1``.
        zipf_exponent: exponent ``s`` of item popularity ``rank ** -s`` (0 = uniform).
        transition_strength: probability that the next item of a session is one of the previous
            item's successors (the learnable sequential signal); 0 disables it.
        successors_per_item: number of likely successors per item (weights 1, 1/2, 1/3, ...).
        same_category_successor: probability that a successor lies in the item's own category
            rather than in a related one.
        interest_concentration: total Dirichlet concentration of a user's initial category
            interests, spread in proportion to category size; small values give each user a few
            favourite categories (learnable from their history), large ones give everyone
            the global category mix.
        category_drift: weight of the new random category mixed into a user's category
            affinity at each session (0 = fixed interests, 1 = a new interest every session).
        categories_per_session: at most this many focus categories per session (>= 1); items
            not reached through a transition are drawn from them.
        popularity_mix: probability that an item not reached through a transition is drawn from
            the global popularity instead of the session's focus categories.
        complement_after_purchase: probability that a session following a purchase enters
            through a category complementary to the purchased item's category.
        start: start of the period, an ISO 8601 date/datetime (naive = UTC) or a datetime.
        seed: seed of the numpy random generator; equal seeds give equal frames.

    Returns:
        An eager frame with columns ``user_id`` (Int64), ``item_id`` (Int64), ``category``
        (String), ``event_type`` (String), ``timestamp`` (Datetime("us", "UTC")), sorted by
        user_id, timestamp. Timestamps are strictly increasing within each user. User and item
        ids are distinct random integers (items >= 10_000, users >= 1_000_000), never 0..n-1.

    Raises:
        ValueError: an argument is out of range; the message names it and the fix.
    """
    _validate(
        num_users=num_users,
        num_items=num_items,
        num_categories=num_categories,
        weeks=weeks,
        sessions_per_user=sessions_per_user,
        events_per_session=events_per_session,
        behaviors=behaviors,
        funnel=funnel,
        zipf_exponent=zipf_exponent,
        transition_strength=transition_strength,
        successors_per_item=successors_per_item,
        same_category_successor=same_category_successor,
        interest_concentration=interest_concentration,
        category_drift=category_drift,
        categories_per_session=categories_per_session,
        popularity_mix=popularity_mix,
        complement_after_purchase=complement_after_purchase,
        seed=seed,
    )
    start_us = _parse_start(start)
    behaviors = tuple(behaviors)
    funnel_arr = np.asarray(funnel, dtype=np.float64)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)

    catalogue = _make_catalogue(
        rng,
        num_items=num_items,
        num_categories=num_categories,
        zipf_exponent=zipf_exponent,
        successors_per_item=successors_per_item,
        same_category_successor=same_category_successor,
    )
    item_ids = _distinct_ids(rng, num_items, ITEM_ID_BASE)
    user_ids = _distinct_ids(rng, num_users, USER_ID_BASE)

    # Sessions, flat and ordered by (user, session index).
    if sessions_per_user > 1:
        rate = rng.gamma(shape=2.0, scale=(sessions_per_user - 1.0) / 2.0, size=num_users)
    else:
        rate = np.zeros(num_users)
    sessions_of_user = 1 + rng.poisson(rate)
    session_user = np.repeat(np.arange(num_users), sessions_of_user)
    user_first_session = _exclusive_cumsum(sessions_of_user)
    num_sessions = len(session_user)

    # Item visits, flat and ordered by (session, position), with their funnel depth
    # (0 = view only, len(behaviors) - 1 = purchase).
    expected_depth = 1.0 + float(np.cumprod(funnel_arr).sum())
    mean_visits = max(events_per_session / expected_depth, 1.0)
    if mean_visits > 1:
        rate = rng.gamma(shape=3.0, scale=(mean_visits - 1.0) / 3.0, size=num_sessions)
    else:
        rate = np.zeros(num_sessions)
    visits_of_session = 1 + rng.poisson(rate)
    session_first_visit = _exclusive_cumsum(visits_of_session)
    num_visits = int(visits_of_session.sum())
    visit_session = np.repeat(np.arange(num_sessions), visits_of_session)
    passes = rng.random((num_visits, len(funnel_arr))) < funnel_arr
    depth = np.cumprod(passes, axis=1).sum(axis=1) if len(funnel_arr) else np.zeros(num_visits, int)
    purchase_depth = len(behaviors) - 1
    last_purchase_visit = np.full(num_sessions, -1)
    if purchase_depth > 0:
        bought = np.flatnonzero(depth == purchase_depth)
        np.maximum.at(last_purchase_visit, visit_session[bought], bought)

    visit_item = _simulate_items(
        rng,
        catalogue=catalogue,
        num_users=num_users,
        sessions_of_user=sessions_of_user,
        user_first_session=user_first_session,
        visits_of_session=visits_of_session,
        session_first_visit=session_first_visit,
        last_purchase_visit=last_purchase_visit,
        transition_strength=transition_strength,
        interest_concentration=interest_concentration,
        category_drift=category_drift,
        categories_per_session=categories_per_session,
        popularity_mix=popularity_mix,
        complement_after_purchase=complement_after_purchase,
    )

    # Events: each visit expands into its funnel stages.
    events_of_visit = depth + 1
    event_visit = np.repeat(np.arange(num_visits), events_of_visit)
    event_stage = np.arange(len(event_visit)) - np.repeat(
        _exclusive_cumsum(events_of_visit), events_of_visit
    )
    event_session = visit_session[event_visit]
    offset_s, session_duration_s = _within_session_offsets(
        rng,
        event_stage=event_stage,
        event_visit=event_visit,
        event_session=event_session,
        visit_session=visit_session,
        session_first_visit=session_first_visit,
        num_sessions=num_sessions,
    )
    session_start_s = _session_starts(
        rng,
        session_user=session_user,
        user_first_session=user_first_session,
        session_duration_s=session_duration_s,
        period_s=int(weeks * 7 * 86400),
    )
    timestamp_us = start_us + (session_start_s[event_session] + offset_s) * 1_000_000

    event_item = visit_item[event_visit]
    width = max(2, len(str(num_categories - 1)))
    category_names = pl.Series([f"c{c:0{width}d}" for c in range(num_categories)], dtype=pl.String)
    frame = pl.DataFrame(
        {
            USER: pl.Series(user_ids[session_user[event_session]], dtype=pl.Int64),
            ITEM: pl.Series(item_ids[event_item], dtype=pl.Int64),
            CATEGORY: category_names.gather(catalogue.item_category[event_item]),
            EVENT_TYPE: pl.Series(list(behaviors), dtype=pl.String).gather(event_stage),
            TIMESTAMP: pl.Series(timestamp_us, dtype=pl.Int64)
            .cast(pl.Datetime("us"))
            .dt.replace_time_zone("UTC"),
        }
    ).sort([USER, TIMESTAMP])
    logger.info(
        "generated %d events (%d users, %d sessions, %d item visits, %d items) in %.2fs",
        frame.height,
        num_users,
        num_sessions,
        num_visits,
        num_items,
        time.perf_counter() - t0,
    )
    return frame


class _CategorySampler:
    """Draws items proportionally to ``weights``, either within given categories or globally."""

    def __init__(self, weights: np.ndarray, item_category: np.ndarray, num_categories: int):
        self.order = np.argsort(item_category, kind="stable")  # items grouped by category
        self.cum = np.cumsum(weights[self.order])
        sizes = np.bincount(item_category, minlength=num_categories)
        self.first = _exclusive_cumsum(sizes)
        self.last = self.first + sizes - 1
        self.low = np.where(self.first > 0, self.cum[np.maximum(self.first - 1, 0)], 0.0)
        self.high = self.cum[self.last]

    def in_category(self, category: np.ndarray, u: np.ndarray) -> np.ndarray:
        x = self.low[category] + u * (self.high[category] - self.low[category])
        pos = np.searchsorted(self.cum, x, side="right")
        # float rounding can step one slot outside the category's block
        pos = np.clip(pos, self.first[category], self.last[category])
        return self.order[pos]

    def globally(self, u: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.cum, u * self.cum[-1], side="right")
        return self.order[np.minimum(pos, len(self.cum) - 1)]


@dataclass(frozen=True)
class _Catalogue:
    item_category: np.ndarray  # (I,) category index of each item
    popularity: _CategorySampler  # Zipf popularity, drawable within a category or globally
    successors: np.ndarray  # (I, K) likely next items
    successor_cumweight: np.ndarray  # (K,) cumulative successor weights, last = 1
    category_share: np.ndarray  # (C,) share of items per category: prior of new interests
    complements: np.ndarray  # (C, 2) complementary categories (the next purchase journey)


def _make_catalogue(
    rng: np.random.Generator,
    *,
    num_items: int,
    num_categories: int,
    zipf_exponent: float,
    successors_per_item: int,
    same_category_successor: float,
) -> _Catalogue:
    share = rng.lognormal(0.0, 1.0, size=num_categories)
    sizes = 1 + rng.multinomial(num_items - num_categories, share / share.sum())
    item_category = rng.permutation(np.repeat(np.arange(num_categories), sizes))
    rank = rng.permutation(num_items) + 1.0
    weights = rank**-zipf_exponent
    popularity = _CategorySampler(weights, item_category, num_categories)

    # Related and complementary categories: random other categories (itself when it is alone).
    related = _other_categories(rng, num_categories, 2)
    complements = _other_categories(rng, num_categories, 2)

    # Successors are drawn proportionally to sqrt(popularity), so that the transition structure
    # is not just the popularity ranking again.
    successor_sampler = _CategorySampler(np.sqrt(weights), item_category, num_categories)
    shape = (num_items, successors_per_item)
    own = np.broadcast_to(item_category[:, None], shape)
    rel = related[own, rng.integers(0, related.shape[1], size=shape)]
    slot_category = np.where(rng.random(shape) < same_category_successor, own, rel)
    successors = successor_sampler.in_category(slot_category, rng.random(shape))
    items = np.broadcast_to(np.arange(num_items)[:, None], shape)
    for attempt in range(12):  # redraw self-loops; a one-item category moves to a related one
        loops = successors == items
        if not loops.any() or num_items == 1:
            break
        if attempt < 6:
            category = slot_category[loops] if attempt < 3 else rel[loops]
            successors[loops] = successor_sampler.in_category(category, rng.random(loops.sum()))
        else:
            successors[loops] = successor_sampler.globally(rng.random(loops.sum()))
    slot_weight = 1.0 / np.arange(1, successors_per_item + 1)
    cumweight = np.cumsum(slot_weight) / slot_weight.sum()
    cumweight[-1] = 1.0
    return _Catalogue(
        item_category=item_category,
        popularity=popularity,
        successors=successors,
        successor_cumweight=cumweight,
        category_share=sizes / sizes.sum(),
        complements=complements,
    )


def _simulate_items(
    rng: np.random.Generator,
    *,
    catalogue: _Catalogue,
    num_users: int,
    sessions_of_user: np.ndarray,
    user_first_session: np.ndarray,
    visits_of_session: np.ndarray,
    session_first_visit: np.ndarray,
    last_purchase_visit: np.ndarray,
    transition_strength: float,
    interest_concentration: float,
    category_drift: float,
    categories_per_session: int,
    popularity_mix: float,
    complement_after_purchase: float,
) -> np.ndarray:
    """Item of every visit. Vectorized over users (outer loop: session index k) and over
    sessions (inner loop: position j within the session)."""
    num_categories = len(catalogue.category_share)
    alpha = np.maximum(interest_concentration * catalogue.category_share, 1e-3)
    affinity = rng.dirichlet(alpha, size=num_users) + 1e-12
    affinity /= affinity.sum(axis=1, keepdims=True)
    purchased_category = np.full(num_users, -1)
    visit_item = np.empty(int(visits_of_session.sum()), dtype=np.int64)
    num_focus_max = categories_per_session

    for k in range(int(sessions_of_user.max())):
        users = np.flatnonzero(sessions_of_user > k)
        sessions = user_first_session[users] + k
        n = len(users)
        if k > 0:  # interests drift: mix in one new category, drawn by category size
            new = rng.choice(num_categories, size=n, p=catalogue.category_share)
            affinity[users] *= 1.0 - category_drift
            affinity[users, new] += category_drift
        user_affinity = affinity[users]
        focus = _sample_rows(rng, user_affinity, num_focus_max)  # (n, F)
        previous = purchased_category[users]
        complement = (previous >= 0) & (rng.random(n) < complement_after_purchase)
        pick = rng.integers(0, catalogue.complements.shape[1], size=n)
        focus[:, 0] = np.where(complement, catalogue.complements[previous, pick], focus[:, 0])
        num_focus = 1 + rng.binomial(num_focus_max - 1, 0.5, size=n)

        visits = visits_of_session[sessions]
        first_visit = session_first_visit[sessions]
        previous_item = np.zeros(n, dtype=np.int64)
        for j in range(int(visits.max())):
            active = np.flatnonzero(visits > j)
            m = len(active)
            follow = rng.random(m) < (transition_strength if j > 0 else 0.0)
            slot = (rng.random(m)[:, None] < catalogue.successor_cumweight).argmax(axis=1)
            successor = catalogue.successors[previous_item[active], slot]
            # a session opens in its entry category; later draws weigh all focus categories alike
            column = np.where(j == 0, 0, (rng.random(m) * num_focus[active]).astype(np.int64))
            in_focus = catalogue.popularity.in_category(focus[active, column], rng.random(m))
            popular = catalogue.popularity.globally(rng.random(m))
            explore = rng.random(m) < popularity_mix
            item = np.where(follow, successor, np.where(explore, popular, in_focus))
            visit_item[first_visit[active] + j] = item
            previous_item[active] = item

        bought = last_purchase_visit[sessions]
        purchased_category[users] = np.where(
            bought >= 0, catalogue.item_category[visit_item[np.maximum(bought, 0)]], -1
        )
    return visit_item


def _within_session_offsets(
    rng: np.random.Generator,
    *,
    event_stage: np.ndarray,
    event_visit: np.ndarray,
    event_session: np.ndarray,
    visit_session: np.ndarray,
    session_first_visit: np.ndarray,
    num_sessions: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds from its session's start for every event, and every session's duration."""
    num_events = len(event_stage)
    first_of_visit = event_stage == 0
    first_of_session = first_of_visit & (
        event_visit == session_first_visit[visit_session[event_visit]]
    )
    median = np.where(
        first_of_visit,
        BROWSE_GAP_MEDIAN_S,
        FUNNEL_GAP_MEDIAN_S * 2.5 ** np.maximum(event_stage - 1, 0),
    )
    gap = np.rint(median * rng.lognormal(0.0, 0.9, size=num_events))
    gap = np.clip(gap, 1, MAX_EVENT_GAP_S).astype(np.int64)
    gap[first_of_session] = 0
    total = np.cumsum(gap)
    session_first_event = np.flatnonzero(first_of_session)
    offset = total - total[session_first_event][event_session]
    duration = np.zeros(num_sessions, dtype=np.int64)
    np.maximum.at(duration, event_session, offset)
    return offset, duration


def _session_starts(
    rng: np.random.Generator,
    *,
    session_user: np.ndarray,
    user_first_session: np.ndarray,
    session_duration_s: np.ndarray,
    period_s: int,
) -> np.ndarray:
    """Start second of every session: uniform order statistics over the user's free time, so
    sessions never overlap and are at least ``MIN_SESSION_GAP_S`` apart."""
    occupied = session_duration_s + MIN_SESSION_GAP_S
    before = _exclusive_cumsum(occupied)
    before = before - before[user_first_session][session_user]  # occupied time before, per user
    required = np.bincount(session_user, weights=occupied) - MIN_SESSION_GAP_S
    slack = np.maximum(period_s - required, 0.0)
    free = rng.random(len(session_user)) * slack[session_user]
    free = free[np.lexsort((free, session_user))]  # sorted within each user's block
    return np.floor(free).astype(np.int64) + before


def _sample_rows(rng: np.random.Generator, probabilities: np.ndarray, draws: int) -> np.ndarray:
    """``draws`` categorical samples (with replacement) from every row of ``probabilities``."""
    rows, width = probabilities.shape
    cum = np.cumsum(probabilities, axis=1)
    # one searchsorted over all rows: row r's cumulative shares are shifted into [r, r + 1]
    shifted = (cum / cum[:, -1:] + np.arange(rows)[:, None]).ravel()
    u = rng.random((rows, draws)) + np.arange(rows)[:, None]
    flat = np.searchsorted(shifted, u, side="right")
    picks = flat - (np.arange(rows) * width)[:, None]
    return np.clip(picks, 0, width - 1)


def _other_categories(rng: np.random.Generator, num_categories: int, count: int) -> np.ndarray:
    """(C, count) random categories different from the row's own (itself if C == 1)."""
    if num_categories == 1:
        return np.zeros((1, count), dtype=np.int64)
    shift = rng.integers(1, num_categories, size=(num_categories, count))
    return (np.arange(num_categories)[:, None] + shift) % num_categories


def _distinct_ids(rng: np.random.Generator, n: int, base: int) -> np.ndarray:
    span = max(9 * base, 20 * n)
    return base + rng.choice(span, size=n, replace=False).astype(np.int64)


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def _parse_start(start: str | datetime) -> int:
    """Microseconds since the Unix epoch; naive values are taken as UTC."""
    if isinstance(start, datetime):
        moment = start
    else:
        try:
            moment = datetime.fromisoformat(str(start))
        except ValueError:
            raise ValueError(
                f"start={start!r} is not an ISO 8601 date or datetime: use e.g. '2024-01-01'"
            ) from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _validate(
    *,
    num_users: int,
    num_items: int,
    num_categories: int,
    weeks: float,
    sessions_per_user: float,
    events_per_session: float,
    behaviors: Sequence[str],
    funnel: Sequence[float],
    zipf_exponent: float,
    transition_strength: float,
    successors_per_item: int,
    same_category_successor: float,
    interest_concentration: float,
    category_drift: float,
    categories_per_session: int,
    popularity_mix: float,
    complement_after_purchase: float,
    seed: int,
) -> None:
    counts = {
        "num_users": num_users,
        "num_items": num_items,
        "num_categories": num_categories,
        "successors_per_item": successors_per_item,
        "categories_per_session": categories_per_session,
    }
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (>= 1)")
    if num_items < num_categories:
        raise ValueError(
            f"num_items={num_items} < num_categories={num_categories}: every category needs an "
            f"item; raise num_items or lower num_categories"
        )
    if not _finite(weeks) or weeks <= 0:
        raise ValueError(f"weeks={weeks!r} must be a positive number of weeks, e.g. 8.0")
    for name, value in {
        "sessions_per_user": sessions_per_user,
        "events_per_session": events_per_session,
    }.items():
        if not _finite(value) or value < 1:
            raise ValueError(f"{name}={value!r} must be a number >= 1 (it is a mean count)")
    if isinstance(behaviors, str):
        raise ValueError(
            f"behaviors={behaviors!r} must be a sequence of names, e.g. ('view', 'purchase')"
        )
    names = list(behaviors)
    if not names or not all(isinstance(b, str) and b for b in names):
        raise ValueError(f"behaviors={names!r} must be non-empty names in funnel order")
    if len(set(names)) != len(names):
        raise ValueError(f"behaviors={names!r} has duplicates: list each event type once")
    if isinstance(funnel, str) or len(funnel) != len(names) - 1:
        raise ValueError(
            f"funnel={funnel!r} needs len(behaviors) - 1 = {len(names) - 1} probabilities, "
            f"one per step of {names!r}"
        )
    for step, p in enumerate(funnel):
        if not _finite(p) or not 0.0 <= p <= 1.0:
            raise ValueError(
                f"funnel[{step}]={p!r} (P({names[step + 1]} | {names[step]})) must be a "
                f"probability in [0, 1]"
            )
    if not _finite(zipf_exponent) or zipf_exponent < 0:
        raise ValueError(f"zipf_exponent={zipf_exponent!r} must be >= 0 (0 = uniform popularity)")
    for name, value in {
        "transition_strength": transition_strength,
        "same_category_successor": same_category_successor,
        "category_drift": category_drift,
        "popularity_mix": popularity_mix,
        "complement_after_purchase": complement_after_purchase,
    }.items():
        if not _finite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value!r} must be a probability in [0, 1]")
    if not _finite(interest_concentration) or interest_concentration <= 0:
        raise ValueError(
            f"interest_concentration={interest_concentration!r} must be > 0 "
            "(about 0.5: a few favourite categories per user; 10+: everyone alike)"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative integer")


def _finite(value: object) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )
