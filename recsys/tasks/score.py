"""Task: a trained model + a (fresh) event log -> top-K recommendations file."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig

from recsys.config import event_schema, prepare_settings
from recsys.data.dataset import SequenceStore
from recsys.data.io import DataError
from recsys.data.pipeline import load_events, scoring_sequences
from recsys.retrieval.recommend import recommend, write_atomically
from recsys.schema import ITEM
from recsys.tasks.evaluate import load_model
from recsys.tasks.prepare import event_source
from recsys.tracking import Tracker, use_tracker
from recsys.training.evaluation import pick_device

log = logging.getLogger(__name__)


def parse_as_of(value) -> datetime | None:
    """``retrieval.as_of``: ISO 8601 (naive = UTC) or null for "after the last event"."""
    if value is None:
        return None
    from datetime import UTC

    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as err:
        raise ValueError(f"retrieval.as_of={value!r} is not an ISO 8601 timestamp") from err
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def run(
    cfg: DictConfig, checkpoint: str | Path | None = None, *, tracker: Tracker | None = None
) -> Path:
    retrieval = cfg.retrieval
    model = load_model(checkpoint or cfg.model_ref, cfg.logger)
    schema = event_schema(cfg.data)
    if tuple(schema.behaviors) != tuple(model.schema.behaviors):
        raise DataError(
            f"the model was trained on behaviours {list(model.schema.behaviors)} but "
            f"data.behaviors is {list(schema.behaviors)}: map the log's event types onto "
            "the model's (data.behavior_aliases)"
        )
    started = time.perf_counter()
    settings = prepare_settings(cfg.data)
    events = load_events(
        event_source(cfg), schema, bad_rows=settings.bad_rows, as_of=settings.as_of
    )
    as_of = parse_as_of(retrieval.as_of)
    store = SequenceStore.from_frame(scoring_sequences(events, vocab=model.vocab, as_of=as_of))
    frame = recommend(
        model,
        store,
        top_k=retrieval.top_k,
        rerank_top_n=retrieval.rerank_top_n,
        exclude_seen=retrieval.exclude_seen,
        batch_size=retrieval.batch_size,
        query_time=None if as_of is None else int(as_of.timestamp()),
        device=pick_device(retrieval.accelerator),
    )
    path = write_atomically(frame, retrieval.output, file_format=retrieval.format)
    with use_tracker(tracker, cfg.logger, run_name=cfg.task_name) as tracker:
        tracker.log_metrics(
            {
                "score/users": store.num_users,
                "score/rows": frame.height,
                "score/seconds": time.perf_counter() - started,
                "score/catalogue_coverage": frame[ITEM].n_unique() / model.vocab.items.height,
            }
        )
        tracker.set_tags({"score.output": str(path), "score.as_of": str(as_of or "end of log")})
    log.info("wrote %d recommendations for %d users to %s", frame.height, store.num_users, path)
    return path
