"""Per-target tables (TargetRecords) and the paired comparison of two of them."""

import math

import polars as pl
import pytest
import torch

from recsys.data.io import DataError
from recsys.training.evaluation import TargetRecords, compare_per_target
from recsys.training.metrics import MISS_RANK, ranking_metrics


def table(values, split="test", users=(1, 2, 3, 4), items=(10, 11, 12, 13)):
    return pl.DataFrame(
        {
            "split": [split] * len(values),
            "user_id": list(users)[: len(values)],
            "item_id": list(items)[: len(values)],
            "retrieval_rank": [1] * len(values),
            "ndcg_at_10": values,
        }
    )


def test_paired_comparison_by_hand():
    a, b = table([0.0, 1.0, 0.5, 0.25]), table([1.0, 1.0, 0.0, 0.5])
    got = compare_per_target(a, b)
    diffs = [1.0, 0.0, -0.5, 0.25]
    mean = sum(diffs) / 4  # 0.1875
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    assert got["targets"] == 4
    assert got["a"] == pytest.approx(0.4375) and got["b"] == pytest.approx(0.625)
    assert got["difference"] == pytest.approx(mean)
    assert got["relative"] == pytest.approx(0.625 / 0.4375 - 1)
    assert got["stderr"] == pytest.approx(sd / 2)
    assert got["ci95_low"] == pytest.approx(mean - 1.96 * sd / 2)
    sd_a = math.sqrt(sum((v - 0.4375) ** 2 for v in [0.0, 1.0, 0.5, 0.25]) / 3)
    sd_b = math.sqrt(sum((v - 0.625) ** 2 for v in [1.0, 1.0, 0.0, 0.5]) / 3)
    assert got["unpaired_stderr"] == pytest.approx(math.hypot(sd_a, sd_b) / 2)
    assert (got["b_better"], got["a_better"], got["ties"]) == (2, 1, 1)


def test_tables_whose_ids_differ_only_in_type_are_compared():
    """A pandas table whose ``user_id`` is a ``category`` (or Int32) beside the written table's
    text (Int64) ids failed in the join with polars' bare SchemaError "datatypes of join keys
    don't match" (an audit's finding). Ids are compared as the prepared data types them: a
    category's values as text, narrower integers as Int64."""
    users = ("007", "7", "a", "b")
    a, b = table([0.0, 1.0, 0.5, 0.25], users=users), table([1.0, 1.0, 0.0, 0.5], users=users)
    expected = compare_per_target(a, b)
    assert compare_per_target(a.to_pandas().astype({"user_id": "category"}), b) == expected
    a, b = table([0.0, 1.0, 0.5, 0.25]), table([1.0, 1.0, 0.0, 0.5])
    expected = compare_per_target(a, b)
    narrow = a.with_columns(pl.col("user_id").cast(pl.Int32)).to_pandas()
    assert compare_per_target(narrow, b) == expected


def test_pairs_are_matched_by_user_not_by_row_order_and_users_select(tmp_path):
    a = table([0.0, 1.0, 0.5, 0.25])
    b = table([1.0, 1.0, 0.0, 0.5]).reverse().to_pandas()  # pandas, another row order
    a.write_parquet(tmp_path / "a.parquet")
    assert compare_per_target(tmp_path / "a.parquet", b)["difference"] == pytest.approx(0.1875)
    pl.DataFrame({"user_id": [1, 3]}).write_csv(tmp_path / "users.csv")
    some = compare_per_target(a, b, users=tmp_path / "users.csv")
    assert some["targets"] == 2 and some["difference"] == pytest.approx((1.0 - 0.5) / 2)
    assert compare_per_target(a, b, users=[2])["ties"] == 1


