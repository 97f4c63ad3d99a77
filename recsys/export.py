"""Export a trained encoder for serving: a TorchScript user encoder plus a plain item table.

Serving contract. An export folder holds:

- ``user_encoder.pt``: a TorchScript module (load with ``torch.jit.load``; no ``recsys`` import
  needed) whose ``forward(item, behavior, time_bucket, padding_mask, query_time_bucket=None)``
  returns the user query vector ``query`` (B, D), the encoder's state after the most recent event.
  Inputs are the encoder's (see :meth:`recsys.data.batch.SeqBatch.model_inputs`):

  - ``item``, ``behavior``, ``time_bucket``: (B, T) int64 vocabulary indices, **left-padded**
    (the most recent event at position T-1), 0 (PAD) at padding positions;
  - ``padding_mask``: (B, T) bool, True = a real token;
  - ``time_bucket``: each event's time-gap bucket (``vocab.json``'s time-bucket settings):
    ``1 + min(floor(log2(1 + max(gap, 0) / unit_seconds)), num_buckets - 1)`` (``vocab.json``'s
    ``time_buckets_rule``), ``gap`` in seconds between the times rounded down to whole Unix
    seconds; with ``reference: previous`` the gap to the user's event before it, also when that
    event is older than the T kept (0 s for a user's first event); with ``reference: target``
    the gap to the moment the prediction is for;
  - ``query_time_bucket``: (B, T) int64, the time-gap bucket from each position's event to the
    moment *its* prediction is for, i.e. to the next event, and at the last position (the
    query served) to the moment of the recommendation (0 = unknown, the same as passing None).
    Scoring's own inputs (:meth:`recsys.data.dataset.SequenceStore.gather`) are built so.

  A user's events are ordered by time, ties in their order in the log; an exact repeat of an
  event (same user, item, behaviour and time) is dropped under the default
  ``data.bad_rows.duplicate: drop``; ``pipelines.score`` and
  ``recommend_frame`` take the log's last event as the moment of the recommendation unless
  ``as_of`` says otherwise. Any B >= 1 and 1 <= T <= ``max_seq_len`` work (clip longer
  histories to their last ``max_seq_len`` events); shapes, dtypes, T and index ranges are
  checked, and so is the padding: each row's most recent event at T-1 (a user with no event
  has no query vector: serve a fallback), padding on the left only, and PAD (0) exactly where
  ``padding_mask`` is False. A bad input raises ``torch.jit.Error`` whose message starts
  ``builtins.ValueError:`` and says what to fix.
  SASRec and GRU4Rec ignore ``behavior``, ``time_bucket`` and ``query_time_bucket`` but take
  them, so every encoder is served the same way.
- ``item_table.pt``: ``{"keys": (I, D) float32, "bias": (I,) float32}``, saved with
  ``torch.save`` and loadable with ``torch.load(..., weights_only=True)``. Row ``i`` is item
  vocabulary index ``i``; ``bias`` already holds -inf for PAD (0) and UNK (1), so they are never
  recommended, and for an item whose id recsys now reads as missing (``""``, which a model of an
  earlier recsys may hold), which scoring never recommends either. Scores over the whole
  catalogue are::

      scores = query @ keys.T + bias        # (B, I); top-k of each row = recommendations

  which is exactly ``encoder.score_items(encoder(*inputs).query)`` of the Python model; keys can
  equally go into an approximate-nearest-neighbour index (inner product, plus the bias).
- ``export.json``: shapes, dtypes, the input names and order, ``max_seq_len``, the torch version,
  the encoder class and config, the scoring rule above, and ``rerank_head``: ATRank's
  target-attention re-rank head (stage 2) is not exported, so a model whose head is trained
  (``training.rerank_top_n > 0``, the target-attention objective of ``atrank_faithful``) is
  logged with a warning and marked here; its exported scores rank as scoring with
  ``retrieval.rerank_top_n=0`` does. ``transition_prior``: ``"none"``, or the model's
  transition prior's settings (``training.transition_prior``): ``weight``, ``window`` (pairs
  counted up to that many events apart), ``recent`` and ``decay``; the export carries its
  counts (below).
- With a transition prior, ``item_table.pt`` also holds its counts as a CSR matrix by the earlier
  item: ``transition_row_start`` (I + 1,), ``transition_next_item`` and ``transition_count``
  (P,) int64. The served scores then add, for each of a user's ``recent`` most recent items
  ``h = item[b, T-j]``, ``j = 1 .. recent`` (none for PAD and UNK, indices 0 and 1)::

      e = transition_row_start[h] : transition_row_start[h + 1]
      scores[b, transition_next_item[e]] += weight * decay**(j-1) * log(1 + transition_count[e])

  which is what evaluation and scoring add (:class:`recsys.model.transition.TransitionPrior`);
  an item index gains nothing from it when no item follows those items in training, so an ANN
  index over ``keys`` stays exact when its top K is merged with their successors.
- ``vocab.json`` (only when exporting a :class:`recsys.checkpoint.LoadedModel`): what turns raw
  events into inputs and indices back into item ids: ``item_id[i - 2]`` is the id of index ``i``,
  the behaviour names (index 2, 3, ...), the time-bucket settings and the event schema.

The encoder is traced with ``torch.jit.trace`` (checked on inputs of other batch sizes and
sequence lengths) in eval mode, on CPU, in float32. Tracing records device constants, so the
exported encoder runs on CPU only. :func:`load_exported` reads a folder back and scores with it.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from recsys.checkpoint import (
    LoadedModel,
    check_finite_weights,
    encoder_target,
    save_atomically,
    unreadable,
)
from recsys.data.sequences import BUCKET_RULE
from recsys.model.transition import TransitionPrior
from recsys.schema import NUM_RESERVED, PAD_IDX

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
ENCODER_FILE = "user_encoder.pt"
ITEM_TABLE_FILE = "item_table.pt"
METADATA_FILE = "export.json"
VOCAB_FILE = "vocab.json"
INPUT_NAMES = ("item", "behavior", "time_bucket", "padding_mask", "query_time_bucket")
SCORING = "scores = query @ keys.T + bias"


class _QueryVector(nn.Module):
    """The part that is traced: encoder inputs -> the user query vector (B, D)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
        query_time_bucket: torch.Tensor,
    ) -> torch.Tensor:
        return self.encoder(item, behavior, time_bucket, padding_mask, query_time_bucket).query


