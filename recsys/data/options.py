"""The data options (``conf/data/*.yaml`` keys, or keyword arguments of
:func:`recsys.data.prepare`) -> typed :class:`~recsys.schema.EventSchema` and
:class:`~recsys.data.pipeline.PrepareSettings`.

This is the one place where option names meet code, for Hydra and the Python API alike.
Missing keys take the defaults of ``conf/data/base.yaml``; unknown keys are an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from numbers import Number
from typing import Any

from recsys.data.io import check_one_side
from recsys.data.pipeline import DEFAULT_ITEM_COLUMNS, PrepareSettings
from recsys.data.sequences import TimeBuckets
from recsys.data.split import SplitSettings
from recsys.data.validate import BadRowPolicy, names, parse_instant
from recsys.schema import EVENT_TYPE, ITEM, TIMESTAMP, USER, EventSchema

SCHEMA_KEYS = {
    "columns",
    "behaviors",
    "behavior_aliases",
    "timestamp_unit",
    "attribute_separator",
}
SETTINGS_KEYS = {
    "split",
    "time_buckets",
    "bad_rows",
    "as_of",
    "window",
    "min_user_events",
    "min_item_events",
    "max_user_events",
    "session_gap_seconds",
    "min_item_count",
    "max_item_attributes",
    "partition_rows",
}
ITEM_KEYS = {"item_columns"}
# the data config group's keys besides the above: where the data is and how it is loaded
CONFIG_KEYS = {"name", "source", "items", "prepared_dir", "max_seq_len", "loader"}
DATA_KEYS = SCHEMA_KEYS | SETTINGS_KEYS | ITEM_KEYS | CONFIG_KEYS
DEFAULT_COLUMNS = {USER: USER, ITEM: ITEM, TIMESTAMP: TIMESTAMP, EVENT_TYPE: EVENT_TYPE}


def check_keys(options: Mapping[str, Any], *, allowed: set[str], group: str = "data") -> None:
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown {group} option(s) {sorted(unknown)}; known: {sorted(allowed)}")


def _label(column: Any) -> Any:
    """A column mapping's value as the text polars names that column: a pandas frame's number
    label (``pd.read_csv(header=None)``'s 0, 1, 2, or ``frame.columns[0]``, numpy's int64) as
    its text, as :func:`recsys.data.io.scan_events` names a frame's columns."""
    return str(column) if isinstance(column, Number) and not isinstance(column, bool) else column


def event_schema(options: Mapping[str, Any]) -> EventSchema:
    columns = {**DEFAULT_COLUMNS, **dict(options.get("columns") or {})}
    columns = {k: _label(v) for k, v in columns.items() if v is not None and v != ""}  # unmapped
    check_one_side(columns, "data.columns")
    defaults = EventSchema()
    return EventSchema(
        columns=columns,
        # absent: the default; null or [] given is refused (not silently the default four)
        behaviors=names("data.behaviors", options.get("behaviors", defaults.behaviors)),
        behavior_aliases=dict(options.get("behavior_aliases") or {}),
        timestamp_unit=options.get("timestamp_unit") or "s",
        attribute_separator=options.get("attribute_separator"),
    )


def item_columns(options: Mapping[str, Any]) -> dict[str, str | None]:
    given = dict(options.get("item_columns") or {})
    check_keys(given, allowed={*DEFAULT_ITEM_COLUMNS, TIMESTAMP}, group="data.item_columns")
    return {**DEFAULT_ITEM_COLUMNS, **{k: _label(v) for k, v in given.items()}}


def time_buckets(options: Mapping[str, Any]) -> TimeBuckets:
    buckets = dict(options.get("time_buckets") or {})
    check_keys(buckets, allowed={f.name for f in fields(TimeBuckets)}, group="data.time_buckets")
    return TimeBuckets(**buckets)


def prepare_settings(options: Mapping[str, Any]) -> PrepareSettings:
    split = dict(options.get("split") or {})
    check_keys(split, allowed={f.name for f in fields(SplitSettings)}, group="data.split")
    window = dict(options.get("window") or {})
    check_keys(window, allowed={"start", "end"}, group="data.window")
    defaults = PrepareSettings()
    plain = {
        key: options[key]
        for key in (
            "min_user_events",
            "min_item_events",
            "max_user_events",
            "session_gap_seconds",
            "min_item_count",
            "max_item_attributes",
            "partition_rows",
        )
        if key in options
    }
    return PrepareSettings(
        split=SplitSettings(**split),
        time_buckets=time_buckets(options),
        bad_rows=BadRowPolicy.from_dict(options.get("bad_rows")),
        as_of=parse_instant(options.get("as_of"), option="data.as_of"),
        window_start=parse_instant(window.get("start"), option="data.window.start"),
        window_end=parse_instant(window.get("end"), option="data.window.end"),
        **{**{k: getattr(defaults, k) for k in plain}, **plain},
    )
