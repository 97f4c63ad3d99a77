"""``pipelines.evaluate other_data=true``'s item map and its refusals, on small vocabularies
(the pipeline runs are in tests/integration/test_pipelines.py)."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest
import torch

from recsys.data.batch import SeqBatch
from recsys.data.vocab import Vocab
from recsys.schema import NUM_RESERVED, UNK_IDX
from recsys.tasks.evaluate import _other_data_items
from recsys.training.evaluation import evaluate


def vocab(ids: list) -> Vocab:
    events = pl.DataFrame({"item_id": ids, "attributes": [None] * len(ids)})
    return Vocab.fit(events.lazy(), behaviors=("view",))


def model_and_data(model_ids: list, data_ids: list):
    model = SimpleNamespace(vocab=vocab(model_ids), data_fingerprint="last-night")
    data = SimpleNamespace(vocab=vocab(data_ids), stats={"fingerprint": "tonight"})
    return model, data


def test_a_log_of_text_ids_for_a_model_of_integer_ids_is_refused_naming_the_id_column():
    """The refusal named data.columns.item, which is no option (the item column is
    data.columns.item_id), and not that text ids never match integer ones."""
    model, data = model_and_data([10, 11, 12], ["10", "11", "12"])
    with pytest.raises(ValueError, match="knows none of this data's 3 items") as info:
        _other_data_items(model, data, "champion.ckpt")
    assert "data.columns.item_id" in str(info.value)
    assert "data.columns.item " not in str(info.value)
    assert str(info.value).endswith(
        "String ids never match Int64 ones: give the log its item ids as Int64"
    )


@pytest.mark.parametrize(("model_ids", "warned"), [([10, 11, 12, 99], False), ([10, 98, 99], True)])
def test_a_model_that_knows_few_of_the_logs_items_is_warned_of(caplog, model_ids, warned):
    """A model that knew 1 of the log's 4 items (another shop's, or the ids of another column
    that overlap by chance) was measured with an info line only, its targets mostly misses;
    scoring warns of such a model below MIN_KNOWN_ITEM_SHARE of the log's items, and so does
    other_data=true now."""
    model, data = model_and_data(model_ids, [10, 11, 12, 13])
    with caplog.at_level("INFO", logger="recsys.tasks.evaluate"):
        item_map = _other_data_items(model, data, "champion.ckpt")
    (record,) = [r for r in caplog.records if "is evaluated on data tonight" in r.message]
    assert (record.levelname == "WARNING") == warned
    known = 1 if warned else 3
    assert f"it knows {known} of the data's 4 items" in record.message
    assert ("(25.0%): most targets will count as misses" in record.message) == warned
    assert int((item_map[NUM_RESERVED:] != UNK_IDX).sum()) == known


class Recommends(torch.nn.Module):
    """A module whose every row's list is ``items`` (the model's indices)."""

    def __init__(self, num_items: int, items: list[int]):
        super().__init__()
        self.encoder = SimpleNamespace(num_items=num_items)
        self.metric_ks = (1, 2)
        self.items = torch.tensor(items)

    def evaluation_metrics(self, batch: SeqBatch, coverage) -> dict[str, torch.Tensor]:
        coverage.update(self.items.expand(len(batch), -1))
        return {"hr_at_2": torch.isin(batch.target_item, self.items).float()}

    def per_target_means(self, split: str, means: dict) -> dict:
        return means


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ([4, 2], (1 / 3, 1 / 3)),  # the data's item 2, then one it lacks
        ([2, 3], (0.0, 0.0)),  # items the data lacks
        ([5, 4], (1 / 3, 2 / 3)),  # the data's items 3 and 2
    ],
)
def test_a_models_coverage_on_other_data_is_a_share_of_this_datas_catalogue(listed, expected):
    """Coverage beside this data's baselines and models is the share of this data's items that
    some list holds. Through an item map it was a share of the model's catalogue: items the
    data no longer has counted, over a denominator of the model's size (a champion knowing 123
    of tonight's 138 items, and 25 gone, reported 0.966 at 20, where at most 123 / 138 of
    tonight's catalogue could be listed)."""
    # the data's items 2, 3, 4 are the model's 4, 5 and one it never learnt; its 2 and 3 are
    # items the data lacks
    item_map = torch.tensor([0, 1, 4, 5, UNK_IDX])
    batch = SeqBatch(
        item=torch.tensor([[2, 3]]),
        behavior=torch.tensor([[2, 2]]),
        time_bucket=torch.zeros(1, 2, dtype=torch.long),
        padding_mask=torch.ones(1, 2, dtype=torch.bool),
        query_time_bucket=torch.zeros(1, 2, dtype=torch.long),
        target_item=torch.tensor([2]),
        target_behavior=torch.tensor([2]),
        user_index=torch.tensor([0]),
    )
    found = evaluate(
        Recommends(NUM_RESERVED + 4, listed),
        [batch],
        device=torch.device("cpu"),
        split="test",
        item_map=item_map,
    )
    coverage = (found["coverage_at_1"], found["coverage_at_2"])
    assert coverage == pytest.approx(expected)  # of the data's 3 items
