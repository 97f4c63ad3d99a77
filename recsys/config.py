"""Config plumbing: Hydra resolvers and typed settings built from the ``data`` config group.

Tasks call these instead of reading nested keys themselves, so the yaml <-> code contract
lives in one place.
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from recsys.data import options
from recsys.data.pipeline import PrepareSettings, terminate_as_exit
from recsys.data.sequences import TimeBuckets
from recsys.data.validate import check_number
from recsys.schema import EventSchema


def _abspath(path: str) -> str:
    """``path`` made absolute against the directory the job was launched from: Hydra's
    ``runtime.cwd`` inside a Hydra app (``hydra.job.chdir=true`` has moved the process into the
    run folder before the config is resolved), else the working directory."""
    from hydra.core.hydra_config import HydraConfig

    launch = HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()
    return os.path.abspath(os.path.join(launch, os.path.expanduser(str(path))))


def config_dir() -> str:
    """The folder of recsys' Hydra configs: ``recsys/conf`` (in a clone, a link to the
    repository's ``conf/``; in an installed package, a copy of it), for :func:`compose` and
    the ``pipelines``, so that both find them from any working directory."""
    conf = (Path(__file__).parent / "conf").resolve()
    if not (conf / "config.yaml").is_file():
        raise FileNotFoundError(
            f"recsys' configs are not in {conf} (no config.yaml): this copy of recsys lacks "
            "them; install it from its repository (pip install <clone or git URL>, or "
            "pip install -e . in a clone) on a system that keeps symbolic links, where "
            "recsys/conf links to conf/"
        )
    return str(conf)


def register_resolvers() -> None:
    """``${abspath:outputs}`` -> an absolute path (resolved against the launch directory)."""
    if not OmegaConf.has_resolver("abspath"):
        OmegaConf.register_new_resolver("abspath", _abspath)


register_resolvers()


def model_reference_argv(argv: list[str]) -> list[str]:
    """``model=<ref>`` on the score / evaluate command line means the model to load, but Hydra
    reads ``model=`` as a choice of the ``conf/model`` group (the architecture): rewrite it to
    the config key ``model_ref`` before Hydra parses the arguments."""
    return [f"model_ref={a.removeprefix('model=')}" if a.startswith("model=") else a for a in argv]


# how to give a mandatory value (``???`` in conf/) that is not set; others: <key>=...
REQUIRED = {
    "model_ref": "model=<checkpoint path | MLflow run id | name@alias> (the model to load)",
    "data.source": "data.source=<a CSV/Parquet file or folder> (the event log)",
    "data.source.path": "data.source.path=<the dataset's file> (the event log)",
    "data.items.path": "data.items.path=<the item table's file>",
}


@contextmanager
def failure_logged(cfg: DictConfig) -> Iterator[None]:
    """Around a pipeline's work: log why it failed, as its last log line. Hydra prints the
    traceback to stderr only, so the run folder's log (``run.log``), which a scheduled job's
    owner reads the morning after, would otherwise end mid-job without a word of the
    failure. A SIGTERM anywhere in the job is ``SystemExit(143)`` (:func:`recsys.data.pipeline.
    terminate_as_exit`), so that it is logged, its MLflow run marked FAILED and its staging
    folders removed, as for any other failure."""
    try:
        with terminate_as_exit():
            yield
    except BaseException as err:  # SystemExit too: a job killed by SIGTERM exits 143
        logging.getLogger("pipelines").error(
            "%s job failed: %s: %s%s",
            cfg.get("task_name", "the"),
            type(err).__name__,
            err,
            _signal_named(err),
        )
        raise


def _signal_named(err: BaseException) -> str:
    """What the job log's failure line adds for a signal's exit, which says nothing of it:
    ``SystemExit: 143`` (a SIGTERM), ``KeyboardInterrupt:`` (a Ctrl-C)."""
    if isinstance(err, SystemExit) and err.code == 128 + signal.SIGTERM:
        return " (killed by SIGTERM)"
    if isinstance(err, KeyboardInterrupt) and not str(err):
        return "interrupted (Ctrl-C)"
    return ""


@contextmanager
def launch_directory() -> Iterator[None]:
    """Around a pipeline's work: with ``hydra.job.chdir=true`` (Hydra has moved the process into
    the run folder), work from the folder the job was started in, as without it. Relative paths
    (``data.source=events.parquet``, ``model=<checkpoint>``, a loader's ``path``) mean that
    folder, as ``${abspath:}`` does for ``paths.output_dir``; they were looked for in the run
    folder and not found. Everything a job writes goes to its run folder either way."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or not HydraConfig.get().job.chdir:
        yield
        return
    here, launch = os.getcwd(), HydraConfig.get().runtime.cwd
    logging.getLogger("pipelines").info(
        "hydra.job.chdir=true: the job works from %s, where it was started (relative paths "
        "are read from there); it writes into its run folder %s as without it",
        launch,
        here,
    )
    os.chdir(launch)
    try:
        yield
    finally:
        os.chdir(here)


RUN_FOLDER_LOCK = ".lock"  # a training's run folder: held while it runs (train.hold_run_folder)


class GuardRunFolder(Callback):
    """Hydra callback: refuse a training whose ``hydra.run.dir`` a training running now holds
    (:func:`running_training`), or that holds a finished training (its checkpoints) unless
    ``resume`` continues it, before Hydra writes its ``.hydra/`` files and opens the folder's
    ``run.log``: refused later (:func:`recsys.tasks.train.hold_run_folder`, :func:`recsys.
    tasks.train.check_run_folder`), the job would already have replaced that run's config
    record with its own and written its failure into that run's log. Only for the jobs that
    train."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.job.name not in ("run", "train"):
            return
        running = running_training(Path(config.hydra.run.dir))
        if running:
            raise SystemExit(
                f"FileExistsError: hydra.run.dir={config.hydra.run.dir} is in use by a job "
                f"running now ({running}): wait for it to end (then resume=last continues "
                "it), or run into another folder (a new hydra.run.dir=..., or none: each job "
                "then gets its own); nothing was written there"
            )
        if config.get("resume") is not None:
            return
        held = held_training(Path(config.hydra.run.dir))
        if held:
            # SystemExit (exit status 1, the message on stderr): Hydra turns a callback's
            # Exception into a warning and goes on
            raise SystemExit(
                f"FileExistsError: hydra.run.dir={config.hydra.run.dir} already holds a "
                f"training ({held}): continue it with resume=last, or run into another folder "
                "(a new hydra.run.dir=..., or none: each job then gets its own); nothing was "
                "written there"
            )


def running_training(run_dir: Path) -> str | None:
    """The process of a training running in ``run_dir`` now, as it names itself in the
    folder's lock (:func:`recsys.tasks.train.hold_run_folder`); None: none."""
    from recsys import locks

    return locks.holder(run_dir / RUN_FOLDER_LOCK)


def held_training(run_dir: Path) -> str | None:
    """The checkpoints a run folder holds, named (None: none)."""
    held = sorted(run_dir.glob("checkpoints/**/*.ckpt"))
    if not held:
        return None
    names = ", ".join(str(p.relative_to(run_dir)) for p in held[:5])
    return names + (", ..." if len(held) > 5 else "")


class CheckSweep(Callback):
    """Hydra callback: before the first job of a ``-m`` sweep starts, compose every job's
    config and check it as the job itself would before any work (:func:`recsys.tasks.main.
    check_config`, :func:`recsys.tasks.train.check_config`, :func:`recsys.tasks.prepare.
    check_config`), so that one bad value
    (``model.num_heads=2,0``) stops the sweep at once, naming the job, instead of after the
    jobs before it have trained. So does an ``init_from`` or teacher
    (``training.distillation.teachers``) that names no model (:func:`recsys.tasks.train.
    check_references`). Only Hydra's basic sweeper's jobs can be listed in advance;
    the jobs that train or prepare are checked, and of a ``pipelines.score`` or
    ``pipelines.evaluate`` sweep the output each job would write (one fixed
    ``retrieval.output.path`` or ``per_target`` file: each job's replaced the one before)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from recsys.tasks import main, prepare, train

        name = config.hydra.job.name
        checks = {
            "run": main.check_config,
            "train": train.check_config,
            "prepare": prepare.check_config,
            "score": None,  # (their outputs only: each job fetches and checks its model)
            "evaluate": None,
        }
        if name not in checks or not str(config.hydra.sweeper.get("_target_", "")).endswith(
            "BasicSweeper"
        ):
            return
        check = checks[name]
        loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        arguments = params + list(config.hydra.overrides.task)
        overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        hydra_config, before = HydraConfig.instance(), HydraConfig.instance().cfg
        writers: dict[str, int] = {}  # folder a job writes -> the first job writing it
        references: set[tuple[str, str]] = set()  # init_from / teachers found already
        try:
            for number, job in enumerate(jobs):
                try:
                    task = _sweep_job_config(loader, config, list(job), number)
                    trains = name in ("run", "train")
                    running = trains and running_training(Path(task.paths.run_dir))
                    if running:  # (an overlapping sweep into the same hydra.sweep.dir)
                        raise FileExistsError(
                            f"its folder {task.paths.run_dir} is in use by a job running now "
                            f"({running}): sweep into another hydra.sweep.dir (or none: each "
                            "sweep then gets its own)"
                        )
                    held = (
                        trains
                        and not task.get("resume")
                        and held_training(Path(task.paths.run_dir))
                    )
                    if held:  # before Hydra rewrites the earlier sweep's records there
                        raise FileExistsError(
                            f"its folder {task.paths.run_dir} already holds a training ({held}):"
                            " sweep into another hydra.sweep.dir (or none: each sweep then gets "
                            "its own)"
                        )
                    if check is not None:
                        check(task)
                        _check_sweep_inputs(task)
                    if trains:  # a checkpoint or MLflow run that is not there
                        train.check_references(task, references)
                    outputs = {"paths.run_dir": task.paths.run_dir}
                    if name in ("run", "score"):
                        outputs["retrieval.output.path"] = task.retrieval.output.path
                    if name == "prepare" and task.data.get("prepared_dir"):  # else in run_dir
                        outputs["data.prepared_dir"] = task.data.prepared_dir
                    if name == "evaluate" and task.get("per_target"):
                        outputs["per_target"] = task.per_target
                    for option, folder in outputs.items():
                        folder = os.path.abspath(str(folder))
                        if folder in writers:
                            own = (
                                "name it in the job's folder: "
                                "per_target='${paths.run_dir}/targets.parquet'"
                                if option == "per_target"
                                else "leave it at its default, which follows the job's "
                                "folder, or sweep it too"
                            )
                            raise FileExistsError(
                                f"{option}={folder} is also job {writers[folder]}'s: each job "
                                f"needs its own ({own})"
                            )
                        writers[folder] = number
                except Exception as err:
                    # SystemExit: Hydra turns a callback's Exception into a warning, goes on
                    raise SystemExit(
                        f"{type(err).__name__}: job {number} of the sweep's {len(jobs)} "
                        f"({' '.join(job)}): {err}. No job was run"
                    ) from err
        finally:
            hydra_config.cfg = before


def sweep_tags() -> dict[str, str]:
    """MLflow tags that tie a ``-m`` sweep's job to its sweep: ``sweep.dir`` (the multirun
    folder, shared by its jobs), ``sweep.job`` (the job's number) and ``sweep.overrides`` (what
    this job sets); none outside a sweep. Each job is its own run, so without them a sweep's
    runs are told apart only by their parameters."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return {}
    return {
        "sweep.dir": os.path.abspath(str(hydra.sweep.dir)),
        "sweep.job": str(hydra.job.num),
        "sweep.overrides": " ".join(hydra.overrides.task),
    }


