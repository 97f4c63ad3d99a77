"""Task: prepared data -> trained encoder (best checkpoint on ``val/ndcg_at_10``)."""

from __future__ import annotations

import copy
import inspect
import logging
import os
import re
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.exceptions import SIGTERMException

from recsys import locks, shown_live
from recsys.allocation import available_memory
from recsys.checkpoint import (
    CHECKPOINT_KEY,
    RUN_ID_KEY,
    LoadedModel,
    check_format,
    check_loadable,
    checkpoint_extra,
    encoder_target,
    load_checkpoint,
    model_digest,
    saved_arguments,
    set_transition_prior,
    unreadable,
    write_scoring_checkpoint,
)
from recsys.config import (
    RUN_FOLDER_LOCK,
    check_required,
    event_schema,
    prepare_settings,
    sweep_tags,
    to_container,
)
from recsys.data.datamodule import SeqRecDataModule, check_loader
from recsys.data.dataset import width_multiple
from recsys.data.io import DataError
from recsys.data.options import time_buckets
from recsys.data.pipeline import QUARANTINE_FILE, STATS_FILE, load_stats
from recsys.data.validate import check_number
from recsys.data.vocab import FILES as VOCAB_FILES
from recsys.data.vocab import Vocab
from recsys.model.interface import check_encoder, reads_time_buckets
from recsys.model.transfer import carry_over
from recsys.model.transition import TransitionCounts, TransitionPrior
from recsys.schema import NUM_RESERVED, UNK_IDX
from recsys.tasks import prepare
from recsys.tracking import (
    Tracker,
    check_registry,
    flatten,
    load_model,
    resolve_model,
    use_tracker,
)
from recsys.training.callbacks import (
    AtomicCheckpointIO,
    CheckMonitors,
    EpochLog,
    MovedRunFolder,
    RandomStreams,
    StopOnDivergence,
    TrainingClock,
)
from recsys.training.evaluation import (
    ACCELERATORS,
    pick_device,
    protocol_tags,
    warn_of_few_targets,
)
from recsys.training.metrics import higher_is_better, known_target_shares
from recsys.training.module import (
    CONTRASTIVE_SCORES,
    KEPT_SCORES,
    RERANK_SCORES,
    SCORE_CHUNK,
    SeqRecModule,
    same_target_partners,
)

log = logging.getLogger(__name__)

MAX_QUARANTINE_ARTIFACT_BYTES = 50 * 2**20  # larger quarantines stay beside the prepared data


@dataclass
class TrainResult:
    checkpoint: Path
    prepared_dir: Path
    best_val: dict[str, float]
    scoring_checkpoint: Path  # the best weights without the optimiser: what is packaged
    run: str  # where the MLflow run is, in words
    train_seconds: float | None = None  # training epochs only (TrainingClock), no validation
    history: list[dict[str, float]] | None = None  # per validation: seconds and metrics


def sweep_objective(metrics: Mapping[str, float]) -> float | None:
    """What a training job returns to Hydra: the objective an optimising sweeper (Optuna,
    Nevergrad, Ax: ``hydra/sweeper=...``) ranks its trials by. It is the validation score
    that selected the checkpoint (the ``best/`` entry of ``metrics``: ``best/val_ndcg_at_10``
    by default, after ``callbacks.model_checkpoint.monitor``), never a test metric: choosing
    settings by test scores is model selection on the test set. None without a score."""
    return next((float(v) for k, v in metrics.items() if k.startswith("best/")), None)


def build_datamodule(cfg: DictConfig, prepared_dir: Path) -> SeqRecDataModule:
    loader = _loader(cfg)
    accelerator = cfg.trainer.get("accelerator", "auto")
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    loader["width_multiple"] = width_multiple(
        loader.get("width_multiple", "auto"), "cuda" if cuda else "cpu"
    )
    return SeqRecDataModule(
        prepared_dir,
        max_seq_len=cfg.data.max_seq_len,
        seed=cfg.seed,
        partners=_partners(cfg),
        # the config's, not the folder's: a reused folder's are not compared (prepare.prepared)
        time_buckets=time_buckets(to_container(cfg.data)),
        **loader,
    )


def _partners(cfg: DictConfig) -> bool:
    return same_target_partners(
        cfg.training.get("contrastive_weight", 0.0),
        cfg.training.get("contrastive_positive", "dropout"),
    )


def _loader(cfg: DictConfig) -> dict[str, Any]:
    """``data.loader`` (null: every loader default)."""
    return dict(to_container(cfg.data.get("loader")) or {})


def build_encoder(cfg: DictConfig, datamodule: SeqRecDataModule) -> torch.nn.Module:
    """Instantiate ``model`` with the sizes that come from the data (never typed into yaml)."""
    vocab = datamodule.vocab
    encoder = _encoder(
        cfg, **vocab.encoder_sizes(), num_time_buckets=datamodule.time_buckets.num_embeddings
    )
    reads = hasattr(encoder, "set_item_attributes")  # optional: encoders without side information
    if reads:
        encoder.set_item_attributes(torch.from_numpy(vocab.item_attribute_array()))
        reads = getattr(encoder, "config", {}).get("attribute_dim") != 0
    if not reads and vocab.attributes.height:
        log.info(
            "%s%s reads item ids only: the %d categories / attributes of the data "
            "(data.columns.category / attributes, data.items) are prepared but not used "
            "(model=atrank embeds them as a bag)",
            type(encoder).__name__,
            " with model.attribute_dim=0" if hasattr(encoder, "set_item_attributes") else "",
            vocab.attributes.height,
        )
    return encoder


def build_callbacks(cfg: DictConfig) -> dict[str, pl.Callback]:
    """``callbacks.*`` by config key; a callback set to null is off
    (``callbacks.weight_averaging`` by default).

    The weight average leaves the encoder's buffers out (``use_buffers=False`` unless set):
    they are constants (the item -> attribute table, the PAD/UNK score mask), and Lightning's
    EMA computes ``decay * average + (1 - decay) * current`` in floating point on them too,
    which the integer attribute table then truncates (decay 0.9999: about a fifth of the
    attribute indices lowered by one in what is validated and saved)."""
    callbacks = {}
    for key, settings in (cfg.callbacks or {}).items():
        if settings is None:
            continue
        extra = {}
        if key == "weight_averaging" and "use_buffers" not in settings:
            extra["use_buffers"] = False
        with _naming_group(f"callbacks.{key}"):
            callbacks[key] = instantiate(settings, **extra)
    return callbacks


def _encoder(cfg: DictConfig, **sizes: int) -> torch.nn.Module:
    """``model`` built with ``max_seq_len`` and those of the data ``sizes`` its constructor
    takes (by name, or all with ``**kwargs``): an encoder that reads no behaviours need not
    declare ``num_behaviors``. Checked against the encoder interface
    (:func:`recsys.model.interface.check_encoder`), so that a member an encoder lacks is named
    here, before the data is prepared, not by an AttributeError after training; so is a class
    that a checkpoint could not name (:func:`recsys.checkpoint.check_loadable`)."""
    try:
        parameters = list(inspect.signature(get_class(cfg.model._target_)).parameters.values())
    except Exception:  # a bad _target_: instantiate below says what is wrong
        parameters = []
    if parameters and all(p.kind is not p.VAR_KEYWORD for p in parameters):
        taken = {p.name for p in parameters}
        sizes = {name: size for name, size in sizes.items() if name in taken}
    try:
        encoder = instantiate(cfg.model, **sizes, max_seq_len=cfg.data.max_seq_len)
    except InstantiationException as err:
        if "can't allocate memory" not in str(err.__cause__):
            raise
        shown = ", ".join(f"{name}={size}" for name, size in sizes.items())
        raise MemoryError(
            f"the model {cfg.model._target_} does not fit in memory with "
            f"data.max_seq_len={cfg.data.max_seq_len} (built with {shown}): lower "
            f"data.max_seq_len or the model's width ({err.__cause__})"
        ) from err.__cause__
    check_encoder(encoder)
    check_loadable(encoder)
    return encoder


# a catalogue larger than any setting's bound on it (negatives, sampled metrics): the trial
# build below refuses what the real one would, and nothing that the real one would take
TRIAL_ITEMS = 20_000
# trainer.precision values recsys trains with (the model stays in float32)
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16", "16")


def check_model_settings(cfg: DictConfig) -> None:
    """Build the encoder and the training module once with placeholder data sizes, so that a
    model or training setting out of range (``model.num_heads=0``, ``model.dropout=1.5``,
    ``training.optimizer.lr=-1``) is refused before the data is prepared, not after."""
    try:
        _trial_build(cfg)
    except ValueError as err:  # a bound on the catalogue is the real one's, not the trial's
        message = str(err).replace(f"{TRIAL_ITEMS - 1}]", "the catalogue's size - 1]")
        message = message.replace(
            f" for this catalogue of {TRIAL_ITEMS} items", " (its size is known once prepared)"
        )
        if message == str(err):
            raise
        raise ValueError(message) from err


