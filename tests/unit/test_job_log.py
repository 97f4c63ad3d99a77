"""The job log (run.log) holds Lightning's lines and Python warnings, as the console does:
Lightning's loggers otherwise write to stderr only (their own handler, no propagation)."""

from __future__ import annotations

import contextlib
import logging
import warnings

from recsys.config import LIGHTNING_LOGGERS, JobLogHasEverything


def test_lightning_lines_and_warnings_reach_the_job_log_for_the_job_only(caplog):
    own = logging.StreamHandler()
    lightning = logging.getLogger(LIGHTNING_LOGGERS[0])
    saved = lightning.handlers[:], lightning.propagate
    lightning.handlers[:] = [own]  # as Lightning sets it up when imported before Hydra's setup
    lightning.propagate = False
    callback = JobLogHasEverything()
    try:
        callback.on_job_start(config=None)
        with caplog.at_level(logging.INFO):
            logging.getLogger("pytorch_lightning.utilities.rank_zero").info("GPU available: no")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn("a third-party warning", UserWarning, stacklevel=1)
        assert "GPU available: no" in caplog.text
        assert "a third-party warning" in caplog.text
        assert own not in lightning.handlers  # not twice on the console
        callback.on_job_end(config=None, job_return=None)
        assert lightning.handlers == [own] and lightning.propagate is False
        assert warnings.showwarning.__module__ == "warnings"  # capture undone
    finally:
        logging.captureWarnings(False)
        lightning.handlers[:], lightning.propagate = saved


def test_the_failure_line_of_a_job_stopped_by_a_signal_names_the_signal(caplog):
    """A job killed by SIGTERM ended its log with "main job failed: SystemExit: 143", and one
    stopped by Ctrl-C outside the training with "KeyboardInterrupt: " (nothing after it)."""
    from omegaconf import OmegaConf

    from recsys.config import failure_logged

    cfg = OmegaConf.create({"task_name": "main"})
    for raised, expected in (
        (SystemExit(143), "main job failed: SystemExit: 143 (killed by SIGTERM)"),
        (KeyboardInterrupt(), "main job failed: KeyboardInterrupt: interrupted (Ctrl-C)"),
        (SystemExit(2), "main job failed: SystemExit: 2"),
    ):
        caplog.clear()
        with (
            caplog.at_level(logging.ERROR),
            contextlib.suppress(BaseException),
            failure_logged(cfg),
        ):
            raise raised
        assert caplog.records[-1].getMessage() == expected


def test_an_interrupted_sweep_job_is_told_to_continue_alone(tmp_path, caplog):
    """A sweep job's training killed mid-way was told to continue with "the same command and
    paths.run_dir=<its folder> resume=last": the sweep again would give every job that folder.
    It names the job's own overrides, to run without -m."""
    from types import SimpleNamespace

    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from recsys.config import config_dir
    from recsys.tasks import train

    run_dir = tmp_path / "multi" / "1"
    overrides = [f"paths.run_dir={run_dir}", "model.num_heads=2"]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
        cfg.hydra.job.num = 1
        cfg.hydra.sweep.dir = str(tmp_path / "multi")
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    instance = HydraConfig.instance()
    before = instance.cfg
    try:
        instance.set_config(cfg)
        with caplog.at_level(logging.WARNING):
            train.log_how_to_continue(cfg, SimpleNamespace(current_epoch=2), "killed by SIGTERM")
    finally:
        instance.cfg = before
    assert caplog.records[-1].getMessage() == (
        "training killed by SIGTERM in epoch 3: continue it from its last finished epoch with "
        f"this job's {' '.join(overrides)} (no -m) and paths.run_dir={run_dir} resume=last"
    )
