"""Task: event log -> prepared dataset folder."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys.config import event_schema, prepare_settings
from recsys.data.pipeline import prepare_dataset

log = logging.getLogger(__name__)


def event_source(cfg: DictConfig):
    """``data.source``: a path to a CSV/Parquet log, or a ``_target_`` that returns a frame."""
    source = cfg.data.source
    if source is None:
        raise ValueError("data.source is not set: give a CSV/Parquet path (data.source=...)")
    return instantiate(source) if isinstance(source, DictConfig) else str(source)


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> Path:
    """Prepare ``data.source`` into ``out_dir`` (default ``<run dir>/prepared``)."""
    out_dir = Path(out_dir or Path(cfg.paths.run_dir) / "prepared")
    prepare_dataset(
        event_source(cfg),
        schema=event_schema(cfg.data),
        settings=prepare_settings(cfg.data),
        out_dir=out_dir,
    )
    log.info("prepared dataset at %s", out_dir)
    return out_dir
