"""How large a temporary score table may be on a CPU.

glibc's ``malloc`` serves a block under its mmap threshold (which grows with use up to 32 MiB on
64-bit Linux) from memory it keeps, but maps every larger block afresh from the kernel and frees
it back on release, so each new one faults in, zeroed, page by page. A loop that makes a new
(rows x items) table of scores at every step, such as the training's full softmax or scoring's
walk over the catalogue, then spends much of its time in the kernel once that table passes
32 MiB: a (25,600 x 3,400) loss step took 2.5-5.3x, and a 512-user batch's search over a
million items 1.6-1.7x, the time it takes in chunks (``python -m
benchmarks.allocation_benchmark``; benchmarks/README.md, "Training speed"). Such loops take
their chunk length from :func:`cpu_chunk_length`, which keeps each table under the threshold
on a CPU.

:func:`available_memory` says how much memory a process may still take, for checks that refuse
work which cannot fit (a training step over a large catalogue) before it starts.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

from recsys.cgroups import memory_room

MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX)
CHUNK_BYTES = 16 * 2**20  # what a chunk's table is cut down to
DEVICE_TABLE_BYTES = 2**30  # an accelerator's largest table where memory, not speed, bounds it


def cpu_chunk_length(
    length: int, unit_bytes: int, device: torch.device | str, *, minimum: int = 1
) -> int:
    """The chunk length to use instead of ``length`` (units of ``unit_bytes`` each: rows of
    logits, items of a score table): ``length`` itself off a CPU or when its table stays under
    ``MMAP_THRESHOLD_MAX``, else as many units as fit in ``CHUNK_BYTES``, at least ``minimum``
    (a very wide unit: few large chunks rather than very many small ones)."""
    if torch.device(device).type != "cpu" or length * unit_bytes < MMAP_THRESHOLD_MAX:
        return length
    return max(1, min(length, max(minimum, CHUNK_BYTES // max(unit_bytes, 1))))


def table_chunk_length(
    length: int, unit_bytes: int, device: torch.device | str, *, minimum: int = 1
) -> int:
    """The chunk length for a table that must stay bounded in memory wherever it is made (an
    evaluation batch's (rows x items) scores, whose size the catalogue sets): as
    :func:`cpu_chunk_length` on a CPU; on an accelerator as many units as fit in
    ``DEVICE_TABLE_BYTES``, at least ``minimum``."""
    if torch.device(device).type == "cpu":
        return cpu_chunk_length(length, unit_bytes, device, minimum=minimum)
    if length * unit_bytes <= DEVICE_TABLE_BYTES:
        return length
    return max(1, min(length, max(minimum, DEVICE_TABLE_BYTES // max(unit_bytes, 1))))


MEMINFO = Path("/proc/meminfo")
PROCESS_STATUS = Path("/proc/self/status")


def available_memory(device: torch.device | str) -> tuple[int, str] | None:
    """The bytes this process can still allocate on ``device``, and where that figure comes
    from; None where it is not known (an accelerator other than CUDA, a system without
    ``/proc``). On a GPU the free memory (``torch.cuda.mem_get_info``); on a CPU the least of
    the system's ``MemAvailable`` (``/proc/meminfo``: free memory plus the cache the kernel can
    reclaim; swap is not counted), the room left under the container's cgroup limit, and the
    room left under the process's address-space limit (``ulimit -v``, against its ``VmSize``)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), "free on the GPU (torch.cuda.mem_get_info)"
    if device.type != "cpu":
        return None
    known = []
    meminfo = _kib_fields(MEMINFO)
    if "MemAvailable" in meminfo:
        known.append((meminfo["MemAvailable"], f"MemAvailable in {MEMINFO}"))
    room = memory_room()  # a container's limit (it sees its host's /proc/meminfo)
    if room is not None:
        known.append((room[0], f"the cgroup limit in {room[1]}"))
    address_space, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _kib_fields(PROCESS_STATUS).get("VmSize")
    if address_space != resource.RLIM_INFINITY and size is not None:
        known.append((max(address_space - size, 0), "the address-space limit (ulimit -v)"))
    return min(known, default=None)


def _kib_fields(path: Path) -> dict[str, int]:
    """``/proc``'s ``Name:  123 kB`` lines, in bytes (other lines left out; {} without the
    file)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024
    return fields
