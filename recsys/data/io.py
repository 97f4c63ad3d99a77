"""Reading event logs: CSV / Parquet files or in-memory pandas / polars frames.

Everything comes out as a ``pl.LazyFrame`` whose columns carry recsys' canonical names
(:mod:`recsys.schema`); nothing is collected here.
"""

from __future__ import annotations

import bisect
import csv
import glob
import gzip
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from recsys.schema import (
    ATTRIBUTES,
    CANONICAL_COLUMNS,
    CATEGORY,
    ITEM,
    TIMESTAMP,
    USER,
    EventSchema,
)

log = logging.getLogger(__name__)

EventSource = str | os.PathLike | pl.DataFrame | pl.LazyFrame | pd.DataFrame
SUPPORTED_SUFFIXES = (".csv", ".parquet", ".pq", ".csv.gz")
# RecBole's atomic files: read by recsys.data.formats.read_recbole / read_recbole_items
RECBOLE_SUFFIXES = (".inter", ".item", ".user", ".kg", ".link", ".net")
# a CSV whose header holds none of these but commas is read with the one it holds
CSV_SEPARATORS = (";", "\t", "|")
# the first bytes of files that are not text, whatever their name says
NOT_TEXT = {
    b"PAR1": "a Parquet file",
    b"PK\x03\x04": "a zip archive (unzip it and point at the file inside)",
    b"BZh": "a bzip2 file (decompress it first: bunzip2)",
    b"\xfd7zXZ\x00": "an xz file (decompress it first: unxz)",
    b"\x28\xb5\x2f\xfd": "a zstd file (decompress it first: unzstd)",
}


class DataError(ValueError):
    """Bad input data: the message names the source, the column or rows, and the fix."""


def source_path(source: str | os.PathLike) -> Path:
    """A path source as a :class:`Path`, ``~`` expanded (polars expands it itself: a path that
    recsys checked unexpanded named another file than the one polars reads)."""
    return Path(source).expanduser()


def describe_source(source: EventSource) -> str:
    """A short human name for ``source`` used in error messages."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"<in-memory {type(source).__module__.split('.')[0]} frame>"


def _suffix(path: Path) -> str:
    """A file's type as :data:`SUPPORTED_SUFFIXES` name it: ``.csv.gz`` or its last suffix."""
    name = path.name.lower()
    return ".csv.gz" if name.endswith(".csv.gz") else path.suffix.lower()


def _recbole_hint(files: Iterable[Path], option: str) -> str:
    """How to read RecBole atomic files among ``files`` ("" when there are none)."""
    suffixes = {_suffix(p) for p in files}
    if not suffixes & set(RECBOLE_SUFFIXES):
        return ""
    if option == "data.items":
        return (
            ". A RecBole <dataset>.item is read by its loader, with its fields named without "
            "their type: 'data.items={_target_: recsys.data.formats.read_recbole_items, path: "
            "<its dataset folder or file>}' data.item_columns.item_id=item_id (or data=recbole "
            "for the whole dataset)"
        )
    return (
        ". RecBole atomic files (<dataset>.inter, .item) are read by data=recbole "
        "data.source.path=<the dataset folder holding them>, which maps their fields by name "
        "without their type (user_id, not user_id:token); see the README's Public formats"
    )


def _hidden(file: Path, root: Path) -> bool:
    """A file under ``root`` that Spark, Hive and Arrow leave out of a dataset: its name or a
    folder's below ``root`` starts with ``_`` or ``.`` (``_temporary/``, ``.part-0.crc``)."""
    return any(part.startswith(("_", ".")) for part in file.relative_to(root).parts)


def _check_mixed_types(
    folder: Path, files: list[Path], frames: list[pl.LazyFrame], columns: Mapping[str, bool]
) -> None:
    """Files of one folder may type a column differently (a CSV whose ids are all digits next
    to one with letters): they are read as their common supertype, and the user is told. An
    id column that is text in one file and floating-point in another is refused: the common
    type would make the id ``100`` of one file and ``100.0`` of the other two ids."""
    seen: dict[str, dict[str, str]] = {}
    fractional: dict[str, str] = {}  # id column -> a file where it is floating-point
    for file, frame in zip(files, frames):
        try:
            schema = frame.collect_schema()
        except pl.exceptions.PolarsError:
            continue  # reported with a clear message when the log is read
        for column, dtype in schema.items():
            seen.setdefault(column, {}).setdefault(str(dtype), file.name)
            if columns.get(column) and (dtype.is_float() or isinstance(dtype, pl.Decimal)):
                fractional.setdefault(column, file.name)
    for column, types in seen.items():
        temporal = next((f for t, f in types.items() if t.startswith(("Datetime", "Date"))), None)
        number = next(
            (f"{t} in {f}" for t, f in types.items() if t[:3] in ("Int", "UIn", "Flo")), None
        )
        if column in columns and temporal and number:
            raise DataError(
                f"{folder}: column {column!r} holds datetimes in {temporal} but numbers "
                f"({number}), which no one type reads as the same instants: export it with one "
                "type in every file (datetimes, or Unix seconds / milliseconds)"
            )
        text = next((f for t, f in types.items() if t in ("String", "Categorical")), None)
        if column in fractional and text:
            raise DataError(
                f"{folder}: id column {column!r} is text in {text} but floating-point numbers "
                f"in {fractional[column]} ({types}), so one id would read as two ('100' and "
                "'100.0'): export the ids with one type (cast the column to integer or text)"
            )
        if len(types) > 1:
            log.warning(
                "%s: column %r has different types across files %s; reading it as their "
                "common type (ids become text when any file has text ids)",
                folder,
                column,
                types,
            )


