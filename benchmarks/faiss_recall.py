"""Recall of the faiss index on a trained model: which ``retrieval.faiss`` settings find the
exact top K for its users.

    python -m benchmarks.faiss_recall outputs/<run>              # a training run's folder
    python -m benchmarks.faiss_recall --checkpoint best.ckpt --prepared <prepared folder>
    python -m benchmarks.faiss_recall outputs/<run> --ef-search 128,512 --nprobe 32,128

The queries are the model's for its validation rows (up to ``--users``), the keys and bias the
ones scoring uses (``item_keys()``; items the model never recommends blocked), each user's
earlier items excluded as ``rules.exclude=seen`` does. For every index setting the table gives
recall@K (the share of the exact top K that the index returned, averaged over users), the
build seconds and the search rate. Run it before switching scoring to ``retrieval.index=faiss``:
recall depends on how the model's keys lie, not only on the index. See ``benchmarks/README.md``,
"Which faiss form".
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from pathlib import Path

import torch

from recsys.checkpoint import load_checkpoint
from recsys.data.datamodule import SeqRecDataModule
from recsys.retrieval.index import FAISS_METRICS, ExactIndex, FaissIndex

log = logging.getLogger("benchmarks.faiss_recall")


def _ints(text: str) -> list[int]:
    return [int(value) for value in text.split(",") if value]


def model_queries(checkpoint: Path, prepared: Path, users: int, batch_size: int = 512):
    """(query (U, D), history items (U, H)) of the first ``users`` validation rows, and the
    model's keys (I, D), bias (I,) and blocked items (I,) as scoring builds them."""
    model = load_checkpoint(checkpoint)
    encoder = model.encoder.eval()
    data = SeqRecDataModule(prepared, max_seq_len=model.max_seq_len, eval_batch_size=batch_size)
    queries, seen = [], []
    with torch.no_grad():
        for batch in data.val_dataloader():
            queries.append(encoder(*batch.model_inputs()).query.float())
            seen.append(batch.seen)  # every item before the target, as scoring excludes
            if sum(len(q) for q in queries) >= users:
                break
        keys = encoder.item_keys().float()
        bias = encoder.score_items(keys.new_zeros(1, keys.shape[1]))[0]  # bias + -inf
    if not queries:
        raise SystemExit(f"{prepared} has no validation rows to take queries from")
    blocked = torch.isneginf(bias)
    blocked[:2] = True  # PAD, UNK
    width = max(h.shape[1] for h in seen)
    history = torch.cat([torch.nn.functional.pad(h, (0, width - h.shape[1])) for h in seen])
    return (
        torch.cat(queries)[:users],
        history[:users],
        keys,
        torch.nan_to_num(bias, neginf=0.0),
        blocked,
    )


def measure(args: argparse.Namespace) -> list[dict]:
    query, history, keys, bias, blocked = model_queries(args.checkpoint, args.prepared, args.users)
    log.info("%d users, %d items, keys of width %d", len(query), len(keys), keys.shape[1])
    _, exact = ExactIndex(keys, bias, blocked).search(query, args.top_k, history)
    settings = [
        {"kind": "hnsw", "metric": metric, "ef_search": ef}
        for metric, ef in itertools.product(args.metrics, args.ef_search)
    ] + [
        {"kind": "ivf", "metric": metric, "nprobe": nprobe}
        for metric, nprobe in itertools.product(args.metrics, args.nprobe)
    ]
    rows = []
    for setting in settings:
        t0 = time.perf_counter()
        index = FaissIndex(keys, bias, blocked, **setting)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, found = index.search(query, args.top_k, history)
        search = time.perf_counter() - t0
        hits = (found[:, :, None] == exact[:, None, :]) & (exact[:, None, :] > 0)
        real = (exact > 0).sum(1).clamp(min=1)
        recall = (hits.any(2).sum(1) / real).mean().item()
        rows.append({**setting, "recall": recall, "build_s": build, "users_s": len(query) / search})
        log.info("%s: recall@%d %.3f", setting, args.top_k, recall)
    return rows


def table(rows: list[dict], top_k: int) -> str:
    lines = [
        f"| index | metric | setting | recall@{top_k} | build s | users/s (search) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        setting = (
            f"efSearch {row['ef_search']}" if row["kind"] == "hnsw" else f"nprobe {row['nprobe']}"
        )
        lines.append(
            f"| {row['kind']} | {row['metric']} | {setting} | {row['recall']:.3f} | "
            f"{row['build_s']:.2f} | {row['users_s']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.faiss_recall", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run", nargs="?", type=Path, help="a training run's folder")
    parser.add_argument("--checkpoint", type=Path, help="default: <run>/checkpoints/best.ckpt")
    parser.add_argument("--prepared", type=Path, help="default: <run>/prepared")
    parser.add_argument("--users", type=int, default=2048, help="validation rows (2048)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--metrics", default=",".join(FAISS_METRICS), help="l2,inner_product")
    parser.add_argument("--ef-search", type=_ints, default=[128], help="HNSW, e.g. 128,512")
    parser.add_argument("--nprobe", type=_ints, default=[32], help="IVF, e.g. 32,128")
    parser.add_argument("--threads", type=int, default=None, help="torch and faiss threads")
    args = parser.parse_args(argv)
    if args.run is None and (args.checkpoint is None or args.prepared is None):
        parser.error("give a run folder, or both --checkpoint and --prepared")
    args.checkpoint = args.checkpoint or args.run / "checkpoints" / "best.ckpt"
    args.prepared = args.prepared or args.run / "prepared"
    for path in (args.checkpoint, args.prepared):
        if not path.exists():
            parser.error(f"{path} does not exist")
    args.metrics = [m for m in args.metrics.split(",") if m]
    if args.threads:
        torch.set_num_threads(args.threads)
        import faiss

        faiss.omp_set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    rows = measure(args)
    print(f"{args.checkpoint} ({len(rows)} settings)\n")
    print(table(rows, args.top_k))


if __name__ == "__main__":
    sys.exit(main())
