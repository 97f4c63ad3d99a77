"""prepare → train → evaluate → score (the main job).

python -m pipelines.run [hydra overrides]
"""

import hydra
from omegaconf import DictConfig

import recsys.config  # noqa: F401  (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import main


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def entry(cfg: DictConfig) -> float:
    result = main.run(cfg)
    print(f"recommendations: {result.recommendations}")
    print(f"checkpoint:      {result.checkpoint}")
    print(f"tracking:        {result.run}")
    for name in ("test/ndcg_at_10", "test/hr_at_10", "test/popularity_ndcg_at_10"):
        print(f"{name:<27}{result.metrics[name]:.4f}")
    return result.metrics["test/ndcg_at_10"]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    entry()
