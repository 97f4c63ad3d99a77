"""The model-quality suite: its table, its argument checks, and one real run end to end."""

from __future__ import annotations

import json
import tempfile

import polars as pl
import pytest
import torch

from benchmarks import quality_suite
from tests.conftest import SHARED_DATA

BEAUTY = SHARED_DATA / "amazon-s3rec" / "raw" / "Beauty.txt.gz"


def fake_result(model: str, seed: int, ndcg: float, hr: float, reached: float | None) -> dict:
    test = {"test/ndcg_at_10": ndcg, "test/hr_at_10": hr}
    for baseline, value in (("popularity", 0.0056), ("transition", 0.0443)):
        test[f"test/{baseline}_ndcg_at_10"] = value
        test[f"test/{baseline}_hr_at_10"] = 2 * value
    return {
        "dataset": "beauty",
        "model": model,
        "seed": seed,
        "command": f"python -m pipelines.run experiment=beauty model=sasrec seed={seed} "
        "logger=none trainer.enable_progress_bar=false callbacks.training_clock.test_curve=true",
        "test": test,
        "train_seconds": 600.0 + 60 * seed,
        "seconds_to_recbole_ndcg": reached,
    }


def shared_beauty(folder):
    """``folder`` as $RECSYS_SHARED_DATA holding (empty) Beauty files: the suite may start."""
    raw = folder / "amazon-s3rec" / "raw"
    raw.mkdir(parents=True)
    for name in ("Beauty.txt.gz", "Beauty_item2attributes.json.gz"):
        (raw / name).touch()
    return folder


def rows(markdown: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in markdown.splitlines()
        if line.startswith("| beauty")
    ]


def test_table_shows_mean_and_spread_over_seeds_and_the_baselines_once():
    results = [
        fake_result("sasrec_ce", 0, 0.05, 0.08, reached=300.0),
        fake_result("sasrec_ce", 1, 0.06, 0.10, reached=420.0),
        fake_result("atrank", 0, 0.04, 0.07, reached=None),
        *(
            fake_result("atrank_low_pass", s, 0.05, 0.09, reached=r)
            for s, r in enumerate([600.0, None, 540.0])
        ),
    ]
    table = rows(quality_suite.table(results))
    assert [row[1] for row in table] == [
        "popularity",
        "first-order transition (PROTOCOLS.md)",
        "SASRec+ (full-softmax CE)",
        "ATRank, modern preset (CE, attributes, behaviours)",
        "ATRank, modern preset + BSARec's low-pass branch (alpha 0.7, c 5)",
    ]
    popularity, _, sasrec, atrank, low_pass = table
    assert popularity[4:7] == ["0.0112", "0.0056", "0.0056 (PROTOCOLS.md, P1)"]
    # two seeds: mean ± sample standard deviation; minutes are means over seeds
    assert sasrec[3:6] == ["2", "0.0900 ± 0.0141", "0.0550 ± 0.0071"]
    assert sasrec[7:9] == ["10.5", "6.0"]
    assert sasrec[9] == "`experiment=beauty model=sasrec`"  # the suite's bookkeeping is left out
    assert atrank[3:6] == ["1", "0.0700", "0.0400"]
    assert atrank[8] == "not reached"
    # some seeds reached it: each one's minutes, and how many
    assert low_pass[8] == "9.0, 10.0 (2 of 3 seeds; the others never)"


def test_a_variant_compares_with_the_published_number_of_its_model():
    results = [
        fake_result("atrank_bsarec", 0, 0.06, 0.10, reached=None),
        fake_result("atrank_bsarec_ema", 0, 0.06, 0.10, reached=None),
    ]
    *_, plain, averaged = rows(quality_suite.table(results))
    assert averaged[6] == plain[6] == "0.0611 (BSARec repo, P1, one run)"
    kang, s3rec = rows(
        quality_suite.table(
            [
                fake_result("sasrec_bce", 0, 0.06, 0.03, reached=None),
                fake_result("sasrec_bce_s3rec", 0, 0.06, 0.03, reached=None),
            ]
        )
    )[-2:]
    assert s3rec[6] == kang[6] == "0.0318 (S3-Rec paper, P1)"


