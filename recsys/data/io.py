"""Reading event logs: CSV / Parquet files or in-memory pandas / polars frames.

Everything comes out as a ``pl.LazyFrame`` whose columns carry recsys' canonical names
(:mod:`recsys.schema`); nothing is collected here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd
import polars as pl

from recsys.schema import CANONICAL_COLUMNS, EventSchema

log = logging.getLogger(__name__)

EventSource = str | os.PathLike | pl.DataFrame | pl.LazyFrame | pd.DataFrame
SUPPORTED_SUFFIXES = (".csv", ".parquet", ".pq")


class DataError(ValueError):
    """Bad input data: the message names the source, the column or rows, and the fix."""


def describe_source(source: EventSource) -> str:
    """A short human name for ``source`` used in error messages."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"<in-memory {type(source).__module__.split('.')[0]} frame>"


def _scan_file(path: Path) -> pl.LazyFrame:
    if not path.exists():
        raise DataError(f"event log {path} does not exist: check data.source.path")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUPPORTED_SUFFIXES)
        if not files:
            raise DataError(
                f"folder {path} holds no {'/'.join(SUPPORTED_SUFFIXES)} files: "
                "point data.source.path at an event log"
            )
        suffixes = {p.suffix.lower().replace(".pq", ".parquet") for p in files}
        if len(suffixes) > 1:
            raise DataError(f"folder {path} mixes file types {sorted(suffixes)}: keep one type")
        return pl.concat([_scan_file(p) for p in files], how="vertical_relaxed")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; recsys reads "
            f"{', '.join(SUPPORTED_SUFFIXES)} (convert the file or rename it if it is one of these)"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty (0 bytes): export the event log again")
    if suffix == ".csv":
        # Types are inferred from every row (not a prefix), so a column that mixes integers and
        # strings becomes a string column instead of failing half-way through a later read.
        return pl.scan_csv(path, infer_schema_length=None, try_parse_dates=False)
    try:
        return pl.scan_parquet(path)
    except Exception as err:  # polars raises several error types for corrupt files
        raise DataError(f"{path} is not a readable Parquet file: {err}") from err


def scan_events(source: EventSource, schema: EventSchema) -> pl.LazyFrame:
    """Open an event log lazily and rename its columns to the canonical names.

    ``source`` is a path (CSV, Parquet, or a folder of either), or a pandas / polars frame.
    Raises :class:`DataError` when a file is missing, empty, of an unsupported type, or lacks a
    mapped column; the message names the file and column and how to fix the mapping.
    """
    name = describe_source(source)
    if isinstance(source, (str, os.PathLike)):
        lf = _scan_file(Path(source))
    elif isinstance(source, pl.LazyFrame):
        lf = source
    elif isinstance(source, pl.DataFrame):
        lf = source.lazy()
    elif isinstance(source, pd.DataFrame):
        lf = pl.from_pandas(source).lazy()
    else:
        raise DataError(
            f"cannot read events from {type(source).__name__}: pass a CSV/Parquet path "
            "or a pandas/polars DataFrame"
        )

    try:
        available = lf.collect_schema().names()
    except pl.exceptions.NoDataError as err:
        raise DataError(f"{name} is empty: it has no header and no rows") from err
    except pl.exceptions.PolarsError as err:
        raise DataError(f"{name} could not be read: {err}") from err
    missing = {
        canonical: column
        for canonical, column in schema.columns.items()
        if column and column not in available
    }
    if missing:
        hints = ", ".join(f"data.columns.{c}=<your column>" for c in missing)
        raise DataError(
            f"{name} lacks column(s) {sorted(missing.values())} "
            f"(mapped as {missing}); its columns are {available}. "
            f"Fix the column mapping: {hints}"
        )
    # keyed by canonical name: one source column may feed two canonical ones
    renames = {canonical: column for canonical, column in schema.columns.items() if column}
    selected = [pl.col(column).alias(canonical) for canonical, column in renames.items()]
    lf = lf.select(selected)
    return lf.select([c for c in CANONICAL_COLUMNS if c in renames])
