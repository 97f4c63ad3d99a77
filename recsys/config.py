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


def model_reference_argv(argv: list[str]) -> list[str]:
    """``model=<ref>`` on the score / evaluate command line means the model to load, but Hydra
    reads ``model=`` as a choice of the ``conf/model`` group (the architecture): rewrite it to
    the config key ``model_ref`` before Hydra parses the arguments."""
    return [f"model_ref={a.removeprefix('model=')}" if a.startswith("model=") else a for a in argv]


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


def compose(config_name: str = "config", overrides: list[str] | None = None) -> DictConfig:
    """The repository's ``conf/<config_name>.yaml`` composed with Hydra's compose API, for
    notebooks and scripts: ``compose("config", ["experiment=tiny", "logger=none"])`` is what
    ``python -m pipelines.run experiment=tiny logger=none`` would run with. For ``score`` and
    ``evaluate``, ``model=<ref>`` names the model to load, as on the command line.

    Outside a Hydra app there is no run folder (``${hydra:runtime.output_dir}``): give
    ``paths.run_dir=<folder>`` (and usually ``paths.output_dir=<folder>``) among the overrides
    before a task reads it.
    """
    from pathlib import Path

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import recsys

    conf_dir = Path(recsys.__file__).resolve().parents[1] / "conf"
    overrides = list(overrides or [])
    if config_name in ("score", "evaluate"):  # model=<ref>, as on the command line
        overrides = model_reference_argv(overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)
