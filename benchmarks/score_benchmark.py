"""Scoring benchmark: users scored per second and peak memory at synthetic catalogue sizes.

    python -m benchmarks.score_benchmark                        # 10k, 100k, 1M items
    python -m benchmarks.score_benchmark --items 100k --users 4096 --faiss-kind ivf

For each catalogue size I a random ATRank encoder (d_model 64, 2 layers, max_seq_len 50, one
random category per item out of 1000) scores random left-padded user histories, the work a
scoring job does per batch for stage 1: the encoder forward, then the top-K search over all I
items with the user's history excluded (:mod:`recsys.retrieval.index`). The exact path
(``ExactIndex``, in item chunks) always runs; where ``import faiss`` works the ANN path
(``FaissIndex``, HNSW by default) runs too and its recall@K against the exact top-K of the same
queries is reported. Every (size, path) runs in a fresh subprocess (``--run-one``) so that its
peak RSS is its own; the child prints one JSON line last on stdout, the parent a Markdown table.
Re-ranking, rules, the cold-start fallback, explanations and writing the output are not measured.
See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmarks.prepare_benchmark import (
    GIB,
    json_path,
    machine_facts,
    parse_sizes,
    run_watched,
    write_json,
)

log = logging.getLogger("benchmarks.score")

DEFAULT_ITEMS = "10k,100k,1M"
PATHS = ("exact", "faiss")
# The synthetic model and data.
D_MODEL = 64
NUM_LAYERS = 2
MAX_SEQ_LEN = 50
NUM_CATEGORIES = 1000
NUM_BEHAVIORS = 6  # PAD, UNK + view, click, cart, purchase
NUM_TIME_BUCKETS = 17  # PAD + conf/data/base.yaml's 16 buckets
SEED = 0


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # KiB on Linux


def _status_gib(field: str) -> float | None:
    """``VmRSS`` (now) or ``VmHWM`` (peak since start or the last :func:`_reset_peak`)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError):
        pass
    return None


def _reset_peak() -> bool:
    """Reset this process' VmHWM to its current RSS (Linux >= 4.0); ru_maxrss is not reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _threads(requested: int | None) -> int:
    return requested or len(os.sched_getaffinity(0))


# -- the measured job (child process) ----------------------------------------------------------
def build_encoder(num_items: int, *, key_projection: bool = False):
    """A random ATRank over ``num_items`` real items (+ PAD and UNK), eval mode; its keys are
    the item ⊕ attribute-bag features (the model default) or, with ``key_projection``, their
    projection."""
    import torch

    from recsys.model.atrank import ATRank
    from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX

    torch.manual_seed(SEED)
    vocab = num_items + NUM_RESERVED
    encoder = ATRank(
        num_items=vocab,
        num_attributes=NUM_CATEGORIES + NUM_RESERVED,
        num_behaviors=NUM_BEHAVIORS,
        num_time_buckets=NUM_TIME_BUCKETS,
        max_seq_len=MAX_SEQ_LEN,
        d_model=D_MODEL,
        num_layers=NUM_LAYERS,
        key_projection=key_projection,
    )
    generator = torch.Generator().manual_seed(SEED + 1)
    category = torch.randint(
        NUM_RESERVED, NUM_CATEGORIES + NUM_RESERVED, (vocab,), generator=generator
    )
    category[PAD_IDX], category[UNK_IDX] = PAD_IDX, UNK_IDX
    encoder.set_item_attributes(category)
    with torch.no_grad():  # a trained model has a popularity bias; a fresh one has zeros
        encoder.item_bias.normal_(0.0, 0.5, generator=generator)
    return encoder.eval()


def synthetic_batches(num_items: int, users: int, batch_size: int) -> list[tuple]:
    """Left-padded random histories (1..MAX_SEQ_LEN events of random items), one tuple of
    encoder inputs per batch; the item tensor doubles as the batch's exclusion list."""
    import torch

    from recsys.schema import NUM_RESERVED

    generator = torch.Generator().manual_seed(SEED + 2)
    vocab = num_items + NUM_RESERVED
    batches = []
    for start in range(0, users, batch_size):
        b = min(batch_size, users - start)
        lengths = torch.randint(1, MAX_SEQ_LEN + 1, (b,), generator=generator)
        width = int(lengths.max())
        mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (B, T) left-padded
        item = torch.randint(NUM_RESERVED, vocab, (b, width), generator=generator) * mask
        behavior = torch.randint(NUM_RESERVED, NUM_BEHAVIORS, (b, width), generator=generator)
        time_bucket = torch.randint(1, NUM_TIME_BUCKETS, (b, width), generator=generator)
        query_time = torch.randint(1, NUM_TIME_BUCKETS, (b, width), generator=generator)
        batches.append((item, behavior * mask, time_bucket * mask, mask, query_time * mask))
    return batches


