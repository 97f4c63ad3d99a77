"""recsys.code_version(): which code a job ran, for its MLflow tags, checkpoint and outputs;
never a failure where there is no git or no checkout."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

import recsys

ROOT = Path(recsys.__file__).resolve().parents[1]


def _copy_of_recsys(folder: Path):
    """recsys/__init__.py copied to ``folder/recsys/`` and imported from there."""
    package = folder / "recsys"
    package.mkdir(parents=True)
    shutil.copy(recsys.__file__, package / "__init__.py")
    spec = importlib.util.spec_from_file_location("recsys_copy", package / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_version_is_the_packages_and_the_commit_the_checkouts():
    found = recsys.code_version()
    assert found["version"] == recsys.__version__
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        assert found["git_commit"] is None
        return
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found["git_commit"] == head and isinstance(found["git_dirty"], bool)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_copy_inside_another_repository_claims_none_of_its_commits(tmp_path):
    """An MLflow model's copy of recsys (code/recsys) inside, say, the user's own repository:
    that repository's commit is not recsys' code."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    copy = _copy_of_recsys(tmp_path / "model" / "code")
    assert copy.code_version() == {
        "version": recsys.__version__,
        "git_commit": None,
        "git_dirty": None,
    }


def test_a_checkout_without_git_installed_gives_the_version_alone(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # looks like a checkout, but git cannot be run
    copy = _copy_of_recsys(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert copy.code_version() == {
        "version": recsys.__version__,
        "git_commit": None,
        "git_dirty": None,
    }
