"""Model-quality suite: Hydra experiment configs on the research datasets -> a Markdown table.

    python -m benchmarks.quality_suite                       # every entry, 3 seeds
    python -m benchmarks.quality_suite --datasets beauty --models sasrec_ce,atrank --seeds 1
    python -m benchmarks.quality_suite --list                # entries and their overrides
    python -m benchmarks.quality_suite --datasets beauty --models atrank --seeds 2 --first-seed 1 \
        --json more.json                                     # add seeds 1 and 2 ...
    python -m benchmarks.quality_suite --table-from seed0.json more.json   # ... one table
    python -m benchmarks.quality_suite --datasets ml1m --models atrank --seeds 1 \
        --work-dir outputs/quality     # kept runs: stop at any time, the same command continues

Each run composes ``conf/config.yaml`` with ``experiment=<dataset>`` (data, protocol) and the
entry's overrides (model, loss), trains with early stopping on validation NDCG@10 (Taobao:
MRR, see its experiment config; `sasrec_bce_s3rec` on the S3-Rec files: NDCG@20, as S3-Rec's
trainer), and
evaluates the selected checkpoint on test once. The table shows, per (dataset, model), the mean
and spread over seeds of test HR@10 / NDCG@10, the published number to compare with (from
../shared/PROTOCOLS.md, same protocol unless the note says otherwise), the training time on
this machine (training epochs only, validation excluded) and, for Beauty, the minutes until
test NDCG@10 first reached RecBole's 0.0546 (the test curve is recorded for this column only;
it never selects a model). Everything each run measured also goes to ``--json``. A run that
fails (an error in training or evaluation) does not stop the suite: its row counts it
("2 of 3 (seed 1 failed)"), shows the finished seeds' mean (``failed`` where none finished),
the error is named under the table, and the suite exits with status 1 (with ``--work-dir`` the
same command runs the failed run again).

Datasets come from ``../shared/data`` (or ``$RECSYS_SHARED_DATA``); before any run the suite
stops with a message naming each data file of the chosen datasets that is absent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.prepare_benchmark import json_path, write_json

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.quality")

BASELINES = ("popularity", "transition")  # evaluated by every run (recsys.tasks.evaluate)
RECBOLE_NDCG = 0.0546  # RecBole SASRec (CE) on Beauty, P1, this machine: 60 min, 17 epochs
BCE_ONE_NEGATIVE = [
    "training.loss=bce",
    "training.num_negatives=1",
    "training.shared_negatives=false",
]

# SASRec as the S3-Rec family's code builds and trains it (aHuiWang/CIKM2020-S3Rec, run without
# pre-training; the source of the published BCE figures): ATRank's encoder over item ids alone
# with BERT's post-norm block (GELU feed-forward 4x wide, two heads, attention output
# projection), a LayerNorm over each token, learned positions; BCE with one negative per
# position, 256 users per batch, no weight decay. On the S3-Rec files (P1) it also selects and
# stops (patience 10) on validation NDCG@20, as that trainer does. `sasrec_bce` is Kang &
# McAuley's block.
S3REC_SASREC = (
    "model=atrank",
    "model.attribute_dim=0",
    "model.positional=learned",
    "model.norm_first=false",
    "model.token_norm=true",
    *BCE_ONE_NEGATIVE,
    "data.loader.batch_size=256",
    "training.optimizer.weight_decay=0",
)

# BSARec's Beauty recipe (yehjin-shin/BSARec; benchmarks/README.md, "Model quality") on ATRank
# with the attribute bag: the low-pass branch over the whole window (non-causal), one training
# row per prefix (only the last position trained), post-norm blocks with one head and learned
# positions, batches of 256 rows, lr 0.0005 without weight decay (tables at std 0.02, as
# the presets now store them).
BSAREC_RECIPE = (
    "model=atrank",
    "model.filter_mix=0.7",
    "model.filter_frequencies=5",
    "model.causal=false",
    "model.norm_first=false",
    "model.num_heads=1",
    "model.positional=learned",
    "data.loader.train_samples=prefixes",
    "data.loader.batch_size=256",
    "training.optimizer.lr=0.0005",
    "training.optimizer.weight_decay=0",
)

# an exponential moving average of the weights is validated, selected and saved
EMA_0999 = (
    "callbacks.weight_averaging="
    "{_target_: pytorch_lightning.callbacks.EMAWeightAveraging, decay: 0.999}"
)


@dataclass(frozen=True)
class Model:
    name: str
    label: str
    overrides: tuple[str, ...]
    compare_as: str | None = None  # a variant of this model: compare with its published number
    p1_overrides: tuple[str, ...] = ()  # added on the S3-Rec files only (datasets run under P1)

    def overrides_on(self, dataset: str) -> tuple[str, ...]:
        """The entry's overrides on ``dataset`` (after ``experiment=<dataset>``); an experiment
        outside the suite's datasets (a test's ``tiny``, a user's own) gets the plain ones."""
        spec = DATASETS.get(dataset)
        return self.overrides + (self.p1_overrides if spec and spec.protocol == P1 else ())