def run_one(path: str, num_items: int, args: argparse.Namespace) -> dict:
    """Measure one path at one catalogue size in this (fresh) process."""
    import torch

    from recsys.retrieval.index import ExactIndex, FaissIndex

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    rss_start = _peak_rss_gib()
    encoder = build_encoder(num_items, key_projection=args.key_projection)
    batches = synthetic_batches(num_items, args.users, args.batch_size)
    rss_model = _peak_rss_gib()
    top_k = args.top_k

    with torch.no_grad():
        # What Recommender.__init__ does: the key table, the bias with PAD/UNK at -inf, blocked.
        t0 = time.perf_counter()
        keys = encoder.item_keys()
        bias = encoder.score_items(keys.new_zeros(1, keys.shape[1]))[0]
        blocked = torch.isneginf(bias)
        bias = torch.nan_to_num(bias, neginf=0.0)
        keys_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cached_s = None
        if path == "exact":
            index = ExactIndex(keys, bias, blocked, item_chunk_size=args.item_chunk_size)
            index_s = time.perf_counter() - t0
        else:
            # with retrieval.faiss.cache_dir: the first job builds and saves the index, the
            # next one (same keys and settings) loads it
            with tempfile.TemporaryDirectory() as cache:
                settings = {
                    "kind": args.faiss_kind,
                    "metric": args.faiss_metric,
                    "ef_search": args.ef_search,
                    "nprobe": args.nprobe,
                    "threads": threads,
                    "cache_dir": cache,
                }
                index = FaissIndex(keys, bias, blocked, **settings)
                index_s = time.perf_counter() - t0
                del index  # one index in memory at a time: the peak stays the job's
                t0 = time.perf_counter()
                index = FaissIndex(keys, bias, blocked, **settings)
                cached_s = time.perf_counter() - t0
        rss_index = _peak_rss_gib()

        def score(batch: tuple) -> tuple[torch.Tensor, float, float]:
            t0 = time.perf_counter()
            query = encoder(*batch).query
            t1 = time.perf_counter()
            _, items = index.search(query, top_k, exclude=batch[0])
            t2 = time.perf_counter()
            return items, t1 - t0, t2 - t1

        rss_before = _status_gib("VmRSS")
        can_reset = _reset_peak()
        score(batches[0])  # warm-up (allocator, faiss / MKL thread pools), not timed
        per_batch, encode_s, search_s, found = [], 0.0, 0.0, []
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for repeat in range(args.repeats):
            for batch in batches:
                items, encode, search = score(batch)
                per_batch.append((encode + search) / len(batch[0]))  # seconds per user
                encode_s, search_s = encode_s + encode, search_s + search
                if repeat == 0:
                    found.append(items)
        usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
        # before the exact reference below, which is not this path's; resetting VmHWM resets
        # ru_maxrss too, so the peak of the key table and index build is taken from before
        peak = max(rss_index, _peak_rss_gib())
        hwm = _status_gib("VmHWM")
        # memory the searches needed on top of what was resident before them
        search_extra = hwm - rss_before if can_reset and hwm and rss_before else None

        recall = None
        if path == "faiss":  # share of the exact top-K that the ANN search returned
            exact = ExactIndex(keys, bias, blocked, item_chunk_size=args.item_chunk_size)
            hits = []
            for batch, ann in zip(batches, found):
                reference = exact.search(encoder(*batch).query, top_k, exclude=batch[0])[1]
                hits.append((reference[:, :, None] == ann[:, None, :]).any(2).float().mean(1))
            recall = float(torch.cat(hits).mean())
    scored = args.users * args.repeats
    search_setting = ""  # the query-time breadth of an ANN index, as the table names it
    if path == "faiss":
        search_setting = {"hnsw": f"ef {args.ef_search}", "ivf": f"nprobe {args.nprobe}"}.get(
            args.faiss_kind, ""
        )
        if args.faiss_kind != "flat":
            search_setting = f"{search_setting}, {args.faiss_metric}"
    return {
        "path": path,
        "items": num_items,
        "kind": "chunked" if path == "exact" else args.faiss_kind,
        "search_setting": search_setting,
        "key_projection": args.key_projection,
        "users": args.users,
        "batch_size": args.batch_size,
        "users_per_s": 1.0 / statistics.median(per_batch),
        "encode_users_per_s": scored / encode_s,
        "search_users_per_s": scored / search_s,
        "keys_s": keys_s,
        "index_s": index_s,
        "build_s": keys_s + index_s,
        "cached_build_s": None if cached_s is None else keys_s + cached_s,
        "recall": recall,
        "peak_rss_gib": peak,
        "rss_start_gib": rss_start,
        "rss_model_gib": rss_model,
        "rss_index_gib": rss_index,
        "search_extra_gib": search_extra,
        "threads": threads,
        # CPU seconds / wall seconds of the timed loop: ~threads on an idle machine
        "cores_busy": (usage.ru_utime - usage0.ru_utime + usage.ru_stime - usage0.ru_stime) / wall,
        "load_avg": os.getloadavg()[0],
    }


