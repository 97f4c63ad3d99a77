"""recsys: sequential recommendation from customer-journey event logs."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

__version__ = "0.1.0"  # the one place it is written (pyproject.toml reads it from here)


@functools.cache
def code_version() -> dict[str, str | bool | None]:
    """Which code is running, for the records a job leaves (MLflow tags, checkpoints, the
    scoring summary): ``version`` (:data:`__version__`) and, when recsys runs from a git
    checkout (a ``.git`` beside the package folder, not an enclosing repository such as one
    holding an MLflow model's copy of recsys), ``git_commit`` and ``git_dirty`` (tracked files
    changed since that commit). Both None where there is no checkout, no git, or git fails;
    asked once per process, without taking git's index lock."""
    root = Path(__file__).resolve().parent.parent
    found: dict[str, str | bool | None] = {
        "version": __version__,
        "git_commit": None,
        "git_dirty": None,
    }
    if not (root / ".git").exists():
        return found
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"  # git status may not write the index under a user's git

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
            env=env,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):  # no git, not a repository, too slow
        return found
    return {**found, "git_commit": commit, "git_dirty": dirty}


def shown_live(stream: Any) -> bool:
    """Whether what is written to ``stream`` is seen as it comes: a terminal, or a Jupyter
    kernel's output (no tty, yet it draws a progress bar live). Not a file, a pipe or a
    scheduler's log (cron, ``> job.log 2>&1``, ``| tee``), where a progress bar's updates
    pile up, carriage-returned, into one long line; nor a missing or closed stream."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