def _check_sweep_inputs(task: DictConfig) -> None:
    """The files a sweep job reads, ``data.source`` and ``data.items`` (a path, or a loader's
    ``path``), exist: a job alone is refused for a missing one before any work, a sweep's
    jobs before it would have trained. A glob is left to the job."""
    for option in ("data.source", "data.items"):
        value = OmegaConf.select(task, option)
        path = value.get("path") if isinstance(value, DictConfig) else value
        if isinstance(path, str) and not glob.has_magic(path) and not Path(path).exists():
            where = f"{option}.path" if isinstance(value, DictConfig) else option
            raise FileNotFoundError(f"{where}={path} does not exist: check {where}")


def _sweep_job_config(loader: Any, sweep: DictConfig, job: list[str], number: int) -> DictConfig:
    """Job ``number`` of a sweep's config as Hydra's basic launcher will give it to the task
    (``hydra.runtime.output_dir`` its folder, the ``hydra`` node set aside as
    :class:`HydraConfig`), without creating the folder."""
    from hydra.core.hydra_config import HydraConfig

    config = loader.load_sweep_config(sweep, job)
    with open_dict(config):
        config.hydra.job.id = config.hydra.job.num = number
        folder = os.path.join(config.hydra.sweep.dir, str(config.hydra.sweep.subdir))
        config.hydra.runtime.output_dir = os.path.abspath(folder)
    HydraConfig.instance().set_config(config)
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def check_required(cfg: DictConfig, *, model_given: bool = False, tracked: bool = True) -> None:
    """Refuse a config whose mandatory values (``???``: ``data.source`` of ``data=events_file``,
    ``model=`` of score / evaluate) are not set, naming each and how to give it, before any
    work: OmegaConf would otherwise stop the job midway with ``MissingMandatoryValue``. So are
    keys nothing would read: a misspelt top-level key, or ``logger`` key (every task has one),
    and a tracking URI that names no store or a server that does not answer
    (:func:`recsys.tracking.check_store`). ``model_given``: the caller passes the checkpoint
    itself (``model=`` is not read); ``tracked`` False: the task opens no MLflow run (a
    preparation), so its store is not asked."""
    from recsys.tracking import check_logger_keys, check_store

    plain = OmegaConf.to_container(cfg, resolve=False)
    check_top_level_keys(plain)
    check_logger_keys(plain.get("logger"))
    missing = [key for key in _missing_keys(plain) if not (model_given and key == "model_ref")]
    if missing:
        given = "; ".join(REQUIRED.get(key, f"{key}=...") for key in missing)
        names = ", ".join("model=" if key == "model_ref" else key for key in missing)
        raise ValueError(f"{names} not set: give {given}")
    if tracked:  # a tracking server that does not answer: before any work
        check_store(cfg.get("logger"))


# every top-level key of conf/config.yaml, conf/evaluate.yaml and conf/score.yaml
TOP_LEVEL_KEYS = frozenset(
    {"task_name", "seed", "resume", "init_from", "model_ref", "users", "per_target", "splits"}
    | {"other_data"}
    | {"paths", "data", "training", "model", "trainer", "callbacks", "logger", "retrieval"}
    | {"hydra"}
)


def check_top_level_keys(cfg: Mapping[str, Any]) -> None:
    """Refuse a top-level key added by mistake, which nothing would read: a misspelt group
    (``+trainig.seen_items=zero``: the groups refuse their own misspelt keys) or a key given
    without its group (``+max_epochs=3`` for ``trainer.max_epochs``). A new key of a user's own
    (for an interpolation) passes unless its name is that close to one of recsys'."""
    import difflib

    nested = {}
    for group in TOP_LEVEL_KEYS & set(cfg):
        if isinstance(cfg[group], Mapping):
            for key in cfg[group]:
                nested.setdefault(str(key), f"{group}.{key}")
    for key in map(str, cfg):
        if key in TOP_LEVEL_KEYS:
            continue
        meant = [nested[key]] if key in nested else []
        meant += difflib.get_close_matches(key, sorted(TOP_LEVEL_KEYS), n=1, cutoff=0.75)
        if meant:
            raise ValueError(
                f"{key} is not a top-level config key, so nothing would read it (added with "
                f"+{key}...?): did you mean {meant[0]}? Write {meant[0]} in its place, "
                "without the +"
            )


