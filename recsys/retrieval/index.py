"""Stage 1 of scoring: top-``depth`` items per user query, with memory bounded by chunks.

``score = query · key + bias`` over the item key table. Two indexes answer the same call:

- :class:`ExactIndex` walks the catalogue in chunks of ``item_chunk_size`` items, so a batch
  of B users never holds more than ``B x item_chunk_size`` scores (a 1 M-item catalogue in
  chunks of 65 536 items: 512 users x 65 536 x 4 bytes = 128 MiB of scores, plus the
  chunk's top-K), and merges each chunk's top-K into a running top-K. On a CPU a chunk is
  cut to 16 MiB of scores (8,192 items for 512 users; at least ``MIN_ITEM_CHUNK`` items) by
  :func:`recsys.allocation.cpu_chunk_length`: larger tables are mapped afresh from the kernel
  at every chunk, which took 1.6-1.7x the time (``python -m benchmarks.allocation_benchmark``).
- :class:`FaissIndex` (optional, ``pip install recsys[ann]``): an approximate HNSW or IVF
  index. The bias is folded in as one more dimension (``[q, 1] · [k, b]``). With ``metric="l2"``
  (default) the largest inner product is found as the nearest neighbour in L2, after one more
  dimension that gives every item vector the same norm (Bachrach et al. 2014); with
  ``"inner_product"`` the index searches inner products directly. On the trained ATRank
  models of the research datasets the L2 form found 0.993-0.999 of the exact top 10 (HNSW,
  efSearch 128), inner products 0.61-0.99 (``benchmarks/README.md``, "Which faiss form");
  on keys whose norms differ widely it can be the other way round, so measure your model's
  recall with ``python -m benchmarks.faiss_recall``.
  Building it is the slow part (HNSW over 1 M items: 67-104 s on 2 cores), so with a
  ``cache_dir`` it is saved there and loaded by the next job with the same vectors and build
  settings.

Both drop ``blocked`` items (PAD, UNK, deny-listed, outside an allow-list) and each row's
``exclude`` items (e.g. what the user has seen). Rows with fewer than ``depth`` admissible items
are padded with score ``-inf`` (item 0, PAD), which callers treat as "no item".

The same :func:`chunked_topk` serves any score function over the catalogue, so the cold-start
popularity scores go through the same rules as the model's.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys.allocation import cpu_chunk_length
from recsys.retrieval.output import write_atomically

log = logging.getLogger(__name__)

INDEXES = ("exact", "faiss")
MIN_ITEM_CHUNK = 1024  # items per chunk on a CPU, however many users a batch holds


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"retrieval.{name}={value!r} must be a positive integer")
    return value


def mask_items(scores: torch.Tensor, items: torch.Tensor, start: int) -> torch.Tensor:
    """Set ``scores[b, items[b, j] - start]`` to ``-inf`` for the items inside this chunk
    (``items`` may hold any index; PAD-filled rows are fine). In place; returns ``scores``.

    Shapes: scores (B, C) for items ``start .. start+C-1``; items (B, T).
    """
    local = items - start
    rows, columns = torch.nonzero((local >= 0) & (local < scores.shape[1]), as_tuple=True)
    scores[rows, local[rows, columns]] = -math.inf  # repeated indices write the same value
    return scores


def chunked_topk(
    score_chunk: Callable[[int, int], torch.Tensor],
    num_items: int,
    depth: int,
    *,
    blocked: torch.Tensor,
    exclude: torch.Tensor | None = None,
    item_chunk_size: int = 65_536,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``depth`` of ``score_chunk(start, end) -> (B, end - start)`` (a new tensor, which
    is modified in place) over items ``0 .. num_items - 1``, one chunk at a time: each chunk's
    own top-``depth`` is merged into the running best, so memory is one chunk of scores.
    Scores are compared in float32, or in float64 when ``score_chunk`` gives float64 (a key
    too fine for float32, e.g. one without ties).

    Shapes: blocked (num_items,) bool, True = never returned; exclude (B, T) item indices.
    Returns scores (B, depth) best first and items (B, depth) long.
    """
    best_scores = best_items = None
    for start in range(0, num_items, item_chunk_size):
        end = min(start + item_chunk_size, num_items)
        scores = score_chunk(start, end)  # (B, C)
        if scores.dtype not in (torch.float32, torch.float64):
            scores = scores.float()
        scores.masked_fill_(blocked[start:end], -math.inf)
        if exclude is not None:
            mask_items(scores, exclude, start)
        scores, position = scores.topk(min(depth, end - start), dim=1)  # (B, k)
        items = position + start
        if best_scores is not None:
            scores = torch.cat([best_scores, scores], dim=1)  # (B, <= 2 * depth)
            items = torch.cat([best_items, items], dim=1)
            scores, position = scores.topk(min(depth, scores.shape[1]), dim=1)
            items = items.gather(1, position)
        best_scores, best_items = scores, items
    if best_scores.shape[1] < depth:  # a catalogue smaller than depth
        missing = depth - best_scores.shape[1]
        best_scores = torch.cat(
            [best_scores, best_scores.new_full((best_scores.shape[0], missing), -math.inf)], 1
        )
        best_items = torch.cat([best_items, best_items.new_zeros(best_items.shape[0], missing)], 1)
    best_items = best_items.masked_fill(torch.isneginf(best_scores), 0)
    return best_scores, best_items


