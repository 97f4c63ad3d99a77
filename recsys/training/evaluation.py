"""Evaluation outside the training loop (the best checkpoint on test, baselines) with exactly
the metric code the LightningModule logs during validation; each target's metrics as a table
(:class:`TargetRecords`), and two models compared target by target on them
(:func:`compare_per_target`)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import polars as pl
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from recsys import shown_live
from recsys.data.batch import SeqBatch
from recsys.data.io import DataError, cast_ids, read_user_list
from recsys.data.validate import canonical_id_type
from recsys.data.vocab import Vocab
from recsys.model.transfer import matching_rows
from recsys.schema import ITEM, NUM_RESERVED, PAD_IDX, UNK_IDX
from recsys.training.metrics import CoverageAccumulator, MeanAccumulator
from recsys.training.module import SeqRecModule

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from recsys.data.datamodule import SeqRecDataModule

log = logging.getLogger(__name__)

ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def pick_device(accelerator: str = "auto", *, option: str = "accelerator") -> torch.device:
    """ "auto" takes a GPU when there is one; "cpu" / "gpu" / "cuda" force the choice. Another
    name, or a GPU asked for where there is none, is refused naming ``option``."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"{option}={accelerator!r}: use one of {list(ACCELERATORS)}")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"{option}={accelerator}: this machine has no CUDA GPU; use auto or cpu"
            )
        return torch.device("cuda")
    if accelerator == "auto" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@torch.no_grad()
def evaluate(
    module: SeqRecModule,
    loader: DataLoader,
    *,
    device: torch.device,
    split: str,
    description: str = "eval",
    segment: bool = False,
    records: TargetRecords | None = None,
    item_map: torch.Tensor | None = None,
) -> dict[str, float]:
    """Mean of every per-row metric of ``module.evaluation_metrics`` over ``loader`` (the
    ``split`` targets, reported as the module reports that split: see
    :meth:`SeqRecModule.per_target_means`), and the catalogue coverage of the rows' top K.

    ``segment``: the loader holds some of the split's users only. Its means are then over
    their ranked targets as they are (the share of unknown-item targets that
    ``unknown_targets=miss`` scales by is the whole split's, not the segment's), and each comes
    with its standard error as ``<metric>_stderr``.

    ``records``: each row's metrics are added to it as well (a per-target table).

    ``item_map``: the module's model was trained on other data (``pipelines.evaluate
    other_data=true``): each item index of the loader's data -> the model's index of the same
    item (UNK where the model never learnt it, :func:`item_index_map`). Batches are read
    through it; a target the model never learnt counts as a miss (0 in every metric), and
    their number is returned as ``model_unknown_targets``. The records keep the data's
    targets, and the coverage is a share of the data's items (:class:`InDataItems`), as the
    data's own models' and baselines' is."""
    module = module.to(device).eval()
    totals = MeanAccumulator()
    size = module.encoder.num_items if item_map is None else len(item_map)
    coverage = CoverageAccumulator(size, module.metric_ks)
    unknown = 0
    if item_map is not None:
        item_map = item_map.to(device)
        listed = InDataItems(coverage, item_map, module.encoder.num_items)
    # a bar that clears itself leaves no line end: into a file or pipe the next log line would
    # follow its updates on their line, so it is drawn where it is seen live only
    bar = tqdm(
        loader, desc=description, leave=False, mininterval=2.0, disable=not shown_live(sys.stderr)
    )
    for batch in bar:
        batch = batch.to(device)
        if item_map is None:
            values = module.evaluation_metrics(batch, coverage)
        else:
            mapped = in_model_items(batch, item_map)
            values = module.evaluation_metrics(mapped, listed)
            missed = mapped.target_item == UNK_IDX
            unknown += int(missed.sum())
            values = {name: value.masked_fill(missed, 0) for name, value in values.items()}
        totals.update(values)
        if records is not None:
            records.update(batch, values)
    counted = {} if item_map is None else {"model_unknown_targets": unknown}
    if segment:
        errors = {f"{name}_stderr": value for name, value in totals.standard_errors().items()}
        return {**totals.compute(), **errors, **coverage.compute(), **counted}
    return {**module.per_target_means(split, totals.compute()), **coverage.compute(), **counted}


