"""recsys' data preparation written plainly in pandas: the baseline of the benchmark.

The same steps and the same output folder as ``recsys.data.prepare`` with the settings the
benchmark uses (temporal split 80/10/10, ``min_user_events=2``, ``min_item_count=1``, bad rows
are errors, exact duplicates dropped), written the way a data scientist would write them:
``read_parquet``, ``drop_duplicates``, ``groupby`` / ``transform`` / ``agg(list)``. Correct,
not deliberately slow and not tuned. No polars and no recsys code is used here.

Output folder (the names recsys writes):

- ``sequences.parquet``: one row per user (ascending ``user_id``) with the list columns
  ``item`` (int32), ``behavior`` (int8), ``timestamp`` (int64 Unix seconds) and ``train_end``,
  ``val_target``, ``test_start``, ``test_target`` (int32; see ``recsys.data.split``);
- ``items.parquet`` (``item_id, index, attribute_indices, train_count``: an item's attribute
  set is ``[its category's index]``), ``attributes.parquet`` (``attribute, index``: the
  categories), ``behaviors.parquet`` (``index, behavior``);
- ``stats.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

BEHAVIORS = ("view", "click", "cart", "purchase")
UNK = 1  # index 0 is PAD, 1 is UNK in every vocabulary; real entries start at 2
EPOCH = pd.Timestamp(0, tz="UTC")

SEQUENCES_SCHEMA = pa.schema(
    [
        ("user_id", pa.int64()),
        ("item", pa.list_(pa.int32())),
        ("behavior", pa.list_(pa.int8())),
        ("timestamp", pa.list_(pa.int64())),
        ("train_end", pa.int32()),
        ("val_target", pa.int32()),
        ("test_start", pa.int32()),
        ("test_target", pa.int32()),
    ]
)
ITEMS_SCHEMA = pa.schema(
    [
        ("item_id", pa.int64()),
        ("index", pa.int32()),
        ("attribute_indices", pa.list_(pa.int32())),
        ("train_count", pa.int64()),
    ]
)


def prepare_pandas(
    source: str | Path | pd.DataFrame,
    out_dir: str | Path,
    *,
    behaviors: tuple[str, ...] = BEHAVIORS,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    min_user_events: int = 2,
    min_item_count: int = 1,
) -> dict:
    """Prepare the event log ``source`` (a Parquet file or folder, or a frame with the columns
    ``user_id, item_id, category, event_type, timestamp``) into ``out_dir``; return the stats."""
    out_dir = Path(out_dir)
    steps: dict[str, float] = {}  # seconds per step, reported in the stats
    clock = [time.perf_counter()]

    def lap(step: str) -> None:
        now = time.perf_counter()
        steps[step] = now - clock[0]
        clock[0] = now

    # 1. read -------------------------------------------------------------------------------
    if isinstance(source, pd.DataFrame):
        df = source.copy()
    else:
        df = pd.read_parquet(source, engine="pyarrow")
    df = df[["user_id", "item_id", "category", "event_type", "timestamp"]]
    rows_read = len(df)
    if rows_read == 0:
        raise ValueError(f"{source}: the event log has no rows")

    lap("read")

    # 2. validate: every kind of bad row is an error --------------------------------------------
    if not isinstance(df["timestamp"].dtype, pd.DatetimeTZDtype):
        df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True)
    df["timestamp"] = df["timestamp"].dt.tz_convert("UTC").astype("datetime64[us, UTC]")
    problems = []
    for column in ("user_id", "item_id"):
        n = int(df[column].isna().sum())
        if n:
            problems.append(f"{n} row(s) with a null {column}")
    n = int(df["timestamp"].isna().sum())
    if n:
        problems.append(f"{n} row(s) without a timestamp")
    n = int((df["timestamp"] < EPOCH).sum())
    if n:
        problems.append(f"{n} row(s) with a timestamp before 1970-01-01")
    n = int((df["timestamp"] > pd.Timestamp.now(tz="UTC")).sum())
    if n:
        problems.append(f"{n} row(s) with a timestamp in the future")
    unknown = ~df["event_type"].isin(behaviors)
    if unknown.any():
        names = sorted(df.loc[unknown, "event_type"].astype(str).unique()[:10])
        problems.append(
            f"{int(unknown.sum())} row(s) with an event type outside {behaviors}: {names}"
        )
    if problems:
        raise ValueError(f"{source}: bad rows, nothing was written: " + "; ".join(problems))

    lap("validate")

    # 3. drop exact duplicates (same user, item, event type and time), keeping the first ---------
    df = df.drop_duplicates(subset=["user_id", "item_id", "event_type", "timestamp"], keep="first")
    deduped_rows = len(df)
    deduped_users = df["user_id"].nunique()

    lap("dedupe")

    # 4. users need an input and a target ---------------------------------------------------------
    user_events = df.groupby("user_id")["item_id"].transform("size")
    df = df[user_events >= min_user_events]

    lap("min_user_events")

    # 5. each user's history in time order (stable: equal times keep their input order) ---------
    df = df.sort_values(["user_id", "timestamp"], kind="stable").reset_index(drop=True)
    df["position"] = df.groupby("user_id").cumcount()

    lap("sort")

    # 6. temporal split: two global cut times, then positions per user --------------------------
    val_cut = df["timestamp"].quantile(1.0 - val_fraction - test_fraction, interpolation="lower")
    test_cut = df["timestamp"].quantile(1.0 - test_fraction, interpolation="lower")
    df["in_train"] = df["timestamp"] < val_cut
    in_val = (df["timestamp"] >= val_cut) & (df["timestamp"] < test_cut)
    in_test = df["timestamp"] >= test_cut
    has_history = df["position"] >= 1

    df["before_test"] = ~in_test
    users = df.groupby("user_id").agg(
        train_end=("in_train", "sum"), test_start=("before_test", "sum")
    )
    users["val_target"] = df[in_val & has_history].groupby("user_id")["position"].min()
    users["test_target"] = df[in_test & has_history].groupby("user_id")["position"].min()
    users = users.fillna(-1).astype("int32")

    lap("split")

    # 7. vocabularies, fitted on the training events only ------------------------------------------
    df["train_end"] = df.groupby("user_id")["in_train"].transform("sum")
    train = df[df["position"] < df["train_end"]]
    items = train.groupby("item_id").size().rename("train_count").reset_index()
    items = items[items["train_count"] >= min_item_count]
    # each item's most frequent training category (ties: the smallest name)
    item_categories = (
        train.dropna(subset=["category"])
        .groupby(["item_id", "category"])
        .size()
        .rename("n")
        .reset_index()
        .sort_values(["item_id", "n", "category"], ascending=[True, False, True])
        .drop_duplicates("item_id")
        .set_index("item_id")["category"]
    )
    items["category"] = items["item_id"].map(item_categories)
    items = items.sort_values(["train_count", "item_id"], ascending=[False, True])
    items = items.reset_index(drop=True)
    items["index"] = np.arange(2, len(items) + 2, dtype="int32")

    # categories ("attributes" in recsys' vocabulary) indexed by the summed training count of
    # their items; each item carries the list [its category's index] ([UNK] without one)
    categories = items.dropna(subset=["category"]).groupby("category")["train_count"].sum()
    categories = categories.reset_index().sort_values(
        ["train_count", "category"], ascending=[False, True]
    )
    categories["index"] = np.arange(2, len(categories) + 2, dtype="int32")
    category_index = categories.set_index("category")["index"]
    items["category_index"] = items["category"].map(category_index).fillna(UNK).astype("int32")
    items["attribute_indices"] = [[i] for i in items["category_index"]]
    lap("vocab")

    # 8. encode ---------------------------------------------------------------------------------
    item_index = items.set_index("item_id")["index"]
    df["item"] = df["item_id"].map(item_index).fillna(UNK).astype("int32")
    behavior_index = {name: 2 + i for i, name in enumerate(behaviors)}
    df["behavior"] = df["event_type"].map(behavior_index).astype("int8")
    df["seconds"] = (df["timestamp"] - EPOCH) // pd.Timedelta(seconds=1)

    # a target whose item is not in the training vocabulary cannot be ranked: set aside (-1)
    unknown_targets = {}
    for column in ("val_target", "test_target"):
        target_position = df["user_id"].map(users[column])
        target_rows = df[df["position"] == target_position]
        unknown_users = target_rows.loc[target_rows["item"] == UNK, "user_id"]
        unknown_targets[f"{column}s_unknown_item"] = len(unknown_users)
        users.loc[unknown_users, column] = -1

    lap("encode")

    # 9. one row per user -------------------------------------------------------------------------
    sequences = df.groupby("user_id", sort=True).agg(
        item=("item", list), behavior=("behavior", list), timestamp=("seconds", list)
    )
    sequences = sequences.join(users).reset_index()

    lap("sequences")

    stats = {
        "source": str(source) if not isinstance(source, pd.DataFrame) else "<pandas frame>",
        "rows_read": rows_read,
        "duplicates_removed": rows_read - deduped_rows,
        "users_below_min_events": deduped_users - len(users),
        "events_of_users_below_min_events": deduped_rows - len(df),
        "events": len(df),
        "users": len(sequences),
        "train_events": int(users["train_end"].sum()),
        "val_targets": int((sequences["val_target"] >= 0).sum()),
        "test_targets": int((sequences["test_target"] >= 0).sum()),
        **unknown_targets,
        "num_items": 2 + len(items),
        "num_categories": 2 + len(categories),
        "num_behaviors": 2 + len(behaviors),
        "split": {"val_start": val_cut.isoformat(), "test_start": test_cut.isoformat()},
    }

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    sequences.to_parquet(out_dir / "sequences.parquet", schema=SEQUENCES_SCHEMA, index=False)
    items[["item_id", "index", "attribute_indices", "train_count"]].to_parquet(
        out_dir / "items.parquet", schema=ITEMS_SCHEMA, index=False
    )
    categories[["category", "index"]].rename(columns={"category": "attribute"}).to_parquet(
        out_dir / "attributes.parquet", index=False
    )
    pd.DataFrame(
        {"index": np.arange(2, 2 + len(behaviors), dtype="int32"), "behavior": list(behaviors)}
    ).to_parquet(out_dir / "behaviors.parquet", index=False)
    lap("write")
    stats["step_seconds"] = steps
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats
