"""Experiment tracking: the one module that imports MLflow (with the pyfunc wrapper it packages,
:mod:`recsys.mlflow_model`).

The store is a local sqlite database with an absolute path by default (MLflow's file store is
an error in MLflow 3, and Hydra may change the working directory); ``MLFLOW_TRACKING_URI`` or
``logger.tracking_uri`` points elsewhere. ``logger=none`` turns tracking off: :class:`Tracker`
then does nothing, and mlflow is never imported (the GPU image has no mlflow).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import shlex
import shutil
import sys
import time
import warnings
import weakref
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recsys import code_version, locks, shown_live
from recsys.checkpoint import LoadedModel, load_checkpoint, refuse_folder

log = logging.getLogger(__name__)
# (MLflow colours it: an escape sequence comes first)
MLFLOW_INPUT_EXAMPLE_ADVICE = r".*An input example was not provided when logging the model"

MAX_PARAM_LENGTH = 6000  # MLflow's limit on a parameter value
URI_VARIABLE = "MLFLOW_TRACKING_URI"  # the user's store, when set: wins over logger.tracking_uri
SERVER_SCHEMES = ("http", "https")  # a tracking server's URI: the server keeps the store
MODEL_ARTIFACT = "model"  # the packaged MLflow model inside a training run
# The job that holds a run it opened (see Tracker): who (process <pid> on <host>), its host
# (what a later job of that host looks for) and the lock it holds while it runs; a run left
# RUNNING by a job killed outright is marked KILLED, with the reason as recsys.ended
HOLDER_TAG = "recsys.holder"
HOST_TAG = "recsys.holder.host"
LOCK_TAG = "recsys.holder.lock"
ENDED_TAG = "recsys.ended"
_HELD_RUNS: dict[str, tuple[Path, int]] = {}  # the runs this process holds: lock, descriptor


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"model": {"d_model": 64}}`` -> ``{"model.d_model": "64"}`` (lists kept as text).

    A mapping with a key that cannot be part of an MLflow parameter name (only letters, digits,
    ``_``, ``-`` and spaces can: MLflow refuses a batch with another one, and ``.`` would make
    the name ambiguous) is one parameter, its text: ``data.behavior_aliases`` with the raw event
    name ``Add to cart (v2)`` as a key is ``{"data.behavior_aliases": "{'Add to cart (v2)':
    'cart'}"}``."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and all(_PARAM_PART.fullmatch(str(k)) for k in value):
            flat.update(flatten(value, f"{name}."))
        else:
            text = str(dict(value)) if isinstance(value, Mapping) else str(value)
            flat[name] = text[:MAX_PARAM_LENGTH]
    return flat


_PARAM_PART = re.compile(r"[\w\- ]+")  # what a config key may hold to be part of a param name


class Tracker:
    """One MLflow run, or nothing when ``enabled`` is False.

    The run is new, or an existing one: ``run_id`` attaches to it as it is;
    ``continue_run_id`` (a resumed training) marks it running again, or opens a new run with a
    warning when this store does not hold it. Parameters logged again keep their first value;
    a changed one is recorded as the tag ``changed_param.<name>`` (MLflow refuses to change a
    parameter), so a run resumed with, say, more epochs says so. A run resumed under other
    code keeps its ``code.*`` tags and gets ``code.resumed.*`` with the values that differ now.

    A run it opens or continues is held until :meth:`finish` ends it: a lock file (see
    :func:`run_lock`) that goes with the process however it ends, named in the tags
    ``recsys.holder`` (``process <pid> on <host>``), ``recsys.holder.host`` and
    ``recsys.holder.lock``. Opening one, it marks ``KILLED`` the runs of its experiment that
    jobs of this host left ``RUNNING`` and no longer hold (killed outright: SIGKILL, the OOM
    killer, a power cut), tagging why (``recsys.ended``) and naming each in a warning
    (:meth:`_end_abandoned`); other hosts' runs are left alone.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        tracking_uri: str | None = None,
        experiment_name: str = "recsys",
        artifact_root: str | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        continue_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        open_run: bool = True,
    ):
        self.enabled = enabled
        self.run_id: str | None = None
        self.tracking_uri = tracking_uri
        if not enabled:
            return
        from mlflow.tracking import MlflowClient

        self.tracking_uri = store_uri(tracking_uri)
        if not self.tracking_uri:
            raise ValueError("logger.tracking_uri is empty: set it or MLFLOW_TRACKING_URI")
        if artifact_root and is_server(self.tracking_uri) and "://" not in str(artifact_root):
            # (a folder of this machine: the server's other clients could not read it, and
            # the config's default, the run folder's mlartifacts/, bypassed the server's store)
            log.info(
                "logger.artifact_root=%s (a folder of this machine) is not used with the "
                "tracking server %s: artifacts go to the server's artifact store (give a URI, "
                "file:///... or s3://..., for another)",
                artifact_root,
                self.tracking_uri,
            )
            artifact_root = None
        if self.tracking_uri.startswith("sqlite:///"):
            Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(
                parents=True, exist_ok=True
            )
        self._held: tuple[Path, int] | None = None  # the run's lock, when this tracker took it
        holds = bool(continue_run_id) or not run_id  # (not a run attached to as it is)
        with store_lock(self.tracking_uri), _root_logging_kept():
            self.client = MlflowClient(tracking_uri=self.tracking_uri)  # creates its tables
            if continue_run_id:
                run_id = self._reopen(continue_run_id)
            if run_id:
                info = self.client.get_run(run_id).info
                self.run_id, self.experiment_id = info.run_id, info.experiment_id
            elif not open_run:  # a client only (registry look-ups)
                return
            else:
                experiment = self.client.get_experiment_by_name(experiment_name)
                self.experiment_id = (
                    experiment.experiment_id
                    if experiment is not None
                    else self.client.create_experiment(
                        experiment_name, artifact_location=artifact_root
                    )
                )
                if experiment is not None and artifact_root:
                    _note_artifact_root(experiment, artifact_root)
                if experiment is not None and not artifact_root and is_server(self.tracking_uri):
                    _note_local_artifacts(experiment, self.tracking_uri)  # (not one asked for)
            if holds:
                self._end_abandoned()
        if not run_id:  # (a new run says which code made it; one attached to keeps its own)
            run = self.client.create_run(
                self.experiment_id, run_name=run_name, tags={**code_tags(), **dict(tags or {})}
            )
            self.run_id = run.info.run_id
            self._hold(self.run_id)
        log.info("MLflow run %s at %s", self.run_id, self.tracking_uri)

    def _hold(self, run_id: str) -> None:
        """Hold ``run_id`` while this process runs: its lock (:func:`run_lock`) and the tags
        naming this process as its holder. A lock that cannot be made (a folder not writable)
        is named in a warning: a later job cannot then tell whether this one still runs, and
        leaves the run as it finds it. A lock another job holds is waited for a few seconds
        (a job looking whether the run was left, :meth:`_end_abandoned`), then named in a
        warning (a copy of the run folder resumed meanwhile): the run stays that job's."""
        holder = f"process {os.getpid()} on {platform.node()}"
        tags = {HOLDER_TAG: holder, HOST_TAG: platform.node()}
        if run_id in _HELD_RUNS:  # (another tracker of this process holds it already)
            tags[LOCK_TAG] = str(_HELD_RUNS[run_id][0])
        elif locks.AVAILABLE:
            lock = run_lock(self.tracking_uri, run_id)
            try:
                lock.parent.mkdir(parents=True, exist_ok=True)
                fd = _take_run_lock(lock)
            except FileExistsError as err:
                log.warning(
                    "MLflow run %s is held by %s, a job running now: this job writes into it "
                    "too, and leaves it that job's to end",
                    run_id,
                    err,
                )
                return
            except OSError as err:
                log.warning(
                    "MLflow run %s: its lock %s cannot be made (%s): if this job is killed "
                    "outright (SIGKILL, a power cut) the run stays RUNNING",
                    run_id,
                    lock,
                    err,
                )
                fd = None
            if fd is not None:  # (None: a filesystem without locks, named by locks.flock)
                self._held = _HELD_RUNS[run_id] = (lock, fd)
                tags[LOCK_TAG] = str(lock)
        for name, value in tags.items():
            self.client.set_tag(run_id, name, value)

    def _release(self, ended: bool) -> None:
        """Let go of the run's lock; ``ended`` (its status set) removes the lock file too,
        else (the status could not be set) a later job finds the run abandoned."""
        if self._held is None:
            return
        lock, fd = self._held
        self._held = None
        _HELD_RUNS.pop(self.run_id, None)
        try:
            if ended:
                lock.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _end_abandoned(self) -> None:
        """Mark ``KILLED`` the runs of this experiment left ``RUNNING`` by a job of this host
        that no longer holds them (its lock is there and free: the job was killed outright),
        each tagged ``recsys.ended`` and named in a warning. A run without a lock (tracked
        where there are no locks, or before recsys held runs) and other hosts' runs are left
        alone: whether their jobs still run is not known here. One query of the store; a
        failure to look is named in a warning, and the job goes on."""
        host = platform.node()
        if not locks.AVAILABLE or "'" in host:
            return
        try:
            runs = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'",
            )
            for run in runs:
                lock = run.data.tags.get(LOCK_TAG)
                fd = locks.take_abandoned(Path(lock)) if lock else None
                if fd is None:
                    continue
                try:
                    # (its job may have ended it, then let go, since the query)
                    if self.client.get_run(run.info.run_id).info.status == "RUNNING":
                        holder = run.data.tags.get(HOLDER_TAG, f"its job on {host}")
                        reason = f"holder gone: {holder} no longer runs"
                        self.client.set_tag(run.info.run_id, ENDED_TAG, reason)
                        self.client.set_terminated(run.info.run_id, status="KILLED")
                        log.warning(
                            "MLflow run %s (%s) was left RUNNING by a job killed outright (%s): "
                            "marked KILLED",
                            run.info.run_id,
                            run.info.run_name,
                            reason,
                        )
                    Path(lock).unlink(missing_ok=True)
                finally:
                    os.close(fd)
        except Exception as err:  # MLflow's own exception types, an unreadable lock
            log.warning(
                "could not look for MLflow runs that killed jobs of %s left RUNNING in %s: %s",
                host,
                self.tracking_uri,
                err,
            )

    def _reopen(self, run_id: str) -> str | None:
        """Mark ``run_id`` running again; None (a new run) when this store does not hold it."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException as err:
            log.warning(
                "MLflow run %s (of the checkpoint being resumed) is not in %s (%s): tracking "
                "the resumed training in a new run",
                run_id,
                self.tracking_uri,
                err,
            )
            return None
        self.run_id = run_id
        self._hold(run_id)  # (before it is RUNNING again: no other job then takes it as left)
        self.client.update_run(run_id, status="RUNNING")
        log.info("continuing MLflow run %s", run_id)
        # (its code.* tags name the code that started it: code that differs now is tagged
        # code.resumed.*, as changed_param.* records a changed parameter)
        first = self.client.get_run(run_id).data.tags
        if ENDED_TAG in first:  # (marked KILLED when its job was killed: running again now)
            self.client.delete_tag(run_id, ENDED_TAG)
        for name, value in code_tags().items():
            if first.get(name) != value:
                self.client.set_tag(run_id, f"code.resumed.{name.removeprefix('code.')}", value)
        return run_id

    @classmethod
    def from_config(cls, logger_cfg: Mapping[str, Any] | None, **overrides: Any) -> Tracker:
        """Build from the ``logger`` config group (``None`` or ``enabled: false`` = off)."""
        if not logger_cfg or not logger_cfg.get("enabled", False):
            return cls(enabled=False)
        registry = ("enabled", "registered_model_name", "model_alias")  # used by train, not here
        settings = {k: v for k, v in logger_cfg.items() if k not in registry}
        return cls(enabled=True, **{**settings, **overrides})

    def lightning_logger(self):
        """A Lightning ``MLFlowLogger`` writing into this run (None when disabled)."""
        if not self.enabled:
            return None
        from pytorch_lightning.loggers import MLFlowLogger

        class _Logger(MLFlowLogger):
            def log_hyperparams(self, params) -> None:
                # The module's hyperparameters are training.* settings, which the job logs with
                # the whole config (train.log_config_params): as ~30 unprefixed params they were
                # copies, and "rerank_top_n" read as retrieval.rerank_top_n's.
                pass

            def finalize(self, status: str = "success") -> None:
                # The job ends the run (use_tracker), not the training: Lightning's would mark
                # it FINISHED at the end of fit, with the evaluation and scoring still to come
                # (and left so if the job then died).
                pass

            @property
            def experiment(self):
                # Lightning calls mlflow.set_tracking_uri, which sets MLFLOW_TRACKING_URI in the
                # process: read as the user's setting, it sent every later job of the process
                # (a notebook's next job, a sweep's next job) to this store. Left as it was.
                before = os.environ.get(URI_VARIABLE)
                try:
                    return MLFlowLogger.experiment.fget(self)
                finally:
                    if before is None:
                        os.environ.pop(URI_VARIABLE, None)
                    else:
                        os.environ[URI_VARIABLE] = before

        return _Logger(tracking_uri=self.tracking_uri, run_id=self.run_id)

    def log_params(self, params: Mapping[str, Any], restored: tuple[str, ...] = ()) -> None:
        """Log ``params``; a parameter the run has already keeps its value (MLflow cannot
        change it), and a different new value is set as the tag ``changed_param.<name>``,
        except under the ``restored`` prefixes (a resumed training's optimiser, for one,
        continues from the checkpoint): a new value there is named in a warning as not
        applied. A change the run's ``changed_param.<name>`` tag already records is not
        named again."""
        if not self.enabled:
            return
        from mlflow.entities import Param

        run = self.client.get_run(self.run_id).data
        logged = run.params
        values = {k: str(v)[:MAX_PARAM_LENGTH] for k, v in params.items()}
        items = [Param(k, v) for k, v in values.items() if k not in logged]
        for start in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=items[start : start + 100])
        changed = {k: v for k, v in values.items() if k in logged and logged[k] != v}
        kept = {k: v for k, v in changed.items() if k.startswith(restored)}
        if kept:
            log.warning(
                "not applied to the resumed training, which continues from its checkpoint: %s",
                ", ".join(f"{k} {logged[k]} (given {v})" for k, v in sorted(kept.items())),
            )
        # (a change the run's tags already record: the main job logs its config before the
        # training does, and a resumed one named each change twice)
        changed = {
            k: v
            for k, v in changed.items()
            if k not in kept and run.tags.get(f"changed_param.{k}") != v
        }
        if changed:
            log.info(
                "parameters changed since this run logged them (tags changed_param.*): %s",
                ", ".join(f"{k} {logged[k]} -> {v}" for k, v in sorted(changed.items())),
            )
            self.set_tags({f"changed_param.{k}": v for k, v in changed.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.enabled:
            for name, value in metrics.items():
                self.client.log_metric(self.run_id, name, float(value), step=step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled:
            for name, value in tags.items():
                self.client.set_tag(self.run_id, name, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.enabled:
            path = Path(path)
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), artifact_path)
            else:
                self.client.log_artifact(self.run_id, str(path), artifact_path)

    def download_artifacts(self, artifact_path: str, dst: str | Path) -> Path:
        if not self.enabled:
            raise ValueError("tracking is off (logger=none): pass a checkpoint path instead")
        Path(dst).mkdir(parents=True, exist_ok=True)  # older MLflow (2.16) refuses a new one
        with artifact_bars_shown_live():
            return Path(self.client.download_artifacts(self.run_id, artifact_path, str(dst)))

    def log_model(self, checkpoint: str | Path) -> str | None:
        """Package ``checkpoint`` (a scoring checkpoint: weights, encoder arguments,
        vocabularies, data schema, time buckets) as the MLflow model ``model/`` of this run
        (:meth:`register_model` registers it). Returns the model URI."""
        if not self.enabled:
            return None
        import tempfile

        import mlflow.pyfunc
        from mlflow.models import ModelSignature
        from mlflow.types.schema import ParamSchema, ParamSpec

        from recsys.tasks.score import PYFUNC_PARAMS

        types = {int: "long", str: "string"}
        params = ParamSchema([ParamSpec(k, types[type(v)], v) for k, v in PYFUNC_PARAMS.items()])
        code = Path(__file__).with_name("mlflow_model.py")
        with tempfile.TemporaryDirectory(prefix="recsys-model-") as tmp:
            folder = Path(tmp) / MODEL_ARTIFACT
            with warnings.catch_warnings(), artifact_bars_shown_live():
                # MLflow's advice for a model whose input it can describe; recsys' takes an
                # event log with the user's own columns, so its signature holds the params
                # only and recsys checks the input when scoring (predict's type hint:
                # mlflow_model.py)
                warnings.filterwarnings(
                    "ignore", message=MLFLOW_INPUT_EXAMPLE_ADVICE, category=UserWarning
                )
                mlflow.pyfunc.save_model(
                    str(folder),
                    python_model=str(code),
                    artifacts={"checkpoint": str(checkpoint)},
                    # recsys travels with the model (code/recsys, first on sys.path when loaded):
                    # "recsys" on PyPI is another project, so it is never a requirement
                    code_paths=[str(Path(__file__).parent)],
                    pip_requirements=model_requirements(),
                    signature=ModelSignature(inputs=None, outputs=None, params=params),
                )
            self.log_artifact(folder, MODEL_ARTIFACT)
        return f"runs:/{self.run_id}/{MODEL_ARTIFACT}"

    def register_model(self, registered_model_name: str | None, *, alias: str | None = None):
        """Register this run's packaged model (``model/``, see :meth:`log_model`) as a new
        version of ``registered_model_name`` and point ``alias`` at it; returns the model URI
        (``runs:/<run>/model`` without a name). The main job calls this only once its
        evaluation and scoring have succeeded, so a failed night never moves an alias."""
        if not self.enabled:
            return None
        uri = f"runs:/{self.run_id}/{MODEL_ARTIFACT}"
        if not registered_model_name:
            return uri
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # already registered: add a version
            self.client.create_registered_model(registered_model_name)
        source = f"{self.client.get_run(self.run_id).info.artifact_uri}/{MODEL_ARTIFACT}"
        version = self.client.create_model_version(
            registered_model_name, source, run_id=self.run_id
        )
        if alias:
            self.client.set_registered_model_alias(registered_model_name, alias, version.version)
        log.info(
            "registered %s version %s%s",
            registered_model_name,
            version.version,
            f" as @{alias}" if alias else "",
        )
        return f"models:/{registered_model_name}/{version.version}"

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` and let go of it (a run that cannot be ended is let go
        all the same: a later job of this host marks it KILLED)."""
        if not self.enabled:
            return
        try:
            self.client.set_terminated(self.run_id, status=status)
        except BaseException:
            self._release(ended=False)
            raise
        self._release(ended=True)

    def describe(self) -> str:
        if not self.enabled:
            return "tracking off"
        if is_server(self.tracking_uri):  # the server's own page of the run (mlflow ui opens
            # a store, not a server)
            page = f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}"
            return f"MLflow run {self.run_id} ({page}/runs/{self.run_id})"
        # quoted as a shell needs it: a store in a folder named with a space, say
        uri = shlex.quote(self.tracking_uri)
        return f"MLflow run {self.run_id} (mlflow ui --backend-store-uri {uri})"


