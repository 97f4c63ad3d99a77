"""The README's main job and pipelines on tiny synthetic data, through the same code paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from recsys.data.io import DataError
from recsys.data.pipeline import load_stats
from recsys.tasks import evaluate, main, score, train

ROOT = Path(__file__).resolve().parents[2]
TINY = ["experiment=tiny"]


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One main job (prepare -> train -> evaluate -> score) shared by the tests below."""
    from hydra import compose, initialize_config_dir

    tmp = tmp_path_factory.mktemp("main")
    overrides = [f"paths.output_dir={tmp / 'outputs'}", f"paths.run_dir={tmp / 'run'}", *TINY]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return cfg, main.run(cfg)


def test_main_job_writes_recommendations(main_run):
    cfg, result = main_run
    recs = pl.read_parquet(result.recommendations)
    assert recs.columns == ["user_id", "rank", "item_id", "score"]
    assert recs.height > 0
    assert recs.group_by("user_id").len()["len"].max() == cfg.retrieval.top_k
    assert result.metrics["test/ndcg_at_10"] >= 0
    assert "test/popularity_ndcg_at_10" in result.metrics


def test_main_job_mlflow_run(main_run):
    cfg, result = main_run
    client = MlflowClient(tracking_uri=cfg.logger.tracking_uri)
    run_id = result.run.split()[2]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["model.d_model"] == "16"
    assert run.data.params["data.split.method"] == "temporal"
    for name in (
        "train/loss",
        "val/ndcg_at_10",
        "val/hr_at_10",
        "val/retrieval_ndcg_at_10",
        "test/ndcg_at_10",
        "test/hr_at_10",
        "test/mrr_at_10",
        "test/popularity_ndcg_at_10",
        "best/val_ndcg_at_10",
        "score/users",
    ):
        assert name in run.data.metrics, name
    epochs = client.get_metric_history(run_id, "val/ndcg_at_10")
    assert len(epochs) == cfg.trainer.max_epochs  # one value per epoch
    assert run.data.tags["protocol.split"] == "temporal"
    stats = load_stats(Path(cfg.paths.run_dir) / "prepared")
    assert run.data.tags["data.fingerprint"] == stats["fingerprint"]
    for key in ("rows_read", "events", "users", "quarantined"):
        assert run.data.tags[f"data.{key}"] == str(stats[key]), key

    def listing(path):
        return {f.path for f in client.list_artifacts(run_id, path)}

    assert listing("config") == {"config/config_resolved.yaml"}
    assert {
        "data/items.parquet",
        "data/attributes.parquet",
        "data/behaviors.parquet",
        "data/stats.json",
        "data/quarantine.parquet",
    } <= listing("data")
    assert listing("checkpoints") == {"checkpoints/best.ckpt"}


def test_score_by_checkpoint_and_by_run_id_agree(main_run, make_config, tmp_path):
    cfg, result = main_run
    run_id = result.run.split()[2]
    expected = pl.read_parquet(result.recommendations)
    # the score config has no experiment group: repeat the tiny data and re-rank settings
    common = [
        "retrieval.rerank_top_n=20",
        "data.source.num_users=150",
        "data.source.num_items=120",
        "data.source.num_categories=8",
        f"logger.tracking_uri={cfg.logger.tracking_uri}",
    ]
    by_path = make_config(
        "score",
        [f"model_ref={result.checkpoint}", f"retrieval.output={tmp_path}/a.parquet", *common],
    )
    assert pl.read_parquet(score.run(by_path)).equals(expected)
    by_run = make_config(
        "score",
        [
            f"model_ref={run_id}",
            f"retrieval.output={tmp_path}/b.csv",
            "retrieval.format=csv",
            *common,
        ],
    )
    from_csv = pl.read_csv(score.run(by_run))
    assert from_csv["item_id"].to_list() == expected["item_id"].to_list()


def test_evaluate_reproduces_test_metrics(main_run, make_config):
    cfg, result = main_run
    eval_cfg = make_config(
        "evaluate",
        [
            f"model_ref={result.checkpoint}",
            "logger=none",
            "data.source.num_users=150",
            "data.source.num_items=120",
            "data.source.num_categories=8",
            "training.rerank_top_n=20",
        ],
    )
    metrics = evaluate.run(eval_cfg)
    assert metrics["test/ndcg_at_10"] == pytest.approx(result.metrics["test/ndcg_at_10"])


def written(folder: Path) -> list[Path]:
    """Files under ``folder`` (empty parent folders of the run directory do not count: see
    tests/unit/data/test_pipeline.py::test_failed_prepare_leaves_no_parent_folders)."""
    return sorted(p for p in folder.rglob("*") if not p.is_dir())


def test_bad_event_log_fails_clearly_and_writes_nothing(make_config, tmp_path):
    log_file = tmp_path / "events.csv"
    log_file.write_text("user,item,ts,event\n1,10,1700000000,view\n1,11,1700000100,view\n")
    cfg = make_config(
        "config",
        [
            *TINY,
            "data=events_file",
            f"data.source={log_file}",
            "logger=none",
            "data.columns.user_id=user",
            "data.columns.item_id=item",
            "data.columns.timestamp=ts",
            "data.columns.event_type=event",
            "data.columns.category=cat",  # mapped, but the file has no such column
        ],
    )
    with pytest.raises(DataError, match=r"lacks column\(s\) \['cat'\].*data.columns.category="):
        train.run(cfg)
    assert written(tmp_path / "outputs") == []

    log_file.write_text("user,item,ts,event,cat\n1,10,yesterday,view,a\n1,11,2024-01-01,view,a\n")
    cfg = make_config(
        "config",
        [
            *TINY,
            "data=events_file",
            f"data.source={log_file}",
            "logger=none",
            "data.columns.user_id=user",
            "data.columns.item_id=item",
            "data.columns.timestamp=ts",
            "data.columns.event_type=event",
            "data.columns.category=cat",
        ],
    )
    message = (
        r"1 row\(s\) whose timestamp \(column 'ts'\) could not be parsed \[bad_timestamp\] "
        r"\(row 0: 'yesterday'\); fix: "
    )
    with pytest.raises(DataError, match=message):
        train.run(cfg)
    log_file.write_text("")
    with pytest.raises(DataError, match="empty"):
        train.run(cfg)
    assert written(tmp_path / "outputs") == []


def test_cli_overrides_and_multirun_sweep(tmp_path):
    """The README's command-line forms: overrides and a -m sweep over num_heads."""
    out = tmp_path / "outputs"
    command = [
        sys.executable,
        "-m",
        "pipelines.train",
        "-m",
        "model.num_heads=1,2",
        "model.d_model=32",
        "trainer.max_epochs=1",
        "data=synthetic",
        *TINY,
        "logger=none",
        f"paths.output_dir={out}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoints = sorted(out.glob("multiruns/*/*/checkpoints/best.ckpt"))
    assert len(checkpoints) == 2
    assert not (out / "mlflow.db").exists()  # logger=none tracks nothing
