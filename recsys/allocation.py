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
"""

from __future__ import annotations

import torch

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
