"""The bias-corrected EMA against its closed form, through torch's AveragedModel as Lightning
uses it; the configured weight average keeps the encoder's constant buffers."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from recsys.data.batch import SeqBatch
from recsys.model import ATRank
from recsys.tasks.train import build_callbacks
from recsys.training.callbacks import BiasCorrectedEMA, bias_corrected_ema
from recsys.training.module import SeqRecModule


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


@pytest.mark.parametrize(
    "target",
    [
        "pytorch_lightning.callbacks.EMAWeightAveraging",
        "recsys.training.callbacks.BiasCorrectedEMA",
    ],
)
def test_the_weight_average_keeps_the_item_attribute_table(make_config, tmp_path, target):
    """The item -> attribute table is an integer buffer: averaged as Lightning's EMA averages
    (``0.9999 * a + 0.0001 * a`` in float32, truncated back), indices such as 11, 22 and 29
    came out one lower in the validated and saved average."""
    cfg = make_config(
        "config", [f"callbacks.weight_averaging={{_target_: {target}, decay: 0.9999}}"]
    )
    callback = build_callbacks(cfg)["weight_averaging"]
    torch.manual_seed(0)
    encoder = ATRank(
        num_items=60,
        num_attributes=60,
        num_behaviors=3,
        num_time_buckets=4,
        max_seq_len=4,
        d_model=8,
        num_heads=2,
        num_layers=1,
    )
    table = torch.arange(60)[:, None]  # item i has attribute i (0 PAD, 1 UNK)
    encoder.set_item_attributes(table)
    module = SeqRecModule(encoder, partial(torch.optim.Adam, lr=1e-2), metric_ks=(5,))
    item = torch.randint(2, 60, (4, 4))
    ones = torch.ones_like(item)
    batch = SeqBatch(
        item=item,
        behavior=2 * ones,
        time_bucket=ones,
        padding_mask=ones.bool(),
        query_time_bucket=ones,
        target_item=torch.randint(2, 60, (4, 4)),
        target_behavior=2 * ones,
        user_index=torch.arange(4),
    )
    trainer = pl.Trainer(
        max_steps=3,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no validation loader, few batches
        trainer.fit(
            module, train_dataloaders=torch.utils.data.DataLoader([batch] * 3, batch_size=None)
        )
        trainer.save_checkpoint(tmp_path / "averaged.ckpt")
    saved = torch.load(tmp_path / "averaged.ckpt", map_location="cpu", weights_only=False)
    assert torch.equal(saved["state_dict"]["encoder.embedding.item_attributes"], table)
    assert torch.equal(module.encoder.embedding.item_attributes, table)  # the average, copied in
