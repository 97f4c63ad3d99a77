"""The README's "Adding an encoder", followed as a contributor would: a small encoder (the mean
of the last k item embeddings, with the tied item table of
:class:`recsys.model.interface.TiedItemScores`), a ``model/<name>.yaml`` naming it, and the main
job run as ``model=<name> experiment=tiny`` through training, evaluation, scoring, the export
and ``init_from``. The class is defined here and installed as a module under recsys.model
(checkpoints load classes from there only), so the package carries no example model."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import recsys.model
from recsys.model.interface import TiedItemScores, check_encoder
from recsys.model.outputs import EncoderOutput
from recsys.schema import PAD_IDX
from recsys.tasks import main, train

MODULE = "recsys.model.readme_example"


class MeanLastK(TiedItemScores, nn.Module):
    """Position t: a linear map of the mean of the last ``k`` real item embeddings up to t."""

    __module__ = MODULE
    causal = True

    def __init__(self, *, num_items: int, max_seq_len: int, d_model: int = 16, k: int = 3) -> None:
        super().__init__()
        self.config = {"num_items": num_items, "max_seq_len": max_seq_len, "d_model": d_model}
        self.config["k"] = self.k = k
        self._init_item_table(num_items, d_model, embedding_std=None)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, item, behavior=None, time_bucket=None, padding_mask=None, qt=None):
        if padding_mask is None:
            padding_mask = item != PAD_IDX
        real = padding_mask[..., None]
        x = (self.item_embedding(item) * self.item_scale).masked_fill(~real, 0.0)
        total, count = x.cumsum(1), real.float().cumsum(1)
        before = nn.functional.pad(total, (0, 0, self.k, 0))[:, : item.shape[1]]
        count_before = nn.functional.pad(count, (0, 0, self.k, 0))[:, : item.shape[1]]
        mean = (total - before) / (count - count_before).clamp(min=1)
        hidden = self.proj(mean).masked_fill(~real, 0.0)
        return EncoderOutput(hidden=hidden, query=hidden[:, -1], padding_mask=padding_mask)


@pytest.fixture
def example(monkeypatch, tmp_path):
    """The encoder importable as recsys.model.readme_example.MeanLastK, and a config folder
    holding model/readme_example.yaml (the override that puts it on Hydra's search path)."""
    module = types.ModuleType(MODULE)
    module.MeanLastK = MeanLastK
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(recsys.model, "readme_example", module, raising=False)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "readme_example.yaml").write_text(
        f"_target_: {MODULE}.MeanLastK\nd_model: 32\nk: 3\n"
    )
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


TINY = ["experiment=tiny", "logger=none", "trainer.max_epochs=1", "model=readme_example"]


def test_it_has_the_interface_and_is_causal() -> None:
    encoder = MeanLastK(num_items=12, max_seq_len=6, d_model=8, k=2)
    check_encoder(encoder)
    item = torch.tensor([[0, 0, 2, 3, 4, 5]])
    changed = item.clone()
    changed[0, -1] = 9
    with torch.no_grad():
        a, b = encoder(item).hidden, encoder(changed).hidden
    torch.testing.assert_close(a[:, :-1], b[:, :-1])  # position t reads nothing after t


def test_a_model_key_set_by_an_experiment_names_the_way_out(make_config, example) -> None:
    # experiment=tiny sets model.num_layers, which this encoder does not take
    cfg = make_config("config", [example, *TINY])
    with pytest.raises(ValueError, match=r"experiment= overlay .* ~model\.num_layers"):
        train.check_model_settings(cfg)


def test_an_encoder_outside_recsys_model_is_refused_before_training(make_config, example):
    # importable, but a checkpoint naming it would not load: refused when built (it used to
    # train, and the job failed when evaluation loaded the checkpoint)
    overrides = [example, *TINY, f"model._target_={__name__}.Outside", "~model.num_layers"]
    with pytest.raises(TypeError, match=r"only classes under recsys.model .* recsys/model/"):
        train.check_model_settings(make_config("config", overrides))


class Outside(MeanLastK):
    __module__ = __name__


def test_the_main_job_trains_evaluates_scores_exports_and_warm_starts(
    make_config, example, tmp_path
) -> None:
    from unit.test_export import assert_served_like_trained  # tests/ is on the pythonpath

    from recsys.checkpoint import load_checkpoint

    # tiny's training.rerank_top_n=20 also runs the generic two-stage path
    overrides = [example, *TINY, "~model.num_layers"]
    result = main.run(make_config("config", overrides))
    assert result.metrics["test/ndcg_at_10"] >= 0
    model = load_checkpoint(result.checkpoint)
    assert type(model.encoder) is MeanLastK
    assert_served_like_trained(model, tmp_path / "served")
    # init_from a model of another log: TiedItemScores' VOCABULARY_ROWS carry items by id
    again = [*overrides, f"paths.run_dir={tmp_path / 'again'}", "data.min_item_events=30"]
    warm = train.run(make_config("config", [*again, f"init_from={result.checkpoint}"]))
    assert warm.checkpoint.exists()


def test_a_class_defined_in_a_function_is_refused(example) -> None:
    from recsys.checkpoint import check_loadable

    class Local(MeanLastK):  # recsys.model.readme_example.<...>.Local: not importable
        __module__ = MODULE

    check_loadable(MeanLastK(num_items=12, max_seq_len=4))
    with pytest.raises(TypeError, match="cannot be imported by that name"):
        check_loadable(Local(num_items=12, max_seq_len=4))
