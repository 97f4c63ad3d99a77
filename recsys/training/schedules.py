"""Learning-rate schedules set in epochs, for ``training.scheduler``.

``training.scheduler`` is a partial (Hydra ``_partial_: true``) that
:meth:`~recsys.training.module.SeqRecModule.configure_optimizers` calls with the optimiser, and
steps once per optimiser step. A factory with a ``steps_per_epoch`` parameter (every schedule
here) is also given the number of optimiser steps in one training epoch, so that its horizon
is stated in epochs, not in steps that depend on the data and the batch size::

    python -m pipelines.run 'training.scheduler={_target_: recsys.training.schedules.warmup_cosine,
        _partial_: true, epochs: 50, final_lr_fraction: 0.04}'

A ``torch.optim.lr_scheduler`` class stepped without arguments works too (its step counts are
optimiser steps); ``ReduceLROnPlateau``, which needs a metric at each step, does not.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    *,
    steps_per_epoch: int,
    epochs: float,
    warmup_epochs: float = 0.0,
    final_lr_fraction: float = 0.0,
) -> LambdaLR:
    """A linear warm-up over ``warmup_epochs`` (step ``s`` of ``W`` at ``(s + 1) / W`` of the
    optimiser's learning rate), then a half cosine from that rate down to
    ``final_lr_fraction`` of it at ``epochs``, held there afterwards (early stopping may end
    training before the horizon, ``trainer.max_epochs`` after it).

    Without warm-up this is ``CosineAnnealingLR(T_max=epochs * steps_per_epoch,
    eta_min=final_lr_fraction * lr)`` up to the horizon; past it, torch's class climbs back
    up, this one stays at the floor.
    """
    if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r} must be a positive integer")
    if not epochs > 0:
        raise ValueError(f"training.scheduler.epochs={epochs!r} must be > 0 (the horizon)")
    if not 0 <= warmup_epochs < epochs:
        raise ValueError(
            f"training.scheduler.warmup_epochs={warmup_epochs!r} must be in [0, epochs={epochs})"
        )
    if not 0 <= final_lr_fraction <= 1:
        raise ValueError(
            f"training.scheduler.final_lr_fraction={final_lr_fraction!r} must be in [0, 1]"
        )
    warmup = warmup_epochs * steps_per_epoch
    decay = epochs * steps_per_epoch - warmup

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / decay)
        return final_lr_fraction + (1 - final_lr_fraction) * (1 + math.cos(math.pi * progress)) / 2

    return LambdaLR(optimizer, factor)
