"""LightningDataModule over a prepared dataset folder."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import polars
import pytorch_lightning as pl
from torch.utils.data import DataLoader

from recsys.data.dataset import (
    GPU_WIDTH_MULTIPLE,
    TRAIN_SAMPLES,
    SequenceStore,
    TargetRows,
    batch_loader,
)
from recsys.data.io import DataError, cast_ids
from recsys.data.pipeline import SEQUENCES_FILE, load_stats
from recsys.data.sequences import TimeBuckets
from recsys.data.validate import canonical_ids
from recsys.data.vocab import Vocab
from recsys.schema import USER

log = logging.getLogger(__name__)

MAX_WIDTH_MULTIPLE = 256
LOADER_KEYS = ("batch_size", "eval_batch_size", "num_workers", "train_samples", "width_multiple")


def check_loader(partners: bool = False, **loader) -> None:
    """``data.loader``, refused by its config key: no unknown key, ``batch_size`` and
    ``eval_batch_size`` whole numbers >= 1, ``num_workers`` >= 0, ``width_multiple`` ``auto``
    or a whole number from 1 to :data:`MAX_WIDTH_MULTIPLE`, ``train_samples`` one of
    :data:`TRAIN_SAMPLES` (prefixes where ``partners``, same-target pairs, are wanted). The
    train task checks it before the data is prepared."""
    unknown = sorted(set(loader) - set(LOADER_KEYS))
    if unknown:
        raise ValueError(f"unknown data.loader option(s) {unknown}; known: {sorted(LOADER_KEYS)}")
    for key, minimum in (("batch_size", 1), ("eval_batch_size", 1), ("num_workers", 0)):
        value = loader.get(key, minimum)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"data.loader.{key}={value!r} must be a whole number >= {minimum}")
    multiple = loader.get("width_multiple", "auto")
    if multiple != "auto" and (
        isinstance(multiple, bool)
        or not isinstance(multiple, int)
        or not 1 <= multiple <= MAX_WIDTH_MULTIPLE
    ):
        raise ValueError(
            f"data.loader.width_multiple={multiple!r} must be auto or a whole number from 1 to "
            f"{MAX_WIDTH_MULTIPLE}: batches are padded to a multiple of it in width (at most "
            f"data.max_seq_len); auto takes {GPU_WIDTH_MULTIPLE} on a GPU and 1 on a CPU"
        )
    train_samples = loader.get("train_samples", "windows")
    if train_samples not in TRAIN_SAMPLES:
        raise ValueError(
            f"data.loader.train_samples={train_samples!r} is not supported: choose one of "
            f"{list(TRAIN_SAMPLES)} (windows: every position a target; prefixes: one row "
            "per target)"
        )
    if partners and train_samples != "prefixes":
        raise ValueError(
            "same-target partners (training.contrastive_positive=same_target) pair training "
            "rows by their one target: they need data.loader.train_samples=prefixes, got "
            f"{train_samples!r}"
        )


class SeqRecDataModule(pl.LightningDataModule):
    """Training rows and one evaluation row per user with a validation / test target. Time
    buckets come from the prepared folder's ``stats.json``.

    ``train_samples``: ``"windows"`` (:class:`~recsys.data.dataset.TrainWindows`, every
    position of a window a target: the fast default for causal encoders) or ``"prefixes"``
    (:class:`~recsys.data.dataset.TrainPrefixes`, one row per target, the last position
    trained: the S3-Rec family's form, for non-causal encoders). ``partners`` (prefixes only)
    adds each training row's same-target partner to its batch (DuoRec's supervised positive,
    for ``training.contrastive_positive=same_target``).
    """

    def __init__(
        self,
        prepared_dir: str | Path,
        *,
        max_seq_len: int,
        batch_size: int = 128,
        eval_batch_size: int = 512,
        num_workers: int = 0,
        seed: int = 0,
        train_samples: str = "windows",
        width_multiple: int = 1,
        partners: bool = False,
        time_buckets: TimeBuckets | None = None,
    ):
        """``time_buckets``: how gaps become bucket ids; default the prepared data's (a
        trained model passes its own: buckets are computed from the stored times per batch,
        so the data's setting need not match the model's)."""
        super().__init__()
        check_loader(
            partners,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            train_samples=train_samples,
            width_multiple=width_multiple,
        )
        self.train_samples = train_samples
        self.partners = bool(partners)
        self.prepared_dir = Path(prepared_dir)
        self.stats = load_stats(self.prepared_dir)
        self.vocab = Vocab.load(self.prepared_dir)
        self.time_buckets = time_buckets or TimeBuckets(**self.stats["time_buckets"])
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.width_multiple = width_multiple
        self.seed = seed
        self.store: SequenceStore | None = None
        self._train_loader: DataLoader | None = None
        self._train_batches: dict | None = None  # a checkpoint's batch order, for the next loader

    def setup(self, stage: str | None = None) -> None:
        if self.store is None:
            # logged: on a large log this is a silent pause before the first progress bar
            # (2 s for 10 M events on 2 cores, in proportion to the events)
            start = time.perf_counter()
            self.store = SequenceStore.from_parquet(self.prepared_dir / SEQUENCES_FILE)
            log.info(
                "read the sequences of %d users (%d events) from %s in %.1f s",
                self.store.num_users,
                len(self.store.item),
                self.prepared_dir,
                time.perf_counter() - start,
            )
            self._warn_of_missing_ids()

    def _warn_of_missing_ids(self) -> None:
        """Name the ids of this folder that preparation now reads as missing
        (:func:`~recsys.data.validate.canonical_ids`: ``""``), which a folder of an earlier
        recsys holds as a user or an item like any other."""
        users = canonical_ids(USER, self.store.user_id.dtype)
        held = []
        if users is not None and self.store.user_id.to_frame().select(users.is_null().any()).item():
            held.append('the user id ""')
        if self.vocab.missing_id_indices():
            held.append('the item id ""')
        if held:
            log.warning(
                "%s holds %s, an empty text id, which recsys now reads as a missing one "
                '(data.bad_rows.null_id): an earlier recsys prepared the folder, taking "" as '
                "an id like any other, and a model trained or evaluated on it counts those "
                "events; prepare the log again to leave them out",
                self.prepared_dir,
                " and ".join(held),
            )

    def _settings(self) -> dict:
        return {
            "max_seq_len": self.max_seq_len,
            "time_buckets": self.time_buckets,
            "width_multiple": self.width_multiple,
        }

    def train_dataloader(self) -> DataLoader:
        self.setup()
        extra = {"partners": True} if self.partners else {}
        windows = TRAIN_SAMPLES[self.train_samples](self.store, **self._settings(), **extra)
        loader = batch_loader(
            windows,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            seed=self.seed,
            lengths=windows.input_lengths,
        )
        if self._train_batches is not None:
            loader.sampler.load_state_dict(self._train_batches)
            self._train_batches = None
        self._train_loader = loader
        return loader

    def state_dict(self) -> dict:
        """Kept in each checkpoint: the position of the train loader's batch-order stream
        (:class:`~recsys.data.dataset.LengthGroupedBatches`). A training resumed from an
        epoch's end (``resume=last``) continues it, so its epochs see the batch orders an
        uninterrupted training's would, not the first epochs' again (Lightning restores a
        loader's own state only within an epoch)."""
        sampler = getattr(self._train_loader, "sampler", None)
        return {"train_batches": sampler.state_dict()} if hasattr(sampler, "state_dict") else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._train_batches = state_dict.get("train_batches")

    def target_loader(self, split: str, users: np.ndarray | None = None) -> DataLoader:
        """Evaluation rows for ``split`` in {"val", "test"}; with ``users`` ((U,) bool over
        the prepared user table, :meth:`user_rows`) only those users' rows."""
        self.setup()
        positions = {"val": self.store.val_target, "test": self.store.test_target}[split]
        if users is not None:
            positions = np.where(users, positions, -1)
        rows = TargetRows(self.store, positions, **self._settings(), seen=True)
        return batch_loader(
            rows, batch_size=self.eval_batch_size, shuffle=False, num_workers=self.num_workers
        )

    def user_rows(self, ids: polars.Series, source: str) -> np.ndarray:
        """(U,) bool: the prepared user table's rows of ``ids`` (:func:`~recsys.data.io.
        read_user_list`). An id the prepared data does not have is refused, naming ``source``."""
        self.setup()
        table = self.store.user_id
        cast = cast_ids(ids, table.dtype)
        unknown = ids.filter(cast.is_null() | ~cast.is_in(table.implode()))
        if unknown.len():
            raise DataError(
                f"{source}: {unknown.len()} of its {ids.len()} user ids are not users of the "
                f"prepared data {self.prepared_dir}, e.g. {unknown.head(3).to_list()} "
                f"({ids.dtype}; its users look like {table.head(3).to_list()}, {table.dtype}): "
                "list users of the log being evaluated (users removed by preparation's filters, "
                "e.g. k-core, are not in it)"
            )
        return table.is_in(cast.implode()).to_numpy()

    def val_dataloader(self) -> DataLoader:
        return self.target_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.target_loader("test")