MODELS = {
    m.name: m
    for m in (
        # baselines: read off every run's evaluation
        Model("popularity", "popularity", ()),
        Model("transition", "first-order transition (PROTOCOLS.md)", ()),
        Model("sasrec_bce", "SASRec (BCE, 1 negative)", ("model=sasrec", *BCE_ONE_NEGATIVE)),
        Model(
            "sasrec_bce_s3rec",
            "SASRec as S3-Rec's code builds it (BCE, 1 negative)",
            S3REC_SASREC,
            compare_as="sasrec_bce",
            p1_overrides=("callbacks.model_checkpoint.monitor=val/ndcg_at_20",),
        ),
        Model("sasrec_ce", "SASRec+ (full-softmax CE)", ("model=sasrec",)),
        Model(
            "atrank_faithful",
            "ATRank, faithful preset (target attention, BCE 1 negative)",
            ("model=atrank_faithful",),  # the preset sets the objective, loss and time gaps
        ),
        Model("atrank", "ATRank, modern preset (CE, attributes, behaviours)", ("model=atrank",)),
        Model(
            "atrank_low_pass",
            "ATRank, modern preset + BSARec's low-pass branch (alpha 0.7, c 5)",
            ("model=atrank", "model.filter_mix=0.7", "model.filter_frequencies=5"),
        ),
        Model(
            "atrank_bsarec",
            "ATRank (attributes) trained as BSARec: low-pass branch, non-causal, every prefix",
            BSAREC_RECIPE,
        ),
        Model(
            "atrank_bsarec_ema",
            "ATRank (attributes) trained as BSARec, weights averaged (EMA 0.999)",
            (*BSAREC_RECIPE, EMA_0999),
            compare_as="atrank_bsarec",
        ),
    )
}


@dataclass(frozen=True)
class Dataset:
    name: str
    protocol: str
    published: dict[str, tuple[float, str]] = field(default_factory=dict)  # model -> (ndcg, src)
    note: str = ""
    # users evaluated apart as well (their test/segment_* metrics get a row of their own): the
    # row's words, and what writes their ids (the run's config, a file to write them to)
    segment: tuple[str, Callable[[Any, Path], None]] | None = None


def write_complete_ml1m_users(cfg: Any, path: Path) -> None:
    """The 512 users whose whole sequence the shared ML-1M copy holds (gSASRec's validation
    users, ``user_seq_complete``; its PROVENANCE.md): for them, and only them, the test step
    is the published one (the last item, from every item before it)."""
    import polars as pl

    frame = pl.read_parquet(cfg.data.source.path, columns=["user_sas", "user_seq_complete"])
    users = frame.filter(pl.col("user_seq_complete"))["user_sas"].unique().sort()
    users.alias("user_id").to_frame().write_parquet(path)


