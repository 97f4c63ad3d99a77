import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import recsys
from recsys.tracking import Tracker, flatten


def test_flatten():
    assert flatten({"model": {"d_model": 64, "heads": [1, 2]}, "seed": 1}) == {
        "model.d_model": "64",
        "model.heads": "[1, 2]",
        "seed": "1",
    }


def test_a_mapping_whose_keys_cannot_name_a_param_is_one_param_that_mlflow_takes(
    tmp_path, monkeypatch
):
    """A raw event name as a data.behavior_aliases key ('Add to cart (v2)') made MLflow refuse
    the whole batch of params, after the data was prepared (an audit's finding)."""
    aliases = {"view": "view", "Add to cart (v2)": "cart"}
    config = {"data": {"behavior_aliases": aliases, "max_seq_len": 50}, "w": {"a.b": 1}}
    assert flatten(config) == {
        "data.behavior_aliases": str(aliases),
        "data.max_seq_len": "50",
        "w": "{'a.b': 1}",  # a dot would make the name ambiguous
    }
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="t")
    tracker.log_params(flatten(config))
    params = tracker.client.get_run(tracker.run_id).data.params
    assert params["data.behavior_aliases"] == str(aliases)


def test_opening_a_new_store_keeps_the_jobs_log(tmp_path, monkeypatch):
    """MLflow before 3.7 created a new sqlite store's tables with alembic, whose logging
    ``fileConfig`` replaced the root logger's handlers with its own and set it to WARN: the
    first job into a new store lost the rest of its log (Hydra's run.log stopped there; a
    floors audit's finding). The job's handlers and level are kept, and its records reach them."""
    import io
    import logging

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = logging.getLogger()
    job_log = logging.StreamHandler(io.StringIO())
    before, level = root.handlers[:], root.level
    root.addHandler(job_log)
    root.setLevel(logging.INFO)
    try:
        tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="t")
        assert root.handlers == [*before, job_log] and root.level == logging.INFO
        logging.getLogger("recsys.tasks.train").info("epoch 0 done")
        tracker.finish()
    finally:
        root.handlers[:] = before
        root.setLevel(level)
    text = job_log.stream.getvalue()
    assert f"MLflow run {tracker.run_id} at sqlite:///" in text and "epoch 0 done" in text


def test_the_lightning_logger_neither_ends_the_run_nor_logs_unprefixed_copies(
    tmp_path, monkeypatch
):
    """Lightning's MLFlowLogger marked the run FINISHED at the end of fit, with the main job's
    evaluation and scoring still to come (a job killed then stayed FINISHED), and logged the
    module's hyperparameters as ~30 unprefixed copies of training.* params."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="t")
    logger = tracker.lightning_logger()
    logger.log_hyperparams({"rerank_top_n": 0})
    logger.log_metrics({"train/loss": 1.5}, step=0)
    logger.finalize("success")
    run = tracker.client.get_run(tracker.run_id)
    assert run.info.status == "RUNNING"
    assert run.data.metrics["train/loss"] == 1.5 and not run.data.params
    tracker.finish("FAILED")  # the job decides
    assert tracker.client.get_run(tracker.run_id).info.status == "FAILED"


def test_the_mlflow_ui_command_a_run_names_works_pasted_in_a_folder_with_a_space(
    tmp_path, monkeypatch
):
    """The main job's last lines name the command that opens its store; a clone in
    '/home/me/my projects' split the store's path in two at the space."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'my projects' / 'outputs' / 'mlflow.db'}"
    tracker = Tracker(tracking_uri=uri, experiment_name="t")
    command = tracker.describe().removeprefix(f"MLflow run {tracker.run_id} (").removesuffix(")")
    assert shlex.split(command) == ["mlflow", "ui", "--backend-store-uri", uri]


