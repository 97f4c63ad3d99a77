from pathlib import Path

import polars as pl
import pytest
import torch

from recsys.checkpoint import LoadedModel
from recsys.data.dataset import SequenceStore, TargetRows
from recsys.data.pipeline import PrepareSettings, load_events, prepare_dataset, scoring_sequences
from recsys.data.synthetic import generate_events
from recsys.data.vocab import Vocab
from recsys.model.atrank import ATRank
from recsys.retrieval.ranker import two_stage
from recsys.schema import EventSchema


@pytest.fixture(scope="module")
def scoring_setup(tmp_path_factory):
    events = generate_events(num_users=60, num_items=80, num_categories=6, seed=3)
    folder = tmp_path_factory.mktemp("prep") / "p"
    stats = prepare_dataset(
        events, schema=EventSchema(), settings=PrepareSettings(), out_dir=folder
    )
    vocab = Vocab.load(folder)
    torch.manual_seed(0)
    encoder = ATRank(
        num_items=vocab.num_items,
        num_attributes=vocab.num_attributes,
        item_attribute_width=vocab.attribute_width,
        num_behaviors=vocab.num_behaviors,
        num_time_buckets=17,
        max_seq_len=12,
        d_model=16,
        num_layers=1,
    ).eval()
    encoder.set_item_attributes(torch.tensor(vocab.item_attribute_table(), dtype=torch.long))
    from recsys.data.sequences import TimeBuckets

    model = LoadedModel(
        encoder=encoder,
        vocab=vocab,
        schema=EventSchema(),
        time_buckets=TimeBuckets(),
        max_seq_len=12,
        path=Path("unused"),
    )
    checked = load_events(events, EventSchema())
    store = SequenceStore.from_frame(scoring_sequences(checked, vocab=vocab))
    return model, store, checked, stats


def test_two_stage_reorders_only_the_head_and_respects_exclusion(scoring_setup):
    model, store, _, _ = scoring_setup
    rows = TargetRows(
        store,
        store.lengths,
        max_seq_len=12,
        time_buckets=model.time_buckets,
        has_target=False,
        query_time=int(store.timestamp.max()),
    )
    batch = rows[list(range(8))]
    with torch.no_grad():
        output = model.encoder(*batch.model_inputs())
        retrieval = model.encoder.score_items(output.query)
        ranking = two_stage(model.encoder, output, top_k=15, rerank_top_n=10, exclude=batch.item)
    top15 = retrieval.scatter(1, batch.item, -torch.inf).topk(15).indices
    # the first 10 are the same set as retrieval's first 10, the rest in retrieval order
    assert torch.equal(ranking.items[:, :10].sort().values, top15[:, :10].sort().values)
    assert torch.equal(ranking.items[:, 10:], top15[:, 10:])
    assert ranking.reranked[:, :10].all() and not ranking.reranked[:, 10:].any()
    for row in range(8):
        assert not set(ranking.items[row].tolist()) & set(batch.item[row].tolist())


def test_as_of_limits_history(scoring_setup):
    model, _, events, _ = scoring_setup
    cut = events["timestamp"].sort()[events.height // 2]
    early = scoring_sequences(events, vocab=model.vocab, as_of=cut)
    n_events = early["timestamp"].list.len().sum()
    assert n_events == events.filter(pl.col("timestamp") <= cut).height
    assert early["timestamp"].explode().max() <= int(cut.timestamp())
