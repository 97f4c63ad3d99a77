"""Event log -> prepared dataset folder: the data layer end to end, in bounded memory.

Stages (each a streaming pass or a loop over user partitions; nothing holds the whole log)::

    scan_events -> normalize -> classify          stream, sink into user-hash partitions
    bad-row policy (error | drop)                 counts; errors stop here, nothing written
    per partition: set bad rows aside, sort, find repeats, clip to the time window, then
      [k-core membership                          iterative, one streaming pass per round;
                                                  only with min_item_events > 1]
      user filter / k-core, keep last N per user, sessionize
      [positional split: the training window's item counts, for the vocabulary]
    temporal cut times                            one column, streamed
    vocab.fit(training window only)               streamed aggregates
    per partition: encode, one row per user       -> sequences.parquet
      (lists and split positions in one group-by)
    quarantine.parquet, vocabularies, stats.json

A log of at most ``partition_rows`` events is one partition, and its stages pass frames in
memory (no work files); a longer log streams through Parquet work files, one partition at a
time. Rows are routed to a partition by a hash of the user id, so every per-user step (sorting,
dedupe, truncation, sessions, splits) sees all of a user's events while holding only about
``partition_rows`` events in memory. Global steps (bad-row counts, k-core, cut times,
vocabulary) are polars streaming aggregations whose size is the number of users or items.

The folder is built in a temporary sibling and renamed into place at the end, so a failed or
interrupted run never leaves a partial dataset (or a partial quarantine file) behind.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from recsys import locks
from recsys.data import transforms
from recsys.data.io import (
    SIDE_BY_SIDE,
    DataError,
    EventSource,
    describe_source,
    read_side_by_side,
    row_locator,
    scan_events,
    scan_items,
    source_path,
)
from recsys.data.sequences import BEHAVIORS, ITEMS, TimeBuckets, build_sequences
from recsys.data.split import (
    TEST_START,
    TEST_TARGET,
    TRAIN_END,
    VAL_TARGET,
    SplitPoints,
    SplitSettings,
    split_aggregations,
    temporal_cuts,
    training_events,
    with_windows,
)
from recsys.data.transforms import SESSION_INDEX
from recsys.data.validate import (
    LOCAL,
    PROBLEM,
    PROBLEM_KINDS,
    RAW_EVENT_TYPE,
    RAW_TIMESTAMP,
    ROW,
    BadRowPolicy,
    attribute_list,
    attribute_sets,
    canonical_ids,
    check_number,
    classify,
    enforce,
    log_summary,
    normalize,
    parse_instant,
    problem_summary,
    raw_as_text,
    refuse_separator_inside,
    separator_inside,
    single_text_side,
    tidy_keys,
    timestamp_expr,
)
from recsys.data.vocab import FILES as VOCAB_FILES
from recsys.data.vocab import ITEM_INDEX, Vocab, count_pairs
from recsys.retrieval.output import no_space_left
from recsys.schema import (
    ATTRIBUTES,
    CATEGORY,
    EVENT_TYPE,
    ITEM,
    NUM_RESERVED,
    SESSION,
    TIMESTAMP,
    UNK_IDX,
    USER,
    EventSchema,
)

log = logging.getLogger(__name__)

SEQUENCES_FILE = "sequences.parquet"
STATS_FILE = "stats.json"
QUARANTINE_FILE = "quarantine.parquet"
# The prepared folder's format: its files, their columns and types, what stats.json holds and
# how the log's values become them (id types, text, the fingerprint). Raised with any change
# after which a folder prepared before it would be read otherwise: load_stats refuses a folder
# of another format (or of none: prepared before the format was recorded) by name.
FORMAT_VERSION = 1
# everything a prepared folder holds: the only files a new preparation may replace
PREPARED_FILES = frozenset({SEQUENCES_FILE, STATS_FILE, QUARANTINE_FILE, *VOCAB_FILES.values()})
_HASH = "_hash"
_PART = "_part"
_HASH_PRIME = 0x100000001B3  # FNV-1a's 64-bit prime: odd, so the chain loses no information
DEFAULT_ITEM_COLUMNS = {ITEM: ITEM, CATEGORY: None, ATTRIBUTES: ATTRIBUTES}


@dataclass(frozen=True)
class PrepareSettings:
    """Every option that shapes the prepared data (the ``data`` config group minus the source
    and its columns). See ``conf/data/base.yaml`` for each option's meaning."""

    split: SplitSettings = field(default_factory=SplitSettings)
    time_buckets: TimeBuckets = field(default_factory=TimeBuckets)
    bad_rows: BadRowPolicy = field(default_factory=BadRowPolicy)
    as_of: datetime | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    min_user_events: int = 2
    min_item_events: int = 1
    max_user_events: int | None = None
    session_gap_seconds: float | None = None
    min_item_count: int = 1
    max_item_attributes: int = 32
    partition_rows: int = 16_000_000

    def __post_init__(self) -> None:
        for name, minimum in (
            ("min_user_events", 1),
            ("min_item_events", 1),
            ("min_item_count", 1),
            ("max_item_attributes", 1),
            ("partition_rows", 1_000),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"data.{name}={value!r} must be an integer >= {minimum}")
        if self.max_user_events is not None and (
            isinstance(self.max_user_events, bool)
            or not isinstance(self.max_user_events, int)
            or self.max_user_events < self.min_user_events
        ):
            raise ValueError(
                f"data.max_user_events={self.max_user_events!r} must be an integer >= "
                f"data.min_user_events={self.min_user_events} (or null to keep every event)"
            )
        if self.session_gap_seconds is not None:
            check_number("data.session_gap_seconds", self.session_gap_seconds)
        if self.session_gap_seconds is not None and not self.session_gap_seconds > 0:
            raise ValueError(
                f"data.session_gap_seconds={self.session_gap_seconds} must be > 0 (or null)"
            )
        if self.session_gap_seconds is not None:  # 1800 and 1800.0: one fingerprint
            object.__setattr__(self, "session_gap_seconds", float(self.session_gap_seconds))
        if self.window_start and self.window_end and self.window_start >= self.window_end:
            raise ValueError(
                f"data.window.start={self.window_start.isoformat()} is not before "
                f"data.window.end={self.window_end.isoformat()}"
            )

    def to_dict(self) -> dict:
        plain = asdict(self)
        for key in ("as_of", "window_start", "window_end"):
            plain[key] = None if plain[key] is None else plain[key].isoformat()
        return plain