# -- the parent: one subprocess per (size, path) -----------------------------------------------
def measure(path: str, num_items: int, argv: list[str], *, max_rss_gib: float, timeout_s: float):
    """Run one job in a fresh interpreter, killed past ``max_rss_gib`` or ``timeout_s``."""
    cmd = [
        sys.executable, "-m", "benchmarks.score_benchmark", *argv,
        "--run-one", path, "--items", str(num_items),
    ]  # fmt: skip
    t0 = time.perf_counter()
    result, reason, _ = run_watched(cmd, max_rss_gib=max_rss_gib, timeout_s=timeout_s)
    if result is None:
        log.error("%s at %d items failed: %s", path, num_items, reason)
        return {"path": path, "items": num_items, "error": reason}
    result["process_s"] = time.perf_counter() - t0
    return result


def _fmt_gib(value: float | None) -> str:
    return "-" if value is None else f"+{value:.2f}"


def fmt_items(n: int) -> str:
    for factor, suffix in ((10**6, "M"), (10**3, "k")):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return f"{n:,}"


def summarise(rows: list[dict], top_k: int) -> str:
    lines = [
        f"| items | path | users/s (median) | build s | from cache s | peak RSS GiB | "
        f"recall@{top_k} |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = fmt_items(row["items"])
        if "error" in row:
            lines.append(f"| {name} | {row['path']} | failed: {row['error']} | | | | |")
            continue
        path = "exact" if row["path"] == "exact" else f"faiss {row['kind']}"
        path = f"{path} {row.get('search_setting', '')}".strip()
        recall = "" if row["recall"] is None else f"{row['recall']:.3f}"
        cached = row.get("cached_build_s")
        lines.append(
            f"| {name} | {path} | {row['users_per_s']:,.0f} | {row['build_s']:.2f} | "
            f"{'' if cached is None else f'{cached:.2f}'} | {row['peak_rss_gib']:.2f} | {recall} |"
        )
    return "\n".join(lines)


def faiss_missing() -> str | None:
    """Why the faiss path cannot run here, or None when it can."""
    try:
        import faiss  # noqa: F401
    except ImportError as err:
        return f"import faiss failed ({err}); pip install 'recsys[ann]' (faiss-cpu)"
    return None


# -- command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.score_benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--items",
        type=parse_sizes,
        default=DEFAULT_ITEMS,
        help="catalogue sizes (default %(default)s)",
    )
    parser.add_argument("--users", type=int, default=2048, help="users per size (%(default)s)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--item-chunk-size", type=int, default=65_536)
    parser.add_argument("--batch-size", type=int, default=512, help="users per batch")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the users")
    parser.add_argument(
        "--faiss-kind", default="hnsw", choices=("hnsw", "ivf", "flat"), help="FaissIndex kind"
    )
    parser.add_argument(
        "--faiss-metric", default="l2", choices=("l2", "inner_product"), help="FaissIndex metric"
    )
    parser.add_argument("--ef-search", type=int, default=128, help="HNSW efSearch (%(default)s)")
    parser.add_argument("--nprobe", type=int, default=32, help="IVF nprobe (%(default)s)")
    parser.add_argument(
        "--key-projection",
        action="store_true",
        help="keys through ATRank's key projection (model.key_projection=true) instead of the "
        "default item ⊕ attribute-bag keys",
    )
    parser.add_argument("--no-faiss", action="store_true", help="exact path only")
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--json", type=json_path, default=None, help="also write all results here")
    parser.add_argument("--run-one", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it loads
    for name in (
        "users",
        "top_k",
        "item_chunk_size",
        "batch_size",
        "repeats",
        "ef_search",
        "nprobe",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} must be >= 1 (leave it out for the usable cores)")
    sizes = [n for _, n in args.items]
    if not sizes:
        parser.error("--items names no catalogue size: pass e.g. --items 10k")

    if args.run_one:
        print(json.dumps(run_one(args.run_one, sizes[0], args)), flush=True)
        return 0

    t_start = time.perf_counter()
    facts = machine_facts()
    for name in ("polars", "pandas", "pyarrow", "POLARS_MAX_THREADS"):
        facts.pop(name, None)
    for package in ("torch", "faiss-cpu"):
        try:
            facts[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            facts[package] = "-"
    facts["threads"] = _threads(args.threads)
    skipped = "--no-faiss" if args.no_faiss else faiss_missing()
    paths = ["exact"] + ([] if skipped else ["faiss"])
    command = " ".join(["python -m benchmarks.score_benchmark", *sys.argv[1:]])
    print("## Machine\n")
    for key, value in facts.items():
        print(f"- {key}: {value}")
    print(f"- command: {command}\n")
    if skipped:
        print(f"faiss path skipped: {skipped}\n")
    sys.stdout.flush()

    child_argv = [
        "--users", str(args.users), "--top-k", str(args.top_k),
        "--item-chunk-size", str(args.item_chunk_size), "--batch-size", str(args.batch_size),
        "--repeats", str(args.repeats), "--faiss-kind", args.faiss_kind,
        "--faiss-metric", args.faiss_metric,
        "--ef-search", str(args.ef_search), "--nprobe", str(args.nprobe),
        "--threads", str(facts["threads"]),
        *(["--key-projection"] if args.key_projection else []),
    ]  # fmt: skip
    rows = []
    for num_items in sizes:
        for path in paths:
            log.info("%s at %d items ...", path, num_items)
            row = measure(
                path,
                num_items,
                child_argv,
                max_rss_gib=0.9 * facts["ram_gib"],
                timeout_s=args.timeout,
            )
            rows.append(row)
            if "error" not in row:
                log.info(
                    "%s at %d items: %.0f users/s, build %.2f s, peak RSS %.2f GiB",
                    path, num_items, row["users_per_s"], row["build_s"], row["peak_rss_gib"],
                )  # fmt: skip

    print("## Results\n")
    print(summarise(rows, args.top_k))
    print(
        f"\nusers/s: encoder forward + top-{args.top_k} search with the history excluded, "
        f"{args.users} users in batches of {args.batch_size}, median over batches of users / "
        "batch seconds (first batch once more beforehand as warm-up); build s: item key table "
        "+ index (faiss: built and saved to a cache folder, as the first job with "
        "retrieval.faiss.cache_dir does); from cache s: the key table + the same index loaded "
        "from that folder, as the next job does; peak RSS: ru_maxrss of the job's own process "
        "(model, key table, index, search), before the exact reference search that recall is "
        "measured against.\n"
    )
    print("## Details\n")
    for row in rows:
        if "error" in row:
            continue
        print(
            f"- {fmt_items(row['items'])} {row['path']}: encode {row['encode_users_per_s']:,.0f} "
            f"users/s, search {row['search_users_per_s']:,.0f} users/s; key table "
            f"{row['keys_s']:.2f} s, index {row['index_s']:.2f} s; RSS after imports "
            f"{row['rss_start_gib']:.2f}, + model and batches {row['rss_model_gib']:.2f}, + keys "
            f"and index {row['rss_index_gib']:.2f} GiB, search working memory "
            f"{_fmt_gib(row['search_extra_gib'])} GiB; {row['threads']} threads, "
            f"{row['cores_busy']:.2f} cores busy, load avg "
            f"{row['load_avg']:.1f}, process {row['process_s']:.0f} s"
        )
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    if args.json:
        write_json(args.json, {"machine": facts, "command": command, "results": rows})
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
