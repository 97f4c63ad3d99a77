"""Learning-rate schedules set in epochs (recsys.training.schedules)."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.training.schedules import warmup_cosine


def rates(scheduler, steps: int) -> list[float]:
    """The learning rate of each of the first ``steps`` optimiser steps."""
    seen = []
    for _ in range(steps):
        seen.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return seen


def optimizer(lr: float = 0.5) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_warmup_then_half_cosine_by_hand():
    # 4 steps per epoch, 1 epoch of warm-up, horizon 3 epochs: steps 0-3 warm up, 4-11 decay
    lr = rates(warmup_cosine(optimizer(), steps_per_epoch=4, epochs=3, warmup_epochs=1), 14)
    assert lr[:4] == pytest.approx([0.125, 0.25, 0.375, 0.5])
    assert lr[4] == pytest.approx(0.5)  # the decay starts at the full rate
    assert lr[8] == pytest.approx(0.25)  # half way through the 8 decay steps: cos(pi/2) = 0
    assert lr[6] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)) / 2)
    assert lr[12:] == pytest.approx([0.0, 0.0])  # held at the floor past the horizon


def test_without_warmup_it_is_torch_cosine_annealing_up_to_the_horizon_then_holds():
    ours = rates(warmup_cosine(optimizer(), steps_per_epoch=5, epochs=2, final_lr_fraction=0.1), 15)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer(), T_max=10, eta_min=0.05)
    torch_rates = rates(reference, 15)
    assert ours[:11] == pytest.approx(torch_rates[:11])
    assert ours[10:] == pytest.approx([0.05] * 5)  # torch's climbs back up from here
    assert torch_rates[14] > 0.05


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 0}, r"epochs=0 must be > 0"),
        ({"epochs": 2, "warmup_epochs": 2}, r"warmup_epochs=2 must be in \[0, epochs=2\)"),
        ({"epochs": 2, "final_lr_fraction": 1.5}, r"final_lr_fraction=1.5 must be in \[0, 1\]"),
        ({"epochs": 2, "steps_per_epoch": 0}, r"steps_per_epoch=0 must be a positive integer"),
    ],
)
def test_bad_settings_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        warmup_cosine(optimizer(), **{"steps_per_epoch": 4, **kwargs})