def item_index_map(model_vocab: Vocab, data_vocab: Vocab) -> torch.Tensor:
    """(items of ``data_vocab``,) long: each item index of the data -> the index of the same
    raw id in ``model_vocab`` (UNK where the model lacks it; PAD and UNK as they are), for
    :func:`evaluate`'s ``item_map``. Matched as a warm start matches them
    (:func:`recsys.model.transfer.matching_rows`)."""
    model_rows, data_rows = matching_rows(model_vocab.items, data_vocab.items, ITEM)
    index = torch.full((data_vocab.num_items,), UNK_IDX, dtype=torch.long)
    index[:NUM_RESERVED] = torch.arange(NUM_RESERVED)
    index[data_rows] = model_rows
    return index


class InDataItems:
    """``coverage`` (a :class:`CoverageAccumulator` of the data's items) given the top items of
    a model of another vocabulary: each is read back to the data's index through ``item_map``
    (:func:`item_index_map`, the data's index -> the model's); an item the data lacks counts in
    no share (it is PAD there)."""

    def __init__(self, coverage: CoverageAccumulator, item_map: torch.Tensor, num_items: int):
        self.coverage = coverage
        known = item_map != UNK_IDX
        known[:NUM_RESERVED] = False
        self.to_data = torch.full((num_items,), PAD_IDX, dtype=torch.long, device=item_map.device)
        self.to_data[item_map[known]] = torch.nonzero(known).squeeze(1)

    def update(self, top_items: torch.Tensor) -> None:
        self.coverage.update(self.to_data[top_items])


def in_model_items(batch: SeqBatch, item_map: torch.Tensor) -> SeqBatch:
    """``batch`` with its item indices (history, target, seen items) read through
    ``item_map`` (:func:`item_index_map`): the batch as a model of another vocabulary reads it."""
    return dataclasses.replace(
        batch,
        item=item_map[batch.item],
        target_item=item_map[batch.target_item],
        seen_item=None if batch.seen_item is None else item_map[batch.seen_item],
    )


# Below this many targets a split's metrics cannot resolve 0.01: one target moves HR@K by
# 1 / targets (a Taobao sample's 38 test targets: 0.026), and a warning says so
def protocol_tags(cfg: DictConfig, datamodule: SeqRecDataModule) -> dict[str, str]:
    """How the numbers were measured, stamped on the run (and in the benchmark table)."""
    stats = datamodule.stats
    split = stats["split"]
    sampled = cfg.training.get("sampled_metrics")
    return {
        "protocol.split": split["method"],
        "protocol.target_behaviors": str(split["target_behaviors"] or "any"),
        "protocol.candidates": "all items",
        "protocol.sampled_candidates": (
            f"target + {sampled.num_negatives} {sampled.sampler} negatives (sampled_*, auc)"
            if sampled
            else "none"
        ),
        "protocol.seen_items": SEEN_ITEMS_WORDS[cfg.training.seen_items],
        "protocol.unknown_item_targets": (
            f"{UNKNOWN_TARGETS_WORDS[cfg.training.unknown_targets]} "
            f"({stats.get('val_targets_unknown_item', 0)} validation, "
            f"{stats.get('test_targets_unknown_item', 0)} test)"
        ),
        "protocol.max_seq_len": str(datamodule.max_seq_len),
        "protocol.ranking": (
            f"top {cfg.training.rerank_top_n} re-ranked by target attention"
            if cfg.training.rerank_top_n
            else "retrieval only"
        ),
        "data.fingerprint": stats["fingerprint"],
    }


UNKNOWN_TARGETS_WORDS = {  # also the benchmark table's words
    "skip": "left out of the means",
    "miss": "counted as misses (S3-Rec family)",
}
SEEN_ITEMS_WORDS = {
    "keep": "kept",
    "exclude": "excluded (-inf)",
    "zero": "scored 0 (S3-Rec family)",
}


