"""Loaders for public dataset formats: each returns a ``pl.LazyFrame`` with canonical columns.

Point a loader at your own download; the matching ``conf/data/<name>.yaml`` maps the output
columns one to one (the ``columns:`` mapping is the identity).

==============================  ============================  ====================================
format: file                    function                      output columns
==============================  ============================  ====================================
Taobao: UserBehavior.csv        read_taobao                   user_id, item_id, category,
                                                              event_type, timestamp (s)
S3-Rec: <Name>.txt              read_s3rec                    user_id, item_id (file order)
S3-Rec: *_item2attributes.json  read_s3rec_attributes         item_id, attributes
MovieLens: ratings.dat          read_movielens_ratings        user_id, item_id, rating,
                                                              timestamp (s)
MovieLens: movies.dat           read_movielens_movies         item_id, attributes (genres)
SASRec: ml-1m.txt               read_sasrec                   user_id, item_id (file order)
SASRec ML-1M Parquet copy       read_movielens_sasrec_copy    user_id, item_id (user, position)
RetailRocket: events.csv        read_retailrocket             user_id, item_id, event_type,
                                                              timestamp (ms), transaction_id
RetailRocket: item_properties*  read_retailrocket_categories  item_id, category (latest;
                                                              history=True: every change
                                                              + timestamp (ms))
RecBole: <dataset>.inter        read_recbole                  the header's fields, typed (see it)
RecBole: <dataset>.item         read_recbole_items            the header's fields, typed
==============================  ============================  ====================================

Ids, ``category`` of Taobao, timestamps and ``transaction_id`` are Int64; ``rating`` is Float64;
``event_type`` is the raw event name (str), mapped by ``data.behavior_aliases``; ``attributes``
is list[str]; the RetailRocket ``category`` is str. Order-only formats have no ``timestamp``
column: the pipeline reads them by input order.

Contract shared by every loader:

* ``path`` is a ``str`` or ``os.PathLike``; plain and gzip-compressed files are both read (gzip is
  recognised by its magic bytes, whatever the suffix). Plain text files are scanned lazily and
  stream; a gzip file is decompressed into memory first (eagerly) and then scanned lazily from
  there, so decompress a very large file before reading it.
* Structural problems raise :class:`~recsys.data.io.DataError` naming the file, the problem and
  the fix: a missing or empty file, a Parquet / zip / binary file where text is expected, a first
  record with the wrong number of fields or a header where the format has none, a wrong header.
* Rows are never dropped or repaired silently. A malformed row comes through as a row with nulls
  (an id or timestamp that is not an integer, a missing field; surplus fields stay in the last
  field, which then fails to parse), so the pipeline's bad-row policy (``data.bad_rows``) stops
  or quarantines it. Only blank lines are skipped, as they hold no record (except in
  :func:`read_taobao`, whose fast typed scan reads every line, a blank one as a row of nulls,
  though blank lines at the end of the file are skipped there too).
* A text file whose last line has no line end was most likely cut mid-row (a truncated download,
  ``head -c``): that line's last field may be incomplete, so it is read as null (a missing field is
  null anyway) and a warning names the file and the line. If the file is in fact complete, append
  a line end (``echo >> FILE``) to read that value.

Example::

    >>> lf = read_taobao("UserBehavior.csv")          # doctest: +SKIP
    >>> lf.collect_schema().names()                    # doctest: +SKIP
    ['user_id', 'item_id', 'category', 'event_type', 'timestamp']
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recsys.data.io import NOT_TEXT, RECBOLE_SUFFIXES, DataError, csv_types
from recsys.schema import CATEGORY, EVENT_TYPE, ITEM, TIMESTAMP, USER

log = logging.getLogger(__name__)

PathLike = str | os.PathLike

ATTRIBUTES = "attributes"
RATING = "rating"
TRANSACTION_ID = "transaction_id"

__all__ = [
    "read_movielens_movies",
    "read_movielens_ratings",
    "read_movielens_sasrec_copy",
    "read_recbole",
    "read_recbole_items",
    "read_retailrocket",
    "read_retailrocket_categories",
    "read_s3rec",
    "read_s3rec_attributes",
    "read_sasrec",
    "read_taobao",
]

_LINE = "_line"  # 0-based line number in the file
_TEXT = "_text"  # the line's text, stripped
_FILE = "_file"
_STRIP = " \t\r\n\ufeff"  # whitespace, CR of CRLF files and a UTF-8 byte-order mark
_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_HEAD_BYTES = 1 << 16
_CHUNK_BYTES = 1 << 24


# ---------------------------------------------------------------------------------------------
# Text files: one LazyFrame row per non-blank line
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """A text file opened for scanning: its bytes in memory (gzip, re-encoded) or its path."""

    path: Path
    what: str
    data: bytes | None  # decompressed / UTF-8 re-encoded content; None: scan ``path`` itself
    first: str  # the first non-blank line (the header, for formats that have one)
    first_idx: int  # its line number (0-based)
    cut: tuple[int, str] | None  # (line number, text) of a last line without a line end

    @property
    def scan_source(self) -> bytes | Path:
        return self.data if self.data is not None else self.path


def _existing_file(path: PathLike, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise DataError(f"{what}: expected a file path (str or os.PathLike), got {path!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{p} does not exist: point the path at your {what} file")
    if p.is_dir():
        raise DataError(f"{p} is a folder: point the path at the {what} file inside it")
    if p.stat().st_size == 0:
        raise DataError(f"{p} is empty (0 bytes): download the {what} file again")
    return p


def _reject_non_text(path: Path, head: bytes, what: str, inside_gzip: bool = False) -> None:
    where = " (inside the gzip)" if inside_gzip else ""
    for magic, kind in NOT_TEXT.items():
        if head.startswith(magic):
            raise DataError(f"{path} is {kind}{where}, not the {what} text file")
    if b"\x00" in head:
        raise DataError(f"{path} is a binary file{where}, not the {what} text file")


def _line_ends(path: Path) -> tuple[int, int]:
    """``(count, offset of the last)`` of a file's line ends (offset -1: none), in one pass."""
    with open(path, "rb") as f:
        count, offset, last_nl = 0, 0, -1
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            n = chunk.count(b"\n")
            if n:
                count += n
                last_nl = offset + chunk.rfind(b"\n")
            offset += len(chunk)
    return count, last_nl


