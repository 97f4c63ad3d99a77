"""Advisory file locks (``flock``) by which a job holds a folder or an output path, so that a
second job given the same one meanwhile (a scheduler's overlapping start of the same command)
is refused at once, naming the holder. The lock goes with the process, however it ends. On
Windows there are no advisory locks: nothing is held (:data:`AVAILABLE` is False)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

AVAILABLE = fcntl is not None


def hold(lock: Path, refusal: Callable[[str], str]) -> int | None:
    """Take ``lock`` (created if absent) without waiting and write this process into it
    (``process <pid> on <host>``); returns its descriptor, to ``os.close`` when done (None
    where there are no locks). Held by another process: ``FileExistsError(refusal(holder))``,
    ``holder`` being what that process wrote. A lock file its holder unlinked on release
    meanwhile is no lock: the file now at that path is taken instead."""
    if fcntl is None:
        return None
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 100).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FileExistsError(refusal(holder)) from None
        try:
            held, named = os.fstat(fd), os.stat(lock)
            same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()} on {os.uname().nodename}".encode())
    return fd


def hold_folder(folder: Path) -> int | None:
    """Hold ``folder``, a staging folder this job has just made, while it writes there: an
    advisory ``flock`` on the folder itself, gone with the process however it ends, by which
    a later job tells a killed job's leftover (:func:`remove_if_abandoned`) from a running
    job's. Returns its descriptor, to ``os.close`` once the folder is renamed or removed
    (None where there are no locks). Waits while another job is looking into the folder."""
    if fcntl is None:
        return None
    fd = os.open(folder, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_if_abandoned(folder: Path) -> bool:
    """Delete ``folder``, a staging folder of :func:`hold_folder`, when no process holds it
    and it holds something: its job was killed (SIGKILL, a power cut: no cleanup of its own
    ran). An empty one stays (its job may have made it and not yet taken it), as does
    everything where there are no locks. Returns whether it was deleted."""
    if fcntl is None:
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # gone meanwhile (its job finished), or not a folder
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not any(folder.iterdir()):
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True
    except BlockingIOError:  # a running job's
        return False
    finally:
        os.close(fd)
