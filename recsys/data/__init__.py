"""recsys' data layer. For notebooks and scripts, two names cover the usual work::

    import recsys.data as rd

    ds = rd.prepare(events_df, "prepared/", columns={"user_id": "visitorid"},
                    split={"method": "leave_one_out"})
    ds.stats["events"]                  # counts, bad rows, fingerprint, split cut times
    ds.sequences()                      # polars, one row per user (``backend="pandas"``)
    ds.events(window="test")            # long format, one row per event
    ds = rd.PreparedDataset.load("prepared/")

``events_df`` may be a pandas or polars frame (or LazyFrame), or a CSV / Parquet path or
folder. The keyword options are the keys of ``conf/data/base.yaml``, so a notebook and a Hydra
override say the same thing (``split={"method": "leave_one_out"}`` is
``data.split.method=leave_one_out``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import polars as pl

from recsys.data import options as _options
from recsys.data.io import DataError, EventSource, to_pandas, whole_number_ids
from recsys.data.pipeline import (
    QUARANTINE_FILE,
    SEQUENCES_FILE,
    load_stats,
    prepare_dataset,
)
from recsys.data.sequences import BEHAVIORS, ITEMS, TIMES
from recsys.data.split import TEST_START, TEST_TARGET, TRAIN_END, VAL_TARGET
from recsys.data.vocab import INDEX, Vocab
from recsys.schema import EVENT_TYPE, ITEM, NUM_RESERVED, TIMESTAMP, USER

__all__ = ["DataError", "PreparedDataset", "prepare"]

Backend = Literal["polars", "pandas"]
WINDOWS = ("train", "val", "test")


def _out(frame: pl.DataFrame, backend: Backend) -> pl.DataFrame | pd.DataFrame:
    if backend == "polars":
        return frame
    if backend == "pandas":
        return to_pandas(frame)  # integer ids with nulls as nullable integers, not float
    raise ValueError(f"backend={backend!r}: use 'polars' or 'pandas'")


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset folder: ``sequences.parquet``, vocabularies, ``quarantine.parquet``
    and ``stats.json`` (see :mod:`recsys.data.pipeline`)."""

    path: Path
    stats: dict
    vocab: Vocab

    @classmethod
    def load(cls, path: str | Path) -> PreparedDataset:
        path = Path(path).expanduser()
        return cls(path=path, stats=load_stats(path), vocab=Vocab.load(path))

    @property
    def timed(self) -> bool:
        """False for an order-only log (``data.columns.timestamp=null``), whose stored times
        are its events' positions, not moments."""
        columns = self.stats.get("schema", {}).get("columns")
        return columns is None or bool(columns.get(TIMESTAMP))

    def _file(self, name: str) -> Path:
        """A file of the folder, once it is known to hold what this handle describes: the
        vocabulary and statistics are held in memory, the frames read from the folder, so a
        folder prepared again since (a notebook cell re-run with another frame) would have its
        item indices decoded with the old vocabulary, every id wrong."""
        try:
            fingerprint = load_stats(self.path).get("fingerprint")
        except (OSError, ValueError) as err:
            raise DataError(f"{self.path} no longer holds a prepared dataset ({err})") from err
        if fingerprint != self.stats.get("fingerprint"):
            raise DataError(
                f"{self.path} was prepared again since this PreparedDataset was made (its data "
                f"fingerprint is now {fingerprint}, this handle's {self.stats.get('fingerprint')}"
                "): use the handle the later prepare() returned, or "
                "PreparedDataset.load(path)"
            )
        return self.path / name

    def sequences(self, *, backend: Backend = "polars") -> pl.DataFrame | pd.DataFrame:
        """One row per user: list columns of item / behaviour indices and Unix seconds, plus
        the split positions."""
        # user ids as the folder's vocabulary's item ids read back: whole-number float ids of a
        # folder prepared before that rule as Int64
        sequences = pl.read_parquet(self._file(SEQUENCES_FILE)).lazy()
        return _out(whole_number_ids(sequences, [USER]).collect(), backend)

    def quarantine(self, *, backend: Backend = "polars") -> pl.DataFrame | pd.DataFrame:
        """The rows set aside by the bad-row policy, with their input row and problem."""
        return _out(pl.read_parquet(self._file(QUARANTINE_FILE)), backend)

    def events(
        self, *, window: str | None = None, backend: Backend = "polars"
    ) -> pl.DataFrame | pd.DataFrame:
        """One row per prepared event: ``user_id, position, item_id, item_index, event_type,
        timestamp, window`` (train | val | test) and ``is_target``. ``item_id`` is null for
        items outside the training vocabulary (index 1, UNK); ``timestamp`` for every event of
        an order-only log. ``window`` filters."""
        if window is not None and window not in WINDOWS:
            raise ValueError(f"window={window!r}: use one of {list(WINDOWS)} or None")
        items = self.vocab.items.select(ITEM, pl.col(INDEX).alias("item_index"))
        behaviors = pl.DataFrame(
            {
                "behavior_index": range(NUM_RESERVED, self.vocab.num_behaviors),
                EVENT_TYPE: list(self.vocab.behaviors),
            },
            schema={"behavior_index": pl.Int8, EVENT_TYPE: pl.String},
        )
        position = pl.col("position")
        frame = (
            whole_number_ids(pl.scan_parquet(self._file(SEQUENCES_FILE)), [USER])
            .select(USER, ITEMS, BEHAVIORS, TIMES, TRAIN_END, VAL_TARGET, TEST_START, TEST_TARGET)
            .with_columns(pl.int_ranges(pl.col(ITEMS).list.len()).alias("position"))
            .explode(ITEMS, BEHAVIORS, TIMES, "position")
            .rename({ITEMS: "item_index", BEHAVIORS: "behavior_index"})
            .with_columns(
                pl.col("position").cast(pl.Int32),
                (
                    pl.from_epoch(TIMES, time_unit="s").dt.replace_time_zone("UTC")
                    if self.timed
                    else pl.lit(None, pl.Datetime("us", "UTC"))  # order-only: no time
                ).alias(TIMESTAMP),
                pl.when(position < pl.col(TRAIN_END))
                .then(pl.lit("train"))
                .when(position < pl.col(TEST_START))
                .then(pl.lit("val"))
                .otherwise(pl.lit("test"))
                .alias("window"),
                ((position == pl.col(VAL_TARGET)) | (position == pl.col(TEST_TARGET))).alias(
                    "is_target"
                ),
            )
            .join(items.lazy(), on="item_index", how="left", maintain_order="left")
            .join(behaviors.lazy(), on="behavior_index", how="left", maintain_order="left")
            .select(
                USER, "position", ITEM, "item_index", EVENT_TYPE, TIMESTAMP, "window", "is_target"
            )
        )
        if window is not None:
            frame = frame.filter(pl.col("window") == window)
        return _out(frame.collect(), backend)


def prepare(
    events: EventSource,
    out_dir: str | Path,
    *,
    items: EventSource | None = None,
    **options: Any,
) -> PreparedDataset:
    """Prepare an event log (pandas / polars frame, or CSV / Parquet path) into ``out_dir``.

    ``items`` is an optional item side table (``item_id`` + ``category`` or ``attributes``;
    map other names with ``item_columns={...}``). ``options`` are the keys of
    ``conf/data/base.yaml``; unmapped columns default to the canonical names ``user_id,
    item_id, timestamp, event_type``. Raises :class:`DataError` for bad input (nothing is
    written) and ``ValueError`` for unknown or impossible options.
    """
    _options.check_keys(
        options, allowed=_options.SCHEMA_KEYS | _options.SETTINGS_KEYS | _options.ITEM_KEYS
    )
    stats, vocab = prepare_dataset(
        events,
        schema=_options.event_schema(options),
        settings=_options.prepare_settings(options),
        out_dir=out_dir,
        items=items,
        item_columns=_options.item_columns(options),
    )
    return PreparedDataset(path=Path(out_dir).expanduser(), stats=stats, vocab=vocab)
