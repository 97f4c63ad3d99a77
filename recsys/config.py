"""Config plumbing: Hydra resolvers and typed settings built from the ``data`` config group.

Tasks call these instead of reading nested keys themselves, so the yaml <-> code contract
lives in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recsys.data.prepare import PrepareSettings
from recsys.data.sequences import TimeBuckets
from recsys.data.split import SplitSettings
from recsys.schema import EventSchema


def register_resolvers() -> None:
    """``${abspath:outputs}`` -> an absolute path (resolved against the launch directory)."""
    if not OmegaConf.has_resolver("abspath"):
        OmegaConf.register_new_resolver("abspath", lambda p: os.path.abspath(os.path.expanduser(p)))


register_resolvers()


def to_container(cfg: Any) -> Any:
    """Resolved plain Python containers from a DictConfig (anything else passes through)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def event_schema(data_cfg: Mapping[str, Any]) -> EventSchema:
    data = to_container(data_cfg)
    return EventSchema(
        columns={k: v for k, v in data["columns"].items() if v},
        behaviors=tuple(data["behaviors"]),
        behavior_aliases=dict(data.get("behavior_aliases") or {}),
        timestamp_unit=data.get("timestamp_unit", "s"),
    )


def time_buckets(data_cfg: Mapping[str, Any]) -> TimeBuckets:
    return TimeBuckets(**to_container(data_cfg)["time_buckets"])


def prepare_settings(data_cfg: Mapping[str, Any]) -> PrepareSettings:
    data = to_container(data_cfg)
    split = dict(data["split"])
    if split.get("target_behaviors"):
        split["target_behaviors"] = tuple(split["target_behaviors"])
    return PrepareSettings(
        split=SplitSettings(**split),
        time_buckets=time_buckets(data),
        min_user_events=int(data["min_user_events"]),
        min_item_count=int(data["min_item_count"]),
    )
