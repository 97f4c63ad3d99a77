"""Advisory file locks (``flock``) by which a job holds a folder or an output path, so that a
second job given the same one meanwhile (a scheduler's overlapping start of the same command)
is refused at once, naming the holder. The lock goes with the process, however it ends. On
Windows there are no advisory locks: nothing is held (:data:`AVAILABLE` is False). Nor on a
filesystem that refuses them (NFS without its lock service, some CIFS and FUSE mounts: ENOLCK,
EOPNOTSUPP): nothing is held there either, with a warning naming the path."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

AVAILABLE = fcntl is not None
# what flock raises on a filesystem without advisory locks
UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})

log = logging.getLogger(__name__)
_warned: set[int] = set()  # the devices whose missing locks were named in a warning


def flock(fd: int, operation: int, path: Path | str) -> bool:
    """``fcntl.flock(fd, operation)`` on ``path``'s descriptor; False where its filesystem
    has no advisory locks (named in a warning, once per filesystem), as if none were needed.
    A lock held elsewhere (``LOCK_NB``) raises ``BlockingIOError`` as before."""
    try:
        fcntl.flock(fd, operation)
    except OSError as err:
        if err.errno not in UNSUPPORTED:
            raise
        device = os.fstat(fd).st_dev
        if device not in _warned:
            _warned.add(device)
            log.warning(
                "the filesystem of %s has no advisory locks (%s): recsys holds nothing there, "
                "so a second job started on the same folder or output meanwhile is not "
                "refused; keep such jobs apart, or write to a local disk",
                path,
                err.strerror,
            )
        return False
    return True


def hold(lock: Path, refusal: Callable[[str], str]) -> int | None:
    """Take ``lock`` (created if absent) without waiting and write this process into it
    (``process <pid> on <host>``); returns its descriptor, to ``os.close`` when done (None
    where there are no locks). Held by another process: ``FileExistsError(refusal(holder))``,
    ``holder`` being what that process wrote. A lock file its holder unlinked on release
    meanwhile is no lock: the file now at that path is taken instead. Where the filesystem
    has no locks: None, and no lock file left."""
    if fcntl is None:
        return None
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, lock):
                os.close(fd)
                lock.unlink(missing_ok=True)
                return None
        except BlockingIOError:
            holder = os.read(fd, 100).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FileExistsError(refusal(holder)) from None
        except BaseException:
            os.close(fd)
            raise
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


def holder(lock: Path) -> str | None:
    """The process holding ``lock``, a lock file of :func:`hold`, as it wrote itself there
    (``process <pid> on <host>``); None when no process holds it, it is absent, or there are
    no locks. Looks with a shared lock taken for a moment and let go: a job taking ``lock`` in
    that moment is refused, as it would be by the caller, which is about to take it too."""
    if fcntl is None:
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # absent, or unreadable: nothing known
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 100).decode(errors="replace").strip() or "another process"
    except OSError:  # a filesystem without locks (:func:`flock` names it when a job holds)
        return None
    finally:
        os.close(fd)
    return None


def hold_folder(folder: Path) -> int | None:
    """Hold ``folder``, a staging folder this job has just made, while it writes there: an
    advisory ``flock`` on the folder itself, gone with the process however it ends, by which
    a later job tells a killed job's leftover (:func:`remove_if_abandoned`) from a running
    job's. Returns its descriptor, to ``os.close`` once the folder is renamed or removed
    (None where there are no locks). Waits while another job is looking into the folder."""
    if fcntl is None:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        if flock(fd, fcntl.LOCK_EX, folder):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def remove_if_abandoned(folder: Path) -> bool:
    """Delete ``folder``, a staging folder of :func:`hold_folder`, when no process holds it
    and it holds something: its job was killed (SIGKILL, a power cut: no cleanup of its own
    ran). An empty one stays (its job may have made it and not yet taken it), as does
    everything where there are no locks (a running job's is not told from a killed one's).
    Returns whether it was deleted."""
    if fcntl is None:
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # gone meanwhile (its job finished), or not a folder
        return False
    try:
        if not flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, folder):
            return False
        # its job may have finished meanwhile: released the folder after renaming it into place
        if not os.path.samestat(os.fstat(fd), os.stat(folder)) or not any(folder.iterdir()):
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True
    except BlockingIOError:  # a running job's
        return False
    except FileNotFoundError:  # renamed into place (or removed) by its job meanwhile
        return False
    finally:
        os.close(fd)


def take_abandoned(lock: Path) -> int | None:
    """Take ``lock``, a lock file of :func:`hold`, when it is there and no process holds it:
    the process that held it ended without removing it (killed outright: SIGKILL, the OOM
    killer, a power cut). Returns its descriptor, for the caller to clean up after that
    process, then unlink the file and ``os.close`` it; None when the file is absent, held by
    a running process, or removed meanwhile, and wherever there are no locks (a running
    holder is not told from a gone one)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:  # gone (its holder ended and removed it), or unreadable: nothing known
        return None
    try:
        if flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, lock) and os.path.samestat(
            os.fstat(fd), os.stat(lock)
        ):
            return fd
    except (BlockingIOError, FileNotFoundError):  # held, or removed by its holder meanwhile
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None