P1 = "P1: leave-one-out, all items, history scored 0"
DATASETS = {
    d.name: d
    for d in (
        Dataset(
            "beauty",
            P1,
            {
                "sasrec_bce": (0.0318, "S3-Rec paper, P1"),
                "sasrec_ce": (0.0531, "SASRec + sampled softmax, transformer_benchmark, P2"),
                "atrank": (0.0614, "WEARec repo, P1 (best of 88 runs on test)"),
                "atrank_low_pass": (0.0611, "BSARec repo, P1, one run"),
                "atrank_bsarec": (0.0611, "BSARec repo, P1, one run"),
                "popularity": (0.0056, "PROTOCOLS.md, P1"),
                "transition": (0.0441, "PROTOCOLS.md, P1"),
            },
        ),
        Dataset(
            "sports",
            P1,
            {
                "sasrec_bce": (0.0192, "S3-Rec paper, P1"),
                "sasrec_ce": (0.0314, "SASRec + sampled softmax, P2"),
                "atrank": (0.0367, "WEARec repo, P1"),
                "atrank_low_pass": (0.0367, "WEARec repo, P1"),
                "atrank_bsarec": (0.0367, "WEARec repo, P1"),
                "popularity": (0.0052, "PROTOCOLS.md, P1"),
                "transition": (0.0236, "PROTOCOLS.md, P1"),
            },
        ),
        Dataset(
            "toys",
            P1,
            {
                "sasrec_bce": (0.0374, "S3-Rec paper, P1"),
                "sasrec_ce": (0.0580, "SASRec + sampled softmax, P2"),
                "atrank": (0.0657, "ICSRec repo, P1"),
                "atrank_low_pass": (0.0657, "ICSRec repo, P1"),
                "atrank_bsarec": (0.0657, "ICSRec repo, P1"),
                "popularity": (0.0049, "PROTOCOLS.md, P1"),
                "transition": (0.0483, "PROTOCOLS.md, P1"),
            },
        ),
        Dataset(
            "ml1m",
            "leave-one-out, all items, seen excluded",
            {
                "sasrec_ce": (0.1821, "SASRec+, antklen/sasrec-bert4rec-recsys23"),
                "atrank": (0.1930, "LRURec"),
                "atrank_low_pass": (0.1930, "LRURec"),
                "atrank_bsarec": (0.1930, "LRURec"),
            },
            note="the shared copy lacks the second-to-last item for 91.5% of users, so their "
            "test step asks for the item two ahead: only the 512 users whose sequences it holds "
            "whole (their own rows: ± over seeds, or for one seed ± its standard error, SE) are "
            "measured on the published test step",
            segment=("512 users on the published test step", write_complete_ml1m_users),
        ),
        Dataset(
            "taobao",
            "global temporal split, next purchase, seen kept",
            note="none published; target: ATRank with behaviours >= 1.10 x item-only SASRec. "
            "The CE rows use a sampled softmax here (1024 popularity negatives, logQ-corrected; "
            "conf/experiment/taobao.yaml), and select on val/mrr: the sample has ~50 "
            "validation and ~40 test targets (stats.json), so one hit moves HR@10 by 0.026",
        ),
    )
}