def test_table_names_the_loss_the_run_trained_with():
    """An experiment config can swap the loss (Taobao's CE rows use a sampled softmax): the row
    says so; a JSON from before the ``loss`` field keeps the model's label."""
    sampled = {**fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None), "loss": "sampled_softmax"}
    full = {**fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None), "loss": "full_softmax"}
    assert rows(quality_suite.table([sampled]))[-1][1] == "SASRec+ (sampled-softmax CE)"
    assert rows(quality_suite.table([full]))[-1][1] == "SASRec+ (full-softmax CE)"


def test_table_states_what_the_run_did_with_unrankable_targets():
    """The protocol column names ``training.unknown_targets`` as the run recorded it; a JSON
    from before the field keeps the dataset's protocol as it is."""
    base = fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None)
    for policy, words in (
        ("miss", "counted as misses (S3-Rec family)"),
        ("skip", "left out of the means"),
    ):
        table = rows(quality_suite.table([{**base, "unknown_targets": policy}]))
        expected = f"P1: leave-one-out, all items, history scored 0, unknown-item targets {words}"
        assert [row[2] for row in table] == [expected] * 3  # the baselines' rows as well
    assert rows(quality_suite.table([base]))[-1][2] == quality_suite.P1


def test_table_of_runs_without_a_training_clock_leaves_their_minutes_out():
    """``callbacks.training_clock=null`` records no training time (``train_seconds`` None):
    the row shows none instead of the table failing after every run has trained."""
    timed = fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None)
    untimed = {**fake_result("atrank", 0, 0.05, 0.08, reached=None), "train_seconds": None}
    *_, sasrec, atrank = rows(quality_suite.table([timed, untimed]))
    assert (sasrec[7], atrank[7]) == ("10.0", "—")


def test_a_failed_seed_is_counted_and_named_never_averaged_away(tmp_path, capsys):
    """A run that failed stays in its row's seed count, its error goes below the table, an
    entry whose every seed failed shows no number, and the table's exit status is 1."""
    failed = {
        key: fake_result("sasrec_ce", 1, 0, 0, None)[key] for key in ("dataset", "seed", "command")
    }
    failed.update(model="sasrec_ce", error="FloatingPointError: diverged at epoch 3")
    runs = [
        fake_result("sasrec_ce", 0, 0.05, 0.08, reached=300.0),
        failed,
        fake_result("sasrec_ce", 2, 0.06, 0.10, reached=420.0),
        {**failed, "model": "atrank", "seed": 0, "error": "RuntimeError: out of memory"},
    ]
    markdown = quality_suite.table(runs)
    popularity, _, sasrec, atrank = rows(markdown)
    assert popularity[4:6] == ["0.0112", "0.0056"]  # from a run that finished
    assert sasrec[3:6] == ["2 of 3 (seed 1 failed)", "0.0900 ± 0.0141", "0.0550 ± 0.0071"]
    assert sasrec[7:9] == ["11.0", "6.0"]  # the finished seeds' minutes
    assert atrank[3:6] == ["0 of 1 (seed 0 failed)", "failed", "failed"]
    assert atrank[7:9] == ["—", "—"]  # no minutes, no time to RecBole's figure
    assert "- failed: beauty / sasrec_ce / seed 1: FloatingPointError: diverged" in markdown
    assert "- failed: beauty / atrank / seed 0: RuntimeError: out of memory" in markdown

    saved = tmp_path / "runs.json"
    saved.write_text(json.dumps(runs))
    assert quality_suite.main(["--table-from", str(saved)]) == 1
    assert "0 of 1 (seed 0 failed)" in capsys.readouterr().out


