"""Task: a trained checkpoint (and two baselines) on the held-out targets.

The baselines are popularity and the first-order transition model (PROTOCOLS.md's trivial
baselines, :mod:`recsys.model.transition`), both fitted on the training events of the same
prepared data (of the evaluated behaviours only, with ``data.split.target_behaviors``:
:func:`baseline_counts`). All three go through the same metric code as validation
(:meth:`SeqRecModule.evaluation_metrics`). Metrics are logged as ``test/<metric>``,
``test/popularity_<metric>`` and ``test/transition_<metric>`` (likewise ``val/``), with the
protocol as run tags.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from recsys.checkpoint import LoadedModel, model_digest
from recsys.config import (
    check_required,
    event_schema,
    note_trained_settings,
    prepare_settings,
    sweep_tags,
)
from recsys.data.datamodule import SeqRecDataModule, check_loader
from recsys.data.dataset import width_multiple
from recsys.data.io import DataError, read_user_list
from recsys.data.vocab import Vocab
from recsys.model.popularity import Popularity
from recsys.model.transition import (
    Transition,
    TransitionCounts,
    TransitionPrior,
    check_prior_settings,
)
from recsys.retrieval.output import write_atomically
from recsys.schema import ITEM, NUM_RESERVED, UNK_IDX
from recsys.tasks import prepare
from recsys.tasks.score import MIN_KNOWN_ITEM_SHARE, check_columns
from recsys.tasks.train import (
    check_evaluated_targets,
    data_arguments,
    log_config_params,
    naming_keys,
    store_transitions,
)
from recsys.tracking import Tracker, code_tags, load_model, use_tracker
from recsys.training.evaluation import (
    TargetRecords,
    evaluate,
    item_index_map,
    pick_device,
    protocol_tags,
    warn_of_few_targets,
)
from recsys.training.module import SeqRecModule

log = logging.getLogger(__name__)


def headline_k(metric_ks) -> int:
    """The cutoff of the one-line summaries (the log and ``pipelines.run``'s printout): 10
    when ``training.metric_ks`` has it, else its largest."""
    ks = [int(k) for k in metric_ks]
    return 10 if 10 in ks else max(ks)


def _evaluation_module(
    cfg: DictConfig, encoder: torch.nn.Module, vocab: Vocab, stats: dict, **overrides
) -> SeqRecModule:
    # evaluation only: no optimiser, and no auxiliary training loss (which the baselines,
    # having no attributes, could not take)
    overrides = {"attribute_loss_weight": 0.0, "distillation": None, **overrides}
    return instantiate(cfg.training, _partial_=True)(
        encoder=encoder,
        optimizer=None,
        scheduler=None,
        **data_arguments(vocab, stats),
        **overrides,
    )


def baseline_counts(
    datamodule: SeqRecDataModule, transitions: TransitionCounts
) -> tuple[list[int], TransitionCounts]:
    """The baselines' counts: each item's training events (popularity) and the first-order
    item pairs (``transitions``, of every event). With ``data.split.target_behaviors`` (e.g.
    [purchase]) an item counts its training events of those behaviours only, and a pair only
    when its second event is one: the baselines then predict what is evaluated (the next
    purchase by the items most purchased, not most viewed), as the model is trained to."""
    targets = (datamodule.stats.get("split") or {}).get("target_behaviors")
    vocab = datamodule.vocab
    if not targets:
        return vocab.item_train_counts(), transitions
    store = datamodule.store
    codes = [NUM_RESERVED + vocab.behaviors.index(b) for b in targets if b in vocab.behaviors]
    ends = np.isin(store.behavior, codes)
    counted = ends & store.training_mask()
    counts = np.bincount(store.item[counted], minlength=vocab.num_items)
    counts[:NUM_RESERVED] = 0  # PAD and UNK: never recommended
    pairs = TransitionCounts.from_sequences(
        store.item, store.offsets, store.train_end, vocab.num_items, ends=ends
    )
    return counts.tolist(), pairs


# the weights training.transition_prior=auto tries on validation (0: the model alone)
PRIOR_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def prior_arguments(prior: TransitionPrior | None) -> dict:
    """The evaluation module's arguments for ``prior`` (None: none)."""
    if prior is None:
        return {"transition_prior": None}
    return {
        "transition_prior": prior.weight,
        "transition_window": prior.counts.window,
        "transition_recent": prior.recent,
        "transition_decay": prior.decay,
        "transition_counts": prior.counts,
    }


def selection_metric(cfg: DictConfig) -> str:
    """The validation metric that chose the checkpoint (``callbacks.model_checkpoint.monitor``,
    e.g. ``ndcg_at_10``): what chooses the transition prior's weight too. Without callbacks
    (``pipelines.evaluate``'s config): NDCG at the headline cutoff."""
    monitor = str((cfg.get("callbacks") or {}).get("model_checkpoint", {}).get("monitor") or "")
    if monitor.startswith("val/"):
        return monitor.removeprefix("val/")
    return f"ndcg_at_{headline_k(cfg.training.metric_ks)}"


def select_transition_prior(
    cfg: DictConfig,
    encoder: torch.nn.Module,
    vocab: Vocab,
    datamodule: SeqRecDataModule,
    prior: TransitionPrior,
    device: torch.device,
) -> tuple[TransitionPrior, dict[str, float]]:
    """``training.transition_prior=auto``: ``prior`` at the weight of :data:`PRIOR_WEIGHTS`
    with the best validation value of :func:`selection_metric` (ties: the smaller weight),
    and that value at every weight (``transition_prior/val_<metric>_at_<weight>``).
    Validation only: the test targets are not read."""
    metric = selection_metric(cfg)
    loader = datamodule.target_loader("val")
    values = {}
    for weight in PRIOR_WEIGHTS:
        weighted = TransitionPrior(prior.counts, weight, prior.recent, prior.decay)
        module = _evaluation_module(
            cfg, encoder, vocab, datamodule.stats, **prior_arguments(weighted)
        )
        found = evaluate(module, loader, device=device, split="val", description=f"val {weight}")
        if metric not in found:
            raise ValueError(
                f"the transition prior is chosen on val/{metric} (callbacks.model_checkpoint."
                f"monitor), which evaluation does not report: monitor one of {sorted(found)}"
            )
        values[weight] = found[metric]
    best = max(PRIOR_WEIGHTS, key=lambda w: (values[w], -w))
    log.info(
        "transition prior: weight %s (val %s by weight: %s)",
        best,
        metric,
        {w: round(v, 4) for w, v in values.items()},
    )
    metrics = {f"transition_prior/val_{metric}_at_{w}": v for w, v in values.items()}
    chosen = TransitionPrior(prior.counts, best, prior.recent, prior.decay)
    return chosen, {**metrics, "transition_prior/weight": best}


def _model_prior(
    cfg: DictConfig,
    model,
    datamodule: SeqRecDataModule,
    transitions: TransitionCounts,
    device: torch.device,
) -> tuple[TransitionPrior | None, dict[str, float]]:
    """The transition prior the model is evaluated with: the checkpoint's, unless
    ``training.transition_prior`` says otherwise: a number is that weight; ``auto`` the
    weight chosen on validation, unless the checkpoint's prior has this command's shape
    (its weight was chosen so already). Either way with this command's
    ``training.transition_window``, ``_recent`` and ``_decay``, counted on this prepared
    data (``transitions``, the baseline's first-order counts, or the checkpoint's when the
    window matches, are not counted again). Returns the prior and the selection's metrics
    ({} without one)."""
    setting, prior = cfg.training.get("transition_prior"), model.transition_prior
    training = cfg.training
    shape = {
        "window": training.transition_window,
        "recent": training.transition_recent,
        "decay": training.transition_decay,
    }
    if setting is None or (setting == "auto" and prior is not None and prior.shape() == shape):
        return prior, {}
    window = training.transition_window
    if prior is not None and prior.counts.window == window:  # the same data: vocab checked
        counts = prior.counts
    else:
        counts = transitions if window == 1 else store_transitions(datamodule, window)
    prior = TransitionPrior(
        counts,
        0.0 if setting == "auto" else setting,
        training.transition_recent,
        training.transition_decay,
    )
    if setting != "auto":
        return prior, {}
    return select_transition_prior(cfg, model.encoder, model.vocab, datamodule, prior, device)


def segment_users(
    cfg: DictConfig, listed: pl.Series | None, datamodule: SeqRecDataModule
) -> np.ndarray | None:
    """The users ``listed`` in ``cfg.users`` (None: no segment) as a (U,) bool mask over the
    prepared user table. Their metrics are reported beside the whole split's, as
    ``<split>/segment_<metric>``, with standard errors: a small segment's mean is noisy."""
    if listed is None:
        return None
    path = cfg.users
    users = datamodule.user_rows(listed, source=f"users={path}")
    stats = datamodule.stats
    unknown = sum(int(stats.get(f"{s}_targets_unknown_item", 0)) for s in ("val", "test"))
    if unknown and cfg.training.unknown_targets == "miss":
        log.warning(
            "the segment's metrics leave its unknown-item targets out (%d in the whole data, "
            "counted as misses in the whole split's metrics by training.unknown_targets=miss): "
            "preparation does not record whose they are",
            unknown,
        )
    log.info("segment: %d users listed in %s", int(users.sum()), path)
    return users


# the per-target file's Parquet key-value metadata: the evaluation run's tags (protocol.*,
# data.fingerprint, model.*) and code.*, as JSON
PER_TARGET_METADATA = "recsys"


def per_target_path(cfg: DictConfig) -> Path | None:
    """``cfg.per_target`` (None: no per-target file), checked before any work: a ``.parquet``
    file that does not exist yet (its folder is created)."""
    path = cfg.get("per_target")
    if path is None:
        return None
    path = Path(str(path))
    if path.suffix != ".parquet":
        raise ValueError(
            f"per_target={path}: name a .parquet file, e.g. per_target=targets.parquet"
        )
    if path.exists():
        raise ValueError(
            f"per_target={path} exists: remove it or name another file (an evaluation never "
            "replaces a file)"
        )
    return path


def progress_label(split: str, segment: str, prefix: str) -> str:
    """The progress bar's words for one evaluation (``test model``, ``test segment
    popularity baseline``), not the metric-name prefixes (``test popularity_``)."""
    what = f"{prefix.rstrip('_')} baseline" if prefix else "model"
    return " ".join(part for part in (split, segment.rstrip("_"), what) if part)


def _other_id_type(model: LoadedModel, vocab: Vocab, ref) -> str:
    """The cause, when the model's item ids have another type than the ones this data was
    prepared with (the log's ids changed type since the training), or it holds an id that
    preparation now reads as missing (``""``, learnt by a model of an earlier recsys), which
    no data setting of this job undoes."""
    trained, now = model.vocab.items.schema[ITEM], vocab.items.schema[ITEM]
    fixes = (
        "No data setting undoes that: evaluate it on the folder it was trained on "
        "(data.prepared_dir=<that folder>), or retrain it on this data"
    )
    if trained != now:
        return (
            f"model={ref} holds {trained} item ids, the data this job prepared {now} ones: the "
            f"log's ids changed type since the training. {fixes}"
        )
    if model.vocab.missing_id_indices() and not vocab.missing_id_indices():
        return (
            f'model={ref} holds the item id "" (an empty text id), which recsys now reads as a '
            "missing one (data.bad_rows.null_id): an earlier recsys trained it on the events "
            f"this job's preparation sets aside. {fixes}"
        )
    return ""


def _other_vocabulary(
    model: LoadedModel, datamodule: SeqRecDataModule, ref, prepared_dir: Path
) -> str:
    """Why a model is not evaluated on data prepared with another vocabulary than its own
    (without ``other_data=true``)."""
    # named as the user gave it: a model fetched from MLflow sits in a temporary copy
    if cause := _other_id_type(model, datamodule.vocab, ref):
        return cause
    recorded = (model.data_settings or {}).get("source")
    trained_on = f": it was trained on data.source={recorded}" if recorded else ""
    return (
        f"{prepared_dir} was prepared with another vocabulary than model={ref} "
        f"(different data or data settings: this data's fingerprint "
        f"{datamodule.stats['fingerprint']}, the model's {model.data_fingerprint}): a model "
        "is evaluated on the data it was trained on (its own test window): give this job "
        f"the data settings of its training (the same data=... overrides{trained_on}, or "
        "data.prepared_dir=<the folder it was trained on>). To measure it on this data's "
        "windows instead (last night's model on tonight's log, beside tonight's model), add "
        "other_data=true: its items are matched by id and the targets it never learnt count "
        'as misses (README "Scheduled retraining")'
    )


def _unknown_targets(metrics: dict[str, float], splits: tuple[str, ...]) -> list[str]:
    """``other_data=true``: each split's targets the model never learnt, for a message."""
    return [f"{int(metrics[f'{split}/model_unknown_targets'])} {split}" for split in splits]


def refuse_other_data_settings(cfg: DictConfig) -> None:
    """``other_data=true``'s settings, before the data is prepared: the evaluation settings
    that would read this data's item indices as the model's are refused."""
    problems = []
    if cfg.training.get("transition_prior") is not None:
        problems.append(
            f"training.transition_prior={cfg.training.transition_prior} counts this data's "
            "item pairs, which the model's item indices do not index: leave it null (the "
            "model's own prior, from its checkpoint, still applies)"
        )
    if cfg.training.get("sampled_metrics"):
        problems.append(
            "training.sampled_metrics draws each target's negatives from the evaluated model's "
            "catalogue, so two models of different vocabularies would not meet the same "
            "negatives: set training.sampled_metrics=null"
        )
    if problems:
        raise ValueError("other_data=true: " + "; ".join(problems))


def _other_data_items(model: LoadedModel, datamodule: SeqRecDataModule, ref) -> torch.Tensor:
    """``other_data=true``: the data's item indices -> the model's (:func:`item_index_map`),
    logged; refused when the model knows none of the data's items (another shop's model, or
    ids of another type)."""
    data = datamodule.vocab
    item_map = item_index_map(model.vocab, data)
    known = int((item_map[NUM_RESERVED:] != UNK_IDX).sum())
    if not known:
        trained, now = model.vocab.items.schema[ITEM], data.items.schema[ITEM]
        kinds = (
            ""
            if trained == now or (trained.is_integer() and now.is_integer())
            else f"; {now} ids never match {trained} ones: give the log its item ids as {trained}"
        )
        raise ValueError(
            f"other_data=true: model={ref} knows none of this data's {data.items.height} items "
            f"(its ids {trained}, e.g. {model.vocab.items[ITEM].head(3).to_list()}; this "
            f"data's {now}, e.g. {data.items[ITEM].head(3).to_list()}): evaluate it on a log of "
            f"the catalogue it was trained on (and data.columns.item_id mapped to the same "
            f"ids){kinds}"
        )
    share = known / data.items.height
    level = logging.WARNING if share < MIN_KNOWN_ITEM_SHARE else logging.INFO
    log.log(
        level,
        "other_data=true: model=%s (trained on data %s) is evaluated on data %s: it knows %d of "
        "the data's %d items (matched by id)%s; a target whose item it never learnt counts as a "
        "miss",
        ref,
        model.data_fingerprint,
        datamodule.stats["fingerprint"],
        known,
        data.items.height,
        ""
        if level == logging.INFO
        else f" ({share:.1%}): most targets will count as misses; is this a model of this "
        "shop's log (model=, data.columns.item_id)?",
    )
    return item_map


def run(
    cfg: DictConfig,
    checkpoint: str | Path | None = None,
    *,
    prepared_dir: str | Path | None = None,
    tracker: Tracker | None = None,
    splits: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """The checkpoint (``cfg.model_ref`` when not given) and the baselines on ``splits``
    (default ``cfg.splits``, else test only)."""
    check_required(cfg, model_given=checkpoint is not None)
    if splits is None:  # default: test only; one split may be named without brackets
        splits = cfg.get("splits")
        splits = ("test",) if splits is None else (splits,) if isinstance(splits, str) else splits
    splits = tuple(splits)
    if not splits or not set(splits) <= {"val", "test"} or len(set(splits)) < len(splits):
        raise ValueError(
            f"splits={list(splits)}: choose among val and test, each once, e.g. '[val,test]'"
        )
    other_data = cfg.get("other_data") or False
    if not isinstance(other_data, bool):  # (any text would count as true: other_data=no)
        raise ValueError(f"other_data={other_data!r} must be true or false")
    loader = cfg.data.loader
    multiple = loader.get("width_multiple", "auto")
    # before the data is prepared
    check_loader(eval_batch_size=loader.eval_batch_size, width_multiple=multiple)
    device = pick_device(cfg.trainer.accelerator, option="trainer.accelerator")
    target_file = per_target_path(cfg)
    ref = checkpoint or cfg.model_ref
    model, model_tags = load_model(ref, cfg.logger)
    # before the data is prepared: the training group's evaluation settings (seen_items,
    # metric_ks, sampled metrics) against this model's catalogue, and the user list's file
    with naming_keys("training", cfg.training):
        _evaluation_module(cfg, model.encoder, model.vocab, {}, transition_prior=None)
    if cfg.training.get("transition_prior") is not None:  # read from this model's input
        check_prior_settings(
            window=cfg.training.transition_window,
            recent=cfg.training.transition_recent,
            decay=cfg.training.transition_decay,
            weight=cfg.training.transition_prior,
            max_seq_len=model.max_seq_len,
        )
    listed = read_user_list(cfg.users) if cfg.get("users") else None
    # an order-only model on a timed log (or the other way round) may find the same
    # vocabulary there, but not the times it was trained with
    check_columns(model, event_schema(cfg.data))
    note_trained_settings(cfg.data, model, ref)
    check_evaluated_targets(
        prepare_settings(cfg.data).split.target_behaviors,
        model.target_behaviors,
        model.vocab.behaviors,
        splits="/".join("validation" if s == "val" else s for s in splits),
        trained_by=f"model={ref} was trained (by its training.behavior_weights)",
    )
    if other_data:  # this job's data settings make the windows the model is measured on
        refuse_other_data_settings(cfg)
        differences = model.data_settings and prepare.data_differences(model.data_settings, cfg)[0]
        if differences:
            log.info(
                "model=%s was trained on data prepared with other settings (%s): other_data=true "
                "evaluates it on this job's",
                ref,
                prepare.listed(differences),
            )
    else:  # before the data is prepared: the data settings its checkpoint records
        prepare.refuse_other_settings(
            model.data_settings,
            cfg,
            trained=f"model={ref}",
            fix="a model is evaluated on the data it was trained on (its own test window): give "
            "this job the data settings of its training",
            otherwise=", e.g. the same +experiment=<name> or data=... overrides as its training, "
            "or other_data=true to evaluate it on this job's data",
        )
    prepared_now = prepared_dir is None and not cfg.data.prepared_dir  # into this run's folder
    prepared_dir = prepared_dir or prepare.prepared(cfg)
    datamodule = SeqRecDataModule(
        prepared_dir,
        max_seq_len=model.max_seq_len,  # as trained, whatever data.max_seq_len says now
        eval_batch_size=loader.eval_batch_size,
        time_buckets=model.time_buckets,  # (and data.time_buckets)
        width_multiple=width_multiple(multiple, device),
    )
    item_map = None
    if datamodule.vocab.content_hash() != model.vocab.content_hash():
        try:
            if other_data:
                item_map = _other_data_items(model, datamodule, ref)
            else:
                raise ValueError(_other_vocabulary(model, datamodule, ref, prepared_dir))
        except ValueError:
            if prepared_now:  # a refused job leaves no copy of the log behind
                shutil.rmtree(prepared_dir, ignore_errors=True)
            raise
    elif other_data:
        log.info(
            "other_data=true: model=%s has this data's vocabulary, so it is evaluated as without",
            ref,
        )
    datamodule.setup()
    stats = datamodule.stats
    transitions = store_transitions(datamodule)  # the first-order prior's
    prior, prior_metrics = _model_prior(cfg, model, datamodule, transitions, device)
    train_counts, transitions = baseline_counts(datamodule, transitions)
    candidates = {
        "": _evaluation_module(cfg, model.encoder, model.vocab, stats, **prior_arguments(prior)),
        # one stage: popularity has nothing to re-rank with; the baselines are this data's
        "popularity_": _evaluation_module(
            cfg,
            Popularity(torch.tensor(train_counts)),
            datamodule.vocab,
            stats,
            rerank_top_n=0,
            transition_prior=None,
        ),
        "transition_": _evaluation_module(
            cfg,
            Transition(transitions, torch.tensor(train_counts)),
            datamodule.vocab,
            stats,
            rerank_top_n=0,
            transition_prior=None,
        ),
    }
    users = segment_users(cfg, listed, datamodule)
    loaders = {split: {"": datamodule.target_loader(split)} for split in splits}
    metrics: dict[str, float] = dict(prior_metrics)
    records = {split: TargetRecords() for split in splits} if target_file else {}
    for split in splits if users is not None else ():
        loaders[split]["segment_"] = datamodule.target_loader(split, users)
        metrics[f"{split}/segment_targets"] = len(loaders[split]["segment_"].dataset)
        if not metrics[f"{split}/segment_targets"]:
            raise DataError(
                f"users={cfg.users}: none of its {int(users.sum())} users has a {split} target "
                f"(the whole split has {len(loaders[split][''].dataset)}): list users with "
                "one, or evaluate another split (splits=...)"
            )
    for split in splits:
        warn_of_few_targets(split, stats, cfg.training.unknown_targets)
        for segment, loader in loaders[split].items():
            for prefix, module in candidates.items():
                values = evaluate(
                    module,
                    loader,
                    device=device,
                    split=split,
                    description=progress_label(split, segment, prefix),
                    segment=bool(segment),
                    records=records.get(split) if not segment and not prefix else None,
                    item_map=None if prefix else item_map,
                )
                metrics.update({f"{split}/{segment}{prefix}{k}": v for k, v in values.items()})
    # how the numbers were measured and of which model: the run's tags, and the per-target file's
    tags = {
        **protocol_tags(cfg, datamodule),
        "protocol.transition_prior": (
            "none" if prior is None else f"{prior.settings()} (training.transition_prior)"
        ),
        "protocol.segment": (
            "none"
            if users is None
            else f"{int(users.sum())} users listed in {cfg.users} (segment_*)"
        ),
        **model_tags,
        "model.digest": model_digest(model),
        "model.data_fingerprint": str(model.data_fingerprint),
        "task": cfg.task_name,
    }
    if item_map is not None:  # (not protocol.*: the protocol is this data's, as for its own model)
        tags["model.other_data"] = (
            "trained on other data: items matched by id, targets of items it never learnt "
            f"counted as misses ({', '.join(_unknown_targets(metrics, splits))})"
        )
    if target_file:
        table = pl.concat(
            records[split].frame(split, datamodule.store.user_id, datamodule.vocab.items[ITEM])
            for split in splits
        )
        target_file.parent.mkdir(parents=True, exist_ok=True)
        described = {PER_TARGET_METADATA: json.dumps({**tags, **code_tags()}, sort_keys=True)}
        write_atomically(target_file, lambda tmp: table.write_parquet(tmp, metadata=described))
        log.info("each target's metrics (%d rows): %s", len(table), target_file)
    own_run = tracker is None  # (the main job's run has logged its config)
    with use_tracker(tracker, cfg.logger, run_name=cfg.task_name, tags=sweep_tags()) as tracker:
        if own_run:
            log_config_params(tracker, cfg)
        tracker.log_metrics(metrics)
        if target_file:
            tracker.log_artifact(target_file)
        tracker.set_tags(tags)
    k = headline_k(cfg.training.metric_ks)
    if prior is not None:
        log.info("the model's scores include the transition prior %s", prior.settings())
    if item_map is not None:
        log.info(
            "targets whose item model=%s never learnt, counted as misses: %s",
            ref,
            ", ".join(_unknown_targets(metrics, splits)),
        )
    for split in splits:
        log.info(
            "%s NDCG@%d %.4f (popularity %.4f, transition %.4f), "
            "HR@%d %.4f (popularity %.4f, transition %.4f)",
            split,
            k,
            metrics[f"{split}/ndcg_at_{k}"],
            metrics[f"{split}/popularity_ndcg_at_{k}"],
            metrics[f"{split}/transition_ndcg_at_{k}"],
            k,
            metrics[f"{split}/hr_at_{k}"],
            metrics[f"{split}/popularity_hr_at_{k}"],
            metrics[f"{split}/transition_hr_at_{k}"],
        )
        if users is not None:
            log.info(
                "%s, the %d targets of the users in %s: NDCG@%d %.4f ± %.4f (popularity "
                "%.4f, transition %.4f), HR@%d %.4f ± %.4f (± one standard error)",
                split,
                metrics[f"{split}/segment_targets"],
                cfg.users,
                k,
                metrics[f"{split}/segment_ndcg_at_{k}"],
                metrics[f"{split}/segment_ndcg_at_{k}_stderr"],
                metrics[f"{split}/segment_popularity_ndcg_at_{k}"],
                metrics[f"{split}/segment_transition_ndcg_at_{k}"],
                k,
                metrics[f"{split}/segment_hr_at_{k}"],
                metrics[f"{split}/segment_hr_at_{k}_stderr"],
            )
    return metrics
