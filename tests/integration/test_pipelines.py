"""The README's main job and pipelines on tiny synthetic data, through the same code paths."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import polars as pl
import pytest
import torch

import recsys
from recsys.checkpoint import FORMAT_VERSION as CHECKPOINT_FORMAT
from recsys.checkpoint import load_checkpoint, model_digest
from recsys.data.io import DataError
from recsys.data.pipeline import FORMAT_VERSION, STATS_FILE, load_stats
from recsys.schema import NUM_RESERVED
from recsys.tasks import evaluate, main, prepare, score, train

ROOT = Path(__file__).resolve().parents[2]
TINY = ["experiment=tiny"]
REGISTERED = "recsys-tiny"
# the score/evaluate configs have no experiment group: the tiny data and re-rank settings again
TINY_DATA = [
    "data.source.num_users=150",
    "data.source.num_items=120",
    "data.source.num_categories=8",
]
BASE_COLUMNS = ["user_id", "rank", "item_id", "score", "source"]


def mlflow_client(tracking_uri: str):
    # imported here: the GPU tests (-m gpu) run where mlflow is not installed
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def read_parts(folder: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted(Path(folder).glob("part-*.parquet")))


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One main job (prepare -> train -> evaluate -> score) shared by the tests below."""
    from hydra import compose, initialize_config_dir

    tmp = tmp_path_factory.mktemp("main")
    overrides = [
        f"paths.output_dir={tmp / 'outputs'}",
        f"paths.run_dir={tmp / 'run'}",
        *TINY,
        f"logger.registered_model_name={REGISTERED}",
        "logger.model_alias=champion",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return cfg, main.run(cfg)


def test_main_job_writes_recommendations(main_run):
    cfg, result = main_run
    recs = read_parts(result.recommendations)
    assert recs.columns[:5] == BASE_COLUMNS and recs.columns[-1] == "item_category"
    assert recs.height > 0
    assert recs.group_by("user_id").len()["len"].max() == cfg.retrieval.top_k
    assert result.metrics["test/ndcg_at_10"] >= 0
    assert "test/popularity_ndcg_at_10" in result.metrics
    assert "test/transition_ndcg_at_10" in result.metrics


def test_main_job_mlflow_run(main_run):
    cfg, result = main_run
    client = mlflow_client(cfg.logger.tracking_uri)
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
        "test/transition_ndcg_at_10",
        "best/val_ndcg_at_10",
        "score/users",
    ):
        assert name in run.data.metrics, name
    epochs = client.get_metric_history(run_id, "val/ndcg_at_10")
    assert len(epochs) == cfg.trainer.max_epochs  # one value per epoch
    assert run.data.tags["protocol.split"] == "temporal"
    assert run.data.tags["protocol.ranking"] == (
        f"top {cfg.training.rerank_top_n} re-ranked by target attention"
        if cfg.training.rerank_top_n
        else "retrieval only"
    )
    stats = load_stats(Path(cfg.paths.run_dir) / "prepared")
    assert run.data.tags["protocol.unknown_item_targets"] == (
        f"left out of the means ({stats['val_targets_unknown_item']} validation, "
        f"{stats['test_targets_unknown_item']} test)"
    )
    assert run.data.tags["data.fingerprint"] == stats["fingerprint"]
    assert run.data.tags["task"] == "main"  # not the last task's name (score)
    # the code that trained it, in the run and in the checkpoint
    assert run.data.tags["code.version"] == recsys.__version__
    assert run.data.tags.get("code.git_commit") == recsys.code_version()["git_commit"]
    assert load_checkpoint(result.checkpoint).code == recsys.code_version()
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
    assert "model/MLmodel" in listing("model")  # the packaged MLflow model
    assert {"score/_summary.json", "score/plots"} <= listing("score")
    assert {"score/plots/coverage.png", "score/plots/popularity.png"} <= listing("score/plots")
    for name in ("score/users_per_second", "score/catalogue_coverage", "score/fallback_share"):
        assert name in run.data.metrics, name


def test_score_by_checkpoint_run_id_and_registered_alias_agree(main_run, make_config, tmp_path):
    cfg, result = main_run
    run_id = result.run.split()[2]
    expected = read_parts(result.recommendations)
    common = [
        *TINY_DATA,
        "retrieval.rerank_top_n=20",
        f"logger.tracking_uri={cfg.logger.tracking_uri}",
    ]
    by_path = make_config(
        "score", [f"model_ref={result.checkpoint}", f"retrieval.output.path={tmp_path}/a", *common]
    )
    assert read_parts(score.run(by_path)).equals(expected)
    by_run = make_config(
        "score",
        [
            f"model_ref={run_id}",
            f"retrieval.output.path={tmp_path}/b",
            "retrieval.output.formats=[parquet,csv]",
            *common,
        ],
    )
    folder = score.run(by_run)
    # (pl.read_csv takes a list of files from polars 2 only)
    from_csv = pl.scan_csv(sorted(folder.glob("_csv/part-*.csv"))).collect()
    assert pd.read_parquet(folder)["item_id"].tolist() == expected["item_id"].to_list()
    assert from_csv["item_id"].to_list() == expected["item_id"].to_list()
    by_alias = make_config(
        "score",
        [f"model_ref={REGISTERED}@champion", f"retrieval.output.path={tmp_path}/c", *common],
    )
    by_alias_output = score.run(by_alias)
    assert read_parts(by_alias_output).equals(expected)
    client = mlflow_client(cfg.logger.tracking_uri)
    scoring_runs = client.search_runs(
        [client.get_experiment_by_name("recsys").experiment_id],
        filter_string="tags.task = 'score' and tags.`model.run_id` = '" + run_id + "'",
    )
    # by path (the checkpoint records its run), run id and alias: all linked to the model's run
    assert len(scoring_runs) == 3
    digest = model_digest(load_checkpoint(result.checkpoint))
    for run in scoring_runs:  # each names its whole config and the model's content
        refs = (str(result.checkpoint), run_id, f"{REGISTERED}@champion")
        assert run.data.params["model_ref"] in refs
        assert run.data.params["retrieval.rerank_top_n"] == "20"
        assert run.data.params["data.source.num_users"] == "150"
        assert run.data.tags["model.digest"] == digest
    # the output folder itself says what produced it: the model as named and as resolved, the
    # scored log and the code (the summary), and the code that started it (the manifest)
    summary = json.loads((by_alias_output / "_summary.json").read_text())
    assert summary["model"] == {
        "uri": f"{REGISTERED}@champion",
        "version": "1",
        "run_id": run_id,
        "digest": digest,
        "data_fingerprint": load_checkpoint(result.checkpoint).data_fingerprint,
        "code": recsys.code_version(),  # the code that trained it
    }
    (alias_run,) = [r for r in scoring_runs if r.data.params["model_ref"].endswith("@champion")]
    assert summary["data"] == {
        "source": "generate_events(num_users=150, num_items=120, num_categories=8, weeks=8.0, "
        "seed=42)",
        "fingerprint": alias_run.data.tags["score.data_fingerprint"],
        "as_of": "end of log",
    }
    assert summary["code"] == recsys.code_version()
    manifest = json.loads((by_alias_output / "_manifest.json").read_text())
    assert manifest["code"] == recsys.code_version() and manifest["job"]["model"] == digest
    missing = make_config(
        "score", [f"model_ref={REGISTERED}@nope", f"retrieval.output.path={tmp_path}/d", *common]
    )
    with pytest.raises(ValueError, match="not found in the MLflow model registry"):
        score.run(missing)


def test_a_scored_loaders_frame_is_named_by_its_call_in_scoring_errors(
    main_run, make_config, tmp_path
):
    """A scoring job whose data.source is a loader (a conf/data/<format>.yaml, the synthetic
    log) names it by its call, as preparation does, where it said '<in-memory polars frame>'
    of a column mapping the frame lacks (and its config's dict text elsewhere)."""
    _, result = main_run
    cfg = make_config(
        "score",
        [
            f"model_ref={result.checkpoint}",
            *TINY_DATA,
            "data.columns.user_id=customer",
            "logger=none",
            f"retrieval.output.path={tmp_path}/recs",
        ],
    )
    with pytest.raises(DataError, match=r"^generate_events\(num_users=150, .*\) lacks column"):
        score.run(cfg)
    assert not (tmp_path / "recs").exists()


def test_jobs_given_an_mlflow_model_leave_no_copy_of_it_behind(
    main_run, make_config, tmp_path, monkeypatch
):
    """score and evaluate with model=<run id> or <name>@<alias> fetch the model out of the
    MLflow store; the copy is gone when the job is (a scheduled job of a GB model would
    otherwise fill the temporary folder)."""
    import tempfile

    cfg, result = main_run
    run_id = result.run.split()[2]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the copies would go
    common = [
        *TINY_DATA,
        "retrieval.rerank_top_n=20",
        f"logger.tracking_uri={cfg.logger.tracking_uri}",
    ]
    for number, ref in enumerate([run_id, f"{REGISTERED}@champion"]):
        output = f"retrieval.output.path={tmp_path}/recs{number}"
        score.run(make_config("score", [f"model_ref={ref}", output, *common]))
    evaluation = [f"model_ref={run_id}", *TINY_DATA, "training.rerank_top_n=20"]
    tracked = [f"logger.tracking_uri={cfg.logger.tracking_uri}", f"per_target={tmp_path}/t.parquet"]
    evaluate.run(make_config("evaluate", [*evaluation, *tracked]))
    assert list(scratch.glob("recsys-model-*")) == []
    # the evaluation's own run says which model it measured
    client = mlflow_client(cfg.logger.tracking_uri)
    (evaluated,) = client.search_runs(
        [r.experiment_id for r in client.search_experiments()], "tags.task = 'evaluate'"
    )
    assert evaluated.data.tags["model.run_id"] == run_id
    assert evaluated.data.tags["model.uri"] == f"runs:/{run_id}/model"
    assert "test/ndcg_at_10" in evaluated.data.metrics
    # and with what: its whole config as parameters, the model's content and training data
    params = evaluated.data.params
    assert params["model_ref"] == run_id and params["splits"] == "['test']"
    assert params["training.rerank_top_n"] == "20" and params["data.source.num_users"] == "150"
    assert params["per_target"] == f"{tmp_path}/t.parquet"
    tags = evaluated.data.tags
    assert tags["model.digest"] == model_digest(load_checkpoint(result.checkpoint))
    assert tags["model.data_fingerprint"] == tags["data.fingerprint"]
    # the per-target file travels with the run
    assert "t.parquet" in {f.path for f in client.list_artifacts(evaluated.info.run_id)}


def test_evaluate_and_score_jobs_of_a_sweep_are_tagged_with_their_sweep(
    main_run, make_config, tmp_path
):
    """pipelines.evaluate -m / pipelines.score -m (e.g. one model over several user segments):
    each job's run is tied to its sweep, as a training sweep's are (their runs had no tag)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    _, result = main_run
    common = [f"model_ref={result.checkpoint}", *TINY_DATA]
    jobs = {
        evaluate: ("evaluate", ["training.rerank_top_n=20"]),
        score: ("score", ["retrieval.rerank_top_n=20", f"retrieval.output.path={tmp_path}/r"]),
    }
    instance = HydraConfig.instance()
    before = instance.cfg
    for task, (name, overrides) in jobs.items():
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            job = compose(name, [*common, *overrides], return_hydra_config=True)
        with open_dict(job):  # job 1 of a sweep, as Hydra's multirun launcher sets it
            job.hydra.mode = "MULTIRUN"
            job.hydra.job.num = 1
            job.hydra.sweep.dir = str(tmp_path / "sweep")
        try:
            instance.set_config(job)
            task.run(make_config(name, [*common, *overrides]))
        finally:
            instance.cfg = before
    client = mlflow_client(make_config("evaluate", common).logger.tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.tags["task"] for r in runs) == ["evaluate", "score"]
    for run in runs:
        assert run.data.tags["sweep.dir"] == str(tmp_path / "sweep")
        assert run.data.tags["sweep.job"] == "1"


def test_killed_scoring_job_resumes_to_identical_output(main_run, make_config, tmp_path, caplog):
    _, result = main_run
    settings = [
        *TINY_DATA,
        f"model_ref={result.checkpoint}",
        "logger=none",
        "retrieval.user_chunk_size=40",  # 150 users -> 4 parts
        "retrieval.output.formats=[parquet,csv]",
    ]
    whole = score.run(make_config("score", [*settings, f"retrieval.output.path={tmp_path}/a"]))
    target = tmp_path / "b"
    cfg = make_config("score", [*settings, f"retrieval.output.path={target}"])

    def crash_after_two(part: int) -> None:
        if part == 1:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt), caplog.at_level("INFO", logger="recsys"):
        score.run(cfg, after_part=crash_after_two)
    assert not target.exists()  # nothing visible before the job completes
    staging = tmp_path / ".b.partial"
    # the log says how to continue (it ended with the interrupt alone)
    assert f"2 part(s) of this job's output are in {staging}: the same job run again" in (
        caplog.text
    )
    assert sorted(p.relative_to(staging).as_posix() for p in staging.glob("**/part-*")) == [
        "_csv/part-00000.csv",
        "_csv/part-00001.csv",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    written_parts = []
    score.run(cfg, after_part=written_parts.append)
    assert written_parts == [2, 3]  # the finished parts were not redone
    assert not staging.exists()
    names = sorted(p.relative_to(whole).as_posix() for p in whole.glob("**/part-*"))
    assert names == sorted(p.relative_to(target).as_posix() for p in target.glob("**/part-*"))
    assert len(names) == 8
    for name in [*names, "_summary.json"]:
        assert (whole / name).read_bytes() == (target / name).read_bytes(), name
    # the same job again is a no-op, and its log says so (it said "wrote 1500 recommendations");
    # another job into the same folder needs overwrite=true
    caplog.clear()
    with caplog.at_level("INFO", logger="recsys"):
        assert score.run(cfg) == target
    assert "complete output: nothing to do" in caplog.text
    assert "wrote" not in caplog.text
    assert re.search(
        r"found \d+ recommendations for 150 users in " + re.escape(str(target)), caplog.text
    )
    other = make_config(
        "score", [*settings, f"retrieval.output.path={target}", "retrieval.top_k=3"]
    )
    with pytest.raises(FileExistsError, match="overwrite=true"):
        score.run(other)


def test_a_resumed_scoring_job_rewrites_parts_of_another_schema(
    main_run, make_config, tmp_path, caplog
):
    """A killed job resumes its staged parts whatever code wrote them (the manifest's code is
    no part of the job): a part of older code, with other types, had gone into the output
    beside this code's (pl.scan_parquet of such a folder, rank Int64 in one part and Int32 in
    the others, raises SchemaError). Such a part is written again, with a warning naming it."""
    _, result = main_run
    target = tmp_path / "out"
    cfg = make_config(
        "score",
        [
            *TINY_DATA,
            f"model_ref={result.checkpoint}",
            "logger=none",
            "retrieval.user_chunk_size=40",
            "retrieval.output.formats=[parquet,csv]",
            f"retrieval.output.path={target}",
        ],
    )

    def crash_after_one(part: int) -> None:
        if part == 0:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        score.run(cfg, after_part=crash_after_one)
    staged = tmp_path / ".out.partial" / "part-00000.parquet"
    older = pl.read_parquet(staged).with_columns(pl.col("rank").cast(pl.Int64))  # older code
    older.write_parquet(staged)
    written = []
    with caplog.at_level("WARNING", logger="recsys"):
        score.run(cfg, after_part=written.append)
    assert written == [0, 1, 2, 3]
    assert f"discarding {staged} and writing it again" in caplog.text
    schemas = [pl.read_parquet_schema(part) for part in sorted(target.glob("part-*.parquet"))]
    assert len(schemas) == 4 and all(schema == schemas[1] for schema in schemas)
    assert schemas[0]["rank"] == pl.Int32


def test_a_job_of_a_model_holding_an_empty_item_id_resumes_no_part_that_recommends_it(
    main_run, make_config, tmp_path, monkeypatch
):
    """A model of a recsys before an empty text id read as missing holds "" as an item, which
    that recsys recommended and this one never does. A staging folder the earlier code left
    (killed after its first part) was resumed as the same job, so the output mixed a part
    recommending "" with parts that never do. Such a model's job is now another job."""
    from recsys.data.vocab import Vocab

    _, result = main_run
    checkpoint = torch.load(result.checkpoint, map_location="cpu", weights_only=False)
    vocab = checkpoint["recsys"]["vocab"]
    lost = vocab["item_id"][0]
    vocab["item_id"] = ["" if i == lost else str(i) for i in vocab["item_id"]]
    vocab["item_id_type"] = "String"
    old = tmp_path / "empty-id.ckpt"
    torch.save(checkpoint, old)
    target = tmp_path / "out"
    cfg = make_config(
        "score",
        [
            *TINY_DATA,
            f"model_ref={old}",
            "logger=none",
            "retrieval.user_chunk_size=40",
            f"retrieval.top_k={len(vocab['item_id'])}",  # every item: "" in every model list
            "retrieval.rules.exclude=none",
            f"retrieval.output.path={target}",
        ],
    )

    def crash_after_one(part: int) -> None:
        if part == 0:
            raise KeyboardInterrupt("killed")

    with monkeypatch.context() as earlier:  # the earlier code: "" is an item like any other
        earlier.setattr(Vocab, "missing_id_indices", lambda self: [])
        with pytest.raises(KeyboardInterrupt):
            score.run(cfg, after_part=crash_after_one)
    staged = pl.read_parquet(tmp_path / ".out.partial" / "part-00000.parquet")
    assert not staged.filter(pl.col("item_id") == "").is_empty()
    written = []
    score.run(cfg, after_part=written.append)
    assert written == [0, 1, 2, 3]
    assert read_parts(target).filter(pl.col("item_id") == "").is_empty()