def _missing_keys(value: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _missing_keys(item, f"{prefix}{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _missing_keys(item, f"{prefix}{index}.")
    elif value == "???":
        yield prefix.removesuffix(".")


def to_container(cfg: Any) -> Any:
    """Resolved plain Python containers from a DictConfig (anything else passes through)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def data_options(data_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``data`` config group as plain values, its keys checked: a misspelt one
    (``+data.min_user_event=3``) is refused by name rather than silently not applied."""
    plain = dict(to_container(data_cfg))
    options.check_keys(plain, allowed=options.DATA_KEYS)
    return plain


def event_schema(data_cfg: Mapping[str, Any]) -> EventSchema:
    return options.event_schema(data_options(data_cfg))


def time_buckets(data_cfg: Mapping[str, Any]) -> TimeBuckets:
    return options.time_buckets(data_options(data_cfg))


def prepare_settings(data_cfg: Mapping[str, Any]) -> PrepareSettings:
    return options.prepare_settings(data_options(data_cfg))


def item_columns(data_cfg: Mapping[str, Any]) -> dict[str, str | None]:
    return options.item_columns(data_options(data_cfg))


def note_trained_settings(data_cfg: Mapping[str, Any], model: Any, ref: object) -> None:
    """A loaded ``model`` (``ref``, as the user named it) reads histories in evaluation and
    scoring as it was trained to: its ``max_seq_len`` and ``time_buckets`` (its position and
    time tables were fitted to them). ``data.max_seq_len`` and ``data.time_buckets`` are still
    checked, and a value that differs is named in the log rather than silently not applied."""
    given = data_cfg.get("max_seq_len")
    check_number(
        "data.max_seq_len", given, integer=True, minimum=1, why=" (the most recent events read)"
    )
    buckets = time_buckets(data_cfg)
    differ = [
        f"{key}: {trained} (data.{key}: {now})"
        for key, trained, now in (
            ("max_seq_len", model.max_seq_len, given),
            ("time_buckets", asdict(model.time_buckets), asdict(buckets)),
        )
        if trained != now
    ]
    if differ:
        logging.getLogger(__name__).info(
            "%s reads histories as it was trained to, not as this config's data settings say: %s",
            ref,
            "; ".join(differ),
        )


def compose(config_name: str = "config", overrides: list[str] | None = None) -> DictConfig:
    """recsys' ``conf/<config_name>.yaml`` composed with Hydra's compose API, for
    notebooks and scripts: ``compose("config", ["experiment=tiny", "logger=none"])`` is what
    ``python -m pipelines.run experiment=tiny logger=none`` would run with. For ``score`` and
    ``evaluate``, ``model=<ref>`` names the model to load, as on the command line.

    The run folder is the one the command line's job would get (``hydra.run.dir``: a new
    dated folder under ``paths.output_dir``), unless ``paths.run_dir=<folder>`` is among the
    overrides. Nothing is created until a task runs.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides or [])
    if config_name in ("score", "evaluate"):  # model=<ref>, as on the command line
        overrides = model_reference_argv(overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides, return_hydra_config=True)
    with open_dict(cfg):
        if not any(o.split("=", 1)[0].lstrip("+~") == "paths.run_dir" for o in overrides):
            # ${hydra:runtime.output_dir} has no value outside a Hydra app
            cfg.paths.run_dir = str(cfg.hydra.run.dir)
        del cfg["hydra"]
    return cfg


# Lightning's loggers: at import, with no root handler yet (before Hydra configures the job's
# logging), Lightning gives them a stderr handler of their own and stops their propagation.
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")


class JobLogHasEverything(Callback):
    """Hydra callback: for the job's duration, Lightning's lines ("GPU available: ...",
    "Seed set to 42", "`Trainer.fit` stopped: ...") and Python warnings go through the job's
    logging (console and the run folder's ``run.log``, each line stamped like recsys' own),
    rather than to stderr only, so that the run log holds what the console showed. Restored
    when the job ends (a sweep's jobs each set it again)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._saved = []
        for name in LIGHTNING_LOGGERS:
            logger = logging.getLogger(name)
            own = [h for h in logger.handlers if type(h) is logging.StreamHandler]
            self._saved.append((logger, own, logger.propagate))
            for handler in own:
                logger.removeHandler(handler)
            logger.propagate = True
        logging.captureWarnings(True)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        logging.captureWarnings(False)
        for logger, own, propagate in getattr(self, "_saved", []):
            for handler in own:
                logger.addHandler(handler)
            logger.propagate = propagate
        self._saved = []
