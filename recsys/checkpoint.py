"""Checkpoints that rebuild themselves: encoder class and arguments, weights, vocabulary, data
schema and time-bucket settings travel together, and load with ``torch.load(weights_only=True)``
(no arbitrary unpickling).

A Lightning checkpoint written by :class:`recsys.training.module.SeqRecModule` carries all of
it under the ``"recsys"`` key.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import logging
import pickle
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from recsys.data.sequences import TimeBuckets
from recsys.data.vocab import Vocab
from recsys.model.transition import TransitionPrior
from recsys.retrieval.output import write_atomically
from recsys.schema import EventSchema

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "recsys"
# The recsys entry's format (its format_version). One without it was written before it was
# recorded and is read as it was (arguments added since: ARGUMENTS_BEFORE_THEY_EXISTED). Raised
# with a change that the code before it would read wrongly (a key renamed, or read otherwise),
# so that such code refuses a newer checkpoint by name instead of loading it as its own.
FORMAT_VERSION = 1
ALLOWED_PACKAGE = "recsys.model."  # checkpoints may only name encoder classes from here
RUN_ID_KEY = "mlflow_run_id"  # in the recsys entry: the run that trained it (a resume continues it)
# what load_checkpoint reads from the recsys entry (the others are optional)
REQUIRED_KEYS = (
    "encoder_target",
    "encoder_config",
    "vocab",
    "schema",
    "time_buckets",
    "max_seq_len",
)


@dataclass
class LoadedModel:
    encoder: nn.Module
    vocab: Vocab
    schema: EventSchema
    time_buckets: TimeBuckets
    max_seq_len: int
    path: Path
    target_behaviors: tuple[str, ...] | None = None  # what it was trained to predict; None = any
    data_fingerprint: str | None = None
    # what the prepared data it was trained on records of its data settings (stats.json's
    # tasks.prepare.DATA_SETTINGS_KEYS); None in a checkpoint written before they were kept
    data_settings: dict | None = None
    # training.transition_prior: added to the encoder's scores by evaluation and scoring
    transition_prior: TransitionPrior | None = None
    # the code that trained it (recsys.code_version()); None: written before it was recorded
    code: dict | None = None
    run_id: str | None = None  # the MLflow run that trained it (None: tracking was off)

    def never_recommended(self) -> list[int]:
        """Item indices never to recommend or serve, named in a warning: those whose id
        preparation now reads as a missing one (:meth:`Vocab.missing_id_indices`, ``""``),
        which a model of an earlier recsys learnt as an item."""
        missing = self.vocab.missing_id_indices()
        if missing:
            log.warning(
                'the model %s holds the item id "" (an empty text id), which recsys now reads '
                "as a missing id (data.bad_rows.null_id): it learnt it as an item before that "
                "rule, and it is never recommended; retrain the model on the log to drop it",
                self.path,
            )
        return missing


def checkpoint_extra(
    *,
    vocab: Vocab,
    schema: EventSchema,
    time_buckets: TimeBuckets,
    max_seq_len: int,
    data_fingerprint: str,
    target_behaviors: list[str] | None = None,
    data_settings: dict | None = None,
) -> dict:
    """What a checkpoint needs besides the encoder to score a fresh log (plain values only)."""
    return {
        "vocab": vocab.to_plain(),
        "schema": schema.to_dict(),
        "time_buckets": {
            "unit_seconds": time_buckets.unit_seconds,
            "num_buckets": time_buckets.num_buckets,
            "reference": time_buckets.reference,
        },
        "max_seq_len": max_seq_len,
        "data_fingerprint": data_fingerprint,
        "target_behaviors": None if target_behaviors is None else list(target_behaviors),
        "data_settings": data_settings,
    }


def encoder_target(encoder: nn.Module) -> str:
    """The class name a checkpoint records for ``encoder`` (``module.QualifiedName``)."""
    return f"{type(encoder).__module__}.{type(encoder).__qualname__}"


def check_loadable(encoder: nn.Module) -> None:
    """Refuse an encoder whose checkpoint could not be loaded: its class outside
    :data:`ALLOWED_PACKAGE`, or not importable by that name (defined inside a function). Called
    when the model is built, so such an encoder is refused before training, not once it has
    trained and evaluation loads its checkpoint."""
    target = encoder_target(encoder)
    try:
        loadable = _encoder_class(target) is type(encoder)
    except ValueError as err:
        raise TypeError(
            f"{err}: move {type(encoder).__name__} into a module under recsys/model/ "
            "(the README's 'Adding an encoder'), or its checkpoint cannot be evaluated, "
            "scored or exported"
        ) from None
    except (ImportError, AttributeError):
        loadable = False
    if not loadable:
        raise TypeError(
            f"encoder class {target!r} cannot be imported by that name, so its checkpoint "
            "could not be loaded: define it at the top level of a module under recsys/model/"
        )


def _encoder_class(target: str) -> type[nn.Module]:
    if not target.startswith(ALLOWED_PACKAGE):
        raise ValueError(
            f"checkpoint names encoder class {target!r}; only classes under "
            f"{ALLOWED_PACKAGE.rstrip('.')} are loaded"
        )
    module_name, _, class_name = target.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", *, option: str = "model"
) -> LoadedModel:
    """Rebuild the encoder (in eval mode) and its vocabulary from a recsys checkpoint
    (messages name ``option``, the key that named the file: ``model``, ``init_from``, ...)."""
    path = Path(path)
    if path.is_dir():
        refuse_folder(path, option)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # the unpickler fails on other files in many ways
        raise ValueError(
            f"{path} is not a recsys checkpoint ({unreadable(path, err)}): point {option}= at a "
            ".ckpt file the train task wrote (a run's checkpoints/best.ckpt or "
            "checkpoints/scoring/model.ckpt), whole"
        ) from err
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint:
        raise ValueError(
            f"{path} is not a recsys checkpoint (no {CHECKPOINT_KEY!r} entry): "
            "use a checkpoint written by the train task"
        )
    meta = checkpoint[CHECKPOINT_KEY]
    check_format(meta, path)
    # another version of recsys (a key renamed or added since), or a file damaged inside: the
    # rebuild would fail on the first missing key or argument with a bare KeyError / TypeError
    fix = (
        "it was written by another version of recsys, or is damaged: retrain with this "
        "version, or load it with the recsys version that trained it"
    )
    missing = [k for k in REQUIRED_KEYS if not isinstance(meta, dict) or k not in meta]
    if not isinstance(checkpoint.get("state_dict"), dict):
        missing.append("state_dict (the weights)")
    if missing:
        raise ValueError(f"{path} cannot be loaded: it lacks {', '.join(missing)}; {fix}")
    check_finite_weights(checkpoint["state_dict"], path)
    try:
        return _rebuild(meta, checkpoint["state_dict"], path)
    except (KeyError, TypeError, ValueError, RuntimeError, ImportError, AttributeError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), "")
        raise ValueError(
            f"{path} cannot be loaded: its model ({meta.get('encoder_target')!r}) could not be "
            f"rebuilt from it ({type(err).__name__}: {first.strip()[:300]}); {fix}"
        ) from err


def check_finite_weights(state_dict: dict, path: Path | str) -> None:
    """Refuse weights that are not numbers (NaN or inf: a training that diverged, or a file
    damaged since): every score they reach would be NaN, which ranks first in a top-K, so
    scoring would write arbitrary recommendations and evaluation report a model that misses
    every target, neither saying why. ``path`` names the checkpoint (or the module) in the
    message."""
    bad = [
        name
        for name, weight in state_dict.items()
        if isinstance(weight, torch.Tensor)
        and weight.is_floating_point()
        and not torch.isfinite(weight).all()
    ]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(
            f"{path} holds weights that are not finite (NaN or inf) in {len(bad)} of its "
            f"{len(state_dict)} tensors ({shown}): the training that wrote it diverged, or the "
            "file was damaged since; its scores would be NaN. Use an earlier checkpoint, or "
            "retrain with a lower training.optimizer.lr (or trainer.gradient_clip_val)"
        )


def check_format(meta, path: Path, prefix: str = "") -> None:
    """Refuse a checkpoint whose recsys entry ``meta`` is of another format than this version
    writes (a newer recsys's): its keys may mean what this code does not know. Messages start
    with ``prefix`` (``resume=last: ``)."""
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version is not None and version != FORMAT_VERSION:
        raise ValueError(
            f"{prefix}{path} is a checkpoint of format {version!r} (its {CHECKPOINT_KEY!r} "
            f"entry's format_version), written by another version of recsys; this version "
            f"reads format {FORMAT_VERSION}: load it with the recsys version that trained it, "
            "or retrain with this one"
        )


def refuse_folder(path: Path, option: str) -> None:
    """Refuse a folder given as a checkpoint (a run folder, or its ``checkpoints/``), naming
    the checkpoint in it to pass instead."""
    found = [p for p in (path / "checkpoints" / "best.ckpt", path / "best.ckpt") if p.is_file()]
    found = found or sorted(path.rglob("*.ckpt"))[:3]
    raise IsADirectoryError(
        f"{option}={str(path)!r} is a folder, not a checkpoint file: "
        + (
            f"pass one of its checkpoints, e.g. {option}={found[0]}"
            if found
            else "it holds no checkpoint (*.ckpt); pass a checkpoint path, an MLflow run "
            "id, or a registered model as <name>@<alias>"
        )
    )


def unreadable(path: Path, err: Exception) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in words that lead to the fix.
    torch's own messages do not: an empty file's EOFError has none; a text file's advises
    re-running with ``weights_only=False`` (which would run code a hostile file names) or
    saving with a zip option; a cut file's speaks of miniz's central directory."""
    size = path.stat().st_size
    if size == 0:
        return "an empty file (0 bytes)"
    if not zipfile.is_zipfile(path):  # torch.save and Lightning write zip archives
        return (
            f"not a torch.save zip archive ({size} bytes): another kind of file, or a "
            "checkpoint cut short by a copy or write that did not finish"
        )
    if isinstance(err, pickle.UnpicklingError) and "weights only" in str(err).lower():
        found = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line]
        return (
            "it holds Python objects other than tensors and plain values"
            + (f" ({found[0][:200]})" if found else "")
            + ", which recsys never writes; loading it in full would run code the file "
            "names, so do that only with a file from a source you trust"
        )
    first = next((line for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first.strip()[:200]}"


def saved_arguments(encoder_class: type, config: dict) -> dict:
    """The encoder arguments a checkpoint's ``encoder_config`` stands for: those added to
    ``encoder_class`` after it was written take the value its code had
    (``ARGUMENTS_BEFORE_THEY_EXISTED``)."""
    return {**getattr(encoder_class, "ARGUMENTS_BEFORE_THEY_EXISTED", {}), **config}


def _rebuild(meta: dict, state_dict: dict, path: Path) -> LoadedModel:
    encoder_class = _encoder_class(meta["encoder_target"])
    encoder = encoder_class(**saved_arguments(encoder_class, meta["encoder_config"]))
    prefix = "encoder."
    state = {k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)}
    encoder.load_state_dict(state)
    encoder.eval()
    return LoadedModel(
        encoder=encoder,
        vocab=Vocab.from_plain(meta["vocab"]),
        schema=EventSchema.from_dict(meta["schema"]),
        time_buckets=TimeBuckets(**meta["time_buckets"]),
        max_seq_len=int(meta["max_seq_len"]),
        path=path,
        target_behaviors=(
            None if meta.get("target_behaviors") is None else tuple(meta["target_behaviors"])
        ),
        data_fingerprint=meta.get("data_fingerprint"),
        data_settings=meta.get("data_settings"),
        transition_prior=(
            None
            if meta.get("transition_prior") is None
            else TransitionPrior.from_plain(meta["transition_prior"])
        ),
        code=meta.get("code"),
        run_id=meta.get(RUN_ID_KEY),
    )