# -- the in-memory path (scoring, notebooks) ----------------------------------------------------
def load_events(
    source: EventSource,
    schema: EventSchema,
    *,
    bad_rows: BadRowPolicy | None = None,
    as_of: datetime | None = None,
    name: str | None = None,
) -> pl.DataFrame:
    """Read, type and check a (small enough) event log in memory with the same rules as
    :func:`prepare_dataset`: ``error`` kinds raise :class:`DataError`; ``drop`` kinds are
    removed and counted in a warning. The repeats of an identical event (``duplicate``, found
    among the good rows as preparation finds them) are refused or counted by that policy, but
    kept: callers dedupe (so the log's fingerprint is the one its rows give). Columns:
    ``user_id, item_id, timestamp, event_type, attributes`` (+ ``session_id``). Messages name
    the log ``name`` (e.g. the loader call that made a frame; else :func:`describe_source`)."""
    policy = bad_rows or BadRowPolicy()
    name = name or describe_source(source)
    lf = scan_events(source, schema, name=name).with_row_index(ROW)
    if checks := separator_inside(lf.collect_schema(), schema.attribute_separator):
        found = _collect(lf.select(checks), name).row(0, named=True)
        refuse_separator_inside(found, _side_option(schema), name)
    as_of = as_of or datetime.now(UTC)
    classified = _collect(
        lf.pipe(normalize, schema=schema).pipe(classify, as_of=as_of), name
    ).lazy()
    counts = problem_summary(classified)
    clean = classified.filter(pl.col(PROBLEM).is_null()).collect(engine=LOCAL)
    ordered = transforms.in_event_order(clean)
    repeats = ordered.filter(~transforms.first_occurrence(ordered))
    if repeats.height:
        counts["duplicate"] = repeats.height
    enforce(
        counts,
        policy,
        source_name=name,
        examples=pl.concat(
            [classified, repeats.lazy().with_columns(pl.lit("duplicate").alias(PROBLEM))]
        ),
        schema=schema,
        as_of=as_of,
        locator=partial(row_locator, source, schema),
    )
    log_summary(counts, source_name=name)
    if clean.height == 0 and any(counts.values()):
        bad = {kind: count for kind, count in counts.items() if count}
        raise DataError(
            f"{name}: no events left after setting aside bad rows {bad} (data.bad_rows): fix "
            "those rows, or score a log with good ones"
        )
    if clean.height == 0:
        raise DataError(f"{name} has no rows: export a non-empty event log")
    if any(counts.values()):
        _warn_of_users_set_aside(classified, clean, name)
    return (
        tidy_keys(clean)
        .drop(ROW, PROBLEM, RAW_TIMESTAMP, RAW_EVENT_TYPE)
        .with_columns(pl.col(EVENT_TYPE).cast(pl.String), attribute_sets(pl.col(ATTRIBUTES)))
    )


def _warn_of_users_set_aside(classified: pl.LazyFrame, clean: pl.DataFrame, name: str) -> None:
    """Name the users whose every row a ``drop`` policy set aside: they have no history left,
    so they get no list (the bad rows themselves are counted by :func:`log_summary`)."""
    set_aside = (
        classified.filter(pl.col(PROBLEM).is_not_null() & pl.col(USER).is_not_null())
        .select(USER)
        .unique(maintain_order=True)
        .join(clean.lazy().select(USER).unique(), on=USER, how="anti", maintain_order="left")
        .collect(engine=LOCAL)[USER]
    )
    if set_aside.len():
        log.warning(
            "%s: %d user(s) had every row set aside by data.bad_rows, so they get no list "
            "(e.g. %s): fix their rows, or policy error to stop on them",
            name,
            set_aside.len(),
            ", ".join(str(user) for user in set_aside.head(5).to_list()),
        )


def _side_option(schema: EventSchema) -> str:
    """The log's category or attribute column and its setting, for messages."""
    side = ATTRIBUTES if schema.has(ATTRIBUTES) else CATEGORY
    return f"column {schema.columns.get(side)!r} (data.columns.{side})"


def _collect(lf: pl.LazyFrame, name: str) -> pl.DataFrame:
    try:
        return lf.collect(engine="streaming")
    except pl.exceptions.PolarsError as err:
        raise DataError(f"{name} could not be read: {err}") from err


