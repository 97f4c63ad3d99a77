"""Shared test fixtures: tiny deterministic data and Hydra configs built with the compose API."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import recsys.config  # noqa: F401  (registers the ${abspath:} resolver)

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def make_config(tmp_path):
    """``make_config("config", ["experiment=tiny", ...])`` -> a composed config whose outputs go
    under ``tmp_path`` (and whose MLflow store is a sqlite file there)."""

    def _make(config_name: str = "config", overrides: list[str] | None = None):
        base = [
            f"paths.output_dir={tmp_path / 'outputs'}",
            f"paths.run_dir={tmp_path / 'outputs' / 'run'}",
        ]
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name=config_name, overrides=base + list(overrides or []))

    return _make
