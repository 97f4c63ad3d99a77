"""event log → prepared dataset folder.

python -m pipelines.prepare [hydra overrides]
"""

import hydra
from omegaconf import DictConfig

import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import prepare


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="config")
def entry(cfg: DictConfig):
    if cfg.task_name == "main":  # the main job's config, run as this pipeline (its log line
        cfg.task_name = "prepare"  # "prepare job failed"), unless task_name=... names it
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        return prepare.run(cfg)


if __name__ == "__main__":
    entry()
