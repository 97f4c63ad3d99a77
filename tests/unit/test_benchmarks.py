"""The prepare benchmark: its pandas reference agrees with recsys, and a tiny end-to-end run
measures each implementation after a warm-up run."""

from __future__ import annotations

import logging
import re

import pytest

from benchmarks import prepare_benchmark


def test_pandas_reference_matches_recsys_on_tiny_logs(tmp_path):
    # duplicates, timestamp ties, shuffled rows: both write the same folder
    assert prepare_benchmark.check(tmp_path)


@pytest.mark.slow
def test_benchmark_runs_a_warm_up_before_each_jobs_runs(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="benchmarks.prepare")
    code = prepare_benchmark.main(
        ["--sizes", "5k", "--pandas-sizes", "5k", "--repeats", "2", "--warmup", "1",
         "--data-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| 5k \| 5,000 \| (recsys|pandas) \| ([0-9.]+) \|", out, re.MULTILINE)
    assert [impl for impl, _ in rows] == ["recsys", "pandas"]
    assert all(float(wall) > 0 for _, wall in rows)
    assert "median of 2 run(s) after 1 uncounted warm-up run(s) of the same job" in out
    started = [
        (m.group(1), m.group(2))
        for m in (
            re.search(r"5k (\w+): (warm-up|run \d/\d) \.\.\.", r.message) for r in caplog.records
        )
        if m
    ]
    assert started == [
        ("recsys", "warm-up"), ("recsys", "run 1/2"), ("recsys", "run 2/2"),
        ("pandas", "warm-up"), ("pandas", "run 1/2"), ("pandas", "run 2/2"),
    ]  # fmt: skip
    assert not any(tmp_path.iterdir())  # without --keep-data nothing is left behind


def test_bad_repeat_counts_are_refused():
    with pytest.raises(SystemExit):
        prepare_benchmark.main(["--repeats", "0"])
    with pytest.raises(SystemExit):
        prepare_benchmark.main(["--warmup", "-1"])
