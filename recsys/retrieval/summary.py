"""What a scoring job recommended, in numbers and plots (the scoring run's summary artifact).

- ``catalogue_coverage``: distinct recommended items / items that could be recommended;
- ``source_share``: share of rows per source (every source, 0 where it gave none), and
  ``fallback_share`` (rows not from the model; 0 when no row was written);
- ``popularity``: how the recommendations spread over the catalogue's popularity: the share of
  rows whose item is in the top 1 % / 10 % / 50 % of items by training count (new items count
  as least popular), and the Gini coefficient of recommendation counts over the catalogue
  (0 = every item recommended equally often, 1 = one item for everybody).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from recsys.retrieval.catalogue import CATALOGUE_INDEX, Catalogue
from recsys.retrieval.recommend import SOURCES
from recsys.schema import ITEM, NUM_RESERVED, USER

POPULARITY_TIERS = (0.01, 0.10, 0.50)


def _gini(counts: np.ndarray) -> float:
    if counts.sum() == 0:
        return 0.0
    values = np.sort(counts.astype(np.float64))
    n = len(values)
    cumulative = np.cumsum(values)
    return float((n + 1 - 2 * (cumulative / cumulative[-1]).sum()) / n)


def summarize(
    recommendations: pl.LazyFrame,
    catalogue: Catalogue,
    *,
    train_counts: list[int],
    recommendable: int,
) -> dict:
    """``train_counts``: per model item index (PAD/UNK included); ``recommendable``: items the
    rules allow."""
    recs = recommendations.select(USER, ITEM, "source").collect(engine="in-memory")
    per_item = (
        recs.group_by(ITEM)
        .len()
        .join(catalogue.items.select(ITEM, CATALOGUE_INDEX), on=ITEM, how="left")
    )
    counts = np.zeros(catalogue.size, dtype=np.int64)
    counts[per_item[CATALOGUE_INDEX].to_numpy()] = per_item["len"].to_numpy()
    popularity = np.zeros(catalogue.size, dtype=np.int64)
    popularity[: len(train_counts)] = train_counts
    real = np.arange(catalogue.size) >= NUM_RESERVED
    order = np.argsort(-popularity[real], kind="stable")  # most popular first
    tier_of = np.empty(real.sum(), dtype=np.float64)
    tier_of[order] = (np.arange(len(order)) + 1) / max(len(order), 1)  # popularity quantile
    rows = max(len(recs), 1)
    # every source, in SOURCES order, 0.0 where it gave no row: the same keys in every job's
    # summary (a consumer reading source_share["popularity"] never meets a missing key)
    counts_by_source = dict(recs["source"].cast(pl.String).value_counts().iter_rows())
    source_share = {name: counts_by_source.get(name, 0) / rows for name in SOURCES}
    return {
        "users": recs[USER].n_unique(),
        "rows": len(recs),
        "catalogue_coverage": float((counts > 0).sum() / max(recommendable, 1)),
        "distinct_items": int((counts > 0).sum()),
        "source_share": source_share,
        "fallback_share": sum(share for name, share in source_share.items() if name != "model"),
        "popularity": {
            **{
                f"top_{round(t * 100)}pct_share": float(counts[real][tier_of <= t].sum() / rows)
                for t in POPULARITY_TIERS
            },
            "gini": _gini(counts[real]),
            "deciles": [
                float(counts[real][(tier_of > d / 10) & (tier_of <= (d + 1) / 10)].sum() / rows)
                for d in range(10)
            ],
        },
        "_counts": counts[real],
    }


def plot(summary: dict, folder: Path) -> list[Path]:
    """Three PNGs: source shares, recommendations per popularity decile, Lorenz curve."""
    # Figure objects, not pyplot: no backend switch, so a notebook's inline plots keep working
    from matplotlib.figure import Figure

    folder.mkdir(parents=True, exist_ok=True)
    paths = []

    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    shares = summary["source_share"]
    ax.bar(list(shares), list(shares.values()), color="#4c72b0")
    ax.set_ylabel("share of rows")
    ax.set_title("Where the recommendations come from")
    paths.append(_save(fig, folder / "sources.png"))

    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    deciles = summary["popularity"]["deciles"]
    ax.bar([f"{10 * d}-{10 * d + 10}%" for d in range(10)], deciles, color="#dd8452")
    ax.axhline(0.1, color="grey", linestyle="--", label="uniform")
    ax.set_xlabel("item popularity decile (most popular first)")
    ax.set_ylabel("share of rows")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend()
    ax.set_title("Popularity of the recommended items")
    paths.append(_save(fig, folder / "popularity.png"))

    fig = Figure(figsize=(4, 4))
    ax = fig.subplots()
    counts = np.sort(summary["_counts"])
    total = max(counts.sum(), 1)
    x = np.linspace(0, 1, len(counts) + 1)
    ax.plot(x, np.concatenate([[0], np.cumsum(counts) / total]), label="recommendations")
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="equal")
    ax.set_xlabel("share of catalogue (least recommended first)")
    ax.set_ylabel("share of rows")
    ax.set_title(
        f"Coverage {summary['catalogue_coverage']:.1%}, Gini {summary['popularity']['gini']:.2f}"
    )
    ax.legend()
    paths.append(_save(fig, folder / "coverage.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
