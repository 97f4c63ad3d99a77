"""The first-order transition baseline and prior against hand-counted transitions (and the
prior on top of an index against the whole catalogue), and the popularity baseline."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from recsys.model.outputs import EncoderOutput
from recsys.model.popularity import Popularity
from recsys.model.transition import Transition, TransitionCounts, TransitionPrior
from recsys.retrieval.ranker import with_prior

# users back to back: u0 = [2 3 4 | 2 3] (3 training events), u1 = [2 3 5], u2 = [4]
ITEM = np.array([2, 3, 4, 2, 3, 2, 3, 5, 4])
OFFSETS = np.array([0, 5, 8, 9])
TRAIN_END = np.array([3, 3, 1])
TRAIN_COUNTS = np.array([0, 0, 2, 2, 2, 1])  # PAD, UNK, items 2..5 in training


def model() -> Transition:
    counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, len(TRAIN_COUNTS))
    return Transition(counts, torch.as_tensor(TRAIN_COUNTS))


def test_counts_only_pairs_inside_training() -> None:
    m = model()
    pairs = {
        (row, int(m.next_item[i]), float(m.count[i]))
        for row in range(6)
        for i in range(int(m.row_start[row]), int(m.row_start[row + 1]))
    }
    # u0's 4 -> 2 and 2 -> 3 reach into validation/test events; u2 has no pair
    assert pairs == {(2, 3, 2.0), (3, 4, 1.0), (3, 5, 1.0)}


def test_scores_follow_the_last_item_with_popularity_tie_break() -> None:
    m = model()
    history = torch.tensor([[0, 2, 3], [0, 0, 5]])  # left-padded; last items 3 and 5
    scores = m.score_items(m(history, None, None, history > 0).query)
    third = 1 / 3  # popularity / (max popularity 2 + 1)
    expected = torch.tensor(
        [
            [-math.inf, -math.inf, 2 * third, 2 * third, 1 + 2 * third, 1 + third],
            [-math.inf, -math.inf, 2 * third, 2 * third, 2 * third, third],  # 5 has no successor
        ]
    )
    torch.testing.assert_close(scores, expected.float())


def test_popularity_ranks_every_user_by_training_count_and_never_pad_or_unk() -> None:
    m = Popularity(torch.as_tensor(TRAIN_COUNTS) * torch.tensor([9, 9, 1, 3, 2, 1]))
    history = torch.tensor([[0, 2, 3], [0, 0, 5]])
    scores = m.score_items(m(history, None, None, history > 0).query)
    assert scores.shape == (2, 6)
    assert torch.equal(scores[0], scores[1])  # the same list for everyone
    assert torch.isneginf(scores[:, :2]).all()  # PAD and UNK, whatever their counts
    assert scores[0].argsort(descending=True)[:4].tolist() == [3, 4, 2, 5]  # counts 6, 4, 2, 1


def test_counts_round_trip_and_the_prior_reads_no_unknown_items_row() -> None:
    # u0 = [2 1 3 3]: UNK (1) counts as an item, as in the baseline; the prior skips its row
    counts = TransitionCounts.from_sequences(
        np.array([2, 1, 3, 3]), np.array([0, 4]), np.array([4]), 4
    )
    assert counts.row_start.tolist() == [0, 0, 1, 2, 3]
    assert counts.next_item.tolist() == [3, 1, 3] and counts.count.tolist() == [1, 1, 1]
    again = TransitionCounts.from_plain(counts.to_plain())
    pairs = zip(again.to_plain().values(), counts.to_plain().values())
    assert all(torch.equal(a, b) for a, b in pairs)
    added = TransitionPrior(counts, 1.0).add_to(torch.zeros(3, 4), torch.tensor([[1], [0], [2]]))
    assert added[:2].eq(0).all() and added[2, 1] == math.log(2)


def test_counts_that_are_no_csr_matrix_are_refused() -> None:
    with pytest.raises(ValueError, match="not a CSR matrix"):
        TransitionCounts(torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([1]))


def prior(weight: float = 1.0) -> TransitionPrior:
    return TransitionPrior(TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6), weight)


def test_prior_adds_weighted_log_counts_of_the_last_items_successors() -> None:
    """2 -> 3 twice; 3 -> 4 and 3 -> 5 once; nothing follows 5 (the class docstring's example)."""
    scores = torch.arange(18, dtype=torch.float32).reshape(3, 6)
    added = prior(2.0).add_to(scores, torch.tensor([[2], [3], [5]]))
    expected = scores.clone()
    expected[0, 3] += 2 * math.log(3)
    expected[1, 4] += 2 * math.log(2)
    expected[1, 5] += 2 * math.log(2)
    torch.testing.assert_close(added, expected)
    assert prior(0.0).add_to(scores, torch.tensor([[2], [3], [5]])) is scores


def test_prior_candidates_are_the_items_add_to_raises() -> None:
    last = torch.tensor([[2], [3], [5], [0]])
    items, terms = prior(0.5).candidates(last)
    dense = prior(0.5).add_to(torch.zeros(4, 6), last)
    rebuilt = torch.zeros(4, 6).scatter_add(1, items, terms)  # padding: PAD gains 0
    torch.testing.assert_close(rebuilt, dense)
    assert items.tolist() == [[3, 0], [4, 5], [0, 0], [0, 0]]


def test_a_window_counts_every_pair_up_to_that_many_events_apart_inside_training() -> None:
    """u0 = [2 3 4 | 2 3], u1 = [2 3 5]: window 2 adds u0's 2 -> 4 and u1's 2 -> 5 (4 -> 3
    and 3 -> 2 reach into u0's held-out events); window 9 adds nothing more."""
    counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=2)
    pairs = {
        (row, int(counts.next_item[i]), int(counts.count[i]))
        for row in range(6)
        for i in range(int(counts.row_start[row]), int(counts.row_start[row + 1]))
    }
    assert pairs == {(2, 3, 2), (2, 4, 1), (2, 5, 1), (3, 4, 1), (3, 5, 1)}
    assert counts.window == 2
    wide = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=9)
    assert torch.equal(wide.count, counts.count) and torch.equal(wide.next_item, counts.next_item)
    again = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=1)
    assert torch.equal(again.count, model().count.long())  # window 1: the baseline's counts


