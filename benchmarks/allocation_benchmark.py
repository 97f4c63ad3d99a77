"""Large score tables on a CPU, whole against in chunks (``recsys.allocation``), side by side.

    python -m benchmarks.allocation_benchmark                 # the sizes the notes quote
    python -m benchmarks.allocation_benchmark --repeats 9

Four measurements, each in a fresh process of its own (the allocator's state after one would
change the other's figures), taking turns between its settings after a warm-up (``--only
NAME`` runs one in this process; ``--only evaluation --setting whole|chunked`` one setting):

- **loss**: the training's full softmax, forward and backward: ``F.cross_entropy`` of
  ``hidden @ keys.T`` for (25,600, 64) hidden states (128 windows of 200) over 3,400 items, as
  one table (348 MB) and in the row chunks ``cpu_chunk_length`` gives (and two fixed sizes);
- **search**: exact top-10 search of 512 queries over 1 M random keys with ``chunked_topk``, in
  chunks of 65,536 items (scoring's ``item_chunk_size``), 16,384, 8,192 (what
  ``cpu_chunk_length`` cuts it to) and 4,096;
- **distillation**: a training step (forward and backward) of SASRec (width 64) with two
  teachers, ``training.distillation``, on 128 windows of 200 over 3,400 items: the student's
  and the teachers' logits as one table each, and in the full softmax's row chunks;
- **evaluation**: ``SeqRecModule.evaluation_metrics`` of one 512-row batch (SASRec, width 64,
  windows of 50, ``seen_items=exclude``) over 1 M items, its score tables made for the whole
  batch at once and in the row chunks ``table_chunk_length`` gives (16 rows). Each setting
  runs in a fresh process of its own, as its peak RSS (the process's, above what it held
  before the first batch) is the point.

Prints the median milliseconds and minor page faults of each. Figures, not a test: see
``benchmarks/README.md``, "Training speed".
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from recsys.allocation import cpu_chunk_length
from recsys.retrieval.index import MIN_ITEM_CHUNK, chunked_topk
from recsys.training.module import MIN_LOGIT_CHUNK_ROWS

MEASUREMENTS = {
    "loss": "loss step",
    "search": "search of one batch",
    "distillation": "distillation step",
    "evaluation": "evaluation of one batch",
}
EVAL_SETTINGS = ("whole", "chunked")


def alternate(fns: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (ms, minor page faults) of each function, run in turns after a warm-up."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    faults = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1000)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {n: (statistics.median(times[n]), statistics.median(faults[n])) for n in fns}


def loss_rows(rows: int, items: int, dim: int, repeats: int) -> dict[str, tuple[float, float]]:
    torch.manual_seed(0)
    hidden = torch.randn(rows, dim, requires_grad=True)
    keys = torch.randn(items, dim, requires_grad=True)
    target = torch.randint(0, items, (rows,))

    def step(chunk: int):
        def run():
            loss = sum(
                F.cross_entropy(
                    hidden[i : i + chunk] @ keys.T, target[i : i + chunk], reduction="sum"
                )
                for i in range(0, rows, chunk)
            )
            loss.backward()

        return run

    chosen = cpu_chunk_length(rows, 4 * items, "cpu", minimum=MIN_LOGIT_CHUNK_ROWS)
    sizes = {"one table": rows, f"cpu_chunk_length: {chosen} rows": chosen}
    sizes.update({f"{n} rows": n for n in (2048, 1024) if n != chosen})
    return alternate({name: step(n) for name, n in sizes.items()}, repeats)


def search_rows(users: int, items: int, dim: int, repeats: int) -> dict[str, tuple[float, float]]:
    torch.manual_seed(0)
    query, keys = torch.randn(users, dim), torch.randn(items, dim)
    blocked = torch.zeros(items, dtype=torch.bool)
    history = torch.randint(0, items, (users, 50))

    def search(chunk: int):
        return lambda: chunked_topk(
            lambda s, e: query @ keys[s:e].T,
            items,
            10,
            blocked=blocked,
            exclude=history,
            item_chunk_size=chunk,
        )

    chosen = cpu_chunk_length(65_536, 4 * users, "cpu", minimum=MIN_ITEM_CHUNK)
    sizes = [65_536, 16_384, chosen, 4_096]
    names = {n: f"{n} items" + (" (cpu_chunk_length)" if n == chosen else "") for n in sizes}
    return alternate({names[n]: search(n) for n in dict.fromkeys(sizes)}, repeats)


def distillation_rows(
    windows: int, width: int, items: int, dim: int, repeats: int
) -> dict[str, tuple[float, float]]:
    import warnings
    from functools import partial

    from recsys.data.batch import SeqBatch
    from recsys.model.sasrec import SASRec
    from recsys.training import module as module_code

    torch.manual_seed(0)

    def encoder():
        return SASRec(num_items=items, max_seq_len=width, d_model=dim, num_heads=2, dropout=0.0)

    student, teachers = encoder(), [encoder(), encoder()]
    module = module_code.SeqRecModule(
        student,
        partial(torch.optim.Adam, lr=1e-3),
        distillation={"teachers": teachers, "weight": 0.5, "temperature": 2.0},
    )
    mask = torch.ones(windows, width, dtype=torch.bool)
    item = torch.randint(2, items, (windows, width))
    batch = SeqBatch(
        item=item,
        behavior=mask.long() * 2,
        time_bucket=mask.long(),
        padding_mask=mask,
        query_time_bucket=mask.long(),
        target_item=torch.roll(item, -1, dims=1),
        target_behavior=mask.long() * 2,
        user_index=torch.arange(windows),
    )
    chunk_length = module_code.cpu_chunk_length

    def step(whole: bool):
        def run():
            module_code.cpu_chunk_length = (
                (lambda length, *args, **kwargs: length) if whole else chunk_length
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # self.log outside a Trainer
                module.training_step(batch, 0).backward()
            student.zero_grad()

        return run

    rows = windows * width
    chosen = chunk_length(rows, 4 * items, "cpu", minimum=module_code.MIN_LOGIT_CHUNK_ROWS)
    return alternate(
        {"one table each": step(True), f"{chosen} rows (cpu_chunk_length)": step(False)}, repeats
    )


def evaluation_rows(
    users: int, items: int, dim: int, repeats: int, setting: str
) -> dict[str, tuple[float, float]]:
    from recsys.data.batch import SeqBatch
    from recsys.model.sasrec import SASRec
    from recsys.training import module as module_code

    torch.manual_seed(0)
    encoder = SASRec(num_items=items, max_seq_len=50, d_model=dim, num_heads=2, dropout=0.0)
    module = module_code.SeqRecModule(encoder, None, seen_items="exclude").eval()
    mask = torch.ones(users, 50, dtype=torch.bool)
    batch = SeqBatch(
        item=torch.randint(2, items, (users, 50)),
        behavior=mask.long() * 2,
        time_bucket=mask.long(),
        padding_mask=mask,
        query_time_bucket=mask.long(),
        target_item=torch.randint(2, items, (users,)),
        target_behavior=torch.full((users,), 2),
        user_index=torch.arange(users),
    )
    if setting == "whole":
        module_code.table_chunk_length = lambda rows, *args, **kwargs: rows
    chunk = module_code.table_chunk_length(
        users, 4 * items, "cpu", minimum=module_code.MIN_EVAL_CHUNK_ROWS
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def run():
        with torch.no_grad():
            module.evaluation_metrics(batch)

    row = alternate({"": run}, repeats)[""]
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20  # KiB -> GiB
    return {f"{setting}: tables of {chunk} rows, peak RSS +{grown:.2f} GiB": row}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds after the warm-up")
    parser.add_argument("--rows", type=int, default=25_600, help="loss: trained positions")
    parser.add_argument("--loss-items", type=int, default=3_400)
    parser.add_argument("--users", type=int, default=512, help="search: queries per batch")
    parser.add_argument("--search-items", type=int, default=1_000_000)
    parser.add_argument("--eval-items", type=int, default=1_000_000)
    parser.add_argument(
        "--only", choices=MEASUREMENTS, help="this measurement alone, in this process"
    )
    parser.add_argument(
        "--setting",
        choices=EVAL_SETTINGS,
        help="with --only evaluation: the score tables made whole or in chunks (default chunked)",
    )
    args = parser.parse_args(argv)
    for name in ("repeats", "rows", "loss_items", "users", "search_items", "eval_items"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    if args.setting is not None and args.only != "evaluation":
        parser.error(
            f"--setting {args.setting} goes with --only evaluation (without --only, both "
            "settings are measured)"
        )
    if args.only == "loss":
        rows = loss_rows(args.rows, args.loss_items, 64, args.repeats)
    elif args.only == "search":
        rows = search_rows(args.users, args.search_items, 64, args.repeats)
    elif args.only == "distillation":
        rows = distillation_rows(128, 200, args.loss_items, 64, args.repeats)
    elif args.only == "evaluation":
        setting = args.setting or "chunked"
        rows = evaluation_rows(args.users, args.eval_items, 64, args.repeats, setting)
    else:  # the parent: one fresh process per measurement
        sys.stdout.write(
            "| measurement | setting | median ms | median page faults |\n|---|---|---:|---:|\n"
        )
        given = argv if argv is not None else sys.argv[1:]
        for only in MEASUREMENTS:
            command = [sys.executable, "-m", "benchmarks.allocation_benchmark", "--only", only]
            for setting in EVAL_SETTINGS if only == "evaluation" else [None]:
                extra = [] if setting is None else ["--setting", setting]
                subprocess.run([*command, *extra, *given], check=True)
        return 0
    what = MEASUREMENTS[args.only]
    for name, (ms, faults) in rows.items():
        sys.stdout.write(f"| {what} | {name} | {ms:.0f} | {faults:,.0f} |\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
