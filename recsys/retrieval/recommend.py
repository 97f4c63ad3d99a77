"""Top-K recommendations for the users of an event log, with business rules, cold start and
attention explanations. :class:`Recommender` scores one chunk of users at a time; the score
task (:mod:`recsys.tasks.score`) writes each chunk as one output part.

Per user, best first:

1. **model** — users with at least ``min_history`` events of items the model knows: the user
   query vector against the item key table (:mod:`recsys.retrieval.index`), minus excluded
   items; target attention re-ranks the first ``rerank_top_n``; then at most
   ``max_per_category`` per category. A model trained with ``training.transition_prior``
   adds it to those scores (:func:`recsys.retrieval.ranker.with_prior`: exact on top of any
   index).
2. **category_popularity** / **popularity** — the cold-start fallback, for users without a
   usable history and to fill lists the rules left short: items ranked first by how many of
   the user's events fall in their category, then by recent popularity
   (:class:`~recsys.retrieval.catalogue.Catalogue`), then by catalogue index (ties never go
   by chance). Model candidates of a model user are not offered again. A row's ``source`` is
   ``category_popularity`` when the item shares a category with the user's events, else
   ``popularity``. Items new in the log (no model key) can only come from here.

The same rules apply to every source. Each user gets ``top_k`` rows, fewer only where the rules
leave fewer items: a ``top_k`` beyond the items the job may recommend (the model's and the
log's new ones, within the allow and deny lists), less the user's excluded items, or a category
cap over too few categories. A user left with no item gets no row (a warning counts them). A
user's list does not depend on the other users of its batch, nor on ``batch_size`` (beyond the
float rounding of the encoder's batched arithmetic).

Output columns (long format, one row per user and rank)::

    user_id  rank  item_id  score  source  explain_1_item_id  explain_1_behavior
    explain_1_timestamp  explain_1_weight  ...  explain_3_weight  item_category

``explain_j_*`` (model rows; null elsewhere) is the history event with the j-th largest
explanation weight for that recommended item (``encoder.explanation_weights``: the
target-attention head's weights once it is trained, else the softmax over history positions of
the item key's match with each history state).
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from recsys.allocation import cpu_chunk_length
from recsys.checkpoint import LoadedModel
from recsys.data.dataset import SequenceStore, TargetRows, width_multiple
from recsys.data.pipeline import scoring_events, scoring_sequences
from recsys.retrieval.catalogue import ITEM_CATEGORY, Catalogue
from recsys.retrieval.index import (
    INDEXES,
    MIN_ITEM_CHUNK,
    build_index,
    changed_faiss_settings,
    check_faiss_settings,
    chunked_topk,
)
from recsys.retrieval.ranker import rerank_head, with_prior
from recsys.retrieval.rules import Rules, cap_per_category, take_first
from recsys.schema import EVENT_TYPE, ITEM, NUM_RESERVED, PAD_IDX, TIMESTAMP, USER

log = logging.getLogger(__name__)

SOURCES = ("model", "category_popularity", "popularity")
_SOURCE_NAMES = pl.Series(SOURCES, dtype=pl.Enum(list(SOURCES)))  # code -> name
MAX_EXPLANATIONS = 3
BASE_COLUMNS = (USER, "rank", ITEM, "score", "source")


def explanation_columns(count: int) -> list[str]:
    return [
        f"explain_{j}_{part}"
        for j in range(1, count + 1)
        for part in ("item_id", "behavior", "timestamp", "weight")
    ]


@dataclass(frozen=True)
class ScoringOptions:
    """``conf/retrieval`` (everything but ``rules`` and the output settings)."""

    top_k: int = 10
    rerank_top_n: int = 0
    index: str = "exact"
    item_chunk_size: int = 65_536
    user_chunk_size: int = 50_000
    batch_size: int = 512
    explanations: int = 3
    min_history: int = 1
    popularity_days: float | None = 30.0
    faiss: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():  # np.int64 from a notebook: the int it is
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
        for name in ("top_k", "item_chunk_size", "user_chunk_size", "batch_size", "min_history"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval.{name}={value!r} must be a positive integer")
        if not isinstance(self.rerank_top_n, int) or self.rerank_top_n < 0:
            raise ValueError(f"retrieval.rerank_top_n={self.rerank_top_n!r} must be >= 0")
        if not isinstance(self.explanations, int) or not 0 <= self.explanations <= 3:
            raise ValueError(
                f"retrieval.explanations={self.explanations!r} must be 0..{MAX_EXPLANATIONS}"
            )
        if self.index not in INDEXES:
            raise ValueError(f"retrieval.index={self.index!r}: use one of {list(INDEXES)}")
        if self.index == "faiss":
            check_faiss_settings(self.faiss)
        elif changed := changed_faiss_settings(self.faiss):
            log.warning(
                "%s ignored: retrieval.index=%s does not read retrieval.faiss; set "
                "retrieval.index=faiss to use it (or drop it)",
                ", ".join(f"retrieval.faiss.{k}={v!r}" for k, v in changed.items()),
                self.index,
            )
        if self.popularity_days is not None and not 0 < self.popularity_days < math.inf:
            raise ValueError(
                f"retrieval.popularity_days={self.popularity_days!r} must be a finite number "
                "> 0, or null (all: every event of the log counts)"
            )

    @property
    def columns(self) -> list[str]:
        return [*BASE_COLUMNS, *explanation_columns(self.explanations), ITEM_CATEGORY]


@dataclass
class ScoringData:
    """A scoring log, ready: ``events`` (sorted, deduped, encoded; row r = flat event r of
    ``store``), the per-user ``store``, each flat event's ``catalogue_index`` and the
    ``catalogue``."""

    events: pl.DataFrame
    store: SequenceStore
    catalogue_index: np.ndarray
    catalogue: Catalogue
    query_time: int  # Unix seconds the recommendations are for

    @classmethod
    def build(
        cls,
        model: LoadedModel,
        events: pl.DataFrame,
        *,
        rules: Rules,
        options: ScoringOptions,
        as_of=None,
        timed: bool = True,
        item_table: pl.DataFrame | None = None,
    ) -> ScoringData:
        """``timed=False``: an order-only log, whose times are its row numbers (one
        microsecond apart in 1970): its explanations show no time. ``item_table``
        (``item_id, attributes``): the categories of the log's items new to the model."""
        encoded = scoring_events(events, vocab=model.vocab, as_of=as_of)
        if as_of is not None:
            later = events[USER].n_unique() - encoded[USER].n_unique()
            if later:
                log.info(
                    "%d users of the log have no event before retrieval.as_of=%s: nothing is "
                    "known of them at that moment, so they get no recommendations",
                    later,
                    as_of.isoformat(),
                )
        store = SequenceStore.from_frame(scoring_sequences(encoded))
        query_time = int(store.timestamp.max()) if as_of is None else int(as_of.timestamp())
        window = None if options.popularity_days is None else options.popularity_days * 86_400
        # a window reaching back before 1970 (popularity_days=1e300) counts every event, as null
        since = None if window is None or window >= query_time else query_time - int(window)
        catalogue = Catalogue.build(
            model.vocab,
            encoded,
            target_behavior=rules.target_behavior,
            popularity_since=since,
            item_table=item_table,
        )
        index = catalogue.index_of(encoded[ITEM])
        moment = pl.col(TIMESTAMP) if timed else pl.lit(None, encoded.schema[TIMESTAMP])
        return cls(
            events=encoded.select(USER, ITEM, EVENT_TYPE, moment.alias(TIMESTAMP)),
            store=store,
            catalogue_index=index,
            catalogue=catalogue,
            query_time=query_time,
        )

    @property
    def known_events(self) -> np.ndarray:
        """(U,) events per user whose item the model knows."""
        known = (self.store.item >= NUM_RESERVED).astype(np.int64)
        return np.add.reduceat(known, self.store.offsets[:-1]) if len(known) else known


def _check_category_cap(
    cap: int, category: torch.Tensor, blocked: torch.Tensor, options: ScoringOptions
) -> None:
    """Warn when ``retrieval.rules.max_per_category`` caps nothing (no item has a category) or
    leaves every list short of ``top_k`` (too few categories among the items this job may
    recommend: the fallback obeys the cap too). Shapes: category, blocked (I_c,)."""
    if not bool((category > 0).any()):
        log.warning(
            "retrieval.rules.max_per_category=%d has no effect: no item of this catalogue "
            "has a category or attribute (the model was trained without "
            "data.columns.category, data.columns.attributes or data.items), so nothing is "
            "capped: train with a category column, or drop the rule",
            cap,
        )
        return
    allowed = category.cpu()[~blocked.cpu()]
    sizes = allowed[allowed > 0].unique(return_counts=True)[1]
    categories = len(sizes)
    most = int(sizes.clamp(max=cap).sum()) + int((allowed == 0).sum())
    if most < min(options.top_k, len(allowed)):  # (top_k beyond them all: warned already)
        log.warning(
            "retrieval.rules.max_per_category=%d over the %d categories of the items this job "
            "may recommend leaves at most %d items per list, under retrieval.top_k=%d: raise "
            "max_per_category or lower top_k",
            cap,
            categories,
            most,
            options.top_k,
        )


