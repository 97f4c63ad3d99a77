"""Type normalisation and bad-row classification of a canonical event log.

``normalize`` turns whatever types the log came with into the canonical ones (timestamps as
``Datetime("us", "UTC")``, behaviour names mapped through the schema's aliases, ids as they
are, item side information as a ``list[str]`` of attributes). ``classify`` labels every row
with the first problem it has (``_problem``, null when the row is good). Nothing is dropped
here: :func:`problem_summary` + :func:`enforce` apply the per-kind policy of
:class:`BadRowPolicy` — ``error`` stops the run with one message that lists every offending
kind with counts and examples, ``drop`` sets the rows aside into the quarantine file, counted
in ``stats.json`` and summarised in the log.

Problem kinds, in the order a row is labelled (a row with several problems gets the first):

=====================  ===========================================================
``null_id``            null (or empty text) user or item id
``bad_timestamp``      a timestamp that is null or cannot be parsed
``unknown_behavior``   an event type outside ``behaviors`` / ``behavior_aliases``
``negative_timestamp`` before 1970-01-01 (a unit or sign error upstream)
``future_timestamp``   after ``as_of`` (default: the moment preparation starts)
``duplicate``          same user, item, event type and timestamp as an earlier row
                       (labelled later, per user, by :mod:`recsys.data.transforms`)
=====================  ===========================================================

Order-only logs (no timestamp column) get ``timestamp = 1970-01-01 + input row number`` in
microseconds: every user's events keep their input order and all time gaps fall in the first
bucket.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from functools import partial

import polars as pl

from recsys.data.io import DataError
from recsys.schema import (
    ATTRIBUTES,
    CATEGORY,
    EVENT_TYPE,
    ITEM,
    SESSION,
    TIMESTAMP,
    USER,
    EventSchema,
)

log = logging.getLogger(__name__)

TIMESTAMP_DTYPE = pl.Datetime("us", "UTC")
# polars 2 collects with its streaming engine by default; a partition, a vocabulary's tables or a
# scoring log are in memory already, and the in-memory engine sorts and groups them 2-4x faster
LOCAL = "in-memory"
ROW = "_row"  # 0-based row number in the input (files of a folder in name order)
PROBLEM = "_problem"
RAW_TIMESTAMP = "_raw_timestamp"
RAW_EVENT_TYPE = "_raw_event_type"
ATTRIBUTE_SEPARATOR = "\x1f"  # joins an attribute set into one key (a control char, never in ids)
SEPARATOR_ROWS = "_separator_rows"  # rows whose side information holds it (refused)
SEPARATOR_EXAMPLE = "_separator"  # and one such value
PROBLEM_KINDS = (
    "null_id",
    "bad_timestamp",
    "unknown_behavior",
    "negative_timestamp",
    "future_timestamp",
    "duplicate",
)
POLICIES = ("error", "drop")
_DESCRIPTIONS = {
    "null_id": "with a null or empty user or item id (columns {user_id!r} / {item_id!r})",
    "bad_timestamp": "whose timestamp (column {timestamp!r}) could not be parsed",
    "unknown_behavior": "with an event type (column {event_type!r}) outside {behaviors}",
    "negative_timestamp": "with a timestamp before 1970-01-01 (column {timestamp!r})",
    "future_timestamp": "with a timestamp after as_of={as_of} (column {timestamp!r})",
    "duplicate": "repeating an earlier identical event (same user, item, event type, timestamp)",
}
_FIXES = {
    "null_id": "fill the ids upstream (or delete blank lines), or data.bad_rows.null_id=drop",
    "bad_timestamp": "use Unix seconds (data.timestamp_unit=s), milliseconds "
    "(data.timestamp_unit=ms) or ISO 8601, or data.bad_rows.bad_timestamp=drop",
    "unknown_behavior": "add them to data.behaviors or map them with "
    "+data.behavior_aliases.<name>=<behavior>, or data.bad_rows.unknown_behavior=drop",
    "negative_timestamp": "check the unit (data.timestamp_unit) and the sign, or "
    "data.bad_rows.negative_timestamp=drop",
    "future_timestamp": "check the unit (data.timestamp_unit: s or ms), set data.as_of to the "
    "log's end, or data.bad_rows.future_timestamp=drop",
    "duplicate": "remove repeated rows upstream, or data.bad_rows.duplicate=drop",
}
# chrono's %#z: an offset with or without minutes (+05:30, +0530, or +01 as PostgreSQL writes
# a timestamptz of a whole-hour zone); %z would refuse the last
_ISO_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f%#z",
    "%Y-%m-%d %H:%M:%S%.f%#z",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M%#z",
    "%Y-%m-%d %H:%M%#z",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
)
# a trailing "Z", or "UTC" as BigQuery exports a TIMESTAMP ("2024-03-10 12:00:00 UTC"): UTC
_UTC_SUFFIX = r"(?:[zZ]| ?UTC)$"


@dataclass(frozen=True)
class BadRowPolicy:
    """``error`` or ``drop`` for each problem kind (see the module docstring)."""

    null_id: str = "error"
    bad_timestamp: str = "error"
    unknown_behavior: str = "error"
    negative_timestamp: str = "error"
    future_timestamp: str = "error"
    duplicate: str = "drop"

    def __post_init__(self) -> None:
        for kind, policy in asdict(self).items():
            if policy not in POLICIES:
                raise ValueError(f"data.bad_rows.{kind}={policy!r}: use one of {list(POLICIES)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, str] | None) -> BadRowPolicy:
        values = dict(values or {})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(
                f"data.bad_rows has unknown kind(s) {sorted(unknown)}; kinds: {list(PROBLEM_KINDS)}"
            )
        return cls(**values)

    def kinds(self, policy: str) -> list[str]:
        return [kind for kind, p in asdict(self).items() if p == policy]


def check_number(
    option: str,
    value: object,
    *,
    integer: bool = False,
    minimum: float | None = None,
    why: str = "",
) -> None:
    """Refuse a setting that is not a finite number (a string from a command line, a bool,
    None, NaN, inf: comparisons on it would fail with a TypeError that names no setting, or
    pass), or below ``minimum``; ``why`` ends the message (what the bound is for)."""
    kinds = (int,) if integer else (int, float)
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"{option}={value!r} ({type(value).__name__}) must be {kind}{why}")
    if not math.isfinite(value):
        raise ValueError(f"{option}={value!r} must be a finite number{why}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{option}={value!r} must be {kind} >= {minimum}{why}")


def names(option: str, value: object) -> tuple[str, ...]:
    """A list of names from a setting; one name alone (``purchase`` on a command line, where
    ``[purchase]`` was meant) is a list of one, not a list of its letters."""
    if isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        items = (value,)
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError(f"{option}={value!r} must be a list of names, e.g. [view, purchase]")
    return items


def parse_instant(value: str | datetime | None, *, option: str) -> datetime | None:
    """An ISO 8601 string or datetime -> aware UTC datetime (naive means UTC)."""
    if value is None or isinstance(value, datetime):
        instant = value
    else:
        try:
            instant = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError as err:
            raise ValueError(
                f"{option}={value!r} is not an ISO 8601 time such as 2024-05-01T00:00:00Z"
            ) from err
    if instant is None:
        return None
    if instant.tzinfo is None:
        return instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)  # a named zone (Europe/Berlin) too: polars compares in UTC


def _text_instants(text: pl.Series, *, scale: int) -> pl.Series:
    """Timestamps written as text: numbers (a CSV column where one bad value made everything
    text) times ``scale`` microseconds, else the first of :data:`_ISO_FORMATS` that parses (a
    :data:`_UTC_SUFFIX` is UTC: chrono's %#z wants an offset); null where none does. Each
    format is tried only on the rows no earlier one parsed: a coalesce of every format parsed
    every row nine times (10 M ISO timestamps: 33 s of a 36 s preparation, a helper measured)."""
    text = text.str.strip_chars()
    number = text.cast(pl.Float64, strict=False)
    out = (number * scale).round().cast(pl.Int64, strict=False).cast(TIMESTAMP_DTYPE)
    iso = text.str.replace(_UTC_SUFFIX, "+00:00")
    for fmt in _ISO_FORMATS:
        todo = (out.is_null() & iso.is_not_null()).arg_true()
        if todo.len() == 0:
            break
        rows = iso if todo.len() == len(iso) else iso.gather(todo)
        parsed = rows.str.to_datetime(fmt, strict=False, time_unit="us", time_zone="UTC")
        out = out.scatter(todo, parsed)
    return out


def timestamp_expr(dtype: pl.DataType, unit: str) -> pl.Expr:
    """The ``timestamp`` column of type ``dtype`` as a UTC datetime (numbers in ``unit``)."""
    col = pl.col(TIMESTAMP)
    scale = {"s": 1_000_000, "ms": 1_000}[unit]
    if isinstance(dtype, CATEGORIES):
        col, dtype = col.cast(pl.String), pl.String
    if dtype == pl.String:
        return col.map_batches(
            partial(_text_instants, scale=scale), return_dtype=TIMESTAMP_DTYPE, is_elementwise=True
        )
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            return col.cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
        return col.dt.convert_time_zone("UTC").cast(TIMESTAMP_DTYPE)
    if dtype == pl.Date:
        return col.cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    if dtype.is_numeric():
        # rounded, not truncated: 1115390794.735 * 1e6 is 1115390794734999.9 in floating point,
        # and truncation would put the event 1 us before the same instant written as text
        micros = (col.cast(pl.Float64) * scale).round()
        return micros.cast(pl.Int64, strict=False).cast(TIMESTAMP_DTYPE)
    if dtype == pl.Null:
        return pl.lit(None, dtype=TIMESTAMP_DTYPE)
    raise DataError(
        f"column {TIMESTAMP!r} has type {dtype}; expected Unix seconds/milliseconds, "
        "ISO 8601 strings or datetimes"
    )


# text held as categories: a polars Categorical or Enum (a pandas category, a dictionary-encoded
# Arrow or Parquet column), read as its text
CATEGORIES = (pl.Categorical, pl.Enum)


def attribute_list(
    dtype: pl.DataType, column: str, *, separator: str | None, option: str
) -> pl.Expr:
    """A category or attribute column -> ``list[str]`` of non-empty attribute ids.

    Lists stay lists; a string is split on ``separator`` (one attribute when None); numbers
    become one-element lists. Example with ``separator="|"``: ``"Action|Comedy"`` ->
    ``["Action", "Comedy"]``; null -> null.
    """
    col = pl.col(column)
    listed = isinstance(dtype, (pl.List, pl.Array))
    if listed and _id_type(dtype.inner):
        values = (
            col.cast(pl.List(dtype.inner)).list.eval(_id_text(pl.element(), dtype.inner))
            if dtype.inner.is_float()
            else col.cast(pl.List(pl.String))  # (as it was: no per-element expression)
        )
    elif not listed and _id_type(dtype):
        text = _id_text(col, dtype)
        values = text.str.split(separator) if separator else pl.concat_list(text)
    else:  # (a list of lists or of records: polars' cast failed naming no column)
        raise DataError(
            f"{option} column has type {dtype}: give a list of ids, a string (with "
            "data.attribute_separator for several) or a number"
        )
    cleaned = values.list.eval(pl.element().str.strip_chars()).list.eval(
        pl.element().filter(pl.element().is_not_null() & (pl.element() != ""))
    )
    return pl.when(cleaned.list.len() > 0).then(cleaned).otherwise(None)


def _id_type(dtype: pl.DataType) -> bool:
    """Whether values of ``dtype`` are read as attribute ids: text, numbers, categories."""
    return dtype in (pl.String, pl.Null) or dtype.is_numeric() or isinstance(dtype, CATEGORIES)


def _id_text(values: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """Attribute ids of ``dtype`` as text; floating-point whole numbers as the integers they
    are (``3.0`` -> ``"3"``) and NaN as null (no attribute): a category column that pandas made
    float to hold a null, written to Parquet, names the categories the log's integers do, as
    the same frame passed to recsys does (:func:`recsys.data.io.scan_events` reads it as
    integers). ``1.5`` stays ``"1.5"``."""
    if not dtype.is_float():
        return values.cast(pl.String)
    whole = (values == values.floor()) & (values.abs() < 2.0**53)
    return (
        pl.when(whole)
        .then(values.cast(pl.Int64, strict=False).cast(pl.String))
        .when(~values.is_nan())
        .then(values.cast(pl.String))
    )


def side_column(types: Mapping[str, pl.DataType]) -> str | None:
    """The side-information column of a log or item table (canonical names): attributes, or
    a category, or None."""
    return ATTRIBUTES if ATTRIBUTES in types else CATEGORY if CATEGORY in types else None


def separator_inside(types: Mapping[str, pl.DataType], separator: str | None) -> list[pl.Expr]:
    """Aggregations over a log or item table (canonical names, ``types`` its schema) for
    :func:`refuse_separator_inside`: how many rows hold :data:`ATTRIBUTE_SEPARATOR` in their
    category or attribute text, and one such value. That character joins an attribute set into
    one key, so the category ``"A\\x1fB"`` would become the two attributes ``A`` and ``B``
    without a word. None (``[]``) when the column holds no text, or when ``separator`` is that
    character (the values are split on it)."""
    column = side_column(types)
    if column is None or separator == ATTRIBUTE_SEPARATOR:
        return []
    dtype = types[column]
    listed = isinstance(dtype, (pl.List, pl.Array))
    inner = dtype.inner if listed else dtype
    if not (inner == pl.String or isinstance(inner, CATEGORIES)):
        return []
    text = pl.col(column).cast(pl.List(pl.String)).list.join(" ") if listed else pl.col(column)
    text = text.cast(pl.String)
    inside = text.str.contains(ATTRIBUTE_SEPARATOR, literal=True).fill_null(False)
    return [
        inside.sum().alias(SEPARATOR_ROWS),
        text.filter(inside).first().alias(SEPARATOR_EXAMPLE),
    ]


def single_text_side(types: Mapping[str, pl.DataType], separator: str | None) -> bool:
    """Whether the side information of a log (``types``: its schema, canonical names) is one
    text value per row taken whole (a category, or attributes with no separator): each value is
    then its own attribute key, so :meth:`recsys.data.vocab.Vocab.fit` finds a value holding
    :data:`ATTRIBUTE_SEPARATOR` among its few distinct keys, and a preparation need not scan
    every row for it (:func:`separator_inside`: +8-12 % on a 1 M-event log of text categories)."""
    column = side_column(types)
    if column is None or separator:
        return False
    dtype = types[column]
    return dtype == pl.String or isinstance(dtype, CATEGORIES)


def refuse_separator_inside(found: Mapping[str, object], option: str, name: str) -> None:
    """Refuse the rows :func:`separator_inside` counted (``found``: its aggregations, by name;
    nothing to refuse without them), naming ``option`` (the column's setting) and a value."""
    if found.get(SEPARATOR_ROWS):
        raise DataError(
            f"{name}: {found[SEPARATOR_ROWS]} row(s) whose {option} holds the control character "
            f"\\x1f (e.g. {found[SEPARATOR_EXAMPLE]!r}), which recsys uses to join an attribute "
            "set into one key: the value would be read as several attributes. Remove or replace "
            "that character upstream"
        )


def attribute_key(
    dtype: pl.DataType, column: str, *, separator: str | None, option: str
) -> pl.Expr:
    """A category or attribute column -> one text key per event: :func:`attribute_list`'s
    set joined by :data:`ATTRIBUTE_SEPARATOR` (null when empty).

    Events carry their side information as this key, not as a list: a list of strings per
    event made sorting 10 M events 2.5x and filtering them 15x slower, and the vocabulary groups by
    the key anyway. :func:`attribute_sets` turns keys back into lists.

    A single category (no separator) is its own key, as a ``Categorical`` read as it is:
    :func:`tidy_keys` cleans it once per distinct value after the read (``" Shoes "`` ->
    ``"Shoes"``; ``""`` -> null), where cleaning every row's text took a third of the read
    pass (1 M events, measured ad hoc with a training on the other core: 0.098 s -> 0.065 s).
    """
    if _id_type(dtype) and not separator:
        return _id_text(pl.col(column), dtype).cast(pl.Categorical)
    lists = attribute_list(dtype, column, separator=separator, option=option)
    return lists.list.join(ATTRIBUTE_SEPARATOR)


def tidy_keys(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with every attribute key stripped of surrounding whitespace, and empty keys
    null (:func:`attribute_key`'s single categories arrive as read). The work is done on the
    distinct keys: when they are all clean (the usual case) ``events`` comes back as it is;
    otherwise each key is replaced by its cleaned form."""
    # the lazy engine's unique: 2x faster than Series.unique on 10 M keys (0.04 s against 0.09)
    distinct = events.lazy().select(pl.col(ATTRIBUTES).unique().drop_nulls()).collect()
    distinct = distinct.to_series().cast(pl.String)
    cleaned = distinct.str.strip_chars()
    cleaned = pl.select(pl.when(cleaned != "").then(cleaned)).to_series()
    if cleaned.null_count() == 0 and (cleaned == distinct).all():
        return events
    return events.with_columns(
        pl.col(ATTRIBUTES)
        .cast(pl.String)
        .replace_strict(distinct, cleaned, default=None, return_dtype=pl.String)
        .cast(events.schema[ATTRIBUTES])
    )


def attribute_sets(key: pl.Expr) -> pl.Expr:
    """Attribute keys of :func:`attribute_key` -> ``list[str]`` (null stays null)."""
    return key.cast(pl.String).str.split(ATTRIBUTE_SEPARATOR)


def _map_behaviors(raw: pl.Expr, aliases: dict[str, str], behaviors: list[str]) -> pl.Expr:
    """Raw event name -> behaviour as ``Enum(behaviors)`` (null when unknown).

    One Enum cast of the accepted names (unknown ones become null), then a gather of each
    name's behaviour by its code: no string comparisons per row, and the small-integer column
    sorts, hashes and groups cheaply downstream (10 M events: read 0.62 -> 0.50 s against a
    when/then chain plus a Categorical cast; ``replace_strict`` on the text held ~9.6 GiB on a
    100 M-row streaming pass)."""
    names = list(aliases)
    behavior_of_name = pl.Series([aliases[n] for n in names], dtype=pl.Enum(behaviors))
    return pl.lit(behavior_of_name).gather(raw.cast(pl.Enum(names), strict=False).to_physical())


def canonical_id_type(dtype: pl.DataType) -> pl.DataType | None:
    """The type user and item ids are prepared in, where ``dtype`` is not it (``None``): the
    values of a Categorical / Enum (a pandas ``category`` column, a dictionary-encoded Parquet
    one) as text, and integers narrower than 64 bits as Int64. So the same ids hash, fingerprint
    and round-trip through a checkpoint alike whatever type the export gave them."""
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        return pl.String
    if dtype.is_integer() and dtype not in (pl.Int64, pl.UInt64):
        return pl.Int64
    return None


def canonical_ids(column: str, dtype: pl.DataType) -> pl.Expr | None:
    """The id ``column`` (of type ``dtype``) as ids are prepared, or None where it is so
    already: in :func:`canonical_id_type`, and an empty text id as a missing one (null), as a
    CSV's empty field reads. An export that writes ``""`` for an anonymous visitor would
    otherwise make one user of every such event."""
    cast = canonical_id_type(dtype)
    if (cast or dtype) != pl.String:
        return None if cast is None else pl.col(column).cast(cast)
    ids = pl.col(column) if cast is None else pl.col(column).cast(cast)
    return pl.when(ids != "").then(ids).alias(column)


def normalize(lf: pl.LazyFrame, *, schema: EventSchema) -> pl.LazyFrame:
    """Cast a canonical-named log to canonical types (lazy; bad values become nulls here and
    are labelled by :func:`classify`).

    ``lf`` must carry the input row number ``_row``. The raw timestamp and event type are kept
    in ``_raw_timestamp`` / ``_raw_event_type`` (as read: the timestamp in its input type,
    made text by :func:`raw_as_text` only where quoted, since formatting every row's datetime
    costs more than the rest of this pass) so that errors and the quarantine file can quote
    the offending values. The side information ends up in ``attributes`` as an
    :func:`attribute_key` (from ``attributes`` or ``category``; null when the log has
    neither), to be passed through :func:`tidy_keys` once collected.
    """
    types = lf.collect_schema()
    aliases = {**{b: b for b in schema.behaviors}, **schema.behavior_aliases}
    columns = [
        ids for column in (USER, ITEM) if (ids := canonical_ids(column, types[column])) is not None
    ]
    if TIMESTAMP in types:
        columns += [
            pl.col(TIMESTAMP).alias(RAW_TIMESTAMP),  # input type; text only where quoted
            timestamp_expr(types[TIMESTAMP], schema.timestamp_unit).alias(TIMESTAMP),
        ]
    else:  # order-only log: input order, one microsecond apart
        columns += [
            pl.lit(None, dtype=pl.String).alias(RAW_TIMESTAMP),
            pl.col(ROW).cast(pl.Int64).cast(TIMESTAMP_DTYPE).alias(TIMESTAMP),
        ]
    if EVENT_TYPE in types:
        raw_type = pl.col(EVENT_TYPE).cast(pl.String)
        columns += [
            raw_type.alias(RAW_EVENT_TYPE),
            _map_behaviors(raw_type, aliases, list(schema.behaviors)).alias(EVENT_TYPE),
        ]
    else:
        columns += [
            pl.lit(None, dtype=pl.String).alias(RAW_EVENT_TYPE),
            pl.lit(schema.behaviors[0], dtype=pl.Enum(schema.behaviors)).alias(EVENT_TYPE),
        ]
    if ATTRIBUTES in types:
        side = attribute_key(
            types[ATTRIBUTES],
            ATTRIBUTES,
            separator=schema.attribute_separator,
            option="data.columns.attributes",
        )
    elif CATEGORY in types:
        side = attribute_key(
            types[CATEGORY], CATEGORY, separator=None, option="data.columns.category"
        )
    else:
        side = pl.lit(None, dtype=pl.String)
    columns.append(side.alias(ATTRIBUTES))
    if SESSION in types:
        columns.append(pl.col(SESSION).cast(pl.String))
    lf = lf.with_columns(columns)
    columns_out = [ROW, USER, ITEM, TIMESTAMP, EVENT_TYPE, ATTRIBUTES]
    columns_out += [SESSION] if SESSION in types else []
    return lf.select(*columns_out, RAW_TIMESTAMP, RAW_EVENT_TYPE)


def classify(lf: pl.LazyFrame, *, as_of: datetime) -> pl.LazyFrame:
    """Add ``_problem``: the first problem kind of each row, null for a good row (lazy).

    The raw timestamp and event type are kept for bad rows only (a good row's typed values
    are exact), so good rows do not carry their timestamp text through the pipeline."""
    ts = pl.col(TIMESTAMP)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    problem = (
        pl.when(pl.col(USER).is_null() | pl.col(ITEM).is_null())
        .then(pl.lit("null_id"))
        .when(ts.is_null())
        .then(pl.lit("bad_timestamp"))
        .when(pl.col(EVENT_TYPE).is_null())
        .then(pl.lit("unknown_behavior"))
        .when(ts < epoch)
        .then(pl.lit("negative_timestamp"))
        .when(ts > as_of)
        .then(pl.lit("future_timestamp"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    bad = pl.col(PROBLEM).is_not_null()
    return lf.with_columns(problem.alias(PROBLEM)).with_columns(
        pl.when(bad).then(pl.col(RAW_TIMESTAMP)).alias(RAW_TIMESTAMP),
        pl.when(bad).then(pl.col(RAW_EVENT_TYPE)).alias(RAW_EVENT_TYPE),
    )


def raw_as_text(lf: pl.LazyFrame) -> pl.LazyFrame:
    """The raw timestamp and event type as text, as error messages and the quarantine file
    quote them (call it on bad rows only: it formats every row)."""
    return lf.with_columns(pl.col(RAW_TIMESTAMP, RAW_EVENT_TYPE).cast(pl.String))


def problem_summary(classified: pl.LazyFrame) -> dict[str, int]:
    """``{kind: rows}`` for every kind present (streaming; nothing else is kept)."""
    counts = (
        classified.filter(pl.col(PROBLEM).is_not_null())
        .group_by(PROBLEM)
        .agg(pl.len())
        .collect(engine="streaming")
    )
    return {kind: int(n) for kind, n in counts.iter_rows()}


def _example_text(kind: str, examples: pl.DataFrame, where: Callable[[int], str]) -> str:
    value_column = {
        "bad_timestamp": RAW_TIMESTAMP,
        "negative_timestamp": RAW_TIMESTAMP,
        "future_timestamp": RAW_TIMESTAMP,
        "unknown_behavior": RAW_EVENT_TYPE,
    }.get(kind)
    if kind == "null_id":  # a CSV's blank line reads as a row of nulls
        empty = examples.select(
            pl.all_horizontal(pl.col(USER, ITEM, RAW_TIMESTAMP, RAW_EVENT_TYPE).is_null())
        ).to_series()
        return ", ".join(
            where(r) + (" (every mapped column empty: a blank line?)" if e else "")
            for r, e in zip(examples[ROW], empty)
        )
    if value_column is None:
        return ", ".join(where(r) for r in examples[ROW])
    return ", ".join(f"{where(r)}: {v!r}" for r, v in zip(examples[ROW], examples[value_column]))


def enforce(
    counts: Mapping[str, int],
    policy: BadRowPolicy,
    *,
    source_name: str,
    examples: pl.LazyFrame,
    schema: EventSchema,
    as_of: datetime | None = None,
    locator: Callable[[], Callable[[int], str] | None] | None = None,
) -> None:
    """Raise one :class:`DataError` for every kind whose policy is ``error`` and that occurs.

    ``examples`` is the classified log; up to three rows per failing kind are quoted (input row
    numbers are 0-based, header excluded). ``locator``, called only when raising, gives the
    function that names a row's file and its row there (a log of several files), if any.
    """
    wording = {
        **{c: schema.columns.get(c) for c in (USER, ITEM, TIMESTAMP, EVENT_TYPE)},
        "behaviors": list(schema.behaviors),
        "as_of": as_of.isoformat() if as_of else None,
    }
    failing = [kind for kind in PROBLEM_KINDS if counts.get(kind) and kind in policy.kinds("error")]
    if not failing:
        return
    where = (locator() if locator else None) or (lambda row: f"row {row}")
    lines = []
    for kind in failing:
        rows = (
            examples.filter(pl.col(PROBLEM) == kind)
            .sort(ROW)
            .head(3)
            .pipe(raw_as_text)
            .collect(engine="streaming")
        )
        detail = _example_text(kind, rows, where)
        if kind == "unknown_behavior":
            names = (
                examples.filter(pl.col(PROBLEM) == kind)
                .select(pl.col(RAW_EVENT_TYPE).unique().sort().head(10))
                .collect(engine="streaming")[RAW_EVENT_TYPE]
                .to_list()
            )
            detail = f"names {names}; {detail}"
        what, fix = _DESCRIPTIONS[kind].format(**wording), _FIXES[kind]
        if kind == "bad_timestamp":
            what, fix = _timestamp_wording(examples, counts[kind], what, fix, wording)
        lines.append(f"{counts[kind]} row(s) {what} [{kind}] ({detail}); fix: {fix}")
    raise DataError(
        f"{source_name}: bad rows (row numbers are 0-based, header excluded), nothing was "
        "written:\n  - " + "\n  - ".join(lines)
    )


def _timestamp_wording(
    examples: pl.LazyFrame, count: int, what: str, fix: str, wording: Mapping
) -> tuple[str, str]:
    """The bad-timestamp line's description and fix when some of its rows have no timestamp
    at all: a unit or format hint does not help there (a format loader reads the last field
    of a file's last line without a line end, a probable cut, as empty)."""
    empty = (
        examples.filter(pl.col(PROBLEM) == "bad_timestamp")
        .select(pl.col(RAW_TIMESTAMP).is_null().sum())
        .collect(engine="streaming")
        .item()
    )
    if not empty:
        return what, fix
    fill = (
        "fill the empty timestamps upstream (a file whose last line has no line end has that "
        "line's last field read as empty: see the warning above, if any)"
    )
    if empty == count:
        column = wording[TIMESTAMP]
        return f"with an empty timestamp (column {column!r})", (
            f"{fill}, or data.bad_rows.bad_timestamp=drop"
        )
    return f"{what} ({empty} of them empty)", f"{fill}; {fix}"


def log_summary(counts: Mapping[str, int], *, source_name: str) -> None:
    dropped = {k: v for k, v in counts.items() if v}
    if dropped:
        log.warning(
            "%s: %d bad row(s) set aside by data.bad_rows policy: %s",
            source_name,
            sum(dropped.values()),
            ", ".join(f"{k}={v}" for k, v in dropped.items()),
        )
