"""a trained model (checkpoint, MLflow run or name@alias) + an event log → recommendations
folder (retrieval.output.path: part-*.parquet, _summary.json, _plots/).

python -m pipelines.score model=<checkpoint path | MLflow run id | name@alias> [overrides]
"""

import sys

import hydra
from omegaconf import DictConfig

import recsys.cgroups
import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import score


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="score")
def entry(cfg: DictConfig):
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        recsys.cgroups.fit_threads_to_cpu_quota()  # a container's CPU limit (see recsys.cgroups)
        return score.run(cfg)


if __name__ == "__main__":
    sys.argv = recsys.config.model_reference_argv(sys.argv)  # model=<ref>, see that function
    entry()
