"""Top-K recommendations for every user of a sequence table, written for analysts.

Output is long format, one row per (user, rank)::

    user_id  rank  item_id  score
    1000017     1    10452  7.31
    1000017     2    10988  6.90

with the log's raw ids. Files are written to a temporary name and renamed into place, so a
reader never sees a half-written file.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from recsys.checkpoint import LoadedModel
from recsys.data.dataset import SequenceStore, TargetRows, batch_loader
from recsys.retrieval.ranker import two_stage
from recsys.schema import ITEM, NUM_RESERVED, PAD_IDX, USER

log = logging.getLogger(__name__)

OUTPUT_COLUMNS = (USER, "rank", ITEM, "score")
FORMATS = ("parquet", "csv")


def seen_items(store: SequenceStore, rows: np.ndarray) -> torch.Tensor:
    """Every item in each row's whole stored history, as a (B, L_max) PAD-filled matrix."""
    lengths = store.lengths[rows]
    width = max(int(lengths.max()), 1)
    columns = np.arange(width)
    inside = columns[None, :] < lengths[:, None]
    index = np.where(inside, store.offsets[rows][:, None] + columns[None, :], 0)
    return torch.from_numpy(np.where(inside, store.item[index], PAD_IDX))


@torch.no_grad()
def recommend(
    model: LoadedModel,
    store: SequenceStore,
    *,
    top_k: int,
    rerank_top_n: int,
    exclude_seen: bool,
    query_time: int | None = None,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> pl.DataFrame:
    """Two-stage top-``top_k`` for every user in ``store`` (their most recent events as input),
    as of ``query_time`` (Unix seconds; default: the last event in the store)."""
    if top_k < 1:
        raise ValueError(f"retrieval.top_k={top_k} must be >= 1")
    if top_k > model.vocab.items.height:
        raise ValueError(
            f"retrieval.top_k={top_k} exceeds the catalogue of {model.vocab.items.height} items"
        )
    encoder = model.encoder.to(device).eval()
    rows = TargetRows(
        store,
        store.lengths,
        max_seq_len=model.max_seq_len,
        time_buckets=model.time_buckets,
        has_target=False,
        query_time=int(store.timestamp.max()) if query_time is None else query_time,
    )
    loader = batch_loader(rows, batch_size=batch_size, shuffle=False)
    item_ids = model.vocab.items[ITEM]  # item index i -> raw id at row i - NUM_RESERVED
    users, ranks, items, scores = [], [], [], []
    for batch in tqdm(loader, desc="score", leave=False, mininterval=2.0):
        batch_rows = batch.user_index.numpy()
        exclude = seen_items(store, batch_rows).to(device) if exclude_seen else None
        batch = batch.to(device)
        output = encoder(*batch.model_inputs())
        ranking = two_stage(
            encoder, output, top_k=top_k, rerank_top_n=rerank_top_n, exclude=exclude
        )
        top_items = ranking.items[:, :top_k].cpu()
        top_scores = ranking.scores[:, :top_k].float().cpu()
        valid = ~torch.isneginf(top_scores)  # fewer than K items left after exclusions
        users.append(np.repeat(batch_rows, valid.sum(dim=1).numpy()))
        ranks.append((torch.arange(1, top_k + 1).expand_as(top_items)[valid]).numpy())
        items.append(top_items[valid].numpy())
        scores.append(top_scores[valid].numpy())
    item_index = np.concatenate(items)
    frame = pl.DataFrame(
        {
            USER: store.user_id.gather(np.concatenate(users)),
            "rank": pl.Series(np.concatenate(ranks), dtype=pl.Int32),
            ITEM: item_ids.gather(item_index - NUM_RESERVED),
            "score": pl.Series(np.concatenate(scores), dtype=pl.Float32),
        }
    )
    log.info("scored %d users -> %d recommendations", len(rows), frame.height)
    return frame


def write_atomically(frame: pl.DataFrame, path: str | Path, *, file_format: str) -> Path:
    """Write ``frame`` to ``path`` through a temporary file in the same folder + rename."""
    if file_format not in FORMATS:
        raise ValueError(f"retrieval.format={file_format!r}: use one of {list(FORMATS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        if file_format == "parquet":
            frame.write_parquet(tmp)
        else:
            frame.write_csv(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