def _scan_files(
    source: Path, files: list[Path], root: Path, columns: Mapping[str, bool]
) -> pl.LazyFrame:
    """The files of a folder or glob ``source`` (under ``root``) as one LazyFrame, in name
    order; hidden files (see :func:`_hidden`) are left out."""
    files, hidden = _listed(files, root)
    if hidden:
        log.warning(
            "%s: leaving out %d file(s) whose name or folder starts with '_' or '.' (work files "
            "of Spark / Hive, e.g. an unfinished write's _temporary/): %s",
            source,
            len(hidden),
            [str(p.relative_to(root)) for p in hidden[:5]],
        )
    if not files:
        raise DataError(
            f"{source} {'holds' if source.is_dir() else 'matches'} no "
            f"{'/'.join(SUPPORTED_SUFFIXES)} files"
            + (" but hidden ones" if hidden else "")
            + ": point data.source.path at an event log"
        )
    kinds = {_suffix(p).replace(".pq", ".parquet").replace(".csv.gz", ".csv") for p in files}
    if len(kinds) > 1:
        raise DataError(f"{source} mixes file types {sorted(kinds)}: keep one type")
    frames = [_wanted_of(_scan_file(p, columns), p, source, columns) for p in files]
    _check_mixed_types(source, files, frames, columns)
    return pl.concat(_unsigned_ids(source, files, frames, columns), how="vertical_relaxed")


def _unsigned_ids(
    folder: Path, files: list[Path], frames: list[pl.LazyFrame], columns: Mapping[str, bool]
) -> list[pl.LazyFrame]:
    """``frames`` with an id column that is UInt64 in some files and a signed integer in others
    read as one integer type: Int64 while every id fits it (their common type's ids are then
    prepared as Int64), else UInt64, the signed files' ids cast to it. Ids past Int64 in one
    file and negative ids in another fit no integer type, and are refused by name."""
    schemas = [frame.collect_schema() for frame in frames]
    for column in (c for c, is_id in columns.items() if is_id):
        types = [schema[column] for schema in schemas]
        unsigned = [i for i, dtype in enumerate(types) if dtype == pl.UInt64]
        signed = [i for i, dtype in enumerate(types) if dtype.is_signed_integer()]
        if not unsigned or not signed:
            continue
        large = next((i for i in unsigned if _extreme(frames[i], column, "max") >= 2**63), None)
        if large is None:
            continue
        negative = next((i for i in signed if _extreme(frames[i], column, "min") < 0), None)
        if negative is not None:
            raise DataError(
                f"{folder}: id column {column!r} holds ids past Int64 in {files[large].name} "
                f"(UInt64) and negative ids in {files[negative].name}, which no integer type "
                "holds both of: export the ids as text in every file"
            )
        frames = [
            frame.with_columns(pl.col(column).cast(pl.UInt64)) if i in signed else frame
            for i, frame in enumerate(frames)
        ]
    return frames


def _extreme(frame: pl.LazyFrame, column: str, which: str) -> int:
    """A file's largest or smallest id in ``column`` (0 when it has none)."""
    value = frame.select(getattr(pl.col(column), which)()).collect().item()
    return 0 if value is None else value


def _listed(files: list[Path], root: Path) -> tuple[list[Path], list[Path]]:
    """The readable files among ``files`` (under ``root``), and the hidden ones of a readable
    type left out. A visible file of another type is refused by name: leaving it out would
    drop its rows unseen (a ``.csv.bz2`` or ``.parquet.gzip`` beside ``.csv`` parts)."""
    files = [p for p in files if p.is_file()]
    hidden = {p for p in files if _hidden(p, root)}
    other = [p for p in files if p not in hidden and _suffix(p) not in SUPPORTED_SUFFIXES]
    if other:
        shown = [str(p.relative_to(root)) for p in other[:5]]
        more = f" and {len(other) - 5} more" if len(other) > 5 else ""
        raise DataError(
            f"{root} holds {len(other)} file(s) recsys does not read: {shown}{more}. It reads "
            f"{', '.join(SUPPORTED_SUFFIXES)}; rather than leave rows out unseen, it stops: "
            "convert or decompress those files, move them out, or name the files to read with "
            f"a glob (e.g. {root / '*.csv'}){_recbole_hint(other, '')}"
        )
    readable = [p for p in files if _suffix(p) in SUPPORTED_SUFFIXES]
    return [p for p in readable if p not in hidden], [p for p in readable if p in hidden]