# -- the prepared folder -----------------------------------------------------------------------
def check_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` that a preparation would replace at a loss: a file, or a folder
    holding anything but a prepared dataset (a raw log, a notebook, another tool's output).
    An empty folder, or one an earlier preparation wrote, is fine."""
    # one look at the path: another preparation may replace the folder between two
    try:
        is_folder = stat.S_ISDIR(out_dir.stat().st_mode)
    except FileNotFoundError:
        return
    if not is_folder:
        raise DataError(f"output folder {out_dir} is a file: choose a folder path")
    try:
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in PREPARED_FILES)
    except (FileNotFoundError, NotADirectoryError):  # absent (or gone meanwhile)
        return
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        shown = ", ".join(foreign[:5]) + more
        raise DataError(
            f"output folder {out_dir} holds {shown}, which is not part of a prepared dataset; "
            "preparing replaces the whole folder, so recsys replaces only an empty folder or one "
            "it prepared: choose a new folder (e.g. a subfolder) for the prepared data"
        )


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM (a scheduler's kill) as ``SystemExit(143)`` meanwhile, so that cleanup code
    runs (by default SIGTERM ends the process at once, leaving the staging folder and its work
    files behind, and an MLflow run marked running or finished). Only where that default is in
    place, in the main thread: a handler the application set is left alone. Every pipeline
    runs under it (:func:`recsys.config.failure_logged`), preparation in a notebook too."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def exit_on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """A temporary sibling of ``out_dir`` that replaces it on success and vanishes on failure
    (a SIGTERM included: see :func:`terminate_as_exit`)."""
    with terminate_as_exit():
        yield from _staged(out_dir)


def _staged(out_dir: Path) -> Iterator[Path]:
    check_out_dir(out_dir)
    created = next((p for p in reversed(out_dir.parents) if not p.exists()), None)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out_dir)
    # mkdir, not mkdtemp: the folder gets the permissions of any new folder (mkdtemp's: 0700)
    tmp = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex}"
    tmp.mkdir()
    held = None
    try:
        held = locks.hold_folder(tmp)  # a killed job's staging folder is told from a running one's
        yield tmp
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created is not None:  # folders made for this run only: leave no trace
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        if held is not None:
            os.close(held)


def _remove_abandoned(out_dir: Path) -> None:
    """Delete what a killed preparation into ``out_dir`` left beside it (SIGKILL, a power cut:
    no cleanup of its own ran), which nothing else would ever remove: its staging folder
    (``.<name>.<hex>``, the dataset so far and its work files) once no process holds it, and
    an earlier dataset it had moved aside to delete (``.<name>.old-<hex>``)."""
    leftover = re.compile(rf"\.{re.escape(out_dir.name)}\.(old-)?[0-9a-f]{{32}}")
    for path in out_dir.parent.iterdir():
        match = leftover.fullmatch(path.name)
        if match is None or not path.is_dir():
            continue
        if match.group(1):  # only ever deleted: by its own job too, meanwhile, so no warning
            shutil.rmtree(path, ignore_errors=True)  # (a running job's swap may be deleting it)
        elif locks.remove_if_abandoned(path):
            log.warning("removed %s, left by a preparation into %s that was killed", path, out_dir)


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``, moving an earlier ``out_dir`` aside (and deleting it)
    first. Two preparations into one folder at once (a scheduler starting the same command
    twice) may each find the other's folder there, or find it gone: each moves aside whatever
    is there and tries again, so both succeed and the last one's dataset stays, instead of one
    failing with a bare ``OSError`` and leaving an ``.old`` folder behind."""
    for _ in range(100):
        try:
            tmp.rename(out_dir)  # (replaces an empty folder)
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex}")
        try:
            out_dir.rename(old)
        except FileNotFoundError:  # another job moved it aside meanwhile
            continue
        shutil.rmtree(old, ignore_errors=True)
    raise OSError(
        f"could not move the prepared dataset into {out_dir}: other jobs kept replacing it; "
        "give each job its own output folder"
    )


class _Stopwatch:
    """Seconds per pipeline stage, logged at INFO (not in ``stats.json``, which describes the
    data and stays identical across runs of the same job)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + now - self._last, 3)
        self._last = now


class _Partitions:
    """The per-user partitions of one preparation run and each stage's frames.

    Rows go to one of ``count`` partitions by a hash of the user id. With one partition (the
    log fits in ``partition_rows``) every stage's frame stays in memory; with more, each
    stage's frames are Parquet work files under ``work`` and only one partition is in memory
    at a time.
    """

    def __init__(self, work: Path, count: int) -> None:
        self.work = work
        self.count = count
        self.in_memory = count == 1
        # a whole-log query on frames in memory runs faster in the in-memory engine
        self.engine = LOCAL if self.in_memory else "streaming"
        self._frames: dict[tuple[str, int], pl.DataFrame] = {}

    def distribute(self, typed: pl.LazyFrame, stage: str) -> None:
        """Route ``typed``'s rows into the partitions of ``stage`` (one streaming pass)."""
        if self.in_memory:
            # streaming even here: it holds only the typed columns, not the file's columns
            # beside them (10 M events: 0.65 s and 0.7 GiB peak, in-memory 1.1 s and 1.45 GiB)
            self._frames[stage, 0] = typed.collect(engine="streaming", optimizations=SIDE_BY_SIDE)
            return
        typed.with_columns((pl.col(USER).hash(seed=1) % self.count).alias(_PART)).sink_parquet(
            pl.PartitionBy(self.work / stage, key=_PART, include_key=False),
            mkdir=True,
            compression="lz4",
            optimizations=SIDE_BY_SIDE,
        )

    def _files(self, stage: str, index: int) -> list[Path]:
        folder = self.work / stage
        if (folder / f"{_PART}={index}").is_dir():  # written by distribute()
            return sorted((folder / f"{_PART}={index}").glob("*.parquet"))
        path = folder / f"part-{index:05d}.parquet"
        return [path] if path.exists() else []

    def write(self, frame: pl.DataFrame, stage: str, index: int) -> None:
        if self.in_memory:
            # one chunk, as a work file reads back: polars' streaming rle (the positional
            # split's transforms.position_in_user) panics on a frame of several, which
            # polars 1.x's in-memory engine can hand back (a no-op on a frame of one)
            self._frames[stage, index] = frame.rechunk()
            return
        (self.work / stage).mkdir(parents=True, exist_ok=True)
        # work files are read once and deleted: fast compression beats small files; one row
        # group reads back as one chunk (see transforms.in_event_order for why that matters)
        frame.write_parquet(
            self.work / stage / f"part-{index:05d}.parquet",
            compression="lz4",
            row_group_size=max(1, frame.height),
        )

    def read(self, stage: str, index: int) -> pl.DataFrame:
        if self.in_memory:
            return self._frames[stage, index]
        files = self._files(stage, index)
        # a partition no user hashed to: an empty frame with the stage's columns
        return pl.read_parquet(files) if files else self.scan(stage).head(0).collect(engine=LOCAL)

    def scan(self, stage: str) -> pl.LazyFrame:
        if self.in_memory:
            return self._frames[stage, 0].lazy()
        return pl.scan_parquet(self.work / stage / "**" / "*.parquet")

    def drop(self, stage: str) -> None:
        if self.in_memory:
            self._frames.pop((stage, 0), None)
        else:
            shutil.rmtree(self.work / stage, ignore_errors=True)

    def map(self, desc: str, fn: Callable[[int], None]) -> None:
        for index in tqdm(range(self.count), desc=desc, unit="part", disable=self.count == 1):
            fn(index)


def prepare_dataset(
    source: EventSource,
    *,
    schema: EventSchema,
    settings: PrepareSettings,
    out_dir: str | Path,
    items: EventSource | None = None,
    item_columns: Mapping[str, str | None] | None = None,
    source_name: str | None = None,
    items_name: str | None = None,
) -> tuple[dict, Vocab]:
    """Prepare ``source`` into ``out_dir`` (replacing an earlier prepared dataset there; any
    other folder content is refused, see :func:`check_out_dir`) and return its statistics
    (what ``stats.json`` holds) and the vocabulary written there, so that a caller need not
    read back what was just written.

    ``items`` is an optional item side table (``item_columns`` maps its ``item_id`` and
    ``category`` / ``attributes`` columns). ``source_name`` and ``items_name`` name an
    in-memory source and item table in messages and ``stats.json`` (e.g. the file a loader
    read). Raises :class:`DataError` for
    bad input and ``ValueError`` for settings that cannot work with this log; either way
    nothing is written.
    """
    out_dir = Path(out_dir).expanduser()
    name = source_name or describe_source(source)
    targets = settings.split.target_behaviors
    if targets and not set(targets) <= set(schema.behaviors):
        raise ValueError(
            f"data.split.target_behaviors={list(targets)} names "
            f"{sorted(set(targets) - set(schema.behaviors))}, not among data.behaviors="
            f"{list(schema.behaviors)}: name target behaviours from that list"
        )
    if (
        isinstance(source, (str, os.PathLike))
        and source_path(source).is_dir()
        and out_dir.resolve().is_relative_to(source_path(source).resolve())
    ):
        raise DataError(
            f"output folder {out_dir} is inside the event log's folder {source}, every file of "
            "which is read: the next preparation would read the prepared files as events. "
            f"Choose an output folder outside {source}"
        )
    if not schema.has(TIMESTAMP) and settings.session_gap_seconds is not None:
        raise ValueError(
            f"data.session_gap_seconds={settings.session_gap_seconds} cuts sessions at gaps in "
            "time, but the log is order-only (data.columns.timestamp=null): set it to null, or "
            "map a session column (data.columns.session_id)"
        )
    if not schema.has(TIMESTAMP) and settings.split.method == "temporal":
        raise DataError(
            f"{name}: the log has no timestamp column (data.columns.timestamp=null), so a "
            "temporal split is impossible: use data.split.method=leave_one_out or leave_last_n"
        )
    with _staging(out_dir) as stage:
        try:
            stats, vocab = _prepare(
                source, name, schema, settings, stage, items, item_columns, items_name
            )
        except (pl.exceptions.PolarsError, OSError) as err:
            _raise_if_disk_full(err, stage, name)
            raise
    log.info(
        "prepared %s: %d users, %d events (%d train), %d items (%d in the vocabulary), "
        "val/test targets %d/%d%s -> %s",
        name,
        stats["users"],
        stats["events"],
        stats["train_events"],
        stats["items"],
        stats["num_items"] - NUM_RESERVED,  # (num_items counts the reserved PAD/UNK rows)
        stats["val_targets"],
        stats["test_targets"],
        _unknown_targets_note(stats),
        out_dir,
    )
    return stats, vocab


# a log whose every event precedes this was most likely read in the wrong unit
_PLAUSIBLE_SINCE = datetime(1980, 1, 1, tzinfo=UTC)


def _warn_if_implausibly_old(summary: pl.DataFrame, schema: EventSchema, name: str) -> None:
    """Seconds read as milliseconds, or dates written as numbers (20231114) read as seconds,
    put a whole log in 1970: valid instants, so no row is bad, but the user is told."""
    last = summary["last"][0]
    if not schema.has(TIMESTAMP) or last >= _PLAUSIBLE_SINCE:
        return  # an order-only log's times are its row numbers, in 1970 by design
    unit = {"s": "seconds", "ms": "milliseconds"}[schema.timestamp_unit]
    log.warning(
        "%s: every event falls before %d (first %s, last %s). Numeric timestamps are read as "
        "Unix %s (data.timestamp_unit=%s): if the column holds another unit, or dates written "
        "as numbers (20231114), fix data.timestamp_unit or the column; a log that old needs "
        "nothing",
        name,
        _PLAUSIBLE_SINCE.year,
        summary["first"][0].isoformat(),
        last.isoformat(),
        unit,
        schema.timestamp_unit,
    )


def _raise_if_disk_full(err: Exception, stage: Path, name: str) -> None:
    """ENOSPC from polars (an error text) or from Python (errno) while preparing writes its
    work files or output: an ``OSError`` naming the disk, not a message blaming the log."""
    if no_space_left(err):
        raise OSError(
            errno.ENOSPC,
            f"no space left on the device of {stage.parent} while preparing {name}: free "
            "space there, or prepare into a folder on a larger disk",
        ) from err


def _prepare(
    source: EventSource,
    name: str,
    schema: EventSchema,
    settings: PrepareSettings,
    stage: Path,
    items: EventSource | None,
    item_columns: Mapping[str, str | None] | None,
    items_name: str | None,
) -> tuple[dict, Vocab]:
    clock = _Stopwatch()
    raw = scan_events(source, schema, name=name)
    types = raw.collect_schema()
    # a single text value per row is checked among the vocabulary's few distinct keys instead
    single_text = single_text_side(types, schema.attribute_separator)
    checks = [] if single_text else separator_inside(types, schema.attribute_separator)
    found = _collect(raw.select(pl.len().alias("rows"), *checks), name).row(0, named=True)
    rows_read = int(found["rows"])
    if rows_read == 0:
        raise DataError(f"{name} has no rows: export a non-empty event log")
    refuse_separator_inside(found, _side_option(schema), name)
    parts = _Partitions(stage / "_work", max(1, math.ceil(rows_read / settings.partition_rows)))
    as_of = settings.as_of or datetime.now(UTC)

    # 1. one streaming pass: types, problem labels, input hash -> user partitions
    typed = (
        read_side_by_side(raw, source, schema)
        .with_row_index(ROW)
        .pipe(normalize, schema=schema)
        .pipe(classify, as_of=as_of)
    )
    try:
        parts.distribute(
            typed.with_columns(_row_hash(typed.collect_schema().names())).with_columns(
                # attribute keys hashed by their text (a Categorical hashes its value, not its
                # code), event types by their Enum code (the configured behaviour order); keys
                # carried as codes: gathers 10-15x cheaper than text
                pl.col(ATTRIBUTES).cast(pl.Categorical)
            ),
            "typed",
        )
    except pl.exceptions.PolarsError as err:
        _raise_if_disk_full(err, stage, name)  # the work files, not the log, are the problem
        raise DataError(f"{name} could not be read: {err}") from err
    typed_all = parts.scan("typed")
    bad = problem_summary(typed_all)
    locator = partial(row_locator, source, schema)  # a folder's rows by file, for messages
    enforce(
        bad,
        settings.bad_rows,
        source_name=name,
        examples=typed_all,
        schema=schema,
        as_of=as_of,
        locator=locator,
    )
    has_problems = bool(bad)  # bad rows in some partition (the good rows need a filter)
    clock.lap("read")

    # 2. per partition: sort, duplicates, time window (quarantine what is set aside), then
    # the per-user steps; with an item threshold the k-core membership (global) comes between
    counters = {"duplicate": 0, "outside_window": 0, "clean": 0, "kcore": 0, "truncated": 0}
    repeated: list[pl.DataFrame] = []  # each partition's first repeats, for the error's examples
    digest = [0]  # sum of the row hashes modulo 2**64: independent of partitioning and order

    def clean(index: int) -> pl.DataFrame:
        df = tidy_keys(parts.read("typed", index))
        digest[0] = (digest[0] + df[_HASH].sum()) % 2**64  # (polars' UInt64 sum wraps too)
        # Bad rows leave before the sort (which then moves a slimmer frame), and cannot
        # duplicate a good row: their problem comes from the very values a duplicate shares.
        # (a log without problems, the usual case, skips both passes over every row)
        bad_rows = df.filter(pl.col(PROBLEM).is_not_null()) if has_problems else df.clear()
        good = _keep(df, pl.col(PROBLEM).is_null()) if has_problems else df
        bad_rows, good = bad_rows.drop(_HASH), good.drop(_HASH, *_BAD_ROW_COLUMNS)
        good = transforms.in_event_order(good)
        first = transforms.first_occurrence(good)
        duplicates = (
            good.filter(~first)
            .with_columns(pl.lit(None, dtype=df.schema[col]).alias(col) for col in _BAD_ROW_COLUMNS)
            .with_columns(pl.lit("duplicate", dtype=df.schema[PROBLEM]).alias(PROBLEM))
        )
        if duplicates.height:
            # with duplicate=error, counted over every partition and raised after the last
            repeated.append(duplicates.sort(ROW).head(3))
            good = good.filter(first)
        good = good.drop(ROW)  # the tie rule's input order has done its work
        counters["duplicate"] += duplicates.height
        parts.write(pl.concat([bad_rows, duplicates.select(bad_rows.columns)]), "quarantine", index)
        kept = good.lazy().pipe(
            transforms.clip_window, start=settings.window_start, end=settings.window_end
        )
        kept = kept.collect(engine=LOCAL)
        counters["outside_window"] += good.height - kept.height
        counters["clean"] += kept.height
        return kept

    members = None
    positional_work_files = settings.split.method != "temporal" and not parts.in_memory
    has_sessions = schema.has(SESSION) or settings.session_gap_seconds is not None

    def finalize(events: pl.DataFrame, index: int) -> None:
        events = events.lazy().pipe(transforms.sorted_by_user).collect(engine=LOCAL)
        kept = (
            _keep(events, transforms.user_has_min_events(settings.min_user_events))
            if members is None
            else events.lazy().pipe(transforms.filter_members, *members).collect(engine=LOCAL)
        )
        final = (
            kept.lazy()
            .pipe(transforms.keep_last_events, max_events=settings.max_user_events)
            .pipe(
                transforms.sessionize,
                gap_seconds=settings.session_gap_seconds,
                has_session_id=schema.has(SESSION),
            )
            .collect(engine=LOCAL)
        )
        counters["kcore"] += events.height - kept.height
        counters["truncated"] += kept.height - final.height
        parts.write(final, "final", index)
        if positional_work_files:
            # a positional split's training window needs each user's count and positions:
            # over the scan of every partition that held the whole log in memory (100 M
            # events: 3.3-3.6 GiB peak, a temporal split 2.1), so it is found and counted here
            events = final.lazy().pipe(transforms.sorted_by_user)
            train = training_events(events, settings.split, SplitPoints(None, None))
            parts.write(count_pairs(train).collect(engine=LOCAL), "train", index)

    iterations = 1 if settings.min_user_events > 1 else 0  # a user filter is one local pass
    kcore = settings.min_item_events > 1  # otherwise the user filter is local to a partition
    if kcore:
        parts.map("clean", lambda index: parts.write(clean(index), "clean", index))
    else:
        parts.map("clean", lambda index: finalize(clean(index), index))
    parts.drop("typed")
    if repeated:  # raises when duplicate=error, with the total and the log's first repeats
        enforce(
            {"duplicate": counters["duplicate"]},
            settings.bad_rows,
            source_name=name,
            examples=pl.concat(repeated).lazy(),
            schema=schema,
            locator=locator,
        )
    clock.lap("clean")
    bad["duplicate"] = counters["duplicate"]
    bad = {kind: bad[kind] for kind in PROBLEM_KINDS if bad.get(kind)}
    log_summary(bad, source_name=name)
    if counters["clean"] == 0:
        raise DataError(
            f"{name}: no events left after setting aside bad rows {bad} and clipping to the "
            f"window [{settings.window_start}, {settings.window_end})"
        )
    if kcore:  # 3. k-core membership (global), then the per-user steps
        users, item_ids, iterations = transforms.kcore_members(
            parts.scan("clean"),
            min_user_events=settings.min_user_events,
            min_item_events=settings.min_item_events,
        )
        members = (users, item_ids)
        parts.map("filter", lambda index: finalize(parts.read("clean", index), index))
        parts.drop("clean")
        clock.lap("kcore")
    final = parts.scan("final")
    summary = final.select(
        pl.len().alias("events"),
        pl.col(TIMESTAMP).min().alias("first"),
        pl.col(TIMESTAMP).max().alias("last"),
    ).collect(engine="streaming")
    if summary["events"][0] == 0:
        raise ValueError(
            f"{name}: no events survive min_user_events={settings.min_user_events} and "
            f"min_item_events={settings.min_item_events}: lower them"
        )
    _warn_if_implausibly_old(summary, schema, name)

    # 4. split: the cut times here; each user's split positions come with the encoding (6.)
    points = (
        temporal_cuts(final, settings.split, engine=parts.engine)
        if settings.split.method == "temporal"
        else SplitPoints(None, None)
    )

    clock.lap("split")

    # 5. vocabulary on the training window only
    train = (
        parts.scan("train")  # counted per partition by finalize()
        if positional_work_files
        else training_events(final, settings.split, points)  # temporal: a streamed filter
    )
    item_table = None
    if items is not None:
        item_table = read_item_table(
            items,
            item_columns,
            schema,
            final.collect_schema()[ITEM],
            dated_by=train,
            name=items_name,
        )
    vocab = Vocab.fit(
        train,
        behaviors=schema.behaviors,
        min_item_count=settings.min_item_count,
        item_table=item_table,
        max_item_attributes=settings.max_item_attributes,
        refuse_joined=(
            functools.partial(refuse_separator_inside, option=_side_option(schema), name=name)
            if single_text
            else None
        ),
    )
    if vocab.items.height == 0:
        count = settings.min_item_count
        raise ValueError(
            f"{name}: the training window holds no items: "
            + (f"lower data.min_item_count={count}, or " if count > 1 else "")
            + settings.split.widening()
        )
    items_label = None if items is None else items_name or describe_source(items)
    items_listed = None
    if item_table is not None:
        items_listed = _log_item_coverage(vocab, item_table, items_label)
    parts.drop("train")

    clock.lap("vocabulary")

    # 6. encode into one row per user
    unknown_targets = {f"{c}s_unknown_item": 0 for c in (VAL_TARGET, TEST_TARGET)}
    # Distinct items = the vocabulary's (all from training events, so all among the events)
    # + those outside it, which the encoding finds anyway: no count over every event's item.
    unknown_items = []

    def encode(index: int) -> None:
        events = parts.read("final", index).lazy().pipe(transforms.sorted_by_user)
        encoded = vocab.encode(events, behavior_column=EVENT_TYPE).collect(engine=LOCAL)
        unknown_items.append(encoded.filter(pl.col(ITEM_INDEX) == UNK_IDX)[ITEM].unique())
        sequences = (
            encoded.lazy()
            .pipe(with_windows, settings.split, points)
            .pipe(build_sequences, split_aggregations(settings.split))
            .collect(engine=LOCAL)
        )
        sequences, counts = _drop_unknown_targets(sequences)
        for key, value in counts.items():
            unknown_targets[key] += value
        parts.write(sequences, "sequences", index)

    parts.map("encode", encode)
    sequences = parts.scan("sequences")
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Compressing the sequences keeps about one core busy; the quarantine, the vocabulary
        # and the totals are written and counted on the other meanwhile. zstd level 1: as
        # small as the default level (39 MiB for 10 M events), 0.1 s faster.
        written = pool.submit(sequences.sink_parquet, stage / SEQUENCES_FILE, compression_level=1)
        quarantine = parts.scan("quarantine").pipe(raw_as_text)
        quarantine.with_columns(
            pl.col(EVENT_TYPE).cast(pl.String), attribute_sets(pl.col(ATTRIBUTES))
        ).select(
            pl.col(ROW).alias("row"),
            pl.col(PROBLEM).alias("problem"),
            pl.all().exclude(ROW, PROBLEM, RAW_TIMESTAMP, RAW_EVENT_TYPE),
            pl.col(RAW_TIMESTAMP).alias("raw_timestamp"),
            pl.col(RAW_EVENT_TYPE).alias("raw_event_type"),
        ).sort("row").sink_parquet(stage / QUARANTINE_FILE)
        vocab.save(stage)
        totals = (
            sequences.select(
                pl.len().alias("users"),
                pl.col(TRAIN_END).sum().alias("train_events"),
                (pl.col(TRAIN_END) >= 2).sum().alias("train_users"),
                (pl.col(VAL_TARGET) >= 0).sum().alias("val_targets"),
                (pl.col(TEST_TARGET) >= 0).sum().alias("test_targets"),
                *(
                    [pl.col(SESSION_INDEX).list.max().add(1).sum().alias("sessions")]
                    if has_sessions
                    else []
                ),
            )
            .collect(engine=parts.engine)
            .row(0, named=True)
        )
        written.result()
    clock.lap("encode")

    items_hash = _frame_digest(item_table.collect()) if item_table is not None else None
    stats = {
        "format_version": FORMAT_VERSION,
        "source": name,
        "items_source": items_label,
        "item_columns": None if items is None else dict(item_columns or DEFAULT_ITEM_COLUMNS),
        "items_listed": items_listed,  # training items the item table gives attributes
        "fingerprint": _fingerprint(rows_read, digest[0], items_hash, settings, schema),
        "rows_read": rows_read,
        "bad_rows": bad,
        "bad_rows_policy": asdict(settings.bad_rows),
        "quarantined": sum(bad.values()),
        "duplicates_removed": bad.get("duplicate", 0),
        "events_outside_window": counters["outside_window"],
        "kcore_iterations": iterations,
        "events_removed_by_kcore": counters["kcore"],
        "events_removed_by_max_user_events": counters["truncated"],
        "events": int(summary["events"][0]),
        "users": int(totals["users"]),
        "items": vocab.items.height + pl.concat(unknown_items).n_unique(),
        **({"sessions": int(totals["sessions"])} if has_sessions else {}),
        "train_events": int(totals["train_events"]),
        "train_users": int(totals["train_users"]),
        "val_targets": int(totals["val_targets"]),
        "test_targets": int(totals["test_targets"]),
        **unknown_targets,
        "num_items": vocab.num_items,
        "num_attributes": vocab.num_attributes,
        "attribute_width": vocab.attribute_width,
        "num_behaviors": vocab.num_behaviors,
        "vocab_hash": vocab.content_hash(),
        "split": {
            **asdict(settings.split),
            "val_start": None if points.val_start is None else points.val_start.isoformat(),
            "test_start": None if points.test_start is None else points.test_start.isoformat(),
        },
        "settings": settings.to_dict(),
        "as_of": as_of.isoformat(),
        "ordered_by": "timestamp" if schema.has(TIMESTAMP) else "input order",
        "time_buckets": asdict(settings.time_buckets),
        "schema": schema.to_dict(),
        "first_event": summary["first"][0].isoformat(),
        "last_event": summary["last"][0].isoformat(),
        "partitions": parts.count,
        "polars_version": pl.__version__,
    }
    if stats["val_targets"] == 0 or stats["test_targets"] == 0:
        _check_target_events(sequences, vocab, settings.split, name, stats["events"])
        raise ValueError(
            f"{name}: the split leaves {stats['val_targets']} validation and "
            f"{stats['test_targets']} test targets ({settings.split.method} split)"
            + (
                f", after leaving out {unknown_targets} whose item never occurs in training"
                if any(unknown_targets.values())
                else ""
            )
            + f"; the log is too small or the windows too narrow: {settings.split.widening()}"
        )
    if stats["train_users"] == 0:  # a target is an event after another in the training window
        raise ValueError(
            f"{name}: the split leaves no training target: no user has two events in the "
            f"training window ({settings.split.method} split, {stats['train_events']} "
            f"training events), so a model would train on nothing; {settings.split.widening()}"
        )
    shutil.rmtree(parts.work, ignore_errors=True)
    clock.lap("finish")
    log.info("prepare seconds per stage: %s", clock.seconds)
    text = json.dumps(stats, indent=2, default=str)
    (stage / STATS_FILE).write_text(text)
    return json.loads(text), vocab  # as a reader of stats.json sees them


_BAD_ROW_COLUMNS = (RAW_TIMESTAMP, RAW_EVENT_TYPE, PROBLEM)  # null in every good row


def _keep(frame: pl.DataFrame, mask: pl.Expr) -> pl.DataFrame:
    """``frame.filter(mask)``, or ``frame`` itself when every row passes (the usual case for
    bad rows and short users): a filter copies every column, and fresh memory is what costs
    most here (page faults took about half the CPU time of preparing 10 M events)."""
    keep = frame.select(mask).to_series()
    return frame if keep.all() else frame.filter(keep)


def read_item_table(
    items: EventSource,
    item_columns: Mapping[str, str | None] | None,
    schema: EventSchema,
    item_dtype: pl.DataType,
    *,
    dated_by: pl.LazyFrame,
    name: str | None = None,
) -> pl.LazyFrame:
    """The item side table as ``item_id`` (the event log's id type) + ``attributes`` list,
    named ``name`` in messages (e.g. the loader call that made a frame; else
    :func:`describe_source`).

    A time-versioned table (``item_columns.timestamp`` set: one row per value and the moment it
    took effect) gives each item its latest value at the last event of ``dated_by`` (the
    training window when preparing, so values recorded after it never reach the vocabulary;
    the scored events when scoring). A null moment counts as the oldest.
    """
    columns = dict(item_columns or DEFAULT_ITEM_COLUMNS)
    name = name or describe_source(items)
    lf = scan_items(items, columns, name=name)
    types = lf.collect_schema()
    if (ids := canonical_ids(ITEM, types[ITEM])) is not None:  # as the log's ids are prepared
        lf = lf.with_columns(ids)
        types = lf.collect_schema()
    _check_item_table(lf, types, columns, schema, item_dtype, name)
    side = ATTRIBUTES if ATTRIBUTES in types else CATEGORY  # (as scan_items mapped them)
    separator = schema.attribute_separator if side == ATTRIBUTES else None
    if checks := separator_inside(types, separator):
        found = lf.select(checks).collect(engine="streaming").row(0, named=True)
        refuse_separator_inside(found, f"column {columns[side]!r} (data.item_columns.{side})", name)
    attributes = attribute_list(
        types[side],
        side,
        separator=separator,
        option=f"data.item_columns.{side}",
    )
    if TIMESTAMP in types:
        if not schema.has(TIMESTAMP):
            raise DataError(
                f"{name}: data.item_columns.timestamp={columns[TIMESTAMP]!r} dates the item "
                "table, but the event log is order-only (data.columns.timestamp=null), so "
                "there is no training cut to date it against: set data.item_columns.timestamp"
                "=null"
            )
        last = dated_by.select(pl.col(TIMESTAMP).max()).collect(engine="streaming").item()
        moment = timestamp_expr(types[TIMESTAMP], schema.timestamp_unit)
        lf = (
            lf.with_row_index("_row")
            .with_columns(moment.alias(TIMESTAMP))
            .filter(pl.col(TIMESTAMP).is_null() | (pl.col(TIMESTAMP) <= last))
            .group_by(ITEM)
            .agg(pl.all().sort_by(TIMESTAMP, "_row", nulls_last=False).last())
        )
    try:
        table = lf.select(pl.col(ITEM).cast(item_dtype), attributes.alias(ATTRIBUTES)).collect(
            engine="streaming"
        )
    except pl.exceptions.PolarsError as err:
        raise DataError(
            f"{name}: item ids of type {types[ITEM]} do not match the event log's {item_dtype} "
            f"({err}): export both with the same id type"
        ) from err
    return table.lazy()


def _check_item_table(
    lf: pl.LazyFrame,
    types: pl.Schema,
    columns: Mapping[str, str | None],
    schema: EventSchema,
    item_dtype: pl.DataType,
    name: str,
) -> None:
    """Refuse an item table row that would otherwise be lost or merged without a word: a null
    item id, an id that changes value as the log's id type (``19.5`` -> 19, ``'007'`` -> 7,
    which would merge with ``'7'``), a moment that does not parse (it would count as the
    oldest)."""
    ids = pl.col(ITEM)
    as_log = ids.cast(item_dtype, strict=False)
    problems = {
        "null_ids": ids.is_null(),
        "changed_ids": ids.is_not_null() & as_log.cast(types[ITEM], strict=False).ne_missing(ids),
    }
    if TIMESTAMP in types:
        moment = timestamp_expr(types[TIMESTAMP], schema.timestamp_unit)
        problems["bad_moments"] = pl.col(TIMESTAMP).is_not_null() & moment.is_null()
    found = (
        lf.select(
            *(flag.sum().alias(kind) for kind, flag in problems.items()),
            *(
                pl.col(ITEM if kind != "bad_moments" else TIMESTAMP)
                .filter(flag)
                .head(3)
                .cast(pl.String)
                .implode()
                .alias(f"{kind}_examples")
                for kind, flag in problems.items()
            ),
        )
        .collect(engine="streaming")
        .row(0, named=True)
    )
    id_column, moment_column = columns[ITEM], columns.get(TIMESTAMP)
    fixes = {
        "null_ids": f"row(s) without an item id (null or empty; column {id_column!r}): remove "
        "them or fill the ids",
        "changed_ids": f"item id(s) that change as the event log's {item_dtype} ids (column "
        f"{id_column!r}, e.g. {found['changed_ids_examples']}; '007' would become the item 7, "
        "19.5 the item 19): export the table's ids exactly as the log writes them",
        "bad_moments": f"moment(s) that do not parse (column {moment_column!r}, e.g. "
        f"{found['bad_moments_examples'] if 'bad_moments' in problems else None}): use Unix "
        "seconds / milliseconds (data.timestamp_unit) or ISO 8601, as in the log",
    }
    wrong = [f"{found[kind]} {fixes[kind]}" for kind in problems if found[kind]]
    if wrong:
        raise DataError(f"item table {name}: " + "; ".join(wrong))


def _log_item_coverage(vocab: Vocab, item_table: pl.LazyFrame, name: str) -> int:
    """How many vocabulary items the item table lists, logged: a table that lists none (ids of
    another numbering, the wrong file) would otherwise leave every item's attributes to its
    events, or UNK, without a word."""
    listed = int(
        vocab.items.lazy()
        .join(item_table.select(ITEM), on=ITEM, how="semi")
        .select(pl.len())
        .collect()
        .item()
    )
    total = vocab.items.height
    if listed == 0:
        log.warning(
            "the item table %s lists none of the %d training items: their attributes come "
            "from their events (or are unknown). Check that data.items has the log's item ids "
            "(data.item_columns.item_id names its id column)",
            name,
            total,
        )
    else:
        log.info("the item table %s lists %d of the %d training items", name, listed, total)
    return listed


def _drop_unknown_targets(sequences: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """A target whose item is not in the (train-fitted) vocabulary cannot be ranked: it is set
    aside (position -1) and counted, never silently."""
    counts: dict[str, int] = {}
    updates = []
    for column in (VAL_TARGET, TEST_TARGET):
        target_item = pl.col(ITEMS).list.get(pl.col(column).clip(lower_bound=0), null_on_oob=True)
        unknown = (pl.col(column) >= 0) & (target_item == UNK_IDX)
        counts[f"{column}s_unknown_item"] = int(sequences.select(unknown.sum()).item())
        updates.append(pl.when(unknown).then(-1).otherwise(pl.col(column)).alias(column))
    return sequences.with_columns(updates), counts


def _row_hash(columns: list[str]) -> pl.Expr:
    """A hash of each typed row with its input position: good rows by their canonical values
    (so the same events in a CSV, a Parquet file or a frame hash alike), bad rows also by their
    raw timestamp and event type (which their canonical values lost; :func:`classify` keeps
    the raw values of bad rows only).

    Column hashes are chained as ``h = h * P + hash(column)`` (UInt64 arithmetic wraps), which
    binds every value to its column, and the chain is hashed once more: the digest sums row
    hashes, and a sum of the linear chains alone would not see rows trade values (e.g. a
    reversed log). ``pl.struct(pl.all()).hash()`` does the same 10-40x slower (3.4 s on 10 M
    rows with a list column, this 0.1 s).
    """
    row_hash = None
    for seed, column in enumerate(columns):
        value = pl.col(column).hash(seed=seed)
        row_hash = value if row_hash is None else row_hash * _HASH_PRIME + value
    return row_hash.hash(seed=len(columns)).alias(_HASH)


# rows hashed at once by _frame_digest
DIGEST_SLICE_ROWS = 1 << 20


def _frame_digest(frame: pl.DataFrame) -> int:
    """The sum (mod 2^64) of the frame's row hashes, one slice of rows at a time: a row's hash
    is its values', wherever the slice starts, so the sum is the whole frame's. Whole,
    ``hash_rows`` of a many-chunk frame (a streamed log) took about twice the frame's size
    on top of it (+1.0 GB for a 10.8 M-event log of 0.43 GB), the scoring job's peak; by
    slices, +0.1 GB and no slower."""
    total = 0
    for start in range(0, frame.height, DIGEST_SLICE_ROWS):
        hashes = frame.slice(start, DIGEST_SLICE_ROWS).hash_rows(seed=0).to_numpy()
        total += int(np.sum(hashes, dtype=np.uint64))
    return total % 2**64  # the UInt64 sum one np.sum over every row gave (it wraps)


def _unknown_targets_note(stats: dict) -> str:
    """`` (+51/138 of items outside the vocabulary)``: the targets the val/test counts leave
    out (their item is not in the vocabulary), so that the counts add up to the split's."""
    val, test = stats["val_targets_unknown_item"], stats["test_targets_unknown_item"]
    return f" (+{val}/{test} of items outside the vocabulary)" if val or test else ""


def _check_target_events(
    sequences: pl.LazyFrame, vocab: Vocab, split: SplitSettings, name: str, events: int
) -> None:
    """Refuse ``data.split.target_behaviors`` of which the prepared log has no event at all,
    naming the behaviours it has: no widening of the windows would give it a target."""
    targets = split.target_behaviors
    if not targets:
        return
    counts = sequences.select(pl.col(BEHAVIORS).explode()).group_by(BEHAVIORS).len().collect()
    found = dict(counts.iter_rows())  # behaviour code -> events
    codes = {b: NUM_RESERVED + i for i, b in enumerate(vocab.behaviors)}
    has = {b: found[code] for b, code in codes.items() if code in found}
    if any(b in has for b in targets):
        return
    raise ValueError(
        f"{name}: none of the log's {events} events is one of data.split.target_behaviors="
        f"{list(targets)} (it has {', '.join(f'{b}: {n}' for b, n in has.items())}), so there "
        "is no validation or test target: name behaviours the log has, or null for every "
        "behaviour (check data.behavior_aliases if the log names them otherwise)"
    )


def _fingerprint(
    rows: int,
    rows_digest: int,
    items_digest: int | None,
    settings: PrepareSettings,
    schema: EventSchema,
) -> str:
    """sha256 of the input's content (every row with its input position) and of every setting
    that shapes the data (not ``partition_rows``, which only lays out the work). Row hashes
    come from polars (recorded as ``polars_version``)."""
    payload = [
        rows,
        rows_digest,
        items_digest,
        {k: v for k, v in settings.to_dict().items() if k != "partition_rows"},  # work layout
        schema.to_dict(),
    ]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def events_fingerprint(events: pl.DataFrame) -> str:
    """sha256 of an in-memory event log's content (every row with its position, as
    :func:`_fingerprint`'s rows): names a scoring job's input in its MLflow run and in the
    resume manifest. The position is hashed because the digest is a sum of row hashes, blind
    to order, and order counts: a user's events at one moment keep their input order, so
    two orders of the same rows can give other histories and other lists."""
    payload = [events.height, _frame_digest(events.with_row_index(ROW)), events.columns]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def load_stats(folder: str | Path) -> dict:
    """The ``stats.json`` of a prepared folder; a damaged one (left empty or cut short by a full
    disk, overwritten) is named with the fix, not left to a bare JSONDecodeError."""
    path = Path(folder) / STATS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the prepare step first")
    try:
        stats = json.loads(path.read_text())
        problem = None if isinstance(stats, dict) else f"holds a {type(stats).__name__}"
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        problem = f"is not JSON ({err})"
    again = (
        "prepare the log again into it (python -m pipelines.prepare "
        f"data.prepared_dir={path.parent})"
    )
    if problem is not None:
        raise DataError(
            f"{path} {problem}, not the statistics of a prepared dataset: the folder is "
            f"damaged; {again}"
        )
    version = stats.get("format_version")
    if version != FORMAT_VERSION:
        # ids, vocabulary files or the fingerprint may differ: read as this format, a folder
        # of another gives a model trained on other data, or fails after its training
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise DataError(
            f"{path.parent} was prepared "
            + (
                "by a version of recsys from before prepared folders recorded their format"
                if version is None
                else f"in format {version!r} (stats.json's format_version)"
            )
            + f"; this version of recsys reads format {FORMAT_VERSION} only: {again}"
            + (", or read it with the newer recsys that prepared it" if newer else "")
        )
    return stats


def scoring_events(
    events: pl.DataFrame, *, vocab: Vocab, as_of: datetime | None = None
) -> pl.DataFrame:
    """The events of :func:`load_events` up to and including ``as_of`` (default: all), in
    :func:`transforms.sort_events` order without repeats, encoded with a *saved* vocabulary
    (never refitted: unseen items become UNK): adds ``item_index`` and ``behavior_index``.
    Row ``r`` of the result is flat event ``r`` of :func:`scoring_sequences`' lists."""
    lf = events.lazy().with_row_index(ROW)
    as_of = parse_instant(as_of, option="as_of")
    if as_of is not None:
        lf = lf.filter(pl.col(TIMESTAMP) <= as_of)
    lf = lf.pipe(transforms.sort_events).pipe(transforms.dedupe)
    encoded = vocab.encode(lf, behavior_column=EVENT_TYPE).collect(engine=LOCAL)
    if encoded.height == 0:
        raise ValueError(f"no events at or before as_of={as_of}: nothing to score")
    return encoded.drop(ROW)


def scoring_sequences(
    events: pl.DataFrame, *, vocab: Vocab | None = None, as_of: datetime | None = None
) -> pl.DataFrame:
    """Each user's whole history as a sequence table without targets. ``events`` come from
    :func:`load_events` (then pass ``vocab``, and ``as_of`` if wanted) or are already
    :func:`scoring_events` (``vocab=None``)."""
    if vocab is not None:
        events = scoring_events(events, vocab=vocab, as_of=as_of)
    whole_history = [
        pl.len().cast(pl.Int32).alias(TRAIN_END),
        pl.lit(-1, dtype=pl.Int32).alias(VAL_TARGET),
        pl.len().cast(pl.Int32).alias(TEST_START),
        pl.lit(-1, dtype=pl.Int32).alias(TEST_TARGET),
    ]
    return build_sequences(events.lazy(), whole_history).collect(engine=LOCAL)