def _trial_build(cfg: DictConfig) -> None:
    behaviors = list(event_schema(cfg.data).behaviors)
    num_items = NUM_RESERVED + TRIAL_ITEMS
    with naming_keys("model", cfg.model):
        encoder = _encoder(
            cfg,
            num_items=num_items,
            num_attributes=NUM_RESERVED + 1,
            item_attribute_width=1,
            num_behaviors=NUM_RESERVED + len(behaviors),
            num_time_buckets=time_buckets(to_container(cfg.data)).num_embeddings,
        )
    with naming_keys("training", cfg.training):
        module = instantiate(cfg.training, _partial_=True)(
            encoder=encoder,
            behaviors=behaviors,
            item_counts=torch.ones(num_items, dtype=torch.long),
            target_shares=known_target_shares({}),
            # the trial encoder stands in for each teacher (they are loaded with the data)
            distillation=_distillation(cfg, lambda ref: encoder),
            # no transition seen yet: counted once the data is prepared
            transition_counts=TransitionCounts.from_sequences(
                np.zeros(0, dtype=np.int64),
                np.zeros(1, dtype=np.int64),
                np.zeros(0),
                num_items,
                cfg.training.transition_window,
            ),
        )
        _check_optimisation(module)
    check_time_reference(cfg, encoder, module.objective)
    check_position_settings(encoder)


def check_position_settings(encoder: torch.nn.Module) -> None:
    """Refuse position settings that the encoder's ``model.positional`` leaves without effect
    (the run would train exactly as without them): ``model.position_std`` without a learned
    position table (it scales only that table), ``model.position_origin=first`` without
    positions (``none``). Checked on the config, not in the constructor, so checkpoints saved
    with such a combination still load."""
    config = getattr(encoder, "config", {})
    positional = config.get("positional", "learned")  # SASRec's positions are always learned
    if positional == "none" and config.get("position_origin", "last") != "last":
        raise ValueError(
            f"model.position_origin={config['position_origin']!r} sets where positions count "
            "from, and model.positional='none' adds no positions: set model.positional="
            "sinusoidal or learned, or leave model.position_origin=last"
        )
    std = config.get("position_std")
    if std is not None and positional != "learned":
        raise ValueError(
            f"model.position_std={std} sets the learned position table's std, which "
            f"model.positional={positional!r} does not have: set model.positional=learned, or "
            "model.position_std=null"
        )


def _check_optimisation(module: Any) -> None:
    """``training.optimizer`` and ``training.scheduler`` built on the trial module (torch's
    checks: betas, eps) and stepped three times, so that ``training.optimizer=null``, a
    scheduler that is not a partial, and one that fails on its first steps (``StepLR`` with
    ``step_size: 0``) are refused now, naming the key, not after the data is prepared."""
    for key, factory in (
        ("optimizer", module.optimizer_factory),
        ("scheduler", module.scheduler_factory),
    ):
        if not callable(factory) and not (key == "scheduler" and factory is None):
            shown = "null" if factory is None else repr(factory)
            raise ValueError(
                f"training.{key}={shown} must be a partial (e.g. training.{key}="
                f"{{_target_: <class>, _partial_: true, ...}}; conf/training/default.yaml)"
                + (", or null for none" if key == "scheduler" else "")
            )
    try:
        module.optimizer_factory(list(module.parameters()))
    except (ValueError, TypeError) as err:  # torch names the argument, not the config key
        settings = getattr(module.optimizer_factory, "keywords", {})
        raise ValueError(f"training.optimizer: {err} (its settings: {settings})") from err
    built = module.optimization(steps_per_epoch=lambda: 10)
    if not isinstance(built, dict):  # no schedule
        return
    optimizer, scheduler = built["optimizer"], built["lr_scheduler"]["scheduler"]
    try:
        for _ in range(3):
            optimizer.step()  # no gradients yet: the parameters stay as they are
            scheduler.step()
    except (ArithmeticError, ValueError, TypeError) as err:
        raise ValueError(
            f"training.scheduler fails on its first steps ({type(err).__name__}: {err}): check "
            "its settings"
        ) from err


def _distillation(cfg: DictConfig, load: Callable[[str], Any]) -> dict | None:
    """``training.distillation`` with each teacher reference loaded by ``load``."""
    settings = to_container(cfg.training.get("distillation"))
    if not settings:
        return None
    if not isinstance(settings, dict):  # (a teacher given as the whole setting, true, ...)
        raise ValueError(
            f"training.distillation={settings!r} must be null or a mapping, e.g. "
            "'training.distillation={teachers: [<checkpoint | run id | name@alias>], weight: "
            "1.0, temperature: 1.0}'"
        )
    teachers = settings.get("teachers")
    if isinstance(teachers, str):  # one reference given as a string, not a list
        teachers = [teachers]
    if teachers is not None and not isinstance(teachers, list):
        raise ValueError(
            f"training.distillation.teachers={teachers!r} must be a list of model references "
            "(checkpoint paths, MLflow run ids or <name>@<alias>)"
        )
    return {**settings, "teachers": [load(str(ref)) for ref in teachers or []]}


TEACHERS = "training.distillation.teachers"


@dataclass
class Reference:
    """A trained model that a setting names: the reference as given, the model, and how it
    was found (:func:`recsys.tracking.load_model`'s tags: uri, registered version, run id)."""

    ref: str
    model: LoadedModel
    tags: dict[str, str]

    def run_tags(self, prefix: str) -> dict[str, str]:
        """``prefix``: the reference as given; ``prefix.uri`` / ``.version`` / ``.run_id``: what
        it named when this run started (an alias moves; a run records which model it used)."""
        found = {f"{prefix}.{k.removeprefix('model.')}": v for k, v in self.tags.items()}
        return {prefix: self.ref, **found}


def load_references(cfg: DictConfig) -> tuple[Reference | None, dict | None]:
    """``init_from``'s model and ``training.distillation`` with its teachers loaded, before
    the data is prepared (as evaluate and score load their model first), so that a reference
    that names no model is refused before that work; :func:`reference_model` checks each
    against the data once it is prepared."""

    def load(option: str, ref: str) -> Reference:
        return Reference(str(ref), *load_model(str(ref), cfg.logger, option))

    initial = cfg.get("init_from")
    return (
        None if initial is None else load("init_from", initial),
        _distillation(cfg, lambda ref: load(TEACHERS, ref)),
    )


def check_references(cfg: DictConfig, checked: set[tuple[str, str]] | None = None) -> None:
    """``init_from`` and ``training.distillation``'s teachers resolve, as
    :func:`load_references` resolves them (:func:`recsys.tracking.resolve_model`), without
    copying a model out of the MLflow store: a checkpoint path is loaded, a run id or
    registered model looked up. For a ``-m`` sweep's check before its first job; ``checked``:
    references (with their store) already found, not looked up again."""
    checked = set() if checked is None else checked
    store = str(OmegaConf.select(cfg, "logger.tracking_uri", default=None))

    def check(option: str, ref: str) -> None:
        if (ref, store) not in checked:
            path, _ = resolve_model(ref, cfg.logger, option, fetch=False)
            if path is not None:
                load_checkpoint(path, option=option)
            checked.add((ref, store))

    if cfg.get("init_from") is not None:
        check("init_from", str(cfg.init_from))
    _distillation(cfg, lambda ref: check(TEACHERS, ref))


# in a checkpoint's recsys entry: the teachers it was distilled from (:func:`teacher_records`)
TEACHERS_KEY = "teachers"


def teacher_records(teachers: Sequence[Reference]) -> list[dict[str, str]]:
    """What a checkpoint records of the teachers it was distilled from: each reference as
    given, how it was found (:attr:`Reference.tags`) and its model's
    :func:`recsys.checkpoint.model_digest`, so that the model says what it learnt from and a
    resumed training can tell a reference that names another model since
    (:func:`resume_checkpoint`)."""
    return [{"ref": t.ref, **t.tags, "digest": model_digest(t.model)} for t in teachers]


def reference_model(
    option: str, reference: Reference, datamodule: SeqRecDataModule, *, same_vocabulary=True
) -> LoadedModel:
    """The trained model of ``reference`` (a checkpoint path, MLflow run id or
    ``<name>@<alias>``) that ``option`` names, refused unless it was trained on this run's
    training data (the same vocabulary, training counts included: another split or log gives
    another) with its window and time buckets, so that it reads this run's batches as it was
    trained to. (Not the data fingerprint, which also changes with settings that leave every
    training row as it was.) ``same_vocabulary=False``: another vocabulary of the same
    behaviours will do (``init_from``, which matches items by id)."""
    model, ref = reference.model, reference.ref
    vocabulary = (
        ("vocabulary", model.vocab.content_hash(), datamodule.vocab.content_hash())
        if same_vocabulary
        else ("behaviours", list(model.vocab.behaviors), list(datamodule.vocab.behaviors))
    )
    differences = [
        (what, was, now)
        for what, was, now in (
            vocabulary,
            ("data.max_seq_len", model.max_seq_len, datamodule.max_seq_len),
            ("data.time_buckets", asdict(model.time_buckets), asdict(datamodule.time_buckets)),
        )
        if was != now
    ]
    if differences:
        listed = "; ".join(f"{what} {was} (this run {now})" for what, was, now in differences)
        raise ValueError(
            f"{option}={ref}: that model was trained on other data or data settings ({listed}): "
            "name models trained on this run's data and window"
        )
    return model


# encoder settings that ``init_from`` may change: they shape no weight (dropout) or only the
# initial weights it replaces (init_std; embedding_std and position_std also scale their
# tables in every forward pass, so they change what the loaded weights compute)
FREE_WHEN_INITIALISED = frozenset({"dropout", "init_std"})
# ... and the sizes that come from the vocabulary, when init_from's model has another one
VOCABULARY_SIZES = frozenset({"num_items", "num_attributes", "item_attribute_width"})