def test_a_training_in_this_process_does_not_send_the_next_jobs_runs_to_its_store(
    tmp_path, monkeypatch
):
    """Lightning's MLFlowLogger sets MLFLOW_TRACKING_URI in the process (mlflow.set_tracking_uri
    does), which recsys reads as the user's: every later job of the process (a notebook's
    evaluation, the next job of a -m sweep with another paths.output_dir) went to the first
    training's store instead of its own logger.tracking_uri, silently."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'a.db'}", experiment_name="t")
    logger = first.lightning_logger()
    logger.log_metrics({"train/loss": 1.5}, step=0)  # (opens Lightning's client)
    assert "MLFLOW_TRACKING_URI" not in os.environ
    second = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'b.db'}", experiment_name="t")
    assert second.tracking_uri == f"sqlite:///{tmp_path / 'b.db'}"
    # the user's own setting still wins, and is left as it was
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'c.db'}")
    third = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'a.db'}", experiment_name="t")
    assert third.tracking_uri == f"sqlite:///{tmp_path / 'c.db'}"
    third.lightning_logger().log_metrics({"train/loss": 1.0}, step=0)
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'c.db'}"


def test_disabled_tracker_does_nothing_and_never_imports_mlflow():
    code = (
        "import sys\n"
        "from recsys.tracking import Tracker\n"
        "t = Tracker.from_config({'enabled': False})\n"
        "t.log_params({'a': 1}); t.log_metrics({'m': 1.0}); t.set_tags({'x': 'y'}); t.finish()\n"
        "assert t.lightning_logger() is None\n"
        "assert 'mlflow' not in sys.modules, 'mlflow was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sqlite_run_records_params_metrics_tags_and_artifacts(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    tracker = Tracker(
        tracking_uri=uri, experiment_name="t", artifact_root=str(tmp_path / "art"), run_name="r"
    )
    tracker.log_params({f"p{i}": i for i in range(150)})  # more than one MLflow batch
    tracker.log_metrics({"val/ndcg_at_10": 0.25}, step=3)
    tracker.set_tags({"protocol.split": "temporal"})
    (tmp_path / "a.txt").write_text("hello")
    tracker.log_artifact(tmp_path / "a.txt", "config")
    tracker.finish()

    resumed = Tracker(tracking_uri=uri, run_id=tracker.run_id)
    run = resumed.client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["p149"] == "149"
    assert run.data.metrics["val/ndcg_at_10"] == 0.25
    assert run.data.tags["protocol.split"] == "temporal"
    # a new run says which code made it (an attached one, as resumed here, keeps its tags)
    assert run.data.tags["code.version"] == recsys.__version__
    commit = recsys.code_version()["git_commit"]
    assert run.data.tags.get("code.git_commit") == commit
    if commit is not None:
        assert run.data.tags["code.git_dirty"] in ("true", "false")
    files = [f.path for f in resumed.client.list_artifacts(tracker.run_id, "config")]
    assert files == ["config/a.txt"]


def test_an_artifact_root_the_experiment_cannot_take_is_named(tmp_path, monkeypatch, caplog):
    """MLflow keeps an experiment's artifact folder from its creation: a later
    logger.artifact_root went unapplied without a word."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = str(tmp_path / "art")
    Tracker(tracking_uri=uri, experiment_name="t", artifact_root=first).finish()
    with caplog.at_level("WARNING", logger="recsys.tracking"):
        Tracker(tracking_uri=uri, experiment_name="t", artifact_root=first).finish()
        assert "is not applied" not in caplog.text  # the same folder: nothing to say
        Tracker(tracking_uri=uri, experiment_name="t", artifact_root=str(tmp_path / "other"))
    assert f"logger.artifact_root={tmp_path / 'other'} is not applied: MLflow experiment 't'" in (
        caplog.text
    )


