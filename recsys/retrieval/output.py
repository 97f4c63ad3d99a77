"""Resumable, atomic output of a scoring job.

A job writes into a hidden staging folder beside the target, ``.<name>.partial/``: one part per
user chunk (``part-00000.parquet``, and ``_csv/part-00000.csv`` when CSV is asked for: in a
``_`` folder, which Parquet readers skip, so ``pd.read_parquet(<name>)`` reads the folder), each
written to a temporary name and renamed, plus ``_manifest.json`` naming the job. When every part is
there, the folder is renamed to ``<name>/`` in one step, so a reader sees either nothing or
the whole output; never half of it.

A job killed mid-way and started again with the same model, data and settings (same manifest
key) finds its staging folder, skips the parts already written and writes the rest: parts are
deterministic, so the result is byte-identical to an uninterrupted run. A staged part of other
columns or types (written by other code) is written again, so every part has one schema. A
staging folder of a different job is discarded (and logged). An existing complete output of
the same job is left as it is; of another job, it is only replaced with
``retrieval.output.overwrite=true``. A path that holds anything but a scoring output (no
``_manifest.json``: a run folder, a file) is refused even then, so overwrite never deletes
what a scoring job did not write.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

import polars as pl

from recsys import code_version, locks

log = logging.getLogger(__name__)

FORMATS = ("parquet", "csv")
MANIFEST = "_manifest.json"


def job_key(job: dict) -> str:
    return hashlib.sha256(json.dumps(job, sort_keys=True, default=str).encode()).hexdigest()


# a temporary file of write_atomically: what a job killed outright (SIGKILL) leaves of a part
TEMPORARY_FILE = re.compile(r"\..+\.[0-9a-f]{32}")


def no_space_left(err: BaseException) -> bool:
    """Whether ``err`` is a full disk: ENOSPC from Python (errno) or from polars (its text)."""
    return getattr(err, "errno", None) == errno.ENOSPC or "os error 28" in str(err)


def write_atomically(path: str | Path, write) -> None:
    """``write(tmp)`` into a temporary file beside ``path`` (``tmp``: its path as text), then
    rename it to ``path``: a reader never sees a partial file, and a failed write leaves none
    behind. A full disk is an ``OSError`` (ENOSPC) naming ``path``: polars' own names no file.

    The temporary file is created as ``open()`` creates a file (mode 0666 less the process
    umask), not as ``tempfile.mkstemp`` does (0600, owner only), so the output can be read by
    whoever may read a file written in place (e.g. a downstream job under another account)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"  # (TEMPORARY_FILE)
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        write(str(tmp))
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if no_space_left(err):
            raise OSError(
                errno.ENOSPC,
                f"no space left on the device of {path.parent} while writing {path.name}: "
                "free space there, or write to a folder on a larger disk",
            ) from err
        raise


def _is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def check_formats(formats) -> list[str]:
    """``retrieval.output.formats`` as a list, refused unless it holds parquet and only
    known formats."""
    formats = [formats] if isinstance(formats, str) else list(formats)
    wrong = [f for f in formats if f not in FORMATS]
    if wrong or not formats or "parquet" not in formats:
        raise ValueError(
            f"retrieval.output.formats={formats}: parquet is always written; add csv "
            f"for CSV too (choices {list(FORMATS)})"
        )
    return formats


def check_output_path(path: str | Path) -> Path:
    """Refuse a ``retrieval.output.path`` that holds something other than a scoring output
    (no ``_manifest.json``: a run folder, a file, another job's data), which no scoring job
    writes into or replaces, even with ``retrieval.output.overwrite=true``. Needs no model, so
    the main job checks it before it trains. Returns the absolute path. A path under a file
    (``results.csv/recs``), where its folder could never be made, is refused too, and so is
    one whose folder cannot be written."""
    path = Path(path).expanduser().absolute()
    above = next(p for p in path.parents if p.exists())
    if not above.is_dir():
        raise NotADirectoryError(
            f"retrieval.output.path={path} lies under {above}, which is a file, not a folder: "
            "no folder can be made there; choose another retrieval.output.path"
        )
    # the output, its staging folder and its lock are made in the folder above it: a read-only
    # one (a mount, or permissions) failed only when the first part was written
    if not os.access(above, os.W_OK | os.X_OK):
        raise PermissionError(
            errno.EACCES,
            f"retrieval.output.path={path}: {above} cannot be written (a read-only mount, or "
            "its permissions), so the recommendations could not be saved there; choose a "
            "writable retrieval.output.path",
        )
    # an empty folder (made ahead for the job) holds nothing to lose: written into as if absent
    if path.exists() and not _is_empty_folder(path) and PartitionedOutput._key_of(path) is None:
        raise FileExistsError(
            f"{path} exists and is not a scoring output (no {MANIFEST}): "
            "retrieval.output.overwrite=true replaces only an earlier scoring job's "
            "output, so nothing there is deleted; choose another retrieval.output.path"
        )
    return path


def holds_output(path: str | Path) -> bool:
    """Whether ``path`` holds something (for a path that passed :func:`check_output_path`: an
    earlier scoring job's complete output), which a job of another model may only replace with
    ``retrieval.output.overwrite=true``."""
    path = Path(path).expanduser().absolute()
    return path.exists() and not _is_empty_folder(path)


