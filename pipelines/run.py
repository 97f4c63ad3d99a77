"""prepare → train → evaluate → score (the main job).

python -m pipelines.run [hydra overrides]
"""

import hydra
from omegaconf import DictConfig

import recsys.cgroups
import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import evaluate, main, train


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="config")
def entry(cfg: DictConfig) -> float | None:
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        recsys.cgroups.fit_threads_to_cpu_quota()  # a container's CPU limit (see recsys.cgroups)
        result = main.run(cfg)
    print(f"recommendations: {result.recommendations}")
    print(f"checkpoint:      {result.checkpoint}")
    print(f"tracking:        {result.run}")
    k = evaluate.headline_k(cfg.training.metric_ks)  # 10 unless training.metric_ks lacks it
    for name in (f"test/ndcg_at_{k}", f"test/hr_at_{k}", f"test/popularity_ndcg_at_{k}"):
        print(f"{name:<27}{result.metrics[name]:.4f}")
    # an optimising sweeper's objective: the validation score that selected the model (test
    # metrics are for the report, never for choosing settings)
    return train.sweep_objective(result.metrics)


if __name__ == "__main__":
    entry()