def _files_under(folder: Path) -> list[Path]:
    """Every file under ``folder``, sorted; links to folders are followed (each real folder
    once, so a link back up does not loop), as they are for links to files."""
    seen: set[str] = set()
    found: list[Path] = []
    for directory, subfolders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            subfolders.clear()
            continue
        seen.add(real)
        found += [Path(directory, name) for name in names]
    return sorted(found)


def _expanded(path: Path) -> tuple[list[Path], Path] | None:
    """A glob's matches or a folder's files (sorted), with the folder their hidden names
    are judged under; ``None`` for a single path."""
    if not path.exists() and glob.has_magic(str(path)):
        return sorted(Path(p) for p in glob.glob(str(path), recursive=True)), _glob_root(str(path))
    if path.is_dir():
        return _files_under(path), path
    return None


def _source_files(path: Path) -> list[Path]:
    """The files a path source reads (a file, a folder's files or a glob's), as
    :func:`_scan_file` finds them."""
    expanded = _expanded(path)
    if expanded is not None:
        return _listed(*expanded)[0]
    return [path] if path.is_file() else []


def row_locator(source: EventSource, schema: EventSchema) -> Callable[[int], str] | None:
    """For a folder or glob of several files: a function from a row number of the whole log
    (0-based, headers excluded, files in path order) to ``row N of <file>``, for messages that
    quote rows; ``None`` for a single file or a frame. Counts each file's rows (Parquet: its
    footer; CSV: a parse), so call it on the error path only."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    files = _source_files(source_path(source))
    if len(files) < 2:
        return None
    root = _expanded(source_path(source))[1]
    wanted = _wanted(schema.columns)
    starts = [0]
    for file in files:
        starts.append(starts[-1] + _scan_file(file, wanted).select(pl.len()).collect().item())

    def locate(row: int) -> str:
        index = bisect.bisect_right(starts, row) - 1
        return f"row {row - starts[index]} of {files[index].relative_to(root)}"

    return locate


def _glob_root(pattern: str) -> Path:
    """The folder of ``pattern`` before its first wildcard."""
    parts = Path(pattern).parts
    fixed = parts[: next(i for i, part in enumerate(parts) if glob.has_magic(part))]
    return Path(*fixed) if fixed else Path()


# what the file a setting names holds, for messages (default: the event log)
_WHAT = {"data.items": "item table", "users": "user list"}


def _scan_file(
    path: Path, columns: Mapping[str, bool], option: str = "data.source.path"
) -> pl.LazyFrame:
    """A CSV / Parquet file, folder or glob as a LazyFrame. ``columns`` names the columns wanted
    from a CSV, True for an id or name column (see :func:`csv_types`); ``option`` is the
    setting that names it (``data.source`` or ``data.items``)."""
    expanded = _expanded(path)
    if expanded is not None:
        return _scan_files(path, *expanded, columns)
    if not path.exists():
        what = _WHAT.get(option, "event log")
        where = (
            "data.source (a loader's data.source.path)" if option == "data.source.path" else option
        )
        raise DataError(f"{what} {path} does not exist: check {where}")
    suffix = _suffix(path)
    if suffix not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; recsys reads "
            f"{', '.join(SUPPORTED_SUFFIXES)} (convert the file or rename it if it is one of "
            f"these){_recbole_hint([path], option)}"
        )
    if path.stat().st_size == 0:
        what = _WHAT.get(option, "event log")
        raise DataError(f"{path} is empty (0 bytes): export the {what} again")
    if suffix in (".csv", ".csv.gz"):
        with open(path, "rb") as f:
            head = f.read(8)
        not_text = {**NOT_TEXT, b"\x1f\x8b": "a gzip file"} if suffix == ".csv" else {}
        for magic, kind in not_text.items():
            if head.startswith(magic):
                fix = {b"PAR1": "rename it to .parquet", b"\x1f\x8b": "rename it to .csv.gz"}
                fix = fix.get(magic, "convert it")
                raise DataError(f"{path} is {kind}, not CSV text despite its name: {fix}")
        lf = _scan_csv(path)
        if suffix == ".csv" and option == "data.source.path":  # (the bad-row policy names it)
            lf = _without_cut_field(lf, path)
        return csv_types(lf, columns, path)
    try:
        return _scan_parquet(path)
    except Exception as err:  # polars and pyarrow raise several error types for corrupt files
        raise DataError(f"{path} is not a readable Parquet file: {err}") from err


def _fixed_offset(dtype: pa.DataType) -> bool:
    """A timestamp type whose zone is a fixed UTC offset (``+05:30``), which polars refuses:
    it takes named zones only."""
    return pa.types.is_timestamp(dtype) and (dtype.tz or "")[:1] in ("+", "-")


def _scan_parquet(path: Path) -> pl.LazyFrame:
    """A Parquet file as a LazyFrame. Timestamps with a fixed UTC offset (pandas writes one for
    ``"...+05:30"`` strings) are read as the UTC instants they hold, through pyarrow: polars'
    own reader panics on such a column, even one that is not read."""
    schema = pq.read_schema(path)
    if not any(_fixed_offset(f.type) for f in schema):
        return pl.scan_parquet(path)
    import pyarrow.dataset as ds

    as_utc = pa.schema(
        [
            pa.field(f.name, pa.timestamp(f.type.unit, "UTC")) if _fixed_offset(f.type) else f
            for f in schema
        ]
    )
    return pl.scan_pyarrow_dataset(ds.dataset(path, format="parquet", schema=as_utc))


def _separator(header: str) -> str | None:
    """The one of :data:`CSV_SEPARATORS` a header without commas uses (None: commas)."""
    return next((s for s in CSV_SEPARATORS if "," not in header and s in header), None)


def _scan_csv(path: Path) -> pl.LazyFrame:
    """A CSV file (plain or gzip) read as text, with the separator its header uses: a comma,
    or one of :data:`CSV_SEPARATORS` in a header without commas."""
    lf = pl.scan_csv(path, infer_schema=False)
    try:
        header = lf.collect_schema().names()
    except pl.exceptions.PolarsError:
        return lf  # no header, or unreadable: said where the columns are read
    separator = _separator(header[0]) if len(header) == 1 else None
    if separator is None:
        return lf
    log.info("%s: the header has no comma; reading the file as %r-separated", path, separator)
    return pl.scan_csv(path, infer_schema=False, separator=separator)


def _without_cut_field(lf: pl.LazyFrame, path: Path) -> pl.LazyFrame:
    """A CSV whose last line has no line end was most likely cut mid-row (a download or copy
    that did not finish, ``head -c``): the last field of that line may hold part of a value
    (``170850`` of ``1708506391``, a valid time in 1970), so it is read as null, for the
    bad-row policy to name, with a warning naming the file, as :mod:`recsys.data.formats`'
    loaders do. A file that ends in a line end is read as it is (only its last bytes looked at)."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 200))
        tail = f.read()
    if tail.endswith(b"\n"):
        return lf
    try:
        last = lf.collect_schema().names()[-1]
    except pl.exceptions.PolarsError:
        return lf  # no header, or unreadable: said where the columns are read
    log.warning(
        "%s: the last line (%r) has no line end, so it was probably cut mid-row; its last "
        "field (column %r) is read as null (if the file is complete, append a line end: "
        "echo >> %s)",
        path,
        tail.rsplit(b"\n", 1)[-1].decode("utf-8", "replace")[-80:],
        last,
        path,
    )
    # (a row index only here: a file that ends in a line end is read as it was)
    whole = pl.int_range(pl.len()) < pl.len() - 1
    return lf.with_columns(pl.when(whole).then(pl.col(last)).alias(last))


