"""Config plumbing: Hydra resolvers and typed settings built from the ``data`` config group.

Tasks call these instead of reading nested keys themselves, so the yaml <-> code contract
lives in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recsys.data import options
from recsys.data.pipeline import PrepareSettings
from recsys.data.sequences import TimeBuckets
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
    return options.event_schema(to_container(data_cfg))


def time_buckets(data_cfg: Mapping[str, Any]) -> TimeBuckets:
    return options.time_buckets(to_container(data_cfg))


def prepare_settings(data_cfg: Mapping[str, Any]) -> PrepareSettings:
    return options.prepare_settings(to_container(data_cfg))


def item_columns(data_cfg: Mapping[str, Any]) -> dict[str, str | None]:
    return options.item_columns(to_container(data_cfg))