def set_transition_prior_weight(path: str | Path, weight: float) -> None:
    """Rewrite the checkpoint at ``path`` with its transition prior's weight set to
    ``weight``; the file is replaced whole, never left half written."""
    path = Path(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    prior = checkpoint[CHECKPOINT_KEY].get("transition_prior")
    if prior is None:
        raise ValueError(f"{path} has no transition prior to weight")
    _write_prior(path, checkpoint, {**prior, "weight": float(weight)})


def set_transition_prior(path: str | Path, prior: TransitionPrior) -> None:
    """Rewrite the checkpoint at ``path`` with ``prior`` as its transition prior, whatever it
    held (none, or another): a training's settings, written into its best checkpoint once
    ``training.transition_prior=auto`` has chosen the weight; replaced whole."""
    path = Path(path)
    _write_prior(path, torch.load(path, map_location="cpu", weights_only=True), prior.to_plain())


def _write_prior(path: Path, checkpoint: dict, prior: dict) -> None:
    checkpoint[CHECKPOINT_KEY]["transition_prior"] = prior
    save_atomically(checkpoint, path)


def save_atomically(obj, path: str | Path, save=None) -> None:
    """``save(obj, file)`` (``torch.save``, ``torch.jit.save``) into ``path``, whole or not at
    all (:func:`~recsys.retrieval.output.write_atomically`: beside it, then renamed). The bytes
    are made in memory first and written as a plain file, so that a full disk is named as such
    (an ``OSError``, ENOSPC, naming ``path``): torch's own writer fails there with "[enforce
    fail at inline_container.cc] unexpected pos ..." or "file write failed"."""

    def write(tmp: str) -> None:
        buffer = io.BytesIO()
        (save or torch.save)(obj, buffer)
        Path(tmp).write_bytes(buffer.getbuffer())

    write_atomically(path, write)


def write_scoring_checkpoint(checkpoint: str | Path, destination: str | Path) -> Path:
    """A training checkpoint without what scoring does not need (optimizer state, loops):
    the encoder's weights and the ``recsys`` entry. Loads with :func:`load_checkpoint`."""
    full = torch.load(checkpoint, map_location="cpu", weights_only=True)
    slim = {
        "state_dict": {k: v for k, v in full["state_dict"].items() if k.startswith("encoder.")},
        CHECKPOINT_KEY: full[CHECKPOINT_KEY],
    }
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    # beside it, then renamed: a job killed mid-write leaves the earlier file, never a cut one
    save_atomically(slim, destination)
    return destination


def model_digest(model: LoadedModel) -> str:
    """sha256 of the encoder's weights, the vocabulary and every setting that shapes its
    scores (schema, time buckets, window, target behaviours): identifies a model for resuming
    a scoring job, so parts scored with other settings are never taken as this model's."""
    digest = hashlib.sha256(model.vocab.content_hash().encode())
    settings = {
        "schema": model.schema.to_dict(),
        "time_buckets": asdict(model.time_buckets),
        "max_seq_len": model.max_seq_len,
        "target_behaviors": model.target_behaviors,
    }
    prior = model.transition_prior
    if prior is not None:  # (absent otherwise: earlier digests stay valid)
        settings["transition_prior_weight"] = prior.weight
        if prior.shape() != {"window": 1, "recent": 1, "decay": 1.0}:  # (likewise)
            settings["transition_prior_shape"] = prior.shape()
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    if model.transition_prior is not None:
        for name, tensor in model.transition_prior.counts.to_plain().items():
            digest.update(f"transition_prior.{name}".encode())
            digest.update(tensor.contiguous().numpy().tobytes())
    for name, tensor in sorted(model.encoder.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
