"""``pipelines.evaluate other_data=true``'s item map and its refusals, on small vocabularies
(the pipeline runs are in tests/integration/test_pipelines.py)."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

from recsys.data.vocab import Vocab
from recsys.schema import NUM_RESERVED, UNK_IDX
from recsys.tasks.evaluate import _other_data_items


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
