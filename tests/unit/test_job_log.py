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
