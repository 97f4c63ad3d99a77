from pathlib import Path

import numpy as np
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
from recsys.retrieval.recommend import recommend, write_atomically
from recsys.schema import ITEM, USER, EventSchema


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


def test_seen_items_are_never_returned(scoring_setup):
    model, _, events, _ = scoring_setup
    frame = recommend(
        model,
        SequenceStore.from_frame(scoring_sequences(events, vocab=model.vocab)),
        top_k=20,
        rerank_top_n=30,
        exclude_seen=True,
    )
    seen = events.select(USER, ITEM).unique()
    overlap = frame.join(seen, on=[USER, ITEM], how="inner")
    assert overlap.height == 0
    # and the exclusion is real: without it, seen items do come back for this model
    unfiltered = recommend(
        model,
        SequenceStore.from_frame(scoring_sequences(events, vocab=model.vocab)),
        top_k=20,
        rerank_top_n=30,
        exclude_seen=False,
    )
    assert unfiltered.join(seen, on=[USER, ITEM], how="inner").height > 0


def test_output_shape_ids_and_ranks(scoring_setup):
    model, store, events, _ = scoring_setup
    frame = recommend(model, store, top_k=5, rerank_top_n=10, exclude_seen=False)
    assert frame.columns == [USER, "rank", ITEM, "score"]
    assert frame.height == store.num_users * 5
    assert set(frame[ITEM].to_list()) <= set(model.vocab.items[ITEM].to_list())
    assert set(frame[USER].to_list()) == set(events[USER].to_list())
    per_user = frame.group_by(USER).agg(pl.col("rank"), pl.col(ITEM).n_unique().alias("n"))
    assert all(r == [1, 2, 3, 4, 5] for r in per_user["rank"].to_list())
    assert (per_user["n"] == 5).all()


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


def test_top_k_larger_than_catalogue_is_refused(scoring_setup):
    model, store, _, _ = scoring_setup
    with pytest.raises(ValueError, match="exceeds the catalogue"):
        recommend(model, store, top_k=10_000, rerank_top_n=0, exclude_seen=False)


@pytest.mark.parametrize("file_format", ["parquet", "csv"])
def test_write_atomically(tmp_path, file_format):
    frame = pl.DataFrame({USER: [1, 1], "rank": [1, 2], ITEM: [7, 9], "score": [0.5, 0.25]})
    path = write_atomically(frame, tmp_path / f"recs.{file_format}", file_format=file_format)
    read = pl.read_parquet(path) if file_format == "parquet" else pl.read_csv(path)
    assert read.equals(frame)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_write_atomically_failure_leaves_nothing(tmp_path):
    bad = pl.DataFrame({"x": [object()]}, schema={"x": pl.Object})
    with pytest.raises(Exception):  # noqa: B017 - polars cannot write Object columns
        write_atomically(bad, tmp_path / "recs.parquet", file_format="parquet")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="use one of"):
        write_atomically(bad, tmp_path / "recs.json", file_format="json")


def test_seen_items_matrix():
    from recsys.retrieval.recommend import seen_items

    frame = pl.DataFrame(
        {
            USER: [1, 2],
            "item": [[3, 4, 5], [6]],
            "behavior": [[2, 2, 2], [2]],
            "timestamp": [[1, 2, 3], [4]],
            "train_end": [3, 1],
            "val_target": [-1, -1],
            "test_start": [3, 1],
            "test_target": [-1, -1],
        },
        schema_overrides={
            "item": pl.List(pl.Int32),
            "behavior": pl.List(pl.Int8),
            "train_end": pl.Int32,
            "val_target": pl.Int32,
            "test_start": pl.Int32,
            "test_target": pl.Int32,
        },
    )
    store = SequenceStore.from_frame(frame)
    assert seen_items(store, np.array([1, 0])).tolist() == [[6, 0, 0], [3, 4, 5]]
