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
ATTRIBUTES = "attributes"  # a set of attribute ids per item (list[str]); a category is a set of one
SESSION = "session_id"
CANONICAL_COLUMNS = (USER, ITEM, TIMESTAMP, EVENT_TYPE, CATEGORY, ATTRIBUTES, SESSION)
REQUIRED_COLUMNS = (USER, ITEM)


@dataclass(frozen=True)
class EventSchema:
    """How a user's event log maps onto recsys' canonical columns.

    ``columns`` maps canonical name -> the user's column name, e.g.
    ``{"user_id": "visitorid", "item_id": "itemid", "timestamp": "ts", "event_type": "event"}``.
    Only ``user_id`` and ``item_id`` are required. Without ``timestamp`` the log is *order-only*
    (each user's events are in input order, as in the S3-Rec files): time gaps carry no
    information and only the leave-one-out / leave-last-N splits apply. Without ``event_type``
    every event is the first behaviour. ``category`` (one per event row) or ``attributes`` (a
    list, or a string split on ``attribute_separator``) give the item side information;
    ``session_id`` carries your own session ids.

    ``behaviors`` lists the event types in funnel order (``view`` first, ``purchase`` last).
    ``behavior_aliases`` maps raw event names onto them (``{"pv": "view", "buy": "purchase"}``).

    ``timestamp_unit`` says how numeric timestamps are read: ``"s"`` or ``"ms"`` since the Unix
    epoch. String timestamps are parsed as ISO 8601; datetimes are taken as they are (naive = UTC).
    """

    columns: dict[str, str] = field(
        default_factory=lambda: {c: c for c in (USER, ITEM, TIMESTAMP, EVENT_TYPE, CATEGORY)}
    )
    behaviors: tuple[str, ...] = ("view", "click", "cart", "purchase")
    behavior_aliases: dict[str, str] = field(default_factory=dict)
    timestamp_unit: str = "s"
    attribute_separator: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.columns) - set(CANONICAL_COLUMNS)
        if unknown:
            raise ValueError(
                f"data.columns has unknown keys {sorted(unknown)}; "
                f"allowed keys are {list(CANONICAL_COLUMNS)}"
            )
        missing = [c for c in REQUIRED_COLUMNS if c not in self.columns]
        if missing:
            raise ValueError(
                f"data.columns must map {missing}: set data.columns.<name>=<your column>"
            )
        if not self.behaviors:
            raise ValueError(
                "data.behaviors is empty: list your event types in funnel order, e.g. "
                "'data.behaviors=[view,cart,purchase]'"
            )
        if len(set(self.behaviors)) != len(self.behaviors):
            raise ValueError(f"data.behaviors has duplicates: {list(self.behaviors)}")
        # raw names are compared as text: numeric event codes ({1: view}) are names "1", ...
        object.__setattr__(
            self, "behavior_aliases", {str(k): v for k, v in self.behavior_aliases.items()}
        )
        bad_alias = {k: v for k, v in self.behavior_aliases.items() if v not in self.behaviors}
        if bad_alias:
            raise ValueError(
                f"data.behavior_aliases map to names not in data.behaviors "
                f"{list(self.behaviors)}: {bad_alias}: alias each raw name to one of those"
            )
        if self.timestamp_unit not in ("s", "ms"):
            raise ValueError(
                f"data.timestamp_unit={self.timestamp_unit!r} is not supported: use 's' (Unix "
                "seconds) or 'ms' (milliseconds)"
            )

    def has(self, canonical: str) -> bool:
        """Whether the log maps the canonical column ``canonical``."""
        return bool(self.columns.get(canonical))

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
            "attribute_separator": self.attribute_separator,
        }

    @classmethod
    def from_dict(cls, d: dict) -> EventSchema:
        return cls(
            columns=dict(d["columns"]),
            behaviors=tuple(d["behaviors"]),
            behavior_aliases=dict(d.get("behavior_aliases") or {}),
            timestamp_unit=d.get("timestamp_unit", "s"),
            attribute_separator=d.get("attribute_separator"),
        )
