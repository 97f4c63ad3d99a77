"""Task: event log -> prepared dataset folder."""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from recsys.config import check_required, event_schema, item_columns, prepare_settings
from recsys.data.pipeline import STATS_FILE, load_stats, prepare_dataset

log = logging.getLogger(__name__)


def _source(value, option: str):
    """A config value naming data: a path, or a ``_target_`` that returns a frame. A loader
    argument its function does not take (the synthetic log's sizes, which ``experiment=tiny``
    sets, under another loader) is refused naming the keys to drop."""
    if value is None:
        raise ValueError(f"{option} is not set: give a CSV/Parquet path ({option}=...)")
    if not isinstance(value, DictConfig):
        return str(value)
    try:
        return instantiate(value)
    except InstantiationException as err:
        cause = err.__cause__
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
        if not (isinstance(cause, TypeError) and unknown and unknown[1] in value):
            raise
        names = [unknown[1]]
        try:  # every argument the loader lacks, not only the first
            parameters = inspect.signature(get_method(value._target_)).parameters
        except (TypeError, ValueError, ImportError):  # (a signature Python cannot read)
            parameters = {}
        if parameters and all(p.kind is not p.VAR_KEYWORD for p in parameters.values()):
            names = [k for k in value if not k.startswith("_") and k not in parameters]
        one = len(names) == 1
        raise ValueError(
            f"{', '.join(f'{option}.{k}' for k in names)}: "
            f"{'not an argument' if one else 'not arguments'} of {value._target_} (an "
            f"experiment= overlay may have set {'it' if one else 'them'}: experiment=tiny sizes "
            f"the synthetic log of data=synthetic); drop {'it' if one else 'them'} with "
            f"{' '.join(f'~{option}.{k}' for k in names)}, or check the spelling"
        ) from cause


def event_source(cfg: DictConfig):
    """``data.source``: a path to a CSV/Parquet log, or a ``_target_`` that returns a frame."""
    return _source(cfg.data.source, "data.source")


def describe(value) -> str | None:
    """A loader config's name for messages: ``read_taobao(/data/UserBehavior.csv)``."""
    if not isinstance(value, DictConfig) or "_target_" not in value:
        return None
    arguments = [str(v) for v in value.get("_args_", [])]
    arguments += [
        str(v) if k == "path" else f"{k}={v}" for k, v in value.items() if not k.startswith("_")
    ]
    return f"{value._target_.rsplit('.', 1)[-1]}({', '.join(arguments)})"


def item_source(cfg: DictConfig):
    """``data.items``: the optional item side table (None when not set)."""
    items = cfg.data.get("items")
    return None if items is None else _source(items, "data.items")


def prepared(cfg: DictConfig) -> Path:
    """The prepared dataset a task works on: ``data.prepared_dir`` when set, else the log
    prepared now into the run folder. A reused folder must have been prepared with the
    config's data settings: an override that the folder does not follow is refused rather
    than logged as if it applied. ``data.time_buckets`` is not compared: the folder holds
    each event's time, and buckets are computed from it per batch, as the config says."""
    if not cfg.data.prepared_dir:
        return run(cfg)
    folder = Path(cfg.data.prepared_dir).expanduser()
    try:
        stats = load_stats(folder)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"data.prepared_dir={folder} holds no prepared dataset (no {STATS_FILE}): prepare it "
            f"first (python -m pipelines.prepare data.prepared_dir={folder}, with this job's "
            "data settings), or drop data.prepared_dir to prepare into the run folder"
        ) from err
    settings, sources = data_differences(stats, cfg)
    if differ := settings + sources:
        raise ValueError(
            f"data.prepared_dir={folder} was prepared with other data settings than this "
            f"config's ({listed(differ)}): give the config the folder's settings"
            + (f" ({' '.join(settable)})" if (settable := overrides(differ)) else "")
            + ", or unset data.prepared_dir to prepare the log with the config's"
        )
    return folder