def store_uri(tracking_uri: str | None) -> str | None:
    """The store a tracked job uses: ``MLFLOW_TRACKING_URI`` when set, else ``tracking_uri``
    (``logger.tracking_uri``)."""
    return os.environ.get(URI_VARIABLE) or tracking_uri


# a tracking server's first answer, checked at a job's start: a few quick tries, not MLflow's
# default (7 retries of up to 120 s each with a growing backoff: minutes before a job failed)
SERVER_CHECK = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
_answered: set[str] = set()  # the servers that have answered this process's check


def check_store(logger_cfg: Mapping[str, Any] | None) -> None:
    """The tracking URI of a tracked job (:func:`store_uri`) is one, and a tracking server
    there answers, before any work: an unreachable server (a wrong port, a server down, https
    to an http one) failed the job only after MLflow's retries (minutes), and a standalone
    scoring or evaluation only after its work; a typo (``http//host``, ``host:5000``) was read
    as a local file store, refused with MLflow's words on file stores. A server that answered
    once is not asked again in the process (the main job's tasks, a sweep's jobs)."""
    if not logger_cfg or not logger_cfg.get("enabled", False):
        return
    where = URI_VARIABLE if os.environ.get(URI_VARIABLE) else "logger.tracking_uri"
    uri = str(store_uri(logger_cfg.get("tracking_uri")) or "")
    typo = re.match(r"(?i)(https?|sqlite)\b", uri) and "://" not in uri
    if typo or re.fullmatch(r"[\w.-]+:\d+(/.*)?", uri):
        raise ValueError(
            f"{where}={uri!r} is not a tracking URI: a tracking server is "
            "http://<host>:<port> (or https://...), a local store sqlite:////<absolute "
            "path>/mlflow.db"
        )
    if not is_server(uri) or uri in _answered:
        return
    from mlflow.tracking import MlflowClient

    before = {name: os.environ.get(name) for name in SERVER_CHECK}
    os.environ.update(SERVER_CHECK)
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as err:  # MLflow's own exception types, whatever the failure
        raise ConnectionError(
            f"the MLflow tracking server {uri} ({where}) does not answer: {err}. Start it "
            "(mlflow server --host <host> --port <port>) or correct the URI (host, port, http "
            "or https); logger=none runs the job without tracking"
        ) from err
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    _answered.add(uri)


