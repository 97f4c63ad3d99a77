"""Task: the main job — prepare -> train -> evaluate -> score, tracked as one MLflow run."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from recsys.config import check_required, event_schema, prepare_settings, sweep_tags
from recsys.retrieval.output import holds_output
from recsys.schema import TIMESTAMP
from recsys.tasks import evaluate, score, train
from recsys.tracking import use_tracker

log = logging.getLogger(__name__)


@dataclass
class MainResult:
    checkpoint: Path
    recommendations: Path
    metrics: dict[str, float]
    run: str  # where the MLflow run is, in words


def run(cfg: DictConfig) -> MainResult:
    check_required(cfg)  # before the run folder is held (created)
    with train.hold_run_folder(cfg):  # the whole job: its scoring writes there too
        return _run(cfg)


def check_config(cfg: DictConfig) -> None:
    """The training's config checks (:func:`recsys.tasks.train.check_config`) and the
    scoring settings', which need no model: a mistake there should not cost a training."""
    train.check_config(cfg)
    schema = event_schema(cfg.data)
    behaviors = schema.behaviors
    score.check_options(
        cfg.retrieval,
        behaviors,
        train.trained_targets(cfg, behaviors),
        timed=schema.has(TIMESTAMP),
    )
    _check_output_is_free(cfg)
    if cfg.training.get("transition_prior") is not None and cfg.retrieval.get("rerank_top_n"):
        raise ValueError(
            f"retrieval.rerank_top_n={cfg.retrieval.rerank_top_n}: the model will add a "
            "transition prior to its scores (training.transition_prior), which the re-rank "
            "stage would replace for its top N: set retrieval.rerank_top_n=0"
        )


def follow_trained_rerank(cfg: DictConfig) -> None:
    """The main job's scoring re-ranks as deep as its evaluation did: with a target-attention
    head trained (``training.rerank_top_n`` > 0, as ``model=atrank_faithful`` sets), a
    ``retrieval.rerank_top_n`` of 0 would write retrieval-only lists while the headline test
    metrics measure the re-ranked ones."""
    trained = cfg.training.get("rerank_top_n")
    if isinstance(trained, int) and trained > 0 and not cfg.retrieval.get("rerank_top_n"):
        cfg.retrieval.rerank_top_n = trained
        log.info(
            "retrieval.rerank_top_n=%d, as training.rerank_top_n: the recommendations are "
            "re-ranked as the test metrics were",
            trained,
        )


def follow_evaluated_target(cfg: DictConfig) -> None:
    """The main job's recommendations are for what it evaluates: with
    ``data.split.target_behaviors`` naming one behaviour (``[purchase]``) and no
    ``retrieval.rules.target_behavior``, scoring ranks for that behaviour, so its cold-start
    fallback counts that behaviour's events, as the test metrics and the baselines do (before,
    the fallback for a next-purchase model recommended the most viewed items)."""
    targets = prepare_settings(cfg.data).split.target_behaviors
    rules = cfg.retrieval.get("rules")
    if targets and len(targets) == 1 and rules is not None and not rules.get("target_behavior"):
        rules.target_behavior = targets[0]
        log.info(
            "retrieval.rules.target_behavior=%s, as data.split.target_behaviors: the "
            "cold-start fallback counts %s events, as the test metrics' targets are",
            targets[0],
            targets[0],
        )


def _run(cfg: DictConfig) -> MainResult:
    train.check_run_folder(cfg)  # before the MLflow run opens: a refusal leaves no run
    follow_trained_rerank(cfg)
    follow_evaluated_target(cfg)
    check_config(cfg)
    # a resumed training continues its MLflow run, and so does the rest of the job
    run_settings = {"run_name": cfg.task_name, "continue_run_id": train.resumed_run_id(cfg)}
    with use_tracker(None, cfg.logger, **run_settings) as tracker:
        train.log_config_params(tracker, cfg)  # a run failing before training: which job it was
        tracker.set_tags({"task": cfg.task_name, **sweep_tags()})
        # packaged and registered last: a job that fails in evaluation or scoring registers no
        # version and moves no alias (downstream scoring with <name>@<alias> keeps the previous
        # model), nor changes the model/ of a resumed run that a version was registered from
        trained = train.run(cfg, tracker=tracker, register=False, checked=True)
        metrics = evaluate.run(
            cfg, trained.checkpoint, prepared_dir=trained.prepared_dir, tracker=tracker
        )
        recommendations = score.run(
            cfg, trained.checkpoint, tracker=tracker, overwrite=_replaces_own_output(cfg) or None
        )
        train.publish_model(cfg, tracker, trained.scoring_checkpoint)
    return MainResult(
        checkpoint=trained.checkpoint,
        recommendations=recommendations,
        metrics={**trained.best_val, **metrics},
        run=tracker.describe(),
    )


def _check_output_is_free(cfg: DictConfig) -> None:
    """An earlier scoring job's output at ``retrieval.output.path`` is of another model than
    the one this job is about to train, so scoring would refuse it without
    ``retrieval.output.overwrite=true``: refused now, not after the training (a nightly
    retraining writing to a fixed path found this out after its training, every night)."""
    output = cfg.retrieval.get("output") or {}
    if output.get("overwrite") is True or _replaces_own_output(cfg):
        return
    path = output.get("path")
    if path and holds_output(str(path)):
        raise FileExistsError(
            f"retrieval.output.path={path} holds an earlier scoring job's output, and "
            "this job scores a model it is about to train: pass retrieval.output.overwrite=true "
            "to replace that output once the new recommendations are written, or choose "
            "another retrieval.output.path"
        )


def _replaces_own_output(cfg: DictConfig) -> bool:
    """A resumed job replaces the recommendations it wrote into its own run folder before (its
    model has trained on since, so they are another scoring job's): without this, continuing a
    finished main job (``trainer.max_epochs`` raised) failed at scoring, after the training."""
    if cfg.get("resume") is None:
        return False
    output = Path(str(cfg.retrieval.output.path)).resolve()
    return output.is_relative_to(Path(str(cfg.paths.run_dir)).resolve())
