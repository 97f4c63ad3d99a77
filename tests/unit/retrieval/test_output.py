"""The scoring job's output folder: atomic parts, resumable staging, file permissions."""

import os
from pathlib import Path

import polars as pl
import pytest

from recsys.retrieval.output import PartitionedOutput, write_atomically


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