def test_faiss_scoring_job_reuses_its_cached_index(main_run, make_config, tmp_path, caplog):
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    _, result = main_run
    settings = [
        *TINY_DATA,
        f"model_ref={result.checkpoint}",
        "logger=none",
        "retrieval.index=faiss",
        "retrieval.faiss.kind=flat",  # exact faiss: both jobs must give the same output
        f"retrieval.faiss.cache_dir={tmp_path / 'cache'}",
    ]
    with caplog.at_level("INFO", logger="recsys.retrieval.index"):
        first = score.run(make_config("score", [*settings, f"retrieval.output.path={tmp_path}/a"]))
        assert "built" in caplog.text
        caplog.clear()
        second = score.run(make_config("score", [*settings, f"retrieval.output.path={tmp_path}/b"]))
        assert "loaded from the cache" in caplog.text and "built" not in caplog.text
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert read_parts(first).equals(read_parts(second))


def test_faiss_recall_tool_measures_every_form_on_a_trained_run(main_run, capsys):
    """benchmarks.faiss_recall: the README's check before switching scoring to faiss."""
    pytest.importorskip("faiss", reason="faiss is optional: pip install 'recsys[ann]'")
    from benchmarks import faiss_recall

    cfg, result = main_run
    run_dir = Path(cfg.paths.run_dir)
    assert result.checkpoint.parent == run_dir / "checkpoints"
    faiss_recall.main([str(run_dir), "--users", "64", "--ef-search", "16,128", "--threads", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    rows = [line.split(" | ") for line in lines[1:]]  # (lines[0]: the header)
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("| hnsw", "l2", "efSearch 16"),
        ("| hnsw", "l2", "efSearch 128"),
        ("| hnsw", "inner_product", "efSearch 16"),
        ("| hnsw", "inner_product", "efSearch 128"),
        ("| ivf", "l2", "nprobe 32"),
        ("| ivf", "inner_product", "nprobe 32"),
    ]
    assert all(0 <= float(row[3]) <= 1 for row in rows)
    with pytest.raises(SystemExit):
        faiss_recall.main([str(run_dir / "nowhere")])


def test_schema_mismatch_fails_clearly_and_writes_nothing(main_run, make_config, tmp_path):
    _, result = main_run
    log_file = tmp_path / "events.csv"

    def scoring_config(*columns: str):
        return make_config(
            "score",
            [
                f"model_ref={result.checkpoint}",
                "logger=none",
                "data=events_file",
                f"data.source={log_file}",
                "data.columns.user_id=user",
                "data.columns.item_id=item",
                "data.columns.timestamp=ts",
                *columns,
                f"retrieval.output.path={tmp_path}/recs",
            ],
        )

    log_file.write_text("user,item,ts\n1,10,1700000000\n1,11,1700000100\n")
    with pytest.raises(DataError, match=r"does not match the model's schema.*'event_type'"):
        score.run(scoring_config("data.columns.event_type=null"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv"]
    # right columns, but items the model has never seen: the log of another shop
    log_file.write_text("user,item,ts,event,cat\n1,990001,1700000000,view,c00\n")
    cfg = scoring_config("data.columns.event_type=event", "data.columns.category=cat")
    with pytest.raises(DataError, match="none of its 1 item ids are in the model's vocabulary"):
        score.run(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv"]


def test_evaluate_reproduces_test_metrics(main_run, make_config, caplog):
    cfg, result = main_run
    eval_cfg = make_config(
        "evaluate",
        [
            f"model_ref={result.checkpoint}",
            "logger=none",
            *TINY_DATA,
            "training.rerank_top_n=20",
        ],
    )
    with caplog.at_level("WARNING", logger="recsys.training.evaluation"):
        metrics = evaluate.run(eval_cfg)
    assert metrics["test/ndcg_at_10"] == pytest.approx(result.metrics["test/ndcg_at_10"])
    # the tiny log's few test targets: the metrics' resolution is named, once
    targets = load_stats(Path(cfg.paths.run_dir) / "prepared")["test_targets"]
    assert targets < 100
    said = f"the test split has {targets} targets (fewer than 100"
    assert caplog.text.count(said) == 1 and f"1/{targets} = {1 / targets:.3f}" in caplog.text
    # other time buckets in the data settings: the checkpoint's are used, as trained
    other = make_config(
        "evaluate",
        [
            f"model_ref={result.checkpoint}",
            "logger=none",
            *TINY_DATA,
            "training.rerank_top_n=20",
            "data.time_buckets.unit_seconds=86400",
        ],
    )
    assert other.data.time_buckets.unit_seconds != cfg.data.time_buckets.unit_seconds
    assert evaluate.run(other)["test/ndcg_at_10"] == pytest.approx(metrics["test/ndcg_at_10"])


def test_evaluate_reports_a_user_segment_beside_the_whole_split(main_run, make_config, tmp_path):
    """users=<file>: the listed users' metrics as <split>/segment_*, with standard errors.
    Two complementary segments average, weighted by their targets, to the whole split."""
    from recsys.tasks import prepare

    cfg, result = main_run
    overrides = [f"model_ref={result.checkpoint}", "logger=none", *TINY_DATA]
    overrides.append("training.rerank_top_n=20")
    sequences = pl.read_parquet(
        prepare.prepared(make_config("evaluate", overrides)) / "sequences.parquet"
    )
    users = sequences["user_id"]
    halves = {"a": users[::2], "b": users[1::2]}
    halves["a"].to_frame().write_csv(tmp_path / "a.csv")
    halves["b"].to_frame().write_parquet(tmp_path / "b.parquet")
    found = {}
    for name, path in (("a", tmp_path / "a.csv"), ("b", tmp_path / "b.parquet")):
        chosen = [f"users={path}", "splits=[val,test]"]
        found[name] = evaluate.run(make_config("evaluate", [*overrides, *chosen]))
    whole = found["a"]
    assert whole["val/segment_targets"] > 0 and "val/ndcg_at_10" in whole
    assert whole["test/ndcg_at_10"] == pytest.approx(result.metrics["test/ndcg_at_10"])
    for metric in ("ndcg_at_10", "hr_at_10", "mrr", "popularity_ndcg_at_10"):
        n = {k: m["test/segment_targets"] for k, m in found.items()}
        weighted = sum(m[f"test/segment_{metric}"] * n[k] for k, m in found.items())
        assert weighted / sum(n.values()) == pytest.approx(whole[f"test/{metric}"])
    hits = whole["test/segment_hr_at_10"]
    n = whole["test/segment_targets"]
    expected = (hits * (1 - hits) / (n - 1)) ** 0.5  # a 0/1 metric's sample standard error
    assert whole["test/segment_hr_at_10_stderr"] == pytest.approx(expected)
    # a user the data does not have is refused by name, before anything is evaluated
    pl.DataFrame({"user_id": [*halves["a"].head(2).to_list(), 10**9]}).write_csv(
        tmp_path / "unknown.csv"
    )
    without = sequences.filter(pl.col("test_target") < 0)["user_id"]
    assert without.len() > 0  # the tiny log's temporal split leaves some users no test target
    without.to_frame().write_csv(tmp_path / "without.csv")
    with pytest.raises(DataError, match=r"none of its \d+ users has a test target"):
        evaluate.run(make_config("evaluate", [*overrides, f"users={tmp_path / 'without.csv'}"]))
    with pytest.raises(ValueError, match=r"splits=\['train'\]: choose among val and test"):
        evaluate.run(make_config("evaluate", [*overrides, "splits=[train]"]))
    with pytest.raises(ValueError, match=r"splits=\[\]: choose among val and test"):
        evaluate.run(make_config("evaluate", [*overrides, "splits=[]"]))
    single = evaluate.run(make_config("evaluate", [*overrides, "splits=test"]))  # not t, e, s, t
    assert "test/ndcg_at_10" in single and not any(k.startswith("val/") for k in single)
    with pytest.raises(DataError, match=r"1 of its 3 user ids are not users .* \[1000000000\]"):
        evaluate.run(make_config("evaluate", [*overrides, f"users={tmp_path / 'unknown.csv'}"]))
    with pytest.raises(ValueError, match=r"splits=\['test', 'test'\]: .* each once"):
        evaluate.run(make_config("evaluate", [*overrides, "splits=[test,test]"]))
    # an id with a fractional part is no user's (a cast truncated it to another user's id)
    first = halves["a"][0]
    fraction = tmp_path / "fraction.parquet"  # (a CSV's ids are read as text)
    pl.DataFrame({"user_id": [float(first), first + 0.5]}).write_parquet(fraction)
    with pytest.raises(DataError, match=rf"1 of its 2 user ids are not users .* \[{first + 0.5}\]"):
        evaluate.run(make_config("evaluate", [*overrides, f"users={fraction}"]))


def test_evaluate_writes_each_targets_metrics_and_two_runs_compare_target_by_target(
    main_run, make_config, tmp_path
):
    """per_target=<file>.parquet: one row per split and user whose means are the reported
    metrics; two evaluations of the same targets (re-ranked or not) compare pair by pair."""
    from recsys.tasks import prepare
    from recsys.training.evaluation import compare_per_target

    cfg, result = main_run
    overrides = [f"model_ref={result.checkpoint}", "logger=none", *TINY_DATA, "splits=[val,test]"]
    files = {n: tmp_path / "out" / f"{n}.parquet" for n in (0, 20)}
    found = {
        n: evaluate.run(
            make_config("evaluate", [*overrides, f"training.rerank_top_n={n}", f"per_target={f}"])
        )
        for n, f in files.items()
    }
    table = pl.read_parquet(files[20])
    assert table.columns[:5] == ["split", "user_id", "item_id", "retrieval_rank", "hr_at_5"]
    # the file says what it measured: the model, the data, the protocol and the code
    described = json.loads(pl.read_parquet_metadata(files[20])["recsys"])
    checkpoint = load_checkpoint(result.checkpoint)
    assert described["model.uri"] == str(Path(result.checkpoint).absolute())
    # given as a path, the model still names the run that trained it (its checkpoint records it)
    assert described["model.run_id"] == result.run.split()[2]
    assert described["model.digest"] == model_digest(checkpoint)
    assert described["data.fingerprint"] == checkpoint.data_fingerprint
    assert described["protocol.ranking"] == "top 20 re-ranked by target attention"
    assert described["protocol.seen_items"] == "kept" and described["task"] == "evaluate"
    assert described["code.version"] == recsys.__version__
    stage_one = [c.startswith("retrieval_") for c in table.columns[4:]]
    assert stage_one == sorted(stage_one) and "mrr" in table.columns  # users' metrics first
    for split in ("val", "test"):
        rows = table.filter(pl.col("split") == split)
        assert rows["user_id"].is_unique().all()
        for metric in ("ndcg_at_10", "hr_at_10", "retrieval_ndcg_at_10", "mrr"):
            assert rows[metric].mean() == pytest.approx(found[20][f"{split}/{metric}"])
    # the rank is the uncut stage-1 one: inside the top 10 exactly where stage 1 hits
    ranked = table.filter(pl.col("retrieval_rank").is_not_null())
    assert ((ranked["retrieval_rank"] <= 10) == (ranked["retrieval_hr_at_10"] == 1)).all()
    # the item ids are the prepared log's raw ids, the users its users
    prepared = prepare.prepared(make_config("evaluate", overrides))
    sequences = pl.read_parquet(prepared / "sequences.parquet")
    assert set(table["user_id"]) <= set(sequences["user_id"])
    same = compare_per_target(files[0], files[20], "retrieval_ndcg_at_10", split="test")
    assert same["difference"] == 0 and same["ties"] == same["targets"] > 0
    paired = compare_per_target(files[0], pl.read_parquet(files[20]).to_pandas(), split="val")
    assert paired["a"] == pytest.approx(found[0]["val/ndcg_at_10"])
    assert paired["b"] == pytest.approx(found[20]["val/ndcg_at_10"])
    # an evaluation never replaces a file, and refuses before any work
    with pytest.raises(ValueError, match=r"per_target=.*0.parquet exists: remove it"):
        evaluate.run(make_config("evaluate", [*overrides, f"per_target={files[0]}"]))
    with pytest.raises(ValueError, match=r"per_target=.*t.csv: name a .parquet file"):
        evaluate.run(make_config("evaluate", [*overrides, f"per_target={tmp_path / 't.csv'}"]))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["0.parquet", "20.parquet"]


def test_evaluating_a_model_on_another_log_names_the_model_as_given(main_run, make_config):
    """A champion trained on last night's log, evaluated on tonight's (another vocabulary), is
    refused naming model=<ref> as the user gave it and both fingerprints, not the temporary
    copy fetched out of MLflow (gone by the time the message is read)."""
    cfg, result = main_run
    run_id = result.run.split()[2]
    other_overrides = [
        f"model_ref={run_id}",
        f"logger.tracking_uri={cfg.logger.tracking_uri}",
        *TINY_DATA,
        "data.source.seed=5",  # another log: other items in training
        "training.rerank_top_n=20",
    ]
    other = make_config("evaluate", other_overrides)
    with pytest.raises(ValueError, match=rf"another vocabulary than model={run_id} ") as info:
        evaluate.run(other)
    assert "recsys-model-" not in str(info.value)
    assert "Scheduled retraining" in str(info.value)
    # the usual cause (an evaluate command without the training's data overrides) and its fix
    assert "data.prepared_dir=<the folder it was trained on>" in str(info.value)
    # the log it prepared for nothing is gone with the refusal (an audit's finding)
    assert not (Path(other.paths.run_dir) / "prepared").exists()
    # the source alone differed, and the fingerprint decided; the same log with other data
    # settings than its training's is refused before anything is prepared, with the overrides
    # that give the training's (its checkpoint records them)
    trained = [a for a in other_overrides if a != "data.source.seed=5"]
    for setting, fix in (
        ("data.split.method=leave_one_out", "data.split.method=temporal"),
        ("data.min_user_events=3", "data.min_user_events=2"),
    ):
        cfg = make_config("evaluate", [*trained, setting])
        with pytest.raises(
            ValueError, match=rf"model={run_id} was trained on data prepared"
        ) as info:
            evaluate.run(cfg)
        assert f"({fix})" in str(info.value), str(info.value)
        assert not Path(cfg.paths.run_dir).exists() or not written(Path(cfg.paths.run_dir))


def test_last_nights_model_on_tonights_log_compares_with_tonights_model(
    main_run, make_config, tmp_path
):
    """Scheduled retraining's promotion question: is tonight's model better than last night's
    champion? other_data=true measures the champion on tonight's windows (refused without it:
    another vocabulary), beside tonight's baselines, with the targets whose item it never
    learnt counted as misses: the same targets as tonight's model's evaluation, so the two
    per-target files compare pair by pair."""
    from recsys.data.synthetic import generate_events
    from recsys.training.evaluation import compare_per_target

    cfg, result = main_run
    champion = result.checkpoint
    # tonight's log: more users, and ten items replaced by new ones the champion never saw
    events = generate_events(num_users=300, num_items=120, num_categories=8, seed=42)
    replaced = events["item_id"].unique().sort().head(10)
    events = events.with_columns(
        pl.when(pl.col("item_id").is_in(replaced.implode()))
        .then(pl.col("item_id") + 10**9)
        .otherwise(pl.col("item_id"))
    )
    log_file = tmp_path / "events-tonight.parquet"
    events.write_parquet(log_file)
    data = ["data=events_file", f"data.source={log_file}", "data.columns.category=category"]
    data += ["data.max_seq_len=20", "training.rerank_top_n=20", "logger=none"]
    small = ["model.d_model=16", "model.num_layers=1", "trainer.max_epochs=2"]
    trained = train.run(make_config("config", [*data, *small, "retrieval.rerank_top_n=20"]))
    tonight = [*data, f"data.prepared_dir={trained.prepared_dir}", "splits=[val,test]"]
    files = {name: tmp_path / f"{name}.parquet" for name in ("champion", "tonight")}
    with pytest.raises(ValueError, match="add other_data=true"):  # not without asking
        evaluate.run(make_config("evaluate", [f"model_ref={champion}", *tonight]))
    found = {
        name: evaluate.run(
            make_config(
                "evaluate",
                [f"model_ref={ref}", *tonight, f"per_target={files[name]}"]
                + (["other_data=true"] if name == "champion" else []),
            )
        )
        for name, ref in (("champion", champion), ("tonight", trained.checkpoint))
    }
    # the windows and baselines are tonight's, whichever model is measured on them
    baselines = [k for k in found["tonight"] if "popularity_" in k or "transition_" in k]
    assert baselines and all(found["champion"][k] == found["tonight"][k] for k in baselines)
    assert "test/model_unknown_targets" not in found["tonight"]
    table = pl.read_parquet(files["champion"])
    described = json.loads(pl.read_parquet_metadata(files["champion"])["recsys"])
    assert described["model.other_data"].startswith("trained on other data: items matched by id")
    assert described["data.fingerprint"] != described["model.data_fingerprint"]
    # a target whose item the champion never learnt is a miss: 0 everywhere, not ranked
    champion_vocab = load_checkpoint(champion).vocab
    learnt = champion_vocab.items["item_id"].implode()
    for split in ("val", "test"):
        rows = table.filter(pl.col("split") == split)
        unknown = rows.filter(~pl.col("item_id").is_in(learnt))
        assert len(unknown) == found["champion"][f"{split}/model_unknown_targets"]
        assert unknown["retrieval_rank"].null_count() == len(unknown)
        metrics = unknown.select(pl.exclude("split", "user_id", "item_id", "retrieval_rank"))
        assert (metrics.to_numpy() == 0).all()
        assert rows["ndcg_at_10"].mean() == pytest.approx(found["champion"][f"{split}/ndcg_at_10"])
    assert found["champion"]["test/model_unknown_targets"] > 0  # (the test checks some)
    # the others are ranked on the champion's own catalogue
    ranked = table.filter(pl.col("retrieval_rank").is_not_null())
    assert len(ranked) and ranked["retrieval_rank"].max() < champion_vocab.num_items
    paired = compare_per_target(files["champion"], files["tonight"], split="test")
    assert paired["a"] == pytest.approx(found["champion"]["test/ndcg_at_10"])
    assert paired["b"] == pytest.approx(found["tonight"]["test/ndcg_at_10"])
    # settings that would read tonight's item indices as the champion's are refused first
    for setting, named in (
        ("training.transition_prior=0.5", "training.transition_prior=0.5 counts this data's"),
        ("training.sampled_metrics={num_negatives: 10, sampler: uniform}", "training.sampled"),
    ):
        job = [f"model_ref={champion}", *tonight, "other_data=true", setting]
        with pytest.raises(ValueError, match=f"other_data=true: {named}"):
            evaluate.run(make_config("evaluate", job))
    # another shop's log (no item id in common) is refused, naming both models' ids
    shop = tmp_path / "other-shop.parquet"
    events.with_columns(pl.col("item_id") + 2 * 10**9).write_parquet(shop)
    job = [f"model_ref={champion}", *data[:3], f"data.source={shop}", "logger=none"]
    job += ["other_data=true", f"paths.run_dir={tmp_path / 'shop'}"]
    with pytest.raises(ValueError, match="other_data=true: model=.* knows none of this data's"):
        evaluate.run(make_config("evaluate", job))
    assert not (tmp_path / "shop" / "prepared").exists()  # nothing left behind


def test_a_model_read_through_an_item_map_scores_as_on_its_own_vocabulary(main_run, make_config):
    """other_data=true reads each batch through the data -> model item map (history, target,
    seen items). The main job's model with its item-indexed weights permuted, evaluated
    through that permutation, gives the metrics of the model itself, target by target."""
    from recsys.data.datamodule import SeqRecDataModule
    from recsys.model.transfer import vocabulary_rows
    from recsys.training.evaluation import TargetRecords
    from recsys.training.evaluation import evaluate as evaluate_loader

    cfg, result = main_run
    model = load_checkpoint(result.checkpoint)
    datamodule = SeqRecDataModule(
        Path(cfg.paths.run_dir) / "prepared",
        max_seq_len=model.max_seq_len,
        eval_batch_size=16,
        time_buckets=model.time_buckets,
    )
    datamodule.setup()
    job = make_config(
        "evaluate", [*TINY_DATA, "training.rerank_top_n=20", "training.seen_items=exclude"]
    )
    reserved = torch.arange(NUM_RESERVED)
    moved = torch.cat(
        [
            reserved,
            NUM_RESERVED
            + torch.randperm(model.vocab.items.height, generator=torch.Generator().manual_seed(0)),
        ]
    )
    permuted = copy.deepcopy(model.encoder)
    state = permuted.state_dict()
    for key, kind in vocabulary_rows(permuted).items():
        if kind in ("item", "data"):  # item rows: row i of the data is row moved[i] here
            table = state[key].clone()
            table[moved] = state[key]
            state[key] = table
    permuted.load_state_dict(state)
    found, records = {}, {}
    for name, encoder, item_map in (("own", model.encoder, None), ("mapped", permuted, moved)):
        records[name] = TargetRecords()
        module = evaluate._evaluation_module(job, encoder, model.vocab, datamodule.stats)
        found[name] = evaluate_loader(
            module,
            datamodule.target_loader("test"),
            device=torch.device("cpu"),
            split="test",
            records=records[name],
            item_map=item_map,
        )
    assert found["mapped"].pop("model_unknown_targets") == 0
    assert found["mapped"] == pytest.approx(found["own"], abs=1e-6)
    frames = {
        name: r.frame("test", datamodule.store.user_id, model.vocab.items["item_id"])
        for name, r in records.items()
    }
    assert frames["mapped"].equals(frames["own"])  # the data's targets, each ranked the same
    assert found["own"]["ndcg_at_10"] > 0


def test_a_model_of_another_id_type_on_its_own_log(main_run, make_config, tmp_path):
    """A model trained before whole-number float ids were read as integers holds ids 10.0;
    evaluated on its own log, now prepared with Int64 ids, it was refused as 'different data
    or data settings: give this job the data settings of its training', which the job did. Its
    vocabulary now reads back with Int64 ids, so it evaluates as the model of today's recsys
    does. Ids of a type no rule converts (text) are refused naming both types and the fixes."""
    import torch

    cfg, result = main_run
    checkpoint = torch.load(result.checkpoint, map_location="cpu", weights_only=False)
    vocab = checkpoint["recsys"]["vocab"]
    ids = list(vocab["item_id"])
    job = [*TINY_DATA, "training.rerank_top_n=20", "logger=none"]
    found = {}
    for kind, ids_as, type_name in (("float", float, "Float64"), ("text", str, "String")):
        vocab["item_id"], vocab["item_id_type"] = [ids_as(i) for i in ids], type_name
        path = tmp_path / f"{kind}-ids.ckpt"
        torch.save(checkpoint, path)
        cfg_kind = make_config(
            "evaluate", [f"model_ref={path}", *job, f"paths.run_dir={tmp_path / kind}"]
        )
        if kind == "float":
            found[kind] = evaluate.run(cfg_kind)
            continue
        with pytest.raises(
            ValueError, match="holds String item ids, the data this job prepared Int64 ones"
        ) as info:
            evaluate.run(cfg_kind)
        assert "data.prepared_dir=<that folder>" in str(info.value)
        assert "give this job the data settings" not in str(info.value)
        assert not (Path(cfg_kind.paths.run_dir) / "prepared").exists()  # nothing left behind
    ints = make_config(
        "evaluate", [f"model_ref={result.checkpoint}", *job, f"paths.run_dir={tmp_path / 'int'}"]
    )
    assert found["float"]["test/ndcg_at_10"] == evaluate.run(ints)["test/ndcg_at_10"]


def test_a_model_holding_an_empty_item_id_evaluated_on_its_log_names_the_id(make_config, tmp_path):
    """A model of a recsys before an empty text id read as missing holds "" as an item; its
    log, prepared now, sets those events aside, so the evaluation was refused as 'different
    data or data settings: give this job the data settings of its training', which the job
    did. The refusal names the id, why and the fixes no data setting replaces."""
    from recsys.data.synthetic import generate_events

    log = tmp_path / "events.parquet"
    events = generate_events(num_users=60, num_items=40, num_categories=4, seed=3)
    events.with_columns(pl.col("user_id", "item_id").cast(pl.String)).write_parquet(log)
    data = ["data=events_file", f"data.source={log}", "data.split.method=leave_one_out"]
    small = ["logger=none", "trainer.max_epochs=1", "model.d_model=16", "model.num_layers=1"]
    trained = train.run(make_config("config", [*data, *small]))
    checkpoint = torch.load(trained.checkpoint, map_location="cpu", weights_only=False)
    checkpoint["recsys"]["vocab"]["item_id"][0] = ""  # as the earlier recsys prepared a lost id
    old = tmp_path / "empty-id.ckpt"
    torch.save(checkpoint, old)
    job = make_config(
        "evaluate", [f"model_ref={old}", *data, "logger=none", f"paths.run_dir={tmp_path / 'e'}"]
    )
    with pytest.raises(ValueError, match='holds the item id "" .* reads as a missing one') as info:
        evaluate.run(job)
    assert "data.prepared_dir=<that folder>" in str(info.value)
    assert "give this job the data settings" not in str(info.value)


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


def test_best_validation_score_is_named_after_its_monitor(make_config):
    """A run selected on another metric (Taobao: val/mrr) reports it under that metric's name."""
    import torch

    monitor = ["callbacks.model_checkpoint.monitor=val/mrr"]  # early stopping follows it
    cfg = make_config("config", [*TINY, "logger=none", "trainer.max_epochs=2", *monitor])
    trained = train.run(cfg)
    assert list(trained.best_val) == ["best/val_mrr"]
    best = torch.load(trained.checkpoint, map_location="cpu", weights_only=False)
    callback = next(v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert callback["monitor"] == "val/mrr"
    assert any(k.startswith("EarlyStopping{'monitor': 'val/mrr'") for k in best["callbacks"])
    assert trained.best_val["best/val_mrr"] == pytest.approx(float(callback["best_model_score"]))
    assert max(epoch["val/mrr"] for epoch in trained.history) == pytest.approx(
        trained.best_val["best/val_mrr"]
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("seed=abc", r"seed='abc' must be a whole number in \[0, 2\*\*32 - 1\]"),
        ("callbacks.early_stopping.patience=-1", r"early_stopping.patience=-1 must be a whole"),
        ("trainer.max_epochs=0", r"trainer.max_epochs=0 trains nothing"),
        ("trainer.max_epochs=-5", r"trainer.max_epochs=-5 must be a whole number >= 1, or -1"),
        ("training.optimizer.lr=-1", r"training.optimizer.lr=-1 must be a number > 0"),
        ("training.optimizer.weight_decay=nan", r"training.optimizer.weight_decay=nan must be"),
        (
            "callbacks.model_checkpoint.monitor=val/ndcg@10",
            r"callbacks.model_checkpoint.monitor='val/ndcg@10' is not a metric this run logs at "
            r"validation \(MLflow forbids '@' in metric names: write 'val/ndcg_at_10'\); set it "
            r"to one of: val/coverage_at_10, .*val/ndcg_at_10",
        ),
        (
            "callbacks.early_stopping.monitor=val/ndcg_at_30",
            r"callbacks.early_stopping.monitor='val/ndcg_at_30' is not a metric this run logs",
        ),
    ],
)
def test_absurd_training_settings_stop_the_run_before_it_trains(make_config, override, message):
    """Each names its setting and the fix, and is caught before the first training step (a
    monitor only once the sanity check's validation batches have logged their metrics), so no
    epoch is spent and no checkpoint written."""
    cfg = make_config("config", [*TINY, "logger=none", override])
    with pytest.raises(ValueError, match=message):
        train.run(cfg)
    assert not list(Path(cfg.paths.run_dir).rglob("*.ckpt"))


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ("retrieval.top_k=0", ValueError, r"retrieval.top_k=0 must be a positive integer"),
        ("retrieval.rules.allow_list=/no/such/list.csv", DataError, r"allow_list=.*no such file"),
        ("retrieval.rules.exclude=[bogus]", ValueError, r"rules.exclude=\['bogus'\]: use seen"),
    ],
)
def test_main_job_checks_its_scoring_settings_before_it_trains(
    make_config, monkeypatch, override, error, message
):
    """A scoring mistake is found before the training it would otherwise come after."""

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the scoring settings were checked")

    monkeypatch.setattr(train, "run", no_training)
    cfg = make_config("config", [*TINY, "logger=none", override])
    with pytest.raises(error, match=message):
        main.run(cfg)


def test_a_scoring_job_refused_by_its_rules_leaves_no_staging_folder(
    main_run, make_config, tmp_path
):
    """An allow list of ids the catalogue does not have is refused once the catalogue is
    built; the staging folder made for the parts (and its manifest) stayed behind."""
    _, result = main_run
    allowed = tmp_path / "allow.csv"
    pl.DataFrame({"item_id": [999_999_999, 888_888_888]}).write_csv(allowed)
    out = tmp_path / "recommendations"
    overrides = [f"model_ref={result.checkpoint}", "logger=none", *TINY_DATA]
    overrides += [f"retrieval.output.path={out}", f"retrieval.rules.allow_list={allowed}"]
    with pytest.raises((ValueError, DataError), match="allow_list"):
        score.run(make_config("score", overrides))
    assert [p.name for p in tmp_path.iterdir()] == ["allow.csv"]


def test_main_job_refuses_an_output_path_it_may_not_write_before_it_trains(
    make_config, monkeypatch, tmp_path
):
    """retrieval.output.path at a folder that is not a scoring output (a downstream team's
    folder) is refused whatever the model; the main job finds it before it trains, not after
    an hour of training."""

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the output path was checked")

    downstream = tmp_path / "downstream"
    downstream.mkdir()
    (downstream / "readme.txt").write_text("not a scoring output")
    monkeypatch.setattr(train, "run", no_training)
    cfg = make_config("config", [*TINY, "logger=none", f"retrieval.output.path={downstream}"])
    with pytest.raises(FileExistsError, match="is not a scoring output"):
        main.run(cfg)
    assert [p.name for p in downstream.iterdir()] == ["readme.txt"]


def test_a_main_job_that_fails_after_training_registers_no_version_and_moves_no_alias(
    make_config, monkeypatch
):
    """A nightly main job with logger.registered_model_name / model_alias whose evaluation or
    scoring fails exits with an error and leaves the registry as it was: no new version, the
    alias where it pointed (downstream scoring with <name>@<alias> keeps the last good
    model). Before, training registered the version and moved the alias before evaluating."""
    cfg = make_config(
        "config",
        [*TINY, "trainer.max_epochs=1", "logger.registered_model_name=m", "logger.model_alias=a"],
    )

    def scoring_fails(*args, **kwargs):
        raise RuntimeError("scoring failed")

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(score, "run", scoring_fails)
    with pytest.raises(RuntimeError, match="scoring failed"):
        main.run(cfg)
    client = mlflow_client(cfg.logger.tracking_uri)
    assert client.search_model_versions("name='m'") == []
    (failed,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert failed.info.status == "FAILED"
    # packaged only once the job succeeded: a resumed run's model/, which a version registered
    # from it serves, no longer takes the model of a job that then failed
    assert client.list_artifacts(failed.info.run_id, "model") == []
    assert failed.data.params["model.d_model"] == "16"  # its config, logged when it opened


def test_a_finished_main_job_resumed_with_more_epochs_replaces_its_own_recommendations(
    make_config, monkeypatch
):
    """config.yaml lets a resume raise trainer.max_epochs; continuing a finished main job then
    failed at scoring, after training, on the recommendations it had written into its own run
    folder before (an audit's finding). They are this job's, of an earlier model: replaced.
    Another main job's recommendations there are refused before the training, unless
    retrieval.output.overwrite=true."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    base = [*TINY, "callbacks.early_stopping.patience=50"]
    first = main.run(make_config("config", [*base, "trainer.max_epochs=1"]))
    manifest = (first.recommendations / "_manifest.json").read_text()
    resumed = main.run(make_config("config", [*base, "trainer.max_epochs=2", "resume=last"]))
    assert resumed.recommendations == first.recommendations
    assert (resumed.recommendations / "_manifest.json").read_text() != manifest  # a new model
    elsewhere = first.recommendations.parent.parent / "elsewhere"
    other = make_config("config", [*base, "trainer.max_epochs=1", f"paths.run_dir={elsewhere}"])
    other.retrieval.output.path = str(first.recommendations)  # not its own run folder's
    kept = (resumed.recommendations / "_manifest.json").read_text()
    trainings, real_training = [], train.run
    monkeypatch.setattr(train, "run", lambda *args, **kwargs: trainings.append(args))
    # another job's recommendations: refused before it trains (a model it has yet to train
    # cannot have written them), not after the training
    with pytest.raises(FileExistsError, match="holds an earlier scoring job's output"):
        main.run(other)
    assert trainings == []
    assert (resumed.recommendations / "_manifest.json").read_text() == kept
    monkeypatch.setattr(train, "run", real_training)
    other.retrieval.output.overwrite = True  # replaced once the new ones are written
    assert main.run(other).recommendations == first.recommendations
    assert (first.recommendations / "_manifest.json").read_text() != kept  # the 2-epoch model's


@pytest.mark.parametrize(
    "target",
    [
        "pytorch_lightning.callbacks.EMAWeightAveraging",
        "recsys.training.callbacks.BiasCorrectedEMA",
    ],
)
def test_weight_averaging_checkpoint_holds_the_validated_average(make_config, target):
    """callbacks.weight_averaging (EMA, plain or bias-corrected): validation scores the averaged
    weights, and the best checkpoint holds exactly them (the raw weights beside them), so
    evaluating the checkpoint on validation reproduces the selected score."""
    import torch

    ema = f"{{_target_: {target}, decay: 0.5}}"
    cfg = make_config(
        "config",
        [*TINY, "logger=none", "trainer.max_epochs=2", f"callbacks.weight_averaging={ema}"],
    )
    trained = train.run(cfg)
    best = torch.load(trained.checkpoint, map_location="cpu", weights_only=False)
    averaged, raw = best["state_dict"], best["current_model_state"]
    assert averaged.keys() == raw.keys()
    assert any(
        not torch.equal(averaged[k], raw[k]) for k in averaged if averaged[k].is_floating_point()
    )
    val = evaluate.run(cfg, trained.checkpoint, prepared_dir=trained.prepared_dir, splits=("val",))
    assert val["val/ndcg_at_10"] == pytest.approx(trained.best_val["best/val_ndcg_at_10"], abs=1e-6)
    # the epoch's history entry holds that epoch's metrics, coverage (logged last) included
    best = max(trained.history, key=lambda entry: entry["val/ndcg_at_10"])
    for name in ("val/ndcg_at_10", "val/coverage_at_10"):
        assert best[name] == pytest.approx(val[name], abs=1e-6), name
    assert make_config("config", TINY).callbacks.weight_averaging is None  # off by default


def test_interrupted_training_resumes_from_its_last_epoch(make_config, monkeypatch):
    """resume=last continues the run folder's last.ckpt: epochs, optimiser steps, the training
    clock, the best checkpoint and the MLflow run carry on from where the first call stopped; a
    checkpoint of other data or another model is refused, naming the difference."""
    import torch

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ema = "callbacks.weight_averaging={_target_: pytorch_lightning.callbacks.EMAWeightAveraging}"
    base = [*TINY, "callbacks.early_stopping.patience=50", ema]
    first_cfg = make_config("config", [*base, "trainer.max_epochs=2"])
    first = train.run(first_cfg)
    last = first.checkpoint.parent / "last.ckpt"
    steps = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    assert [e["epoch"] for e in first.history] == [0.0, 1.0]

    resumed = train.run(make_config("config", [*base, "trainer.max_epochs=3", "resume=last"]))
    assert [e["epoch"] for e in resumed.history] == [0.0, 1.0, 2.0]
    assert resumed.history[:2] == first.history  # restored, not trained again
    assert resumed.train_seconds > first.train_seconds
    final = torch.load(last, map_location="cpu", weights_only=True)
    assert final["global_step"] == steps * 3 // 2
    assert final["epoch"] == 2
    best_val = max(e["val/ndcg_at_10"] for e in resumed.history)
    assert resumed.best_val["best/val_ndcg_at_10"] == pytest.approx(best_val)

    # one MLflow run for the whole training: the resumed call continued the first one's
    client = mlflow_client(first_cfg.logger.tracking_uri)
    run_id = first.run.split()[2]
    assert resumed.run == first.run and final["recsys"]["mlflow_run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    epochs = [m.step for m in client.get_metric_history(run_id, "val/ndcg_at_10")]
    assert len(epochs) == 3 and epochs == sorted(epochs)
    assert run.data.params["trainer.max_epochs"] == "2"  # first value kept; the change is a tag
    assert run.data.tags["changed_param.trainer.max_epochs"] == "3"
    assert run.data.tags["changed_param.resume"] == "last"
    assert run.data.tags["train.resumed_from"] == str(last)

    again = [*base, "trainer.max_epochs=4", "resume=last"]
    with pytest.raises(ValueError, match=r"holds another model .*d_model 16 -> 32"):
        train.run(make_config("config", [*again, "model.d_model=32"]))
    with pytest.raises(ValueError, match=r"another model .*encoder 'recsys.model.atrank.ATRank'"):
        train.run(make_config("config", [*again, "model=sasrec", "model.d_model=16"]))
    prepared = last.parents[1] / "prepared"
    before = {p.name: p.read_bytes() for p in prepared.iterdir()}
    with pytest.raises(ValueError, match="was trained on other data"):
        train.run(make_config("config", [*again, "data.source.num_users=160"]))
    # other data settings are refused before the log is prepared, naming the run's
    with pytest.raises(
        ValueError, match=r"last.ckpt was trained on data prepared with other"
    ) as info:
        train.run(make_config("config", [*again, "data.min_user_events=3"]))
    assert "(data.min_user_events=2), or drop resume" in str(info.value)
    # the refused resume left the run's data as it was, so it can still be continued
    assert {p.name: p.read_bytes() for p in prepared.iterdir()} == before
    staged = [p.name for p in prepared.parent.iterdir() if p.name.startswith(".")]
    assert sorted(staged) == [train.LOCK_FILE]  # no staging folder left (the lock stays)
    elsewhere = make_config("config", [*again, f"paths.run_dir={last.parents[2] / 'new'}"])
    with pytest.raises(FileNotFoundError, match=r"checkpoints/last.ckpt does not exist: pass"):
        train.run(elsewhere)
    # its last.ckpt from another run folder, where Lightning would lose the best so far
    branch = make_config("config", [*base, "trainer.max_epochs=4", f"resume={last}"])
    branch.paths.run_dir = str(last.parents[2] / "branch")
    with pytest.raises(ValueError, match=r"belongs to another run folder .*resume=last"):
        train.run(branch)
    scoring = last.parent / "scoring" / "model.ckpt"
    with pytest.raises(ValueError, match="is a scoring checkpoint .* cannot continue a training"):
        train.run(make_config("config", [*base, "trainer.max_epochs=4", f"resume={scoring}"]))


def test_a_run_folder_moved_before_its_resume_continues_its_own_checkpoints(make_config, tmp_path):
    """A run folder copied elsewhere (restored from a backup onto another disk) and resumed
    there: Lightning, its checkpoint's dirpath being the old folder's, dropped the best score
    so far and wrote best-v1.ckpt and last-v1.ckpt beside best.ckpt and last.ckpt (the next
    resume=last read the stale last.ckpt); it continues as in its own folder now."""
    import shutil

    base = [*TINY, "logger=none", "callbacks.early_stopping.patience=50"]
    first = train.run(make_config("config", [*base, "trainer.max_epochs=1"]))
    moved = tmp_path / "restored" / "run"
    shutil.copytree(first.checkpoint.parents[1], moved)
    # and what a resume killed by SIGKILL left: its trial preparation, the staging folder of one
    shutil.copytree(moved / "prepared", moved / ".prepared-resume")
    shutil.copytree(moved / "prepared", moved / f"..prepared-resume.{'0' * 32}")
    again = [*base, "trainer.max_epochs=2", "resume=last", f"paths.run_dir={moved}"]
    resumed = train.run(make_config("config", again))
    assert sorted(p.name for p in moved.iterdir() if p.name.startswith(".")) == [train.LOCK_FILE]
    checkpoints = moved / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt", "scoring"]
    assert resumed.checkpoint == checkpoints / "best.ckpt"
    assert resumed.history[:1] == first.history
    best = max(e["val/ndcg_at_10"] for e in resumed.history)
    assert resumed.best_val["best/val_ndcg_at_10"] == pytest.approx(best)
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["epoch"] == 1


def test_a_resume_without_tracking_names_the_settings_its_checkpoint_keeps(make_config, caplog):
    """A resumed training continues its optimiser and early stopping's patience from the
    checkpoint (Lightning restores them), so a new learning rate or patience is not applied.
    A tracked run that continues the interrupted one names them in a warning (comparing its
    logged parameters); with logger=none they were not applied without a word. They are now
    compared with the checkpoint's own state and named the same way."""
    base = [*TINY, "logger=none", "callbacks.early_stopping.patience=50"]
    train.run(make_config("config", [*base, "trainer.max_epochs=1"]))
    last = Path(make_config("config", base).paths.run_dir) / "checkpoints" / "last.ckpt"
    changed = [
        *TINY,
        "logger=none",
        "trainer.max_epochs=2",
        "resume=last",
        "training.optimizer.lr=0.002",
        "callbacks.early_stopping.patience=7",
    ]
    with caplog.at_level("WARNING", logger="recsys.tasks.train"):
        train.run(make_config("config", changed))
    message = "not applied to the resumed training, which continues from its checkpoint"
    assert message in caplog.text
    assert "training.optimizer.lr 0.001 (given 0.002)" in caplog.text
    assert "callbacks.early_stopping.patience 50 (given 7)" in caplog.text
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["optimizer_states"][0]["param_groups"][0]["lr"] == 0.001  # as the warning says
    caplog.clear()
    with caplog.at_level("WARNING", logger="recsys.tasks.train"):  # nothing changed: no word
        train.run(make_config("config", [*base, "trainer.max_epochs=3", "resume=last"]))
    assert message not in caplog.text


def test_a_training_interrupted_before_an_upgrade_resumes_after_it(make_config):
    """A run folder whose prepared data an earlier recsys wrote (no format recorded, which
    this version refuses to read) is resumed: the log is prepared again for the fingerprint
    check anyway, and that folder, the same data in this version's format, replaces it. Its
    last.ckpt, written before an encoder argument existed (query_time), holds the model that
    argument's ARGUMENTS_BEFORE_THEY_EXISTED value builds, as load_checkpoint reads it: the
    resume was refused as 'another model (query_time None -> True)'."""
    base = [*TINY, "logger=none", "callbacks.early_stopping.patience=50"]
    first = train.run(make_config("config", [*base, "trainer.max_epochs=1"]))
    stats_file = first.checkpoint.parents[1] / "prepared" / STATS_FILE
    stats = json.loads(stats_file.read_text())
    del stats["format_version"]  # as prepared before the format was recorded
    stats_file.write_text(json.dumps(stats))
    last = first.checkpoint.parent / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["recsys"]["format_version"] == CHECKPOINT_FORMAT
    newer = {**checkpoint, "recsys": {**checkpoint["recsys"], "format_version": 99}}
    torch.save(newer, last)  # a newer recsys's checkpoint: refused before any work
    with pytest.raises(ValueError, match=r"resume=last: .*last.ckpt is a checkpoint of format 99"):
        train.run(make_config("config", [*base, "trainer.max_epochs=2", "resume=last"]))
    del checkpoint["recsys"]["format_version"]
    assert checkpoint["recsys"]["encoder_config"].pop("query_time") is True
    torch.save(checkpoint, last)  # as saved before query_time (and the format) existed
    resumed = train.run(make_config("config", [*base, "trainer.max_epochs=2", "resume=last"]))
    assert [e["epoch"] for e in resumed.history] == [0.0, 1.0]
    assert resumed.history[:1] == first.history
    assert load_stats(stats_file.parent)["format_version"] == FORMAT_VERSION
    assert {p.name for p in stats_file.parents[1].iterdir() if p.name.startswith(".")} == {
        train.LOCK_FILE
    }  # no staging folder left


def test_a_training_whose_log_reads_otherwise_after_an_upgrade_names_its_own_data(make_config):
    """A training interrupted before an upgrade that reads its log otherwise (whole-number
    float ids as integers, "" ids as missing, ...) was refused on resume as 'trained on other
    data: resume with the data and data settings of the interrupted run', which the job did.
    When the run folder still holds the data it was trained on, the refusal names it as the
    way to continue (data.prepared_dir), which does continue it."""
    base = [*TINY, "logger=none", "callbacks.early_stopping.patience=50"]
    first = train.run(make_config("config", [*base, "trainer.max_epochs=1"]))
    run_dir = first.checkpoint.parents[1]
    earlier = "0" * 64  # the fingerprint the earlier recsys gave the same log
    stats_file = run_dir / "prepared" / STATS_FILE
    stats_file.write_text(
        json.dumps({**json.loads(stats_file.read_text()), "fingerprint": earlier})
    )
    last = first.checkpoint.parent / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    checkpoint["recsys"]["data_fingerprint"] = earlier
    torch.save(checkpoint, last)
    again = [*base, "trainer.max_epochs=2", "resume=last"]
    with pytest.raises(ValueError, match="trained on other data") as info:
        train.run(make_config("config", again))
    assert f"data.prepared_dir={run_dir / 'prepared'}" in str(info.value)
    resumed = train.run(
        make_config("config", [*again, f"data.prepared_dir={run_dir / 'prepared'}"])
    )
    assert [e["epoch"] for e in resumed.history] == [0.0, 1.0]


@pytest.mark.parametrize(
    "trainer", ["default", pytest.param("gpu", marks=pytest.mark.gpu)], ids=lambda t: f"trainer={t}"
)
def test_a_resumed_training_repeats_an_uninterrupted_one_exactly(make_config, tmp_path, trainer):
    """2 epochs, then resume=last to 3, gives the weights and validation figures of 3 epochs in
    one go: the batch order, dropout masks, input masks, sampled negatives and contrastive
    partners continue their random streams instead of starting again from the seed.
    (trainer.deterministic: on two threads some gradient sums otherwise differ in the last
    bits between any two runs, resumed or not; on a GPU, atomic adds do.)"""
    import torch

    random_draws = [
        *TINY,
        f"trainer={trainer}",
        "logger=none",
        "trainer.deterministic=true",
        "callbacks.early_stopping.patience=50",
        "callbacks.weight_averaging={_target_: pytorch_lightning.callbacks.EMAWeightAveraging}",
        "data.loader.train_samples=prefixes",
        "training.contrastive_weight=0.1",
        "training.contrastive_positive=same_target",
        "training.input_mask_prob=0.2",
        "training.loss=sampled_softmax",
        "training.num_negatives=16",
    ]

    def final(run_dir: Path) -> dict:
        return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)

    whole = train.run(
        make_config(
            "config", [*random_draws, f"paths.run_dir={tmp_path / 'whole'}", "trainer.max_epochs=3"]
        )
    )
    parts = [*random_draws, f"paths.run_dir={tmp_path / 'parts'}"]
    train.run(make_config("config", [*parts, "trainer.max_epochs=2"]))
    resumed = train.run(make_config("config", [*parts, "trainer.max_epochs=3", "resume=last"]))

    strip = [{k: v for k, v in e.items() if k != "train_seconds"} for e in whole.history]
    assert [{k: v for k, v in e.items() if k != "train_seconds"} for e in resumed.history] == strip
    a, b = final(tmp_path / "whole"), final(tmp_path / "parts")
    assert a["global_step"] == b["global_step"]
    for key in ("state_dict", "current_model_state"):  # the EMA weights and the raw ones
        assert a[key].keys() == b[key].keys()
        different = [k for k in a[key] if not torch.equal(a[key][k], b[key][k])]
        assert not different, f"{key}: {different}"


@pytest.mark.gpu
def test_the_main_job_runs_on_a_gpu_and_its_scoring_there_matches_the_cpu(make_config, tmp_path):
    """trainer=gpu (bf16-mixed) and retrieval.accelerator=gpu: prepare -> train -> evaluate ->
    score on CUDA; the CPU's scoring of the same checkpoint gives the same scores rank by rank
    (items may swap only where two scores tie within float error)."""
    import math

    import torch

    result = main.run(
        make_config("config", [*TINY, "trainer=gpu", "retrieval.accelerator=gpu", "logger=none"])
    )
    assert torch.cuda.max_memory_allocated() > 0
    assert all(math.isfinite(v) for v in result.metrics.values())
    on_gpu = read_parts(result.recommendations)
    on_cpu = read_parts(
        score.run(
            make_config(
                "score",
                [
                    f"model_ref={result.checkpoint}",
                    *TINY_DATA,
                    "retrieval.rerank_top_n=20",
                    "retrieval.accelerator=cpu",
                    "logger=none",
                    f"retrieval.output.path={tmp_path / 'on_cpu'}",
                ],
            )
        )
    )
    assert on_gpu.height > 0
    assert on_gpu.select("user_id", "rank").equals(on_cpu.select("user_id", "rank"))
    torch.testing.assert_close(
        on_gpu["score"].to_torch(), on_cpu["score"].to_torch(), rtol=1e-4, atol=1e-4
    )
    assert (on_gpu["item_id"] == on_cpu["item_id"]).mean() > 0.98


def test_a_training_killed_by_sigterm_exits_non_zero(make_config, monkeypatch):
    """Lightning ends a SIGTERM'd fit with SystemExit() (exit status 0): a scheduler would take
    the killed job for a finished one. The job exits 143 (128 + SIGTERM) instead."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    def killed(*args, **kwargs):
        raise SIGTERMException

    monkeypatch.setattr(Trainer, "fit", killed)
    with pytest.raises(SystemExit) as info:
        train.run(make_config("config", [*TINY, "logger=none"]))
    assert info.value.code == 143


def test_a_sigterm_mid_epoch_under_the_jobs_handler_exits_143_not_as_a_ctrl_c(
    make_config, monkeypatch, caplog
):
    """A pipeline runs under terminate_as_exit, whose SystemExit(143) Lightning's own SIGTERM
    handler calls in fit and then re-raises: the job took it for Lightning's Ctrl-C exit, and
    a scheduler's kill ended as "interrupted (Ctrl-C) while training" with status 130. The log
    says how to continue (it ended with the signal alone)."""
    import os
    import signal

    from recsys.data.pipeline import terminate_as_exit
    from recsys.training.module import SeqRecModule

    step = SeqRecModule.training_step

    def killed(self, *args, **kwargs):
        if self.current_epoch == 1:  # the second epoch: the first's last.ckpt is written
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(SeqRecModule, "training_step", killed)
    cfg = make_config("config", [*TINY, "logger=none"])
    with pytest.raises(SystemExit) as info, terminate_as_exit():
        train.run(cfg)
    assert info.value.code == 143
    run_dir = Path(cfg.paths.run_dir).resolve()
    assert (
        "training killed by SIGTERM in epoch 2: continue it from its last finished epoch with "
        f"the same command and paths.run_dir={run_dir} resume=last"
    ) in caplog.text


def test_a_training_interrupted_by_ctrl_c_is_an_interrupt_and_ctrl_c_works_again(
    make_config, monkeypatch, caplog
):
    """Lightning turns a Ctrl-C in fit into sys.exit(1) and leaves SIGINT ignored: the job
    logged "SystemExit: 1" (a failure of its own, exit status 1), and a notebook's next
    Ctrl-C did nothing. It is a KeyboardInterrupt (exit status 130), and Ctrl-C is restored."""
    import signal

    from recsys.training.module import SeqRecModule

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(SeqRecModule, "training_step", interrupted)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="while training"):
        train.run(make_config("config", [*TINY, "logger=none"]))
    assert signal.getsignal(signal.SIGINT) is before
    assert "training interrupted (Ctrl-C) in epoch 1, before any checkpoint" in caplog.text


def test_training_into_a_run_folder_that_holds_a_training_is_refused_before_any_work(
    make_config, monkeypatch
):
    """The same paths.run_dir again without resume would train fully beside the first
    training (best-v1.ckpt), overwrite its scoring checkpoint and config, and leave a later
    resume=last the old last.ckpt: refused before the data is prepared, naming the folder and
    both fixes. resume=last, and a fresh folder, go on to the work."""
    base = [*TINY, "logger=none", "trainer.max_epochs=1"]
    first = train.run(make_config("config", base))
    checkpoints = first.checkpoint.parent
    before = {p: p.stat().st_mtime_ns for p in checkpoints.rglob("*") if p.is_file()}
    assert {p.name for p in before} == {"best.ckpt", "last.ckpt", "model.ckpt"}

    def no_preparation(*args, **kwargs):
        raise AssertionError("the data was prepared")

    monkeypatch.setattr(train.prepare, "run", no_preparation)
    run_dir = checkpoints.parent
    message = (
        rf"paths.run_dir={run_dir} already holds a training \(checkpoints/best.ckpt, "
        r"checkpoints/last.ckpt, checkpoints/scoring/model.ckpt\): continue it with "
        r"resume=last, or train into another folder \(a new hydra.run.dir=\.\.\. or "
        r"paths.run_dir=\.\.\., or none"
    )
    with pytest.raises(FileExistsError, match=message):
        train.run(make_config("config", [*base, "model.d_model=32"]))
    assert {p: p.stat().st_mtime_ns for p in checkpoints.rglob("*") if p.is_file()} == before

    with pytest.raises(AssertionError, match="the data was prepared"):  # past the check
        train.run(make_config("config", [*base, "resume=last"]))
    fresh = make_config("config", [*base, f"paths.run_dir={run_dir.parent / 'another'}"])
    with pytest.raises(AssertionError, match="the data was prepared"):
        train.run(fresh)


def test_a_run_folder_a_running_job_holds_is_refused(make_config, monkeypatch, tmp_path):
    """A second job given the folder a job is training in right now (a scheduler starting the
    same command twice) is refused before any work, naming the holder: the first job has no
    checkpoint yet, so check_run_folder alone would let both train there. Once the holder has
    ended, the folder is free again; a job refused before any work leaves no folder."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(run_dir / train.LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'process 7 on the scheduler')\n"
            "print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"

        def no_preparation(*args, **kwargs):
            raise AssertionError("the data was prepared")

        monkeypatch.setattr(train.prepare, "run", no_preparation)
        cfg = make_config("config", [*TINY, "logger=none", f"paths.run_dir={run_dir}"])
        message = rf"paths.run_dir={run_dir} is in use by a job running now \(process 7 on the"
        with pytest.raises(FileExistsError, match=message):
            main.run(cfg)
        with pytest.raises(FileExistsError, match=message):
            train.run(cfg)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(AssertionError, match="the data was prepared"):  # free again
        train.run(cfg)
    other = make_config("config", [*TINY, "logger=none", f"paths.run_dir={tmp_path / 'new'}"])
    with pytest.raises(AssertionError, match="the data was prepared"):
        main.run(other)
    assert not (tmp_path / "new").exists()


def test_default_run_folders_of_jobs_started_in_the_same_second_differ(monkeypatch):
    """Two jobs started within one second (a scheduler firing two trainings) each get their
    own run folder (and sweep folder), still named by their start time so they sort in start
    order; the jobs of one -m sweep share its folder, one subfolder each (hydra.job.num)."""
    from datetime import datetime

    import hydra.core.utils
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    class Clock(datetime):
        reading = datetime(2025, 1, 2, 3, 4, 5, 100_000)

        @classmethod
        def now(cls, tz=None):
            return cls.reading

    monkeypatch.setattr(hydra.core.utils, "datetime", Clock)  # what ${now:...} reads
    folders = []
    for reading in (Clock.reading, Clock.reading.replace(microsecond=900_000)):
        Clock.reading = reading
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", ["paths.output_dir=/out"], return_hydra_config=True)
        folders.append((cfg.hydra.run.dir, cfg.hydra.sweep.dir))
    (run_a, sweep_a), (run_b, sweep_b) = folders
    assert run_a != run_b and sweep_a != sweep_b
    assert run_a < run_b and sweep_a < sweep_b
    assert Path(run_a).parent == Path("/out/runs")
    assert Path(sweep_a).parent == Path("/out/multiruns")
    assert Path(run_a).name.startswith("2025-01-02_03-04-05")
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}"


@pytest.mark.parametrize("config_name", ["evaluate", "score"])
def test_sweeps_of_evaluate_and_score_go_under_the_output_folder(config_name):
    """A -m sweep of pipelines.evaluate / pipelines.score writes under paths.output_dir's
    multiruns/ (to the microsecond, one subfolder per job), as the main job's sweeps do, not
    into Hydra's default multirun/<date>/<time>/ in the working directory."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name, ["paths.output_dir=/out", "model_ref=x.ckpt"], return_hydra_config=True
        )
    sweep = Path(cfg.hydra.sweep.dir)
    assert sweep.parent == Path("/out/multiruns")
    assert sweep.name.endswith(f"_{config_name}") and len(sweep.name.split("_")) == 4
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}"


def test_output_folder_stays_at_the_launch_directory_with_hydra_job_chdir(tmp_path, monkeypatch):
    """hydra.job.chdir=true moves the process into the run folder before the job resolves its
    config: paths.output_dir (the MLflow store, the shared data) is still the launch
    directory's, not a new outputs/ inside each run folder."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    launch, run_folder = tmp_path / "launch", tmp_path / "launch" / "outputs" / "runs" / "r"
    run_folder.mkdir(parents=True)
    monkeypatch.chdir(launch)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", ["hydra.job.chdir=true"], return_hydra_config=True)
    cfg.hydra.runtime.cwd = str(launch)  # what Hydra records before it changes directory
    HydraConfig.instance().set_config(cfg)
    try:
        monkeypatch.chdir(run_folder)  # hydra.job.chdir=true
        assert cfg.paths.output_dir == str(launch / "outputs")
        assert cfg.logger.tracking_uri == f"sqlite:///{launch / 'outputs'}/mlflow.db"
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize(
    ("pipeline", "says"),
    [
        ("pipelines.train", "pipelines.train    prepare (or reuse data.prepared_dir=<folder>)"),
        ("pipelines.score", "model= names the trained model to load, not an option\nof the model"),
        ("pipelines.evaluate", "as +experiment=<name> (with the +)"),
    ],
)
def test_help_says_what_the_pipeline_does_and_how_to_name_its_model(tmp_path, pipeline, says):
    """--help began "train is powered by Hydra" and, for score and evaluate, listed the model
    group's architectures (atrank, sasrec, ...) as the choices of model=, which there names the
    model to load (model=sasrec: "names an MLflow run or registered model"). It creates
    nothing."""
    command = [sys.executable, "-m", pipeline, "--help"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"python -m {pipeline} ")
    assert says in done.stdout
    assert "== Configuration groups ==" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_relative_paths_are_read_from_the_launch_directory_with_hydra_job_chdir(tmp_path):
    """hydra.job.chdir=true: a relative data.source is read from the folder the job was started
    in (it was looked for in the run folder: "event log events.parquet does not exist"), and
    the prepared data still goes to the run folder."""
    from recsys.data.synthetic import generate_events

    generate_events(num_users=60, num_items=40, num_categories=4, seed=3).write_parquet(
        tmp_path / "events.parquet"
    )
    command = [
        sys.executable,
        "-m",
        "pipelines.prepare",
        "data=events_file",
        "data.source=events.parquet",
        "data.split.method=leave_one_out",
        "logger=none",
        "hydra.job.chdir=true",
        "hydra.run.dir=night",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "night" / "prepared" / "sequences.parquet").is_file()
    assert f"the job works from {tmp_path}, where it was started" in done.stdout


def test_attribute_loss_trains_and_evaluates_beside_the_baselines(make_config):
    """training.attribute_loss_weight through the real tasks: the checkpoint records it, and
    the evaluation (whose popularity and transition baselines have no attributes) runs."""
    import torch

    overrides = [*TINY, "logger=none", "trainer.max_epochs=1", "training.attribute_loss_weight=0.5"]
    cfg = make_config("config", overrides)
    trained = train.run(cfg)
    best = torch.load(trained.checkpoint, map_location="cpu", weights_only=False)
    assert best["hyper_parameters"]["attribute_loss_weight"] == 0.5
    test = evaluate.run(cfg, trained.checkpoint, prepared_dir=trained.prepared_dir)
    expected = {"test/ndcg_at_10", "test/popularity_ndcg_at_10", "test/transition_ndcg_at_10"}
    assert expected <= set(test)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_gru4rec_trains_evaluates_scores_and_exports(make_config, tmp_path):
    """model=gru4rec through the main job (prepare -> train -> evaluate -> score, with
    explanations) and the serving export of its checkpoint, which scores as the model does."""

    from unit.test_export import assert_served_like_trained  # tests/ is on the pythonpath

    from recsys.checkpoint import load_checkpoint

    cfg = make_config("config", [*TINY, "logger=none", "trainer.max_epochs=1", "model=gru4rec"])
    result = main.run(cfg)
    assert result.metrics["test/ndcg_at_10"] >= 0
    recs = read_parts(result.recommendations)
    assert recs.group_by("user_id").len()["len"].max() == cfg.retrieval.top_k
    assert recs["score"].is_finite().all()
    model = load_checkpoint(result.checkpoint)
    assert type(model.encoder).__name__ == "GRU4Rec"
    assert_served_like_trained(model, tmp_path / "served")


def test_faithful_preset_trains_on_every_prefix(make_config, tmp_path):
    """data.loader.train_samples=prefixes: the non-causal reference encoder learns from every
    training target (one row each), through the real training task."""
    overrides = [
        *TINY,
        "logger=none",
        "trainer.max_epochs=1",
        "model=atrank_faithful",
        "data.loader.train_samples=prefixes",
    ]
    trained = train.run(make_config("config", overrides))
    assert trained.checkpoint.exists()
    assert trained.best_val["best/val_ndcg_at_10"] >= 0
    elsewhere = f"paths.run_dir={tmp_path / 'bad'}"  # (the first run's folder is taken)
    bad = make_config(
        "config", [*TINY, "logger=none", "data.loader.train_samples=every", elsewhere]
    )
    with pytest.raises(ValueError, match=r"train_samples='every' is not supported"):
        train.run(bad)


@pytest.mark.slow
def test_a_training_on_a_reused_folder_keeps_its_own_time_buckets_through_a_resume(
    make_config, tmp_path
):
    """A folder prepared with the default time buckets trains ``model=atrank_faithful`` with
    the preset's (gaps to the target), which its checkpoint records; the folder's fingerprint
    does not say which buckets a training used, so a resume with others is refused by name."""
    folder = prepare.run(make_config("config", TINY), tmp_path / "prepared")
    overrides = [
        *TINY,
        "logger=none",
        "model=atrank_faithful",
        f"data.prepared_dir={folder}",
        "callbacks.early_stopping.patience=50",
    ]
    trained = train.run(make_config("config", [*overrides, "trainer.max_epochs=1"]))
    assert load_checkpoint(trained.checkpoint).time_buckets.reference == "target"
    resume = [*overrides, "trainer.max_epochs=2", "resume=last"]
    with pytest.raises(ValueError, match=r"holds another model .*data.time_buckets .*86400"):
        train.run(make_config("config", [*resume, "data.time_buckets.unit_seconds=86400"]))


def test_a_schedule_set_in_epochs_learns_the_epoch_length_from_the_trainer(make_config):
    """training.scheduler=warmup_cosine through the real training task: the module hands it
    the steps per epoch, so after one epoch of a 2-epoch horizon with half an epoch of warm-up
    the decay is a third done, whatever the epoch's length: lr * (1 + cos(pi/3)) / 2."""
    import torch

    schedule = (
        "training.scheduler={_target_: recsys.training.schedules.warmup_cosine, _partial_: true,"
        " epochs: 2, warmup_epochs: 0.5}"
    )
    overrides = [*TINY, "logger=none", "trainer.max_epochs=1", schedule]
    cfg = make_config("config", overrides)
    trained = train.run(cfg)
    last = torch.load(
        trained.checkpoint.with_name("last.ckpt"), map_location="cpu", weights_only=False
    )
    (state,) = last["lr_schedulers"]
    assert state["last_epoch"] > 1  # optimiser steps taken
    lr = cfg.training.optimizer.lr
    assert state["_last_lr"][0] == pytest.approx(lr * 0.75)


def test_same_target_contrastive_loss_trains_through_the_real_tasks(make_config, tmp_path):
    """training.contrastive_positive=same_target: the data module adds each row's same-target
    partner to the batch (the module refuses batches without them); without prefixes it is
    refused up front."""
    same_target = ["training.contrastive_weight=0.1", "training.contrastive_positive=same_target"]
    overrides = [
        *TINY,
        "logger=none",
        "trainer.max_epochs=1",
        "model.causal=false",
        "data.loader.train_samples=prefixes",
        *same_target,
    ]
    import torch

    trained = train.run(make_config("config", overrides))
    best = torch.load(trained.checkpoint, map_location="cpu", weights_only=False)
    assert best["hyper_parameters"]["contrastive_positive"] == "same_target"
    assert trained.best_val["best/val_ndcg_at_10"] >= 0
    elsewhere = f"paths.run_dir={tmp_path / 'bad'}"  # (the first run's folder is taken)
    bad = make_config("config", [*TINY, "logger=none", *same_target, elsewhere])
    with pytest.raises(ValueError, match=r"need data.loader.train_samples=prefixes"):
        train.run(bad)


def test_a_training_starts_from_a_models_weights_and_distils_trained_teachers(
    make_config, tmp_path
):
    """init_from and training.distillation through the real training task: the student starts
    from the teacher's weights (a learning rate too small to move them keeps them), learns from
    the teachers, saves none of them, and refuses teachers of other data before it trains."""
    import torch

    base = [*TINY, "logger=none", "trainer.max_epochs=1"]
    teacher = train.run(make_config("config", [*base, f"paths.run_dir={tmp_path / 'teacher'}"]))
    ref = str(teacher.checkpoint)
    student_overrides = [
        *base,
        f"paths.run_dir={tmp_path / 'student'}",
        f"init_from={ref}",
        f"training.distillation={{teachers: [{ref}, {ref}], weight: 0.5, temperature: 2.0}}",
        "training.optimizer.lr=1e-12",
        "model.dropout=0.3",  # may differ: not a weight
    ]
    student = train.run(make_config("config", student_overrides))

    def weights(path):
        state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
        return {k: v for k, v in state.items() if k.startswith("encoder.")}, state

    taught, state = weights(student.checkpoint)
    start, _ = weights(teacher.checkpoint)
    assert set(state) == set(taught)  # the teachers are not saved with the student
    assert taught.keys() == start.keys()
    for key in start:
        torch.testing.assert_close(taught[key], start[key], atol=1e-6, rtol=0)
    hyper = torch.load(student.checkpoint, map_location="cpu", weights_only=False)
    assert hyper["hyper_parameters"]["distillation"] == {
        "teachers": 2,
        "weight": 0.5,
        "temperature": 2.0,
    }
    # a teacher of other data (another catalogue) is refused, naming the option and why
    other = make_config(
        "config",
        [
            *base,
            "data.source.num_items=100",
            f"paths.run_dir={tmp_path / 'other'}",
            f"training.distillation={{teachers: [{ref}]}}",
        ],
    )
    with pytest.raises(ValueError, match=r"training.distillation.teachers=.*vocabulary"):
        train.run(other)
    # init_from a model of other data (another night's log): its rows follow the item ids
    warm = train.run(
        make_config(
            "config",
            [
                *base,
                "data.source.num_users=200",  # the same catalogue, other journeys
                f"paths.run_dir={tmp_path / 'next'}",
                f"init_from={ref}",
                "training.optimizer.lr=1e-12",
            ],
        )
    )
    before, after = load_checkpoint(teacher.checkpoint), load_checkpoint(warm.checkpoint)
    assert before.vocab.content_hash() != after.vocab.content_hash()
    table = "embedding.item_embedding.weight"
    was = dict(zip(before.vocab.item_ids(), before.encoder.state_dict()[table], strict=True))
    now = dict(zip(after.vocab.item_ids(), after.encoder.state_dict()[table], strict=True))
    shared = [item for item in now if item is not None and item in was]
    assert 0 < len(shared) < len(now) - 2
    for item in shared:
        torch.testing.assert_close(now[item], was[item], atol=1e-6, rtol=0)
    both = make_config(
        "config", [*base, f"paths.run_dir={tmp_path / 'both'}", f"init_from={ref}", "resume=last"]
    )
    with pytest.raises(ValueError, match=r"init_from and resume are both set"):
        train.run(both)
    assert not (tmp_path / "both").exists()  # refused before any work
    wider = make_config(
        "config",
        [*base, f"paths.run_dir={tmp_path / 'wider'}", f"init_from={ref}", "model.causal=false"],
    )
    with pytest.raises(ValueError, match=r"init_from=.*model.causal True -> False"):
        train.run(wider)
    rescaled = make_config(
        "config",
        [
            *base,
            f"paths.run_dir={tmp_path / 'rescaled'}",
            f"init_from={ref}",
            "model.embedding_std=0.5",
        ],
    )
    with pytest.raises(ValueError, match=r"init_from=.*model.embedding_std"):
        train.run(rescaled)


def test_a_resumed_distillation_refuses_a_teacher_reference_that_now_names_another_model(
    make_config, tmp_path, caplog
):
    """The checkpoint records what each teacher was (its reference and model digest), and a
    resumed training whose teacher reference names another model since (the file replaced,
    an alias moved) is refused, naming it: it had continued silently with the other teacher,
    half of the run distilled from each."""
    import shutil

    base = [*TINY, "logger=none", "trainer.max_epochs=1"]
    first = train.run(make_config("config", [*base, f"paths.run_dir={tmp_path / 'a'}"]))
    other = train.run(
        make_config(
            "config", [*base, f"paths.run_dir={tmp_path / 'b'}", "training.optimizer.lr=0.01"]
        )
    )
    teacher = tmp_path / "teacher.ckpt"
    shutil.copy(first.checkpoint, teacher)
    student = [
        *base,
        f"paths.run_dir={tmp_path / 'student'}",
        f"training.distillation={{teachers: [{teacher}]}}",
    ]
    trained = train.run(make_config("config", student))
    recorded = torch.load(trained.checkpoint, map_location="cpu", weights_only=True)["recsys"]
    digest = model_digest(load_checkpoint(teacher))
    assert recorded["teachers"] == [
        {"ref": str(teacher), "model.uri": str(teacher), "digest": digest}
    ]
    resumed = make_config("config", [*student, "trainer.max_epochs=2", "resume=last"])
    shutil.copy(other.checkpoint, teacher)  # another model behind the same reference
    with pytest.raises(
        ValueError,
        match=rf"resume=last: .*teachers\[0\]={re.escape(str(teacher))} names another model "
        rf"than .* distilled from.*digest {digest[:12]}",
    ):
        train.run(resumed)
    shutil.copy(first.checkpoint, teacher)  # the same model again: the training continues
    assert train.run(resumed).checkpoint.exists()
    # a checkpoint of a recsys before teachers were recorded: nothing to check them against,
    # which the resume says (it had continued without a word, whatever the reference named)
    last = tmp_path / "student" / "checkpoints" / "last.ckpt"
    earlier = torch.load(last, map_location="cpu", weights_only=False)
    del earlier["recsys"]["teachers"]
    torch.save(earlier, last)
    with caplog.at_level("WARNING", logger="recsys"):
        train.run(make_config("config", [*student, "trainer.max_epochs=3", "resume=last"]))
    assert re.search(
        rf"resume=last: .*records no teacher .*teachers\[0\]={re.escape(str(teacher))} is "
        "taken as the model it distilled from, unchecked",
        caplog.text,
    )


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


@pytest.mark.parametrize(
    ("pipeline", "sweep", "expected"),
    [
        (
            "pipelines.train",
            ["model.num_heads=2,0"],
            "job 1 of the sweep's 2 (model.num_heads=0 ",
        ),
        (  # the main job's scoring settings too, swept by a config's hydra.sweeper.params
            "pipelines.run",
            ["--config-dir", "{configs}", "+sweep=bad", "model.num_heads=1,2"],
            "job 2 of the sweep's 4 (retrieval.top_k=-1 +sweep=bad model.num_heads=1 ",
        ),
        (  # a log file that is not there (an audit's finding: job 0 trained first)
            "pipelines.train",
            ["data=events_file", "data.source={configs}/sweep/bad.yaml,{configs}/nope.parquet"],
            "FileNotFoundError: job 1 of the sweep's 2 (data=events_file data.source=",
        ),
        (  # a checkpoint that is not there: found out when job 1 started, after job 0 trained
            "pipelines.train",
            ["init_from=null,{configs}/nope.ckpt"],
            "FileNotFoundError: job 1 of the sweep's 2 (init_from=",
        ),
        (  # one fixed output path for every job: job 1 would have trained, then been refused
            "pipelines.run",
            ["retrieval.output.path={configs}/recs", "model.num_heads=1,2"],
            "job 1 of the sweep's 2 (retrieval.output.path=",
        ),
        (  # one prepared folder for every job: job 1's data silently replaced job 0's
            "pipelines.prepare",
            ["data.prepared_dir={configs}/prepared", "data.min_user_events=2,3"],
            "job 1 of the sweep's 2 (data.prepared_dir=",
        ),
        (
            "pipelines.prepare",
            ["data.min_user_events=2,0"],
            "data.min_user_events=0 must be an integer >= 1. No job was run",
        ),
    ],
)
def test_a_sweep_with_one_bad_value_stops_before_any_job_runs(tmp_path, pipeline, sweep, expected):
    """``-m`` with one bad value among good ones: every job's config is checked before the
    first starts (recsys.config.CheckSweep), so the good jobs do not train first, and the
    message names the bad job's overrides."""
    configs = tmp_path / "configs"
    (configs / "sweep").mkdir(parents=True)
    (configs / "sweep" / "bad.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      retrieval.top_k: 5,-1\n"
    )
    sweep = [argument.format(configs=configs) for argument in sweep]
    out = tmp_path / "outputs"
    command = [sys.executable, "-m", pipeline, "-m", *sweep, *TINY, "logger=none"]
    command.append(f"paths.output_dir={out}")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert expected in last and last.endswith("No job was run"), last
    assert not out.exists()  # no sweep folder, no job folder


@pytest.mark.parametrize(
    ("pipeline", "sweep", "expected"),
    [
        (  # each job replaced the one before (with overwrite=true: silently, exit status 0)
            "pipelines.score",
            ["retrieval.output.path={configs}/recs", "retrieval.top_k=5,10"],
            "job 1 of the sweep's 2 (model_ref={configs}/model.ckpt retrieval.output.path=",
        ),
        (  # job 1 refused after job 0's evaluation; two at once (joblib): the last file stayed
            "pipelines.evaluate",
            ["per_target={configs}/targets.parquet", "users=null,{configs}/users.csv"],
            "job 1 of the sweep's 2 (model_ref={configs}/model.ckpt per_target=",
        ),
    ],
)
def test_a_score_or_evaluate_sweep_writing_one_output_stops_before_any_job_runs(
    tmp_path, pipeline, sweep, expected
):
    """A ``pipelines.score`` sweep (one model over several settings or ``users=`` segments)
    with one fixed ``retrieval.output.path``, or a ``pipelines.evaluate`` sweep with one
    ``per_target`` file, is refused before its first job (recsys.config.CheckSweep), as a
    ``pipelines.run`` sweep's is: its jobs would each write the one output, the last job's
    replacing the others' (or, without overwrite, job 1 refused after job 0's work)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    sweep = [argument.format(configs=configs) for argument in sweep]
    out = tmp_path / "outputs"
    command = [sys.executable, "-m", pipeline, "-m", f"model={configs}/model.ckpt", *sweep]
    command += [*TINY_DATA, "logger=none", f"paths.output_dir={out}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert expected.format(configs=configs) in last and last.endswith("No job was run"), last
    assert "each job needs its own" in last, last
    assert not out.exists()  # no sweep folder, no job folder


@pytest.mark.slow
def test_a_model_trained_order_only_is_not_evaluated_on_the_log_with_its_timestamps(make_config):
    """Evaluation had no order-only / timed check (scoring has, score.check_columns): an ATRank
    trained on the order-only log was evaluated on the same log with its timestamps (the same
    leave-one-out split, the same vocabulary), its time tables given gaps they never learned,
    and reported other metrics than on its own data without a word. Refused before the data
    is prepared, as scoring refuses it."""
    data = ["data.split.method=leave_one_out"]
    trained = train.run(
        make_config(
            "config",
            [*TINY, *data, "logger=none", "trainer.max_epochs=1", "data.columns.timestamp=null"],
        )
    )
    given = ["logger=none", f"model_ref={trained.checkpoint}", *TINY_DATA, *data]
    with pytest.raises(DataError, match=r"trained on an order-only log .*read it order-only too"):
        evaluate.run(make_config("evaluate", given))
    own = evaluate.run(make_config("evaluate", [*given, "data.columns.timestamp=null"]))
    assert own["test/ndcg_at_10"] >= 0


@pytest.mark.parametrize("task", ["evaluate", "score"])
def test_evaluate_and_score_read_histories_as_trained_and_say_so(
    main_run, make_config, tmp_path, caplog, monkeypatch, task
):
    """A loaded model reads histories as it was trained to: a different data.max_seq_len (or
    data.time_buckets) is named in the log (the length was silently not applied), an absurd
    length is refused before any work."""
    _, result = main_run
    settings = [f"model_ref={result.checkpoint}", *TINY_DATA, "logger=none"]
    if task == "score":
        settings.append(f"retrieval.output.path={tmp_path}/recs")
    run = {"evaluate": evaluate.run, "score": score.run}[task]
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared before checking"))
    with pytest.raises(ValueError, match=r"^data.max_seq_len=0 .*>= 1"):
        run(make_config(task, [*settings, "data.max_seq_len=0"]))
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="recsys.config"):
        run(make_config(task, [*settings, "data.max_seq_len=7", "data.time_buckets.num_buckets=8"]))
    said = f"{result.checkpoint} reads histories as it was trained to, not as this config's data"
    assert said in caplog.text
    assert "max_seq_len: 20 (data.max_seq_len: 7); time_buckets: {" in caplog.text


@pytest.mark.parametrize("running", [False, True])
def test_a_sweep_into_a_sweep_folder_that_holds_trainings_is_refused_untouched(tmp_path, running):
    """The same -m command again with the same hydra.sweep.dir: each job was refused, but only
    after Hydra had rewritten the earlier jobs' .hydra/ records (with settings those
    checkpoints were not trained with) and multirun.yaml. So was it while that sweep's job
    was still training, before its first checkpoint (two overlapping scheduled sweeps)."""
    from recsys import locks
    from recsys.tasks.train import LOCK_FILE

    sweep = tmp_path / "multi"
    kept = {
        sweep / "0" / ".hydra" / "overrides.yaml": "- model.num_heads=1\n",
        sweep / "multirun.yaml": "earlier sweep\n",
    }
    if not running:
        kept[sweep / "0" / "checkpoints" / "best.ckpt"] = "weights"
    for path, text in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    fd = locks.hold(sweep / "0" / LOCK_FILE, str) if running else None
    try:
        command = [sys.executable, "-m", "pipelines.train", "-m", "model.num_heads=1,2", *TINY]
        command += ["logger=none", f"hydra.sweep.dir={sweep}"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        if fd is not None:
            os.close(fd)
    assert done.returncode == 1
    expected = (
        f"its folder {sweep / '0'} is in use by a job running now (process {os.getpid()} "
        if running
        else f"its folder {sweep / '0'} already holds a training (checkpoints/best.ckpt)"
    )
    assert expected in done.stderr, done.stderr[-2000:]
    written = {p: p.read_text() for p in sweep.rglob("*") if p.is_file()}
    assert {p: t for p, t in written.items() if p.name != LOCK_FILE} == kept


def test_a_failed_pipeline_exits_non_zero_and_says_why_in_its_run_log(tmp_path):
    """A scheduled job's owner reads the run folder's job log (run.log, prepare.log, ...) the
    morning after: it ends with the failure (which task, the error and its message naming the
    file), not mid-job; Hydra alone prints the traceback to stderr only."""
    run_dir = tmp_path / "night"
    command = [
        sys.executable,
        "-m",
        "pipelines.prepare",
        "data=events_file",
        f"data.source={tmp_path / 'missing.parquet'}",
        "logger=none",
        f"paths.output_dir={tmp_path / 'outputs'}",
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    (log_file,) = run_dir.glob("*.log")  # Hydra's job log, named after the job: prepare.log
    last = log_file.read_text().strip().splitlines()[-1]
    assert "[ERROR] - prepare job failed: " in last and "missing.parquet" in last, last


@pytest.mark.parametrize("pipeline", ["pipelines.run", "pipelines.train"])
def test_a_training_refused_for_its_run_folder_leaves_that_folder_untouched(tmp_path, pipeline):
    """A nightly job started again with the same hydra.run.dir: refused before Hydra writes its
    .hydra/ record and run.log there (they would claim the good night failed, with this job's
    settings)."""
    run_dir = tmp_path / "night1"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    kept = {
        run_dir / "checkpoints" / "best.ckpt": "weights",
        run_dir / ".hydra" / "overrides.yaml": "- trainer.max_epochs=1\n",
        run_dir / f"{pipeline.split('.')[1]}.log": "... main job done\n",
    }
    for path, text in kept.items():
        path.write_text(text)
    command = [sys.executable, "-m", pipeline, *TINY, "logger=none", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"hydra.run.dir={run_dir} already holds a training (checkpoints/best.ckpt)" in (
        done.stderr
    )
    assert {p: p.read_text() for p in run_dir.rglob("*") if p.is_file()} == kept


@pytest.mark.parametrize("resume", [[], ["resume=last"]])
def test_a_job_refused_for_a_run_folder_in_use_leaves_that_jobs_records_untouched(tmp_path, resume):
    """A second job into the run folder a training works in right now, before that training's
    first checkpoint (a scheduler's overlapping start, during a long preparation): it was
    refused by the folder's lock only after Hydra had replaced the running job's .hydra/
    record with this job's settings and written "train job failed" into its log. Refused
    before Hydra writes there (recsys.config.GuardRunFolder), naming the holder."""
    from recsys import locks
    from recsys.tasks.train import LOCK_FILE

    run_dir = tmp_path / "night1"
    (run_dir / ".hydra").mkdir(parents=True)
    kept = {
        run_dir / ".hydra" / "overrides.yaml": "- model.dropout=0.1\n",
        run_dir / "train.log": "... preparing\n",
    }
    for path, text in kept.items():
        path.write_text(text)
    fd = locks.hold(run_dir / LOCK_FILE, str)  # the running job, as hold_run_folder holds it
    try:
        command = [sys.executable, "-m", "pipelines.train", *TINY, "logger=none"]
        command += ["model.dropout=0.3", f"hydra.run.dir={run_dir}", *resume]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert done.returncode != 0
    assert f"hydra.run.dir={run_dir} is in use by a job running now (process {os.getpid()} " in (
        done.stderr
    ), done.stderr[-2000:]
    written = {p: p.read_text() for p in run_dir.rglob("*") if p.is_file()}
    assert {p: t for p, t in written.items() if p.name != LOCK_FILE} == kept


@pytest.mark.parametrize(
    ("overrides", "expected"), [([], "train"), (["task_name=nightly"], "nightly")]
)
def test_train_pipeline_keeps_a_task_name_given_on_the_command_line(tmp_path, overrides, expected):
    """pipelines.train names its runs "train" instead of the main job's "main", but a
    task_name=... override (the MLflow run name of a scheduled retraining) is kept."""
    script = (
        "import runpy, types; import recsys.tasks.train as t; "
        "t.run = lambda cfg: print('TASK_NAME', cfg.task_name) or types.SimpleNamespace("
        "best_val={}); "
        "runpy.run_module('pipelines.train', run_name='__main__')"
    )
    command = [sys.executable, "-c", script, "logger=none", f"hydra.run.dir={tmp_path}", *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"TASK_NAME {expected}" in done.stdout


def test_main_job_without_cutoff_10_reports_its_own_cutoff(tmp_path):
    """training.metric_ks without 10 (with a monitor it has): the main job evaluates, scores and
    prints the largest cutoff, instead of failing on test/ndcg_at_10 after the training."""
    out = tmp_path / "outputs"
    command = [
        sys.executable,
        "-m",
        "pipelines.run",
        *TINY,
        "trainer.max_epochs=1",
        "training.metric_ks=[5,20]",
        "callbacks.model_checkpoint.monitor=val/ndcg_at_5",
        "logger=none",
        f"paths.output_dir={out}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "test/ndcg_at_20" in done.stdout and "test/popularity_ndcg_at_20" in done.stdout
    assert "test NDCG@20" in done.stdout + done.stderr  # the evaluation's log line
    assert len(list(out.glob("runs/*/recommendations/part-*.parquet"))) == 1


def test_score_command_line_takes_model_equals(main_run, tmp_path):
    """The README's form: ``python -m pipelines.score model=<checkpoint>``."""
    _, result = main_run
    command = [
        sys.executable,
        "-m",
        "pipelines.score",
        f"model={result.checkpoint}",
        *TINY_DATA,
        "retrieval.rerank_top_n=20",
        "logger=none",
        f"retrieval.output.path={tmp_path}/recs",
        f"paths.output_dir={tmp_path}/outputs",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_parts(tmp_path / "recs").equals(read_parts(result.recommendations))


def test_packaged_mlflow_model_predicts_like_the_score_task(main_run):
    """Outside recsys' own loader: mlflow.pyfunc.load_model(...).predict(events)."""
    import mlflow.pyfunc

    from recsys.checkpoint import load_checkpoint
    from recsys.data.synthetic import generate_events
    from recsys.tasks.score import recommend_frame

    cfg, result = main_run
    mlflow.set_tracking_uri(cfg.logger.tracking_uri)
    events = generate_events(num_users=150, num_items=120, num_categories=8, seed=cfg.seed)
    pyfunc = mlflow.pyfunc.load_model(f"models:/{REGISTERED}@champion")
    predicted = pyfunc.predict(events.to_pandas(), params={"top_k": 3})
    expected = recommend_frame(load_checkpoint(result.checkpoint), events, retrieval={"top_k": 3})
    assert list(predicted.columns) == expected.columns
    assert predicted["item_id"].tolist() == expected["item_id"].to_list()


NO_RERANK = ["training.rerank_top_n=0", "retrieval.rerank_top_n=0"]


def test_a_resumed_training_writes_its_transition_prior_into_a_best_checkpoint_of_before(
    make_config, tmp_path
):
    """A training resumed with training.transition_prior whose best checkpoint is still one of
    the interrupted run's (no later epoch better), written without a prior or with another
    shape: the prior is written into it as this run's settings say. (auto ended the training
    with an AttributeError on the missing prior; a set weight was lost without a word.)"""
    from recsys.tasks.evaluate import PRIOR_WEIGHTS

    run_dir = tmp_path / "run"
    base = [*TINY, *NO_RERANK, "logger=none", "trainer.max_epochs=1", f"paths.run_dir={run_dir}"]
    train.run(make_config("config", base))  # no prior; resumed at its last epoch: no training
    for setting, window in (("auto", 3), ("0.5", 1)):
        resumed = train.run(
            make_config(
                "config",
                [
                    *base,
                    "resume=last",
                    f"training.transition_prior={setting}",
                    f"training.transition_window={window}",
                ],
            )
        )
        prior = load_checkpoint(resumed.checkpoint).transition_prior
        assert prior is not None and prior.counts.window == window
        assert prior.weight in PRIOR_WEIGHTS if setting == "auto" else prior.weight == 0.5


def test_transition_prior_auto_is_chosen_on_validation_saved_evaluated_and_scored(
    make_config, tmp_path
):
    """training.transition_prior=auto through the main job, with a wider prior (pairs up to 2
    events apart, the 3 most recent items): the weight chosen on validation is written into
    the best checkpoint with the prior's shape, and evaluation and scoring use it."""
    import shutil

    from recsys.checkpoint import load_checkpoint, set_transition_prior_weight
    from recsys.tasks.evaluate import PRIOR_WEIGHTS

    shape = [
        "training.transition_window=2",
        "training.transition_recent=3",
        "training.transition_decay=0.5",
    ]
    overrides = [*TINY, *NO_RERANK, *shape, "logger=none", "trainer.max_epochs=1"]
    cfg = make_config("config", [*overrides, "training.transition_prior=auto"])
    result = main.run(cfg)
    prior = load_checkpoint(result.checkpoint).transition_prior
    assert prior is not None and prior.weight in PRIOR_WEIGHTS
    assert prior.counts.count.sum() > 0
    assert prior.shape() == {"window": 2, "recent": 3, "decay": 0.5}
    assert read_parts(result.recommendations)["score"].is_finite().all()
    # evaluation with the saved prior, and with it set aside (a weight of 0) or overridden
    again = evaluate.run(cfg, result.checkpoint, splits=("val", "test"))
    plain = make_config("config", [*overrides, "training.transition_prior=0"])
    without = evaluate.run(plain, result.checkpoint, splits=("val", "test"))
    chosen = max(without["val/ndcg_at_10"], again["val/ndcg_at_10"])
    assert again["val/ndcg_at_10"] == pytest.approx(chosen)  # the choice is not worse on val
    assert again["test/ndcg_at_10"] == pytest.approx(result.metrics["test/ndcg_at_10"])
    assert "transition_prior/weight" not in again  # auto, same shape: the saved weight
    other = [o for o in overrides if o not in shape]  # auto, another shape: chosen again
    first_order = make_config("config", [*other, "training.transition_prior=auto"])
    reselected = evaluate.run(first_order, result.checkpoint, splits=("val",))
    assert reselected["transition_prior/weight"] in PRIOR_WEIGHTS
    # scoring reads the weight from the checkpoint: a large one reorders the lists
    lists = {}
    for weight in (0.0, 3.0):
        copy = shutil.copy(result.checkpoint, tmp_path / f"weight-{weight}.ckpt")
        set_transition_prior_weight(copy, weight)
        job = make_config(
            "score",
            [*TINY_DATA, f"model_ref={copy}", f"retrieval.output.path={tmp_path}/{weight}"],
        )
        lists[weight] = read_parts(score.run(job))["item_id"].to_list()
    assert lists[0.0] != lists[3.0]


def test_evaluate_measures_a_transition_prior_on_a_model_trained_without_one(make_config):
    """pipelines.evaluate with training.transition_prior on a checkpoint without one: the
    counts come from the prepared data's training sequences, the weight from validation."""
    overrides = [*TINY, *NO_RERANK, "logger=none", "trainer.max_epochs=1"]
    cfg = make_config("config", overrides)
    trained = train.run(cfg)
    shape = ["training.transition_window=3", "training.transition_recent=2"]
    auto = make_config("config", [*overrides, *shape, "training.transition_prior=auto"])
    metrics = evaluate.run(auto, trained.checkpoint, prepared_dir=trained.prepared_dir)
    assert metrics["transition_prior/weight"] in evaluate.PRIOR_WEIGHTS
    best = max(v for k, v in metrics.items() if k.startswith("transition_prior/val_"))
    assert (
        metrics[f"transition_prior/val_ndcg_at_10_at_{metrics['transition_prior/weight']}"] == best
    )
    # its recent items come from the model's input: no more of them than the model reads
    width = cfg.data.max_seq_len
    deep = [*overrides, "training.transition_prior=1", f"training.transition_recent={width + 1}"]
    with pytest.raises(ValueError, match=rf"transition_recent={width + 1} exceeds the {width}"):
        evaluate.run(make_config("config", deep), trained.checkpoint)
    for weight in ("-3", "nan", "abc"):  # named by its key, as training names it
        bad = make_config("config", [*overrides, f"training.transition_prior={weight}"])
        with pytest.raises(ValueError, match=r"^training.transition_prior=.* must be null"):
            evaluate.run(bad, trained.checkpoint)


def test_metric_cutoffs_as_deep_as_the_catalogue_are_named_in_a_warning(make_config, caplog):
    overrides = [*TINY, *NO_RERANK, "logger=none", "trainer.max_epochs=1"]
    cfg = make_config("config", [*overrides, "training.metric_ks=[10,100000]"])
    with caplog.at_level("WARNING", logger="recsys.tasks.train"):
        train.run(cfg)
    assert re.search(r"metric_ks \[100000\] reach the catalogue's \d+ rankable items", caplog.text)
    # the tiny log's validation split, which selects the checkpoint, is named once as small
    stats = load_stats(Path(cfg.paths.run_dir) / "prepared")
    small = f"the validation split has {stats['val_targets']} targets (fewer than 100"
    assert caplog.text.count(small) == 1 and "the test split" not in caplog.text


def test_a_diverging_training_stops_before_writing_a_checkpoint_or_recommendations(make_config):
    """A learning rate far too high made every weight NaN; the job ended with status 0,
    finite-looking metrics (a NaN score is a miss) and recommendations scored NaN."""
    overrides = [*TINY, "logger=none", "trainer.max_epochs=2", "training.optimizer.lr=1e6"]
    overrides += ["training.optimizer.weight_decay=0"]  # (else refused: lr * weight_decay >= 1)
    cfg = make_config("config", overrides)
    with pytest.raises(FloatingPointError, match=r"training diverged: .*\(training.optimizer.lr=1"):
        main.run(cfg)
    run_dir = Path(cfg.paths.run_dir)
    for path in run_dir.rglob("*.ckpt"):  # a checkpoint, if any, from before the divergence
        weights = torch.load(path, weights_only=True)["state_dict"]
        assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    assert not list(run_dir.rglob("recommendations*"))


def test_weights_broken_by_an_epochs_last_step_are_not_saved_as_the_best(make_config):
    """GRU4Rec at lr=1e3 breaks its weights in the first epoch's last step, whose loss was
    still finite: the training validated them (NDCG 0), saved them as best.ckpt and, with
    max_epochs=1, ended with status 0 and recommendations all scored NaN. It now stops before
    validating them, naming the weights."""
    overrides = [*TINY, *NO_RERANK, "logger=none", "model=gru4rec", "trainer.max_epochs=1"]
    overrides += ["training.optimizer.lr=1e3", "training.optimizer.weight_decay=0"]
    cfg = make_config("config", overrides)
    message = r"the weights were not finite \(NaN or inf\) after its last step \(encoder\."
    with pytest.raises(FloatingPointError, match=message + r".* in epoch 1, .*lr=1000"):
        train.run(cfg)
    assert not list(Path(cfg.paths.run_dir).rglob("*.ckpt"))


def test_a_main_job_with_a_transition_prior_and_a_re_rank_stage_is_refused_before_training(
    make_config,
):
    cfg = make_config(
        "config", [*TINY, "logger=none", "training.transition_prior=1", "training.rerank_top_n=0"]
    )
    with pytest.raises(ValueError, match="set retrieval.rerank_top_n=0"):
        main.run(cfg)
    assert not (Path(cfg.paths.run_dir) / "checkpoints").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.seen_items=bogus", r"^training.seen_items='bogus'"),
        ("training.metric_ks=[0]", r"^training.metric_ks"),
        ("users=/nonexistent/users.csv", r"^user list /nonexistent/users.csv does not exist"),
    ],
)
def test_evaluation_settings_are_refused_before_the_data_is_prepared(
    main_run, make_config, monkeypatch, override, message
):
    _, result = main_run

    def no_preparation(*args, **kwargs):
        raise AssertionError("the data was prepared")

    monkeypatch.setattr(evaluate.prepare, "prepared", no_preparation)
    cfg = make_config(
        "evaluate", [f"model_ref={result.checkpoint}", *TINY_DATA, "logger=none", override]
    )
    with pytest.raises(ValueError, match=message):
        evaluate.run(cfg)