def _last_line_info(path: Path, data: bytes | None) -> tuple[int, bytes] | None:
    """``(line number, bytes)`` of the last line when the file does not end with a line end."""
    if data is not None:
        if data.endswith(b"\n"):
            return None
        return data.count(b"\n"), data[data.rfind(b"\n") + 1 :]
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return None
    count, last_nl = _line_ends(path)
    with open(path, "rb") as f:
        f.seek(last_nl + 1)
        return count, f.read()


def _trailing_blank_rows(src: _Source) -> tuple[int, int] | None:
    """``(rows, blank)`` when the file ends in blank lines: a CSV scan's row count (one per line)
    and how many of its last rows are blank lines. Only the file's tail is read, and the lines
    are counted (one pass) only when it does end in blank lines."""
    if src.data is not None:
        tail = src.data[-_HEAD_BYTES:]
    else:
        with open(src.path, "rb") as f:
            f.seek(max(0, src.path.stat().st_size - _HEAD_BYTES))
            tail = f.read()
    lines = tail.split(b"\n")
    if lines[-1] == b"":  # after the last line end: no row
        lines.pop()
    blank = 0
    for line in reversed(lines[1:]):  # (the first may be part of a longer line)
        if line.decode("utf-8", "replace").strip(_STRIP):
            break
        blank += 1
    if not blank:
        return None
    count = src.data.count(b"\n") if src.data is not None else _line_ends(src.path)[0]
    rows = count + (0 if tail.endswith(b"\n") else 1)
    return rows, blank


def _read_source(path: PathLike, what: str, *, encoding: str = "utf-8") -> _Source:
    """Check that ``path`` is a text file (plain or gzip); find its first line and cut last line."""
    p = _existing_file(path, what)
    with open(p, "rb") as f:
        magic = f.read(8)
    data: bytes | None = None
    if magic.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(p.read_bytes())
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(
                f"{p} is a damaged or truncated gzip file ({err}): download it again"
            ) from err
        if not data:
            raise DataError(f"{p} decompresses to nothing: download the {what} file again")
        log.info("%s: gzip file decompressed into memory (%d bytes)", p, len(data))
        head = data[:_HEAD_BYTES]
        _reject_non_text(p, head, what, inside_gzip=True)
    else:
        with open(p, "rb") as f:
            head = f.read(_HEAD_BYTES)
        _reject_non_text(p, head, what)

    if head.startswith(_UTF8_BOM):  # the mark says UTF-8, whatever the format's usual encoding
        encoding = "utf-8"
    head_lines = head.split(b"\n")
    first_idx = next(
        (i for i, line in enumerate(head_lines) if line.decode(encoding, "replace").strip(_STRIP)),
        None,
    )
    if first_idx is None:
        if len(head) < _HEAD_BYTES:
            raise DataError(f"{p} holds only blank lines: download the {what} file again")
        raise DataError(f"{p} starts with {_HEAD_BYTES} bytes of blank lines: is it {what}?")
    first = head_lines[first_idx].decode(encoding, "replace").strip(_STRIP)

    cut = None
    last = _last_line_info(p, data)
    if last is not None and last[1].decode(encoding, "replace").strip(_STRIP):
        line_no, raw = last
        text = raw.decode(encoding, "replace").strip(_STRIP)
        fix = f"echo >> {p}" if data is None else "decompress it, then echo >> FILE"
        log.warning(
            "%s: the last line (line %d: %r) has no line end, so it was probably cut mid-row; "
            "its last field is read as null (if the file is complete, append a line end: %s)",
            p,
            line_no + 1,
            text[-80:],
            fix,
        )
        cut = (line_no, text)
    if encoding.replace("-", "").lower() not in ("utf8", "ascii"):
        data = (data if data is not None else p.read_bytes()).decode(encoding).encode("utf-8")
        log.debug("%s: read into memory to decode it from %s", p, encoding)
    return _Source(path=p, what=what, data=data, first=first, first_idx=first_idx, cut=cut)


