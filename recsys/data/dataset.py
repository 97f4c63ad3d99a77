"""Datasets that turn a prepared sequence table into :class:`SeqBatch` es without Python work per
sample: the table is held as flat NumPy arrays plus offsets, and a batch is one vectorised gather.

The loaders hand a whole list of indices to ``__getitem__`` (``DataLoader(batch_size=None,
sampler=BatchSampler(...))``), so collation is the gather itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from recsys.data.batch import SeqBatch
from recsys.data.io import whole_number_ids
from recsys.data.sequences import BEHAVIORS, ITEMS, TIMES, TimeBuckets
from recsys.data.split import TEST_TARGET, TRAIN_END, VAL_TARGET
from recsys.data.vocab import damaged, unreadable_parquet
from recsys.schema import USER


def _flat_list(column: pa.ChunkedArray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    array = column.combine_chunks()
    lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return array.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False), offsets


@dataclass
class SequenceStore:
    """All users' histories as flat arrays: user ``u``'s events are ``offsets[u]:offsets[u+1]``."""

    user_id: pl.Series
    offsets: np.ndarray  # (U+1,) int64
    item: np.ndarray  # (N,) int64
    behavior: np.ndarray  # (N,) int64
    timestamp: np.ndarray  # (N,) int64 Unix seconds
    train_end: np.ndarray  # (U,) int64, positions
    val_target: np.ndarray  # (U,) int64, -1 = none
    test_target: np.ndarray  # (U,) int64, -1 = none

    @classmethod
    def from_table(cls, table: pa.Table) -> SequenceStore:
        item, offsets = _flat_list(table[ITEMS], np.int64)
        behavior, _ = _flat_list(table[BEHAVIORS], np.int64)
        timestamp, _ = _flat_list(table[TIMES], np.int64)

        def scalar(name: str) -> np.ndarray:
            return table[name].to_numpy().astype(np.int64)

        # ids as preparation reads them now, as the folder's vocabulary reads back: whole-number
        # float ids of a folder prepared before that rule (10.0) as Int64
        users = whole_number_ids(pl.from_arrow(table.select([USER])).lazy(), [USER]).collect()

        return cls(
            user_id=users[USER],
            offsets=offsets,
            item=item,
            behavior=behavior,
            timestamp=timestamp,
            train_end=scalar(TRAIN_END),
            val_target=scalar(VAL_TARGET),
            test_target=scalar(TEST_TARGET),
        )

    @classmethod
    def from_parquet(cls, path: str | Path) -> SequenceStore:
        """The store of a prepared ``sequences.parquet``. Arrow's memory pool (mimalloc or
        jemalloc) keeps the memory the Parquet reader decoded into after the table is freed,
        for Arrow's own reuse, which training and evaluation (NumPy, torch) never make: it is
        handed back once the flat arrays are built (on a 10 M-event log 0.29 GiB of the
        0.55 GiB the store held resident). A file cut short or replaced is named with the fix
        (:func:`recsys.data.vocab.damaged`)."""
        path = Path(path)
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as err:  # cut short, another file, or missing
            raise damaged(path, unreadable_parquet(err)) from err
        absent = [
            c
            for c in (USER, ITEMS, BEHAVIORS, TIMES, TRAIN_END, VAL_TARGET, TEST_TARGET)
            if c not in table.schema.names
        ]
        if absent:
            raise damaged(path, f"lacks the column(s) {absent} of a prepared sequences file")
        store = cls.from_table(table)
        pa.default_memory_pool().release_unused()
        return store

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> SequenceStore:
        return cls.from_table(frame.to_arrow())

    @property
    def num_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def train_lengths(self) -> np.ndarray:
        """(U,) each user's training events (those before ``train_end``)."""
        return np.minimum(self.train_end, self.lengths)

    def positions(self) -> np.ndarray:
        """(N,) each event's 0-based position in its user's history."""
        return _rows_and_ranks(self.lengths)[1]

    def training_mask(self) -> np.ndarray:
        """(N,) whether each event is one of its user's training events (before ``train_end``)."""
        return self.positions() < np.repeat(self.train_end, self.lengths)

    def history(
        self,
        values: np.ndarray,
        rows: np.ndarray,
        end: np.ndarray | None = None,
        keep: np.ndarray | None = None,
    ) -> torch.Tensor:
        """``values`` (flat, e.g. :attr:`item`) of each row's events from its user's first up to
        the flat index ``end`` (exclusive; default: the whole history) as a (B, L_max) long
        tensor, left-aligned, PAD (0) where there is none or ``keep`` (flat bool) is False."""
        first = self.offsets[rows]
        lengths = (self.offsets[rows + 1] if end is None else end) - first
        width = max(int(lengths.max(initial=1)), 1)
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        index = np.where(inside, first[:, None] + columns[None, :], 0)
        if keep is not None:
            inside &= keep[index]
        return torch.from_numpy(np.where(inside, values[index], 0).astype(np.int64))

    def gather(
        self,
        rows: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        *,
        max_seq_len: int,
        time_buckets: TimeBuckets,
        targets: str | np.ndarray,
        query_time: np.ndarray | None = None,
        width_multiple: int = 1,
    ) -> SeqBatch:
        """Left-padded batch of the flat events ``start[b]:end[b]`` (at most ``max_seq_len``), as
        wide as its longest row, rounded up to a multiple of ``width_multiple`` (at most
        ``max_seq_len``): fewer distinct widths, for a GPU (see ``data.loader``).

        ``targets="next"`` makes every position's target the following event (training);
        an array of flat indices (-1 = none) gives one target per row (evaluation/scoring).
        Token time buckets follow ``time_buckets.reference`` (see :class:`TimeBuckets`).
        ``query_time_bucket`` holds, at every position, the gap to the next event — the moment
        that position's prediction is for. At the last position of a row with one target that
        is the target's time; rows without a target use ``query_time`` (Unix seconds per row,
        e.g. ``as_of``) or leave it unknown (0).
        """
        length = end - start  # (B,)
        # trimmed to the batch's longest window: padding columns cost attention and FFN time,
        # and positions count back from the most recent event, so a narrower batch means the same
        longest = max(1, int(length.max(initial=1)))
        width = min(max_seq_len, -(-longest // width_multiple) * width_multiple)
        columns = np.arange(width)
        pad = width - length
        mask = columns[None, :] >= pad[:, None]  # (B, T) True = real
        index = np.where(mask, start[:, None] + columns[None, :] - pad[:, None], 0)  # (B, T)
        first = self.offsets[rows]  # flat index of each user's first event
        gap = np.where(
            index > first[:, None],
            self.timestamp[index] - self.timestamp[np.maximum(index - 1, 0)],
            0,
        )
        if isinstance(targets, str):
            target_index = np.where(mask, index + 1, 0)
            has_target = mask
            query_mask = mask
            query_gap = self.timestamp[target_index] - self.timestamp[index]  # (B, T)
            moment = self.timestamp[target_index[:, -1]]  # the last position's target
        else:
            target_index = np.maximum(targets, 0)
            has_target = targets >= 0
            moment = np.where(
                has_target,
                self.timestamp[target_index],
                -1 if query_time is None else query_time,
            )
            # As in training, each history position is told the time of the event after it; the
            # last position, which makes the prediction, is told ``moment``.
            next_time = self.timestamp[np.minimum(index + 1, len(self.timestamp) - 1)]
            next_time[:, -1] = moment
            query_mask = mask.copy()
            query_mask[:, -1] &= moment >= 0
            query_gap = next_time - self.timestamp[index]  # (B, T)
            moment = np.where(moment >= 0, moment, self.timestamp[index[:, -1]])
        if time_buckets.reference == "target":  # ATRank: every token's gap to the prediction
            gap = moment[:, None] - self.timestamp[index]

        def tensor(values: np.ndarray, where: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.where(where, values, 0).astype(np.int64))

        return SeqBatch(
            item=tensor(self.item[index], mask),
            behavior=tensor(self.behavior[index], mask),
            time_bucket=tensor(time_buckets(gap), mask),
            padding_mask=torch.from_numpy(mask),
            query_time_bucket=tensor(time_buckets(query_gap), query_mask),
            target_item=tensor(self.item[target_index], has_target),
            target_behavior=tensor(self.behavior[target_index], has_target),
            user_index=torch.from_numpy(rows.astype(np.int64)),
        )


GPU_WIDTH_MULTIPLE = 32


def width_multiple(setting: int | str, device: torch.device | str) -> int:
    """``data.loader.width_multiple`` for batches bound for ``device``: a number as it is;
    ``auto``: multiples of :data:`GPU_WIDTH_MULTIPLE` on a CUDA device, where every new batch
    shape costs a few hundred milliseconds the first time it is seen (benchmarks/README.md,
    "Batch widths on a GPU"), and 1 (as narrow as the longest row) on a CPU, where padding
    columns only cost time."""
    if setting != "auto":
        return int(setting)
    return GPU_WIDTH_MULTIPLE if torch.device(device).type == "cuda" else 1


class _BatchDataset(Dataset):
    """Indexed by a *list* of row numbers; returns one :class:`SeqBatch`."""

    def __init__(
        self,
        store: SequenceStore,
        *,
        max_seq_len: int,
        time_buckets: TimeBuckets,
        width_multiple: int = 1,
    ):
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len={max_seq_len} must be >= 1")
        if width_multiple < 1:
            raise ValueError(f"width_multiple={width_multiple} must be >= 1")
        self.store = store
        self.max_seq_len = max_seq_len
        self.time_buckets = time_buckets
        self.width_multiple = width_multiple

    def _gather(self, rows, start, end, **targets) -> SeqBatch:
        return self.store.gather(
            rows,
            start,
            end,
            max_seq_len=self.max_seq_len,
            time_buckets=self.time_buckets,
            width_multiple=self.width_multiple,
            **targets,
        )


def _rows_and_ranks(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``counts[u]`` samples per user -> each sample's user and its rank 0..counts[u]-1 among
    its user's samples. Example: counts [2, 0, 3] -> users [0 0 2 2 2], ranks [0 1 0 1 2]."""
    rows = np.repeat(np.arange(len(counts)), counts)
    return rows, np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)


class TrainWindows(_BatchDataset):
    """Training windows over every user's training events, all positions trained at once.

    A history of ``n`` training events becomes windows of at most ``max_seq_len + 1`` events,
    cut from the most recent end with stride ``max_seq_len``, so every training event from the
    second on is a target exactly once. Example (max_seq_len=3, events e0..e6):
    windows [e3 e4 e5 e6] and [e0 e1 e2 e3] -> inputs [e3 e4 e5] / [e0 e1 e2].
    """

    def __init__(self, store: SequenceStore, *, max_seq_len: int, **settings):
        super().__init__(store, max_seq_len=max_seq_len, **settings)
        n = store.train_lengths
        windows = np.where(n >= 2, np.ceil((n - 1) / max_seq_len), 0).astype(np.int64)
        self.rows, k = _rows_and_ranks(windows)  # k = 0 is the most recent window of its user
        local_end = n[self.rows] - k * max_seq_len
        local_start = np.maximum(local_end - max_seq_len - 1, 0)
        base = store.offsets[self.rows]
        self.start, self.end = base + local_start, base + local_end

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def input_lengths(self) -> np.ndarray:
        """Events in each window's input (the window without its last event)."""
        return self.end - 1 - self.start

    @property
    def target_span(self) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices ``[first, stop)`` of each window's targets (every event of the window
        but its first)."""
        return self.start + 1, self.end

    def __getitem__(self, indices: list[int]) -> SeqBatch:
        i = np.asarray(indices)
        # inputs are window[:-1]; each input position's target is the next event
        return self._gather(self.rows[i], self.start[i], self.end[i] - 1, targets="next")


class TrainPrefixes(_BatchDataset):
    """One training row per training target: the ``max_seq_len`` events before it, only the
    last position trained (the S3-Rec family's trainers: every prefix is a sample).

    The targets are :class:`TrainWindows`' (every training event from the second on, once per
    epoch), but each is predicted from its own window, so a non-causal encoder, which
    :class:`TrainWindows` can train at one position per window only, learns from every target,
    and a model whose last position sees the whole window (BSARec's filter, ATRank's reference
    attention) is trained the way it is evaluated. It costs more: a user with ``n`` training
    events is encoded ``n - 1`` times. Batches are :class:`SeqBatch` training batches whose
    ``target_item`` is 0 (none) everywhere but the last position. Example (events e0..e3):
    rows [e0] -> e1, [e0 e1] -> e2, [e0 e1 e2] -> e3.

    With ``partners`` a batch of B rows has 2B: rows ``B + i`` are row ``i``'s *partner*, another
    training row with the same target item drawn at random on every call (the row itself
    when no other row has that target; DuoRec's supervised positive), cut to its most recent
    events as many as the batch's longest row, so that the batch stays as wide as it would be
    without partners (rows of similar length are batched together; a partner can be of any
    length). Partner rows have no target (0), so only the first B rows are trained; a
    contrastive loss pairs the halves.
    """

    def __init__(
        self,
        store: SequenceStore,
        *,
        max_seq_len: int,
        partners: bool = False,
        **settings,
    ):
        super().__init__(store, max_seq_len=max_seq_len, **settings)
        targets = np.maximum(store.train_lengths - 1, 0)  # events 1 .. n-1 of each user
        self.rows, rank = _rows_and_ranks(targets)
        local = rank + 1  # local position of each target: 1, 2, ..., n-1 within its user
        base = store.offsets[self.rows]
        self.end = base + local  # the target's flat index: the input ends just before it
        self.start = base + np.maximum(local - max_seq_len, 0)
        self.partners = bool(partners)
        if self.partners:
            # rows sorted by target item: each row's group of same-target rows is a slice
            self._by_target = np.argsort(store.item[self.end], kind="stable")
            self._place = np.empty_like(self._by_target)
            self._place[self._by_target] = np.arange(len(self._by_target))
            _, group_start, group_size = np.unique(
                store.item[self.end][self._by_target], return_index=True, return_counts=True
            )
            self._group_start = np.repeat(group_start, group_size)  # per sorted place
            self._group_size = np.repeat(group_size, group_size)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def input_lengths(self) -> np.ndarray:
        return self.end - self.start

    @property
    def target_span(self) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices ``[first, stop)`` of each row's target: the one event after its input
        (a partner row, added per batch, has none)."""
        return self.end, self.end + 1

    def partner_of(self, indices: np.ndarray) -> np.ndarray:
        """A random other row with the same target item for each row (itself if none): a
        uniform draw among the other rows of its group, from torch's random stream."""
        place = self._place[indices]
        start, size = self._group_start[place], self._group_size[place]
        draw = torch.rand(len(indices), dtype=torch.float64).numpy()
        step = 1 + np.minimum((draw * (size - 1)).astype(np.int64), np.maximum(size - 2, 0))
        return self._by_target[start + (place - start + step) % size]

    def __getitem__(self, indices: list[int]) -> SeqBatch:
        i = np.asarray(indices)
        start = self.start[i]
        if self.partners:
            partner = self.partner_of(i)
            width = (self.end[i] - start).max()
            start = np.concatenate(
                [start, np.maximum(self.start[partner], self.end[partner] - width)]
            )
            i = np.concatenate([i, partner])
        batch = self._gather(self.rows[i], start, self.end[i], targets="next")
        # only the last position's target is this row's; the others belong to other rows
        batch.target_item[:, :-1] = 0
        batch.target_behavior[:, :-1] = 0
        if self.partners:  # partner rows are inputs only
            batch.target_item[len(indices) :] = 0
            batch.target_behavior[len(indices) :] = 0
        return batch


TRAIN_SAMPLES = {"windows": TrainWindows, "prefixes": TrainPrefixes}


class TargetRows(_BatchDataset):
    """One row per user with a target: the ``max_seq_len`` events before it, and the target.

    ``target_position`` is per user (-1 = none, row skipped). For scoring, pass each user's
    history length and ``has_target=False``: the row then holds the most recent events, no
    target, and predicts for the moment ``query_time`` (Unix seconds). With ``seen`` each
    batch's ``seen_item`` holds every item of the user's history before the target, not only
    the ``max_seq_len`` the model reads: what evaluation's seen-item policy sets aside.
    """

    def __init__(
        self,
        store: SequenceStore,
        target_position: np.ndarray,
        *,
        max_seq_len: int,
        has_target: bool = True,
        query_time: int | None = None,
        seen: bool = False,
        **settings,
    ):
        super().__init__(store, max_seq_len=max_seq_len, **settings)
        self.seen = seen
        self.rows = np.flatnonzero(target_position >= 1)
        position = target_position[self.rows]
        base = store.offsets[self.rows]
        self.end = base + position
        self.start = base + np.maximum(position - max_seq_len, 0)
        self.target = self.end if has_target else np.full(len(self.rows), -1)
        self.query_time = None if query_time is None else np.full(len(self.rows), query_time)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, indices: list[int]) -> SeqBatch:
        i = np.asarray(indices)
        batch = self._gather(
            self.rows[i],
            self.start[i],
            self.end[i],
            targets=self.target[i],
            query_time=None if self.query_time is None else self.query_time[i],
        )
        if self.seen:
            batch.seen_item = self.store.history(self.store.item, self.rows[i], self.end[i])
        return batch


class LengthGroupedBatches(Sampler[list[int]]):
    """Random batches of rows of similar length: each epoch shuffles the rows, sorts every
    group of ``group_batches`` batches by length, cuts the groups into batches and shuffles the
    batches. Batches are then trimmed to their longest row (:meth:`SequenceStore.gather`), so
    little attention and feed-forward work goes into padding, while every epoch still sees
    every row once in a random order of batches (deterministic for a seed)."""

    def __init__(
        self, lengths: np.ndarray, *, batch_size: int, seed: int, group_batches: int = 50
    ) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.group = batch_size * group_batches
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def state_dict(self) -> dict:
        """The random stream's position (plain values: a checkpoint holds it)."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]

    def __iter__(self) -> Iterator[list[int]]:
        order = self.rng.permutation(len(self.lengths))
        batches = []
        for begin in range(0, len(order), self.group):
            group = order[begin : begin + self.group]
            group = group[np.argsort(self.lengths[group], kind="stable")]
            batches += [
                group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)
            ]
        for index in self.rng.permutation(len(batches)):
            yield batches[index].tolist()


class ShuffledBatches(BatchSampler):
    """Batches of a random order of every row, drawn from a generator seeded with ``seed``
    (each epoch continues its stream; its position is the state a checkpoint keeps)."""

    def __init__(self, dataset: Dataset, *, batch_size: int, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(dataset, generator=self.generator)
        super().__init__(sampler, batch_size=batch_size, drop_last=False)

    def state_dict(self) -> dict:
        """The generator's position (a tensor: a checkpoint holds it)."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def batch_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    shuffle: bool,
    num_workers: int = 0,
    seed: int = 0,
    lengths: np.ndarray | None = None,
) -> DataLoader:
    """A loader that hands whole index lists to the dataset (its gather is the collate).
    With ``shuffle`` and ``lengths`` (each row's input length) batches group rows of similar
    length (:class:`LengthGroupedBatches`)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if shuffle and lengths is not None:
        batches = LengthGroupedBatches(lengths, batch_size=batch_size, seed=seed)
    elif shuffle:
        batches = ShuffledBatches(dataset, batch_size=batch_size, seed=seed)
    else:
        batches = BatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=False)
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=batches,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
