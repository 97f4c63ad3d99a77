"""Names declared once: canonical column names, reserved indices, the event schema.

Every module reads column names from here (or from an :class:`EventSchema`) instead of
scattering string literals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAD_IDX = 0  # padding token in every vocabulary (items, categories, behaviours)
UNK_IDX = 1  # anything not seen in the training window
NUM_RESERVED = 2

# Canonical column names inside recsys, after the user's columns are mapped.
USER = "user_id"
ITEM = "item_id"
TIMESTAMP = "timestamp"
EVENT_TYPE = "event_type"
CATEGORY = "category"
CANONICAL_COLUMNS = (USER, ITEM, TIMESTAMP, EVENT_TYPE, CATEGORY)
REQUIRED_COLUMNS = (USER, ITEM, TIMESTAMP, EVENT_TYPE)


@dataclass(frozen=True)
class EventSchema:
    """How a user's event log maps onto recsys' canonical columns.

    ``columns`` maps canonical name -> the user's column name, e.g.
    ``{"user_id": "visitorid", "item_id": "itemid", "timestamp": "ts", "event_type": "event"}``.
    ``category`` is optional: leave it out and every item gets the UNK category.

    ``behaviors`` lists the event types in funnel order (``view`` first, ``purchase`` last).
    ``behavior_aliases`` maps raw event names onto them (``{"pv": "view", "buy": "purchase"}``).

    ``timestamp_unit`` says how numeric timestamps are read: ``"s"`` or ``"ms"`` since the Unix
    epoch. String timestamps are parsed as ISO 8601; datetimes are taken as they are (naive = UTC).
    """

    columns: dict[str, str] = field(default_factory=lambda: {c: c for c in CANONICAL_COLUMNS})
    behaviors: tuple[str, ...] = ("view", "click", "cart", "purchase")
    behavior_aliases: dict[str, str] = field(default_factory=dict)
    timestamp_unit: str = "s"

    def __post_init__(self) -> None:
        unknown = set(self.columns) - set(CANONICAL_COLUMNS)
        if unknown:
            raise ValueError(
                f"EventSchema.columns has unknown keys {sorted(unknown)}; "
                f"allowed keys are {list(CANONICAL_COLUMNS)}"
            )
        missing = [c for c in REQUIRED_COLUMNS if c not in self.columns]
        if missing:
            raise ValueError(
                f"EventSchema.columns must map {missing}: set data.columns.<name>=<your column>"
            )
        if not self.behaviors:
            raise ValueError(
                "EventSchema.behaviors is empty: list your event types in funnel order"
            )
        if len(set(self.behaviors)) != len(self.behaviors):
            raise ValueError(f"EventSchema.behaviors has duplicates: {list(self.behaviors)}")
        bad_alias = {k: v for k, v in self.behavior_aliases.items() if v not in self.behaviors}
        if bad_alias:
            raise ValueError(
                "EventSchema.behavior_aliases map to names not in behaviors "
                f"{list(self.behaviors)}: {bad_alias}"
            )
        if self.timestamp_unit not in ("s", "ms"):
            raise ValueError(
                f"timestamp_unit={self.timestamp_unit!r} is not supported: use 's' or 'ms'"
            )

    @property
    def has_category(self) -> bool:
        return CATEGORY in self.columns and bool(self.columns[CATEGORY])

    @property
    def num_behaviors(self) -> int:
        """Size of the behaviour vocabulary, PAD and UNK included."""
        return NUM_RESERVED + len(self.behaviors)

    def behavior_index(self, name: str) -> int:
        return NUM_RESERVED + self.behaviors.index(name)

    def to_dict(self) -> dict:
        return {
            "columns": dict(self.columns),
            "behaviors": list(self.behaviors),
            "behavior_aliases": dict(self.behavior_aliases),
            "timestamp_unit": self.timestamp_unit,
        }

    @classmethod
    def from_dict(cls, d: dict) -> EventSchema:
        return cls(
            columns=dict(d["columns"]),
            behaviors=tuple(d["behaviors"]),
            behavior_aliases=dict(d.get("behavior_aliases") or {}),
            timestamp_unit=d.get("timestamp_unit", "s"),
        )