# What a prepared folder's stats.json records of the config that prepared it, and what a
# checkpoint keeps of it (``data_settings``) to name the data settings of its training
DATA_SETTINGS_KEYS = ("settings", "schema", "source", "items_source", "item_columns")


def data_differences(recorded: dict, cfg: DictConfig) -> tuple[list, list]:
    """How ``cfg``'s data settings differ from those ``recorded`` (a prepared folder's
    ``stats.json``, or the ``DATA_SETTINGS_KEYS`` of it a checkpoint keeps): ``(settings,
    sources)``, each a list of ``(key, recorded value, config value)``. ``data.partition_rows``
    and ``data.time_buckets`` do not shape the prepared data, so they are not compared; a
    source prepared from an in-memory frame (a notebook's ``rd.prepare(df, ...)``) names
    nothing to compare."""
    config = {**prepare_settings(cfg.data).to_dict(), **event_schema(cfg.data).to_dict()}
    config = json.loads(json.dumps(config, default=str))  # as stats.json holds it
    folder_settings = {**recorded.get("settings", {}), **recorded.get("schema", {})}
    settings = [
        difference
        for difference in _flat_differences("data", folder_settings, config)
        # the work layout, not the data; time buckets are computed from the stored times per
        # batch (a training takes its config's, a trained model its own)
        if difference[0] != "data.partition_rows"
        and not difference[0].startswith("data.time_buckets.")
    ]
    items = cfg.data.get("items")
    if items is not None and recorded.get("item_columns") is not None:
        columns = {"item_columns": item_columns(cfg.data)}
        settings += _flat_differences("data", {"item_columns": recorded["item_columns"]}, columns)
    items_now = None if items is None else _source_name(items)
    sources = [
        ("data.source", recorded.get("source", ""), _source_name(cfg.data.source)),
        ("data.items", recorded.get("items_source"), items_now),
    ]
    sources = [
        (key, was, now)
        for key, was, now in sources
        if not str(was).startswith("<in-memory") and not _same_source(was, now)
    ]
    return settings, sources


def refuse_other_settings(
    recorded: dict | None,
    cfg: DictConfig,
    *,
    trained: str,
    fix: str,
    otherwise: str,
) -> None:
    """Refuse, before any data is prepared, a config whose data settings differ from those
    ``recorded`` by the checkpoint that ``trained`` names (``model=<ref>``, ``resume=...``):
    the message lists them, says ``fix`` with the overrides that give the recorded settings,
    then ``otherwise``. A source that differs alone is not refused: a log moved to another
    path is the same data, which the data fingerprint decides after preparing. A checkpoint
    from before the settings were recorded (``recorded`` None) is not checked here."""
    if recorded is None:
        return
    settings, sources = data_differences(recorded, cfg)
    if not settings:
        return
    differ = settings + sources
    fixes = overrides(differ)
    raise ValueError(
        f"{trained} was trained on data prepared with other data settings than this config's "
        f"({listed(differ)}): {fix}" + (f" ({' '.join(fixes)})" if fixes else "") + otherwise
    )


def listed(differences: list) -> str:
    """``data_differences`` for a message: ``key: prepared 'a', config 'b'; ...``."""
    return "; ".join(f"{key}: prepared {was!r}, config {now!r}" for key, was, now in differences)


def overrides(differences: list) -> list[str]:
    """The command-line overrides that give a config the recorded side of ``differences``
    (those that can be typed: not an item table, nor a loader's call)."""
    return [
        _override(key, was)
        for key, was, _ in differences
        if key != "data.items" and (key != "data.source" or not _LOADER_CALL.match(str(was)))
    ]