@dataclass
class ExactIndex:
    """Exact inner-product search over ``keys`` (I, D) plus ``bias`` (I,), in item chunks."""

    keys: torch.Tensor
    bias: torch.Tensor
    blocked: torch.Tensor
    item_chunk_size: int = 65_536

    def __post_init__(self) -> None:
        _check_positive("item_chunk_size", self.item_chunk_size)

    @property
    def num_items(self) -> int:
        return self.keys.shape[0]

    def search(
        self, query: torch.Tensor, depth: int, exclude: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: query (B, D); exclude (B, T) -> scores, items (B, depth)."""

        def score_chunk(start: int, end: int) -> torch.Tensor:
            return query @ self.keys[start:end].T + self.bias[start:end]  # (B, C)

        return chunked_topk(
            score_chunk,
            self.num_items,
            depth,
            blocked=self.blocked,
            exclude=exclude,
            item_chunk_size=cpu_chunk_length(
                self.item_chunk_size, 4 * len(query), query.device, minimum=MIN_ITEM_CHUNK
            ),
        )


class FaissIndex:
    """Approximate search with faiss over the admissible items only.

    ``kind``: ``hnsw`` (graph, ``hnsw_m`` links per node, ``ef_search`` breadth at query time)
    or ``ivf`` (``nlist`` clusters, ``nprobe`` visited per query); ``flat`` is exact faiss
    (a reference for recall). ``metric``: how hnsw and ivf search, ``l2`` (the inner product as
    an L2 distance over vectors of equal norm) or ``inner_product``; either way the scores
    returned are the exact ``query · key + bias`` of the items found. Rows' ``exclude`` items
    are removed after the search, which asks for ``depth + T`` neighbours so that excluding up
    to T items still leaves ``depth``.

    ``cache_dir``: where built indexes are kept, one file per content key — a hash of the
    vectors (keys, bias), the admissible items and the build settings (``kind``, ``metric``,
    ``hnsw_m``, ``ef_construction``, ``nlist``). A job whose key has a file loads it instead
    of building; the query-time settings (``ef_search``, ``nprobe``) are applied after
    loading, so changing them reuses the file. A file that cannot be read is rebuilt and
    replaced (with a warning).
    ``cache_keep``: how many index files the folder keeps (``None``: all); after each job the
    least recently used others are deleted, so scheduled retraining does not fill the disk
    with the indexes of retired models (loading or saving a file marks it used).
    """

    def __init__(
        self,
        keys: torch.Tensor,
        bias: torch.Tensor,
        blocked: torch.Tensor,
        *,
        kind: str = "hnsw",
        metric: str = "l2",
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
        nlist: int = 1024,
        nprobe: int = 32,
        threads: int | None = None,
        cache_dir: str | Path | None = None,
        cache_keep: int | None = 3,
    ) -> None:
        check_faiss_settings(
            {
                "kind": kind,
                "metric": metric,
                "hnsw_m": hnsw_m,
                "ef_construction": ef_construction,
                "ef_search": ef_search,
                "nlist": nlist,
                "nprobe": nprobe,
                "cache_keep": cache_keep,
            }
        )
        import faiss

        self.faiss = faiss
        if threads:  # faiss' OpenMP setting is process-wide
            faiss.omp_set_num_threads(int(threads))
        self.num_items = keys.shape[0]
        self.ids = torch.nonzero(~blocked.cpu()).squeeze(1)  # faiss row -> item index
        vectors = torch.cat([keys.detach().cpu(), bias.detach().cpu()[:, None]], dim=1)
        vectors = np.ascontiguousarray(vectors[self.ids].numpy(), dtype=np.float32)
        if kind == "flat":
            metric = "inner_product"  # exact either way; the reference keeps the plain form
        build = {"kind": kind, "metric": metric}
        if kind == "hnsw":
            build["hnsw_m"], build["ef_construction"] = int(hnsw_m), int(ef_construction)
        elif kind == "ivf":
            build["nlist"] = min(int(nlist), max(1, len(vectors) // 39))
        cache = None
        if cache_dir is not None:
            key = _content_key(vectors, self.ids, build)
            cache = Path(cache_dir) / f"{_CACHE_PREFIX}{key}.index"
        self.metric = metric
        self.keys, self.bias = keys.detach().cpu().float(), bias.detach().cpu().float()
        indexed = _equal_norms(vectors) if metric == "l2" else vectors
        del vectors  # (faiss copies what it indexes: one table less at the peak)
        index = _read_cached(faiss, cache, indexed.shape)
        if index is None:
            index = _build_faiss(faiss, indexed, **build)
            if cache is not None:
                _write_cached(faiss, index, cache)
        del indexed
        if cache is not None and cache_keep is not None:
            _prune_cache(cache, cache_keep)
        if kind == "hnsw":
            index.hnsw.efSearch = ef_search
        elif kind == "ivf":
            index.nprobe = min(nprobe, build["nlist"])
        self.index = index
        self.cache_file = cache

    def search(
        self, query: torch.Tensor, depth: int, exclude: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = query.device
        extra = 0 if exclude is None else exclude.shape[1]
        k = min(depth + extra, len(self.ids))
        augmented = torch.cat(
            [query.detach().float().cpu(), query.new_ones(len(query), 1).cpu()], 1
        )
        if self.metric == "l2":  # the queries' equal-norm coordinate is 0
            augmented = torch.cat([augmented, augmented.new_zeros(len(augmented), 1)], 1)
        _, rows = self.index.search(np.ascontiguousarray(augmented.numpy()), k)
        rows = torch.from_numpy(rows)
        found = rows >= 0
        items = torch.where(found, self.ids[rows.clamp(min=0)], 0)
        # exact scores of the items found (the L2 distances only rank them)
        scores = torch.einsum("bkd,bd->bk", self.keys[items], query.detach().float().cpu())
        scores = (scores + self.bias[items]).masked_fill(~found, -math.inf)
        if exclude is not None:
            seen = (items[:, :, None] == exclude.cpu()[:, None, :]).any(dim=2)  # (B, k)
            scores = scores.masked_fill(seen, -math.inf)
        order = scores.argsort(dim=1, descending=True, stable=True)[:, :depth]
        scores, items = scores.gather(1, order), items.gather(1, order)
        if scores.shape[1] < depth:
            pad = depth - scores.shape[1]
            scores = torch.cat([scores, scores.new_full((len(scores), pad), -math.inf)], 1)
            items = torch.cat([items, items.new_zeros(len(items), pad)], 1)
        items = items.masked_fill(torch.isneginf(scores), 0)
        return scores.to(device), items.to(device)


FAISS_KINDS = ("hnsw", "ivf", "flat")
FAISS_METRICS = ("l2", "inner_product")
FAISS_SETTINGS = (
    "kind",
    "metric",
    "hnsw_m",
    "ef_construction",
    "ef_search",
    "nlist",
    "nprobe",
    "threads",
    "cache_dir",
    "cache_keep",
)


def check_faiss_settings(settings: dict | None) -> None:
    """``retrieval.faiss`` (with ``retrieval.index=faiss``) checked without a model, as
    :class:`FaissIndex` would check it, so the main job refuses a mistake before it trains:
    unknown keys, a kind or metric outside the choices, sizes that are not positive integers,
    and faiss not installed."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(FAISS_SETTINGS))
    if unknown:
        raise ValueError(
            f"retrieval.faiss has unknown keys {unknown}; allowed: {list(FAISS_SETTINGS)}"
        )
    kind, metric = settings.get("kind", "hnsw"), settings.get("metric", "l2")
    if kind not in FAISS_KINDS:
        raise ValueError(f"retrieval.faiss.kind={kind!r}: use one of {list(FAISS_KINDS)}")
    if metric not in FAISS_METRICS:
        raise ValueError(f"retrieval.faiss.metric={metric!r}: use one of {list(FAISS_METRICS)}")
    for name in ("hnsw_m", "ef_construction", "ef_search", "nlist", "nprobe"):
        if name in settings:
            _check_positive(f"faiss.{name}", settings[name])
    if settings.get("cache_keep") is not None:
        _check_positive("faiss.cache_keep", settings["cache_keep"])
    try:
        import faiss  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "retrieval.index=faiss needs faiss: pip install 'recsys[ann]' (faiss-cpu), "
            "or use retrieval.index=exact"
        ) from err