def compose(dataset: str, model: Model, seed: int, run_dir: Path, extra: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import recsys.config  # noqa: F401  (the ${abspath:} resolver)

    overrides = [
        f"experiment={dataset}",
        *model.overrides_on(dataset),
        f"seed={seed}",
        f"paths.run_dir={run_dir}",
        f"paths.output_dir={run_dir.parent}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        *(["callbacks.training_clock.test_curve=true"] if dataset == "beauty" else []),
        *extra,
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides), overrides


RESULT_FILE = "result.json"  # a finished run's result, in its folder
COMMAND_FILE = "command.txt"  # what the folder's run was started with
# each test and validation target's metrics (pipelines.evaluate per_target=): two runs on the
# same data compare target by target with benchmarks.compare_targets
PER_TARGET_FILE = "per_target.parquet"


def run_one(dataset: str, model: Model, seed: int, work: Path, extra: list[str]) -> dict:
    """One run in ``work/<dataset>-<model>-<seed>``. In a kept work folder the suite can be
    stopped and started again with the same command: a finished run's result is read back,
    and an interrupted one continues from its last epoch (``resume=last``)."""
    from omegaconf import open_dict

    from recsys.tasks import evaluate, train

    run_dir = work / f"{dataset}-{model.name}-{seed}"
    resume = ["resume=last"] if (run_dir / "checkpoints" / "last.ckpt").is_file() else []
    cfg, overrides = compose(dataset, model, seed, run_dir, [*extra, *resume])
    recipe = (o for o in overrides if not o.startswith(("paths.", "resume=")))
    command = "python -m pipelines.run " + shlex.join(recipe)
    started_with = run_dir / COMMAND_FILE
    if started_with.is_file() and started_with.read_text() != command:
        raise ValueError(
            f"{run_dir} holds a run started as\n  {started_with.read_text()}\nnot\n  {command}\n"
            "pass another --work-dir (or delete that folder) to run these settings"
        )
    if (run_dir / RESULT_FILE).is_file():
        log.info("%s finished earlier: its result is read from %s", run_dir.name, RESULT_FILE)
        return json.loads((run_dir / RESULT_FILE).read_text())
    if resume:
        log.info("%s was interrupted: it continues from its last epoch", run_dir.name)
    elif (run_dir / "checkpoints").is_dir():  # killed before any last.ckpt: nothing to continue
        log.info("%s was interrupted before its first last.ckpt: it starts again", run_dir.name)
        shutil.rmtree(run_dir / "checkpoints")
    run_dir.mkdir(parents=True, exist_ok=True)
    started_with.write_text(command)
    spec = DATASETS.get(dataset)  # tests run experiment configs outside the suite too
    segment = spec.segment if spec is not None else None
    per_target = run_dir / PER_TARGET_FILE
    per_target.unlink(missing_ok=True)  # of an evaluation stopped before the result was written
    with open_dict(cfg):
        cfg.per_target = str(per_target)
    identity = {
        "dataset": dataset,
        "model": model.name,
        "seed": seed,
        "loss": str(cfg.training.loss),
        "unknown_targets": str(cfg.training.unknown_targets),
        "command": command,
    }
    try:
        if segment is not None:
            users = run_dir / "segment_users.parquet"
            segment[1](cfg, users)
            with open_dict(cfg):
                cfg.users = str(users)  # evaluate.run reports them as test/segment_*
        started = time.perf_counter()
        trained = train.run(cfg)
        # validation as well: the baselines' validation numbers show the gap the data has
        metrics = evaluate.run(
            cfg, trained.checkpoint, prepared_dir=trained.prepared_dir, splits=("val", "test")
        )
    except Exception as err:  # the other runs go on; the table shows this one as failed
        log.exception("%s failed", run_dir.name)
        return {**identity, "error": f"{type(err).__name__}: {err}"}
    curve = [
        (entry["train_seconds"], entry.get("curve/test_ndcg_at_10"))
        for entry in trained.history or []
    ]
    reached = next((s for s, ndcg in curve if ndcg is not None and ndcg >= RECBOLE_NDCG), None)
    result = {
        **identity,
        "test": metrics,
        "best_val": trained.best_val,
        "epochs": len(trained.history or []),
        "train_seconds": trained.train_seconds,  # every call's epochs, when resumed
        "wall_seconds": time.perf_counter() - started,  # this call only
        "resumed": bool(resume),
        "seconds_to_recbole_ndcg": reached,
        "history": trained.history,
    }
    write_json(run_dir / RESULT_FILE, result, indent=2, default=str)
    return result


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.4f}"
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}"


def _segment_spread(runs: list[dict], metric: str) -> str:
    """A segment's test ``metric`` at 10: ± over seeds, or for one seed ± its standard error
    over the segment's targets (a few hundred users: one seed's figure is far from exact)."""
    key = f"test/segment_{metric}_at_10"
    error = runs[0]["test"].get(f"{key}_stderr")
    if len(runs) == 1 and error is not None:
        return f"{runs[0]['test'][key]:.4f} ± {error:.4f} SE"
    return _spread([r["test"][key] for r in runs])