def initialise_from(
    reference: Reference | None, encoder: torch.nn.Module, datamodule
) -> Reference | None:
    """``init_from`` (loaded by :func:`load_references`): start this training from another
    model's weights (same model settings but :data:`FREE_WHEN_INITIALISED`; the training
    settings may differ). A new run with a fresh optimiser, unlike ``resume``. A model of
    other data (another night's log) needs the same behaviours, window and time buckets; its
    item and attribute rows are carried over by id (:mod:`recsys.model.transfer`). Returns
    ``reference`` (``None``: not set)."""
    if reference is None:
        return None
    ref = reference.ref
    model = reference_model("init_from", reference, datamodule, same_vocabulary=False)
    same_vocabulary = model.vocab.content_hash() == datamodule.vocab.content_hash()
    free = FREE_WHEN_INITIALISED if same_vocabulary else FREE_WHEN_INITIALISED | VOCABULARY_SIZES
    source = model.encoder
    if type(source) is not type(encoder):
        raise ValueError(
            f"init_from={ref}: that model is a {type(source).__name__}, this run trains a "
            f"{type(encoder).__name__}: give a model of the same class"
        )
    changed = {
        key: (value, encoder.config.get(key))
        for key, value in dict(source.config).items()
        if key not in free and encoder.config.get(key) != value
    }
    if changed:
        raise ValueError(
            f"init_from={ref}: that model has other settings (it -> this run: "
            + ", ".join(
                f"model.{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items())
            )
            + "): use the model settings it was trained with"
        )
    carried = None
    try:
        if same_vocabulary:
            encoder.load_state_dict(source.state_dict())
        else:
            carried = carry_over(source, model.vocab, encoder, datamodule.vocab)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"init_from={ref}: its weights do not fit this run's model ({err}); use the model "
            "settings it was trained with"
        ) from err
    except LookupError as err:  # no item id in common
        raise ValueError(f"init_from={ref}: {err}: name a model of this catalogue") from err
    except TypeError as err:  # an encoder that does not list its vocabulary's tables
        raise ValueError(f"init_from={ref}: {err}") from err
    if carried is None:
        log.info("initialised the model from %s", ref)
    else:
        log.info("initialised the model from %s (other data): %s", ref, carried.describe())
        reference.tags["carried_items"] = f"{carried.items}/{carried.num_items}"
        if carried.attributes is not None:  # an encoder with an attribute table
            reference.tags["carried_attributes"] = f"{carried.attributes}/{carried.num_attributes}"
    return reference


def check_time_reference(cfg: DictConfig, encoder: torch.nn.Module, objective: str) -> None:
    """Refuse ``data.time_buckets.reference=target`` where a causal encoder that reads time
    buckets is trained at every position of a window: every token's bucket is then its gap to
    the window's last target, so each earlier position would learn from when a later event
    happens (and evaluation, which measures gaps to that position's own target, differs)."""
    reference = time_buckets(to_container(cfg.data)).reference
    samples = (cfg.data.get("loader") or {}).get("train_samples", "windows")
    if (
        reference == "target"
        and samples == "windows"
        and objective == "retrieval"
        and reads_time_buckets(encoder)
        and getattr(encoder, "causal", True)
    ):
        raise ValueError(
            "data.time_buckets.reference=target gives every token its gap to the window's last "
            "target, so a causal encoder trained at every position "
            "(data.loader.train_samples=windows) would see when later events happen: use "
            "data.loader.train_samples=prefixes (one row per target), model.causal=false (the "
            "last position trained) or data.time_buckets.reference=previous"
        )


@contextmanager
def naming_keys(group: str, settings: DictConfig) -> Iterator[None]:
    """A constructor's ``ValueError('num_heads=0 is invalid ...')`` as the config key the user
    sets (``model.num_heads=0 ...``), without Hydra's instantiation wrapper around it."""
    try:
        yield
    except (ValueError, TypeError, InstantiationException) as err:  # (TypeError: a partial's)
        cause = err if isinstance(err, (ValueError, TypeError)) else err.__cause__
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
        if isinstance(cause, TypeError) and unknown and unknown[1] in settings:
            hint = ""
            if group == "model":  # an experiment overlay sets keys of the encoders it was made for
                hint = (
                    f"; an experiment= overlay (conf/experiment/) may have set it: give the "
                    f"constructor that argument, or add ~model.{unknown[1]} to the command"
                )
            raise ValueError(
                f"{group}.{unknown[1]} is not an option of {settings.get('_target_')}: check "
                f"its spelling, or drop it (the options: conf/{group}/){hint}"
            ) from cause
        if not isinstance(cause, ValueError):
            raise
        message = str(cause)
        key = message.split("=", 1)[0]
        if key in settings and not message.startswith(f"{group}."):
            message = f"{group}.{message}"
        elif key == "max_seq_len":  # the one encoder argument set under data
            message = f"data.{message}"
        raise ValueError(message) from cause


def data_arguments(vocab: Vocab, stats: Mapping[str, Any]) -> dict:
    """What the training module needs from the data: behaviour names (for
    ``training.behavior_weights``), item training counts (popularity-sampled negatives) and
    the share of each split's targets that can be ranked (``training.unknown_targets``)."""
    return {
        "behaviors": list(vocab.behaviors),
        "item_counts": torch.tensor(vocab.item_train_counts(), dtype=torch.long),
        "target_shares": known_target_shares(stats),
    }


def store_transitions(datamodule: SeqRecDataModule, window: int = 1) -> TransitionCounts:
    """The item pairs at most ``window`` events apart in the prepared data's training
    sequences: the transition baseline's counts (1) and ``training.transition_prior``'s
    (``training.transition_window``)."""
    datamodule.setup()
    store = datamodule.store
    return TransitionCounts.from_sequences(
        store.item, store.offsets, store.train_end, datamodule.vocab.num_items, window
    )


def write_transition_prior(
    cfg: DictConfig, best: Path, datamodule: SeqRecDataModule, prior: TransitionPrior
) -> dict:
    """Write this run's transition ``prior`` (``training.transition_prior`` and its shape,
    this run's counts) into the ``best`` checkpoint, with ``auto``'s weight chosen for it on
    validation; returns the choice's metrics ({} for a set weight). Written whatever that
    file held: a resumed training's best checkpoint may be one of the interrupted run's,
    saved without a prior or with another."""
    from recsys.tasks.evaluate import select_transition_prior  # (it imports this module)

    metrics = {}
    if cfg.training.transition_prior == "auto":
        model = load_checkpoint(best)
        device = pick_device(cfg.trainer.accelerator, option="trainer.accelerator")
        prior, metrics = select_transition_prior(
            cfg, model.encoder, model.vocab, datamodule, prior, device
        )
    set_transition_prior(best, prior)
    return metrics


def trained_targets(cfg: DictConfig, behaviors: Sequence[str]) -> list[str]:
    """The behaviours the model learns to predict: those with a positive
    ``training.behavior_weights`` weight (every behaviour when none are given)."""
    weights = cfg.training.get("behavior_weights") or {}
    if not weights:
        return list(behaviors)
    # (a weight that is no number is refused by the training module, by its key)
    return [b for b in behaviors if _positive(weights.get(b, 0))]


def _positive(weight: object) -> bool:
    return isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight > 0


def check_evaluated_targets(
    evaluated: Sequence[str] | None,
    trained: Sequence[str] | None,
    behaviors: Sequence[str],
    *,
    splits: str,
    trained_by: str,
) -> None:
    """Refuse ``splits`` targets (``data.split.target_behaviors``: ``evaluated``; None: every
    behaviour) of behaviours the model is not trained to predict (``trained``, as
    :func:`trained_targets` gives them, told as ``trained_by``; None: every behaviour): its
    metrics would count targets it never learns, e.g. views for a model of purchases."""
    evaluated_set = set(evaluated or behaviors)
    trained = list(behaviors) if trained is None else list(trained)
    untrained = [b for b in behaviors if b in evaluated_set and b not in trained]
    if not untrained:
        return
    shown = "null" if evaluated is None else f"[{', '.join(evaluated)}]"
    fit = [b for b in trained if b in evaluated_set] or trained
    raise ValueError(
        f"data.split.target_behaviors={shown} makes {untrained} {splits} targets, but "
        f"{trained_by} to predict only {trained}: its metrics would count targets it never "
        f"learns; set data.split.target_behaviors=[{', '.join(fit)}]"
        + (" (or fewer of them)" if len(fit) > 1 else "")
    )


def check_target_behaviors(cfg: DictConfig) -> None:
    """:func:`check_evaluated_targets` for a training: validation (which selects the
    checkpoint) and test targets of behaviours ``training.behavior_weights`` does not train."""
    weights = cfg.training.get("behavior_weights")
    if not weights:
        return
    behaviors = event_schema(cfg.data).behaviors
    check_evaluated_targets(
        prepare_settings(cfg.data).split.target_behaviors,
        trained_targets(cfg, behaviors),
        behaviors,
        splits="validation and test",
        trained_by=f"training.behavior_weights={dict(weights)} trains the model",
    )