def test_the_prior_sums_decayed_terms_over_the_recent_items() -> None:
    """Window 2, recent 2, decay 0.5 (the class docstring's second example, on this log):
    history [.. 3 2]: 2 is followed by 3 twice, 4 and 5 once; 3 (one back) by 4 and 5 once."""
    counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=2)
    p = TransitionPrior(counts, 2.0, recent=2, decay=0.5)
    history = torch.tensor([[4, 3, 2], [0, 0, 2], [0, 3, 1]])  # row 2's last item is UNK
    added = p.add_to(torch.zeros(3, 6), history)
    log2, log3 = math.log(2), math.log(3)
    expected = torch.zeros(3, 6)
    expected[0, 3:] = torch.tensor([2 * log3, 2 * log2 + 1 * log2, 2 * log2 + 1 * log2])
    expected[1, 3:] = torch.tensor([2 * log3, 2 * log2, 2 * log2])  # PAD one back adds nothing
    expected[2, 4:] = torch.tensor([1 * log2, 1 * log2])  # UNK's row is not read
    torch.testing.assert_close(added, expected)
    items, terms = p.candidates(history)  # each item once, its terms summed
    assert items.tolist() == [[3, 4, 5], [3, 4, 5], [4, 5, 0]]
    torch.testing.assert_close(torch.zeros(3, 6).scatter_add(1, items, terms), expected)


def test_a_prior_saved_before_window_recent_and_decay_reads_as_first_order() -> None:
    counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6)
    old = {"weight": 0.5, **counts.to_plain()}  # what checkpoints and exports held
    p = TransitionPrior.from_plain(old)
    assert p.settings() == {"weight": 0.5, "window": 1, "recent": 1, "decay": 1.0}
    shaped = TransitionPrior(
        TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=3), 1.5, 4, 0.25
    )
    again = TransitionPrior.from_plain(shaped.to_plain())
    assert again.settings() == {"weight": 1.5, "window": 3, "recent": 4, "decay": 0.25}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window": 0}, "training.transition_window=0 must be a whole number >= 1"),
        ({"window": 2.0}, "training.transition_window=2.0 must be"),
        ({"recent": 0}, "training.transition_recent=0 must be a whole number >= 1"),
        ({"recent": True}, "training.transition_recent=True must be"),
        ({"decay": 0}, "training.transition_decay=0 must be a number in (0, 1]"),
        ({"decay": 1.5}, "training.transition_decay=1.5 must be"),
        ({"decay": "half"}, "training.transition_decay='half' must be"),
    ],
)
def test_absurd_prior_shapes_are_refused_naming_the_option(settings, message) -> None:
    from recsys.model.transition import check_prior_settings

    with pytest.raises(ValueError, match=re.escape(message)):
        check_prior_settings(**{"window": 1, "recent": 1, "decay": 1.0, **settings})
    with pytest.raises(ValueError, match=re.escape(message)):
        window = settings.get("window", 1)
        counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, window=window)
        TransitionPrior(counts, 1.0, settings.get("recent", 1), settings.get("decay", 1.0))


