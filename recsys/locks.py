"""Advisory file locks (``flock``) by which a job holds a folder or an output path, so that a
second job given the same one meanwhile (a scheduler's overlapping start of the same command)
is refused at once, naming the holder. The lock goes with the process, however it ends. On
Windows there are no advisory locks: nothing is held (:data:`AVAILABLE` is False)."""

from __future__ import annotations

import os
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