def check_weighted_targets(cfg: DictConfig, datamodule: SeqRecDataModule) -> None:
    """Refuse ``training.behavior_weights`` whose weighted behaviours no training target has
    (e.g. ``{fav: 1}`` on a log without favourites): the loss would be 0 at every step and
    the "best" checkpoint an untrained model. Weighted behaviours without a training target
    beside others that have one are named in a warning: their weights train nothing."""
    if not cfg.training.get("behavior_weights"):
        return
    behaviors = datamodule.vocab.behaviors
    wanted = trained_targets(cfg, behaviors)
    datamodule.setup()
    store = datamodule.store
    target = (store.positions() >= 1) & store.training_mask()  # a training event after another
    codes = np.unique(store.behavior[target]) - NUM_RESERVED  # PAD/UNK: below 0
    present = {behaviors[c] for c in codes if 0 <= c < len(behaviors)}
    if not present & set(wanted):
        raise ValueError(
            f"training.behavior_weights={dict(cfg.training.behavior_weights)} weighs "
            f"{wanted}, but no training target is one of them (the training window's targets "
            f"are {sorted(present)}): weigh behaviours the data has, or drop the setting"
        )
    if missing := [b for b in wanted if b not in present]:
        log.warning(
            "training.behavior_weights weighs %s, which no training target is: %s trains "
            "nothing (the training window's targets are %s)",
            missing,
            "its weight" if len(missing) == 1 else "their weights",
            sorted(present),
        )


def peak_training_batch(datamodule: SeqRecDataModule, module: SeqRecModule) -> tuple[int, int]:
    """(rows, trained positions) of the batch that trains the most positions in the training's
    first epoch, from its loader's batch order (a copy of the sampler: the training's own is
    not advanced). A trained position is one :meth:`SeqRecModule._trained_positions` trains:
    a target item in the vocabulary (not UNK) of a behaviour weighted above 0, at the last
    position only for a non-causal encoder."""
    loader = datamodule.train_dataloader()
    store = datamodule.store
    trainable = store.item > UNK_IDX
    if module.behavior_weight is not None:
        trainable &= module.behavior_weight.numpy()[store.behavior] > 0
    first, stop = loader.dataset.target_span
    if not getattr(module.encoder, "causal", True):
        first = np.maximum(first, stop - 1)
    before = np.concatenate([[0], np.cumsum(trainable)])  # trainable targets before each event
    counts = before[stop] - before[first]  # (rows,)
    return max(
        ((len(batch), int(counts[batch].sum())) for batch in copy.deepcopy(loader.sampler)),
        key=lambda batch: batch[1],
        default=(0, 0),
    )