def test_a_run_that_fails_does_not_stop_the_suite(monkeypatch, tmp_path, capsys):
    """Training raising an error in one run: the suite goes on to the next seed, prints the
    table with the failures, keeps them in --json and exits with status 1; nothing of a failed
    run is kept as finished, so the same command with --work-dir runs it again."""
    from recsys.tasks import train

    calls = []

    def diverging(cfg, **kwargs):
        calls.append(cfg.seed)
        raise FloatingPointError(f"seed {cfg.seed}: the loss is nan")

    monkeypatch.setattr(train, "run", diverging)
    monkeypatch.setenv("RECSYS_SHARED_DATA", str(shared_beauty(tmp_path)))
    report = tmp_path / "runs.json"
    argv = ["--datasets", "beauty", "--models", "sasrec_ce", "--seeds", "2",
            "--work-dir", str(tmp_path / "work"), "--json", str(report)]  # fmt: skip
    assert quality_suite.main(argv) == 1
    assert calls == [0, 1]
    (*_, row) = rows(capsys.readouterr().out)
    assert row[3:6] == ["0 of 2 (seed 0, 1 failed)", "failed", "failed"]
    saved = json.loads(report.read_text())
    assert [(r["seed"], r["error"]) for r in saved] == [
        (0, "FloatingPointError: seed 0: the loss is nan"),
        (1, "FloatingPointError: seed 1: the loss is nan"),
    ]
    assert not list((tmp_path / "work").glob(f"*/{quality_suite.RESULT_FILE}"))


def test_table_from_saved_runs_merges_the_files(tmp_path, capsys):
    first, second = tmp_path / "seed0.json", tmp_path / "seeds12.json"
    first.write_text(json.dumps([fake_result("sasrec_ce", 0, 0.05, 0.08, reached=300.0)]))
    second.write_text(
        json.dumps([fake_result("sasrec_ce", s, 0.06, 0.10, reached=420.0) for s in (1, 2)])
    )
    assert quality_suite.main(["--table-from", str(first), str(second)]) == 0
    (*_, sasrec) = rows(capsys.readouterr().out)
    assert sasrec[3:6] == ["3", "0.0933 ± 0.0115", "0.0567 ± 0.0058"]


