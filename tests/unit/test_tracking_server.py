"""recsys against an MLflow tracking server over HTTP (``mlflow server``), as teams run it:
one server, started once for the module on a free port."""

import logging
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from recsys.tracking import Tracker

pytestmark = pytest.mark.slow  # (a server takes seconds to start)


def _mlflow_cli() -> str | None:
    beside = Path(sys.executable).with_name("mlflow")  # the virtualenv's, when not on PATH
    return str(beside) if beside.is_file() else shutil.which("mlflow")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``(uri, artifacts folder)`` of a running ``mlflow server`` that proxies artifacts."""
    cli = _mlflow_cli()
    if cli is None:
        pytest.skip("the mlflow CLI is not installed: these tests need `mlflow server`")
    folder = tmp_path_factory.mktemp("server")
    port = _free_port()
    command = [cli, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'server.db'}"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    with open(folder / "server.log", "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                # (an API call, not /health: the server opens its store on the first one)
                search = f"{uri}/api/2.0/mlflow/experiments/search?max_results=1"
                with urllib.request.urlopen(search, timeout=60):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "server.log").read_text()[-3000:]
                    pytest.fail(f"mlflow server did not start:\n{log}")
                time.sleep(0.5)
        yield uri, folder / "artifacts"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(autouse=True)
def _no_uri_variable(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_artifacts_go_to_the_servers_store_not_a_folder_of_the_job(server, tmp_path, caplog):
    """The logger config's default artifact_root (the run folder's mlartifacts/) became the
    artifact location of an experiment created on the server: every job, from any machine,
    then wrote its artifacts (checkpoints, the packaged model) into that folder of its own
    machine, never to the server's store, so a job elsewhere could not fetch the model, and
    each job started from another folder warned that its artifact_root was not applied."""
    uri, served = server
    local = tmp_path / "job" / "mlartifacts"
    tracker = Tracker(tracking_uri=uri, experiment_name="artifacts", artifact_root=str(local))
    (tmp_path / "stats.json").write_text("{}")
    tracker.log_artifact(tmp_path / "stats.json", "data")
    tracker.finish()
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    assert not local.exists()
    assert [p.name for p in served.rglob("stats.json")] == ["stats.json"]
    with caplog.at_level(logging.INFO, logger="recsys.tracking"):
        other = str(tmp_path / "elsewhere" / "mlartifacts")
        reader = Tracker(tracking_uri=uri, experiment_name="artifacts", artifact_root=other)
    assert "is not applied" not in caplog.text
    assert "is not used with the tracking server" in caplog.text
    fetched = Tracker(tracking_uri=uri, run_id=tracker.run_id)
    assert (fetched.download_artifacts("data", tmp_path / "got") / "stats.json").is_file()
    reader.finish()


def test_a_run_on_a_server_is_described_by_its_page_there(server):
    """The main job's last lines told a server's user to run `mlflow ui --backend-store-uri
    http://...`, which opens no server's runs: it names the run's page on the server."""
    uri, _ = server
    tracker = Tracker(tracking_uri=f"{uri}/", experiment_name="pages")
    page = f"{uri}/#/experiments/{tracker.experiment_id}/runs/{tracker.run_id}"
    assert tracker.describe() == f"MLflow run {tracker.run_id} ({page})"
    with urllib.request.urlopen(page, timeout=30) as answer:
        assert answer.status == 200
    tracker.finish()


def test_an_experiment_keeping_artifacts_in_a_folder_of_each_machine_is_named(
    server, tmp_path, caplog
):
    """An experiment recsys created on a server before it left logger.artifact_root's folder
    out keeps that folder: every job went on writing its models to its own machine, silently."""
    uri, _ = server
    Tracker(tracking_uri=uri, experiment_name="served").finish()
    folder = str(tmp_path / "outputs" / "mlartifacts")
    Tracker(tracking_uri=uri, experiment_name="old").client.create_experiment("local", folder)
    with caplog.at_level(logging.WARNING, logger="recsys.tracking"):
        Tracker(tracking_uri=uri, experiment_name="served").finish()
        shared = f"file://{tmp_path / 'shared'}"  # a folder asked for (a share): as asked
        Tracker(tracking_uri=uri, experiment_name="share", artifact_root=shared).finish()
        Tracker(tracking_uri=uri, experiment_name="share", artifact_root=shared).finish()
        assert "of each machine" not in caplog.text and "is not applied" not in caplog.text
        Tracker(tracking_uri=uri, experiment_name="local").finish()
    assert f"MLflow experiment 'local' on the tracking server {uri} keeps its artifacts in " in (
        caplog.text
    )
    assert f"the folder {folder} of each machine" in caplog.text