def check_training_memory(
    cfg: DictConfig, module: SeqRecModule, datamodule: SeqRecDataModule
) -> None:
    """Refuse a training whose step cannot fit in the memory left on its device, before it
    starts: at a large catalogue the full softmax's (positions x items) tables alone can need
    tens of GiB (a million items, the default batch of 128 windows of 50 events: 24 GiB),
    and such a training was killed by the out-of-memory killer at its first step, without a
    word in its log (or failed with CUDA out of memory). The step's memory is a lower bound
    (:meth:`SeqRecModule.step_memory` of the first epoch's largest batch, the encoder's
    activations left out) and is compared with :func:`recsys.allocation.available_memory`,
    so only a training that cannot fit is refused; the message names what would."""
    accelerator = cfg.trainer.get("accelerator", "auto")
    if accelerator not in ACCELERATORS or (
        accelerator in ("gpu", "cuda") and not torch.cuda.is_available()
    ):
        return  # (another accelerator: its memory is not known here)
    device = pick_device(accelerator, option="trainer.accelerator")
    if device.type == "cuda" and cfg.trainer.get("devices", 1) != 1:
        return  # (several GPUs: asking one's memory starts CUDA, which forked workers refuse)
    known = available_memory(device)
    if known is None:
        return
    available, source = known
    rows, positions = peak_training_batch(datamodule, module)
    parts = module.step_memory(rows, positions, device)
    needed = sum(parts.values())
    shown = ", ".join(f"{name} {_gib(size)}" for name, size in parts.items() if size)
    if needed <= available:
        if needed >= 2**30:
            log.info(
                "one training step holds at least %s (%s) of the %s available (%s)",
                _gib(needed),
                shown,
                _gib(available),
                source,
            )
        return
    items = module.encoder.num_items - NUM_RESERVED
    fixes = []
    softmax = parts.get(KEPT_SCORES, 0) + parts.get(SCORE_CHUNK, 0)
    if softmax:
        fixes.append(
            "a sampled loss, whose memory does not grow with the catalogue beyond the item "
            f"table: training.loss=sampled_softmax (training.num_negatives="
            f"{module.num_negatives} negatives per target)"
        )
    if parts.get(RERANK_SCORES):
        fixes.append("no re-rank loss: training.rerank_top_n=0")
    if parts.get(CONTRASTIVE_SCORES, 0) > needed / 2:
        fixes.append("no contrastive loss: training.contrastive_weight=0")
    batch_size = datamodule.batch_size

    def fits(size: int) -> bool:  # a batch of this size, its positions in proportion, in 80 %
        scaled = module.step_memory(size, positions * size // max(rows, 1), device)
        return sum(scaled.values()) <= 0.8 * available

    smaller = next((size for size in range(batch_size - 1, 0, -1) if fits(size)), None)
    if smaller is not None:
        fixes.append(
            f"smaller batches: data.loader.batch_size={smaller} or lower (now {batch_size}), "
            f"or a shorter window, data.max_seq_len (now {datamodule.max_seq_len})"
        )
    reuse = f"data.prepared_dir={datamodule.prepared_dir} reuses the prepared data"
    fixes.append(
        "fewer items: data.min_item_count=<n> maps the items with fewer than n training events "
        f"to UNK (the data is prepared again; for the other fixes {reuse})"
    )
    raise MemoryError(
        f"one training step needs at least {_gib(needed)} on the {device.type.upper()} ({shown}: "
        f"the first epoch's largest batch, {rows} rows training {positions:,} positions over "
        f"{items:,} items), more than the {_gib(available)} available ({source}): the "
        "training would be killed for lack of memory in its first steps. Train with "
        + "; or ".join(fixes)
    )


def _gib(size: int) -> str:
    """Bytes in GiB (MiB under 1 GiB), one decimal."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def log_config_params(tracker: Tracker, cfg: DictConfig) -> None:
    """The resolved config as flattened params. A resumed training's optimiser, scheduler and
    early stopping's patience continue from the checkpoint, so those settings keep the values
    logged first (not tagged as changed). The main job logs them as soon as its run opens, so
    that a run that fails before its data is prepared still says which job it was; logged
    again, nothing changes."""
    tracker.log_params(
        flatten(to_container(cfg)),
        restored=RESTORED_ON_RESUME if cfg.get("resume") is not None else (),
    )


def log_run_inputs(tracker: Tracker, cfg: DictConfig, prepared_dir: Path) -> None:
    """Resolved config (flattened params + yaml), vocabularies and dataset statistics."""
    log_config_params(tracker, cfg)
    config_file = Path(cfg.paths.run_dir) / "config_resolved.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracker.log_artifact(config_file, "config")
    for name in (*VOCAB_FILES.values(), STATS_FILE):
        tracker.log_artifact(prepared_dir / name, "data")
    quarantine = prepared_dir / QUARANTINE_FILE
    if quarantine.exists() and quarantine.stat().st_size <= MAX_QUARANTINE_ARTIFACT_BYTES:
        tracker.log_artifact(quarantine, "data")
    stats = load_stats(prepared_dir)
    tracker.set_tags(
        {
            "data.fingerprint": stats["fingerprint"],
            **{f"data.{k}": str(stats[k]) for k in ("rows_read", "events", "users", "quarantined")},
        }
    )


# settings a resumed training takes from its checkpoint, not from the config
# (Lightning restores early stopping's patience, not its other settings)
RESTORED_ON_RESUME = (
    "training.optimizer.",
    "training.scheduler.",
    "callbacks.early_stopping.patience",
)


def note_restored_settings(cfg: DictConfig, checkpoint: Path) -> None:
    """Name in a warning the :data:`RESTORED_ON_RESUME` settings of ``cfg`` that differ from
    the state ``checkpoint`` restores (the optimiser's hyperparameters, early stopping's
    patience): Lightning continues those from the checkpoint, so a new value is not applied.
    A tracked run that continues the interrupted one names them from its logged parameters
    (:meth:`recsys.tracking.Tracker.log_params`); without one (``logger=none``, or a store
    that lacks that run) they were not applied without a word."""
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:  # (advice only: the resume itself loads the checkpoint its way)
        log.debug("resume settings not compared with %s: %s", checkpoint, err)
        return
    kept: dict[str, tuple[Any, Any]] = {}
    groups = [g for s in state.get("optimizer_states") or [] for g in s.get("param_groups", [])]
    optimizer = to_container(cfg.training.get("optimizer")) or {}
    if groups and isinstance(optimizer, Mapping):
        saved = groups[0]
        for key, given in optimizer.items():
            # (a scheduler keeps the configured learning rate as initial_lr)
            was = saved.get("initial_lr" if key == "lr" and "initial_lr" in saved else key)
            if key.startswith("_") or was is None or given is None:
                continue
            if isinstance(was, (list, tuple)) and isinstance(given, (list, tuple)):
                differs = list(was) != list(given)
            else:
                differs = was != given
            if differs:
                kept[f"training.optimizer.{key}"] = (was, given)
    patience = ((cfg.get("callbacks") or {}).get("early_stopping") or {}).get("patience")
    for name, callback in (state.get("callbacks") or {}).items():
        was = callback.get("patience") if isinstance(callback, Mapping) else None
        if name.startswith("EarlyStopping") and was is not None and patience not in (None, was):
            kept["callbacks.early_stopping.patience"] = (was, patience)
    if kept:
        log.warning(
            "not applied to the resumed training, which continues from its checkpoint: %s",
            ", ".join(f"{k} {was} (given {given})" for k, (was, given) in sorted(kept.items())),
        )


def last_checkpoint_path(cfg: DictConfig) -> Path | None:
    """The checkpoint ``resume=last`` continues from (``callbacks.last_checkpoint``'s file,
    written after every epoch); None without that callback."""
    last = (cfg.callbacks or {}).get("last_checkpoint")
    return None if last is None else Path(last.dirpath) / f"{last.filename}.ckpt"


def log_how_to_continue(cfg: DictConfig, trainer, how: str) -> None:
    """Tell an interrupted training's owner how to continue it: the job log otherwise ended
    with the signal alone (``SystemExit: 143``)."""
    last = last_checkpoint_path(cfg)
    epoch = f"in epoch {trainer.current_epoch + 1}"
    # a sweep's job: the sweep again would give every job that folder
    overrides = sweep_tags().get("sweep.overrides")
    command = "the same command" if overrides is None else f"this job's {overrides} (no -m)"
    if last is not None and last.is_file():
        log.warning(
            "training %s %s: continue it from its last finished epoch with %s "
            "and paths.run_dir=%s resume=last",
            how,
            epoch,
            command,
            Path(cfg.paths.run_dir).resolve(),
        )
    else:
        log.warning("training %s %s, before any checkpoint to continue from", how, epoch)


def _resume_target(cfg: DictConfig) -> tuple[str, Path, dict] | None:
    """``resume``'s value, the checkpoint it names and that checkpoint's recsys entry (read
    memory-mapped and ``weights_only``: the weights and optimiser state, GBs on a large
    catalogue, are read once, by Lightning, and nothing but tensors and plain values is
    unpickled); ``None`` without ``resume``."""
    value = cfg.get("resume")
    if value is None:
        return None
    if str(value) == "last":
        path = last_checkpoint_path(cfg)
        if path is None:
            raise ValueError("resume=last needs callbacks.last_checkpoint (it writes last.ckpt)")
        fix = (
            "pass paths.run_dir=<the interrupted run's folder> (its checkpoints/last.ckpt is "
            "written after every epoch), a checkpoint path, or drop resume to start fresh"
        )
    else:
        path, fix = Path(str(value)), "give an existing checkpoint, or drop resume to start fresh"
    if not path.is_file():
        raise FileNotFoundError(f"resume={value}: checkpoint {path} does not exist: {fix}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # a cut file raises OSError, RuntimeError, ... (see unreadable)
        raise ValueError(
            f"resume={value}: {path} could not be read as a training checkpoint "
            f"({unreadable(path, err)}): continue from another checkpoint of the run "
            f"(resume={path.with_name('best.ckpt')} continues from its best epoch), or train "
            "afresh into a new folder (a new hydra.run.dir)"
        ) from err
    saved = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if saved is None:
        raise ValueError(f"resume={value}: {path} is not a recsys training checkpoint")
    check_format(saved, path, prefix=f"resume={value}: ")
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    if TEACHERS_KEY not in saved and hyper_parameters.get("distillation"):
        saved = {**saved, TEACHERS_KEY: None}  # distilled by a recsys that recorded no teacher
    if "optimizer_states" not in checkpoint:
        raise ValueError(
            f"resume={value}: {path} is a scoring checkpoint (weights only, no optimiser or "
            "callback state), which cannot continue a training: resume from the run's "
            "checkpoints/last.ckpt (resume=last with paths.run_dir=<that run's folder>)"
        )
    own = (cfg.callbacks or {}).get("model_checkpoint")
    if own is not None and path.parent.resolve() != Path(own.dirpath).resolve():
        raise ValueError(
            f"resume={value}: {path} belongs to another run folder than this job's "
            f"({own.dirpath}); Lightning keeps the best checkpoint so far only in its own "
            "folder, so the continued training could end with a worse best.ckpt: continue it "
            f"there with paths.run_dir={path.parent.parent} resume=last"
        )
    return str(value), path, saved


def resumed_run_id(cfg: DictConfig) -> str | None:
    """The MLflow run of the training that ``resume`` continues (``None``: no resume, or it
    was not tracked): the job tracks its rest into that same run."""
    target = _resume_target(cfg)
    return None if target is None else target[2].get(RUN_ID_KEY)


def _prepared(cfg: DictConfig) -> Path:
    """:func:`prepare.prepared`, except for a resumed training that prepares into its run
    folder: the log is prepared beside the run's ``prepared/`` and checked against the
    checkpoint's data first, so a refused resume (the log changed meanwhile) leaves the
    interrupted run's data as it was."""
    target = _resume_target(cfg)
    if target is not None:  # before the log is prepared: the settings the checkpoint records
        value, path, saved = target
        prepare.refuse_other_settings(
            saved.get("data_settings"),
            cfg,
            trained=f"resume={value}: {path}",
            fix="resume with the data settings of the interrupted run",
            otherwise=", or drop resume to start fresh",
        )
    if target is None or cfg.data.prepared_dir:
        return prepare.prepared(cfg)
    final = Path(cfg.paths.run_dir) / "prepared"
    # one name, the run folder being held: what a killed resume left there is replaced (its
    # staging folder removed: recsys.data.pipeline._remove_abandoned), not left for good
    trial = prepare.run(cfg, final.with_name(".prepared-resume"))
    try:
        _check_fingerprint(target, load_stats(trial)["fingerprint"])
    except ValueError as err:
        shutil.rmtree(trial, ignore_errors=True)
        if not _holds(final, target[2]["data_fingerprint"]):
            raise
        # the run's own data is there: the same log may read otherwise since (an upgrade)
        raise ValueError(
            f"{err}. If the log is the same, the recsys that prepared it for the run read it "
            'otherwise (an upgrade since: whole-number float ids now read as integers, "" ids '
            f"as missing, ...): continue on the data it was trained on with data.prepared_dir="
            f"{final}"
        ) from err
    if final.exists() and _current(final):  # the same data (same fingerprint): keep it
        shutil.rmtree(trial, ignore_errors=True)
    else:  # (a folder of an earlier recsys's format: replaced by the same data in this one's)
        shutil.rmtree(final, ignore_errors=True)
        trial.rename(final)
    return final


def _holds(prepared_dir: Path, fingerprint: str) -> bool:
    """Whether ``prepared_dir`` is a prepared folder of this version holding the data of
    ``fingerprint``."""
    try:
        return load_stats(prepared_dir).get("fingerprint") == fingerprint
    except (DataError, OSError, ValueError):
        return False


def _current(prepared_dir: Path) -> bool:
    """Whether ``prepared_dir`` is readable as this version's prepared folder."""
    try:
        load_stats(prepared_dir)
    except DataError:
        return False
    return True


def _check_fingerprint(target: tuple[str, Path, dict], fingerprint: str) -> None:
    value, path, saved = target
    if saved["data_fingerprint"] != fingerprint:
        raise ValueError(
            f"resume={value}: {path} was trained on other data (fingerprint "
            f"{saved['data_fingerprint']}, this run's data {fingerprint}): resume with the data "
            "and data settings of the interrupted run, or drop resume to start fresh"
        )


def resume_checkpoint(
    cfg: DictConfig,
    encoder: torch.nn.Module,
    fingerprint: str,
    teachers: Sequence[Mapping[str, str]] = (),
) -> Path | None:
    """The checkpoint ``resume`` names (``None``: start fresh), checked against this run.

    ``resume=last`` is the run folder's ``checkpoints/last.ckpt``, written after every
    validation (``callbacks.last_checkpoint``), so a training that was interrupted (killed,
    out of time) continues from its last finished epoch with ``paths.run_dir=<that run's
    folder> resume=last``; any other value is a checkpoint path. Optimiser, scheduler, early
    stopping, the best checkpoint so far, weight averaging, the training clock and the MLflow
    run all continue. The data and the encoder settings must be those the checkpoint was
    trained with, and a teacher reference (``teachers``: :func:`teacher_records`) the
    checkpoint records must name the model it named then.
    """
    target = _resume_target(cfg)
    if target is None:
        return None
    value, path, saved = target
    _check_fingerprint(target, fingerprint)
    target_name = encoder_target(encoder)
    config = saved["encoder_config"]
    if saved["encoder_target"] == target_name:  # (an argument added since: as its code had it)
        config = saved_arguments(type(encoder), config)
    changed = {k: (config.get(k), v) for k, v in dict(encoder.config).items() if config.get(k) != v}
    if saved["encoder_target"] != target_name:
        changed["encoder"] = (saved["encoder_target"], target_name)
    # (a reused data.prepared_dir leaves them to the config: its fingerprint does not say)
    buckets = asdict(time_buckets(to_container(cfg.data)))
    if saved["time_buckets"] != buckets:
        changed["data.time_buckets"] = (saved["time_buckets"], buckets)
    if changed:
        raise ValueError(
            f"resume={value}: {path} holds another model (checkpoint -> this run: "
            + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
            + "): resume with the model settings of the interrupted run"
        )
    _check_teachers(f"resume={value}: {path}", saved.get(TEACHERS_KEY, []), teachers)
    return path


def _check_teachers(
    resumed: str,
    saved: Sequence[Mapping[str, str]] | None,
    teachers: Sequence[Mapping[str, str]],
) -> None:
    """Refuse a teacher reference that names another model than when the interrupted run
    distilled from it (a checkpoint file replaced, an alias moved since): the run would learn
    from one model, then from another, its record naming one. (A reference changed in the
    config is a changed setting, tagged as such.) A distillation checkpoint of a recsys before
    teachers were recorded (``saved`` None) has nothing to check them against: a warning says
    so."""
    if saved is None:
        for i, now in enumerate(teachers):
            log.warning(
                "%s records no teacher (an earlier recsys wrote it): %s[%d]=%s is taken as the "
                "model it distilled from, unchecked; if that reference was replaced or its "
                "alias moved since, drop resume to train afresh",
                resumed,
                TEACHERS,
                i,
                now["ref"],
            )
        return
    for i, (was, now) in enumerate(zip(saved, teachers)):
        if was.get("ref") != now["ref"] or was.get("digest") == now["digest"]:
            continue
        version = f" (version {was['model.version']})" if "model.version" in was else ""
        raise ValueError(
            f"{resumed}: {TEACHERS}[{i}]={now['ref']} names another model than the one it "
            f"distilled from{version}: its weights or data changed since (digest "
            f"{str(was.get('digest'))[:12]}, now {now['digest'][:12]}); restore that model "
            "(for a moved alias, name its version: models:/<name>/<version>), or drop resume "
            "to train afresh"
        )


def check_checkpoint_callback(cfg: DictConfig) -> None:
    """``callbacks.model_checkpoint`` must be there: other settings refer to its folder, and
    evaluation and scoring read the best checkpoint it keeps."""
    if not isinstance((cfg.get("callbacks") or {}).get("model_checkpoint"), DictConfig):
        raise ValueError(
            "callbacks.model_checkpoint is not set: it keeps the best checkpoint, which "
            "evaluation and scoring read (and other settings refer to its folder): keep it "
            "(conf/callbacks/default.yaml), changing its keys if need be"
        )


def check_run_folder(cfg: DictConfig) -> None:
    """Refuse, before any work, to train into a run folder that holds a training already (its
    checkpoints), unless ``resume`` continues it: a second training there would write
    best-v1.ckpt beside the first one's, overwrite its scoring checkpoint and config, and
    leave a later ``resume=last`` the first one's last.ckpt."""
    check_checkpoint_callback(cfg)  # (its folder is one of those looked into)
    if cfg.get("resume") is not None:
        return
    run_dir = Path(cfg.paths.run_dir)
    folders = {
        Path(callback.dirpath)
        for callback in (cfg.callbacks or {}).values()
        if isinstance(callback, DictConfig) and callback.get("dirpath")
    }
    held = sorted({p for folder in folders for p in folder.rglob("*.ckpt")})
    if held:
        names = [str(p.relative_to(run_dir)) if p.is_relative_to(run_dir) else str(p) for p in held]
        raise FileExistsError(
            f"paths.run_dir={run_dir} already holds a training ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}): continue it with resume=last, or train into "
            "another folder (a new hydra.run.dir=... or paths.run_dir=..., or none: each job "
            "then gets its own)"
        )


_HELD: set[Path] = set()  # the run folders this process holds (see hold_run_folder)
LOCK_FILE = RUN_FOLDER_LOCK


@contextmanager
def hold_run_folder(cfg: DictConfig) -> Iterator[None]:
    """Hold ``paths.run_dir`` while a training works there: an exclusive lock on its
    ``.lock`` file, so that a second job given the same folder meanwhile (a scheduler's
    overlapping start of the same command) is refused at once instead of training beside the
    first and overwriting its checkpoints. :func:`check_run_folder` sees only a finished
    training's files; this sees a running one. Re-entrant within a process (the main job holds
    the folder around its training); the lock goes with the process, however it ends."""
    run_dir = Path(cfg.paths.run_dir).resolve()
    if run_dir in _HELD or not locks.AVAILABLE:
        yield
        return
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = locks.hold(
        run_dir / LOCK_FILE,
        lambda holder: (
            f"paths.run_dir={run_dir} is in use by a job running now ({holder}): wait for it "
            "to end (then resume=last continues it), or train into another folder (a new "
            "paths.run_dir=..., or none: each job then gets its own)"
        ),
    )
    _HELD.add(run_dir)
    try:
        yield
    finally:
        _HELD.discard(run_dir)
        if created and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} == {LOCK_FILE}:
            shutil.rmtree(run_dir)  # a job refused before any work leaves no folder behind
        if fd is not None:  # (None: a filesystem without locks)
            os.close(fd)