@pytest.mark.parametrize("weight", [-1.0, math.nan, math.inf, True, "1"])
def test_prior_weights_that_are_no_number_at_or_above_zero_are_refused(weight) -> None:
    with pytest.raises(ValueError, match="must be a number >= 0"):
        prior(weight)


class Keys(torch.nn.Module):
    """Scores query @ keys.T; PAD and UNK -inf (the encoder interface's two scoring calls)."""

    def __init__(self, keys: torch.Tensor):
        super().__init__()
        self.keys = keys

    def score_items(self, query):
        scores = query @ self.keys.T
        scores[:, :2] = -math.inf
        return scores

    def score_candidates(self, query, items):
        return self.score_items(query).gather(1, items)


def test_with_prior_on_an_index_top_k_is_the_exact_top_k_of_the_sum() -> None:
    """The model's top 2 plus the successors of the last item, under a blocked item and each
    row's excluded items, rank as the whole catalogue's scores plus the prior would."""
    generator = torch.Generator().manual_seed(0)
    model = Keys(torch.randn(6, 4, generator=generator))
    query = torch.randn(3, 4, generator=generator)
    output = EncoderOutput(hidden=query[:, None], query=query, padding_mask=None)
    blocked = torch.tensor([False, False, False, False, False, True])  # item 5
    exclude = torch.tensor([[2, 0], [4, 0], [3, 2]])
    last = torch.tensor([[2], [3], [3]])
    dense = model.score_items(query)
    dense[:, 5] = -math.inf
    dense = dense.scatter(1, exclude, -math.inf)
    dense[:, :2] = -math.inf
    index_scores, index_items = dense.topk(2, dim=1)
    p = prior(3.0)
    scores, items = with_prior(
        model, output, p, last, index_items, index_scores, blocked=blocked, exclude=exclude
    )
    expected_scores, expected_items = p.add_to(dense, last).topk(2, dim=1)
    torch.testing.assert_close(scores, expected_scores)
    finite = scores.isfinite()  # row 3 has one admissible item: its second entry is -inf
    assert torch.equal(items[finite], expected_items[finite]) and finite.sum() == 5
    assert not torch.equal(items[finite], index_items[finite])  # the prior changed the order


def test_a_checkpoint_without_a_prior_cannot_be_given_a_weight(tmp_path) -> None:
    from recsys.checkpoint import set_transition_prior_weight

    path = tmp_path / "model.ckpt"
    torch.save({"recsys": {}, "state_dict": {}}, path)
    with pytest.raises(ValueError, match="has no transition prior to weight"):
        set_transition_prior_weight(path, 1.0)