def _not_utf8(path: Path) -> str:
    """Where ``path`` (plain or gzip) first holds bytes that are not UTF-8: for the message
    of a failed read (polars names no line)."""
    opener = gzip.open if _suffix(path) == ".csv.gz" else open
    with opener(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                shown = line.rstrip(b"\r\n")[:120].decode("utf-8", "backslashreplace")
                return f" (line {number}: {shown})"
    return ""


def _first_bad_line(path: Path) -> str:
    """The first line of a CSV (plain or gzip) whose fields do not match its header's count,
    or whose quote never closes, and the fix ("" if none is found)."""
    opener = gzip.open if _suffix(path) == ".csv.gz" else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            first = f.readline()
            separator = _separator(first) or ","
            width = len(next(csv.reader([first], delimiter=separator)))
            reader = csv.reader(f, delimiter=separator, strict=True)
            line = 2
            for row in reader:
                if row and len(row) != width:
                    return (
                        f"line {line} has {len(row)} fields where the header has {width}: fix "
                        "or remove that line, quoting any field that holds the separator"
                    )
                line = reader.line_num + 2
    except csv.Error as err:
        return (
            f"a quote opened on line {line} is never closed ({err}): close it, or double a "
            'quote meant inside a field ("")'
        )
    except (OSError, UnicodeDecodeError, StopIteration):
        pass
    return ""


def _wanted_of(frame: pl.LazyFrame, file: Path, folder: Path, columns: Mapping[str, bool]):
    """A folder's file reduced to the wanted ``columns`` in one order: files may order their
    columns differently or carry others besides. Dates and datetimes become UTC datetimes
    (naive = UTC), so that files with and without a time zone combine."""
    names = _available_columns(frame, str(file))
    schema = frame.collect_schema()
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(
            f"{file} (in folder {folder}) lacks column(s) {missing}; its columns are {names}. "
            "Every file of the folder needs the mapped columns: fix that file or the column "
            "mapping (data.columns.*)"
        )
    return frame.select(
        _as_utc(column, schema[column])
        if isinstance(schema[column], (pl.Datetime, pl.Date))
        else pl.col(column)
        for column in columns
    )


def _as_utc(column: str, dtype: pl.DataType) -> pl.Expr:
    utc = pl.col(column).cast(pl.Datetime("us"))
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is not None:
        return pl.col(column).dt.convert_time_zone("UTC").dt.cast_time_unit("us")
    return utc.dt.replace_time_zone("UTC")


def csv_types(lf: pl.LazyFrame, columns: Mapping[str, bool], path: Path) -> pl.LazyFrame:
    """Type the wanted ``columns`` of a CSV read as text, from every row (a column that mixes
    numbers and text stays text instead of failing half-way through a later read).

    An id or name column (True in ``columns``; see :func:`_wanted`) becomes Int64 only when
    each value is exactly an integer's text (``7``, ``-12``), or UInt64 when each is that of
    a non-negative integer and some lie past Int64 (``18446744073709551615``): ids as written,
    so ``007`` and ``7`` stay two ids, and integer ids are the same (and give the same
    fingerprint) as in a Parquet file or a frame. The timestamp becomes Int64 or Float64 where
    every value parses, else stays text. One pass, in place of polars' own schema inference
    over every row."""
    try:
        present = [c for c in columns if c in lf.collect_schema()]
    except pl.exceptions.NoDataError:
        return lf  # no header: said where the columns are read
    as_int = {c: pl.col(c).cast(pl.Int64, strict=False) for c in present}
    # ids past Int64 (UInt64 ones, up to 2**64 - 1) as a Parquet file or a frame types them
    as_uint = {c: pl.col(c).cast(pl.UInt64, strict=False) for c in present if columns[c]}
    as_float = {c: pl.col(c).cast(pl.Float64, strict=False) for c in present}
    fits = [  # eq_missing: a value that does not parse (null) against text (not null) is False
        (as_int[c].cast(pl.String) if columns[c] else as_int[c].is_null())
        .eq_missing(pl.col(c) if columns[c] else pl.col(c).is_null())
        .all()
        .alias(f"int:{c}")
        for c in present
    ] + [
        as_float[c].is_null().eq(pl.col(c).is_null()).all().alias(f"float:{c}")
        for c in present
        if not columns[c]
    ]
    fits += [
        as_uint[c].cast(pl.String).eq_missing(pl.col(c)).all().alias(f"uint:{c}") for c in as_uint
    ]
    try:
        found = lf.select(fits).collect(engine="streaming").row(0, named=True) if present else {}
    except pl.exceptions.PolarsError as err:
        if "utf-8" in str(err):
            raise DataError(
                f"{path} is not UTF-8 text{_not_utf8(path)}: recsys reads UTF-8 CSV; export it "
                "as UTF-8, or re-encode it from the encoding it was exported in (e.g. iconv -f "
                "WINDOWS-1252 -t UTF-8)"
            ) from err
        # polars names no line, and suggests its own options: the line and its fix instead
        raise DataError(f"{path} could not be read as CSV: {_first_bad_line(path) or err}") from err
    except OSError as err:  # a .csv.gz cut short: polars' bare "unexpected end of file"
        raise DataError(
            f"{path} could not be read ({err}): the file is damaged or cut short (a download or "
            "copy that did not finish): export or copy it again"
        ) from err
    typed = [
        as_int[c] if found[f"int:{c}"] else as_uint[c] if found.get(f"uint:{c}") else as_float[c]
        for c in present
        if found[f"int:{c}"] or found.get(f"uint:{c}", False) or found.get(f"float:{c}", False)
    ]
    return lf.with_columns(typed)


def _as_lazy(
    source: EventSource, name: str, columns: Mapping[str, bool], option: str = "data.source.path"
) -> pl.LazyFrame:
    """``source`` as a LazyFrame; ``columns`` (wanted column -> is an id) types a CSV."""
    if isinstance(source, (str, os.PathLike)):
        return _scan_file(source_path(source), columns, option)
    if isinstance(source, pl.LazyFrame):
        return source
    if isinstance(source, pl.DataFrame):
        return source.lazy()
    if isinstance(source, pd.DataFrame):
        if not all(isinstance(c, str) for c in source.columns):
            # labels such as pd.read_csv(header=None)'s 0, 1, 2: as polars names them ("0", ...)
            source = source.copy(deep=False)
            source.columns = [str(c) for c in source.columns]
        in_index = [c for c in columns if c not in source.columns and c in source.index.names]
        if in_index:
            raise DataError(
                f"{name}: column(s) {in_index} are the frame's index, not columns: pass "
                "df.reset_index()"
            )
        repeated = sorted({str(c) for c in source.columns[source.columns.duplicated()]})
        if set(repeated) & set(columns):
            raise DataError(
                f"{name} has several columns named {sorted(set(repeated) & set(columns))}: "
                "keep one of each (df.loc[:, ~df.columns.duplicated()] keeps the first) or "
                "rename the copies"
            )
        if not set(columns) <= set(source.columns):
            # a mapped column is missing: select_mapped names it among the frame's columns
            return pl.LazyFrame(schema=dict.fromkeys(map(str, source.columns), pl.Null))
        # only the mapped columns: another column need not convert (mixed types, objects)
        source = source[list(columns)].copy(deep=False)  # the caller's frame stays as is
        # aware datetimes as UTC instants: polars takes named zones, not pandas' fixed offsets
        # (datetime64[us, UTC+05:30], what pd.to_datetime makes of "...+05:30", or an Arrow
        # timestamp with such a zone). pandas' own as naive UTC, which recsys reads as UTC
        # (polars' conversion of an aware one takes Series.values, deprecated in pandas 3.1)
        for column in source.columns:
            dtype = source[column].dtype
            # by name: pa.types.is_string_view is pyarrow >= 16 (15 has no string_view at all)
            if isinstance(dtype, pd.ArrowDtype) and str(dtype.pyarrow_dtype) == "string_view":
                # pandas (its dtype checks, astype) and polars' conversion raise
                # NotImplementedError on it: cast in Arrow
                text = pa.array(source[column].array).cast(pa.large_string())
                source[column] = pd.arrays.ArrowExtensionArray(text)  # by position
            elif pd.api.types.is_object_dtype(dtype) and _unsigned_64(source[column]):
                # Python ints past int64 (UInt64 ids from a database driver or JSON): polars'
                # conversion of an object column overflows on them
                source[column] = source[column].astype("UInt64")
            elif isinstance(dtype, pd.DatetimeTZDtype):
                source[column] = source[column].dt.tz_convert(None)  # naive UTC
            elif isinstance(dtype, pd.ArrowDtype) and _fixed_offset(dtype.pyarrow_dtype):
                utc = pa.timestamp(dtype.pyarrow_dtype.unit, "UTC")
                source[column] = source[column].astype(pd.ArrowDtype(utc))
        try:
            return pl.from_pandas(source).lazy()
        except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError) as err:
            mixed = [
                str(c)
                for c in source.columns
                if source[c].dtype == object and source[c].dropna().map(type).nunique() > 1
            ]
            if mixed:
                hint = (
                    f"column(s) {mixed} mix value types (e.g. numbers and strings): cast each "
                    "to one type, e.g. df[col] = df[col].astype(str)"
                )
            elif isinstance(err, OverflowError):
                wide = [
                    str(c)
                    for c in source.columns
                    if source[c].dtype == object
                    and any(isinstance(v, int) and abs(v) >= 2**63 for v in source[c])
                ]
                hint = (
                    f"column(s) {wide} of type object hold integers beyond Int64 and UInt64: "
                    "give such ids as text, e.g. df[col] = df[col].astype(str)"
                )
            else:  # e.g. lists that mix numbers and strings: name the column(s) that fail
                failing = [str(c) for c in source.columns if not _converts(source[[c]])]
                hint = (
                    f"column(s) {failing} hold values of several types (lists of numbers and "
                    "strings?): give each column one type, e.g. lists of strings"
                    if failing
                    else "check the column types"
                )
            raise DataError(f"{name} could not be converted to polars: {hint} ({err})") from err
    raise DataError(
        f"cannot read events from {type(source).__name__}: pass a CSV/Parquet path "
        "or a pandas/polars DataFrame"
    )


