"""recsys.allocation: chunks that keep a CPU's score tables under glibc's mmap threshold."""

from __future__ import annotations

import torch

from recsys import allocation
from recsys.allocation import CHUNK_BYTES, MMAP_THRESHOLD_MAX, cpu_chunk_length
from recsys.retrieval.index import MIN_ITEM_CHUNK, ExactIndex


def test_a_table_under_the_threshold_or_off_the_cpu_keeps_its_length():
    assert cpu_chunk_length(1000, 4 * 1000, "cpu") == 1000  # 4 MB
    assert cpu_chunk_length(25_600, 4 * 3_400, "meta") == 25_600  # not a CPU
    assert cpu_chunk_length(25_600, 4 * 3_400, torch.device("meta")) == 25_600
    below = MMAP_THRESHOLD_MAX // 4 - 1
    assert cpu_chunk_length(below, 4, "cpu") == below


def test_a_larger_table_is_cut_to_the_chunk_bytes_but_not_below_the_minimum():
    assert cpu_chunk_length(MMAP_THRESHOLD_MAX // 4, 4, "cpu") == CHUNK_BYTES // 4  # at 32 MiB
    assert cpu_chunk_length(25_600, 4 * 3_400, "cpu") == CHUNK_BYTES // (4 * 3_400)  # 1,233
    assert cpu_chunk_length(65_536, 4 * 512, "cpu", minimum=1024) == 8192  # scoring's default
    assert cpu_chunk_length(6_400, 4 * 10**6, "cpu", minimum=256) == 256  # a huge catalogue
    assert cpu_chunk_length(6_400, 4 * 10**9, "cpu") == 1


def test_exact_search_on_a_cpu_scores_the_catalogue_in_cut_chunks_with_the_same_top_k(
    monkeypatch,
):
    torch.manual_seed(0)
    keys, bias = torch.randn(5000, 8), torch.randn(5000)
    blocked = torch.zeros(5000, dtype=torch.bool)
    blocked[:2] = True
    query, seen = torch.randn(6, 8), torch.randint(0, 5000, (6, 7))
    index = ExactIndex(keys, bias, blocked, item_chunk_size=4096)
    whole = index.search(query, 20, seen)
    widths = []
    real = torch.Tensor.__matmul__

    def spy(a, b):
        out = real(a, b)
        widths.append(out.shape[-1])
        return out

    monkeypatch.setattr(allocation, "MMAP_THRESHOLD_MAX", 6 * 4 * 4096)  # 6 users x 4,096 items
    monkeypatch.setattr(allocation, "CHUNK_BYTES", 6 * 4 * 1500)
    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    torch.testing.assert_close(index.search(query, 20, seen), whole)
    assert widths == [1500, 1500, 1500, 500]
    widths.clear()
    monkeypatch.setattr(allocation, "CHUNK_BYTES", 6 * 4 * 500)  # under the floor
    torch.testing.assert_close(index.search(query, 20, seen), whole)
    assert widths == [MIN_ITEM_CHUNK] * 4 + [5000 - 4 * MIN_ITEM_CHUNK]


def test_a_bounded_table_is_cut_as_on_a_cpu_there_and_to_a_gib_on_an_accelerator():
    from recsys.allocation import DEVICE_TABLE_BYTES, table_chunk_length

    assert table_chunk_length(512, 4 * 12_101, "cpu") == 512  # Beauty: 25 MB, one table
    assert table_chunk_length(512, 4 * 10**6, "cpu", minimum=16) == 16  # 1 M items
    # off a CPU (meta stands for an accelerator) only memory bounds it: 1 GiB
    assert table_chunk_length(512, 4 * 10**5, "meta") == 512  # 205 MB
    assert table_chunk_length(512, 4 * 10**6, "meta") == DEVICE_TABLE_BYTES // (4 * 10**6) == 268
    assert table_chunk_length(512, 4 * 10**9, "meta", minimum=16) == 16


def test_the_memory_available_is_the_least_of_the_system_the_cgroup_and_ulimit(
    tmp_path, monkeypatch
):
    """What a training step is checked against on a CPU: MemAvailable, the room under a
    container's cgroup limit (a container sees its host's /proc/meminfo) and under the
    address-space limit (``ulimit -v``), whichever is least, named."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n")
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmSize:\t 3000000 kB\n")
    limit = tmp_path / "memory.max"  # the cgroups' reading: tests/unit/test_cgroups.py
    room = None
    monkeypatch.setattr(allocation, "memory_room", lambda: room)
    monkeypatch.setattr(allocation, "MEMINFO", meminfo)
    monkeypatch.setattr(allocation, "PROCESS_STATUS", status)
    monkeypatch.setattr(allocation.resource, "getrlimit", lambda which: (-1, -1))
    monkeypatch.setattr(allocation.resource, "RLIM_INFINITY", -1)
    assert allocation.available_memory("cpu") == (20000000 * 1024, f"MemAvailable in {meminfo}")
    room = (6 * 2**30, limit)
    assert allocation.available_memory("cpu") == (6 * 2**30, f"the cgroup limit in {limit}")
    monkeypatch.setattr(allocation.resource, "getrlimit", lambda which: (4 * 2**30, -1))
    assert allocation.available_memory("cpu") == (
        4 * 2**30 - 3000000 * 1024,
        "the address-space limit (ulimit -v)",
    )
    monkeypatch.setattr(allocation, "MEMINFO", tmp_path / "absent")
    room = None
    monkeypatch.setattr(allocation, "PROCESS_STATUS", tmp_path / "absent")
    assert allocation.available_memory("cpu") is None  # not Linux: not known, not checked
    assert allocation.available_memory("meta") is None
