"""A container's CPU limit (a cgroup's CFS quota) caps torch's threads: torch starts one per
visible core, which the quota then throttles (recsys.cpus)."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys.cpus import cpu_quota, fit_threads_to_cpu_quota


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
    assert cpu_quota(tmp_path / "absent") is None  # another operating system


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
    with caplog.at_level(logging.INFO, logger="recsys.cpus"):
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
    with caplog.at_level(logging.INFO, logger="recsys.cpus"):
        assert fit_threads_to_cpu_quota(quota=2.0) == 3  # the user's choice is kept
    assert "OMP_NUM_THREADS=3 gives torch 3 threads" in caplog.text
    assert "set OMP_NUM_THREADS=2" in caplog.text
