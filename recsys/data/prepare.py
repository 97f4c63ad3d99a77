"""Event log -> prepared dataset folder: the data layer end to end.

    scan_events -> normalize -> check_events -> dedupe -> min user events -> sort -> split
    -> vocab.fit(train window) -> encode -> per-user sequences -> folder (written atomically)

The folder holds ``sequences.parquet`` (see :mod:`recsys.data.sequences`), the vocabularies
(:mod:`recsys.data.vocab`) and ``stats.json``. It is written to a temporary sibling folder and
renamed into place, so a failed run never leaves a half-written dataset behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from recsys.data import transforms
from recsys.data.io import EventSource, describe_source, scan_events
from recsys.data.sequences import ITEMS, TimeBuckets, build_sequences
from recsys.data.split import (
    TEST_TARGET,
    TRAIN_END,
    VAL_TARGET,
    SplitPoints,
    SplitSettings,
    split_positions,
    temporal_cuts,
)
from recsys.data.validate import check_events, normalize
from recsys.data.vocab import Vocab
from recsys.schema import EVENT_TYPE, TIMESTAMP, UNK_IDX, USER, EventSchema

log = logging.getLogger(__name__)

SEQUENCES_FILE = "sequences.parquet"
STATS_FILE = "stats.json"


@dataclass(frozen=True)
class PrepareSettings:
    split: SplitSettings = field(default_factory=SplitSettings)
    time_buckets: TimeBuckets = field(default_factory=TimeBuckets)
    min_user_events: int = 2
    min_item_count: int = 1

    def __post_init__(self) -> None:
        if self.min_user_events < 1:
            raise ValueError(f"data.min_user_events={self.min_user_events} must be >= 1")
        if self.min_item_count < 1:
            raise ValueError(f"data.min_item_count={self.min_item_count} must be >= 1")


def load_events(source: EventSource, schema: EventSchema) -> pl.DataFrame:
    """Read, type and check an event log; raise :class:`~recsys.data.io.DataError` on bad rows."""
    name = describe_source(source)
    df = scan_events(source, schema).pipe(normalize, schema=schema).collect()
    return check_events(df, schema=schema, source_name=name)


def fingerprint(events: pl.DataFrame, settings: PrepareSettings, schema: EventSchema) -> str:
    """sha256 of the checked events (content and order) and every setting that shapes the data."""
    digest = hashlib.sha256()
    digest.update(events.hash_rows(seed=0).to_numpy().tobytes())
    digest.update(json.dumps([asdict(settings), schema.to_dict()], sort_keys=True).encode())
    return digest.hexdigest()


def _drop_unknown_targets(sequences: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """A target whose item is not in the (train-fitted) vocabulary cannot be ranked: it is set
    aside (position -1) and counted, never silently."""
    counts: dict[str, int] = {}
    updates = []
    for column in (VAL_TARGET, TEST_TARGET):
        target_item = pl.col(ITEMS).list.get(pl.col(column).clip(lower_bound=0))
        unknown = (pl.col(column) >= 0) & (target_item == UNK_IDX)
        counts[f"{column}s_unknown_item"] = int(sequences.select(unknown.sum()).item())
        updates.append(pl.when(unknown).then(-1).otherwise(pl.col(column)).alias(column))
    return sequences.with_columns(updates), counts


def prepare_dataset(
    source: EventSource,
    *,
    schema: EventSchema,
    settings: PrepareSettings,
    out_dir: str | Path,
) -> dict:
    """Prepare ``source`` into ``out_dir`` (replaced if it exists) and return its statistics."""
    out_dir = Path(out_dir)
    events = load_events(source, schema)
    raw_rows = events.height
    fp = fingerprint(events, settings, schema)

    deduped = events.lazy().pipe(transforms.dedupe).collect()
    clean = (
        deduped.lazy()
        .pipe(transforms.filter_min_user_events, min_events=settings.min_user_events)
        .pipe(transforms.sort_events)
        .pipe(transforms.add_position)
        .collect()
    )
    lf = clean.lazy()
    points = (
        temporal_cuts(lf, settings.split)
        if settings.split.method == "temporal"
        else SplitPoints(None, None)
    )
    positions = split_positions(lf, settings.split, points).collect()
    train = lf.join(positions.lazy(), on=USER).filter(
        pl.col(transforms.POSITION) < pl.col(TRAIN_END)
    )
    vocab = Vocab.fit(train, behaviors=schema.behaviors, min_item_count=settings.min_item_count)
    if vocab.items.height == 0:
        raise ValueError(
            "the training window holds no items: lower data.split.val_fraction/test_fraction "
            "or data.min_item_count"
        )
    encoded = vocab.encode(lf, behavior_column=EVENT_TYPE)
    sequences = build_sequences(encoded, positions.lazy()).collect()
    sequences, unknown_targets = _drop_unknown_targets(sequences)

    train_events = int(positions[TRAIN_END].sum())
    stats = {
        "source": describe_source(source),
        "fingerprint": fp,
        "rows_read": raw_rows,
        "duplicates_removed": raw_rows - deduped.height,
        "users_below_min_events": deduped[USER].n_unique() - clean[USER].n_unique(),
        "events_of_users_below_min_events": deduped.height - clean.height,
        "events": clean.height,
        "users": sequences.height,
        "train_events": train_events,
        "train_users": int((positions[TRAIN_END] >= 2).sum()),
        "val_targets": int((sequences[VAL_TARGET] >= 0).sum()),
        "test_targets": int((sequences[TEST_TARGET] >= 0).sum()),
        **unknown_targets,
        "num_items": vocab.num_items,
        "num_categories": vocab.num_categories,
        "num_behaviors": vocab.num_behaviors,
        "vocab_hash": vocab.content_hash(),
        "split": {
            **asdict(settings.split),
            "val_start": None if points.val_start is None else points.val_start.isoformat(),
            "test_start": None if points.test_start is None else points.test_start.isoformat(),
        },
        "time_buckets": asdict(settings.time_buckets),
        "min_user_events": settings.min_user_events,
        "min_item_count": settings.min_item_count,
        "schema": schema.to_dict(),
        "first_event": clean["timestamp"].min().isoformat(),
        "last_event": clean["timestamp"].max().isoformat(),
    }
    if stats["val_targets"] == 0 or stats["test_targets"] == 0:
        raise ValueError(
            f"{stats['source']}: the split leaves {stats['val_targets']} validation and "
            f"{stats['test_targets']} test targets; the log is too small or the windows too "
            "narrow — widen data.split.val_fraction/test_fraction or use data.split.method="
            "leave_one_out"
        )
    _write_atomically(out_dir, sequences, vocab, stats)
    log.info(
        "prepared %s: %d users, %d events (%d train), %d items, val/test targets %d/%d -> %s",
        stats["source"],
        stats["users"],
        stats["events"],
        train_events,
        vocab.num_items,
        stats["val_targets"],
        stats["test_targets"],
        out_dir,
    )
    return stats


def _write_atomically(out_dir: Path, sequences: pl.DataFrame, vocab: Vocab, stats: dict) -> None:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        sequences.write_parquet(tmp / SEQUENCES_FILE)
        vocab.save(tmp)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2, default=str))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_stats(folder: str | Path) -> dict:
    path = Path(folder) / STATS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the prepare step first")
    return json.loads(path.read_text())


def scoring_sequences(
    events: pl.DataFrame, *, vocab: Vocab, as_of: datetime | None = None
) -> pl.DataFrame:
    """Each user's whole history up to and including ``as_of`` (default: everything), encoded
    with a *saved* vocabulary (never refitted: unseen items become UNK), as a sequence table
    without targets."""
    lf = events.lazy()
    if as_of is not None:
        if as_of.tzinfo is None:  # naive = UTC, as everywhere in recsys
            as_of = as_of.replace(tzinfo=UTC)
        lf = lf.filter(pl.col(TIMESTAMP) <= as_of)
    lf = lf.pipe(transforms.dedupe).pipe(transforms.sort_events)
    encoded = vocab.encode(lf, behavior_column=EVENT_TYPE)
    positions = lf.group_by(USER, maintain_order=True).agg(
        pl.len().cast(pl.Int32).alias(TRAIN_END),
        pl.lit(-1, dtype=pl.Int32).alias(VAL_TARGET),
        pl.lit(-1, dtype=pl.Int32).alias(TEST_TARGET),
    )
    sequences = build_sequences(encoded, positions).collect()
    if sequences.height == 0:
        raise ValueError(f"no events at or before as_of={as_of}: nothing to score")
    return sequences
