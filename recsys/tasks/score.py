"""Task: a trained model + a (fresh) event log -> recommendations for every user of the log.

``run(cfg)`` is ``python -m pipelines.score``: partitioned, atomic, resumable output
(:mod:`recsys.retrieval.output`), a summary with plots, and an MLflow scoring run linked to the
model's run. :func:`recommend_frame` is the same scoring in memory, for notebooks and the MLflow
pyfunc model.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from recsys import code_version
from recsys.checkpoint import LoadedModel, model_digest
from recsys.config import (
    check_required,
    event_schema,
    item_columns,
    note_trained_settings,
    prepare_settings,
    sweep_tags,
    to_container,
)
from recsys.data import options as data_options
from recsys.data.io import DataError, EventSource
from recsys.data.pipeline import events_fingerprint, load_events, read_item_table
from recsys.data.validate import BadRowPolicy, parse_instant
from recsys.model.interface import reads_time_buckets
from recsys.retrieval.output import PartitionedOutput, check_formats, check_output_path
from recsys.retrieval.recommend import Recommender, ScoringData, ScoringOptions
from recsys.retrieval.rules import Rules
from recsys.retrieval.summary import plot, summarize
from recsys.schema import ATTRIBUTES, ITEM, SESSION, TIMESTAMP, EventSchema
from recsys.tasks.prepare import _source_name, describe, event_source, item_source
from recsys.tasks.train import log_config_params
from recsys.tracking import Tracker, load_model, use_tracker
from recsys.training.evaluation import pick_device

log = logging.getLogger(__name__)

SUMMARY_FILE = "_summary.json"
PLOTS_FOLDER = "_plots"
NOT_SCORING_OPTIONS = ("rules", "output", "as_of", "accelerator")


def check_options(
    retrieval: Mapping[str, Any] | None,
    behaviors: Sequence[str],
    trained: Sequence[str] | None = None,
    *,
    timed: bool = True,
) -> tuple[ScoringOptions, Rules]:
    """``conf/retrieval`` -> (:class:`ScoringOptions`, :class:`Rules`): unknown keys, values
    out of range, rules naming behaviours outside ``behaviors`` or a target behaviour outside
    ``trained`` (the behaviours the model learns to predict), list files that do not exist,
    output formats, an output path holding something other than a scoring output,
    ``as_of`` (see :func:`check_as_of`; ``timed``: the log has times) and the accelerator
    are refused. Needs no model, so the main job checks before it trains."""
    retrieval = dict(to_container(retrieval) or {})
    known = set(ScoringOptions.__dataclass_fields__) | set(NOT_SCORING_OPTIONS)
    unknown = sorted(set(retrieval) - known)
    if unknown:
        raise ValueError(f"retrieval has unknown keys {unknown}; allowed: {sorted(known)}")
    options = ScoringOptions(**{k: v for k, v in retrieval.items() if k not in NOT_SCORING_OPTIONS})
    rules = Rules.from_options(retrieval.get("rules"), behaviors=behaviors)
    rules.check_list_files()
    target = rules.target_behavior
    if target is not None and trained is not None and target not in trained:
        raise ValueError(
            f"retrieval.rules.target_behavior={target!r}, but the model is trained to predict "
            f"{list(trained)}: score with a model trained for {target!r} "
            f"(training.behavior_weights={{{target}: 1}}) or drop the rule"
        )
    check_output(retrieval.get("output") or {})
    check_as_of(retrieval.get("as_of"), timed=timed)
    pick_device(retrieval.get("accelerator", "auto"), option="retrieval.accelerator")
    return options, rules


def check_as_of(as_of: str | datetime | None, *, timed: bool) -> datetime | None:
    """``retrieval.as_of`` as an instant (None: the moment of the log's last event). Refused
    for an order-only log (``timed`` False): its times are its row numbers, microseconds after
    1970, so every user's last position would be told a gap of decades to the moment of the
    recommendation (the top time bucket, which training never saw there, and with
    ``data.time_buckets.reference=target`` every token's), and the fallback's popularity
    window before ``as_of`` would hold no event."""
    instant = parse_instant(as_of, option="retrieval.as_of")
    if instant is not None and not timed:
        raise ValueError(
            f"retrieval.as_of={as_of}, but the log is order-only (data.columns.timestamp="
            "null): its events have no time to hold it against, and it is scored for the "
            "moment of its last event. Drop retrieval.as_of, or map the log's timestamp "
            "column (data.columns.timestamp=<your column>) if it has one"
        )
    return instant


OUTPUT_KEYS = ("path", "formats", "overwrite")


def check_output(output: Mapping[str, Any]) -> None:
    """``retrieval.output``: no unknown key (a misspelt ``overwite=true`` would be ignored), a
    path, the formats, and ``overwrite`` true or false (any text would otherwise count as
    true and replace another job's output)."""
    unknown = sorted(set(output) - set(OUTPUT_KEYS))
    if unknown:
        raise ValueError(
            f"retrieval.output has unknown keys {unknown}; allowed: {list(OUTPUT_KEYS)}"
        )
    if "path" in output and not output["path"]:
        raise ValueError(
            f"retrieval.output.path={output['path']!r}: give the folder the recommendations go to"
        )
    check_formats(output.get("formats", ["parquet"]))
    if output.get("path"):
        check_output_path(output["path"])
    if not isinstance(output.get("overwrite", False), bool):
        raise ValueError(
            f"retrieval.output.overwrite={output['overwrite']!r} must be true or false"
        )


def settings(retrieval: Mapping[str, Any] | None, model: LoadedModel):
    """:func:`check_options` for ``model``: its behaviours, and the ones it learned to predict."""
    return check_options(retrieval, model.vocab.behaviors, model.target_behaviors)


def check_columns(model: LoadedModel, schema: EventSchema) -> None:
    """Refuse a log that lacks columns or behaviours the model was trained with, and a timed
    log for a model trained order-only that reads time buckets: its time tables learned the
    one bucket of an order-only log (no gap), so real gaps would reach untrained rows. (The
    scored log's, and an evaluated one's: :func:`recsys.tasks.evaluate.run`.)"""
    problems = []
    if tuple(schema.behaviors) != tuple(model.schema.behaviors):
        aliases = ", ".join(f"{raw}: {to}" for raw, to in model.schema.behavior_aliases.items())
        trained = f" (trained with 'data.behavior_aliases={{{aliases}}}')" if aliases else ""
        problems.append(
            f"behaviours: the model has {list(model.schema.behaviors)}, data.behaviors is "
            f"{list(schema.behaviors)}: set data.behaviors=[{','.join(model.schema.behaviors)}]"
            f" and map the log's event types onto them with data.behavior_aliases{trained}"
        )
    used = [c for c, name in model.schema.columns.items() if name and c != SESSION]
    missing = [c for c in used if not schema.has(c)]
    if missing:
        wanted = " ".join(f"data.columns.{c}={model.schema.columns[c]}" for c in missing)
        problems.append(
            f"columns: the model was trained with {missing} but this job's data maps none of "
            f"them: set {wanted} (as trained; your log's columns if named otherwise)"
        )
    if (
        schema.has(TIMESTAMP)
        and not model.schema.has(TIMESTAMP)
        and reads_time_buckets(model.encoder)
    ):
        problems.append(
            f"timestamps: the model was trained on an order-only log (data.columns.timestamp="
            f"null), so its time-gap tables know no gap, but this job's data maps a timestamp "
            f"column ({schema.columns[TIMESTAMP]!r}) whose gaps they would be given: read it "
            "order-only too (data.columns.timestamp=null; each user's events are then taken "
            "in the log's order, so put it in time order first)"
        )
    if problems:
        raise DataError("the event log does not match the model's schema: " + "; ".join(problems))


# below this share of a log's item ids known to the model, scoring warns (another shop's
# model, or ids mapped from the wrong column)
MIN_KNOWN_ITEM_SHARE = 0.5


def check_vocabulary(model: LoadedModel, events: pl.DataFrame, source_name: str) -> None:
    """Refuse a log none of whose items (or attributes) the model knows: the wrong data or the
    wrong model."""
    vocab = model.vocab
    ids = events[ITEM].unique()
    as_model = ids.cast(vocab.items.schema[ITEM], strict=False)
    known = as_model.is_in(vocab.items[ITEM].implode())
    # ids that the cast to the model's id type writes otherwise ("042" -> 42, 42.5 -> 42)
    changed = ids.filter(as_model.is_not_null() & as_model.cast(ids.dtype).ne_missing(ids))
    if changed.len():
        example = changed[0]
        log.warning(
            "%d item id(s) of the log change when read as the model's %s ids (e.g. %r -> %r): "
            "they are scored as those items, so %r and %r would be one item; give the log its "
            "item ids as the model was trained with them if they are not",
            changed.len(),
            vocab.items.schema[ITEM],
            example,
            as_model.filter(ids == example)[0],
            example,
            str(as_model.filter(ids == example)[0]),
        )
    if int(known.sum()) == 0:
        raise DataError(
            f"{source_name}: none of its {ids.len()} item ids are in the model's vocabulary "
            f"of {vocab.items.height} items (log ids look like {ids.head(3).to_list()} "
            f"({ids.dtype}), the model's like {vocab.items[ITEM].head(3).to_list()} "
            f"({vocab.items.schema[ITEM]})): score the model with the log of the same shop, "
            "or check data.columns.item_id"
        )
    if ATTRIBUTES in events.columns and vocab.attributes.height:
        attributes = events[ATTRIBUTES].explode().drop_nulls().unique()
        if attributes.len() and not attributes.is_in(vocab.attributes["attribute"].implode()).any():
            raise DataError(
                f"{source_name}: none of its {attributes.len()} categories / attributes are in "
                f"the model's vocabulary (log: {attributes.head(3).to_list()}, model: "
                f"{vocab.attributes['attribute'].head(3).to_list()}): check data.columns"
            )
    share = int(known.sum()) / ids.len()
    level = logging.WARNING if share < MIN_KNOWN_ITEM_SHARE else logging.INFO
    log.log(
        level,
        "%d of %d item ids of the log are in the model's vocabulary%s",
        known.sum(),
        ids.len(),
        ""
        if level == logging.INFO
        else f" ({share:.1%}): most histories will be unknown items, and their users get the "
        "fallback; is this the model of this shop's log (model=, data.columns.item_id)?",
    )


# The MLflow pyfunc model's predict(params=...): flat scalars (MLflow's param schema has no
# nested mappings), with 0 / "" for "not set".
PYFUNC_PARAMS = {
    "top_k": 10,
    "rerank_top_n": 0,
    "explanations": 3,
    "exclude": "seen",
    "max_per_category": 0,
    "target_behavior": "",
    "as_of": "",
    "bad_rows": "",  # "unknown_behavior=drop,duplicate=drop": data.bad_rows' policies by kind
}


def recommend_kwargs_from_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """:data:`PYFUNC_PARAMS` (MLflow's flat params) -> the keyword arguments of
    :func:`recommend_frame`: ``retrieval``, ``as_of`` and ``bad_rows``."""
    values = {**PYFUNC_PARAMS, **dict(params or {})}
    unknown = sorted(set(values) - set(PYFUNC_PARAMS))
    if unknown:
        raise ValueError(f"unknown params {unknown}; allowed: {sorted(PYFUNC_PARAMS)}")
    exclude = values["exclude"]
    rules = {
        "exclude": exclude if exclude in ("seen", "none") else exclude.split(","),
        "max_per_category": values["max_per_category"] or None,
        "target_behavior": values["target_behavior"] or None,
    }
    retrieval = {k: values[k] for k in ("top_k", "rerank_top_n", "explanations")}
    bad_rows = {}
    for pair in filter(None, (p.strip() for p in str(values["bad_rows"]).split(","))):
        kind, _, policy = pair.partition("=")
        if not policy.strip():
            raise ValueError(
                f"params bad_rows={values['bad_rows']!r}: write kind=policy pairs separated "
                "by commas, e.g. 'unknown_behavior=drop,duplicate=drop'"
            )
        bad_rows[kind.strip()] = policy.strip()
    return {
        "retrieval": {**retrieval, "rules": rules},
        "as_of": values["as_of"] or None,
        "bad_rows": bad_rows or None,
    }


def _chunks(data: ScoringData, size: int) -> list[np.ndarray]:
    users = np.arange(data.store.num_users)
    return [users[i : i + size] for i in range(0, len(users), size)]


@dataclass
class _Job:
    """The checked inputs of a scoring job: settings, the log and the scoring data."""

    options: ScoringOptions
    rules: Rules
    events: pl.DataFrame
    data: ScoringData
    as_of: datetime | None
    item_table: pl.DataFrame | None = None

    @classmethod
    def load(
        cls,
        model,
        source,
        schema,
        retrieval,
        *,
        as_of,
        source_name,
        bad_rows=None,
        clock=None,
        items=None,
        item_columns=None,
        items_name=None,
    ) -> _Job:
        """Every check runs before anything is written: columns, settings, bad rows (with
        ``bad_rows``; ``clock`` is the "now" future timestamps are judged by), vocabulary.
        ``items`` (an item table, mapped by ``item_columns``) gives the log's items that are
        new to the model their attributes, so their category (``max_per_category``, the
        fallback's shared categories, ``item_category``)."""
        check_columns(model, schema)
        options, rules = settings(retrieval, model)
        as_of = check_as_of(as_of, timed=schema.has(TIMESTAMP))
        if clock is None and as_of is not None:  # an event up to the scoring time is no
            clock = max(datetime.now(UTC), as_of)  # future_timestamp (data.as_of unset)
        events = load_events(source, schema, bad_rows=bad_rows, as_of=clock, name=source_name)
        check_vocabulary(model, events, source_name)
        item_table = None
        if items is not None:  # a dated table: each item's value at the last scored event
            scored = events.lazy()
            if as_of is not None:
                scored = scored.filter(pl.col(TIMESTAMP) <= as_of)
            item_table = read_item_table(
                items, item_columns, schema, events.schema[ITEM], dated_by=scored, name=items_name
            ).collect()
        data = ScoringData.build(
            model,
            events,
            rules=rules,
            options=options,
            as_of=as_of,
            timed=schema.has(TIMESTAMP),
            item_table=item_table,
        )
        return cls(
            options=options,
            rules=rules,
            events=events,
            data=data,
            as_of=as_of,
            item_table=item_table,
        )


def recommend_frame(
    model: LoadedModel,
    events: EventSource,
    *,
    schema: EventSchema | None = None,
    retrieval: Mapping[str, Any] | None = None,
    as_of: str | datetime | None = None,
    device: str | torch.device | None = None,
    bad_rows: Mapping[str, str] | None = None,
    items: EventSource | None = None,
    item_columns: Mapping[str, str | None] | None = None,
) -> pl.DataFrame:
    """Recommendations for every user of ``events`` (a frame or file with the columns the
    model was trained with, unless ``schema`` says otherwise), in memory. ``retrieval``:
    ``conf/retrieval`` keys, e.g. ``{"top_k": 5, "rules": {"max_per_category": 2}}``, its
    ``as_of`` and ``accelerator`` included (``as_of`` / ``device`` here win over them; without
    either the device is the CPU; ``device``: auto, cpu, gpu or a ``torch.device``).
    ``bad_rows``: ``data.bad_rows``' policies, e.g. ``{"unknown_behavior": "drop"}`` where a
    message names ``data.bad_rows.unknown_behavior``. Without ``as_of`` the lists are for the
    moment of the frame's last event, so a subset of the users may get other lists than the
    whole log: give ``as_of`` to compare. An event after both now and ``as_of`` is a
    ``future_timestamp`` bad row. ``items``: an item table (``item_columns`` maps its
    columns, as ``data.item_columns``) giving the log's items new to the model their
    category."""
    retrieval = dict(to_container(retrieval) or {})
    if as_of is None:
        as_of = retrieval.get("as_of")
    if device is None:
        device = pick_device(retrieval.get("accelerator", "cpu"), option="retrieval.accelerator")
    elif not isinstance(device, torch.device):
        device = pick_device(device, option="device")
    job = _Job.load(
        model,
        events,
        schema or model.schema,
        retrieval,
        as_of=as_of,
        source_name="events",
        bad_rows=BadRowPolicy.from_dict(to_container(bad_rows)),
        items=items,
        item_columns=data_options.item_columns({"item_columns": to_container(item_columns)}),
    )
    recommender = Recommender(model, job.data, rules=job.rules, options=job.options, device=device)
    data, options = job.data, job.options
    frames = [recommender.recommend(rows) for rows in _chunks(data, options.user_chunk_size)]
    return pl.concat(frames) if frames else recommender.empty()


def run(
    cfg: DictConfig,
    checkpoint: str | Path | None = None,
    *,
    tracker: Tracker | None = None,
    after_part: Callable[[int], None] | None = None,
    overwrite: bool | None = None,
) -> Path:
    """Score ``data.source`` with ``model`` (or ``checkpoint``); returns the output folder.
    ``after_part(i)`` is called after part ``i`` is written (tests inject faults there).
    ``overwrite``: instead of ``retrieval.output.overwrite`` (the main job's resume)."""
    check_required(cfg, model_given=checkpoint is not None)
    started = time.perf_counter()
    retrieval = to_container(cfg.retrieval)
    ref = cfg.model_ref if checkpoint is None else checkpoint
    model, model_tags = load_model(ref, cfg.logger)
    note_trained_settings(cfg.data, model, ref)
    prepare = prepare_settings(cfg.data)
    job = _Job.load(
        model,
        event_source(cfg),
        event_schema(cfg.data),
        retrieval,
        as_of=retrieval.get("as_of"),
        source_name=_source_name(cfg.data.source),  # a loader's call, or the path
        bad_rows=prepare.bad_rows,
        clock=prepare.as_of,
        items=item_source(cfg),
        item_columns=item_columns(cfg.data),
        items_name=describe(cfg.data.get("items")),
    )
    data, options, rules, as_of = job.data, job.options, job.rules, job.as_of
    fingerprint = events_fingerprint(job.events)
    # the item table's content: another table gives new items other categories (a key only
    # with a table, so the jobs without one keep the manifests they always had)
    items = {} if job.item_table is None else {"items": events_fingerprint(job.item_table)}
    # a model of an earlier recsys that holds an item id now read as missing (""), which that
    # recsys recommended and this one never does: parts it staged are of another job (a key
    # only for such a model, so the others keep their manifests)
    missing = {"missing_item_ids": "never recommended"} if model.vocab.missing_id_indices() else {}
    output_cfg = retrieval.get("output") or {}
    job = {
        "model": model_digest(model),
        "data": fingerprint,
        **items,
        **missing,
        "as_of": str(as_of),
        "options": {k: v for k, v in retrieval.items() if k not in ("output", "accelerator")},
        "formats": output_cfg.get("formats", ["parquet"]),
        "list_files": _list_file_digests(rules),
    }
    output = PartitionedOutput(
        output_cfg["path"],
        formats=output_cfg.get("formats", ["parquet"]),
        job=job,
        overwrite=bool(output_cfg.get("overwrite", False)) if overwrite is None else overwrite,
    )
    found = output.complete  # this job's output already there: nothing is written
    try:  # the output path is held until the output is committed or the job fails
        device = pick_device(retrieval.get("accelerator", "auto"), option="retrieval.accelerator")
        timings = {}
        if not output.complete:
            try:  # rules and options checked against the catalogue: nothing left behind if refused
                recommender = Recommender(model, data, rules=rules, options=options, device=device)
            except BaseException:
                output.abandon()
                raise
            timings["score/setup_seconds"] = time.perf_counter() - started
            output.keep_parts_like(recommender.empty())  # one schema for every part
            chunks = _chunks(data, options.user_chunk_size)
            scoring_started = time.perf_counter()
            for part, rows in enumerate(tqdm(chunks, desc="score", unit="part", mininterval=2.0)):
                if output.done(part):
                    continue
                output.write(part, recommender.recommend(rows))
                if after_part is not None:
                    after_part(part)
            timings["score/scoring_seconds"] = time.perf_counter() - scoring_started
            summary = summarize(
                output.scan(),
                data.catalogue,
                train_counts=model.vocab.item_train_counts(),
                recommendable=int((~recommender.blocked).sum()),
            )
            counts = summary.pop("_counts")
            scored = {
                "source": _source_name(cfg.data.source),  # as stats.json names it
                "fingerprint": fingerprint,
                "as_of": str(as_of or "end of log"),
            }
            summary.update(provenance(model, model_tags, digest=job["model"], data=scored))
            text = json.dumps(summary, indent=2)
            output.write_extra(SUMMARY_FILE, lambda path: Path(path).write_text(text))
            plot({**summary, "_counts": counts}, output.staging / PLOTS_FOLDER)
            output.commit()
    except BaseException:  # (a SIGTERM, a Ctrl-C too) the job log's last word is the failure
        if not output.complete and output.staging.is_dir() and output.parts_done():
            log.warning(
                "%d part(s) of this job's output are in %s: the same job run again (same "
                "model, data and settings) continues from there",
                output.parts_done(),
                output.staging,
            )
        raise
    finally:
        output.release()
    summary = json.loads((output.path / SUMMARY_FILE).read_text())
    seconds = time.perf_counter() - started
    own_run = tracker is None  # (the main job's run has logged its config)
    with use_tracker(tracker, cfg.logger, run_name=cfg.task_name, tags=sweep_tags()) as tracker:
        if own_run:
            log_config_params(tracker, cfg)
        tracker.set_tags(
            {
                **model_tags,
                "model.digest": job["model"],
                "task": cfg.task_name,  # the pipeline: score, or main for the main job
                "score.output": str(output.path),
                "score.as_of": str(as_of or "end of log"),
                "score.data_fingerprint": fingerprint,  # the scored log (data.* = training)
                "model.data_fingerprint": str(model.data_fingerprint),
            }
        )
        tracker.log_metrics(
            {
                "score/users": data.store.num_users,
                "score/rows": summary["rows"],
                "score/seconds": seconds,
                "score/users_per_second": data.store.num_users / max(seconds, 1e-9),
                "score/catalogue_coverage": summary["catalogue_coverage"],
                "score/fallback_share": summary["fallback_share"],
                "score/popularity_gini": summary["popularity"]["gini"],
                **timings,
            }
        )
        tracker.log_artifact(output.path / SUMMARY_FILE, "score")
        tracker.log_artifact(output.path / PLOTS_FOLDER, "score/plots")
    log.info(
        "%s %d recommendations for %d users %s %s in %.1f s (coverage %.1f%%, fallback %.1f%%)",
        "found" if found else "wrote",
        summary["rows"],
        data.store.num_users,
        "in" if found else "to",
        output.path,
        seconds,
        100 * summary["catalogue_coverage"],
        100 * summary["fallback_share"],
    )
    return output.path


def provenance(
    model: LoadedModel, model_tags: Mapping[str, str], *, digest: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    """What produced a scoring output, for its ``_summary.json``: the model (the reference as
    given and what it resolved to, as the run's ``model.*`` tags, with its ``digest``, its
    training data's fingerprint and the code that trained it), the scored log (``data``) and
    the code that scored it (:func:`recsys.code_version`)."""
    return {
        "model": {
            **{key.removeprefix("model."): value for key, value in model_tags.items()},
            "digest": digest,
            "data_fingerprint": model.data_fingerprint,
            "code": model.code,
        },
        "data": dict(data),
        "code": code_version(),
    }


def _list_file_digests(rules: Rules) -> dict[str, str]:
    """Allow/deny list files by content, so a changed list is a different job."""
    import hashlib

    digests = {}
    for name in ("allow_list", "deny_list"):
        value = getattr(rules, name)
        if isinstance(value, str) and Path(value).expanduser().is_file():
            digests[name] = hashlib.sha256(Path(value).expanduser().read_bytes()).hexdigest()
    return digests
