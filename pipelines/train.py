"""prepared data → trained model (prepares first unless data.prepared_dir is set).

python -m pipelines.train [hydra overrides]
"""

import hydra
from omegaconf import DictConfig

import recsys.cgroups
import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import train


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="config")
def entry(cfg: DictConfig) -> float | None:
    if cfg.task_name == "main":  # the main job's config, run as this pipeline (MLflow run
        cfg.task_name = "train"  # name, tag), unless task_name=... names the runs otherwise
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        recsys.cgroups.fit_threads_to_cpu_quota()  # a container's CPU limit (see recsys.cgroups)
        result = train.run(cfg)
    return train.sweep_objective(result.best_val)  # an optimising sweeper's objective


if __name__ == "__main__":
    entry()