def _unsigned_64(values: pd.Series) -> bool:
    """An object column of integers, nulls aside, some beyond int64 and all within uint64."""
    known = values.dropna()
    return (
        len(known) > 0
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in known)
        and min(known) >= 0
        and 2**63 <= max(known) < 2**64
    )


def whole_number_ids(lf: pl.LazyFrame, columns: Iterable[str]) -> pl.LazyFrame:
    """``lf`` with each floating-point id column among ``columns`` whose values are all whole
    numbers that Int64 holds exactly (nulls and NaN aside) as Int64, NaN as null: an integer
    id column that pandas made float to hold one missing id, passed as a frame or written to
    Parquet, names the users and items that the same ids as integers do (the same vocabulary,
    fingerprint and outputs, not ``1041569.0``). A column with a fractional id stays float."""
    types = lf.collect_schema()
    floats = [c for c in columns if c in types and types[c].is_float()]
    if not floats:
        return lf
    ids = {c: pl.col(c) for c in floats}
    whole = [
        (ids[c].is_nan() | ((ids[c] == ids[c].floor()) & (ids[c].abs() < 2.0**53))).all().alias(c)
        for c in floats
    ]
    found = lf.select(whole).collect(engine="streaming").row(0, named=True)
    return lf.with_columns(ids[c].fill_nan(None).cast(pl.Int64) for c in floats if found[c])