def table(results: list[dict]) -> str:
    rows = [
        "| dataset | model | protocol | seeds | test HR@10 | test NDCG@10 | published NDCG@10 "
        "(source) | training min | min to NDCG 0.0546 | run (`python -m pipelines.run ...`) |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    groups: dict[tuple[str, str, str, str], list[dict]] = {}
    for result in results:
        groups.setdefault(_entry(result), []).append(result)
    baselines_done = set()
    for (dataset, model, policy, _), runs in groups.items():
        spec = DATASETS[dataset]
        # a failed run (no metrics) is counted in the seeds column and named below the table,
        # never averaged over as if the entry had fewer seeds
        done = [r for r in runs if "error" not in r]
        failed = [r["seed"] for r in runs if "error" in r]
        seeds = str(len(runs))
        if failed:
            seeds = f"{len(done)} of {len(runs)} (seed {', '.join(map(str, failed))} failed)"
        if done and (dataset, policy) not in baselines_done:  # once per dataset, protocol
            baselines_done.add((dataset, policy))
            first = done[0]["test"]
            for baseline in BASELINES:
                rows.append(
                    f"| {dataset} | {MODELS[baseline].label} | {_protocol(spec, runs[0])} | 1 | "
                    f"{first[f'test/{baseline}_hr_at_10']:.4f} | "
                    f"{first[f'test/{baseline}_ndcg_at_10']:.4f} | "
                    f"{_published(spec.published.get(baseline))} | — | — | "
                    "(every run's evaluation) |"
                )
        hr = [r["test"]["test/hr_at_10"] for r in done]
        ndcg = [r["test"]["test/ndcg_at_10"] for r in done]
        minutes = [r["train_seconds"] / 60 for r in done if r["train_seconds"] is not None]
        to_target = "—" if dataset != "beauty" or not done else _minutes_to_recbole(done)
        published = spec.published.get(MODELS[model].compare_as or model)
        hr_cell, ndcg_cell = (_spread(hr), _spread(ndcg)) if done else ("failed", "failed")
        rows.append(
            f"| {dataset} | {_label(MODELS[model], runs[0])} | {_protocol(spec, runs[0])} | "
            f"{seeds} | "
            f"{hr_cell} | {ndcg_cell} | {_published(published)} | "
            f"{f'{statistics.fmean(minutes):.1f}' if minutes else '—'} | {to_target} | "
            f"`{_overrides(runs[0])}` |"
        )
        if (
            spec.segment is not None
            and done
            and all("test/segment_ndcg_at_10" in r["test"] for r in done)
        ):
            rows.append(
                f"| {dataset} | {_label(MODELS[model], runs[0])}, {spec.segment[0]} | "
                f"{_protocol(spec, runs[0])} | {seeds} | {_segment_spread(done, 'hr')} | "
                f"{_segment_spread(done, 'ndcg')} | {_published(published)} | — | — | "
                "(the same runs) |"
            )
    notes = [f"- {d}: {DATASETS[d].note}" for d in dict.fromkeys(r["dataset"] for r in results)]
    notes = [n for n in notes if not n.endswith(": ")]
    notes += [
        f"- failed: {r['dataset']} / {r['model']} / seed {r['seed']}: {r['error']}"
        for r in results
        if "error" in r
    ]
    return "\n".join(rows + ([""] + notes if notes else []))


def _entry(result: dict) -> tuple[str, str, str, str]:
    """What one row averages seeds over: the dataset, the model, the run's protocol (its
    ``training.unknown_targets``) and its recipe (the command without the seed), so that
    ``--table-from`` never merges runs of other settings into one mean."""
    policy = result.get("unknown_targets") or ""
    return result["dataset"], result["model"], policy, _overrides(result)


def _protocol(spec: Dataset, result: dict) -> str:
    """The dataset's protocol and what the run did with targets whose item never occurs in
    training (``training.unknown_targets``; JSON from before that field: not stated, they were
    left out)."""
    from recsys.training.evaluation import UNKNOWN_TARGETS_WORDS  # the runs' protocol tag's words

    policy = result.get("unknown_targets")
    if not policy:
        return spec.protocol
    return f"{spec.protocol}, unknown-item targets {UNKNOWN_TARGETS_WORDS[policy]}"


def _label(model: Model, result: dict) -> str:
    """The model's label, naming the loss the run trained with where an experiment config
    changed it (Taobao's CE rows use a sampled softmax; JSON from before the ``loss`` field
    keeps the label as it is)."""
    loss = result.get("loss")
    if loss == "sampled_softmax":
        return model.label.replace("full-softmax CE", "sampled-softmax CE")
    return model.label


def _minutes_to_recbole(runs: list[dict]) -> str:
    """Mean training minutes to RecBole's test NDCG@10 when every seed reached it; each seed's
    minutes and how many seeds reached it when only some did."""
    reached = sorted(
        r["seconds_to_recbole_ndcg"] / 60 for r in runs if r["seconds_to_recbole_ndcg"]
    )
    if not reached:
        return "not reached"
    if len(reached) == len(runs):
        return f"{statistics.fmean(reached):.1f}"
    minutes = ", ".join(f"{m:.1f}" for m in reached)
    return f"{minutes} ({len(reached)} of {len(runs)} seeds; the others never)"


def _overrides(result: dict) -> str:
    """The run's command line without the suite's own bookkeeping (seed, logging, paths)."""
    words = shlex.split(result["command"].removeprefix("python -m pipelines.run "))
    skip = ("seed=", "logger=", "trainer.enable_progress_bar", "callbacks.training_clock")
    return shlex.join(w for w in words if not w.startswith(skip))


def _published(entry: tuple[float, str] | None) -> str:
    return "—" if entry is None else f"{entry[0]:.4f} ({entry[1]})"


def run_all(
    datasets: list[str],
    models: list[Model],
    seeds: range,
    work: Path,
    overrides: list[str],
    json_path: Path | None,
) -> list[dict]:
    """Every (dataset, model, seed) run in ``work``; ``json_path`` is rewritten after each."""
    results = []
    for dataset in datasets:
        for model in models:
            if model.name in BASELINES:
                continue
            for seed in seeds:
                log.info("%s / %s / seed %d ...", dataset, model.name, seed)
                result = run_one(dataset, model, seed, work, overrides)
                if "error" in result:
                    log.error(
                        "%s / %s / seed %d failed: %s", dataset, model.name, seed, result["error"]
                    )
                else:
                    log.info(
                        "%s / %s / seed %d: test NDCG@10 %.4f HR@10 %.4f, %.1f min training",
                        dataset,
                        model.name,
                        seed,
                        result["test"]["test/ndcg_at_10"],
                        result["test"]["test/hr_at_10"],
                        (result["train_seconds"] or 0) / 60,
                    )
                results.append(result)
                if json_path:
                    write_json(json_path, results, indent=2, default=str)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--models", default=",".join(m for m in MODELS if m not in BASELINES))
    parser.add_argument("--seeds", type=int, default=3, help="runs per entry")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds are first-seed .. first-seed + seeds - 1 (add seeds to earlier runs)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the runs (checkpoints, prepared data, results) here, so the same command "
        "started again skips finished runs and continues interrupted ones from their last "
        "epoch; default: a temporary folder removed at the end",
    )
    parser.add_argument("--json", type=json_path, default=None, help="also write every result here")
    parser.add_argument("--list", action="store_true", help="print the entries and exit")
    parser.add_argument(
        "--table-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the table of results saved with --json (several files: their runs "
        "together, e.g. seeds run by separate invocations) and exit; trains nothing",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.table_from:
        results = _saved_results(args.table_from, parser)
        print(table(results))
        return _status(results)
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(
            f"--seeds {args.seeds} --first-seed {args.first_seed}: pass at least one seed and "
            "a first seed >= 0"
        )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    datasets = [d for d in args.datasets.split(",") if d]
    for name in datasets:
        if name not in DATASETS:
            parser.error(f"unknown dataset {name!r}: choose from {list(DATASETS)}")
    for name in args.models.split(","):
        if name and name not in MODELS:
            parser.error(f"unknown model {name!r}: choose from {list(MODELS)}")
    models = [MODELS[m] for m in args.models.split(",") if m]
    if args.list:
        for d in datasets:
            for m in models:
                print(f"{d:8} {m.name:17} experiment={d} {shlex.join(m.overrides_on(d))}")
        return 0
    trained = [m for m in models if m.name not in BASELINES]
    if not trained:
        parser.error(
            f"--models {args.models}: name a trained model (every run evaluates {BASELINES})"
        )
    shared = Path(os.environ.get("RECSYS_SHARED_DATA", ROOT.parent / "shared" / "data"))
    if not shared.is_dir():
        print(
            f"{shared} not found: the suite needs the research datasets (../shared/data or "
            "$RECSYS_SHARED_DATA)",
            file=sys.stderr,
        )
        return 2
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    missing = []
    for name in datasets:
        try:
            missing += _missing_files(name, trained[0], seeds[0], args.overrides)
        except (HydraException, OmegaConfBaseException) as err:
            parser.error(f"experiment={name} with the overrides {args.overrides}: {err}")
    if missing:  # before any run: not after the datasets before it have trained for hours
        print(
            "\n".join(missing) + "\nthe suite needs the research datasets (../shared/data or "
            "$RECSYS_SHARED_DATA): add the files, or leave those datasets out with --datasets",
            file=sys.stderr,
        )
        return 2
    if args.work_dir is not None:  # kept: checkpoints and prepared data for inspection
        results = run_all(datasets, models, seeds, args.work_dir, args.overrides, args.json)
    else:  # runs in a temporary folder that goes when the suite ends, finished or not
        with tempfile.TemporaryDirectory(prefix="recsys-quality-") as work:
            results = run_all(datasets, models, seeds, Path(work), args.overrides, args.json)
    print(table(results))
    return _status(results)


def _missing_files(dataset: str, model: Model, seed: int, overrides: list[str]) -> list[str]:
    """The data files ``experiment=<dataset>`` reads (with the suite's overrides) that do not
    exist, each as a line naming the file and the dataset."""
    from omegaconf import OmegaConf

    cfg, _ = compose(dataset, model, seed, ROOT / "outputs" / "unused", overrides)
    paths = (OmegaConf.select(cfg, key) for key in ("data.source.path", "data.items.path"))
    return [
        f"{path} not found (experiment={dataset})"
        for path in paths
        if isinstance(path, str) and not Path(path).exists()
    ]


def _status(results: list[dict]) -> int:
    """The exit status: 1 when a run in the table failed."""
    return 1 if any("error" in r for r in results) else 0


def _saved_results(paths: list[Path], parser: argparse.ArgumentParser) -> list[dict]:
    """The runs of ``--json`` files, in file order; the same (dataset, model, seed) of one
    protocol and recipe twice is an error (a table would count one seed twice)."""
    results, seen = [], {}
    for path in paths:
        try:
            runs = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            parser.error(f"--table-from {path}: {err}; pass a file written by --json")
        if not isinstance(runs, list) or not all(
            isinstance(r, dict)
            and {"dataset", "model", "seed", "command"} <= r.keys()
            and ("test" in r or "error" in r)
            for r in runs
        ):
            parser.error(f"--table-from {path}: not a list of runs; pass a file written by --json")
        for run in runs:
            if run["dataset"] not in DATASETS:  # (a table row needs its published number)
                parser.error(
                    f"--table-from {path}: dataset {run['dataset']!r} is not one of the suite's "
                    f"{list(DATASETS)}; pass files written by this suite's --json"
                )
            key = (*_entry(run), run["seed"])
            if key in seen:
                parser.error(
                    f"--table-from: {run['dataset']} / {run['model']} / seed {run['seed']} is in "
                    f"both {seen[key]} and {path}; pass each run once"
                )
            seen[key] = path
            results.append(run)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
