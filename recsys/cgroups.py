"""What a container lets this process use: its CPU quota and its memory limit (the cgroups
that hold it, v1 or v2), and torch's threads cut to that quota.

A container's CPU limit (Kubernetes ``resources.limits.cpu``, ``docker run --cpus``) is a CFS
quota on its cgroup, not fewer visible cores: torch (OpenMP) still starts one thread per core
it sees, and the kernel then stops them all for the rest of each period once the quota is
spent, while OpenMP's threads wait on one another. polars sizes its pool by the quota already
(Rust's ``available_parallelism`` reads it); torch does not. The pipelines therefore cut
torch's threads to the quota at the start of each job (:func:`fit_threads_to_cpu_quota`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)


PROC = Path("/proc/self")


def _folders(controller: str, proc: Path) -> list[tuple[Path, bool]]:
    """The folders of the cgroups that hold this process for ``controller`` (``cpu``,
    ``memory``): its own, then each one above it up to the hierarchy's mount, for the unified
    (v2) hierarchy and a v1 one of that controller, each with whether it is v2. [] where the
    cgroups cannot be read (another operating system, a filesystem without them)."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = [line.split() for line in (proc / "mountinfo").read_text().splitlines()]
    except OSError:
        return []
    folders = []
    for membership in memberships:
        if membership.count(":") < 2:  # (not a cgroup line: nothing to read from it)
            continue
        hierarchy, controllers, path = membership.split(":", 2)
        unified = hierarchy == "0" and not controllers
        if not unified and controller not in controllers.split(","):
            continue
        for fields in mounts:
            if "-" not in fields[6:]:
                continue
            kind = fields[fields.index("-", 6) + 1 :]  # file system type, source, options
            if len(kind) < 3:
                continue
            if unified and kind[0] != "cgroup2":
                continue
            if not unified and (kind[0] != "cgroup" or controller not in kind[-1].split(",")):
                continue
            root, point = fields[3], Path(fields[4])
            # the membership's path is from the hierarchy's root; the mount may show a part
            # of it (a container's own cgroup mounted as its /sys/fs/cgroup)
            inside = os.path.relpath(path, root) if _under(path, root) else "."
            folder = Path(os.path.normpath(point / inside))
            while True:
                folders.append((folder, unified))
                if folder == point or point not in folder.parents:
                    break
                folder = folder.parent
    return folders


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def cpu_quota(proc: Path = PROC) -> float | None:
    """The CPUs this process's cgroups allow it: the smallest CFS quota / period along its
    cgroup and the cgroups above it (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` and
    ``cpu.cfs_period_us``). None where no quota is set or the cgroups cannot be read."""
    limits = [limit for folder, v2 in _folders("cpu", proc) if (limit := _cpus(folder, v2))]
    return min(limits, default=None)


def _cpus(folder: Path, unified: bool) -> float | None:
    """One cgroup's CPU quota in CPUs (None: unlimited or not readable)."""
    try:
        if unified:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def memory_room(proc: Path = PROC) -> tuple[int, Path] | None:
    """The bytes this process's cgroups still let it take: the least of limit - usage along
    its cgroup and the cgroups above it (v2 ``memory.max`` and ``memory.current``; v1
    ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``), with the limit's file. None
    where no limit is set or the cgroups cannot be read."""
    rooms = [room for folder, v2 in _folders("memory", proc) if (room := _room(folder, v2))]
    return min(rooms, default=None)


def _room(folder: Path, unified: bool) -> tuple[int, Path] | None:
    """One cgroup's memory limit less its usage (None: no limit, or not readable)."""
    limit_file = folder / ("memory.max" if unified else "memory.limit_in_bytes")
    usage_file = folder / ("memory.current" if unified else "memory.usage_in_bytes")
    try:
        limit, usage = limit_file.read_text().strip(), int(usage_file.read_text())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= 2**60:  # "max" (v2), or v1's huge "no limit"
        return None
    return max(int(limit) - usage, 0), limit_file


def fit_threads_to_cpu_quota(quota: float | None = None) -> int:
    """Cut torch's CPU threads to the whole CPUs of ``quota`` (default :func:`cpu_quota`; at
    least one) where it runs more, and log it. A thread count set by ``OMP_NUM_THREADS`` is the
    user's: kept, with a warning when the quota is smaller. Returns torch's thread count."""
    quota = cpu_quota() if quota is None else quota
    threads = torch.get_num_threads()
    if quota is None:
        return threads
    allowed = max(1, int(quota))
    if threads <= allowed:
        return threads
    if os.environ.get("OMP_NUM_THREADS"):
        log.warning(
            "OMP_NUM_THREADS=%s gives torch %d threads, but this process's cgroup allows it %.3g "
            "CPUs: threads beyond that are throttled, which slows training and scoring; set "
            "OMP_NUM_THREADS=%d",
            os.environ["OMP_NUM_THREADS"],
            threads,
            quota,
            allowed,
        )
        return threads
    torch.set_num_threads(allowed)
    log.info(
        "this process's cgroup allows it %.3g CPUs (a container's CPU limit): torch runs %d "
        "threads instead of %d, which the quota would throttle (OMP_NUM_THREADS=<n> chooses)",
        quota,
        allowed,
        threads,
    )
    return allowed