def _available_columns(lf: pl.LazyFrame, name: str) -> list[str]:
    try:
        return lf.collect_schema().names()
    except pl.exceptions.NoDataError as err:
        raise DataError(f"{name} is empty: it has no header and no rows") from err
    except pl.exceptions.PolarsError as err:
        raise DataError(
            f"{name} could not be read: {err}. If it is a folder, its files must share the "
            "same columns and compatible types"
        ) from err


def _like(column: str, available: list[str]) -> str:
    """The one available column that differs from ``column`` only in case or surrounding
    spaces (quoted), else a placeholder: the fix a missing column's message suggests."""
    like = [a for a in available if a.strip().casefold() == column.strip().casefold()]
    return repr(like[0]) if len(like) == 1 else "<your column>"


def select_mapped(
    lf: pl.LazyFrame, columns: dict[str, str | None], *, name: str, option: str
) -> pl.LazyFrame:
    """Rename the mapped columns (``canonical -> source column``) to their canonical names.

    Raises :class:`DataError` naming the missing columns, the available ones and the override
    (``<option>.<canonical>=<your column>``) that fixes the mapping.
    """
    available = _available_columns(lf, name)
    mapped = {canonical: column for canonical, column in columns.items() if column}
    missing = {c: column for c, column in mapped.items() if column not in available}
    if missing:
        hints = ", ".join(
            f"{option}.{c}={_like(column, available)}" for c, column in missing.items()
        )
        raise DataError(
            f"{name} lacks column(s) {sorted(missing.values())} "
            f"(mapped as {missing}); its columns are {available}. "
            f"Fix the column mapping: {hints} (or null for an optional column)"
        )
    # keyed by canonical name: one source column may feed two canonical ones
    return lf.select([pl.col(column).alias(canonical) for canonical, column in mapped.items()])


