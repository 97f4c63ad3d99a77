"""What a container's cgroups allow (recsys.cgroups): its CPU limit (a CFS quota) caps torch's
threads (torch starts one per visible core, which the quota then throttles), and its memory
limit bounds what a training step may take (recsys.allocation.available_memory)."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys.cgroups import cpu_quota, fit_threads_to_cpu_quota, memory_room


def fake_proc(tmp_path, cgroup: str, mountinfo: list[str], files: dict[str, str]):
    """A /proc/self with ``cgroup`` and ``mountinfo``, and cgroup files under ``tmp_path``
    (``files``: path relative to tmp_path -> content)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("\n".join(line.format(tmp=tmp_path) for line in mountinfo))
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    return proc


V2_MOUNT = "30 25 0:26 / {tmp}/cg rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"
V1_MOUNT = "31 25 0:27 {root} {tmp}/cpu rw,nosuid - cgroup cgroup rw,cpu,cpuacct"


def test_cgroup_v2_quota_of_the_process_or_a_parent(tmp_path):
    # a container with its own cgroup namespace: its cgroup is the mount's root
    proc = fake_proc(tmp_path, "0::/\n", [V2_MOUNT], {"cg/cpu.max": "150000 100000\n"})
    assert cpu_quota(proc) == 1.5
    # a job in a child cgroup of a limited one (a systemd slice): the smallest along the way
    other = tmp_path / "nested"
    other.mkdir()
    files = {"cg/job.slice/cpu.max": "max 100000\n", "cg/cpu.max": "200000 100000\n"}
    proc = fake_proc(other, "0::/job.slice\n", [V2_MOUNT], files)
    assert cpu_quota(proc) == 2.0


def test_cgroup_v1_quota_through_the_mount_root(tmp_path):
    # docker without a cgroup namespace: the membership names /docker/<id>, which the
    # container sees mounted as its own root
    mount = V1_MOUNT.replace("{root}", "/docker/abc")
    files = {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    proc = fake_proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n0::/\n", [mount], files)
    assert cpu_quota(proc) == 0.5


def test_no_quota_or_no_cgroups(tmp_path):
    files = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    mount = V1_MOUNT.replace("{root}", "/")
    proc = fake_proc(tmp_path, "4:cpu,cpuacct:/\n", [mount, V2_MOUNT], files)
    assert cpu_quota(proc) is None  # -1: unlimited; and no cpu.max in the v2 hierarchy
    # lines of another shape are passed over, not a failure at every job's start
    odd = tmp_path / "odd"
    odd.mkdir()
    files = {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    files |= {"cpu/a/cpu.cfs_quota_us": "50000\n", "cpu/a/cpu.cfs_period_us": "0\n"}
    lines = [mount, "40 25 0:30 / /x rw - ", "41 25 0:31 / /y rw"]
    proc = fake_proc(odd, "garbage\n4:cpu,cpuacct:/a\n", lines, files)
    assert cpu_quota(proc) == 0.5
    assert cpu_quota(tmp_path / "absent") is None  # another operating system


def test_memory_room_is_the_least_limit_less_usage_along_the_cgroups(tmp_path):
    v2 = "30 25 0:26 / {tmp}/cg rw - cgroup2 cgroup2 rw"
    files = {
        "cg/job.slice/memory.max": f"{8 * 2**30}\n",
        "cg/job.slice/memory.current": f"{2 * 2**30}\n",
        "cg/memory.max": f"{16 * 2**30}\n",
        "cg/memory.current": f"{12 * 2**30}\n",  # the parent's other jobs use more
    }
    proc = fake_proc(tmp_path, "0::/job.slice\n", [v2], files)
    assert memory_room(proc) == (4 * 2**30, tmp_path / "cg" / "memory.max")
    # v1, a process in a child cgroup; v1's "no limit" is a huge number
    other = tmp_path / "v1"
    other.mkdir()
    v1 = "31 25 0:27 / {tmp}/memory rw - cgroup cgroup rw,memory"
    files = {
        "memory/app/memory.limit_in_bytes": f"{2**30}\n",
        "memory/app/memory.usage_in_bytes": f"{2**28}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/memory.usage_in_bytes": "5\n",
    }
    proc = fake_proc(other, "5:memory:/app\n", [v1], files)
    assert memory_room(proc) == (2**30 - 2**28, other / "memory" / "app" / "memory.limit_in_bytes")
    assert memory_room(tmp_path / "absent") is None


@pytest.fixture
def torch_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_torch_threads_cut_to_the_quota_unless_omp_num_threads_says(
    torch_threads, monkeypatch, caplog
):
    with caplog.at_level(logging.INFO, logger="recsys.cgroups"):
        assert fit_threads_to_cpu_quota(quota=1.5) == 1
    assert torch.get_num_threads() == 1
    assert (
        "allows it 1.5 CPUs" in caplog.text and "torch runs 1 threads instead of 3" in caplog.text
    )
    torch.set_num_threads(3)
    assert fit_threads_to_cpu_quota(quota=4.0) == 3  # under the quota: as it is
    assert fit_threads_to_cpu_quota(quota=0.2) == 1  # at least one
    torch.set_num_threads(3)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="recsys.cgroups"):
        assert fit_threads_to_cpu_quota(quota=2.0) == 3  # the user's choice is kept
    assert "OMP_NUM_THREADS=3 gives torch 3 threads" in caplog.text
    assert "set OMP_NUM_THREADS=2" in caplog.text