def is_server(tracking_uri: str) -> bool:
    """``tracking_uri`` names an MLflow tracking server (``http://``, ``https://``), which
    keeps the store and its artifacts, rather than a store this process opens itself."""
    scheme, sep, _ = str(tracking_uri).partition("://")
    return bool(sep) and scheme.lower() in SERVER_SCHEMES


def code_tags() -> dict[str, str]:
    """:func:`recsys.code_version` as run tags: ``code.version``, and from a git checkout
    ``code.git_commit`` and ``code.git_dirty`` (``true`` when tracked files had changed)."""
    return {
        f"code.{key}": str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in code_version().items()
        if value is not None
    }


def model_requirements() -> list[str]:
    """What a packaged model needs installed besides its own copy of recsys: recsys'
    dependencies (``pyproject.toml`` beside the package, else the installed distribution's),
    without optional extras."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, requires

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    try:
        declared = requires("recsys") or []
    except PackageNotFoundError:
        declared = []
    return [r for r in declared if "extra ==" not in r]


def _take_run_lock(lock: Path, patience: float = 10.0) -> int | None:
    """:func:`recsys.locks.hold` on a run's lock, tried again for up to ``patience`` seconds
    while another job holds it (one looking whether the run was left holds it for a moment);
    then ``FileExistsError`` naming the holder."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return locks.hold(lock, lambda holder: holder)
        except FileExistsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_lock(tracking_uri: str, run_id: str) -> Path:
    """The lock file a job holds while its run ``run_id`` runs (:class:`Tracker`): beside a
    sqlite store, in ``<db>.runs/``; for another store (a tracking server, a database), in
    the user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``), ``recsys/mlflow-runs/``.
    Neither is in a temporary folder, which a power cut's reboot empties."""
    if tracking_uri.startswith("sqlite:///"):
        store = Path(tracking_uri.removeprefix("sqlite:///"))
        folder = store.with_name(f"{store.name}.runs")
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = folder / "recsys" / "mlflow-runs"
    return folder.absolute() / f"{run_id}.lock"