def test_users_may_be_frames_or_series_and_unmatched_ids_are_named(caplog):
    """A pandas frame of users was read as its column names, a polars one failed to cast,
    and a listed user without a target was left out without a word."""
    import pandas as pd

    a, b = table([0.0, 1.0, 0.5, 0.25]), table([1.0, 1.0, 0.0, 0.5])
    expected = compare_per_target(a, b, users=[1, 3])
    for users in (
        pd.DataFrame({"user_id": [1, 3]}),
        pd.DataFrame({"customer": [1, 3]}),  # its only column
        pl.DataFrame({"user_id": [1, 3], "segment": ["x", "y"]}),
        pd.Series([1, 3]),
        pl.Series([1, 3]),
        (1, 3),
    ):
        assert compare_per_target(a, b, users=users) == expected
    with pytest.raises(ValueError, match=r"columns \['id', 'segment'\], none of them 'user_id'"):
        compare_per_target(a, b, users=pd.DataFrame({"id": [1], "segment": ["x"]}))
    with caplog.at_level("WARNING", logger="recsys.training.evaluation"):
        assert compare_per_target(a, b, users=[1, 3, 99])["targets"] == 2
    assert "1 of the 3 users listed have no test target in the tables (e.g. [99])" in caplog.text
    caplog.clear()
    assert compare_per_target(a, b, users=[1.0, 3.0]) == expected
    with caplog.at_level("WARNING", logger="recsys.training.evaluation"):  # not user 3's
        assert compare_per_target(a, b, users=[1.0, 3.5])["targets"] == 1
    assert "1 of the 2 users listed have no test target in the tables (e.g. [3.5])" in caplog.text


def test_several_tables_on_a_side_are_averaged_target_by_target():
    """One table per training seed: each target's metric is their mean before pairing."""
    a = table([0.0, 1.0, 0.5, 0.25])
    seeds = [table([1.0, 1.0, 0.0, 0.5]), table([0.0, 1.0, 1.0, 0.5]).reverse()]
    got = compare_per_target(a, seeds)
    mean_b = table([0.5, 1.0, 0.5, 0.5])
    assert got == compare_per_target(a, mean_b)
    assert compare_per_target([a, a], seeds)["difference"] == pytest.approx(got["difference"])
    with pytest.raises(DataError, match=r"1 users have a target in only some of them"):
        compare_per_target(a, [seeds[0], seeds[1].head(3)])
    with pytest.raises(ValueError, match=r"metric='ndcg_at_10' is not a column of b\[1\]"):
        compare_per_target(a, [seeds[0], seeds[1].rename({"ndcg_at_10": "x"})])
    with pytest.raises(ValueError, match=r"b: an empty list of tables"):
        compare_per_target(a, [])


def test_tables_of_other_targets_splits_or_metrics_are_refused():
    a = table([0.0, 1.0, 0.5])
    with pytest.raises(
        DataError, match=r"1 users have a target in only some of them, 0 another target"
    ):
        compare_per_target(a, table([0.0, 1.0]))
    with pytest.raises(
        DataError, match=r"0 users have a target in only some of them, 3 another target"
    ):
        compare_per_target(a, table([0.0, 1.0, 0.5], items=(7, 8, 9)))
    both = pl.concat([a, table([0.0, 1.0, 0.5], split="val")])
    with pytest.raises(ValueError, match=r"splits \['test', 'val'\]: choose one with split="):
        compare_per_target(both, both)
    assert compare_per_target(both, both, split="val")["targets"] == 3
    with pytest.raises(ValueError, match=r"metric='hr_at_10' is not a column of a: choose from"):
        compare_per_target(a, a, "hr_at_10")
    with pytest.raises(DataError, match=r"a lacks column\(s\) \['item_id'\]"):
        compare_per_target(a.drop("item_id"), a)
    with pytest.raises(DataError, match=r"b holds 2 rows of the same split and user"):
        compare_per_target(a, pl.concat([a, a.head(1)]))
    with pytest.raises(DataError, match=r"is not a file: give the per-target file"):
        compare_per_target("missing.parquet", a)
    with pytest.raises(ValueError, match=r"none of the 1 users listed has a test target"):
        compare_per_target(a, a, users=[99])