def changed_faiss_settings(settings: dict | None) -> dict:
    """The ``retrieval.faiss`` settings that differ from :class:`FaissIndex`'s defaults (which
    ``conf/retrieval/default.yaml`` repeats): what a user set, which only
    ``retrieval.index=faiss`` reads."""
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(FaissIndex.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    return {
        name: value
        for name, value in (settings or {}).items()
        if name not in defaults or value != defaults[name]
    }


_CACHE_PREFIX = "faiss-"


def _equal_norms(vectors: np.ndarray) -> np.ndarray:
    """``[v, sqrt(M² - |v|²)]`` with M the largest norm: every row then has norm M, so for a
    query ``[q, 0]`` the L2 distance ``|q|² + M² - 2 q·v`` orders items as ``q·v`` does,
    largest first (the MIPS-to-nearest-neighbour reduction, Bachrach et al. 2014)."""
    squared = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64)
    out = np.empty((len(vectors), vectors.shape[1] + 1), dtype=np.float32)
    out[:, :-1] = vectors
    out[:, -1] = np.sqrt(np.maximum(squared.max(initial=0.0) - squared, 0.0))
    return out


def _build_faiss(faiss, vectors: np.ndarray, *, kind: str, metric: str, **build):
    """``flat``: exact inner product; ``hnsw`` / ``ivf``: L2 (over :func:`_equal_norms` rows)
    or inner product, as ``metric`` says."""
    dim = vectors.shape[1]
    l2 = metric == "l2"
    faiss_metric = faiss.METRIC_L2 if l2 else faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, build["hnsw_m"], faiss_metric)
        index.hnsw.efConstruction = build["ef_construction"]
    else:
        quantizer = faiss.IndexFlatL2(dim) if l2 else faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, build["nlist"], faiss_metric)
        index.train(vectors)
    index.add(vectors)
    log.info("faiss %s index (%s) built over %d items (dim %d)", kind, metric, len(vectors), dim)
    return index