def _wanted(columns: Mapping[str, str | None]) -> dict[str, bool]:
    """Mapped source columns -> whether each is read as written from a CSV: every column but
    the timestamp holds ids or names (users, items, sessions, event types, categories,
    attributes), which a number would change (``007`` -> 7, ``1.10`` -> 1.1)."""
    wanted: dict[str, bool] = {}
    for canonical, column in columns.items():
        if column:
            wanted[column] = wanted.get(column, False) or canonical != TIMESTAMP
    return wanted


def scan_events(
    source: EventSource, schema: EventSchema, *, name: str | None = None
) -> pl.LazyFrame:
    """Open an event log lazily and rename its mapped columns to the canonical names.

    ``source`` is a path (CSV, Parquet, or a folder of either), or a pandas / polars frame.
    Raises :class:`DataError` when a file is missing, empty, of an unsupported type, or lacks a
    mapped column; the message names the file (``name``, e.g. the loader call that made a
    frame: else :func:`describe_source`) and column and how to fix the mapping.
    """
    name = name or describe_source(source)
    lf = _as_lazy(source, name, _wanted(schema.columns))
    lf = select_mapped(lf, schema.columns, name=name, option="data.columns")
    return whole_number_ids(
        lf.select([c for c in CANONICAL_COLUMNS if schema.has(c)]), (USER, ITEM)
    )


# the optimizations that keep read_side_by_side's scans apart (common subplans shared, the
# groups would read through one scan again)
SIDE_BY_SIDE = pl.QueryOptFlags(comm_subplan_elim=False)


def read_side_by_side(lf: pl.LazyFrame, source: EventSource, schema: EventSchema) -> pl.LazyFrame:
    """``lf`` (:func:`scan_events` of ``source``) reading its columns in groups side by side,
    one per thread, when ``source`` is Parquet with fewer files, and files with fewer row
    groups, than polars has threads; otherwise ``lf`` itself.

    polars decodes the row groups of a file in parallel but the columns of one row group one
    after another, so a file of one row group (what pyarrow and pandas write up to 1 Mi rows)
    reads on one core. A horizontal concat of projections of ``lf`` scans the file once per
    group, side by side in the streaming engine, and stays lazy (1 M events on 2 cores: the raw
    read 27 ms against 44 ms). Groups are balanced by the columns' decoding work (values and
    page bytes). Collect it with ``comm_subplan_elim`` off (:data:`SIDE_BY_SIDE`), or polars
    shares one scan between the groups; and count rows on ``lf``, whose count reads only the
    files' footers where the concat's decodes columns.
    """
    threads = pl.thread_pool_size()
    if threads < 2 or not isinstance(source, (str, os.PathLike)):
        return lf
    files = _source_files(source_path(source))
    if not files or len(files) >= threads or any(_suffix(p) != ".parquet" for p in files):
        return lf
    names = lf.collect_schema().names()
    if len(names) < 2:
        return lf
    file_columns = {column: canonical for canonical, column in schema.columns.items() if column}
    size = dict.fromkeys(names, 0)
    try:
        for path in files:
            meta = pq.read_metadata(path)
            if meta.num_row_groups >= threads:
                return lf  # polars reads the row groups in parallel already
            for index in range(meta.num_row_groups):
                row_group = meta.row_group(index)
                for leaf in range(row_group.num_columns):
                    chunk = row_group.column(leaf)
                    canonical = file_columns.get(chunk.path_in_schema.split(".", 1)[0])
                    if canonical in size:  # decoding costs as much per value as per 8 bytes
                        size[canonical] += 8 * chunk.num_values + chunk.total_uncompressed_size
    except Exception:  # an unreadable footer: the read itself reports the file
        return lf
    groups: list[list[str]] = [[] for _ in range(min(threads, len(names)))]
    load = [0] * len(groups)
    for name in sorted(names, key=lambda n: -size[n]):
        lightest = load.index(min(load))
        groups[lightest].append(name)
        load[lightest] += size[name]
    return pl.concat([lf.select(group) for group in groups], how="horizontal").select(names)


