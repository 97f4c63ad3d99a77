"""The scoring benchmark runs end to end at a tiny size and reports each path's figures,
including what a job with a faiss index cache pays (figures are printed, never asserted on)."""

from __future__ import annotations

import json

import pytest

from benchmarks import score_benchmark


def test_tiny_run_reports_both_paths_and_the_cached_faiss_build(tmp_path, capsys):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    out = tmp_path / "scores.json"
    code = score_benchmark.main(
        ["--items", "2000", "--users", "64", "--batch-size", "32", "--json", str(out)]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "| build s | from cache s |" in table
    rows = {row["path"]: row for row in json.loads(out.read_text())["results"]}
    assert rows["exact"]["cached_build_s"] is None
    faiss = rows["faiss"]
    assert faiss["cached_build_s"] > 0 and faiss["build_s"] > 0 and 0 <= faiss["recall"] <= 1
    assert f"| 2k | faiss hnsw ef 128, l2 | {faiss['users_per_s']:,.0f} |" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--items", "10x"], "argument --items: size '10x': use e.g. 1M"),
        (["--items", "0"], "argument --items: size '0' is not a positive whole number"),
        (["--items", ","], "--items names no catalogue size"),
        (["--threads", "0"], "--threads 0 must be >= 1"),
    ],
)
def test_bad_sizes_and_threads_are_refused_by_name_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        score_benchmark.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