def test_an_artifact_root_given_as_a_file_uri_is_not_named_as_unapplied(
    tmp_path, monkeypatch, caplog
):
    """logger.artifact_root=file:///shared/... (a folder as a URI, as a tracking server needs
    one) was compared with the experiment's folder without its file:// only: every job into
    the experiment created with it warned that it was not applied."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, shared = f"sqlite:///{tmp_path / 'mlflow.db'}", f"file://{tmp_path / 'shared'}"
    Tracker(tracking_uri=uri, experiment_name="t", artifact_root=shared).finish()
    with caplog.at_level("WARNING", logger="recsys.tracking"):
        Tracker(tracking_uri=uri, experiment_name="t", artifact_root=shared).finish()
        Tracker(tracking_uri=uri, experiment_name="t", artifact_root=f"{shared}/").finish()
    assert "is not applied" not in caplog.text


def test_environment_variable_wins(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'cfg.db'}", experiment_name="e")
    assert tracker.tracking_uri == uri
    assert (tmp_path / "env.db").exists() and not (tmp_path / "cfg.db").exists()


def test_a_new_sqlite_store_is_opened_under_a_lock(tmp_path, monkeypatch):
    """Two jobs starting together on a store that does not exist yet (the first night's
    overlapping jobs) both create its tables, and one failed with sqlite's "table
    latest_metrics already exists"; the experiment likewise. The store is opened and the
    experiment found or created while <db>.lock is held, so the second job waits."""
    import fcntl
    import os

    import mlflow.tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    database = tmp_path / "db" / "mlflow.db"
    real = mlflow.tracking.MlflowClient
    held = []

    def client(*args, **kwargs):
        fd = os.open(f"{database}.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return real(*args, **kwargs)

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", client)
    tracker = Tracker(tracking_uri=f"sqlite:///{database}", experiment_name="e")
    assert held == [True]
    tracker.finish()
    fd = os.open(f"{database}.lock", os.O_RDWR)  # released once the store is open
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_continued_run_keeps_its_parameters_and_tags_the_changed_ones(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(tracking_uri=uri, experiment_name="e", run_name="train")
    first.log_params({"epochs": 2, "lr": 0.1})
    first.finish("FAILED")  # e.g. the job was interrupted

    with caplog.at_level("INFO", logger="recsys.tracking"):
        again = Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=first.run_id)
    assert again.run_id == first.run_id and "continuing MLflow run" in caplog.text
    assert again.client.get_run(first.run_id).info.status == "RUNNING"
    with caplog.at_level("INFO", logger="recsys.tracking"):
        again.log_params({"epochs": 3, "lr": 0.1, "resume": "last"})  # MLflow alone refuses
        # the main job logs its config, then its training does: the change is named once
        again.log_params({"epochs": 3, "lr": 0.1, "resume": "last"})
    assert caplog.text.count("epochs 2 -> 3") == 1
    again.finish()
    run = again.client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"epochs": "2", "lr": "0.1", "resume": "last"}
    assert {k: v for k, v in run.data.tags.items() if k.startswith("changed_param.")} == {
        "changed_param.epochs": "3"
    }
    assert "epochs 2 -> 3" in caplog.text

    # a run this store does not hold (another tracking URI): a new run, with a warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="recsys.tracking"):
        other = Tracker(tracking_uri=uri, experiment_name="e", continue_run_id="0" * 32)
    assert other.run_id not in (None, first.run_id) and "in a new run" in caplog.text


def test_a_resumed_run_names_the_settings_its_checkpoint_keeps_instead_of_tagging_them(
    tmp_path, caplog
):
    """resume=last continues the optimiser and callbacks from the checkpoint: a new learning
    rate or patience was tagged changed_param.*, as if it had applied."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(tracking_uri=uri, experiment_name="e")
    first.log_params({"training.optimizer.lr": 0.001, "trainer.max_epochs": 2})
    again = Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=first.run_id)
    with caplog.at_level("WARNING", logger="recsys.tracking"):
        again.log_params(
            {"training.optimizer.lr": 0.01, "trainer.max_epochs": 4},
            restored=("training.optimizer.", "callbacks."),
        )
    tags = again.client.get_run(first.run_id).data.tags
    assert {k: v for k, v in tags.items() if k.startswith("changed_param.")} == {
        "changed_param.trainer.max_epochs": "4"
    }
    assert "not applied to the resumed training, which continues from its checkpoint" in caplog.text
    assert "training.optimizer.lr 0.001 (given 0.01)" in caplog.text


def test_a_run_resumed_under_other_code_names_both(tmp_path, monkeypatch):
    """A resumed training kept the first start's code.* tags: a run resumed under other code
    said the first code alone had made it. The code of the resume is tagged code.resumed.*
    where it differs; the same code adds nothing."""
    from recsys import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = {"version": "1.0", "git_commit": "aaa", "git_dirty": False}
    monkeypatch.setattr(tracking, "code_version", lambda: dict(code))
    first = Tracker(tracking_uri=uri, experiment_name="e")
    first.finish("KILLED")
    Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=first.run_id).finish()
    tags = first.client.get_run(first.run_id).data.tags
    assert not [k for k in tags if k.startswith("code.resumed.")]
    code.update(git_commit="bbb", git_dirty=True)
    Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=first.run_id).finish()
    tags = first.client.get_run(first.run_id).data.tags
    assert {k: v for k, v in tags.items() if k.startswith("code.")} == {
        "code.version": "1.0",
        "code.git_commit": "aaa",
        "code.git_dirty": "false",
        "code.resumed.git_commit": "bbb",
        "code.resumed.git_dirty": "true",
    }


