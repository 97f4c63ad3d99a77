"""recsys installed from a wheel (``pip install <clone or git URL>``, not ``-e``) and used from
another folder: the wheel holds the Hydra configs and the pipelines, and both
``recsys.config.compose`` and ``python -m pipelines.<name>`` find them from anywhere."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import recsys.config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (an in-tree build would leave ``build/`` and
    ``*.egg-info`` in the clone), offline, with the setuptools already installed."""
    pytest.importorskip("setuptools")
    pytest.importorskip("pip")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("recsys", "conf", "pipelines"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--quiet", str(src), "-w", str(base / "dist")],
        check=True,
        capture_output=True,
    )
    (built,) = (base / "dist").glob("recsys-*.whl")
    return built


def test_the_wheel_holds_every_config_and_the_pipelines(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"recsys/conf/{p.relative_to(ROOT / 'conf')}" for p in ROOT.glob("conf/**/*.yaml")}
    assert "recsys/conf/config.yaml" in configs
    assert configs - names == set()
    pipelines = {f"pipelines/{p.name}" for p in ROOT.glob("pipelines/*.py")}
    assert {"pipelines/run.py", "pipelines/score.py"} <= pipelines
    assert pipelines - names == set()


@pytest.mark.slow  # two Python processes that import torch: ~10 s on 2 cores
def test_an_installed_wheel_composes_and_runs_pipelines_from_another_folder(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installed: its files
    elsewhere = tmp_path / "notebooks"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of any editable install's finder
    code = (
        "import recsys, recsys.config as rc\n"
        "cfg = rc.compose('config', ['experiment=tiny', 'logger=none'])\n"
        "print(recsys.__file__, rc.config_dir(), cfg.model.d_model, cfg.paths.output_dir)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    module, conf, d_model, output_dir = out.stdout.split()
    assert Path(module).is_relative_to(site)
    assert Path(conf) == (site / "recsys" / "conf").resolve()
    assert d_model == "16"  # experiment=tiny's
    assert Path(output_dir) == elsewhere.resolve() / "outputs"  # beside it, as in a clone
    job = subprocess.run(
        [sys.executable, "-m", "pipelines.score", "--cfg", "job", "model=best.ckpt"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert job.returncode == 0, job.stderr
    assert "model_ref: best.ckpt" in job.stdout
    assert list(elsewhere.iterdir()) == []  # --cfg job writes nothing


def test_configs_that_are_not_there_are_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(recsys.config, "__file__", str(tmp_path / "recsys" / "config.py"))
    with pytest.raises(FileNotFoundError, match=r"recsys/conf.*pip install -e \. in a clone"):
        recsys.config.compose("config")