MIN_EVALUATION_TARGETS = 100


def warn_of_few_targets(split: str, stats: Mapping[str, Any], unknown_targets: str) -> None:
    """Warn when the ``split`` (``val`` or ``test``) of prepared data with ``stats`` has fewer
    than :data:`MIN_EVALUATION_TARGETS` targets its metrics average over (the ranked ones, and
    under ``training.unknown_targets=miss`` the unknown-item ones too), naming their number and
    how far one target moves a hit rate (1 / targets)."""
    targets = int(stats.get(f"{split}_targets", 0))
    if unknown_targets == "miss":
        targets += int(stats.get(f"{split}_targets_unknown_item", 0))
    if not 0 < targets < MIN_EVALUATION_TARGETS:
        return
    word = "validation" if split == "val" else split
    log.warning(
        "the %s split has %d targets (fewer than %d, recsys.training.evaluation."
        "MIN_EVALUATION_TARGETS): one target moves its HR@K by 1/%d = %.3f (NDCG@K and MRR by "
        "up to as much), so %s metrics closer than a few times that do not tell models apart; "
        "evaluate on more users (a longer log, or for a temporal split a larger "
        "data.split.%s_fraction)",
        word,
        targets,
        MIN_EVALUATION_TARGETS,
        targets,
        1 / targets,
        word,
        split,
    )


# the columns of a per-target table before its metrics, and what identifies a target in it
TARGET_COLUMNS = ("split", "user_id", "item_id", "retrieval_rank")
TARGET_KEY = ["split", "user_id"]