def test_a_model_fetched_from_mlflow_is_removed_when_its_caller_is_done_with_it(
    tmp_path, monkeypatch
):
    """resolve_model copies a run's (or a registered version's) checkpoint out of the store;
    the copy goes once the caller drops the path it was given (a scheduled scoring job of a
    GB model must not leave one in the temporary folder per run). A checkpoint path given
    directly is the caller's file and stays."""
    import tempfile

    from recsys.tracking import MODEL_ARTIFACT, done_with, resolve_model

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the copies would go
    logger = {
        "enabled": True,
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "artifact_root": str(tmp_path / "artifacts"),
        "experiment_name": "e",
        "registered_model_name": "m",
    }
    packaged = tmp_path / "packaged" / "artifacts"
    packaged.mkdir(parents=True)
    (packaged / "model.ckpt").write_bytes(b"weights")
    with_model = Tracker.from_config(logger)
    with_model.log_artifact(packaged.parent, MODEL_ARTIFACT)
    source = f"{with_model.client.get_run(with_model.run_id).info.artifact_uri}/{MODEL_ARTIFACT}"
    with_model.client.create_registered_model("m")
    version = with_model.client.create_model_version("m", source, run_id=with_model.run_id)
    with_model.client.set_registered_model_alias("m", "champion", version.version)
    raw = tmp_path / "best.ckpt"  # a run logged before models were packaged: checkpoints/
    raw.write_bytes(b"raw weights")
    without_model = Tracker.from_config(logger)
    without_model.log_artifact(raw, "checkpoints")

    for ref, content in [
        (with_model.run_id, b"weights"),
        ("m@champion", b"weights"),
        (without_model.run_id, b"raw weights"),
    ]:
        path, tags = resolve_model(ref, logger)
        assert path.read_bytes() == content and tags["model.run_id"]
        assert scratch in path.parents
        done_with(path)  # the caller has loaded it
        assert list(scratch.iterdir()) == [], ref

    empty = Tracker.from_config(logger)  # nothing to fetch: refused, and nothing left
    with pytest.raises(FileNotFoundError, match="has no packaged model"):
        resolve_model(empty.run_id, logger)
    assert list(scratch.iterdir()) == []
    # a run id that is not in the store, or a registered name without its alias
    for ref in ("0123abcd0123abcd0123abcd0123abcd", "m"):
        with pytest.raises(ValueError, match=rf"model='{ref}': no MLflow run with that id in sq"):
            resolve_model(ref, logger)
    assert list(scratch.iterdir()) == []

    path, _ = resolve_model(str(raw), logger)
    done_with(path)
    assert raw.read_bytes() == b"raw weights"