class _ServingEncoder(nn.Module):
    """Scripted shell around the traced encoder: the input checks tracing cannot keep (the
    encoders' ``T <= max_seq_len`` check is Python control flow, which a trace drops; past it a
    positional table slice would silently go wrong) and the optional ``query_time_bucket``."""

    def __init__(self, traced: nn.Module, max_seq_len: int, config: dict[str, Any]) -> None:
        super().__init__()
        self.traced = traced
        self.max_seq_len = max_seq_len
        # each index input's table size (-1: an input this encoder does not read); past it an
        # embedding lookup fails with torch's "index out of range in self", naming nothing
        self.num_items = int(config.get("num_items", -1))
        self.num_behaviors = int(config.get("num_behaviors", -1))
        self.num_time_buckets = int(config.get("num_time_buckets", -1))

    def forward(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
        query_time_bucket: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if query_time_bucket is None:
            query_time_bucket = torch.zeros_like(item)
        if item.dim() != 2 or item.shape[0] < 1 or item.shape[1] < 1:
            raise ValueError(f"item has shape {item.shape}: pass (B, T) with B >= 1 and T >= 1")
        for name, tensor in [
            ("behavior", behavior),
            ("time_bucket", time_bucket),
            ("padding_mask", padding_mask),
            ("query_time_bucket", query_time_bucket),
        ]:
            if tensor.shape != item.shape:
                raise ValueError(
                    f"{name} has shape {tensor.shape} but item has {item.shape}: "
                    f"every input is (B, T)"
                )
        for name, tensor in [
            ("item", item),
            ("behavior", behavior),
            ("time_bucket", time_bucket),
            ("query_time_bucket", query_time_bucket),
        ]:
            if tensor.dtype != torch.long:
                raise ValueError(f"{name} must be int64 (torch.long) indices")
        if padding_mask.dtype != torch.bool:
            raise ValueError("padding_mask must be a bool tensor, True = real token")
        if item.shape[1] > self.max_seq_len:
            raise ValueError(
                f"sequence length T={item.shape[1]} exceeds max_seq_len={self.max_seq_len}: "
                f"keep the last {self.max_seq_len} events"
            )
        for name, tensor, size in [
            ("item", item, self.num_items),
            ("behavior", behavior, self.num_behaviors),
            ("time_bucket", time_bucket, self.num_time_buckets),
            ("query_time_bucket", query_time_bucket, self.num_time_buckets),
        ]:
            if size > 0 and bool(((tensor < 0) | (tensor >= size)).any()):
                raise ValueError(
                    f"{name} holds indices outside [0, {size}): map ids with vocab.json "
                    "(0 = padding, 1 = unknown)"
                )
        # a wrongly padded row would be encoded without error into another user's query
        if bool((~padding_mask[:, -1]).any()):
            raise ValueError(
                "a row's last position (T-1) is padding: left-pad each row so that its most "
                "recent event is at T-1 (a user with no event has no query: serve a fallback)"
            )
        if bool((padding_mask[:, 1:] < padding_mask[:, :-1]).any()):
            raise ValueError(
                "a row has padding after a real token: pad on the left only, real tokens "
                "(padding_mask True) contiguous up to T-1"
            )
        if bool(((item == 0) == padding_mask).any()):  # 0: PAD_IDX (a script sees no globals)
            raise ValueError(
                "item and padding_mask disagree: item must be 0 (PAD) exactly where "
                "padding_mask is False (an unknown item is 1, UNK)"
            )
        return self.traced(item, behavior, time_bucket, padding_mask, query_time_bucket)


@dataclass
class ExportedModel:
    """An export folder read back: score users without the ``recsys`` model code."""

    user_encoder: torch.jit.ScriptModule
    keys: torch.Tensor  # (I, D)
    bias: torch.Tensor  # (I,), -inf for PAD and UNK
    metadata: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    transition_prior: TransitionPrior | None = None  # added to the scores when present

    @torch.no_grad()
    def encode(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
        query_time_bucket: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shapes: inputs (B, T) (see the module docstring) -> query (B, D)."""
        return self.user_encoder(item, behavior, time_bucket, padding_mask, query_time_bucket)

    @torch.no_grad()
    def score(
        self,
        item: torch.Tensor,
        behavior: torch.Tensor,
        time_bucket: torch.Tensor,
        padding_mask: torch.Tensor,
        query_time_bucket: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``query @ keys.T + bias`` for every item, plus the transition prior's term when the
        model has one (module docstring). Shapes: inputs (B, T) -> scores (B, I), -inf in the
        PAD and UNK columns."""
        query = self.encode(item, behavior, time_bucket, padding_mask, query_time_bucket)
        scores = query @ self.keys.T + self.bias
        if self.transition_prior is not None:
            scores = self.transition_prior.add_to(scores, item)
        return scores


def export_model(
    model: LoadedModel | nn.Module, folder: str | Path, *, overwrite: bool = False
) -> dict[str, Path]:
    """Write the user encoder, the item table and their description into ``folder``.

    ``model`` is a loaded checkpoint or a bare encoder (ATRank, SASRec, GRU4Rec: anything with
    the encoder interface, :mod:`recsys.model.interface`, whose ``config`` holds
    ``max_seq_len``). The encoder is copied, so the
    caller's module is left as it was (mode, device, dtype). Files are written into a temporary
    sibling folder that is renamed into place, so ``folder`` never holds a partial export.
    Raises ValueError when ``folder`` exists and is not empty, unless ``overwrite`` is set.

    Returns the path of each file written, by name: ``user_encoder``, ``item_table``,
    ``metadata`` and, for a LoadedModel, ``vocab``.
    """
    folder = Path(folder)
    _check_target(folder, overwrite)
    loaded = model if isinstance(model, LoadedModel) else None
    source = loaded.encoder if loaded is not None else model
    if not isinstance(source, nn.Module):
        raise ValueError(
            f"model is a {type(model).__name__}: pass a LoadedModel (recsys.checkpoint."
            f"load_checkpoint) or an encoder nn.Module"
        )
    if loaded is None:  # (a loaded checkpoint's weights were checked as it loaded)
        check_finite_weights(source.state_dict(), f"the {type(source).__name__} encoder")
    config = getattr(source, "config", None)
    config = dict(config) if isinstance(config, dict) else {}
    max_seq_len = loaded.max_seq_len if loaded is not None else config.get("max_seq_len")
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(
            f"cannot tell the encoder's max_seq_len (config has {max_seq_len!r}): pass a "
            f"LoadedModel or an encoder whose .config holds max_seq_len"
        )

    encoder = copy.deepcopy(source).to(device="cpu", dtype=torch.float32).eval()
    encoder.requires_grad_(False)
    with torch.no_grad():
        keys = encoder.item_keys().detach().clone().contiguous()  # (I, D)
        bias = _item_bias(encoder, keys).detach().clone().contiguous()  # (I,)
        if loaded is not None:  # as scoring: an item id now read as missing is never served
            bias[loaded.never_recommended()] = -math.inf
        user_encoder = _script_encoder(encoder, max_seq_len, config)
    _warn_if_zero_bucket_is_not_none(encoder)

    metadata = _metadata(encoder, config, keys, bias, max_seq_len)
    metadata["rerank_head"] = _rerank_head(encoder)
    prior = loaded.transition_prior if loaded is not None else None
    metadata["transition_prior"] = "none" if prior is None else prior.settings()
    table = {"keys": keys, "bias": bias}
    if prior is not None:
        table.update({f"transition_{k}": v for k, v in prior.counts.to_plain().items()})
    if loaded is not None:
        metadata["checkpoint"] = {
            "path": str(loaded.path),
            "data_fingerprint": getattr(loaded, "data_fingerprint", None),
            "target_behaviors": _plain_list(getattr(loaded, "target_behaviors", None)),
        }
    files = {
        "user_encoder": ENCODER_FILE,
        "item_table": ITEM_TABLE_FILE,
        "metadata": METADATA_FILE,
    }
    if loaded is not None:
        files["vocab"] = VOCAB_FILE

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        # (bytes made in memory: a full disk is named as such, not as torch's "unexpected pos")
        save_atomically(user_encoder, tmp / ENCODER_FILE, torch.jit.save)
        save_atomically(table, tmp / ITEM_TABLE_FILE)
        _write_json(tmp / METADATA_FILE, metadata)
        if loaded is not None:
            _write_json(tmp / VOCAB_FILE, _vocab_plain(loaded))
        _replace_folder(tmp, folder, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "exported %s (I=%d items, D=%d, max_seq_len=%d) to %s",
        type(source).__name__,
        keys.shape[0],
        keys.shape[1],
        max_seq_len,
        folder,
    )
    return {name: folder / filename for name, filename in files.items()}


def load_exported(folder: str | Path) -> ExportedModel:
    """Read an export folder written by :func:`export_model` (CPU tensors). A file missing, cut
    short (a copy that did not finish) or replaced is named with the fix, rather than left to
    torch's miniz messages or a JSONDecodeError that name no file."""
    folder = Path(folder)
    metadata_path = folder / METADATA_FILE
    if not metadata_path.is_file():
        raise FileNotFoundError(
            f"{folder} has no {METADATA_FILE}: pass a folder written by recsys.export.export_model"
        )
    redo = "the export folder is damaged or incomplete: export the model again (export_model)"
    for name in (ENCODER_FILE, ITEM_TABLE_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} does not exist: {redo}")
    try:
        metadata = json.loads(metadata_path.read_text())
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{metadata_path} is not JSON ({err}): {redo}") from err
    if not isinstance(metadata, dict):
        raise ValueError(
            f"{metadata_path} holds a {type(metadata).__name__}, not an object: {redo}"
        )
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{metadata_path} has format_version={version!r}; this code reads version "
            f"{FORMAT_VERSION}: re-export the model with this version of recsys"
        )
    try:
        user_encoder = torch.jit.load(str(folder / ENCODER_FILE), map_location="cpu")
    except Exception as err:  # torch raises RuntimeError, ValueError, ... on a damaged file
        path = folder / ENCODER_FILE
        raise ValueError(f"{path} cannot be read ({unreadable(path, err)}): {redo}") from err
    user_encoder.eval()
    table_path = folder / ITEM_TABLE_FILE
    try:
        table = torch.load(table_path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"{table_path} cannot be read ({unreadable(table_path, err)}): {redo}"
        ) from err
    needed = ["keys", "bias"]
    if isinstance(metadata.get("transition_prior"), dict):
        needed += [f"transition_{k}" for k in ("row_start", "next_item", "count")]
    absent = needed if not isinstance(table, dict) else [k for k in needed if k not in table]
    if absent:
        raise ValueError(f"{table_path} lacks {', '.join(absent)} of the item table: {redo}")
    prior = metadata.get("transition_prior")
    if isinstance(prior, dict):
        counts = {k: table[f"transition_{k}"] for k in ("row_start", "next_item", "count")}
        prior = TransitionPrior.from_plain({**prior, **counts})
    return ExportedModel(
        user_encoder=user_encoder,
        keys=table["keys"],
        bias=table["bias"],
        metadata=metadata,
        folder=folder,
        transition_prior=prior if isinstance(prior, TransitionPrior) else None,
    )


# --- helpers ---------------------------------------------------------------------------------


def _check_target(folder: Path, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"export folder {folder} exists and is not a folder: pick another path")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise ValueError(
            f"export folder {folder} exists and is not empty: pick a new folder or pass "
            f"overwrite=True to replace it"
        )


def _replace_folder(tmp: Path, folder: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``folder``; an existing (empty, or with ``overwrite``) ``folder`` is
    moved aside first and deleted only once the new one is in place."""
    _check_target(folder, overwrite)  # again: it may have changed while exporting
    old = None
    if folder.exists():
        old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex}"
        folder.rename(old)
    try:
        tmp.rename(folder)
    except BaseException:
        if old is not None:
            old.rename(folder)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _item_bias(encoder: nn.Module, keys: torch.Tensor) -> torch.Tensor:
    """(I,) the additive part of ``score_items`` (item_bias for ATRank, none for SASRec, -inf
    for PAD and UNK): its scores for a zero query, as scoring reads it, so any encoder whose
    ``score_items`` is ``query @ keys.T + bias`` exports (the encoder interface)."""
    return encoder.score_items(keys.new_zeros(1, keys.shape[1]))[0]


def _example_inputs(
    batch_size: int, seq_len: int, max_seq_len: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """Left-padded inputs that are valid for any encoder: item 2 is the first real item,
    behaviour 2 the first real behaviour, time bucket 1 the first real bucket (every
    vocabulary has them). Row lengths cycle through 1..seq_len."""
    seq_len = min(seq_len, max_seq_len)
    lengths = (torch.arange(batch_size) + seed) % seq_len + 1  # (B,)
    padding_mask = torch.arange(seq_len)[None, :] >= seq_len - lengths[:, None]  # (B, T)
    ones = padding_mask.long()
    item = NUM_RESERVED * ones
    behavior = NUM_RESERVED * ones
    time_bucket = ones
    query_time_bucket = ones
    return item, behavior, time_bucket, padding_mask, query_time_bucket


def _script_encoder(
    encoder: nn.Module, max_seq_len: int, config: dict[str, Any]
) -> torch.jit.ScriptModule:
    """Trace the query path (checked against the Python module on other batch sizes and
    sequence lengths, which fails if a shape got baked in) and wrap it in the scripted shell."""
    example = _example_inputs(2, 4, max_seq_len, seed=0)
    checks = [
        _example_inputs(3, max_seq_len, max_seq_len, seed=1),
        _example_inputs(1, 1, max_seq_len, seed=0),
    ]
    with warnings.catch_warnings():
        # The encoders' T <= max_seq_len check turns a traced size into a Python bool; the
        # scripted shell re-implements it, so the trace's constant is harmless.
        warnings.filterwarnings(
            "ignore", message="Converting a tensor to a Python boolean", category=Warning
        )
        traced = torch.jit.trace(_QueryVector(encoder), example, check_inputs=checks)
    scripted = torch.jit.script(_ServingEncoder(traced, max_seq_len, config))
    # Belt and braces: the scripted module on one more shape equals the Python encoder.
    probe = _example_inputs(2, max(1, max_seq_len - 1), max_seq_len, seed=2)
    expected = encoder(*probe).query
    got = scripted(*probe)
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
        raise RuntimeError(
            f"the exported encoder disagrees with {type(encoder).__name__} (max abs diff "
            f"{(got - expected).abs().max().item():.3g}); export this encoder another way"
        )
    return scripted


def _rerank_head(encoder: nn.Module) -> str:
    """Whether the encoder has a trained target-attention head, which is not exported: the
    export serves stage 1 (``query @ keys.T + bias``) only, so where scoring re-ranks with
    that head (``retrieval.rerank_top_n > 0``) the served lists differ from the score task's."""
    if not (hasattr(encoder, "rerank_head_trained") and encoder.rerank_head_trained()):
        return "none"
    log.warning(
        "%s has a trained target-attention re-rank head, which the export leaves out: the "
        "exported scores are stage 1 (%s) alone, so they rank like scoring with "
        "retrieval.rerank_top_n=0, not like a job that re-ranks with the head",
        type(encoder).__name__,
        SCORING,
    )
    return "trained, not exported: scores are stage 1 only (retrieval.rerank_top_n=0)"


def _warn_if_zero_bucket_is_not_none(encoder: nn.Module) -> None:
    table = getattr(encoder, "query_time_embedding", None)
    if isinstance(table, nn.Embedding) and bool(table.weight[PAD_IDX].any()):
        log.warning(
            "query_time_embedding row 0 is not zero: the exported encoder's default "
            "query_time_bucket (zeros) will not match the Python encoder called with None"
        )


def _metadata(
    encoder: nn.Module,
    config: dict[str, Any],
    keys: torch.Tensor,
    bias: torch.Tensor,
    max_seq_len: int,
) -> dict[str, Any]:
    num_items, dim = keys.shape
    token = {"shape": ["B", "T"], "dtype": "int64"}
    return {
        "format_version": FORMAT_VERSION,
        "torch_version": torch.__version__,
        "encoder_class": encoder_target(encoder),
        "encoder_config": config,
        "device": "cpu",
        "dtype": "float32",
        "max_seq_len": max_seq_len,
        "num_items": num_items,
        "d_model": dim,
        "pad_index": PAD_IDX,
        "num_reserved": NUM_RESERVED,
        "files": {
            "user_encoder": ENCODER_FILE,
            "item_table": ITEM_TABLE_FILE,
        },
        "user_encoder": {
            "format": "torchscript",
            "load": "torch.jit.load(path, map_location='cpu')",
            "input_names": list(INPUT_NAMES),
            "inputs": {
                "item": token,
                "behavior": token,
                "time_bucket": token,
                "padding_mask": {"shape": ["B", "T"], "dtype": "bool"},
                "query_time_bucket": {**token, "optional": True},
            },
            "output": {"name": "query", "shape": ["B", dim], "dtype": "float32"},
            "batch": "1 <= T <= max_seq_len, any B >= 1",
            "padding": "left-padded: most recent event at position T-1; PAD (0) and "
            "padding_mask False at padding positions; padding_mask True = real token",
            "time_bucket": "bucket of each event's gap to the user's event before it (0 s "
            "for the first; reference previous) or to the moment of the prediction "
            "(reference target): vocab.json's time-bucket settings",
            "query_time_bucket": "bucket of each position's gap to the moment its prediction "
            "is for: the next event, and at T-1 the moment of the recommendation; "
            "0 = unknown (the same as None)",
        },
        "item_table": {
            "format": "torch.save dict; torch.load(path, weights_only=True)",
            "keys": {"shape": [num_items, dim], "dtype": str(keys.dtype).removeprefix("torch.")},
            "bias": {"shape": [num_items], "dtype": str(bias.dtype).removeprefix("torch.")},
            "row": "item vocabulary index; 0 = PAD and 1 = UNK (and an item id read as missing, "
            '"") have bias -inf',
        },
        "scoring": f"{SCORING}  # (B, I); take the top-k of each row",
    }


def _vocab_plain(loaded: LoadedModel) -> dict[str, Any]:
    vocab = loaded.vocab.to_plain()
    time_buckets = loaded.time_buckets
    return {
        "item_id": vocab["item_id"],
        "item_id_note": f"item_id[i - {NUM_RESERVED}] is the id of item index i",
        "behaviors": vocab["behaviors"],
        "behaviors_note": f"behaviors[j] has index j + {NUM_RESERVED}",
        "time_buckets": {
            "unit_seconds": time_buckets.unit_seconds,
            "num_buckets": time_buckets.num_buckets,
            "reference": time_buckets.reference,
        },
        "time_buckets_rule": BUCKET_RULE,
        "time_buckets_note": "gap: seconds between times rounded down to whole Unix seconds "
        "(reference previous: to the user's event before; target: to the moment of the "
        "prediction); 0 = PAD",
        "schema": loaded.schema.to_dict(),
        "target_behaviors": _plain_list(getattr(loaded, "target_behaviors", None)),
    }


def _plain_list(values: Any) -> list[Any] | None:
    return None if values is None else list(values)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