def _scan_lines(src: _Source, sep: str, *, header: bool = False) -> pl.LazyFrame:
    """One row per non-blank line: ``_line`` (line number) and ``_text`` (stripped).

    ``sep`` is the field separator: the last field of a cut last line is emptied (read as null).
    ``header``: the first non-blank line is a header and is left out.
    """
    lf = (
        pl.scan_csv(
            src.scan_source,
            has_header=False,
            separator="\x00",  # no field splitting: one string per line (binary files rejected)
            quote_char=None,
            schema={_TEXT: pl.String},
            empty_string_is_null=False,
            encoding="utf8-lossy",
        )
        .with_row_index(_LINE)
        .with_columns(pl.col(_TEXT).str.strip_chars(_STRIP))
        .filter(pl.col(_TEXT) != "")
    )
    if header:
        lf = lf.filter(pl.col(_LINE) > src.first_idx)
    if src.cut is not None:
        line_no, text = src.cut
        kept = text[: text.rfind(sep) + len(sep)] if sep in text else ""
        lf = lf.with_columns(
            pl.when(pl.col(_LINE) == line_no)
            .then(pl.lit(kept))
            .otherwise(pl.col(_TEXT))
            .alias(_TEXT)
        )
    return lf


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _shown(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")


def _check_first_record(src: _Source, sep: str, n_fields: int, int_fields: tuple[int, ...]) -> None:
    """A headerless file's first record must have ``n_fields`` fields, integers where stated."""
    fields = src.first.split(sep)
    if len(fields) != n_fields:
        raise DataError(
            f"{src.path}: the first line {_shown(src.first)} has {len(fields)} field(s) "
            f"separated by {sep!r}, but {src.what} has {n_fields}; is this the right file "
            "and loader?"
        )
    bad = [i for i in int_fields if not _is_int(fields[i])]
    if bad:
        raise DataError(
            f"{src.path}: the first line {_shown(src.first)} is not a {src.what} record "
            f"(field {bad[0] + 1} is not an integer); {src.what} has no header line: "
            "remove it, or check the file"
        )


def _check_header(src: _Source, expected: str) -> None:
    if src.first.replace(" ", "") != expected:
        raise DataError(
            f"{src.path}: header {_shown(src.first)} is not the {src.what} header "
            f"{expected!r}; is this the right file and loader?"
        )


def _fields(sep: str, names: list[str]) -> pl.Expr:
    """The line split into ``len(names)`` fields: surplus separators stay in the last field."""
    return pl.col(_TEXT).str.splitn(sep, len(names)).struct.rename_fields(names).alias("_f")


def _field(name: str) -> pl.Expr:
    return pl.col("_f").struct.field(name)


def _int(expr: pl.Expr) -> pl.Expr:
    """An integer, or null when the text is empty or not an integer."""
    return expr.cast(pl.Int64, strict=False)


def _str(expr: pl.Expr) -> pl.Expr:
    """The text, or null when empty."""
    return pl.when(expr.str.len_bytes() > 0).then(expr)


# ---------------------------------------------------------------------------------------------
# Event tables
# ---------------------------------------------------------------------------------------------

_TAOBAO_FIELDS = [USER, ITEM, CATEGORY, EVENT_TYPE, TIMESTAMP]


def read_taobao(path: PathLike) -> pl.LazyFrame:
    """Taobao UserBehavior (Tianchi dataset 649): headerless ``UserBehavior.csv``.

    Each line is ``user,item,category,behaviour,timestamp``, for example
    ``1,2268318,2520377,pv,1511544070`` (behaviour pv / cart / fav / buy; Unix seconds). Returns
    ``user_id, item_id, category`` (Int64), ``event_type`` (the raw string;
    ``data.behavior_aliases`` maps pv -> view, buy -> purchase) and ``timestamp`` (Int64
    seconds), in file order.

    A plain file is read by polars' typed CSV scanner and streams (the full 3.5 GB file is fine);
    a ``.gz`` is decompressed into memory first. Every line is one row, so unlike the other text
    loaders a blank line here is a row of nulls, except blank lines at the end of the file
    (skipped); a value that is not an integer is a null. A line
    with more than five fields makes polars fail at collect time ("found more fields than
    defined in 'Schema'"): such a file is not in this format.

    >>> read_taobao("UserBehavior.csv").head(1).collect().row(0)   # doctest: +SKIP
    (1, 2268318, 2520377, 'pv', 1511544070)
    """
    src = _read_source(path, "Taobao UserBehavior.csv")
    _check_first_record(src, ",", 5, (0, 1, 2, 4))
    schema = {name: pl.String if name == EVENT_TYPE else pl.Int64 for name in _TAOBAO_FIELDS}
    # Typed parsing is ~3x faster than splitting lines ourselves; ignore_errors turns a value
    # that does not parse into a null (the row stays), it does not skip lines.
    lf = pl.scan_csv(
        src.scan_source,
        has_header=False,
        schema=schema,
        quote_char=None,
        ignore_errors=True,
        encoding="utf8-lossy",
    )
    trailing = _trailing_blank_rows(src)
    if trailing is not None:  # blank lines at the end hold no record: not rows of nulls
        rows, blank = trailing
        lf = lf.slice(0, rows - blank)
    if src.cut is not None:  # null the possibly cut last field (missing fields are null already)
        line_no, text = src.cut
        cut_from = min(text.count(","), len(_TAOBAO_FIELDS) - 1)
        keep = pl.col(_LINE) != line_no
        lf = lf.with_row_index(_LINE).select(
            pl.when(keep).then(pl.col(name)).alias(name) if i >= cut_from else pl.col(name)
            for i, name in enumerate(_TAOBAO_FIELDS)
        )
    return lf


def read_s3rec(path: PathLike) -> pl.LazyFrame:
    """S3-Rec Amazon ``<Name>.txt`` (Beauty, Sports_and_Outdoors, Toys_and_Games, ...).

    Each line is one user's chronological sequence ``user item1 item2 ...`` (space-separated, no
    timestamps). Returns ``user_id, item_id`` (Int64), one row per interaction, in file order (the
    pipeline reads order-only logs by input order). A line holding only a user id gives one row
    with a null ``item_id``; a token that is not an integer gives a null. A user id on more than
    one line is refused (:class:`~recsys.data.io.DataError`): the lines' order is no time order.

    >>> read_s3rec("Beauty.txt").head(3).collect().rows()   # doctest: +SKIP
    [(1, 1), (1, 2), (1, 3)]
    """
    src = _read_source(path, "S3-Rec <Name>.txt")
    tokens = src.first.split(" ")
    if len(tokens) < 2 or not all(_is_int(t) for t in tokens):
        raise DataError(
            f"{src.path}: the first line {_shown(src.first)} is not an S3-Rec sequence "
            "('user item1 item2 ...', space-separated integers); is this the right file?"
        )
    split = pl.col(_TEXT).str.split(" ")
    repeated = (
        _scan_lines(src, " ")
        .select(_LINE, _int(split.list.first()).alias(USER))
        .drop_nulls(USER)
        .group_by(USER)
        .agg(pl.col(_LINE).sort() + 1)
        .filter(pl.col(_LINE).list.len() > 1)
        .sort(USER)
        .collect()
    )
    if repeated.height:
        user, lines = repeated.row(0)
        raise DataError(
            f"{src.path}: user {user} has more than one line (lines {lines[:5]}), and "
            f"{repeated.height} user(s) in all; the format has one line per user, so their "
            "sequences would be joined into one (a file appended to itself repeats every "
            "item, the test target included): remove the repeated lines"
        )
    items = split.list.slice(1)
    return (
        _scan_lines(src, " ")
        .select(
            _int(split.list.first()).alias(USER),
            # an empty list would vanish in explode: keep the line as one row with a null item
            pl.when(items.list.len() > 0)
            .then(items)
            .otherwise(pl.concat_list(pl.lit(None, dtype=pl.String)))
            .alias(ITEM),
        )
        .explode(ITEM)
        .with_columns(_int(pl.col(ITEM)))
    )


def read_sasrec(path: PathLike) -> pl.LazyFrame:
    """SASRec's preprocessed ``ml-1m.txt`` (also its Beauty / Steam files): ``user item`` per line.

    One interaction per line, space-separated, chronological per user; ids are SASRec's remapped
    ones (so MovieLens ``movies.dat`` does not join). Returns ``user_id, item_id`` (Int64) in file
    order.

    >>> read_sasrec("ml-1m.txt").head(2).collect().rows()   # doctest: +SKIP
    [(1, 1), (1, 2)]
    """
    src = _read_source(path, "SASRec ml-1m.txt")
    _check_first_record(src, " ", 2, (0, 1))
    return (
        _scan_lines(src, " ")
        .select(_fields(" ", [USER, ITEM]))
        .select(_int(_field(USER)).alias(USER), _int(_field(ITEM)).alias(ITEM))
    )


def read_movielens_ratings(path: PathLike) -> pl.LazyFrame:
    """MovieLens ``ratings.dat`` (ML-1M, ML-10M): ``UserID::MovieID::Rating::Timestamp``.

    Returns ``user_id, item_id`` (Int64), ``rating`` (Float64: ML-10M has half stars) and
    ``timestamp`` (Int64, Unix seconds), in file order.

    >>> read_movielens_ratings("ratings.dat").head(1).collect().row(0)   # doctest: +SKIP
    (1, 1193, 5.0, 978300760)
    """
    src = _read_source(path, "MovieLens ratings.dat")
    if src.first.replace(" ", "").lower() == "userid,movieid,rating,timestamp":
        raise DataError(
            f"{src.path} is a MovieLens ratings.csv (ML-20M, ML-25M, ml-latest: a CSV with a "
            "header), not the '::'-separated ratings.dat this loader reads: prepare it as any "
            f"CSV, data=events_file data.source={src.path} data.columns.user_id=userId "
            "data.columns.item_id=movieId data.columns.event_type=null"
        )
    _check_first_record(src, "::", 4, (0, 1, 3))
    names = [USER, ITEM, RATING, TIMESTAMP]
    return (
        _scan_lines(src, "::")
        .select(_fields("::", names))
        .select(
            _int(_field(USER)).alias(USER),
            _int(_field(ITEM)).alias(ITEM),
            _field(RATING).cast(pl.Float64, strict=False).alias(RATING),
            _int(_field(TIMESTAMP)).alias(TIMESTAMP),
        )
    )


_SASREC_COPY_COLUMNS = ("user_sas", "position", "movie_id")


def read_movielens_sasrec_copy(path: PathLike) -> pl.LazyFrame:
    """The shared SASRec-ordered MovieLens-1M copy ``sasrec_ml1m_interactions.parquet``.

    Returns ``user_id`` (= ``user_sas``, SASRec's user id) and ``item_id`` (= ``movie_id``, the
    original MovieID, so ``movies.dat`` genres join), both Int64, sorted by ``user_sas``,
    ``position`` (SASRec's chronological order; no timestamps). See that folder's PROVENANCE.md:
    for most users the second-to-last item is missing.

    >>> read_movielens_sasrec_copy("sasrec_ml1m_interactions.parquet").head(1).collect().row(0)
    ... # doctest: +SKIP
    (1, 1198)
    """
    what = "SASRec MovieLens-1M Parquet copy"
    p = _existing_file(path, what)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"PAR1":
        raise DataError(f"{p} is not a Parquet file: point the path at the {what}")
    try:
        lf = pl.scan_parquet(p)
        names = lf.collect_schema().names()
    except Exception as err:  # polars raises several error types for corrupt files
        raise DataError(f"{p} is not a readable Parquet file: {err}") from err
    missing = [c for c in _SASREC_COPY_COLUMNS if c not in names]
    if missing:
        raise DataError(
            f"{p} lacks column(s) {missing} of the {what} (its columns are {names}); "
            "is this sasrec_ml1m_interactions.parquet?"
        )
    return lf.sort("user_sas", "position", maintain_order=True).select(
        pl.col("user_sas").cast(pl.Int64).alias(USER),
        pl.col("movie_id").cast(pl.Int64).alias(ITEM),
    )


_RETAILROCKET_EVENTS_HEADER = "timestamp,visitorid,event,itemid,transactionid"


def read_retailrocket(path: PathLike) -> pl.LazyFrame:
    """RetailRocket ``events.csv``: header ``timestamp,visitorid,event,itemid,transactionid``.

    Returns ``user_id`` (visitorid), ``item_id`` (Int64), ``event_type`` (the raw string: view /
    addtocart / transaction), ``timestamp`` (Int64, Unix **milliseconds**: set
    ``data.timestamp_unit=ms``) and ``transaction_id`` (Int64, null except on transactions), in
    file order.

    >>> read_retailrocket("events.csv").head(1).collect().row(0)   # doctest: +SKIP
    (257597, 355908, 'view', 1433221332117, None)
    """
    src = _read_source(path, "RetailRocket events.csv")
    _check_header(src, _RETAILROCKET_EVENTS_HEADER)
    names = _RETAILROCKET_EVENTS_HEADER.split(",")
    return (
        _scan_lines(src, ",", header=True)
        .select(_fields(",", names))
        .select(
            _int(_field("visitorid")).alias(USER),
            _int(_field("itemid")).alias(ITEM),
            _str(_field("event")).alias(EVENT_TYPE),
            _int(_field("timestamp")).alias(TIMESTAMP),
            _int(_field("transactionid")).alias(TRANSACTION_ID),
        )
    )


_RECBOLE_TYPES = ("token", "token_seq", "float", "float_seq")


def _recbole_file(path: PathLike, suffix: str) -> Path:
    """A RecBole atomic file: ``path`` itself, ``<path>/<folder name>.<suffix>`` for the dataset
    folder (RecBole's ``<data_path>/<dataset>/<dataset>.inter``), or, for another atomic file of
    the dataset (``data=recbole`` passes the source's path on to the items), its sibling."""
    what = f"RecBole <dataset>.{suffix}"
    if not isinstance(path, (str, os.PathLike)):
        raise DataError(
            f"{what}: expected a file or folder path (str or os.PathLike), got {path!r}"
        )
    p = Path(path).expanduser()
    if p.suffix in RECBOLE_SUFFIXES and p.suffix != f".{suffix}":
        sibling = p.with_suffix(f".{suffix}")
        if suffix == "item" and p.exists() and not sibling.exists():
            raise DataError(
                f"{p.parent} holds no {sibling.name} beside {p.name}: give the item file's path "
                "(data.items.path), or data.items=null for a dataset without one"
            )
        return sibling
    if not p.is_dir():
        return p
    file = p / f"{p.resolve().name}.{suffix}"
    if file.exists():
        return file
    found = sorted(f.name for f in p.glob(f"*.{suffix}"))
    also = f"; it holds {found[:5]}: give that file's path" if found else ""
    none = " (a dataset without one: data.items=null)" if suffix == "item" else ""
    raise DataError(
        f"{p} is a folder without {file.name}: RecBole keeps a dataset's atomic files as "
        f"<data_path>/<dataset>/<dataset>.{suffix}, so point the path at that folder or at "
        f"the file{also}{none}"
    )


def _read_recbole(path: PathLike, suffix: str, seq_separator: str) -> pl.LazyFrame:
    """An atomic file: the header's fields ``name:type`` as columns ``name``, typed."""
    file = _recbole_file(path, suffix)
    src = _read_source(file, f"RecBole <dataset>.{suffix}")
    if not seq_separator:
        raise DataError(
            f"{src.path}: seq_separator is empty; RecBole's default (seq_separator) is ' '"
        )
    fields = src.first.split("\t")
    types: dict[str, str] = {}
    for field in fields:
        name, _, kind = field.rpartition(":")
        if not name or kind not in _RECBOLE_TYPES:
            raise DataError(
                f"{src.path}: header field {field!r} is not RecBole's 'name:type' (type one of "
                f"{', '.join(_RECBOLE_TYPES)}), in a tab-separated header such as "
                f"'user_id:token\\titem_id:token\\ttimestamp:float'; is this a RecBole atomic "
                "file? (any other tab-separated log: data=events_file, see the README)"
            )
        if name in types:
            raise DataError(f"{src.path}: the header names field {name!r} twice: rename one")
        types[name] = kind
    if src.first_idx:  # RecBole reads the first line as the header
        raise DataError(f"{src.path}: {src.first_idx} blank line(s) before the header: remove them")
    lf = pl.scan_csv(
        src.scan_source,
        separator="\t",
        has_header=True,
        infer_schema=False,  # every field as text, typed below
        # one record per line, quotes as written: RecBole's converters write no quoting, and a
        # title opening a quote it never closes (pandas' reading) would swallow the next lines
        quote_char=None,
    )
    lf = lf.rename(dict(zip(lf.collect_schema().names(), types)))
    if src.cut is not None:  # (its line was named in a warning by _read_source)
        last = next(reversed(types))
        whole = pl.int_range(pl.len()) < pl.len() - 1
        lf = lf.with_columns(pl.when(whole).then(pl.col(last)).alias(last))
    # tokens as ids are read from a CSV (integers when each is an integer's text), floats as
    # numbers (or left text where one does not parse, for the bad-row policy to name)
    scalar = {name: kind == "token" for name, kind in types.items() if not kind.endswith("_seq")}
    lf = csv_types(lf, scalar, src.path)
    schema = lf.collect_schema()
    return lf.with_columns(
        [
            pl.col(name).cast(pl.Float64, strict=False)
            for name, kind in types.items()
            if kind == "float" and schema[name] != pl.String
        ]
        + [
            pl.col(name)
            .fill_null("")
            .str.split(seq_separator)
            .list.eval(pl.element().filter(pl.element() != ""))
            .cast(pl.List(pl.Float64 if kind == "float_seq" else pl.String), strict=False)
            for name, kind in types.items()
            if kind.endswith("_seq")
        ]
    )


def read_recbole(path: PathLike, *, seq_separator: str = " ") -> pl.LazyFrame:
    """RecBole's interaction atomic file ``<dataset>.inter`` (tab-separated, typed header).

    ``path`` is the file or the dataset folder (``<data_path>/<dataset>``, RecBole's layout),
    which must hold ``<dataset>.inter``. The header names each field with its type,
    ``user_id:token\titem_id:token\trating:float\ttimestamp:float``; each column is named by
    its field (``user_id``, ...) and typed as RecBole types it: ``token`` as an id (Int64 when
    every value is an integer's text, else str, as a CSV's ids), ``float`` as Float64 (kept as
    text when a value does not parse, so the bad-row policy names the row), ``token_seq`` as
    list[str] and ``float_seq`` as list[float], split on ``seq_separator`` (RecBole's
    ``seq_separator``, a space), empty tokens left out. Each line is one record and a quote is
    a character (RecBole's converters write no quoting; a title such as ``"Fresh" Wash`` stays
    as written, where a reader with CSV quoting would strip it, or join lines at a quote never
    closed). A header that is not RecBole's is refused, naming the field.

    >>> read_recbole("dataset/ml-100k").head(1).collect().row(0)   # doctest: +SKIP
    (196, 242, 3.0, 881250949.0)
    """
    return _read_recbole(path, "inter", seq_separator)


# ---------------------------------------------------------------------------------------------
# Item side tables
# ---------------------------------------------------------------------------------------------


def read_s3rec_attributes(path: PathLike) -> pl.LazyFrame:
    """S3-Rec ``<Name>_item2attributes.json``: ``{"<item id>": [attribute ids...], ...}``.

    Returns ``item_id`` (Int64, as :func:`read_s3rec`) and ``attributes`` (list[str], the
    attribute ids as strings), in file order. A key that is not an integer gives a null
    ``item_id``; a value that is not a list of ids gives null ``attributes``; a repeated key
    gives two rows. The (small) file is read eagerly, then ``.lazy()``.

    >>> read_s3rec_attributes("Beauty_item2attributes.json").head(1).collect().row(0)
    ... # doctest: +SKIP
    (4, ['1', '2', '3'])
    """
    what = "S3-Rec <Name>_item2attributes.json"
    p = _existing_file(path, what)
    raw = p.read_bytes()
    if raw.startswith(_GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(
                f"{p} is a damaged or truncated gzip file ({err}): download it again"
            ) from err
    _reject_non_text(p, raw[:_HEAD_BYTES], what)
    try:
        # pairs, not a dict: a repeated key must not silently replace the earlier one
        pairs = json.loads(raw.decode("utf-8-sig"), object_pairs_hook=lambda kv: kv)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(
            f"{p} is not valid JSON ({err}): is this the {what} file (not the <Name>.txt "
            "sequences)? If it is, download it again"
        ) from err
    if not isinstance(pairs, list) or not all(isinstance(kv, tuple) for kv in pairs):
        raise DataError(
            f'{p}: expected a JSON object {{"<item id>": [attribute ids], ...}}, '
            f"got {type(pairs).__name__}; is this the right file?"
        )

    def attrs(value: object) -> list[str] | None:
        ok = isinstance(value, list) and all(
            isinstance(a, (int, str)) and not isinstance(a, bool) for a in value
        )
        return [str(a) for a in value] if ok else None

    frame = pl.DataFrame(
        {"_key": [k for k, _ in pairs], ATTRIBUTES: [attrs(v) for _, v in pairs]},
        schema={"_key": pl.String, ATTRIBUTES: pl.List(pl.String)},
    )
    return frame.lazy().select(_int(pl.col("_key").str.strip_chars()).alias(ITEM), ATTRIBUTES)


def read_movielens_movies(path: PathLike) -> pl.LazyFrame:
    """MovieLens ``movies.dat``: ``MovieID::Title::Genres`` (pipe-separated genres, latin-1).

    Returns ``item_id`` (Int64) and ``attributes`` (list[str]: the genres), in file order. The id
    is the text before the first ``::`` and the genres the text after the last one, so a title
    holding ``:`` (even at its end) or ``::`` is harmless. The file is read into memory to decode
    it from ISO-8859-1, then scanned lazily.

    >>> read_movielens_movies("movies.dat").head(1).collect().row(0)   # doctest: +SKIP
    (1, ['Animation', "Children's", 'Comedy'])
    """
    src = _read_source(path, "MovieLens movies.dat", encoding="latin-1")
    if src.first.count("::") < 2 or not _is_int(src.first.split("::", 1)[0]):
        raise DataError(
            f"{src.path}: the first line {_shown(src.first)} is not a {src.what} record "
            "('MovieID::Title::Genres'); is this the right file?"
        )
    if _is_int(src.first.rsplit("::", 1)[1]):  # ratings.dat / users.dat end in a number
        raise DataError(
            f"{src.path}: the first line {_shown(src.first)} is not a {src.what} record "
            "('MovieID::Title::Genres': its last field holds genre names, not a number); it "
            "looks like ratings.dat ('UserID::MovieID::Rating::Timestamp') or users.dat: point "
            "the path (data.items.path) at movies.dat"
        )
    genres = pl.col(_TEXT).str.extract(r"^.*?::.*::(.*)$", 1)
    return _scan_lines(src, "::").select(
        _int(pl.col(_TEXT).str.extract(r"^(.*?)::", 1)).alias(ITEM),
        _str(genres).str.split("|").alias(ATTRIBUTES),
    )


_RETAILROCKET_PROPERTIES_HEADER = "timestamp,itemid,property,value"


def read_retailrocket_categories(*paths: PathLike, history: bool = False) -> pl.LazyFrame:
    """RetailRocket item categories from ``item_properties_part1.csv``, ``..._part2.csv``.

    Each file has the header ``timestamp,itemid,property,value``; rows whose ``property`` is
    ``categoryid`` give an item's category. Categories change over time: the value with the
    **latest timestamp** wins (a tie goes to the row that comes later, in the order the files are
    given; a null timestamp counts as the oldest). Returns ``item_id`` (Int64) and ``category``
    (str), one row per item, sorted by ``item_id``; an unparseable item id is kept as a null
    ``item_id`` row.

    ``history=True`` returns every ``categoryid`` row instead, with its ``timestamp`` (Int64,
    Unix ms), in file order: with ``data.item_columns.timestamp=timestamp`` the pipeline then
    takes each item's latest value at the end of the training window, so a category recorded
    later (in the validation or test period) is not used (``conf/data/retailrocket.yaml``).

    >>> read_retailrocket_categories("item_properties_part1.csv", "item_properties_part2.csv")
    ... # doctest: +SKIP
    """
    if not paths:
        raise DataError(
            "read_retailrocket_categories needs at least one item_properties_*.csv path"
        )
    names = _RETAILROCKET_PROPERTIES_HEADER.split(",")
    frames = []
    for i, path in enumerate(paths):
        src = _read_source(path, "RetailRocket item_properties_*.csv")
        _check_header(src, _RETAILROCKET_PROPERTIES_HEADER)
        frames.append(
            _scan_lines(src, ",", header=True)
            .select(pl.lit(i, dtype=pl.Int64).alias(_FILE), _LINE, _fields(",", names))
            .filter(_field("property") == "categoryid")
            .select(
                _FILE,
                _LINE,
                _int(_field("itemid")).alias(ITEM),
                _str(_field("value")).alias(CATEGORY),
                _int(_field("timestamp")).alias(TIMESTAMP),
            )
        )
    rows = pl.concat(frames, how="vertical")
    if history:
        return rows.select(ITEM, CATEGORY, TIMESTAMP)
    return (
        rows.group_by(ITEM)
        .agg(pl.col(CATEGORY).sort_by(TIMESTAMP, _FILE, _LINE, nulls_last=False).last())
        .sort(ITEM, nulls_last=False)
    )


def read_recbole_items(path: PathLike, *, seq_separator: str = " ") -> pl.LazyFrame:
    """RecBole's item atomic file ``<dataset>.item``, read as :func:`read_recbole` reads
    ``.inter`` (``path``: the file or the dataset folder holding ``<dataset>.item``).

    RecBole's Amazon files hold ``item_id:token\tcategories:token_seq\ttitle:token\t...``:
    ``categories`` comes out as list[str] (the attribute set ``data=recbole`` maps), the
    MovieLens ones ``genre:token_seq`` (ml-1m) or ``class:token_seq`` (ml-100k).

    >>> read_recbole_items("dataset/ml-100k").head(1).collect().row(0)   # doctest: +SKIP
    (1, ['Toy', 'Story'], 1995, ['Animation', "Children's", 'Comedy'])
    """
    return _read_recbole(path, "item", seq_separator)
