"""The prepare benchmark: its pandas reference agrees with recsys, and a tiny end-to-end run
measures each implementation after a warm-up run."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "1X"], "argument --sizes: size '1X': use e.g. 1M"),
        (["--sizes", "0"], "argument --sizes: size '0' is not a positive whole number"),
        (["--sizes", "1M,0.5"], "size '0.5' is not a positive whole number"),
        (["--pandas-sizes", "10Q"], "argument --pandas-sizes: size '10Q'"),
        (["--sizes", ","], "--sizes names no size"),
        (["--gen-workers", "0"], "--gen-workers 0 must be >= 1"),
        (["--max-rss-gib", "0"], "--max-rss-gib 0.0 must be a number > 0 (leave it out for 90"),
        (["--timeout", "0"], "--timeout 0.0 must be a number > 0 (leave it out for no time"),
    ],
)
def test_bad_sizes_and_workers_are_refused_by_name_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare_benchmark.main([*argv, "--generate-only", "--data-dir", "/nonexistent/x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_details_take_cpu_from_the_run_whose_wall_time_is_the_median(tmp_path, capsys, monkeypatch):
    """The details line's CPU and cores busy belong to the median run, not to whichever run
    came second: CPU of one run over the wall time of another is no core count."""
    runs = iter([(0.30, 0.30), (0.10, 0.15), (0.20, 0.40)])  # (wall s, CPU s) in run order

    def fake_measure(impl, events_dir, out_dir, **_):
        wall, cpu = next(runs)
        return {
            "impl": impl, "api": "fake", "wall_s": wall, "cpu_s": cpu, "peak_rss_gib": 0.1,
            "events_in": 5000, "events": 5000, "users_out": 10, "num_items": 20, "out_mib": 1.0,
            "step_seconds": None, "load_before": 0.0, "load_after": 0.0,
            "process_wall_s": 1.0, "sampled_rss_gib": 0.1,
        }  # fmt: skip

    monkeypatch.setattr(prepare_benchmark, "measure", fake_measure)
    monkeypatch.setattr(
        prepare_benchmark, "ensure_events", lambda data_dir, name, *_: data_dir / name
    )
    argv = ["--sizes", "5k", "--pandas-sizes", "", "--repeats", "3", "--warmup", "0",
            "--data-dir", str(tmp_path)]  # fmt: skip
    assert prepare_benchmark.main(argv) == 0
    out = capsys.readouterr().out
    assert "| 5k | 5,000 | recsys | 0.20 |" in out
    assert "- 5k recsys: CPU 0.4 s (2.00 cores busy)" in out


@pytest.mark.parametrize(
    ("impl", "modules"),
    [
        ("recsys", ["polars", "recsys.data"]),
        # pd.read_parquet of a folder goes through pyarrow.dataset
        ("pandas", ["pandas", "benchmarks.pandas_reference", "pyarrow.dataset"]),
    ],
)
def test_measured_jobs_import_their_code_before_the_clock_starts(impl, modules, tmp_path):
    """The README: imports happen before the clock starts, on both sides (a fresh process,
    as each measured job is: here they would be imported already)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from benchmarks import prepare_benchmark as pb\n"
        "def spy(source, out_dir):\n"
        f"    print([m for m in {modules!r} if m not in sys.modules])\n"
        "    return {}, 'spy'\n"
        f"pb.run_{impl} = spy\n"
        f"pb.run_one({impl!r}, Path({str(tmp_path)!r}), Path({str(tmp_path / 'out')!r}))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("prepare_benchmark", ["--generate-only", "--sizes", "1k"]),
        ("score_benchmark", ["--users", "0"]),
        ("train_benchmark", ["--epochs", "1"]),
        ("quality_suite", ["--list"]),
    ],
)
def test_a_json_file_in_a_missing_folder_is_refused_before_any_work(script, argv, tmp_path, capsys):
    """--json names its folder's absence when the command is parsed, not when the figures are
    written at the end of the work (FileNotFoundError after hours of a quality suite)."""
    import importlib

    main = importlib.import_module(f"benchmarks.{script}").main
    target = tmp_path / "absent" / "figures.json"
    data = ["--data-dir", str(tmp_path / "data")] if script == "prepare_benchmark" else []
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, *data, "--json", str(target)])
    assert exit_info.value.code == 2
    assert f"the folder {target.parent} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "absent").exists() and not any(
        p for p in tmp_path.iterdir() if p.name != "absent"
    )


def test_json_figures_replace_the_file_at_once(tmp_path, monkeypatch):
    """An interrupted write leaves the earlier figures whole (the quality suite rewrites its
    --json after every run, and reads a run folder's result.json back), and no stray file."""
    target = tmp_path / "runs.json"
    prepare_benchmark.write_json(target, [{"seed": 0}], indent=2)
    real_write = Path.write_text

    def interrupted(self, text, *args, **kwargs):
        real_write(self, text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_benchmark.write_json(target, [{"seed": 0}, {"seed": 1}], indent=2)
    monkeypatch.undo()
    assert json.loads(target.read_text()) == [{"seed": 0}]
    assert [p.name for p in tmp_path.iterdir()] == ["runs.json"]


def test_prepare_ab_refuses_no_pairs(tmp_path, capsys):
    from benchmarks import prepare_ab

    (tmp_path / "events_1M").mkdir()
    root = Path(prepare_benchmark.__file__).resolve().parents[1]
    with pytest.raises(SystemExit) as exit_info:
        prepare_ab.main(["--other", str(root), "--pairs", "0", "--data-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--pairs 0 must be >= 1" in capsys.readouterr().err


def test_the_gpu_check_exits_non_zero_naming_the_steps_that_failed(tmp_path):
    """benchmarks/gpu_check.sh is read from its exit status in a scripted device run: a step
    that fails (here the GPU main job on a machine without one, refused at once) makes it
    exit 1 and say which; an unknown step name is refused before anything runs."""
    import os
    import shutil
    import subprocess

    import torch

    if torch.cuda.is_available() or shutil.which("bash") is None:
        pytest.skip("needs a machine without a CUDA GPU, and bash")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"
    env = {**os.environ, "GPU_CHECK_STEPS": "main_job_gpu"}
    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"failed steps: main_job_gpu (logs in {tmp_path / 'logs'})" in done.stdout
    assert "no CUDA GPU" in (tmp_path / "logs" / "main_job_gpu.log").read_text()
    env["GPU_CHECK_STEPS"] = "main_job_tpu"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown step 'main_job_tpu'" in done.stderr