def _converts(frame: pd.DataFrame) -> bool:
    """Whether polars converts ``frame``."""
    try:
        pl.from_pandas(frame)
    except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
        return False
    return True


def check_one_side(columns: Mapping[str, object], option: str, *, source: str = "") -> None:
    """An item's side information is one attribute set, read from the ``category`` column or
    from ``attributes``: with both mapped, the attributes replaced the category unseen."""
    if columns.get(CATEGORY) and columns.get(ATTRIBUTES):
        raise DataError(
            f"{source}{option} maps both category ({columns[CATEGORY]!r}) and attributes "
            f"({columns[ATTRIBUTES]!r}), but an item's side information is one set, read from "
            f"one of them (the category was left unused): set {option}.attributes=null or "
            f"{option}.category=null, or put the category into the attribute lists"
        )


def scan_items(
    source: EventSource, columns: dict[str, str | None], *, name: str | None = None
) -> pl.LazyFrame:
    """Open an item side table lazily: ``item_id`` plus ``category`` or ``attributes``.
    With ``category`` mapped, the default ``attributes: attributes`` applies only where the
    table has that column, and is then refused with it (:func:`check_one_side`). Messages
    name the table as ``name`` (else :func:`describe_source`)."""
    name = name or describe_source(source)
    if not columns.get(ITEM):
        raise DataError("data.item_columns.item_id is not set: name the item id column")
    if not (columns.get(CATEGORY) or columns.get(ATTRIBUTES)):
        raise DataError(
            f"{name}: data.item_columns maps neither category nor attributes, so the item "
            "table adds nothing: map one of them or set data.items=null"
        )
    lf = _as_lazy(source, name, _wanted(columns), option="data.items")
    if (
        columns.get(CATEGORY)
        and columns.get(ATTRIBUTES) == ATTRIBUTES
        and ATTRIBUTES not in _available_columns(lf, name)
    ):  # the default attributes mapping, with a category mapped: a table of item and category
        columns = {**columns, ATTRIBUTES: None}
        lf = _as_lazy(source, name, _wanted(columns), option="data.items")
    check_one_side(columns, "data.item_columns", source=f"{name}: ")
    return whole_number_ids(
        select_mapped(lf, columns, name=name, option="data.item_columns"), [ITEM]
    )


# Arrow's integer types -> pandas' nullable integer type of the same width
NULLABLE_INTEGERS = {
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.uint8(): pd.UInt8Dtype(),
    pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
}


def to_pandas(frame: pl.DataFrame) -> pd.DataFrame:
    """``frame`` as pandas, as polars converts it, but for an integer column that holds a null
    (an item id outside the vocabulary, a quarantined row's missing user id, an explanation
    past a short history): pandas' nullable integer type of its width (``Int64``,
    ``UInt64``), where the default float64 shows ids as ``1041569.0`` and rounds those beyond
    2**53 (UInt64 ids past 2**63) to other ids. A column without nulls keeps its numpy type."""
    out = frame.to_pandas()
    for name, dtype in frame.schema.items():
        if dtype.is_integer() and frame[name].null_count():
            out[name] = frame[name].to_pandas(types_mapper=NULLABLE_INTEGERS.get)
    return out


def cast_ids(ids: pl.Series, dtype: pl.DataType) -> pl.Series:
    """``ids`` (e.g. a user list's) in a table's id type ``dtype``, null where a value is not
    one of that type's ids: text that is no number, a number out of range, and a number with
    a fractional part for whole-number ids (which a plain cast would truncate to another
    user's id)."""
    cast = ids.cast(dtype, strict=False)
    if ids.dtype.is_float() and dtype.is_integer():
        cast = pl.select(pl.when(ids == ids.floor()).then(cast)).to_series().rename(ids.name)
    return cast


def read_user_list(path: str | os.PathLike, option: str = "users") -> pl.Series:
    """The user ids a CSV or Parquet file lists: its ``user_id`` column, or its only column
    (``option`` is the setting that named the file, for messages). Refused: a missing, empty or
    unsupported file, several columns none of them ``user_id``, no ids, a null id."""
    path = source_path(path)
    frame = _scan_file(path, {USER: True}, option)
    try:
        names = frame.collect_schema().names()
    except pl.exceptions.NoDataError as err:
        raise DataError(f"{path} lists no users: write one user id per row ({option})") from err
    if USER not in names and len(names) != 1:
        raise DataError(
            f"{path} has columns {names} and none is {USER!r}: name the column of user ids "
            f"{USER!r}, or keep only that column ({option})"
        )
    column = USER if USER in names else names[0]
    ids = frame.select(pl.col(column)).collect()[column]
    if ids.len() == 0:
        raise DataError(f"{path} lists no users: write one user id per row ({option})")
    if ids.null_count():
        raise DataError(
            f"{path}: {ids.null_count()} of its {ids.len()} rows have no user id in column "
            f"{column!r}: remove the empty rows ({option})"
        )
    return ids.rename(USER)