def test_table_from_keeps_runs_of_other_protocols_and_recipes_apart(tmp_path, capsys):
    """A row averages seeds of one recipe under one protocol: runs that left unknown-item
    targets out, or ran other overrides, get rows of their own, never one mean."""
    miss = {**fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None), "unknown_targets": "miss"}
    skip = {**fake_result("sasrec_ce", 1, 0.07, 0.12, reached=None), "unknown_targets": "skip"}
    patience = {**fake_result("sasrec_ce", 2, 0.09, 0.16, reached=None), "unknown_targets": "miss"}
    patience["command"] += " callbacks.early_stopping.patience=5"
    for name, run in (("miss", miss), ("skip", skip), ("patience", patience)):
        (tmp_path / f"{name}.json").write_text(json.dumps([run]))
    files = [str(tmp_path / f"{name}.json") for name in ("miss", "skip", "patience")]
    assert quality_suite.main(["--table-from", *files]) == 0
    table = [row for row in rows(capsys.readouterr().out) if row[1].startswith("SASRec+")]
    assert [(row[2].rsplit(", ", 1)[-1], row[3], row[5], row[9]) for row in table] == [
        ("unknown-item targets counted as misses (S3-Rec family)", "1", "0.0500",
         "`experiment=beauty model=sasrec`"),
        ("unknown-item targets left out of the means", "1", "0.0700",
         "`experiment=beauty model=sasrec`"),
        ("unknown-item targets counted as misses (S3-Rec family)", "1", "0.0900",
         "`experiment=beauty model=sasrec callbacks.early_stopping.patience=5`"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "pass a file written by --json"),
        ('{"dataset": "beauty"}', "not a list of runs"),
        (None, "beauty / sasrec_ce / seed 0 is in both"),
        # (a KeyError after the files were read: the table looks up the published number)
        ("tiny", "dataset 'tiny' is not one of the suite's"),
    ],
)
def test_table_from_refuses_what_it_cannot_count(content, message, tmp_path, capsys):
    path = tmp_path / "runs.json"
    run = json.dumps([fake_result("sasrec_ce", 0, 0.05, 0.08, reached=None)])
    if content == "tiny":
        content = run.replace('"beauty"', '"tiny"')
    path.write_text(run if content is None else content)
    with pytest.raises(SystemExit) as exit_info:
        quality_suite.main(["--table-from", str(path), str(path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_first_seed_shifts_the_seeds_of_every_entry(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_run_one(dataset, model, seed, work, extra):
        calls.append((dataset, model.name, seed))
        return fake_result(model.name, seed, 0.05, 0.08, reached=None)

    monkeypatch.setattr(quality_suite, "run_one", fake_run_one)
    monkeypatch.setenv("RECSYS_SHARED_DATA", str(shared_beauty(tmp_path)))
    argv = ["--datasets", "beauty", "--models", "sasrec_ce", "--seeds", "2", "--first-seed", "1"]
    assert quality_suite.main(argv) == 0
    assert calls == [("beauty", "sasrec_ce", 1), ("beauty", "sasrec_ce", 2)]
    with pytest.raises(SystemExit):
        quality_suite.main([*argv[:4], "--seeds", "0"])
    assert "pass at least one seed" in capsys.readouterr().err


def test_missing_data_files_are_named_before_any_run(monkeypatch, tmp_path, capsys):
    """The shared folder exists but one dataset's files do not: the suite names each missing
    file before training anything (not after the datasets before it have trained)."""
    calls = []
    monkeypatch.setattr(quality_suite, "run_one", lambda *args: calls.append(args))
    monkeypatch.setenv("RECSYS_SHARED_DATA", str(shared_beauty(tmp_path)))
    argv = ["--datasets", "beauty,ml1m", "--models", "sasrec_ce", "--seeds", "1"]
    assert quality_suite.main(argv) == 2
    err = capsys.readouterr().err
    ml1m = tmp_path / "movielens-1m"
    assert f"{ml1m}/sasrec_ml1m_interactions.parquet not found (experiment=ml1m)" in err
    assert f"{ml1m}/raw/movies.dat.gz not found (experiment=ml1m)" in err
    assert "Beauty" not in err and "leave those datasets out with --datasets" in err
    assert calls == []
    # the same check reports overrides that do not compose, before any run
    with pytest.raises(SystemExit) as exit_info:
        quality_suite.main([*argv[:1], "beauty", *argv[2:], "no_such_key=1"])
    assert exit_info.value.code == 2
    assert "experiment=beauty with the overrides ['no_such_key=1']" in capsys.readouterr().err
    assert calls == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "beuaty"], "unknown dataset 'beuaty': choose from"),
        (["--models", "popularity"], "--models popularity: name a trained model"),
        (["--models", "sasrec"], "unknown model 'sasrec': choose from"),
    ],
)
def test_unknown_names_are_refused_with_the_choices(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        quality_suite.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_list_names_each_run_and_its_overrides(capsys):
    assert quality_suite.main(["--list", "--datasets", "toys", "--models", "sasrec_bce"]) == 0
    out = capsys.readouterr().out.split()
    assert out[:3] == ["toys", "sasrec_bce", "experiment=toys"]
    assert "training.loss=bce" in out and "training.num_negatives=1" in out


@pytest.mark.parametrize("dataset", list(quality_suite.DATASETS))
def test_every_entry_composes_and_selects_on_its_metric(dataset, tmp_path):
    """Each (dataset, model) config resolves; Taobao selects on val/mrr (its ~50 validation
    targets leave NDCG@10 at 0.0 for the first epochs), SASRec as S3-Rec builds it on the
    S3-Rec files on val/ndcg_at_20 (S3-Rec's trainer), the rest on val/ndcg_at_10."""
    from omegaconf import OmegaConf

    s3rec_files = dataset in ("beauty", "sports", "toys")
    for name, model in quality_suite.MODELS.items():
        if name in quality_suite.BASELINES:
            continue
        if dataset == "taobao":
            monitor = "val/mrr"
        elif name == "sasrec_bce_s3rec" and s3rec_files:
            monitor = "val/ndcg_at_20"
        else:
            monitor = "val/ndcg_at_10"
        cfg, _ = quality_suite.compose(dataset, model, 0, tmp_path / "run", [])
        OmegaConf.resolve(cfg)
        assert cfg.callbacks.model_checkpoint.monitor == monitor, name
        assert cfg.callbacks.early_stopping.monitor == monitor, name


@pytest.mark.slow
@pytest.mark.skipif(
    not BEAUTY.exists(), reason=f"{BEAUTY} is absent (real datasets live in ../shared/data)"
)
def test_one_real_run_end_to_end_leaves_no_temporary_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the suite's default work folder
    report = tmp_path / "runs.json"
    argv = ["--datasets", "beauty", "--models", "sasrec_ce", "--seeds", "1",
            "--json", str(report), "trainer.max_epochs=1"]  # fmt: skip
    assert quality_suite.main(argv) == 0
    (result,) = json.loads(report.read_text())
    assert result["epochs"] == 1 and result["train_seconds"] > 0
    assert result["loss"] == "full_softmax"
    assert 0 < result["test"]["test/ndcg_at_10"] < 1
    # the baselines' published numbers are reproduced by every run (split and metric checks)
    assert result["test"]["test/popularity_ndcg_at_10"] == pytest.approx(0.0056, abs=0.0003)
    assert result["test"]["test/transition_ndcg_at_10"] == pytest.approx(0.0443, abs=0.0003)
    table = rows(capsys.readouterr().out)
    assert [row[1] for row in table][-1] == "SASRec+ (full-softmax CE)"
    # (torch may put its own cache there, torchinductor_<user>, when it is first imported here)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("recsys-quality-")] == []
    assert (tmp_path / "runs.json").exists()


def test_a_kept_run_is_read_back_when_finished_and_continued_when_interrupted(
    tmp_path, monkeypatch
):
    """--work-dir: the same command again reads a finished run's result, continues an
    interrupted one from its last epoch (here: stopped between training and evaluation), and
    refuses a folder started with other settings."""
    from recsys.tasks import evaluate, train

    model, extra = quality_suite.MODELS["sasrec_ce"], ["logger=none", "trainer.max_epochs=1"]
    real_evaluate = evaluate.run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quality_suite.run_one("tiny", model, 0, tmp_path, extra)
    run_dir = tmp_path / "tiny-sasrec_ce-0"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert not (run_dir / quality_suite.RESULT_FILE).exists()
    first_clock = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)

    monkeypatch.setattr(evaluate, "run", real_evaluate)
    per_target = run_dir / quality_suite.PER_TARGET_FILE
    per_target.write_bytes(b"from an evaluation stopped before the result was written")
    result = quality_suite.run_one("tiny", model, 0, tmp_path, extra)
    targets = pl.read_parquet(per_target)  # the suite's own, written again
    test_rows = targets.filter(pl.col("split") == "test")  # (unknown_targets=skip: unscaled)
    assert test_rows["ndcg_at_10"].mean() == pytest.approx(result["test"]["test/ndcg_at_10"])
    assert set(targets["split"]) == {"val", "test"}
    assert result["resumed"] and result["epochs"] == 1
    clock = next(v for k, v in first_clock["callbacks"].items() if k == "TrainingClock")
    assert result["train_seconds"] == clock["train_seconds"]  # no epoch trained again
    assert "resume=" not in result["command"] and "test/ndcg_at_10" in result["test"]

    monkeypatch.setattr(train, "run", interrupted)  # nothing is trained a third time
    assert quality_suite.run_one("tiny", model, 0, tmp_path, extra) == json.loads(
        json.dumps(result, default=str)
    )
    with pytest.raises(ValueError, match="holds a run started as"):
        quality_suite.run_one("tiny", model, 0, tmp_path, [*extra, "model.dropout=0.1"])

    # killed after best.ckpt but before the first last.ckpt: nothing to continue, so it
    # starts again (the run folder check would refuse a fresh training beside best.ckpt)
    monkeypatch.undo()
    other = tmp_path / "tiny-sasrec_ce-1" / "checkpoints"
    other.mkdir(parents=True)
    (other / "best.ckpt").write_bytes(b"from a killed epoch")
    again = quality_suite.run_one("tiny", model, 1, tmp_path, extra)
    assert not again["resumed"] and "test/ndcg_at_10" in again["test"]