def test_a_packaged_model_carries_recsys_and_never_requires_the_pypi_project(tmp_path, monkeypatch):
    """ "recsys" on PyPI is another project (RecSys 0.0.1a3, no recsys.checkpoint): an
    environment built from the packaged model's requirements (mlflow models serve, a docker
    image) must not install it. The model carries its own copy of recsys instead, which loads
    where only that foreign package is importable."""
    import textwrap

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker(
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        experiment_name="e",
        artifact_root=str(tmp_path / "art"),
    )
    tracker.log_model(_tiny_checkpoint(tmp_path))
    tracker.finish()
    model = tracker.download_artifacts("model", tmp_path / "fetched")
    requirements = (model / "requirements.txt").read_text().split()
    assert "recsys" not in requirements and any(r.startswith("torch") for r in requirements)
    foreign = tmp_path / "site" / "recsys"  # what `pip install recsys` would bring
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("")
    code = textwrap.dedent(
        f"""
        import sys
        # a serving environment has only what the requirements install: not this checkout
        sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path = [p for p in sys.path if p not in ("", {str(Path.cwd())!r})]
        import mlflow.pyfunc
        model = mlflow.pyfunc.load_model({str(model)!r})
        print(type(model.unwrap_python_model().model).__name__)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(foreign.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "LoadedModel"


def test_packaging_a_model_shows_none_of_mlflows_advice_on_describing_its_input(
    tmp_path, monkeypatch
):
    """recsys' model takes an event log with the user's own columns: MLflow's advice to add
    type hints to ``predict`` (its hint is pd.DataFrame, which MLflow infers nothing from) and
    an input example does not apply, and is not shown; the filter is undone afterwards."""
    import warnings

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker(
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        experiment_name="e",
        artifact_root=str(tmp_path / "art"),
    )
    checkpoint = _tiny_checkpoint(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker.log_model(checkpoint)
        advice = "An input example was not provided when logging the model"
        warnings.warn(advice, UserWarning, stacklevel=1)
    tracker.finish()
    shown = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not [m for m in shown if "type hints" in m], shown
    assert [m for m in shown if "input example" in m] == [
        "An input example was not provided when logging the model"
    ], shown


def _tiny_checkpoint(tmp_path):
    """A scoring checkpoint of an untrained SASRec with a three-item vocabulary."""
    import torch

    from recsys.checkpoint import checkpoint_extra
    from recsys.data.sequences import TimeBuckets
    from recsys.data.vocab import Vocab
    from recsys.model.sasrec import SASRec
    from recsys.schema import EventSchema

    vocab = Vocab.from_plain(
        {
            "item_id": [10, 11, 12],
            "item_attributes": [[2]] * 3,
            "item_train_count": [1] * 3,
            "attribute": ["a"],
            "behaviors": ["view"],
        }
    )
    encoder = SASRec(num_items=vocab.num_items, max_seq_len=4, d_model=8, num_heads=1)
    path = tmp_path / "model.ckpt"
    extra = checkpoint_extra(
        vocab=vocab,
        schema=EventSchema(),
        time_buckets=TimeBuckets(),
        max_seq_len=4,
        data_fingerprint="f",
    )
    extra["encoder_target"] = "recsys.model.sasrec.SASRec"
    extra["encoder_config"] = encoder.config
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    torch.save({"state_dict": state, "recsys": extra}, path)
    return path


def test_a_version_registered_from_a_path_is_fetched_from_it_and_opens_no_run(
    tmp_path, monkeypatch
):
    """A registered version need not belong to a run (mlflow registers a folder too): its
    checkpoint comes from the version's source. Before, the missing run id opened a new,
    empty MLflow run, left RUNNING, and the error named that run."""
    from recsys.tracking import done_with, resolve_model

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = {
        "enabled": True,
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "artifact_root": str(tmp_path / "artifacts"),
        "experiment_name": "e",
    }
    packaged = tmp_path / "packaged" / "artifacts"
    packaged.mkdir(parents=True)
    (packaged / "model.ckpt").write_bytes(b"weights")
    client = Tracker.from_config(logger, open_run=False).client
    client.create_registered_model("m")
    version = client.create_model_version("m", str(packaged.parent))
    client.set_registered_model_alias("m", "champion", version.version)

    path, tags = resolve_model("m@champion", logger)
    assert path.read_bytes() == b"weights" and tags["model.version"] == str(version.version)
    done_with(path)
    assert not path.exists()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs == []


def test_a_job_killed_by_sigterm_after_training_is_logged_and_its_run_marked_failed(
    tmp_path, monkeypatch
):
    """A SIGTERM outside Lightning's fit (during evaluation or scoring) ended the process at
    once: no 'job failed' line, and the MLflow run left as it was (an audit's finding)."""
    code = (
        "import logging, os, signal, sys, time\n"
        "from omegaconf import OmegaConf\n"
        "from recsys.config import failure_logged\n"
        "from recsys.tracking import use_tracker\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "cfg = OmegaConf.create({'task_name': 'main'})\n"
        f"logger = {{'enabled': True, 'tracking_uri': 'sqlite:///{tmp_path}/mlflow.db'}}\n"
        "with failure_logged(cfg):\n"
        "    with use_tracker(None, logger) as tracker:\n"
        "        print(tracker.run_id, flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 143, done.stderr[-2000:]
    assert "main job failed: SystemExit: 143" in done.stderr
    run_id = done.stdout.split()[0]
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # (it would win over the path)
    tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", run_id=run_id)
    assert tracker.client.get_run(run_id).info.status == "FAILED"


def test_a_run_whose_job_was_killed_outright_is_marked_killed_by_the_next_job_of_its_host(
    tmp_path, monkeypatch, caplog
):
    """A job killed outright (SIGKILL, the OOM killer, a power cut) runs no cleanup: its run
    stayed RUNNING forever, and mlflow ui showed a training going on. The next job opening the
    experiment on the same host marks it KILLED and says why, while a running job's run, and
    a run of another host, are left as they are; resume=last continues the killed run."""
    import signal

    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = (
        "import sys, time\n"
        "from recsys.tracking import Tracker\n"
        f"tracker = Tracker(tracking_uri={uri!r}, experiment_name='e', run_name='train')\n"
        "print(tracker.run_id, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        run_id = job.stdout.readline().strip()
        assert run_id, "the job opened no run"
        client = MlflowClient(tracking_uri=uri)
        lock = tmp_path / "gone.lock"  # (free here: whether its job runs is not known here)
        lock.touch()
        tags = {
            "recsys.holder": "process 1 on another-host",
            "recsys.holder.host": "another-host",
            "recsys.holder.lock": str(lock),
        }
        experiment = client.get_experiment_by_name("e").experiment_id
        elsewhere = client.create_run(experiment, run_name="other host", tags=tags).info.run_id

        with caplog.at_level("WARNING", logger="recsys.tracking"):
            Tracker(tracking_uri=uri, experiment_name="e").finish()
        assert client.get_run(run_id).info.status == "RUNNING"  # its job still runs
        assert "marked KILLED" not in caplog.text

        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        job.kill()
        job.stdout.close()
    assert client.get_run(run_id).info.status == "RUNNING"  # nothing of the job ended it
    with caplog.at_level("WARNING", logger="recsys.tracking"):
        later = Tracker(tracking_uri=uri, experiment_name="e", run_name="next night")
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    reason = f"holder gone: process {job.pid} on {os.uname().nodename} no longer runs"
    assert run.data.tags["recsys.ended"] == reason
    assert f"MLflow run {run_id} (train) was left RUNNING by a job killed outright" in caplog.text
    assert client.get_run(elsewhere).info.status == "RUNNING"  # not this host's to end
    assert client.get_run(later.run_id).info.status == "RUNNING"
    later.finish()

    # resume=last continues it: RUNNING again, held by the resuming job, the reason dropped
    again = Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=run_id)
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and "recsys.ended" not in run.data.tags
    assert run.data.tags["recsys.holder"] == f"process {os.getpid()} on {os.uname().nodename}"
    Tracker(tracking_uri=uri, experiment_name="e").finish()  # a job meanwhile: still held
    assert client.get_run(run_id).info.status == "RUNNING"
    again.finish()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert list((tmp_path / "mlflow.db.runs").iterdir()) == []  # each ended run let go


def test_a_run_another_job_holds_is_continued_without_waiting_for_that_job(
    tmp_path, monkeypatch, caplog
):
    """Two copies of a run folder resumed at once continue the same run: the second job
    must not wait for the first one's whole training to hold the run. It waits a moment (a
    job looking whether the run was left holds it that long), then names the holder."""
    import functools

    from recsys import locks, tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(
        tracking, "_take_run_lock", functools.partial(tracking._take_run_lock, patience=0.3)
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(tracking_uri=uri, experiment_name="e")
    first.finish("FAILED")
    fd = locks.hold(tracking.run_lock(uri, first.run_id), lambda holder: holder)  # the other
    try:
        with caplog.at_level("WARNING", logger="recsys.tracking"):
            again = Tracker(tracking_uri=uri, experiment_name="e", continue_run_id=first.run_id)
    finally:
        os.close(fd)
    assert again.client.get_run(first.run_id).info.status == "RUNNING"
    assert f"MLflow run {first.run_id} is held by process {os.getpid()}" in caplog.text


def test_a_sweep_jobs_run_is_tagged_with_its_sweep_and_job():
    """Each job of a -m sweep is a run of its own: tags tie it to its sweep (an audit found
    them told apart only by their parameters). Outside a sweep, none."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from recsys.config import sweep_tags

    root = Path(__file__).resolve().parents[2]
    assert sweep_tags() == {}  # no Hydra job at all (a notebook)
    with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
        cfg = compose("config", ["model.num_heads=2"], return_hydra_config=True)
    multirun = cfg.copy()
    with open_dict(multirun):
        multirun.hydra.mode = "MULTIRUN"
        multirun.hydra.job.num = 3
        multirun.hydra.sweep.dir = "/tmp/sweeps/night"
    instance = HydraConfig.instance()
    before = instance.cfg
    try:
        instance.set_config(cfg)
        assert sweep_tags() == {}  # a single run
        instance.set_config(multirun)
        assert sweep_tags() == {
            "sweep.dir": "/tmp/sweeps/night",
            "sweep.job": "3",
            "sweep.overrides": "model.num_heads=2",
        }
    finally:
        instance.cfg = before


def test_a_run_folder_given_as_the_model_names_the_checkpoints_in_it(tmp_path):
    """model=<a run folder> (or its checkpoints/) was refused as "no such checkpoint file",
    which sends one looking for a missing folder; it now says it is a folder and names the
    checkpoint to pass."""
    from recsys.tracking import resolve_model

    run = tmp_path / "runs" / "2025-03-01"
    (run / "checkpoints" / "scoring").mkdir(parents=True)
    for name in ("best.ckpt", "last.ckpt", "scoring/model.ckpt"):
        (run / "checkpoints" / name).write_bytes(b"")
    for folder in (run, run / "checkpoints"):
        with pytest.raises(IsADirectoryError, match="is a folder") as info:
            resolve_model(str(folder), None)
        assert f"model={run / 'checkpoints' / 'best.ckpt'}" in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IsADirectoryError, match="holds no checkpoint"):
        resolve_model(str(tmp_path / "empty"), None)


def test_a_training_alone_stamps_its_validation_metrics_with_their_protocol(
    make_config, monkeypatch
):
    """pipelines.train logs val/* metrics without a test evaluation after it: its run carries
    the same protocol.* tags as the main job's, so that a number read from it says how it was
    measured (split, candidates, seen items...)."""
    from recsys.tasks import train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = make_config(
        "config",
        ["experiment=tiny", "trainer.max_epochs=1", "training.seen_items=exclude"],
    )
    run_id = train.run(cfg).run.split()[2]  # "MLflow run <id> (mlflow ui ...)"
    run = Tracker(tracking_uri=cfg.logger.tracking_uri, run_id=run_id).client.get_run(run_id)
    tags, metrics = run.data.tags, run.data.metrics
    assert "val/ndcg_at_10" in metrics
    assert tags["protocol.split"] == "temporal"
    assert tags["protocol.candidates"] == "all items"
    assert tags["protocol.seen_items"] == "excluded (-inf)"
    assert tags["data.fingerprint"] and tags["task"] == cfg.task_name


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # (bound, never listening: refused, and free of others)
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_tracking_server_that_does_not_answer_is_refused_before_any_work(
    make_config, tmp_path, monkeypatch
):
    """A server down or on another port failed a job only after MLflow's retries (7, of up to
    120 s each, with a growing backoff: 4.5 minutes for a refused connection), and a scoring
    job only after it had written its recommendations. Refused at the job's first check,
    naming the URI, where it came from and the fix; the user's MLflow settings are kept."""
    from recsys import tracking
    from recsys.tasks import score

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(tracking.SERVER_CHECK, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "9")
    uri = f"http://127.0.0.1:{_closed_port()}"
    output = tmp_path / "recs"
    cfg = make_config(
        "score",
        [f"model_ref={tmp_path / 'none.ckpt'}", f"logger.tracking_uri={uri}"]
        + [f"retrieval.output.path={output}"],
    )
    with pytest.raises(ConnectionError, match=f"server {uri} \\(logger.tracking_uri\\) does not"):
        score.run(cfg)  # (before the missing checkpoint is even looked for)
    assert not output.exists()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConnectionError, match="Start it .* logger=none runs the job without"):
        tracking.check_store({"enabled": True, "tracking_uri": "sqlite:////x/mlflow.db"})
    tracking.check_store({"enabled": False, "tracking_uri": uri})  # tracking off: not asked


@pytest.mark.parametrize("uri", ["http//127.0.0.1:5000", "https:/host", "host.lan:5000"])
def test_a_tracking_uri_with_a_typo_is_named(uri, monkeypatch):
    """http//host (or host:port) was read as a local file store: MLflow 3 refused it with a
    notice about file stores' maintenance mode, naming neither the typo nor the key."""
    from recsys.tracking import check_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match=f"logger.tracking_uri='{uri}' is not a tracking URI"):
        check_store({"enabled": True, "tracking_uri": uri})


def _run_with_packaged_model(tmp_path, monkeypatch) -> tuple[dict, Tracker]:
    """A logger config of a sqlite store under ``tmp_path`` and a run of it holding a packaged
    model (``model/`` with a checkpoint whose bytes are ``weights``)."""
    from recsys.tracking import MODEL_ARTIFACT

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    logger["artifact_root"] = str(tmp_path / "artifacts")
    packaged = tmp_path / "packaged" / "artifacts"
    packaged.mkdir(parents=True)
    (packaged / "model.ckpt").write_bytes(b"weights")
    run = Tracker.from_config(logger)
    run.log_artifact(packaged.parent, MODEL_ARTIFACT)
    return logger, run


def test_a_runs_uri_as_runs_record_it_names_the_runs_model(tmp_path, monkeypatch):
    """An evaluation or scoring run records its model as model.uri=runs:/<run id>/model (as
    log_model and register_model return it), but that URI given back as model=, init_from or
    a teacher was refused as 'no such checkpoint file'; and models:/<name> without a version
    failed with 'not enough values to unpack'."""
    from recsys.tracking import MODEL_ARTIFACT, done_with, resolve_model

    logger, run = _run_with_packaged_model(tmp_path, monkeypatch)
    uri = f"runs:/{run.run_id}/{MODEL_ARTIFACT}"
    path, tags = resolve_model(uri, logger)
    assert path.read_bytes() == b"weights"
    assert tags == {"model.uri": uri, "model.run_id": run.run_id}
    done_with(path)
    assert resolve_model(f"runs:/{run.run_id}", logger, fetch=False)[1] == tags
    with pytest.raises(ValueError, match=r"init_from='runs:/\w+/data': a run's model is runs:/"):
        resolve_model(f"runs:/{run.run_id}/data", logger, "init_from")
    with pytest.raises(ValueError, match="give models:/recs/<version> or recs@<alias>"):
        resolve_model("models:/recs", logger)


def test_a_failed_download_of_a_runs_model_is_not_read_as_a_run_without_one(tmp_path, monkeypatch):
    """Any failure fetching a run's model/ (a download cut off, a tracking server restarted)
    was swallowed, and the job said the run 'has no packaged model and no checkpoint': the
    failure is raised as it is, and a run without either names where its artifacts are."""
    import tempfile

    from recsys.tracking import resolve_model

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    logger, run = _run_with_packaged_model(tmp_path, monkeypatch)

    def cut_off(self, artifact_path, dst):
        raise ConnectionError("Connection reset by peer")

    with monkeypatch.context() as patch:
        patch.setattr(Tracker, "download_artifacts", cut_off)
        with pytest.raises(ConnectionError, match="Connection reset by peer"):
            resolve_model(run.run_id, logger)
    assert list(scratch.iterdir()) == []
    empty = Tracker.from_config(logger)
    with pytest.raises(
        FileNotFoundError, match=f"no checkpoint in its artifacts, .*{empty.run_id}"
    ):
        resolve_model(empty.run_id, logger)


def test_a_store_that_fails_is_not_read_as_a_run_id_it_does_not_hold(tmp_path, monkeypatch):
    """Any failure looking a run up (a tracking server gone after MLflow's retries, a store
    that cannot be opened) was reported as 'no MLflow run with that id', naming only the
    exception's type: the failure is raised as it is; an unknown id is still named."""
    from mlflow.exceptions import MlflowException

    from recsys.tracking import resolve_model

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    run_id = "0123abcd0123abcd0123abcd0123abcd"
    with pytest.raises(ValueError, match=f"model='{run_id}': no MLflow run with that id in sq"):
        resolve_model(run_id, logger)

    def gone(self, run_id):
        raise MlflowException("API request to http://host:5000/api/2.0/mlflow/runs/get failed")

    from mlflow.tracking import MlflowClient

    monkeypatch.setattr(MlflowClient, "get_run", gone)
    with pytest.raises(MlflowException, match="runs/get failed"):
        resolve_model(run_id, logger)


def test_a_failed_job_fails_with_its_own_error_when_its_run_cannot_be_closed(
    tmp_path, monkeypatch, caplog
):
    """A job failing while its tracking server was gone (the server lost mid-training, a
    SIGTERM then) tried to mark its run FAILED, which failed too: the job then failed with
    that MLflow error, its log naming it instead of the job's failure, and a SIGTERM's exit
    status 143 became 1. The job's own failure is raised, the unclosed run named."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from recsys.tracking import use_tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}

    def gone(self, run_id, status=None, end_time=None):
        raise MlflowException("API request to http://host:5000/api/2.0/mlflow/runs/update failed")

    real = MlflowClient.set_terminated
    monkeypatch.setattr(MlflowClient, "set_terminated", gone)
    with (
        caplog.at_level("WARNING", logger="recsys.tracking"),
        pytest.raises(SystemExit) as exit_,
        use_tracker(None, logger) as tracker,
    ):
        raise SystemExit(143)
    assert exit_.value.code == 143
    assert f"MLflow run {tracker.run_id} could not be marked FAILED: API request" in caplog.text
    # let go all the same: the next job of this host (its server back) marks it KILLED
    monkeypatch.setattr(MlflowClient, "set_terminated", real)
    Tracker.from_config(logger).finish()
    assert tracker.client.get_run(tracker.run_id).info.status == "KILLED"


def test_a_preparation_which_opens_no_run_does_not_ask_the_tracking_server(
    make_config, monkeypatch
):
    """pipelines.prepare tracks nothing: a tracking server down is no reason to refuse it
    (a training of the same config is refused)."""
    from recsys import tracking
    from recsys.tasks import prepare, train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(tracking.SERVER_CHECK, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg = make_config("config", ["experiment=tiny", f"logger.tracking_uri={uri}"])
    prepare.check_config(cfg)
    with pytest.raises(ConnectionError, match=f"server {uri} \\(logger.tracking_uri\\)"):
        train.check_config(cfg)


class _Terminal(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


def test_mlflows_artifact_bars_are_drawn_on_a_terminal_only(tmp_path, monkeypatch):
    """MLflow draws a bar for each artifact transfer, on stderr (a model fetched by run id or
    alias: an update per file, some 90 in a scheduled scoring's log every night; packaging a
    model: its checkpoint). Into a file or pipe there is none now, as for Lightning's bar; a
    terminal keeps it, and MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR set by the user decides."""
    import io

    from recsys.tracking import (
        ARTIFACT_BARS,
        MODEL_ARTIFACT,
        artifact_bars_shown_live,
        done_with,
        resolve_model,
    )

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(ARTIFACT_BARS, raising=False)
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stderr", shown)
    logger = {
        "enabled": True,
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "artifact_root": str(tmp_path / "artifacts"),
        "experiment_name": "e",
    }
    packaged = tmp_path / "packaged" / "artifacts"  # as log_model packages a model
    packaged.mkdir(parents=True)
    (packaged / "model.ckpt").write_bytes(b"weights")
    for name in ("MLmodel", "python_env.yaml", "requirements.txt"):
        (packaged.parent / name).write_text("")
    tracker = Tracker.from_config(logger)
    tracker.log_artifact(packaged.parent, MODEL_ARTIFACT)
    tracker.finish()
    path, _ = resolve_model(tracker.run_id, logger)
    assert path.read_bytes() == b"weights"
    done_with(path)
    # (MLflow's log lines may be there: a new store's tables)
    assert "it/s" not in shown.getvalue() and "\r" not in shown.getvalue()
    assert ARTIFACT_BARS not in os.environ  # set for the transfers only

    with artifact_bars_shown_live():
        assert os.environ[ARTIFACT_BARS] == "false"
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with artifact_bars_shown_live():
        assert ARTIFACT_BARS not in os.environ  # MLflow's default: drawn
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv(ARTIFACT_BARS, "true")
    with artifact_bars_shown_live():
        assert os.environ[ARTIFACT_BARS] == "true"
    assert os.environ[ARTIFACT_BARS] == "true"