def test_score_reads_data_items_for_the_logs_new_items(make_config, tmp_path):
    """pipelines.score with data.items: the log's items new to the model take their category
    from the item table (they had none when the model's attributes came from a table, as the
    S3-Rec files', and max_per_category never capped them), and the table is part of the job,
    so scoring again with another table is another job, not a rerun that does nothing."""
    from recsys.data.synthetic import generate_events

    events = generate_events(num_users=60, num_items=40, num_categories=4, seed=3)
    table = events.group_by("item_id").agg(pl.concat_list(pl.col("category").first()))
    events.drop("category").write_parquet(tmp_path / "train.parquet")
    new_id = int(events["item_id"].max()) + 1
    new = pl.DataFrame({"item_id": [new_id], "category": [["c01"]]})
    pl.concat([table, new]).rename({"category": "attributes"}).write_parquet(tmp_path / "i.parquet")
    data = [
        "data=events_file",
        f"data.items={tmp_path / 'i.parquet'}",
        "data.split.method=leave_one_out",
        "logger=none",
    ]
    trained = train.run(
        make_config(
            "config",
            [
                *data,
                f"data.source={tmp_path / 'train.parquet'}",
                "trainer.max_epochs=1",
                "model.d_model=16",
                "model.num_layers=1",
            ],
        )
    )
    users = events["user_id"].unique().to_list()
    last = events["timestamp"].max()
    bought = pl.DataFrame(
        {"user_id": users, "item_id": new_id, "timestamp": last, "event_type": "purchase"},
        schema={k: events.schema[k] for k in ("user_id", "item_id", "timestamp", "event_type")},
    )
    log = pl.concat([events.drop("category"), bought.select(events.drop("category").columns)])
    log.write_parquet(tmp_path / "score.parquet")
    scoring = [
        *data,
        f"data.source={tmp_path / 'score.parquet'}",
        f"model_ref={trained.checkpoint}",
        "retrieval.min_history=1000",  # every list from the fallback, which knows new items
        "retrieval.rules.exclude=none",
        f"retrieval.output.path={tmp_path / 'recs'}",
    ]
    folder = score.run(make_config("score", scoring))
    recs = read_parts(folder)
    assert recs.filter(pl.col("item_id") == new_id)["item_category"].unique().to_list() == ["c01"]
    pl.concat([table, new.with_columns(pl.lit(["c02"]).alias("category"))]).rename(
        {"category": "attributes"}
    ).write_parquet(tmp_path / "i.parquet")
    with pytest.raises(FileExistsError, match="overwrite=true"):
        score.run(make_config("score", scoring))