def _override(key: str, value) -> str:
    """The command-line override that gives a config the prepared ``value`` of ``key``. A raw
    event name of ``data.behavior_aliases`` is a key the config may lack (Hydra refuses
    ``data.behavior_aliases.<name>=...`` for it) or have beside the folder's: ``++`` adds or
    sets it, ``~`` removes it."""
    if key.startswith("data.behavior_aliases."):
        return f"~{key}" if value is None else f"++{key}={_override_value(value)}"
    return f"{key}={_override_value(value)}"


def _override_value(value) -> str:
    """A prepared setting as a command-line override writes it: null, [a,b], text."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)


def _source_name(value) -> str:
    """``data.source`` as ``stats.json`` names it: a loader's call, or the path."""
    return describe(value) or str(value)


def _same_source(prepared_from: str | None, source: str | None) -> bool:
    """The same loader call, or the same file (a relative and an absolute path to it agree,
    inside a loader's call too: ``read_s3rec(/data/x/../Beauty.txt)`` is
    ``read_s3rec(/data/Beauty.txt)``). A folder prepared from an in-memory frame (a notebook's
    ``rd.prepare(df, ...)``) names no source to compare, so the caller does not ask."""
    if prepared_from == source:
        return True
    if prepared_from is None or source is None:
        return False
    first, second = _LOADER_CALL.match(prepared_from), _LOADER_CALL.match(source)
    if first is None or second is None:
        return _same_file(prepared_from, source)
    if first["loader"] != second["loader"]:
        return False
    # the arguments as describe() writes them: paths and k=v, joined by ", "
    was, now = first["arguments"].split(", "), second["arguments"].split(", ")
    return len(was) == len(now) and all(_same_argument(a, b) for a, b in zip(was, now))


_LOADER_CALL = re.compile(r"^(?P<loader>[A-Za-z_][\w.]*)\((?P<arguments>.*)\)$", re.DOTALL)


def _same_argument(was: str, now: str) -> bool:
    """One argument of a loader's call: equal text, the same file, or ``key=`` the same file."""
    if was == now or _same_file(was, now):
        return True
    key, equals, value = was.partition("=")
    return bool(equals) and now.startswith(f"{key}=") and _same_file(value, now[len(key) + 1 :])


def _same_file(first: str, second: str) -> bool:
    one, other = Path(first).expanduser(), Path(second).expanduser()
    return one.exists() and other.exists() and one.resolve() == other.resolve()


def _flat_differences(prefix: str, was: Any, now: Any) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(was, dict) and isinstance(now, dict):
        for key in sorted(set(was) | set(now)):
            yield from _flat_differences(f"{prefix}.{key}", was.get(key), now.get(key))
    elif was != now:
        yield prefix, was, now


def check_config(cfg: DictConfig) -> None:
    """A preparation's config checks that need no data, for each job of a ``-m`` sweep before
    the first starts (:class:`recsys.config.CheckSweep`), as a training's are."""
    check_required(cfg, tracked=False)  # (a preparation opens no MLflow run)
    event_schema(cfg.data)
    prepare_settings(cfg.data)


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> Path:
    """Prepare ``data.source`` into ``out_dir`` (default: ``data.prepared_dir`` when set, as
    ``python -m pipelines.prepare data.prepared_dir=<folder>`` makes the folder that
    ``pipelines.train data.prepared_dir=<folder>`` reuses; else ``<run dir>/prepared``)."""
    check_required(cfg, tracked=False)  # (a preparation opens no MLflow run)
    out_dir = out_dir or cfg.data.prepared_dir or Path(cfg.paths.run_dir) / "prepared"
    out_dir = Path(out_dir).expanduser()
    prepare_dataset(
        event_source(cfg),
        schema=event_schema(cfg.data),
        settings=prepare_settings(cfg.data),
        out_dir=out_dir,
        items=item_source(cfg),
        item_columns=item_columns(cfg.data),
        source_name=describe(cfg.data.source),  # (None: the path names itself)
        items_name=describe(cfg.data.get("items")),
    )
    log.info("prepared dataset at %s", out_dir)
    return out_dir