TRAINER_SWITCHES = ("enable_progress_bar", "enable_model_summary", "enable_checkpointing")
AUTO_SWITCHES = ("enable_progress_bar",)  # also take auto: see progress_bar


def progress_bar(trainer: DictConfig) -> bool | None:
    """``trainer.enable_progress_bar`` as Lightning takes it. ``auto`` (the default) shows the
    bar only where it is seen live (:func:`recsys.shown_live`): standard output, where
    Lightning writes it, is a terminal or a notebook's. A job whose output goes to a file, a
    pipe or a scheduler's log (cron, ``> job.log 2>&1``, ``| tee``) gets none, where it wrote
    every batch's update, carriage-returned, into one line per epoch; the job log's line per
    epoch (:class:`EpochLog`) tells the training's progress there."""
    value = trainer.get("enable_progress_bar")
    return shown_live(sys.stdout) if value == "auto" else value


def _mps_available() -> bool:
    """Whether Lightning's ``accelerator=auto`` could pick Apple's GPU."""
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def divergence_settings(cfg: DictConfig) -> str:
    """The settings a diverged training names (:class:`StopOnDivergence`)."""
    optimizer = cfg.training.get("optimizer") or {}
    decay = optimizer.get("weight_decay")
    clip = (cfg.trainer or {}).get("gradient_clip_val")
    return (
        f"training.optimizer.lr={optimizer.get('lr')}, "
        + ("" if decay is None else f"training.optimizer.weight_decay={decay}, ")
        + f"trainer.gradient_clip_val={clip}"
    )


def _warn_of_idle_loss_settings(training: DictConfig) -> None:
    """Negative-sampling settings changed from their defaults where the loss draws no
    negatives (full softmax with the retrieval objective), and ``gbce_t`` outside gbce, are
    named in a warning: the run would otherwise look like the ablation it is not. A warning,
    not a refusal, so a sweep crossing losses with negative counts still runs."""
    loss = training.get("loss", "full_softmax")
    idle = ["gbce_t"] if loss != "gbce" else []
    if loss == "full_softmax" and training.get("objective", "retrieval") == "retrieval":
        idle += ["num_negatives", "negative_sampler", "shared_negatives"]
    defaults = inspect.signature(SeqRecModule.__init__).parameters
    changed = [
        f"training.{key}={training[key]!r}"
        for key in idle
        if key in training and training[key] != defaults[key].default
    ]
    if changed:
        log.warning(
            "%s: no effect with training.loss=%s and objective=%s (negatives are drawn by the "
            "sampled losses and the target_attention objective; gbce_t is gbce's calibration)",
            ", ".join(changed),
            loss,
            training.get("objective", "retrieval"),
        )


def _check_contrastive_batch(cfg: DictConfig, samples: str) -> None:
    """Refuse the contrastive loss where each training batch trains one position: batches of
    one row (``data.loader.batch_size=1``) that train one position each (``train_samples=
    prefixes``, or a non-causal encoder's last position) leave it no other position to
    contrast with, so it would be 0 at every step (:func:`recsys.training.losses.info_nce`),
    its extra encoder pass wasted, without a word."""
    weight = cfg.training.get("contrastive_weight", 0.0)
    if not _positive(weight) or _loader(cfg).get("batch_size") != 1:
        return
    causal = (cfg.model or {}).get("causal", True)
    if samples != "prefixes" and causal is not False:
        return
    why = (
        "data.loader.train_samples=prefixes trains one position per row"
        if samples == "prefixes"
        else "model.causal=false trains the last position of each row"
    )
    raise ValueError(
        f"training.contrastive_weight={weight} contrasts each trained position with the "
        f"batch's others, but data.loader.batch_size=1 and {why}: one position per batch, "
        "so the loss would be 0 at every step; raise data.loader.batch_size, or set "
        "training.contrastive_weight=0"
    )


