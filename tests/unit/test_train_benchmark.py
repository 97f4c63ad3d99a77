"""benchmarks/train_benchmark.py: a tiny CPU run prints its table and writes its figures."""

from __future__ import annotations

import json

import pytest

from benchmarks import train_benchmark


def test_a_tiny_cpu_run_reports_each_epoch_and_its_steady_speed(tmp_path, capsys):
    out = tmp_path / "figures.json"
    code = train_benchmark.main(
        [
            "--epochs",
            "3",
            "--json",
            str(out),
            "data.source.num_users=120",
            "data.source.num_items=80",
            "data.source.num_categories=8",
        ]
    )
    assert code == 0
    (row,) = json.loads(out.read_text())
    assert row["accelerator"] == "cpu" and row["precision"] == "32-true"
    assert row["epochs"] == 3 and len(row["epoch_seconds"]) == 3
    assert all(s > 0 for s in row["epoch_seconds"])
    steady = sorted(row["epoch_seconds"][1:])
    assert row["median_epoch_seconds"] == pytest.approx(sum(steady) / 2)
    assert row["train_events"] > 0
    assert row["events_per_second"] == pytest.approx(
        row["train_events"] / row["median_epoch_seconds"]
    )
    assert 0 <= row["val_ndcg_at_10"] <= 1
    table = capsys.readouterr().out
    assert "| cpu | on | 32-true | 3 |" in table and "| 1.00x |" in table


def test_epoch_seconds_come_from_the_clocks_running_total():
    history = [{"train_seconds": 2.0}, {"train_seconds": 3.5}, {"train_seconds": 4.0}]
    assert train_benchmark.epoch_seconds(history) == [2.0, 1.5, 0.5]


def test_step_summary_splits_each_epoch_by_shapes_new_to_the_run():
    steps = [(0, (4, 8), 0.5), (0, (4, 8), 0.1), (0, (4, 16), 0.4), (1, (4, 16), 0.1)]
    steps += [(1, (2, 16), 0.3)]
    assert train_benchmark.step_summary(steps) == [
        {"epoch": 0, "new_steps": 2, "new_s": 0.9, "seen_steps": 1, "seen_s": 0.1},
        {"epoch": 1, "new_steps": 1, "new_s": 0.3, "seen_steps": 1, "seen_s": 0.1},
    ]


@pytest.mark.parametrize("multiple", [1, 8])
def test_step_times_count_every_training_step_and_see_the_width_multiple(
    tmp_path, capsys, multiple
):
    out = tmp_path / "figures.json"
    data = ["data.source.num_users=80", "data.source.num_items=40", "data.max_seq_len=13"]
    argv = ["--epochs", "2", "--step-times", "--json", str(out), *data]
    assert train_benchmark.main([*argv, f"data.loader.width_multiple={multiple}"]) == 0
    (row,) = json.loads(out.read_text())
    epochs = row["steps"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert len({e["new_steps"] + e["seen_steps"] for e in epochs}) == 1  # the same batches
    assert epochs[0]["new_steps"] >= 1  # the first step's shape at least
    widths = {shape[1] for _, shape, _ in train_benchmark.STEPS}
    assert widths <= ({8, 13} if multiple == 8 else set(range(1, 14)))
    assert "training steps by batch shape" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epochs", "1"], "--epochs must be >= 2"),
        (["--accelerators", "tpu"], "tpu"),
        (["--cpu-chunks", "maybe"], "on, off"),
    ],
)
def test_bad_options_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_benchmark.main(argv)
    assert message in capsys.readouterr().err


def test_cpu_chunks_off_is_one_runs_setting_only(tmp_path, monkeypatch):
    from recsys import allocation
    from recsys.training import module

    seen = []
    real = module.SeqRecModule._full_softmax_rows

    def spy(self, *args, **kwargs):
        seen.append(allocation.MMAP_THRESHOLD_MAX)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(module.SeqRecModule, "_full_softmax_rows", spy)
    before = allocation.MMAP_THRESHOLD_MAX
    out = tmp_path / "figures.json"
    tiny = ["data.source.num_users=60", "data.source.num_items=40", "data.source.num_categories=4"]
    assert (
        train_benchmark.main(["--cpu-chunks", "off,on", "--epochs", "2", "--json", str(out), *tiny])
        == 0
    )
    assert [r["cpu_chunks"] for r in json.loads(out.read_text())] == ["off", "on"]
    assert before == allocation.MMAP_THRESHOLD_MAX  # restored
    assert set(seen) == {2**62, before}


def test_the_allocation_benchmark_times_each_setting_of_both_measurements(capsys):
    from benchmarks import allocation_benchmark

    small = ["--repeats", "1", "--rows", "600", "--loss-items", "50", "--users", "8"]
    settings = {  # tables this small stay under the threshold: cpu_chunk_length keeps them
        "loss": ["one table", "cpu_chunk_length: 600 rows", "2048 rows", "1024 rows"],
        "search": ["65536 items (cpu_chunk_length)", "16384 items", "4096 items"],
    }
    for only, names in settings.items():
        assert allocation_benchmark.main([*small, "--search-items", "3000", "--only", only]) == 0
        rows = [r.split("|") for r in capsys.readouterr().out.strip().splitlines()]
        assert [r[1].strip() for r in rows] == [allocation_benchmark.MEASUREMENTS[only]] * len(
            names
        )
        assert [r[2].strip() for r in rows] == names
        assert all(float(r[3]) >= 0 and float(r[4].replace(",", "")) >= 0 for r in rows)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "0"], "--rows 0 must be >= 1"),
        (["--search-items", "-5"], "--search-items -5 must be >= 1"),
        (["--repeats", "0"], "--repeats 0 must be >= 1"),
        (["--setting", "whole"], "--setting whole goes with --only evaluation"),
        (["--only", "loss", "--setting", "whole"], "goes with --only evaluation"),
    ],
)
def test_the_allocation_benchmark_refuses_bad_options_by_name(argv, message, capsys):
    from benchmarks import allocation_benchmark

    with pytest.raises(SystemExit) as exit_info:
        allocation_benchmark.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_allocation_benchmarks_evaluation_alone_names_its_setting(capsys):
    """--only evaluation without --setting measures the chunked tables and says so."""
    from benchmarks import allocation_benchmark

    small = ["--repeats", "1", "--users", "4", "--eval-items", "100", "--only", "evaluation"]
    assert allocation_benchmark.main(small) == 0
    (row,) = capsys.readouterr().out.strip().splitlines()
    assert row.split("|")[2].strip().startswith("chunked: tables of 4 rows")
