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

from recsys.schema import ATTRIBUTES, CANONICAL_COLUMNS, CATEGORY, ITEM, EventSchema

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


def _warn_on_mixed_types(folder: Path, files: list[Path], frames: list[pl.LazyFrame]) -> None:
    """Files of one folder may type a column differently (a CSV whose ids are all digits next
    to one with letters): they are read as their common supertype, and the user is told."""
    seen: dict[str, dict[str, str]] = {}
    for file, frame in zip(files, frames):
        try:
            schema = frame.collect_schema()
        except pl.exceptions.PolarsError:
            continue  # reported with a clear message when the log is read
        for column, dtype in schema.items():
            seen.setdefault(column, {}).setdefault(str(dtype), file.name)
    for column, types in seen.items():
        if len(types) > 1:
            log.warning(
                "%s: column %r has different types across files %s; reading it as their "
                "common type (ids become text when any file has text ids)",
                folder,
                column,
                types,
            )


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
        frames = [_scan_file(p) for p in files]
        _warn_on_mixed_types(path, files, frames)
        return pl.concat(frames, how="vertical_relaxed")
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


def _as_lazy(source: EventSource, name: str) -> pl.LazyFrame:
    if isinstance(source, (str, os.PathLike)):
        return _scan_file(Path(source))
    if isinstance(source, pl.LazyFrame):
        return source
    if isinstance(source, pl.DataFrame):
        return source.lazy()
    if isinstance(source, pd.DataFrame):
        try:
            return pl.from_pandas(source).lazy()
        except (pl.exceptions.PolarsError, TypeError, ValueError) as err:
            mixed = [
                str(c)
                for c in source.columns
                if source[c].dtype == object and source[c].dropna().map(type).nunique() > 1
            ]
            hint = (
                f"column(s) {mixed} mix value types (e.g. numbers and strings): cast each to one "
                "type, e.g. df[col] = df[col].astype(str)"
                if mixed
                else "check the column types"
            )
            raise DataError(f"{name} could not be converted to polars: {hint} ({err})") from err
    raise DataError(
        f"cannot read events from {type(source).__name__}: pass a CSV/Parquet path "
        "or a pandas/polars DataFrame"
    )


def _available_columns(lf: pl.LazyFrame, name: str) -> list[str]:
    try:
        return lf.collect_schema().names()
    except pl.exceptions.NoDataError as err:
        raise DataError(f"{name} is empty: it has no header and no rows") from err
    except pl.exceptions.PolarsError as err:
        raise DataError(
            f"{name} could not be read: {err}. If it is a folder, its files must share the "
            "same columns and compatible types"
        ) from err


def select_mapped(
    lf: pl.LazyFrame, columns: dict[str, str | None], *, name: str, option: str
) -> pl.LazyFrame:
    """Rename the mapped columns (``canonical -> source column``) to their canonical names.

    Raises :class:`DataError` naming the missing columns, the available ones and the override
    (``<option>.<canonical>=<your column>``) that fixes the mapping.
    """
    available = _available_columns(lf, name)
    mapped = {canonical: column for canonical, column in columns.items() if column}
    missing = {c: column for c, column in mapped.items() if column not in available}
    if missing:
        hints = ", ".join(f"{option}.{c}=<your column>" for c in missing)
        raise DataError(
            f"{name} lacks column(s) {sorted(missing.values())} "
            f"(mapped as {missing}); its columns are {available}. "
            f"Fix the column mapping: {hints} (or null for an optional column)"
        )
    # keyed by canonical name: one source column may feed two canonical ones
    return lf.select([pl.col(column).alias(canonical) for canonical, column in mapped.items()])


def scan_events(source: EventSource, schema: EventSchema) -> pl.LazyFrame:
    """Open an event log lazily and rename its mapped columns to the canonical names.

    ``source`` is a path (CSV, Parquet, or a folder of either), or a pandas / polars frame.
    Raises :class:`DataError` when a file is missing, empty, of an unsupported type, or lacks a
    mapped column; the message names the file and column and how to fix the mapping.
    """
    name = describe_source(source)
    lf = _as_lazy(source, name)
    lf = select_mapped(lf, schema.columns, name=name, option="data.columns")
    return lf.select([c for c in CANONICAL_COLUMNS if schema.has(c)])


def scan_items(source: EventSource, columns: dict[str, str | None]) -> pl.LazyFrame:
    """Open an item side table lazily: ``item_id`` plus ``category`` and/or ``attributes``."""
    name = describe_source(source)
    if not columns.get(ITEM):
        raise DataError("data.item_columns.item_id is not set: name the item id column")
    if not (columns.get(CATEGORY) or columns.get(ATTRIBUTES)):
        raise DataError(
            f"{name}: data.item_columns maps neither category nor attributes, so the item "
            "table adds nothing: map one of them or set data.items=null"
        )
    lf = _as_lazy(source, name)
    return select_mapped(lf, columns, name=name, option="data.item_columns")