def check_settings(cfg: DictConfig) -> None:
    """Settings that Lightning would take without complaint or refuse without naming them,
    checked before any work: ``data.loader``'s sizes, the seed, ``trainer.max_epochs`` and each
    callback's ``patience``. (What a monitor names is checked by :class:`CheckMonitors` once
    validation has logged its metrics.)"""
    check_loader(_partners(cfg), **_loader(cfg))
    samples = (cfg.data.get("loader") or {}).get("train_samples", "windows")
    _check_contrastive_batch(cfg, samples)
    if cfg.training.get("objective") == "target_attention" and samples == "windows":
        log.warning(
            "training.objective=target_attention trains the last position of each row only: "
            "with data.loader.train_samples=windows that is one target per window of "
            "data.max_seq_len=%s, the others unused; data.loader.train_samples=prefixes trains "
            "every training event (one row each), as model=atrank_faithful does",
            cfg.data.get("max_seq_len"),
        )
    _warn_of_idle_loss_settings(cfg.training)
    if cfg.get("init_from") is not None and cfg.get("resume") is not None:
        raise ValueError(
            "init_from and resume are both set: resume continues an interrupted run (weights, "
            "optimiser, epoch, early stopping); init_from starts a new run from a model's "
            "weights: keep one"
        )
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} must be a whole number in [0, 2**32 - 1], e.g. seed=0")
    epochs = (cfg.trainer or {}).get("max_epochs")
    if epochs is not None and (
        isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < -1
    ):
        raise ValueError(
            f"trainer.max_epochs={epochs!r} must be a whole number >= 1, or -1 (no limit)"
        )
    if epochs == 0:
        raise ValueError(
            "trainer.max_epochs=0 trains nothing, so there is no checkpoint to select: set it "
            ">= 1 (early stopping usually ends training sooner) or -1 (no limit)"
        )
    trainer = cfg.trainer or {}
    for key, integer, minimum, why in (
        # a negative clip: torch scales the gradients by it (ascent)
        ("gradient_clip_val", False, 0, " (the largest gradient norm; 0 or null: no clipping)"),
        ("check_val_every_n_epoch", True, 1, " (validation selects the checkpoint)"),
        ("accumulate_grad_batches", True, 1, " (batches per optimiser step)"),
    ):
        if trainer.get(key) is not None:
            check_number(f"trainer.{key}", trainer[key], integer=integer, minimum=minimum, why=why)
    every = trainer.get("check_val_every_n_epoch") or 1
    if isinstance(epochs, int) and epochs > 0 and isinstance(every, int) and every > epochs:
        raise ValueError(
            f"trainer.check_val_every_n_epoch={every} with trainer.max_epochs={epochs}: no "
            "validation would run, so no checkpoint would be selected: validate at least "
            "once (check_val_every_n_epoch <= max_epochs)"
        )
    if trainer.get("max_steps") == 0:
        raise ValueError("trainer.max_steps=0 trains nothing: drop it, or set it >= 1 (-1: none)")
    for key, what in (("limit_train_batches", "trains"), ("limit_val_batches", "validates")):
        limit = trainer.get(key)
        if limit is None:
            continue
        check_number(f"trainer.{key}", limit, minimum=0)
        if limit == 0 or (isinstance(limit, float) and limit > 1):
            raise ValueError(
                f"trainer.{key}={limit!r}: 0 {what} nothing (no checkpoint would be selected); "
                "give a share in (0, 1] or a whole number of batches >= 1"
            )
    deterministic = trainer.get("deterministic")
    if deterministic is not None and deterministic not in (True, False, "warn"):
        raise ValueError(
            f"trainer.deterministic={deterministic!r} must be true, false or warn (Lightning "
            "applies other values only in part)"
        )
    switches = {f"trainer.{key}": trainer.get(key) for key in TRAINER_SWITCHES}
    clock = (cfg.callbacks or {}).get("training_clock")
    if isinstance(clock, DictConfig):
        switches["callbacks.training_clock.test_curve"] = clock.get("test_curve")
    for key, value in switches.items():
        auto = key.removeprefix("trainer.") in AUTO_SWITCHES
        if value is not None and not isinstance(value, bool) and not (auto and value == "auto"):
            choices = "true, false or auto" if auto else "true or false"
            raise ValueError(f"{key}={value!r} must be {choices}")
    precision = str(trainer.get("precision", "32-true"))
    if precision not in PRECISIONS:
        raise ValueError(
            f"trainer.precision={precision}: recsys trains in float32 (32-true) or with mixed "
            "precision (bf16-mixed, as trainer=gpu, or 16-mixed); a model held in 16 or 64 bits "
            "(16-true, bf16-true, 64-true) is not supported"
        )
    accelerator = (cfg.trainer or {}).get("accelerator")
    on_cpu = accelerator == "cpu" or (
        accelerator in (None, "auto") and not torch.cuda.is_available() and not _mps_available()
    )
    if precision in ("16-mixed", "16") and on_cpu:  # Lightning would train in bf16-mixed
        raise ValueError(
            f"trainer.precision={precision}: float16 mixed precision needs a GPU, and this job "
            "trains on the CPU (Lightning would switch to bf16-mixed while the run records "
            f"{precision}): use trainer.precision=bf16-mixed, or 32-true"
        )
    devices = trainer.get("devices", 1)
    listed = isinstance(devices, Sequence) and not isinstance(devices, str)
    if not (devices in (1, "1") or (listed and len(devices) == 1)):
        raise ValueError(
            f"trainer.devices={devices}: recsys trains on one device (one process); "
            "set trainer.devices=1 (a particular GPU: trainer.devices=[<index>])"
        )
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator}: this machine has no CUDA GPU: train on the CPU "
            "with trainer=default (accelerator auto), or trainer.accelerator=cpu"
        )
    best = (cfg.callbacks or {}).get("model_checkpoint")
    if best is not None and best.get("save_top_k", 1) == 0:
        raise ValueError(
            "callbacks.model_checkpoint.save_top_k=0 keeps no checkpoint, so the training "
            "would end with none to evaluate or score: keep 1 (the best), or -1 (every one)"
        )
    for key, callback in (cfg.callbacks or {}).items():
        decay = callback.get("decay") if isinstance(callback, DictConfig) else None
        if decay is not None:  # an average that never (1) or always (0) follows the weights
            check_number(f"callbacks.{key}.decay", decay, minimum=0)
            if not 0 < decay < 1:
                raise ValueError(
                    f"callbacks.{key}.decay={decay} must lie strictly between 0 and 1 (e.g. "
                    "0.999): at 1 the average keeps the initial weights, at 0 it is no average"
                )
        if isinstance(callback, DictConfig) and callback.get("min_delta") is not None:
            check_number(f"callbacks.{key}.min_delta", callback.min_delta, minimum=0)
        monitor = callback.get("monitor") if isinstance(callback, DictConfig) else None
        if higher_is_better(str(monitor or "")) and callback.get("mode") == "min":
            raise ValueError(
                f"callbacks.{key}.mode=min with monitor={monitor!r}: higher is better for "
                "that metric, so min would select (or stop at) the worst epoch; set mode=max"
            )
        patience = callback.get("patience") if isinstance(callback, DictConfig) else None
        if patience is not None and (
            isinstance(patience, bool) or not isinstance(patience, int) or patience < 0
        ):
            raise ValueError(
                f"callbacks.{key}.patience={patience!r} must be a whole number >= 0: the "
                "validations without improvement before training stops"
            )


def check_monitored_cutoffs(cfg: DictConfig) -> None:
    """A callback monitoring a metric at a cutoff (``val/ndcg_at_10``) that
    ``training.metric_ks`` does not compute is refused before the data is prepared
    (:class:`CheckMonitors` would refuse it only at the first validation)."""
    ks = cfg.training.get("metric_ks")
    ks = list(ks) if isinstance(ks, Sequence) and not isinstance(ks, str) else None
    for key, callback in (cfg.callbacks or {}).items():
        monitor = callback.get("monitor") if isinstance(callback, DictConfig) else None
        cutoff = re.fullmatch(r"(?:val|test)/\w+_at_(\d+)", str(monitor or ""))
        if ks is not None and cutoff and int(cutoff[1]) not in ks:
            raise ValueError(
                f"callbacks.{key}.monitor={monitor!r} is not a metric this run logs: its "
                f"cutoff {cutoff[1]} is not in training.metric_ks={ks}; add it there, or "
                "monitor a cutoff it has"
            )


def check_trainer_settings(cfg: DictConfig) -> None:
    """Build the callbacks and the Trainer once (cheap: no folder, no data), so that a setting
    Lightning refuses (``trainer.precision=33``, ``+trainer.max_epoch=3``,
    ``callbacks.model_checkpoint.mode=maximum``) stops the job before the data is prepared."""
    check_monitored_cutoffs(cfg)  # (after the module's check of training.metric_ks itself)
    callbacks = build_callbacks(cfg)
    quiet = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its "GPU available" lines come with the real Trainer
    try:
        with _naming_group("trainer"):
            instantiate(
                cfg.trainer,
                logger=False,
                callbacks=list(callbacks.values()),
                enable_progress_bar=progress_bar(cfg.trainer),
            )
    finally:
        quiet.setLevel(level)