ARTIFACT_BARS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextmanager
def artifact_bars_shown_live():
    """Around MLflow's artifact transfers: its progress bars (one update per file, on stderr)
    only where they are seen live (:func:`recsys.shown_live`); into a file or a pipe, where a
    fetched model's ~90 files wrote ~90 carriage-returned updates into a scheduled job's log,
    none. ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` set by the user decides instead."""
    if ARTIFACT_BARS in os.environ or shown_live(sys.stderr):
        yield
        return
    os.environ[ARTIFACT_BARS] = "false"
    try:
        yield
    finally:
        os.environ.pop(ARTIFACT_BARS, None)


@contextmanager
def _root_logging_kept():
    """The root logger's handlers and level as they were before the block: MLflow before 3.7
    creates a new sqlite store's tables with alembic, whose ``fileConfig`` replaced them with
    its own stderr handler at WARN, so the rest of the job's log (Hydra's ``run.log``, the
    console's INFO lines) was lost on the first job into a new store."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@contextmanager
def store_lock(tracking_uri: str):
    """Hold ``<db>.lock`` beside a sqlite store (an advisory ``flock``, released however the
    block ends; not on Windows) while a job opens the store and finds or creates its
    experiment: two jobs starting together on a new store (two nights' jobs, a sweep) would
    otherwise both create its tables or the experiment, and one fails ("table ... already
    exists", "experiment ... already exists"). Other stores, or a filesystem without
    advisory locks (:func:`recsys.locks.flock`): nothing held."""
    if not locks.AVAILABLE or not tracking_uri.startswith("sqlite:///"):
        yield
        return
    lock = tracking_uri.removeprefix("sqlite:///") + ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locks.flock(fd, locks.fcntl.LOCK_EX, lock)  # waits while another job opens the store
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _note_artifact_root(experiment: Any, artifact_root: str) -> None:
    """MLflow fixes an experiment's artifact folder when it is created: a later
    ``logger.artifact_root`` is not applied, and the user is told where artifacts go."""
    where = str(experiment.artifact_location)
    given = str(artifact_root).removeprefix("file://").rstrip("/")  # (a folder as a URI too)
    if where.removeprefix("file://").rstrip("/") != given:
        log.warning(
            "logger.artifact_root=%s is not applied: MLflow experiment %r keeps the artifact "
            "folder it was created with (%s); a new folder needs a new experiment "
            "(logger.experiment_name=...)",
            artifact_root,
            experiment.name,
            where,
        )


def _note_local_artifacts(experiment: Any, tracking_uri: str) -> None:
    """An experiment on a tracking server whose artifacts go to a folder (as recsys created
    them there before it left the folder of ``logger.artifact_root`` out): each job writes its
    artifacts, models included, on its own machine, where no other machine fetches them."""
    where = str(experiment.artifact_location)
    if where.startswith(("/", "file:")):
        log.warning(
            "MLflow experiment %r on the tracking server %s keeps its artifacts in the folder "
            "%s of each machine that logs to it, not in the server's store: models this job "
            "logs can be fetched on this machine only; a new experiment "
            "(logger.experiment_name=...) keeps them on the server",
            experiment.name,
            tracking_uri,
            where,
        )


# the keys of the logger config group (conf/logger/)
LOGGER_KEYS = (
    "enabled",
    "tracking_uri",
    "artifact_root",
    "experiment_name",
    "registered_model_name",
    "model_alias",
)


def check_logger_keys(logger_cfg: Mapping[str, Any] | None) -> None:
    """No unknown key in the ``logger`` group: a misspelt one (``+logger.experiment=x`` for
    ``experiment_name``) was ignored with tracking off, and with it on reached :class:`Tracker`
    as an unexpected argument only when the job opened its run (after a training's data was
    prepared, after a scoring had written its output)."""
    unknown = sorted(set(logger_cfg or {}) - set(LOGGER_KEYS))
    if unknown:
        raise ValueError(f"logger has unknown keys {unknown}; allowed: {list(LOGGER_KEYS)}")


def check_registry(logger_cfg: Mapping[str, Any] | None) -> None:
    """``logger.registered_model_name`` and ``logger.model_alias`` checked before a training,
    by MLflow's rules (and ``@``, which would split ``model=<name>@<alias>`` in the wrong
    place): MLflow would refuse them only when registering, after the whole training."""
    logger = logger_cfg or {}
    name, alias = logger.get("registered_model_name"), logger.get("model_alias")
    if alias is not None and not name:
        raise ValueError(
            f"logger.model_alias={alias} points a registered model's alias at each new "
            "version, but logger.registered_model_name is not set: name the model (e.g. "
            "logger.registered_model_name=recsys), or drop the alias"
        )
    if name is None:
        return
    if not logger.get("enabled", False):
        raise ValueError(
            f"logger.registered_model_name={name}: tracking is off (logger=none), so nothing "
            "would be registered: use logger=mlflow, or drop the name"
        )
    if (
        not isinstance(name, str)
        or not name.strip()
        or any(c in name for c in "/:@")
        or name == "."
        or name.startswith("..")  # MLflow's rule against names that read as paths
    ):
        raise ValueError(
            f"logger.registered_model_name={name!r} must be a non-empty name without '/', ':' "
            "or '@' (scoring finds it as model=<name>@<alias>), neither '.' nor starting with "
            "'..', e.g. recsys-nightly"
        )
    if alias is not None and (
        not isinstance(alias, str)
        or not re.fullmatch(r"[\w\-]{1,255}", alias)
        or alias.lower() == "latest"
        or re.fullmatch(r"[vV]\d+", alias)
    ):
        raise ValueError(
            f"logger.model_alias={alias!r} is not an alias MLflow accepts: letters, digits, "
            "'_' and '-' only, and neither 'latest' nor v<number> (reserved for versions), "
            "e.g. champion"
        )


@contextmanager
def use_tracker(tracker: Tracker | None, logger_cfg: Mapping[str, Any] | None, **kwargs: Any):
    """Yield ``tracker``, or a new one from ``logger_cfg`` that is closed (FINISHED / FAILED)
    on exit; a tracker passed in belongs to the caller and stays open. A run that cannot be
    marked FAILED is named in a warning, and the block's own failure raised."""
    if tracker is not None:
        yield tracker
        return
    tracker = Tracker.from_config(logger_cfg, **kwargs)
    try:
        yield tracker
    except BaseException:
        # (the job's own failure is what it fails with: a tracking server gone took its place,
        # a SIGTERM's exit status 143 among it)
        try:
            tracker.finish("FAILED")
        except Exception as err:
            log.warning("MLflow run %s could not be marked FAILED: %s", tracker.run_id, err)
        raise
    tracker.finish()


class FetchedCheckpoint(type(Path())):
    """A checkpoint copied out of the MLflow store into a temporary folder of its own, which
    :func:`done_with` removes once the caller has loaded it; failing that, it goes with this
    path object (when the last holder drops it, at the latest when the process exits)."""

    _remove: weakref.finalize


def load_model(
    ref: str | Path, logger_cfg: Mapping[str, Any] | None, option: str = "model"
) -> tuple[LoadedModel, dict[str, str]]:
    """``ref`` (see :func:`resolve_model`) -> the loaded model and how it was found (tags)."""
    path, tags = resolve_model(str(ref), logger_cfg, option)
    model = load_checkpoint(path, option=option)
    done_with(path)
    if model.run_id and "model.run_id" not in tags:  # a checkpoint path: the run it records
        tags["model.run_id"] = model.run_id
    return model, tags


def done_with(path: Path) -> None:
    """Remove the copy :func:`resolve_model` fetched, now that the checkpoint is loaded (a
    checkpoint path given directly is the caller's file: left alone)."""
    if isinstance(path, FetchedCheckpoint):
        path._remove()


def resolve_model(
    ref: str, logger_cfg: Mapping[str, Any] | None, option: str = "model", *, fetch: bool = True
) -> tuple[Path | None, dict[str, str]]:
    """Where the model named by ``model=`` (messages name ``option``) is, as a local checkpoint
    file, and how it was found (tags for the scoring run). ``ref`` is one of:

    - a checkpoint path (``.ckpt``): returned as it is;
    - ``<registered name>@<alias>`` or ``models:/<name>@<alias>``, or ``<name>/<version>``
      with the ``models:/`` prefix: the MLflow model registry;
    - an MLflow run id (or ``runs:/<run id>/model``, as runs record it): that run's packaged
      model (``model/``), else its ``checkpoints/``.

    A model from the store is copied into a temporary folder: call :func:`done_with` on the
    returned :class:`FetchedCheckpoint` once it is loaded (a scheduled job of a GB model would
    otherwise leave a copy per run). ``fetch`` False: only check that the store holds the run or
    registered version, copying nothing (the path is then None; a sweep's check).
    """
    import tempfile

    text = str(ref).strip()
    path = Path(text).expanduser()
    if path.is_file():
        return path, {"model.uri": str(path.absolute())}
    if path.is_dir():  # a run folder, or its checkpoints/: name the checkpoint to pass
        refuse_folder(path, option)
    if text.startswith("runs:/"):  # a run's model URI, as runs record it (tag model.uri)
        run_id, _, artifact = text.removeprefix("runs:/").partition("/")
        if not run_id.isalnum() or artifact.strip("/") not in ("", MODEL_ARTIFACT):
            raise ValueError(
                f"{option}={text!r}: a run's model is runs:/<run id>/{MODEL_ARTIFACT}, or the "
                "run id alone"
            )
        text = run_id
    registry = text.removeprefix("models:/")
    is_registry = text.startswith("models:/") or ("@" in text and "/" not in text)
    if is_registry and "@" not in registry and "/" not in registry.strip("/"):
        raise ValueError(
            f"{option}={text!r} names no version of the registered model: give "
            f"models:/{registry.strip('/')}/<version> or {registry.strip('/')}@<alias>"
        )
    if not is_registry and (path.suffix == ".ckpt" or "/" in text or not text.isalnum()):
        raise FileNotFoundError(
            f"{option}={text!r}: no such checkpoint file. Pass a checkpoint path, an MLflow run "
            "id, or a registered model as <name>@<alias>"
        )
    if not logger_cfg or not logger_cfg.get("enabled", False):
        raise ValueError(
            f"{option}={text!r} names an MLflow run or registered model, but tracking is off "
            "(logger=none): pass a checkpoint path"
        )
    if is_registry:
        tracker = Tracker.from_config(logger_cfg, open_run=False)
        client = tracker.client
        try:
            if "@" in registry:
                name, alias = registry.split("@", 1)
                version = client.get_model_version_by_alias(name, alias)
            else:
                name, number = registry.rsplit("/", 1)
                version = client.get_model_version(name, number)
        except Exception as err:  # MLflow raises its own RestException / MlflowException
            raise ValueError(
                f"{option}={text!r}: not found in the MLflow model registry at "
                f"{tracker.tracking_uri} ({err}). Register one by training with "
                "logger.registered_model_name=<name> logger.model_alias=<alias>"
            ) from err
        tags = {"model.uri": text, "model.version": str(version.version)}
        if not fetch:
            return None, tags
        if not version.run_id:  # registered from a path, not a run: fetch what it names
            return _fetch_version_source(tracker, name, version, text, option), tags
        run_id = version.run_id
    else:
        run_id = text
        tags = {"model.uri": f"runs:/{run_id}/{MODEL_ARTIFACT}"}
    from mlflow.exceptions import MlflowException

    try:
        run_tracker = Tracker.from_config(logger_cfg, run_id=run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":  # (a server gone, say: raised as it is)
            raise
        raise ValueError(
            f"{option}={text!r}: no MLflow run with that id in "
            f"{store_uri(logger_cfg.get('tracking_uri'))} "
            f"({type(err).__name__}). Pass a checkpoint path, a run id from `mlflow ui`, or a "
            "registered model as <name>@<alias> (a registered name needs its alias)"
        ) from err
    if not fetch:
        return None, {**tags, "model.run_id": run_id}
    destination = tempfile.mkdtemp(prefix="recsys-model-")
    try:
        checkpoint = _download_checkpoint(run_tracker, destination)
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    path = FetchedCheckpoint(checkpoint)
    path._remove = weakref.finalize(path, shutil.rmtree, destination, ignore_errors=True)
    log.info("model of MLflow run %s fetched to %s (removed when done)", run_id, str(path))
    return path, {**tags, "model.run_id": run_id}


def _fetch_version_source(
    tracker: Tracker, name: str, version, text: str, option: str
) -> FetchedCheckpoint:
    """The checkpoint of a registered version that belongs to no run (registered from a
    path), copied out of its source like a run's (see :func:`resolve_model`)."""
    import tempfile

    import mlflow.artifacts

    source = tracker.client.get_model_version_download_uri(name, version.version)
    destination = tempfile.mkdtemp(prefix="recsys-model-")
    try:
        with artifact_bars_shown_live():
            folder = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=destination, tracking_uri=tracker.tracking_uri
            )
        candidates = sorted(Path(folder).rglob("*.ckpt"))
        if not candidates:
            raise FileNotFoundError(
                f"{option}={text!r}: version {version.version} was registered from {source}, "
                "which holds no recsys checkpoint (*.ckpt): register the model a recsys "
                "training packaged (logger.registered_model_name=<name>)"
            )
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    path = FetchedCheckpoint(candidates[0])
    path._remove = weakref.finalize(path, shutil.rmtree, destination, ignore_errors=True)
    log.info("model %s (from %s) fetched to %s (removed when done)", text, source, str(path))
    return path


def _download_checkpoint(run_tracker: Tracker, destination: str) -> Path:
    """The run's packaged checkpoint (``model/``), else its raw one (``checkpoints/``: a run
    logged before models were packaged), downloaded under ``destination``. A folder the run's
    artifacts list is downloaded or the failure raised as it is (a download cut off, a server
    gone: it had read as a run without a model)."""
    for artifact, pattern in ((MODEL_ARTIFACT, "**/*.ckpt"), ("checkpoints", "*.ckpt")):
        if run_tracker.client.list_artifacts(run_tracker.run_id, artifact):
            folder = run_tracker.download_artifacts(artifact, destination)
            candidates = sorted(folder.glob(pattern))
            if candidates:
                return candidates[0]
    where = run_tracker.client.get_run(run_tracker.run_id).info.artifact_uri
    raise FileNotFoundError(
        f"MLflow run {run_tracker.run_id} has no packaged model ({MODEL_ARTIFACT}/) and no "
        f"checkpoint in its artifacts, {where}"
    )