def _content_key(vectors: np.ndarray, ids: torch.Tensor, build: dict) -> str:
    """What a built index depends on: its vectors, which item each row is, how it was built."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(sorted(build.items())).encode())
    digest.update(np.ascontiguousarray(ids.numpy(), dtype=np.int64).tobytes())
    digest.update(vectors.tobytes())
    return digest.hexdigest()


def _read_cached(faiss, path: Path | None, shape: tuple[int, int]):
    """The index saved at ``path``, or None (none there, or unreadable: built again)."""
    if path is None or not path.is_file():
        return None
    try:
        index = faiss.read_index(str(path))
        if (index.ntotal, index.d) != shape:
            raise RuntimeError(f"it holds {index.ntotal} x {index.d} vectors, not {shape}")
    except RuntimeError as err:  # faiss raises RuntimeError on a truncated or foreign file
        log.warning("faiss index cache %s could not be read (%s): building it again", path, err)
        return None
    log.info("faiss index loaded from the cache %s", path)
    with contextlib.suppress(OSError):  # mark it used: pruning deletes the least recently used
        os.utime(path)
    return index


def _write_cached(faiss, index, path: Path) -> None:
    """Write ``index`` to ``path`` through a temporary file, so that a killed job never leaves
    a partial index for the next one to load."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: faiss.write_index(index, str(tmp)))
    except (OSError, RuntimeError) as err:  # the job goes on with the index in memory
        log.warning(
            "faiss index not saved to the cache %s (%s): scoring goes on; point "
            "retrieval.faiss.cache_dir at a writable folder with room for the index",
            path,
            err,
        )
        return
    log.info("faiss index saved to the cache %s", path)


def _prune_cache(current: Path, keep: int) -> None:
    """Delete the index files of ``current``'s folder beyond the ``keep`` most recently used
    (``current``, just used, is always kept). Files another job removed meanwhile are skipped."""

    def last_used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return -math.inf

    others = [p for p in current.parent.glob(f"{_CACHE_PREFIX}*.index") if p != current]
    stale = sorted(others, key=last_used, reverse=True)[keep - 1 :]
    for path in stale:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:  # e.g. a read-only folder: the job goes on
            log.warning("faiss index cache %s could not be deleted (%s)", path, err)
            continue
        log.info("faiss index cache %s deleted (retrieval.faiss.cache_keep=%d)", path, keep)


def build_index(
    keys: torch.Tensor,
    bias: torch.Tensor,
    blocked: torch.Tensor,
    *,
    index: str = "exact",
    item_chunk_size: int = 65_536,
    faiss: dict | None = None,
) -> ExactIndex | FaissIndex:
    """``retrieval.index``: ``exact`` (default) or ``faiss`` (settings in ``retrieval.faiss``)."""
    if index == "exact":
        return ExactIndex(keys, bias, blocked, item_chunk_size=item_chunk_size)
    if index == "faiss":
        return FaissIndex(keys, bias, blocked, **(faiss or {}))
    raise ValueError(f"retrieval.index={index!r}: use one of {list(INDEXES)}")
