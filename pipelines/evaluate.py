"""a trained model (checkpoint, MLflow run or name@alias) on the test targets (splits=[val,test]
adds the validation ones), beside the popularity and transition baselines.

python -m pipelines.evaluate model=<checkpoint path | MLflow run id | name@alias> [overrides]
"""

import sys

import hydra
from omegaconf import DictConfig

import recsys.cgroups
import recsys.config  # (registers the ${abspath:} resolver before Hydra resolves)
from recsys.tasks import evaluate


@hydra.main(version_base="1.3", config_path=recsys.config.config_dir(), config_name="evaluate")
def entry(cfg: DictConfig):
    with recsys.config.launch_directory(), recsys.config.failure_logged(cfg):
        recsys.cgroups.fit_threads_to_cpu_quota()  # a container's CPU limit (see recsys.cgroups)
        return evaluate.run(cfg)


if __name__ == "__main__":
    sys.argv = recsys.config.model_reference_argv(sys.argv)  # model=<ref>, see that function
    entry()
