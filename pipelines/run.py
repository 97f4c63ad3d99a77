"""prepare → train → evaluate → score (the main job).

python -m pipelines.run [hydra overrides]
"""

import hydra
from omegaconf import DictConfig

import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import evaluate, main


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="config")
def entry(cfg: DictConfig) -> float:
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        result = main.run(cfg)
    print(f"recommendations: {result.recommendations}")
    print(f"checkpoint:      {result.checkpoint}")
    print(f"tracking:        {result.run}")
    k = evaluate.headline_k(cfg.training.metric_ks)  # 10 unless training.metric_ks lacks it
    for name in (f"test/ndcg_at_{k}", f"test/hr_at_{k}", f"test/popularity_ndcg_at_{k}"):
        print(f"{name:<27}{result.metrics[name]:.4f}")
    return result.metrics[f"test/ndcg_at_{k}"]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    entry()