class PartitionedOutput:
    def __init__(self, path: str | Path, *, formats, job: dict, overwrite: bool = False):
        formats = check_formats(formats)
        self.formats = formats
        # overwrite replaces (deletes) an earlier scoring output only, never a run folder,
        # the checkpoints or anything else that happens to be at the path
        self.path = check_output_path(path)
        self.staging = self.path.parent / f".{self.path.name}.partial"
        self.key = job_key(job)
        self.job = job
        self.complete = False
        self._lock_fd = None
        self._hold()
        try:
            self._open(overwrite)
        except BaseException:
            self.release()
            raise

    def _hold(self) -> None:
        """Hold ``.<name>.lock`` beside the output (an advisory ``flock``, gone with the
        process however it ends) until the output is committed or the job ends: a second job
        writing the same path meanwhile would discard or rename this one's staging folder
        under it, and fail deep inside with a bare FileNotFoundError. It is refused at once,
        naming the job that holds the path."""
        self._lock.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = locks.hold(
            self._lock,
            lambda holder: (
                f"retrieval.output.path={self.path} is being written by a scoring job running "
                f"now ({holder}): wait for it to end (the same job run again then finds its "
                "output complete), or give this job another retrieval.output.path"
            ),
        )

    @property
    def _lock(self) -> Path:
        return self.path.parent / f".{self.path.name}.lock"

    def release(self) -> None:
        """Let other jobs write the path (after :meth:`commit`, or when the job failed); the
        lock file goes, so nothing is left beside the output. Called again: nothing."""
        if self._lock_fd is None:
            return
        self._lock.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = None

    def _open(self, overwrite: bool) -> None:
        job = self.job
        if holds_output(self.path):
            if self._key_of(self.path) == self.key:
                log.info("%s already holds this job's complete output: nothing to do", self.path)
                self.complete = True
                return
            if not overwrite:
                raise FileExistsError(
                    f"{self.path} exists and holds another scoring job's output: choose another "
                    "retrieval.output.path or pass retrieval.output.overwrite=true"
                )
        if self.staging.exists() and self._key_of(self.staging) != self.key:
            log.warning("discarding %s: left by another scoring job", self.staging)
            shutil.rmtree(self.staging)
        if self.staging.exists():
            log.info("resuming %s (%d part(s) already written)", self.staging, self.parts_done())
            # the file a job killed outright was writing (it would end up in the output)
            for path in self.staging.rglob(".*"):
                if TEMPORARY_FILE.fullmatch(path.name) and path.is_file():
                    path.unlink()
        else:
            self.staging.mkdir(parents=True)
            write_atomically(
                self.staging / MANIFEST,
                lambda tmp: Path(tmp).write_text(
                    # the code that started it: not part of the key, so that an upgrade
                    # neither discards a killed job's parts nor makes its output another job's
                    json.dumps(
                        {"key": self.key, "job": job, "code": code_version()},
                        indent=2,
                        default=str,
                    )
                ),
            )

    @staticmethod
    def _key_of(folder: Path) -> str | None:
        try:
            return json.loads((folder / MANIFEST).read_text())["key"]
        except (OSError, ValueError, KeyError):
            return None

    def _part(self, index: int, file_format: str) -> Path:
        folder = self.staging if file_format == "parquet" else self.staging / f"_{file_format}"
        return folder / f"part-{index:05d}.{file_format}"

    def done(self, index: int) -> bool:
        return all(self._part(index, f).exists() for f in self.formats)

    def keep_parts_like(self, frame: pl.DataFrame) -> None:
        """Discard (with a warning) each staged part whose columns or types differ from
        ``frame``'s, what this job writes: parts left by other code (a job killed, recsys
        upgraded, the job started again, which resumes its parts) would otherwise end up in one
        output with parts of another schema, which a reader of the whole folder may not
        combine (``pl.scan_parquet`` refuses an Int64 column beside Int32 ones). The job
        writes them again."""
        for path in sorted(self.staging.glob("part-*.parquet")):
            try:
                written = dict(pl.read_parquet_schema(path))
            except (OSError, pl.exceptions.PolarsError):  # (not a Parquet file now)
                written = "unreadable"
            if written == dict(frame.schema):
                continue
            log.warning(
                "discarding %s and writing it again: it holds columns %s, and this job writes "
                "%s (a part left by other code)",
                path,
                written,
                dict(frame.schema),
            )
            for file_format in self.formats:
                self._part(int(path.stem.removeprefix("part-")), file_format).unlink(
                    missing_ok=True
                )

    def parts_done(self) -> int:
        return len(list(self.staging.glob("part-*.parquet")))

    def abandon(self) -> None:
        """A job that failed before writing any part: its staging folder, which holds nothing
        to resume, goes (one that holds parts stays, for the job run again to continue)."""
        if not self.complete and self.staging.exists() and not any(self.staging.rglob("part-*")):
            shutil.rmtree(self.staging)

    def write(self, index: int, frame: pl.DataFrame) -> None:
        for file_format in self.formats:
            path = self._part(index, file_format)
            path.parent.mkdir(exist_ok=True)
            if file_format == "parquet":
                write_atomically(path, lambda tmp: frame.write_parquet(tmp, statistics=False))
            else:
                write_atomically(path, lambda tmp: frame.write_csv(tmp))

    def scan(self) -> pl.LazyFrame:
        """All parts written so far (the staging folder; the final one once committed)."""
        folder = self.path if self.complete else self.staging
        return pl.scan_parquet(sorted(folder.glob("part-*.parquet")))

    def write_extra(self, name: str, write) -> Path:
        """A side file (summary, plots) inside the output: ``write(path)``."""
        path = self.staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, write)
        return self.path / name

    def commit(self) -> Path:
        """Make the output visible in one rename (an old one replaced by overwrite goes)."""
        if self.complete:
            return self.path
        old = self.path.parent / f".{self.path.name}.old"
        shutil.rmtree(old, ignore_errors=True)  # (also one a job killed in its commit left)
        if self.path.exists():
            os.replace(self.path, old)
        os.replace(self.staging, self.path)
        shutil.rmtree(old, ignore_errors=True)
        self.complete = True
        self.release()
        return self.path
