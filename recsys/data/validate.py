"""Type normalisation and validation of a canonical event log.

``normalize`` turns whatever types the log came with into the canonical ones (timestamps as
``Datetime("us", "UTC")``, behaviour names mapped through the schema's aliases, category as
string). ``check_events`` collects once, counts every kind of bad row and raises one
:class:`~recsys.data.io.DataError` that lists them all with examples and the fix — nothing is
dropped silently.
"""

from __future__ import annotations

import logging

import polars as pl

from recsys.data.io import DataError
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, USER, EventSchema

log = logging.getLogger(__name__)

TIMESTAMP_DTYPE = pl.Datetime("us", "UTC")
_ISO_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f%z",
    "%Y-%m-%d %H:%M:%S%.f%z",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
)
_RAW_TIMESTAMP = "_raw_timestamp"
_RAW_EVENT_TYPE = "_raw_event_type"


def _timestamp_expr(dtype: pl.DataType, unit: str) -> pl.Expr:
    col = pl.col(_RAW_TIMESTAMP)
    if dtype == pl.String:
        # A trailing "Z" is UTC; chrono's %z wants an explicit offset.
        text = col.str.strip_chars().str.replace(r"[zZ]$", "+00:00")
        return pl.coalesce(
            [
                text.str.to_datetime(fmt, strict=False, time_unit="us", time_zone="UTC")
                for fmt in _ISO_FORMATS
            ]
        )
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            return col.cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
        return col.dt.convert_time_zone("UTC").cast(TIMESTAMP_DTYPE)
    if dtype == pl.Date:
        return col.cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    if dtype.is_numeric():
        scale = {"s": 1_000_000, "ms": 1_000}[unit]
        return (col.cast(pl.Float64) * scale).cast(pl.Int64).cast(pl.Datetime("us", "UTC"))
    raise DataError(
        f"column {TIMESTAMP!r} has type {dtype}; expected Unix seconds/milliseconds, "
        "ISO 8601 strings or datetimes"
    )


def normalize(lf: pl.LazyFrame, *, schema: EventSchema) -> pl.LazyFrame:
    """Cast a canonical-named log to canonical types (lazy; bad values become nulls here and
    are counted by :func:`check_events`).

    The raw timestamp and event type are kept in ``_raw_timestamp`` / ``_raw_event_type`` so
    that errors can quote the offending values.
    """
    types = lf.collect_schema()
    behavior_names = list(schema.behaviors)
    aliases = {**{b: b for b in behavior_names}, **schema.behavior_aliases}
    lf = lf.with_columns(
        pl.col(TIMESTAMP).alias(_RAW_TIMESTAMP),
        pl.col(EVENT_TYPE).cast(pl.String).alias(_RAW_EVENT_TYPE),
    )
    columns = [
        _timestamp_expr(types[TIMESTAMP], schema.timestamp_unit).alias(TIMESTAMP),
        pl.col(_RAW_EVENT_TYPE)
        .replace_strict(aliases, default=None, return_dtype=pl.String)
        .alias(EVENT_TYPE),
    ]
    if CATEGORY in types:
        columns.append(pl.col(CATEGORY).cast(pl.String))
    else:
        columns.append(pl.lit(None, dtype=pl.String).alias(CATEGORY))
    return lf.with_columns(columns)


def _examples(df: pl.DataFrame, mask: pl.Series, column: str, n: int = 3) -> str:
    rows = df.with_row_index("_row").filter(mask).head(n)
    return ", ".join(f"row {r}: {v!r}" for r, v in zip(rows["_row"], rows[column]))


def check_events(df: pl.DataFrame, *, schema: EventSchema, source_name: str) -> pl.DataFrame:
    """Raise one :class:`DataError` listing every kind of bad row in ``df``; return it cleaned
    of the helper columns when it is good.

    Checked: an empty log, null user/item ids, unparseable timestamps, unknown event types.
    """
    if df.height == 0:
        raise DataError(f"{source_name} has no rows: export a non-empty event log")
    problems: list[str] = []
    for column in (USER, ITEM):
        nulls = df[column].is_null()
        if nulls.any():
            problems.append(
                f"{int(nulls.sum())} row(s) with a null {column!r} "
                f"(column {schema.columns[column]!r}; e.g. rows "
                f"{df.with_row_index('_r').filter(nulls)['_r'].head(3).to_list()})"
            )
    bad_ts = df[TIMESTAMP].is_null()
    if bad_ts.any():
        problems.append(
            f"{int(bad_ts.sum())} row(s) whose {schema.columns[TIMESTAMP]!r} could not be parsed "
            f"as a timestamp ({_examples(df, bad_ts, _RAW_TIMESTAMP)}); use Unix seconds "
            f"(data.timestamp_unit=s), milliseconds (data.timestamp_unit=ms) or ISO 8601"
        )
    bad_type = df[EVENT_TYPE].is_null()
    if bad_type.any():
        unknown = df.filter(bad_type)[_RAW_EVENT_TYPE].unique().head(10).to_list()
        problems.append(
            f"{int(bad_type.sum())} row(s) with an event type outside {list(schema.behaviors)}: "
            f"{unknown}; add them to data.behaviors or map them with data.behavior_aliases"
        )
    if problems:
        raise DataError(
            f"{source_name}: bad rows, nothing was written:\n  - " + "\n  - ".join(problems)
        )
    return df.drop(_RAW_TIMESTAMP, _RAW_EVENT_TYPE)