def test_run_column_is_a_command_line_a_shell_reads_back():
    """An override with spaces and braces (the EMA callback) is quoted in the table's run
    column, so pasting the command gives Hydra the same overrides."""
    import shlex

    model = quality_suite.MODELS["atrank_bsarec_ema"]
    command = "python -m pipelines.run " + shlex.join(["experiment=beauty", *model.overrides])
    result = {**fake_result("atrank_bsarec_ema", 0, 0.06, 0.1, None), "command": command}
    words = shlex.split(quality_suite._overrides(result))
    assert words == ["experiment=beauty", *model.overrides]
    assert quality_suite.EMA_0999 in words


def test_ml1m_runs_get_a_row_for_the_users_measured_on_the_published_test_step():
    runs = []
    for seed, (whole, segment) in enumerate(((0.13, 0.15), (0.14, 0.17))):
        result = fake_result("atrank_low_pass", seed, whole, 2 * whole, None)
        result["dataset"] = "ml1m"
        result["test"].update({"test/segment_ndcg_at_10": segment, "test/segment_hr_at_10": 0.3})
        runs.append(result)
    lines = [line for line in quality_suite.table(runs).splitlines() if "| ml1m" in line]
    segment_row = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert "512 users on the published test step" in segment_row[1]
    assert segment_row[3:6] == ["2", "0.3000 ± 0.0000", "0.1600 ± 0.0141"]
    assert segment_row[6].startswith("0.1930 (LRURec)")
    assert "0.1350 ± 0.0071" in lines[-2]  # the whole split's row stays as it is

    # one seed: no spread over seeds, so the figure comes with its standard error
    runs[0]["test"].update(
        {"test/segment_ndcg_at_10_stderr": 0.0123, "test/segment_hr_at_10_stderr": 0.0192}
    )
    single = [line for line in quality_suite.table(runs[:1]).splitlines() if "| ml1m" in line]
    cells = [c.strip() for c in single[-1].strip("|").split("|")]
    assert cells[3:6] == ["1", "0.3000 ± 0.0192 SE", "0.1500 ± 0.0123 SE"]


ML1M = SHARED_DATA / "movielens-1m" / "sasrec_ml1m_interactions.parquet"


@pytest.mark.skipif(
    not ML1M.exists(), reason=f"{ML1M} is absent (real datasets live in ../shared/data)"
)
def test_the_ml1m_segment_is_the_512_users_whose_sequences_the_copy_holds_whole(tmp_path):
    import polars as pl

    model = quality_suite.MODELS["atrank_low_pass"]
    cfg, _ = quality_suite.compose("ml1m", model, 0, tmp_path / "run", [])
    _, write = quality_suite.DATASETS["ml1m"].segment
    write(cfg, tmp_path / "users.parquet")
    users = pl.read_parquet(tmp_path / "users.parquet")["user_id"]
    assert users.len() == users.n_unique() == 512
    # the copy's val_target rows are exactly these users' second-to-last items
    frame = pl.read_parquet(ML1M)
    val_users = frame.filter(pl.col("role") == "val_target")["user_sas"].unique().sort()
    assert users.to_list() == val_users.to_list()