class Recommender:
    """Scores chunks of users of ``data`` with ``model`` under ``rules``."""

    def __init__(
        self,
        model: LoadedModel,
        data: ScoringData,
        *,
        rules: Rules,
        options: ScoringOptions,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model, self.data, self.rules, self.options = model, data, rules, options
        if model.transition_prior is not None and options.rerank_top_n:
            raise ValueError(
                f"retrieval.rerank_top_n={options.rerank_top_n}: this model's scores include a "
                "transition prior (training.transition_prior), which the re-rank stage would "
                "replace for its top N: score with retrieval.rerank_top_n=0"
            )
        self.device = torch.device(device)
        self.encoder = model.encoder.to(self.device).eval()
        catalogue = data.catalogue
        self.blocked = rules.blocked(catalogue)
        self.blocked[model.never_recommended()] = True  # (a model item's index is its own)
        self.blocked = self.blocked.to(self.device)
        recommendable = int((~self.blocked).sum())
        if options.top_k > recommendable:
            log.warning(
                "retrieval.top_k=%d exceeds the %d items this job may recommend (the model's "
                "and the log's new items, within retrieval.rules.allow_list / deny_list): each "
                "list holds at most %d, fewer where the user's own items are excluded "
                "(retrieval.rules.exclude)",
                options.top_k,
                recommendable,
                recommendable,
            )
        self.category = catalogue.category.to(self.device)
        if rules.max_per_category is not None:
            _check_category_cap(rules.max_per_category, catalogue.category, self.blocked, options)
        pop = catalogue.popularity.double().log1p()
        # in [0, 1): a popularity order that never outweighs one shared-category event
        self.popularity = (pop / (pop.max() + 1.0)).float().to(self.device)
        # the fallback's order among equal popularity: the lower catalogue index first
        order = torch.sort(self.popularity.cpu(), descending=True, stable=True).indices
        self.popularity_rank = torch.empty(catalogue.size, dtype=torch.float64)
        self.popularity_rank[order] = torch.arange(catalogue.size - 1, -1, -1, dtype=torch.float64)
        self.popularity_rank = self.popularity_rank.to(self.device)  # (I_c,) larger = first
        excluded = rules.excluded_behaviors(model.vocab.behaviors)
        self.exclude_event = None if excluded is None else np.isin(data.store.behavior, excluded)
        self.known = data.known_events
        most = int(self.known.max()) if len(self.known) else 0
        if options.min_history > 1 and most < options.min_history:
            log.warning(
                "retrieval.min_history=%d: no user of this log has that many events of items "
                "the model knows (the most is %d), so every user gets the fallback (popularity "
                "and shared categories), none the model's scores: lower it",
                options.min_history,
                most,
            )
        self.rows = TargetRows(
            data.store,
            data.store.lengths,
            max_seq_len=model.max_seq_len,
            time_buckets=model.time_buckets,
            has_target=False,
            query_time=data.query_time,
            width_multiple=width_multiple("auto", self.device),  # the same scores, any width
        )
        with torch.no_grad():
            keys = self.encoder.item_keys()
            bias = self.encoder.score_items(keys.new_zeros(1, keys.shape[1]))[0]  # bias + -inf
        num_model = catalogue.num_model_items
        self.index = build_index(
            keys,
            torch.nan_to_num(bias, neginf=0.0),
            self.blocked[:num_model] | torch.isneginf(bias),
            index=options.index,
            item_chunk_size=options.item_chunk_size,
            faiss=dict(options.faiss or {}),
        )
        self.num_model_items = num_model

    # -- stage by stage ----------------------------------------------------------------------
    def _excluded(self, rows: np.ndarray) -> torch.Tensor | None:
        if self.exclude_event is None:
            return None
        store = self.data.store
        return store.history(self.data.catalogue_index, rows, keep=self.exclude_event).to(
            self.device
        )

    def _deep_enough(self, search, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``search(depth) -> (scores, items)`` (B, depth), best first, at the depth the rules
        need: a category cap can eat a whole depth, so look 4x deeper while some row is short
        of ``top_k`` and the ``limit`` items have more to give."""
        depth = max(self.options.top_k, self.options.rerank_top_n)
        if self.rules.max_per_category is not None:
            depth = max(depth, 4 * self.options.top_k)
        depth = min(depth, limit)
        while True:
            scores, items = search(depth)
            valid = ~torch.isneginf(scores)
            kept = cap_per_category(items, self.category, valid, self.rules.max_per_category)
            short = kept.sum(dim=1) < self.options.top_k
            if depth >= limit or not bool((short & valid.all(dim=1)).any()):
                return scores, items
            depth = min(depth * 4, limit)

    @torch.no_grad()
    def _model_candidates(self, rows: np.ndarray):
        """Model ranking of ``rows`` (positions in the store): candidates (B, D) best first,
        their scores, the encoder output and the batch."""
        batch = self.rows[list(rows)].to(self.device)
        output = self.encoder(*batch.model_inputs())
        exclude = self._excluded(rows)

        prior = self.model.transition_prior

        def search(depth: int) -> tuple[torch.Tensor, torch.Tensor]:
            scores, items = self.index.search(output.query, depth, exclude)  # (B, D)
            if prior is not None:
                scores, items = with_prior(
                    self.encoder,
                    output,
                    prior,
                    batch.item,
                    items,
                    scores,
                    blocked=self.blocked[: self.num_model_items],
                    exclude=exclude,
                )
            items, scores = rerank_head(
                self.encoder, output, items, scores, self.options.rerank_top_n
            )
            return scores, items

        scores, items = self._deep_enough(search, self.num_model_items)
        return items, scores, output, batch

    @torch.no_grad()
    def _fallback(self, rows: np.ndarray, before: tuple[torch.Tensor, torch.Tensor] | None):
        """Cold-start candidates for ``rows``: (B, D) items, scores and a source code per item
        (1 = category_popularity, 2 = popularity). ``before``: (items, valid) (B, D'), the
        model's candidates ahead of them in each row's list (None: no row has any). The
        valid ones are not offered again; invalid ones (a cold user's row, none left) exclude
        nothing."""
        history = self.data.store.history(self.data.catalogue_index, rows)
        history = history.to(self.device)  # (B, L)
        counts = torch.zeros(len(rows), self.data.catalogue.num_categories, device=self.device)
        counts.scatter_add_(1, self.category[history], (history >= NUM_RESERVED).float())
        counts[:, 0] = 0  # "no category" is not a shared category

        size = self.data.catalogue.size
        shared_events = counts.double() * size

        def rank_chunk(start: int, end: int) -> torch.Tensor:
            """The score's order with no ties: shared-category events, then popularity, then
            the lower catalogue index; exact in float64 (events x size < 2^53). torch.topk
            breaks ties by chance, differently at each depth, and the depth is set by the
            batch's other rows, so tied items would depend on the batch."""
            category = self.category[start:end]
            return shared_events[:, category] + self.popularity_rank[start:end]  # (B, C)

        def score(items: torch.Tensor) -> torch.Tensor:
            return counts.gather(1, self.category[items]) + self.popularity[items]  # (B, D)

        exclude = self._excluded(rows)
        if before is not None:
            listed = before[0].masked_fill(~before[1], PAD_IDX)  # (B, D')
            exclude = listed if exclude is None else torch.cat([exclude, listed], 1)

        def search(depth: int) -> tuple[torch.Tensor, torch.Tensor]:
            ranks, items = chunked_topk(
                rank_chunk,
                size,
                depth,
                blocked=self.blocked,
                exclude=exclude,
                item_chunk_size=cpu_chunk_length(
                    self.options.item_chunk_size,
                    8 * len(rows),
                    counts.device,
                    minimum=MIN_ITEM_CHUNK,
                ),  # float64 ranks
            )
            return score(items).masked_fill(torch.isneginf(ranks), -math.inf), items

        scores, items = self._deep_enough(search, size)
        shared = counts.gather(1, self.category[items]) > 0
        return items, scores, torch.where(shared, 1, 2)

    @torch.no_grad()
    def recommend(self, rows: np.ndarray) -> pl.DataFrame:
        """Recommendations for store rows ``rows`` (one output part), in ``rows`` order."""
        frames = [
            self._recommend_batch(rows[i : i + self.options.batch_size])
            for i in range(0, len(rows), self.options.batch_size)
        ]
        frame = pl.concat(frames) if frames else self.empty()
        listed = int((frame["rank"] == 1).sum())
        if listed < len(rows):
            log.warning(
                "%d of %d users got no recommendation: the rules leave them no item (what "
                "retrieval.rules.allow_list allows, less deny_list, is all excluded for them by "
                "retrieval.rules.exclude); widen the allow list or relax exclude",
                len(rows) - listed,
                len(rows),
            )
        return frame

    def empty(self) -> pl.DataFrame:
        return self._frame(np.zeros(0, np.int64), *(np.zeros(0),) * 4, None)

    def _recommend_batch(self, rows: np.ndarray) -> pl.DataFrame:
        """One batch of store rows: each row's model candidates (users with ``min_history``
        known events), then the fallback's for rows the rules left short of ``top_k``."""
        o, device = self.options, self.device
        k = o.top_k
        batch_size = len(rows)
        (model_at,) = np.nonzero(self.known[rows] >= o.min_history)  # (M,) model rows
        items = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        scores = torch.zeros(batch_size, 0, device=device)
        if len(model_at):
            # only model users are encoded and searched: a cold row has no model candidate
            # (PAD at -inf), so nothing the model would have offered it leaves its fallback
            at = torch.from_numpy(model_at).to(device)
            m_items, m_scores, output, batch = self._model_candidates(rows[model_at])
            self._check_scores(m_scores)
            items = _spread(m_items, at, batch_size, PAD_IDX)
            scores = _spread(m_scores, at, batch_size, -math.inf)
        source = torch.zeros_like(items)
        valid = ~torch.isneginf(scores)
        kept = cap_per_category(items, self.category, valid, self.rules.max_per_category)
        need = kept.sum(dim=1) < k
        if bool(need.any()):
            fill = torch.nonzero(need).squeeze(1)  # (F,)
            before = None if items.shape[1] == 0 else (items[fill], valid[fill])
            f_items, f_scores, f_source = self._fallback(rows[fill.cpu().numpy()], before)
            items = torch.cat([items, _spread(f_items, fill, batch_size, PAD_IDX)], dim=1)
            scores = torch.cat([scores, _spread(f_scores, fill, batch_size, -math.inf)], dim=1)
            source = torch.cat([source, _spread(f_source, fill, batch_size, 0)], dim=1)
            valid = ~torch.isneginf(scores)
            kept = cap_per_category(items, self.category, valid, self.rules.max_per_category)
        chosen = take_first(kept, k)  # (B, K), -1 = none
        has = chosen >= 0
        safe = chosen.clamp(min=0)
        items, scores, source = (t.gather(1, safe) for t in (items, scores, source))
        explanations = None
        if o.explanations and len(model_at):
            flat, weights = self._explain(items[at], source[at], output, batch, rows[model_at])
            explanations = (
                _spread(flat, at, batch_size, -1).cpu().numpy(),
                _spread(weights, at, batch_size, 0.0).float().cpu().numpy(),
            )
        has_np = has.cpu().numpy()
        user_rows = np.repeat(rows, has_np.sum(axis=1))
        ranks = np.broadcast_to(np.arange(1, k + 1), has_np.shape)[has_np]
        return self._frame(
            user_rows,
            ranks,
            items.cpu().numpy()[has_np],
            scores.float().cpu().numpy()[has_np],
            source.cpu().numpy()[has_np],
            None if explanations is None else tuple(e[has_np] for e in explanations),
        )

    def _check_scores(self, scores: torch.Tensor) -> None:
        """Refuse NaN model scores (B, D): NaN ranks first in a top-K, so the lists would be
        in arbitrary order, written without a word (weights that overflow on these histories;
        weights that are themselves NaN are refused when the checkpoint loads)."""
        broken = torch.isnan(scores).any(dim=1)
        if bool(broken.any()):
            raise FloatingPointError(
                f"the model {self.model.path} scored NaN for {int(broken.sum())} of a batch's "
                f"{len(scores)} users: its numbers overflow (its training diverged), so its "
                "rankings would be arbitrary; nothing more is written. Score with an earlier "
                "checkpoint, or retrain with a lower training.optimizer.lr"
            )

    def _explain(self, items, source, output, batch, rows):
        """Top ``explanations`` (E) history events by explanation weight for each model
        item: flat event indices (B, K, E) (-1 = none) and weights (B, K, E) (0 = none), on
        the device. E columns whatever the batch: a batch whose longest window holds fewer
        than E events has its last columns empty."""
        candidates = torch.where(
            (source == 0) & (items < self.num_model_items), items, PAD_IDX
        )  # (B, K)
        weights = self.encoder.explanation_weights(output, candidates)
        weights = weights * (candidates != PAD_IDX)[..., None]  # (B, K, T)
        count = min(self.options.explanations, weights.shape[2])
        top_weights, position = weights.topk(count, dim=2)  # (B, K, c)
        width = weights.shape[2]
        lengths = torch.from_numpy(self.rows.end[rows] - self.rows.start[rows]).to(
            self.device
        )  # (B,)
        start = torch.from_numpy(self.rows.start[rows]).to(self.device)
        flat = start[:, None, None] + position - (width - lengths)[:, None, None]
        flat = torch.where(top_weights > 0, flat, -1)
        missing = self.options.explanations - count  # windows shorter than E
        flat = torch.nn.functional.pad(flat, (0, missing), value=-1)
        top_weights = torch.nn.functional.pad(top_weights, (0, missing), value=0.0)
        return flat, top_weights

    def _frame(self, user_rows, ranks, items, scores, source, explanations) -> pl.DataFrame:
        catalogue = self.data.catalogue
        items = np.asarray(items, dtype=np.int64)
        frame = pl.DataFrame(
            {
                USER: self.data.store.user_id.gather(user_rows),
                "rank": pl.Series(ranks, dtype=pl.Int32),
                ITEM: catalogue.item_ids(items),
                "score": pl.Series(scores, dtype=pl.Float32),
                # codes gathered from the three names: a Python str per row took 0.13 s per
                # 1 M rows (100 k users), a tenth of this method
                "source": _SOURCE_NAMES.gather(np.asarray(source, dtype=np.int64)),
            }
        )
        count = self.options.explanations
        if count:
            events = self.data.events
            flat = np.full((len(items), count), -1) if explanations is None else explanations[0]
            weight = np.zeros((len(items), count)) if explanations is None else explanations[1]
            behaviors = pl.Enum(list(self.model.vocab.behaviors))
            for j in range(count):
                index = pl.Series(flat[:, j], dtype=pl.Int64)
                index = index.set(index < 0, None)
                valid = index.is_not_null()
                frame = frame.with_columns(
                    events[ITEM].gather(index).alias(f"explain_{j + 1}_item_id"),
                    events[EVENT_TYPE]
                    .gather(index)
                    .cast(behaviors)
                    .alias(f"explain_{j + 1}_behavior"),
                    events[TIMESTAMP].gather(index).alias(f"explain_{j + 1}_timestamp"),
                    pl.Series(weight[:, j], dtype=pl.Float32)
                    .set(~valid, None)
                    .alias(f"explain_{j + 1}_weight"),
                )
        return frame.with_columns(catalogue.categories(items).alias(ITEM_CATEGORY)).select(
            self.options.columns
        )


def _spread(values: torch.Tensor, at: torch.Tensor, size: int, fill) -> torch.Tensor:
    """``values`` (M, ...) as rows ``at`` (M,) of a (size, ...) tensor, ``fill`` elsewhere."""
    out = values.new_full((size, *values.shape[1:]), fill)
    out[at] = values
    return out


__all__ = [
    "Recommender",
    "ScoringData",
    "ScoringOptions",
    "SOURCES",
    "explanation_columns",
]