def test_a_prior_weight_written_onto_a_full_disk_leaves_the_checkpoint_whole(
    tmp_path, monkeypatch
) -> None:
    """training.transition_prior=auto rewrites best.ckpt with the chosen weight. On a full
    disk torch fails with "[enforce fail at inline_container.cc] unexpected pos ...", and the
    rewrite left a cut .best.ckpt.partial beside the checkpoint; now the error names the file
    and the full disk, and nothing is left but the checkpoint as it was."""
    import errno
    from pathlib import Path

    from recsys.checkpoint import set_transition_prior_weight

    path = tmp_path / "best.ckpt"
    torch.save({"recsys": {"transition_prior": {"weight": 0.0}}, "state_dict": {}}, path)
    before = path.read_bytes()
    save = torch.save

    def cut_short(obj, target):  # half the file reaches the disk, then the disk is full
        if isinstance(target, (str, Path)):
            Path(target).write_bytes(before[: len(before) // 2])
        else:
            target.write(before[: len(before) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", cut_short)
    with pytest.raises(OSError, match=r"no space left on the device of .* best\.ckpt") as info:
        set_transition_prior_weight(path, 1.0)
    assert info.value.errno == errno.ENOSPC and str(tmp_path) in str(info.value)
    monkeypatch.setattr(torch, "save", save)
    assert [p.name for p in tmp_path.iterdir()] == ["best.ckpt"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("seed", range(20))
def test_with_prior_is_exact_on_random_catalogues_rules_and_depths(seed) -> None:
    """Random transitions, prior shapes (window, recent items, decay), blocked items,
    exclusions and index depths against the whole catalogue's scores plus the prior."""
    generator = torch.Generator().manual_seed(seed)
    num_items, rows = 14, 5
    sequence = torch.randint(1, num_items, (80,), generator=generator).numpy()  # UNK included
    window, recent = (int(v) for v in torch.randint(1, 4, (2,), generator=generator))
    counts = TransitionCounts.from_sequences(
        sequence, np.array([0, 40, 80]), np.array([40, 40]), num_items, window
    )
    decay = float(torch.rand(1, generator=generator)) * 0.9 + 0.1
    p = TransitionPrior(counts, float(torch.rand(1, generator=generator)) * 4, recent, decay)
    model = Keys(torch.randn(num_items, 3, generator=generator))
    query = torch.randn(rows, 3, generator=generator)
    output = EncoderOutput(hidden=query[:, None], query=query, padding_mask=None)
    blocked = torch.rand(num_items, generator=generator) < 0.2
    exclude = torch.randint(0, num_items, (rows, 3), generator=generator)
    last = torch.randint(0, num_items, (rows, 4), generator=generator)  # PAD and UNK too
    depth = int(torch.randint(1, 6, (1,), generator=generator))
    dense = model.score_items(query).masked_fill(blocked, -math.inf)
    dense = dense.scatter(1, exclude, -math.inf)
    dense[:, :2] = -math.inf
    index_scores, index_items = dense.topk(depth, dim=1)
    scores, items = with_prior(
        model, output, p, last, index_items, index_scores, blocked=blocked, exclude=exclude
    )
    expected_scores, expected_items = p.add_to(dense, last).topk(depth, dim=1)
    torch.testing.assert_close(scores, expected_scores)
    finite = scores.isfinite()
    assert torch.equal(items[finite], expected_items[finite])


def pairs_of(counts: TransitionCounts) -> set[tuple[int, int, float]]:
    return {
        (row, int(counts.next_item[i]), float(counts.count[i]))
        for row in range(counts.num_items)
        for i in range(int(counts.row_start[row]), int(counts.row_start[row + 1]))
    }


def test_pairs_end_only_in_the_events_given_as_ends() -> None:
    """``ends``: the events a pair may end in (the evaluated behaviours' events); every event
    still starts pairs. Here only items 3 and 5's events may end one."""
    ends = np.isin(ITEM, [3, 5])
    counts = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6, ends=ends)
    assert pairs_of(counts) == {(2, 3, 2.0), (3, 5, 1.0)}  # u0's and u1's 3 -> 4 gone


def test_baselines_count_the_evaluated_behaviours_events() -> None:
    """With data.split.target_behaviors=[purchase] popularity counted every training event,
    so the next purchase was predicted by the most viewed items (an audit's finding: on a
    Taobao-format log popularity fitted on purchases gave test NDCG@10 0.0732 against 0.0576).
    Now an item counts its training purchases, and a pair only when it ends in one."""
    from types import SimpleNamespace

    import polars as pl

    from recsys.data.dataset import SequenceStore
    from recsys.tasks.evaluate import baseline_counts

    view, purchase = 2, 3  # behaviour codes: NUM_RESERVED + index in the vocabulary
    behavior = np.array([view, purchase, view, view, purchase, view, purchase, view, purchase])
    users = len(OFFSETS) - 1
    store = SequenceStore(
        user_id=pl.Series(range(users)),
        offsets=OFFSETS,
        item=ITEM,
        behavior=behavior,
        timestamp=np.arange(len(ITEM)),
        train_end=TRAIN_END,
        val_target=np.full(users, -1),
        test_target=np.full(users, -1),
    )
    vocab = SimpleNamespace(
        behaviors=("view", "purchase"),
        num_items=6,
        item_train_counts=lambda: TRAIN_COUNTS.tolist(),
    )
    every = TransitionCounts.from_sequences(ITEM, OFFSETS, TRAIN_END, 6)

    def module(targets):
        stats = {"split": {"target_behaviors": targets}}
        return SimpleNamespace(store=store, vocab=vocab, stats=stats)

    counts, pairs = baseline_counts(module(None), every)
    assert counts == TRAIN_COUNTS.tolist() and pairs is every  # every behaviour: as before
    counts, pairs = baseline_counts(module(["purchase"]), every)
    # training events: u0 2v 3p 4v, u1 2v 3p 5v, u2 4p -> purchases of item 3 twice and 4 once
    assert counts == [0, 0, 0, 2, 1, 0]
    assert pairs_of(pairs) == {(2, 3, 2.0)}  # 2 -> 3 ends in a purchase twice; 3 -> 4, 3 -> 5 not
