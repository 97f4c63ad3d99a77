"""The scoring job's output folder: atomic parts, resumable staging, file permissions."""

import errno
import os
from pathlib import Path

import polars as pl
import pytest

from recsys.retrieval.output import PartitionedOutput, check_output_path, write_atomically


@pytest.fixture
def umask_027():
    """A umask other than the usual 022, so that the test sees the umask, not a constant."""
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def test_output_files_and_folders_get_the_permissions_of_the_umask(tmp_path, umask_027):
    """A reader under another account (group here) can read the output: files and folders
    get what open() and mkdir() give under the umask, not mkstemp's owner-only 0600."""
    output = PartitionedOutput(tmp_path / "out", formats=["parquet", "csv"], job={"job": 1})
    output.write(0, pl.DataFrame({"user_id": [1], "rank": [1]}))
    output.write_extra("_plots/sources.txt", lambda path: Path(path).write_text("plot"))
    folder = output.commit()
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == [
        "_csv/part-00000.csv",
        "_manifest.json",
        "_plots/sources.txt",
        "part-00000.parquet",
    ]
    for path in [folder, *folder.rglob("*")]:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask_027
        assert path.stat().st_mode & 0o777 == expected, path


def test_a_failed_write_leaves_no_file(tmp_path):
    def fail(tmp):
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(tmp_path / "part-00000.parquet", fail)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", ["polars", "python"])
def test_a_full_disk_names_the_file_and_says_so(tmp_path, error):
    """A part written onto a full disk: polars says "File out of specification: underlying IO
    error ... (os error 28)", naming no file; the job's error names the file and the disk, as
    an OSError whose errno is ENOSPC, and leaves no temporary file."""

    def full(tmp):
        Path(tmp).write_text("half")
        if error == "polars":
            raise pl.exceptions.ComputeError(
                "parquet: File out of specification: underlying IO error: No space left on "
                "device (os error 28)"
            )
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"no space left on the device of .*part-00000") as caught:
        write_atomically(tmp_path / "part-00000.parquet", full)
    assert caught.value.errno == errno.ENOSPC
    assert str(tmp_path) in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_overwrite_never_deletes_a_folder_that_is_not_a_scoring_output(tmp_path):
    """retrieval.output.overwrite=true replaces an earlier scoring output; a path that is
    something else (here a run folder with its checkpoint, or a file) is refused and kept."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_text("weights")
    stray = tmp_path / "notes.txt"
    stray.write_text("notes")
    for path in (run, stray):
        with pytest.raises(FileExistsError, match="not a scoring output"):
            PartitionedOutput(path, formats=["parquet"], job={"job": 2}, overwrite=True)
    assert (run / "checkpoints" / "best.ckpt").read_text() == "weights"
    assert stray.read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run"]  # no staging

    # an earlier scoring output is still replaced, and an empty folder is fine
    first = PartitionedOutput(tmp_path / "out", formats=["parquet"], job={"job": 1})
    first.write(0, pl.DataFrame({"user_id": [1], "rank": [1]}))
    first.commit()
    second = PartitionedOutput(
        tmp_path / "out", formats=["parquet"], job={"job": 2}, overwrite=True
    )
    second.write(0, pl.DataFrame({"user_id": [2], "rank": [1]}))
    assert pl.read_parquet(second.commit() / "part-00000.parquet")["user_id"].to_list() == [2]
    (tmp_path / "empty").mkdir()
    PartitionedOutput(tmp_path / "empty", formats=["parquet"], job={"job": 3}, overwrite=True)


def test_an_output_path_under_a_file_is_refused_before_any_work(tmp_path):
    """retrieval.output.path=<a file>/recs passed the check the main job makes before it
    trains; after the training and scoring, making its folder failed with a bare
    "FileExistsError: [Errno 17] File exists: '<the file>'". Now the check refuses it,
    naming the file, and nothing is written."""
    (tmp_path / "results.csv").write_text("user_id\n")
    with pytest.raises(NotADirectoryError, match=r"lies under .*results.csv, which is a file"):
        check_output_path(tmp_path / "results.csv" / "day" / "recs")
    with pytest.raises(NotADirectoryError, match="which is a file"):
        PartitionedOutput(tmp_path / "results.csv" / "recs", formats=["parquet"], job={"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_an_empty_folder_at_the_output_path_is_written_into_without_overwrite(tmp_path):
    # a folder made ahead for the job holds no other job's output: nothing to refuse or lose
    (tmp_path / "out").mkdir()
    output = PartitionedOutput(tmp_path / "out", formats=["parquet"], job={"job": 1})
    output.write(0, pl.DataFrame({"user_id": [1], "rank": [1]}))
    assert pl.read_parquet(output.commit() / "part-00000.parquet")["user_id"].to_list() == [1]


@pytest.mark.skipif(os.name == "nt", reason="no advisory locks on Windows")
@pytest.mark.parametrize("other_job", [{"model": "a"}, {"model": "b"}])
def test_a_second_job_on_an_output_path_being_written_is_refused(tmp_path, other_job):
    """Two scoring jobs writing one retrieval.output.path at once (a scheduler starting the
    same command twice): the second discarded or renamed the first's staging folder under it,
    and one failed deep inside with a bare FileNotFoundError. Now the second is refused at
    once, naming the path and the job holding it; the first completes, and after it the path
    is free again, with no lock file left beside it."""
    frame = pl.DataFrame({"user_id": [1], "item_id": [2]})
    first = PartitionedOutput(tmp_path / "recs", formats=["parquet"], job={"model": "a"})
    first.write(0, frame)
    with pytest.raises(FileExistsError, match=r"recs is being written by a scoring job .*process"):
        PartitionedOutput(tmp_path / "recs", formats=["parquet"], job=other_job)
    first.commit()  # (which lets the path go)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs"]
    again = PartitionedOutput(tmp_path / "recs", formats=["parquet"], job={"model": "a"})
    assert again.complete
    again.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs"]


def test_what_a_job_killed_outright_left_does_not_end_up_in_the_output(tmp_path):
    """SIGKILL runs no cleanup: the temporary file of the part being written stayed in the
    staging folder, and the job run again committed it into the output beside the parts
    (".part-00001.parquet.<hex>", half a part); a kill between the commit's two renames left
    the earlier output in ".out.old" for good. Both go when the job runs again."""
    job = {"job": 1}
    frame = pl.DataFrame({"user_id": [1], "rank": [1]})
    first = PartitionedOutput(tmp_path / "out", formats=["parquet", "csv"], job=job)
    first.write(0, frame)
    first.release()  # killed while writing part 1 (and an earlier commit of another job)
    (first.staging / f".part-00001.parquet.{'a' * 32}").write_text("half a part")
    (first.staging / "_csv" / f".part-00001.csv.{'b' * 32}").write_text("half a part")
    (tmp_path / ".out.old").mkdir()
    (tmp_path / ".out.old" / "part-00000.parquet").write_text("an earlier output")

    again = PartitionedOutput(tmp_path / "out", formats=["parquet", "csv"], job=job)
    assert again.done(0) and not again.done(1)
    again.write(1, frame)
    folder = again.commit()
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == [
        "_csv/part-00000.csv",
        "_csv/part-00001.csv",
        "_manifest.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