def test_target_records_give_raw_ids_and_the_uncut_rank():
    """Rows in evaluation order; the rank read back from the uncut MRR, null when not ranked."""
    ranks = torch.tensor([1, 3, 2000, MISS_RANK])
    metrics = ranking_metrics(ranks, [10])
    values = {**metrics, **{f"retrieval_{k}": v for k, v in metrics.items()}}

    class Batch:
        user_index = torch.tensor([2, 0, 1, 3])
        target_item = torch.tensor([2, 3, 4, 5])  # item indices from NUM_RESERVED (2) on

    records = TargetRecords()
    records.update(Batch(), values)
    frame = records.frame(
        "val", pl.Series(["u0", "u1", "u2", "u3"]), pl.Series(["i0", "i1", "i2", "i3"])
    )
    assert frame["user_id"].to_list() == ["u2", "u0", "u1", "u3"]
    assert frame["item_id"].to_list() == ["i0", "i1", "i2", "i3"]
    assert frame["retrieval_rank"].to_list() == [1, 3, 2000, None]
    assert frame["hr_at_10"].to_list() == [1.0, 1.0, 0.0, 0.0]
    assert frame.columns.index("mrr") < frame.columns.index("retrieval_mrr")
    with pytest.raises(ValueError, match="no rows were evaluated"):
        TargetRecords().frame("val", pl.Series([]), pl.Series([]))


def test_the_command_prints_one_row_per_metric(tmp_path, capsys):
    from benchmarks import compare_targets

    for name, values in (("a", [0.0, 1.0, 0.5, 0.25]), ("b", [1.0, 1.0, 0.0, 0.5])):
        table(values).with_columns(hr_at_10=pl.col("ndcg_at_10") > 0).write_parquet(
            tmp_path / f"{name}.parquet"
        )
    argv = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--split", "test"]
    assert compare_targets.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| metric | targets | a | b | b − a (± paired SE)")
    assert lines[2].startswith("| ndcg_at_10 | 4 | 0.4375 | 0.6250 | +0.1875 ± ")
    assert lines[3].startswith("| hr_at_10 | 4 | 0.7500 | 0.7500 | +0.0000 ± ")
    assert lines[3].endswith("| 1 / 1 / 2 |")  # b hits user 1, a user 3


def test_the_command_averages_a_comma_separated_list(tmp_path, capsys):
    from benchmarks import compare_targets

    files = []
    for name, values in (("a", [0.0, 1.0]), ("b0", [1.0, 1.0]), ("b1", [0.0, 0.0])):
        table(values).write_parquet(tmp_path / f"{name}.parquet")
        files.append(str(tmp_path / f"{name}.parquet"))
    assert compare_targets.main([files[0], ",".join(files[1:]), "--metric", "ndcg_at_10"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith("| ndcg_at_10 | 2 | 0.5000 | 0.5000 | +0.0000 ± 0.5000 |")


def test_the_command_names_its_own_option_when_a_split_must_be_chosen(tmp_path, capsys):
    from benchmarks import compare_targets

    both = pl.concat([table([0.0, 1.0]), table([1.0, 0.0], split="val")])
    both.write_parquet(tmp_path / "a.parquet")
    with pytest.raises(SystemExit) as exit_info:  # a usage error, not a traceback
        compare_targets.main([str(tmp_path / "a.parquet")] * 2)
    assert exit_info.value.code == 2
    assert "choose one with split='val' (python -m benchmarks.compare_targets: --split val)" in (
        capsys.readouterr().err
    )


def test_a_split_of_few_targets_is_warned_about_with_the_resolution_of_its_metrics(caplog):
    """38 test targets: one hit moves HR@10 by 0.026, which nothing told the user."""
    from recsys.training.evaluation import MIN_EVALUATION_TARGETS, warn_of_few_targets

    stats = {"test_targets": 38, "test_targets_unknown_item": 0, "val_targets": 0}
    with caplog.at_level("WARNING", logger="recsys.training.evaluation"):
        warn_of_few_targets("test", stats, "skip")
    assert len(caplog.records) == 1
    assert "the test split has 38 targets (fewer than 100" in caplog.text
    assert "1/38 = 0.026" in caplog.text and "data.split.test_fraction" in caplog.text
    caplog.clear()
    enough = {"val_targets": MIN_EVALUATION_TARGETS - 1, "val_targets_unknown_item": 1}
    warn_of_few_targets("val", enough, "miss")  # the unknown-item ones count as misses: 100
    warn_of_few_targets("val", {"val_targets": MIN_EVALUATION_TARGETS}, "skip")
    warn_of_few_targets("val", stats, "skip")  # none at all: nothing to resolve
    assert not caplog.records
    warn_of_few_targets("val", enough, "skip")  # left out of the means: 99
    assert "the validation split has 99 targets" in caplog.text
