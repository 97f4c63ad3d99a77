"""The advisory locks (recsys.locks) on a filesystem that refuses them."""

from __future__ import annotations

import errno
import logging
import os

import polars as pl
import pytest
from omegaconf import OmegaConf

from recsys import locks

pytestmark = pytest.mark.skipif(not locks.AVAILABLE, reason="no advisory locks on Windows")


@pytest.fixture
def refused(monkeypatch):
    """flock as on an NFS mount without its lock service (some CIFS / FUSE mounts: EOPNOTSUPP)."""

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", flock)
    monkeypatch.setattr(locks, "_warned", set(), raising=False)


def test_a_preparation_on_a_filesystem_without_locks_is_not_refused(tmp_path, refused, caplog):
    """flock's ENOLCK ended every preparation at once in a bare "OSError: [Errno 37] No locks
    available", its staging folder left beside the output. Now nothing is held there, as on
    Windows, with one warning naming the path; the dataset is in place, nothing else."""
    from recsys.data.pipeline import _staging

    with caplog.at_level(logging.WARNING, logger="recsys.locks"), _staging(tmp_path / "out") as s:
        (s / "stats.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / "stats.json").is_file()
    (warning,) = caplog.messages
    assert str(tmp_path) in warning and "has no advisory locks (No locks available)" in warning


def test_an_error_taking_the_staging_folders_lock_leaves_no_staging_folder(tmp_path, monkeypatch):
    from recsys.data.pipeline import _staging

    def flock(fd, operation):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(locks.fcntl, "flock", flock)
    with pytest.raises(OSError, match="Input/output error"), _staging(tmp_path / "sub" / "out"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_scoring_output_training_and_the_store_work_without_locks(tmp_path, refused, caplog):
    """The scoring output's, the run folder's and the sqlite store's locks likewise: the job
    goes on unheld (before: the same bare OSError, and a .<name>.lock left beside the
    output), warned once for the filesystem, and leaves no lock file."""
    from recsys.retrieval.output import PartitionedOutput
    from recsys.tasks.train import hold_run_folder
    from recsys.tracking import store_lock

    with caplog.at_level(logging.WARNING, logger="recsys.locks"):
        output = PartitionedOutput(tmp_path / "recs", formats=["parquet"], job={"model": "a"})
        output.write(0, pl.DataFrame({"user_id": [1], "item_id": [2]}))
        output.commit()
        with hold_run_folder(OmegaConf.create({"paths": {"run_dir": str(tmp_path / "run")}})):
            (tmp_path / "run" / "last.ckpt").write_text("x")
        with store_lock(f"sqlite:///{tmp_path / 'mlflow.db'}"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db.lock", "recs", "run"]
    assert os.listdir(tmp_path / "run") == ["last.ckpt"]
    assert len(caplog.messages) == 1  # one filesystem, one warning


def test_a_staging_folder_renamed_into_place_meanwhile_is_not_taken_for_a_leftover(
    tmp_path, monkeypatch
):
    """A preparation's sweep for killed jobs' staging folders opened one, and its job renamed
    it into place and let it go before the sweep took the lock: the sweep then listed the old
    path and raised FileNotFoundError, failing a preparation that ran beside another into the
    same folder (tests/unit/data/test_pipeline.py's four preparations at once, now and then)."""
    staging, done = tmp_path / ".out.0123", tmp_path / "out"
    staging.mkdir()
    (staging / "stats.json").write_text("{}")
    take = locks.flock

    def finished_meanwhile(fd, operation, path):
        staging.rename(done)  # its job's swap, between the sweep's open and its lock
        return take(fd, operation, path)

    monkeypatch.setattr(locks, "flock", finished_meanwhile)
    assert locks.remove_if_abandoned(staging) is False
    assert (done / "stats.json").read_text() == "{}"


def test_a_lock_is_taken_as_abandoned_only_when_there_and_held_by_no_one(tmp_path):
    """take_abandoned: a lock file whose holder ended without removing it (killed outright)
    is taken; a held one, or none, is not."""
    lock = tmp_path / "run.lock"
    assert locks.take_abandoned(lock) is None  # no lock file: nothing known
    fd = locks.hold(lock, str)
    assert locks.take_abandoned(lock) is None  # held by a running holder
    os.close(fd)  # its holder gone, the file left
    taken = locks.take_abandoned(lock)
    assert taken is not None
    os.close(taken)


def test_a_run_tracked_without_locks_is_not_taken_for_one_left_by_a_killed_job(
    tmp_path, refused, monkeypatch
):
    """Where there are no locks a running job's run is not told from a killed one's: the run
    names its holder but no lock, leaves no lock file, and a later job leaves it RUNNING."""
    from recsys.tracking import Tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(tracking_uri=uri, experiment_name="e")
    Tracker(tracking_uri=uri, experiment_name="e").finish()
    run = first.client.get_run(first.run_id)
    assert run.info.status == "RUNNING" and "recsys.holder.lock" not in run.data.tags
    assert run.data.tags["recsys.holder"] == f"process {os.getpid()} on {os.uname().nodename}"
    assert not (tmp_path / "mlflow.db.runs").exists() or not os.listdir(tmp_path / "mlflow.db.runs")