class TargetRecords:
    """Every evaluated target's per-row metrics (those :meth:`SeqRecModule.evaluation_metrics`
    averages), gathered batch by batch; :meth:`frame` makes them a table with raw ids."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []

    def update(self, batch: SeqBatch, values: dict[str, torch.Tensor]) -> None:
        part = {name: value.float().cpu().numpy() for name, value in values.items()}
        part["user_index"] = batch.user_index.cpu().numpy()
        part["target_item"] = batch.target_item.cpu().numpy()
        self.parts.append(part)

    def frame(self, split: str, user_ids: pl.Series, item_ids: pl.Series) -> pl.DataFrame:
        """One row per target: ``split``, ``user_id`` (``user_ids`` holds the raw id of every
        prepared user row), ``item_id`` (the target's raw id; ``item_ids`` of every item index
        from ``NUM_RESERVED`` on), ``retrieval_rank`` (the target's rank among the whole
        catalogue in stage 1, 1 = best, null where the seen-item rule excluded it) and each
        metric (those users get, then ``retrieval_*``), in evaluation order (the prepared
        user table's)."""
        if not self.parts:
            raise ValueError("no rows were evaluated")
        columns = {
            name: np.concatenate([part[name] for part in self.parts]) for name in self.parts[0]
        }
        users = columns.pop("user_index")
        items = columns.pop("target_item") - NUM_RESERVED
        mrr = columns["retrieval_mrr"]  # 1 / the uncut stage-1 rank, 0 when not ranked
        rank = np.where(mrr > 0, np.rint(1.0 / np.where(mrr > 0, mrr, 1.0)), np.nan)
        return pl.DataFrame(
            {
                "split": pl.Series([split] * len(users), dtype=pl.String),
                "user_id": user_ids.gather(users),
                "item_id": item_ids.gather(items),
                "retrieval_rank": pl.Series(rank).fill_nan(None).cast(pl.Int64),
                # the metrics users get first, then stage 1's alone
                **{
                    name: pl.Series(name, columns[name])
                    for name in sorted(columns, key=lambda n: n.startswith("retrieval_"))
                },
            }
        )


def _listed_users(users) -> pl.Series:
    """``compare_per_target``'s ``users``: a CSV / Parquet file (as ``pipelines.evaluate
    users=`` reads it), a polars or pandas frame (its ``user_id`` column, or its only one), a
    Series, or any iterable of ids."""
    if isinstance(users, str | os.PathLike):
        return read_user_list(users)
    if isinstance(users, pl.DataFrame | pd.DataFrame):
        names = [str(c) for c in users.columns]
        if "user_id" not in names and len(names) != 1:
            raise ValueError(
                f"users: a frame with columns {names}, none of them 'user_id': name the column "
                "of user ids 'user_id', or pass that column"
            )
        users = users["user_id" if "user_id" in names else users.columns[0]]
    if isinstance(users, pd.Series):
        users = pl.from_pandas(users)
    return (users if isinstance(users, pl.Series) else pl.Series(list(users))).rename("user_id")


def _per_target_table(table, name: str) -> pl.DataFrame:
    if isinstance(table, str | os.PathLike):
        path = Path(table)
        if not path.is_file():
            raise DataError(
                f"{name}: {path} is not a file: give the per-target file that "
                "`pipelines.evaluate per_target=<file>.parquet` wrote"
            )
        table = pl.read_parquet(path)
    elif isinstance(table, pd.DataFrame):
        table = pl.from_pandas(table)
    if not isinstance(table, pl.DataFrame):
        raise TypeError(f"{name}: a path, a polars or a pandas DataFrame, not {type(table)}")
    missing = [c for c in TARGET_COLUMNS if c not in table.columns]
    if missing:
        raise DataError(
            f"{name} lacks column(s) {missing} of a per-target table (has {table.columns}): "
            "give what `pipelines.evaluate per_target=<file>.parquet` wrote"
        )
    ids = {c: canonical_id_type(table.schema[c]) for c in ("user_id", "item_id")}
    # ids as prepared data types them (a pandas category's values as text, Int32 as Int64), so
    # two tables of the same targets join whatever type a notebook gave them
    table = table.with_columns(pl.col(c).cast(dtype) for c, dtype in ids.items() if dtype)
    repeated = table.filter(pl.struct(TARGET_KEY).is_duplicated())
    if len(repeated):
        raise DataError(
            f"{name} holds {len(repeated)} rows of the same split and user, e.g. "
            f"{repeated.select(TARGET_KEY).head(2).rows()}: a per-target table has one row per "
            "split and user (concatenated tables of two evaluations?)"
        )
    return table


def compare_per_target(
    a,
    b,
    metric: str = "ndcg_at_10",
    *,
    split: str | None = None,
    users=None,
) -> dict[str, float]:
    """Two models on the same targets, target by target: their per-target tables (paths, or
    polars / pandas frames, as ``pipelines.evaluate per_target=`` writes them) joined on split
    and user. ``a`` or ``b`` may be a list of tables, e.g. one per training seed: each
    target's metric is then the mean over them.

    Returns the number of targets, each model's mean ``metric`` (``a``, ``b``), the difference
    ``b - a``, its relative size (``b / a - 1``), its standard error as a paired one
    (``stderr``: the per-target differences' sample standard deviation / √targets, which
    leaves out how hard each target is, shared by both models) with the 95 % interval, the
    standard error the two means would have as independent samples (``unpaired_stderr``, for
    comparison), and how many targets each model scores higher on (``b_better``, ``a_better``,
    ``ties``). Both standard errors are over targets: they do not include how another
    training seed would move either model (pass several seeds' tables to average over them).

    ``split``: which split to compare (needed when the tables hold several). ``users``: only
    these user ids (an iterable, a polars or pandas Series or frame, or a CSV / Parquet file
    as ``users=`` of ``pipelines.evaluate`` reads it; listed users without a target there are
    counted in a warning). All tables must hold the same targets (the same data and
    split): other tables are refused, saying how they differ."""
    sides = {"a": a, "b": b}
    tables: dict[str, pl.DataFrame] = {}  # "a", or "a[0]", "a[1]", ... for a list
    for side, given in sides.items():
        many = isinstance(given, list | tuple)
        if many and not given:
            raise ValueError(f"{side}: an empty list of tables")
        for i, table in enumerate(given if many else [given]):
            name = f"{side}[{i}]" if many else side
            tables[name] = _per_target_table(table, name)
            if metric not in tables[name].columns:
                metrics = [c for c in tables[name].columns if c not in TARGET_COLUMNS]
                raise ValueError(
                    f"metric={metric!r} is not a column of {name}: choose from {metrics}"
                )
    splits = sorted({s for table in tables.values() for s in table["split"].unique()})
    if split is None:
        if len(splits) != 1:
            raise ValueError(
                f"the tables hold splits {splits}: choose one with split={splits[-1]!r} "
                f"(python -m benchmarks.compare_targets: --split {splits[-1]})"
            )
        split = splits[0]
    ids = None if users is None else _listed_users(users)
    if ids is not None:
        listed = pl.concat([t.filter(pl.col("split") == split)["user_id"] for t in tables.values()])
        known = cast_ids(ids, listed.dtype).is_in(listed.implode()).fill_null(False)
        absent = ids.filter(~known)
        if absent.len():
            log.warning(
                "%d of the %d users listed have no %s target in the tables (e.g. %s): they "
                "are not compared (unknown users, or targets not ranked)",
                absent.len(),
                ids.len(),
                split,
                absent.head(3).to_list(),
            )
    joined = None
    for i, (name, table) in enumerate(tables.items()):
        table = table.filter(pl.col("split") == split)
        if not len(table):
            raise ValueError(f"split={split!r}: {name} has no {split} target")
        if ids is not None:
            table = table.filter(
                pl.col("user_id").is_in(cast_ids(ids, table["user_id"].dtype).implode())
            )
            if not len(table):
                raise ValueError(
                    f"none of the {len(ids)} users listed has a {split} target in {name}"
                )
        table = table.select(
            *TARGET_KEY,
            pl.col("item_id").alias(f"item_{i}"),
            pl.col(metric).cast(pl.Float64).alias(name),
        )
        joined = (
            table
            if joined is None
            else joined.join(table, on=TARGET_KEY, how="full", coalesce=True)
        )
    names = list(tables)
    unpaired = joined.filter(pl.any_horizontal(pl.col(names).is_null()))
    other_item = joined.filter(
        pl.any_horizontal(pl.col(f"item_{i}") != pl.col("item_0") for i in range(1, len(names)))
    )
    if len(unpaired) or len(other_item):
        raise DataError(
            f"the tables do not hold the same {split} targets: {len(unpaired)} users have a "
            f"target in only some of them, {len(other_item)} another target item (e.g. "
            f"{pl.concat([unpaired, other_item])['user_id'].head(3).to_list()}): compare "
            "models evaluated on the same prepared data and split"
        )
    joined = joined.select(
        pl.mean_horizontal(n for n in names if n.split("[")[0] == side).alias(side)
        for side in sides
    )
    difference = joined["b"] - joined["a"]
    totals = MeanAccumulator()  # the means and standard errors evaluation reports, likewise
    columns = {"a": joined["a"], "b": joined["b"], "d": difference}
    totals.update({name: torch.tensor(v.to_numpy()) for name, v in columns.items()})
    means, errors = totals.compute(), totals.standard_errors()
    mean_a, mean_b = means["a"], means["b"]
    return {
        "targets": totals.count,
        "a": mean_a,
        "b": mean_b,
        "difference": mean_b - mean_a,
        "relative": mean_b / mean_a - 1 if mean_a else math.nan,
        "stderr": errors["d"],
        "ci95_low": mean_b - mean_a - 1.96 * errors["d"],
        "ci95_high": mean_b - mean_a + 1.96 * errors["d"],
        "unpaired_stderr": math.hypot(errors["a"], errors["b"]),
        "b_better": int((difference > 0).sum()),
        "a_better": int((difference < 0).sum()),
        "ties": int((difference == 0).sum()),
    }
