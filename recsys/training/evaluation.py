"""Evaluation outside the training loop (the best checkpoint on test, baselines) with exactly
the metric code the LightningModule logs during validation."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from recsys.training.metrics import CoverageAccumulator, MeanAccumulator
from recsys.training.module import SeqRecModule

ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def pick_device(accelerator: str = "auto", *, option: str = "accelerator") -> torch.device:
    """ "auto" takes a GPU when there is one; "cpu" / "gpu" / "cuda" force the choice. Another
    name, or a GPU asked for where there is none, is refused naming ``option``."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"{option}={accelerator!r}: use one of {list(ACCELERATORS)}")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"{option}={accelerator}: this machine has no CUDA GPU; use auto or cpu"
            )
        return torch.device("cuda")
    if accelerator == "auto" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@torch.no_grad()
def evaluate(
    module: SeqRecModule,
    loader: DataLoader,
    *,
    device: torch.device,
    split: str,
    description: str = "eval",
    segment: bool = False,
) -> dict[str, float]:
    """Mean of every per-row metric of ``module.evaluation_metrics`` over ``loader`` (the
    ``split`` targets, reported as the module reports that split: see
    :meth:`SeqRecModule.per_target_means`), and the catalogue coverage of the rows' top K.

    ``segment``: the loader holds some of the split's users only. Its means are then over
    their ranked targets as they are (the share of unknown-item targets that
    ``unknown_targets=miss`` scales by is the whole split's, not the segment's), and each comes
    with its standard error as ``<metric>_stderr``."""
    module = module.to(device).eval()
    totals = MeanAccumulator()
    coverage = CoverageAccumulator(module.encoder.num_items, module.metric_ks)
    for batch in tqdm(loader, desc=description, leave=False, mininterval=2.0):
        totals.update(module.evaluation_metrics(batch.to(device), coverage))
    if segment:
        errors = {f"{name}_stderr": value for name, value in totals.standard_errors().items()}
        return {**totals.compute(), **errors, **coverage.compute()}
    return {**module.per_target_means(split, totals.compute()), **coverage.compute()}
