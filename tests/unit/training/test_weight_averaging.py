"""The bias-corrected EMA against its closed form, through torch's AveragedModel as Lightning
uses it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from recsys.training.callbacks import BiasCorrectedEMA, bias_corrected_ema


@pytest.mark.parametrize("decay", [0.5, 0.9, 0.999])
def test_average_is_the_normalised_exponentially_weighted_sum(decay):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    averaged = AveragedModel(model, avg_fn=bias_corrected_ema(decay), use_buffers=True)
    points = []
    for _ in range(7):
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p))
        points.append([p.detach().clone() for p in model.parameters()])
        averaged.update_parameters(model)
    ages = torch.arange(len(points) - 1, -1, -1, dtype=torch.float64)
    weights = decay**ages / (decay**ages).sum()
    for i, p in enumerate(averaged.module.parameters()):
        stacked = torch.stack([point[i].double() for point in points])
        expected = (weights[:, None, None] if stacked.ndim == 3 else weights[:, None]) * stacked
        torch.testing.assert_close(p.detach().double(), expected.sum(0), rtol=1e-5, atol=1e-6)


def test_two_points_are_averaged_equally_whatever_the_decay():
    first, second = torch.zeros(4), torch.ones(4)
    average = bias_corrected_ema(0.9999)(first, second, torch.tensor(1))
    torch.testing.assert_close(average, torch.full((4,), 1.0 / (1.0 + 0.9999)))


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, True, "0.9"])
def test_bad_decay_names_the_option(decay):
    with pytest.raises(ValueError, match="weight_averaging.decay"):
        BiasCorrectedEMA(decay=decay)