# What Lightning says in every training that does not apply to recsys' (message patterns):
# - train/* metrics are per-epoch means (SeqRecModule._log_train: on_step=False), so an epoch
#   of fewer batches than trainer.log_every_n_steps loses no log, whatever Lightning advises;
# - Lightning's own CombinedLoader builds torch's deprecated LeafSpec (nothing recsys calls);
# - with data.loader.num_workers=0 (the default: a batch is one vectorised gather, workers
#   rarely pay off) the "does not have many workers" advice is the opposite of the measured
#   one; a user who sets workers still gets it.
LIGHTNING_WARNINGS = (
    r"The number of training batches \(\d+\) is smaller than the logging interval",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
WORKERS_WARNING = r"The '\w+' does not have many workers"
# a resumed training's checkpoint folder holds its own checkpoints (a new training into a folder
# that holds some is refused: check_run_folder), which Lightning warns of as if by accident
RESUME_WARNING = r"Checkpoint directory .* exists and is not empty"
LIGHTNING_TIP = "\N{ELECTRIC LIGHT BULB} Tip:"  # advertisements (litlogger, litmodels)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_TIP)


@contextmanager
def lightning_notices_filtered(*, num_workers: int, resuming: bool = False) -> Iterator[None]:
    """Around building the Trainer and fitting: Lightning's warnings that do not apply to a
    recsys training (:data:`LIGHTNING_WARNINGS`, :data:`WORKERS_WARNING` when
    ``num_workers`` is 0, :data:`RESUME_WARNING` when ``resuming``) and its "Tip:"
    advertisements are dropped; any other warning or line of Lightning's is shown as before."""
    rank_zero = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    tips = _DropTips()
    patterns = [
        *LIGHTNING_WARNINGS,
        *([WORKERS_WARNING] if num_workers == 0 else []),
        *([RESUME_WARNING] if resuming else []),
    ]
    rank_zero.addFilter(tips)
    try:
        with warnings.catch_warnings():
            for pattern in patterns:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        rank_zero.removeFilter(tips)


@contextmanager
def _naming_group(option: str) -> Iterator[None]:
    """What a ``_target_`` refuses (Lightning's own words), prefixed by the config key that
    built it, without Hydra's instantiation wrapper around it."""
    try:
        yield
    except InstantiationException as err:
        cause = err.__cause__ or err
        raise ValueError(f"{option}: {cause}") from cause


def publish_model(cfg: DictConfig, tracker: Tracker, scoring_checkpoint: Path) -> str | None:
    """Package ``scoring_checkpoint`` into the run's ``model/`` (an MLflow model), register it
    as ``logger.registered_model_name`` (a new version) and point ``logger.model_alias`` at it
    (no name: packaged only). Called as the last step of a job that succeeded (training alone,
    or the main job after evaluating and scoring), so that a version or an alias never names
    the model of a failed job, nor a resumed run's ``model/``, which versions registered from
    it serve, holds a model whose job failed."""
    tracker.log_model(scoring_checkpoint)
    logger = cfg.logger or {}
    return tracker.register_model(
        logger.get("registered_model_name"), alias=logger.get("model_alias")
    )


def run(
    cfg: DictConfig,
    tracker: Tracker | None = None,
    *,
    register: bool = True,
    checked: bool = False,
) -> TrainResult:
    """Train; with ``register`` (default) the model is packaged and registered at the end (see
    :func:`publish_model`). The main job passes ``register=False`` and publishes after its
    evaluation and scoring, and ``checked=True``: it has run :func:`check_config` itself,
    before opening its MLflow run."""
    check_required(cfg)  # before the run folder is held (created)
    with hold_run_folder(cfg):
        return _run(cfg, tracker, register, checked)


def check_config(cfg: DictConfig) -> None:
    """Every check of a training's config that needs neither data nor a folder: run before
    any work, and for each job of a ``-m`` sweep before the first starts
    (:class:`recsys.config.CheckSweep`)."""
    check_required(cfg)
    check_checkpoint_callback(cfg)
    prepare_settings(cfg.data)
    check_settings(cfg)
    check_model_settings(cfg)  # (training.behavior_weights' values among them)
    check_target_behaviors(cfg)
    check_trainer_settings(cfg)
    check_registry(cfg.logger)


def _run(
    cfg: DictConfig, tracker: Tracker | None, register: bool = True, checked: bool = False
) -> TrainResult:
    check_run_folder(cfg)
    if not checked:
        check_config(cfg)
    pl.seed_everything(cfg.seed, workers=True)
    initial, distillation = load_references(cfg)  # a reference to nothing: before preparing
    prepared_dir = _prepared(cfg)
    datamodule = build_datamodule(cfg, prepared_dir)
    check_weighted_targets(cfg, datamodule)
    # what selects the checkpoint (the test split is warned about where it is evaluated)
    warn_of_few_targets("val", datamodule.stats, cfg.training.unknown_targets)
    encoder = build_encoder(cfg, datamodule)
    initialised = initialise_from(initial, encoder, datamodule)
    teachers = [] if distillation is None else distillation["teachers"]
    taught_by = teacher_records(teachers)
    if distillation is not None:
        distillation = {
            **distillation,
            "teachers": [reference_model(TEACHERS, t, datamodule).encoder for t in teachers],
        }
    # a partial, so the (large, plain) checkpoint_extra is not copied into an OmegaConf node
    module = instantiate(cfg.training, _partial_=True)(
        encoder=encoder,
        distillation=distillation,
        transition_counts=(
            None
            if cfg.training.get("transition_prior") is None
            else store_transitions(datamodule, cfg.training.transition_window)
        ),
        **data_arguments(datamodule.vocab, datamodule.stats),
        checkpoint_extra=checkpoint_extra(
            vocab=datamodule.vocab,
            schema=event_schema(cfg.data),
            time_buckets=datamodule.time_buckets,
            max_seq_len=cfg.data.max_seq_len,
            data_fingerprint=datamodule.stats["fingerprint"],
            target_behaviors=trained_targets(cfg, datamodule.vocab.behaviors),
            data_settings={k: datamodule.stats.get(k) for k in prepare.DATA_SETTINGS_KEYS},
        ),
    )
    rankable = datamodule.vocab.num_items - NUM_RESERVED
    if trivial := [k for k in module.metric_ks if k >= rankable]:
        log.warning(
            "training.metric_ks %s reach the catalogue's %d rankable items: every ranked target "
            "is a hit at those cutoffs (HR 1), so they measure nothing; use smaller ones",
            trivial,
            rankable,
        )
    check_training_memory(cfg, module, datamodule)  # before a run opens or a step is taken
    if taught_by:  # what the model learnt from (and what a resume must find again)
        module.checkpoint_extra[TEACHERS_KEY] = taught_by
    resume = resume_checkpoint(cfg, encoder, datamodule.stats["fingerprint"], taught_by)
    continued = resumed_run_id(cfg) if tracker is None else None  # (else the caller's run)
    with use_tracker(
        tracker, cfg.logger, run_name=cfg.task_name, continue_run_id=continued
    ) as tracker:
        tracker.set_tags(  # (the validation metrics' protocol: pipelines.train has no test)
            {**protocol_tags(cfg, datamodule), "task": cfg.task_name, **sweep_tags()}
        )
        if initialised is not None:
            tracker.set_tags(initialised.run_tags("train.initialised_from"))
        for i, teacher in enumerate(teachers):
            tracker.set_tags(teacher.run_tags(f"train.teacher.{i}"))
        if resume is not None:
            tracker.set_tags({"train.resumed_from": str(resume)})
            log.info("resuming training from %s", resume)
            if tracker.run_id is None or tracker.run_id != resumed_run_id(cfg):
                note_restored_settings(cfg, resume)  # (a continued run's params name them)
        if tracker.run_id is not None:  # a later resume continues this run
            module.checkpoint_extra[RUN_ID_KEY] = tracker.run_id
        log_run_inputs(tracker, cfg, prepared_dir)

        callbacks = build_callbacks(cfg)
        monitors = {
            f"callbacks.{key}.monitor": callback.monitor
            for key, callback in callbacks.items()
            if getattr(callback, "monitor", None)
        }
        workers = datamodule.num_workers
        with lightning_notices_filtered(num_workers=workers):
            trainer = instantiate(
                cfg.trainer,
                logger=tracker.lightning_logger() or False,
                enable_progress_bar=progress_bar(cfg.trainer),
                plugins=[AtomicCheckpointIO()],
                callbacks=[
                    *callbacks.values(),
                    EpochLog(callbacks.get("model_checkpoint")),
                    CheckMonitors(monitors),
                    RandomStreams(),
                    MovedRunFolder(),
                    StopOnDivergence(divergence_settings(cfg)),
                ],
            )
        ctrl_c = signal.getsignal(signal.SIGINT)  # Lightning leaves Ctrl-C ignored after one
        try:
            with lightning_notices_filtered(num_workers=workers, resuming=resume is not None):
                trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
        except SIGTERMException as err:  # Lightning's SystemExit() would end the job with 0
            log_how_to_continue(cfg, trainer, "killed by SIGTERM")
            raise SystemExit(128 + signal.SIGTERM) from err  # a scheduler must see the kill
        except SystemExit as err:
            if not trainer.interrupted:
                raise
            by_ctrl_c = isinstance(err.__context__, KeyboardInterrupt)
            # (a SIGTERM is SystemExit(143) from the job's handler, which Lightning re-raises)
            killed = err.code == 128 + signal.SIGTERM
            how = "interrupted (Ctrl-C)" if by_ctrl_c else "killed by SIGTERM" if killed else ""
            log_how_to_continue(cfg, trainer, how or f"stopped (exit status {err.code})")
            if not by_ctrl_c:
                raise
            # Lightning ends a Ctrl-C with sys.exit(1), which the log and a scheduler would
            # read as the job's own failure: an interrupt, as anywhere else in the job (exit 130)
            raise KeyboardInterrupt("interrupted (Ctrl-C) while training") from err
        finally:
            if ctrl_c is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, ctrl_c)

        checkpoint_cb = callbacks.get("model_checkpoint")  # the best one (last_checkpoint: latest)
        if checkpoint_cb is None or not checkpoint_cb.best_model_path:
            raise RuntimeError("training produced no checkpoint: keep callbacks.model_checkpoint")
        best = Path(checkpoint_cb.best_model_path)
        if module.transition_prior is not None:
            tracker.log_metrics(
                write_transition_prior(cfg, best, datamodule, module.transition_prior)
            )
        tracker.log_artifact(best, "checkpoints")
        scoring = write_scoring_checkpoint(best, best.parent / "scoring" / "model.ckpt")
        best_score = checkpoint_cb.best_model_score
        # named after what selected it: best/val_ndcg_at_10 by default, best/val_mrr, ...
        best_name = "best/" + str(checkpoint_cb.monitor).replace("/", "_")
        best_val = {} if best_score is None else {best_name: float(best_score)}
        tracker.log_metrics(best_val)
        log.info(
            "best checkpoint %s (%s)",
            best,
            ", ".join(f"{name} {value:.4f}" for name, value in best_val.items()) or "no score",
        )
        if register:  # (the main job publishes once it has evaluated and scored the model)
            publish_model(cfg, tracker, scoring)
    clock = next((c for c in callbacks.values() if isinstance(c, TrainingClock)), None)
    return TrainResult(
        checkpoint=best,
        scoring_checkpoint=scoring,
        prepared_dir=prepared_dir,
        best_val=best_val,
        run=tracker.describe(),
        train_seconds=None if clock is None else clock.train_seconds,
        history=None if clock is None else clock.history,
    )
