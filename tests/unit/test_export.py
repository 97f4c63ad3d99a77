"""Serving export: the TorchScript user encoder plus the item table score exactly like the
Python encoder, for any batch size and sequence length, and the folder is written safely."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.checkpoint import FORMAT_VERSION as CHECKPOINT_FORMAT
from recsys.checkpoint import checkpoint_extra, load_checkpoint, write_scoring_checkpoint
from recsys.data.batch import SeqBatch
from recsys.data.sequences import TimeBuckets
from recsys.data.vocab import Vocab
from recsys.export import INPUT_NAMES, export_model, load_exported
from recsys.model import ATRank
from recsys.model.gru4rec import GRU4Rec
from recsys.model.sasrec import SASRec
from recsys.model.transition import TransitionCounts, TransitionPrior
from recsys.schema import NUM_RESERVED, PAD_IDX, UNK_IDX, EventSchema

# TorchScript is deprecated in recent torch; the export still works and is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

SIZES = {
    "num_items": 20,
    "num_attributes": 7,
    "num_behaviors": 4,
    "num_time_buckets": 6,
    "max_seq_len": 8,
}
# conf/model/atrank_faithful.yaml
FAITHFUL = {
    "norm_first": False,
    "qkv_activation": "relu",
    "output_projection": False,
    "ffn_multiplier": 0.25,
    "activation": "relu",
    "positional": "none",
    "causal": False,
    "item_bias": True,
    "behavior_projection": True,
    "query_time": False,
}
ENCODERS = (
    "atrank",
    "atrank_faithful",
    "atrank_learned",
    "atrank_F_g",
    "atrank_attribute_attention",
    "atrank_low_pass",
    "sasrec",
    "sasrec_low_pass",
    "gru4rec",
)
# (lengths of the rows, T): neither is the tracing example's (B=2, T=4)
SHAPES = [([3, 5, 1], 5), ([8, 2, 7, 8, 1, 4], 8), ([1], 1)]


def attribute_table(width: int) -> torch.Tensor:
    """(I, width) item -> attribute sets of 0..width real attributes each, PAD-padded."""
    items = torch.arange(SIZES["num_items"])[:, None]
    column = torch.arange(width)[None, :]
    table = (items + 2 * column) % (SIZES["num_attributes"] - 2) + 2
    table = table.masked_fill(column >= items % (width + 1), PAD_IDX)
    table[PAD_IDX] = PAD_IDX
    return table


def make_encoder(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gru4rec":
        encoder = GRU4Rec(
            num_items=SIZES["num_items"],
            max_seq_len=SIZES["max_seq_len"],
            d_model=16,
            num_layers=2,
            dropout=0.1,
        )
    elif kind.startswith("sasrec"):
        encoder = SASRec(
            filter_mix=0.7 if kind == "sasrec_low_pass" else 0.0,
            num_items=SIZES["num_items"],
            max_seq_len=SIZES["max_seq_len"],
            d_model=16,
            num_heads=2,
            num_layers=2,
            dropout=0.1,
        )
    else:
        extra = {
            "atrank": {},
            "atrank_faithful": FAITHFUL,
            "atrank_learned": {"positional": "learned"},
            "atrank_F_g": {"behavior_projection": True},
            "atrank_low_pass": {"filter_mix": 0.7, "filter_frequencies": 3},
            "atrank_attribute_attention": {"attribute_attention": True},
        }[kind]
        encoder = ATRank(
            **SIZES, item_attribute_width=3, d_model=16, num_heads=2, dropout=0.1, **extra
        )
        encoder.set_item_attributes(attribute_table(3))
        with torch.no_grad():  # a trained model has a non-zero item bias
            encoder.item_bias.normal_()
    return encoder.eval()


def make_batch(lengths: list[int], seq_len: int, seed: int) -> SeqBatch:
    """Random left-padded batch, PAD (0) at padding positions."""
    generator = torch.Generator().manual_seed(seed)
    shape = (len(lengths), seq_len)
    padding_mask = torch.arange(seq_len)[None, :] >= seq_len - torch.tensor(lengths)[:, None]

    def draw(low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=generator) * padding_mask

    return SeqBatch(
        item=draw(2, SIZES["num_items"]),
        behavior=draw(2, SIZES["num_behaviors"]),
        time_bucket=draw(1, SIZES["num_time_buckets"]),
        padding_mask=padding_mask,
        query_time_bucket=draw(0, SIZES["num_time_buckets"]),
        target_item=torch.zeros(len(lengths), dtype=torch.long),
        target_behavior=torch.zeros(len(lengths), dtype=torch.long),
        user_index=torch.arange(len(lengths)),
    )


@torch.no_grad()
def python_scores(encoder: torch.nn.Module, *inputs: torch.Tensor | None) -> torch.Tensor:
    return encoder.score_items(encoder(*inputs).query)


def assert_same_scores(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    # exactly the same -inf columns (PAD and UNK) and nothing else non-finite
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
    assert torch.isneginf(got[:, :2]).all() and torch.isfinite(got[:, 2:]).all()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def assert_served_like_trained(model, folder: Path) -> None:
    """A trained checkpoint's model, exported into ``folder`` and loaded back, scores two
    small histories as the Python model does."""
    served = load_exported(export_model(model, folder)["metadata"].parent)
    item = torch.tensor([[0, 0, 2, 3, 4], [5, 6, 7, 8, 9]])
    zeros, mask = torch.zeros_like(item), item != 0
    expected = python_scores(model.encoder, item, zeros, zeros, mask)
    torch.testing.assert_close(served.score(item, zeros, zeros, mask), expected)


@pytest.fixture(scope="module", params=ENCODERS)
def exported(request, tmp_path_factory):
    encoder = make_encoder(request.param)
    folder = tmp_path_factory.mktemp(request.param) / "export"
    files = export_model(encoder, folder)
    return request.param, encoder, folder, files


def test_exported_scores_equal_python(exported):
    kind, encoder, folder, _ = exported
    model = load_exported(folder)
    for seed, (lengths, seq_len) in enumerate(SHAPES):
        batch = make_batch(lengths, seq_len, seed)
        got = model.score(*batch.model_inputs())
        assert_same_scores(got, python_scores(encoder, *batch.model_inputs()))
        # the query vector itself, and the contract written out: query @ keys.T + bias
        query = model.user_encoder(*batch.model_inputs())
        with torch.no_grad():
            torch.testing.assert_close(
                query, encoder(*batch.model_inputs()).query, rtol=1e-6, atol=1e-6
            )
        torch.testing.assert_close(query @ model.keys.T + model.bias, got, rtol=0, atol=0)
        # query_time_bucket omitted = the Python encoder called with None
        inputs = batch.model_inputs()[:4]
        assert_same_scores(model.score(*inputs), python_scores(encoder, *inputs, None))


def test_files_load_with_weights_only(exported):
    kind, encoder, folder, files = exported
    assert set(files) == {"user_encoder", "item_table", "metadata"}
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in files.values())
    table = torch.load(files["item_table"], weights_only=True)
    assert set(table) == {"keys", "bias"}
    keys, bias = table["keys"], table["bias"]
    assert keys.dtype == bias.dtype == torch.float32
    assert keys.shape == (SIZES["num_items"], 16) and bias.shape == (SIZES["num_items"],)
    assert not keys.requires_grad
    torch.testing.assert_close(keys, encoder.item_keys().detach(), rtol=0, atol=0)
    assert torch.isneginf(bias[:2]).all() and torch.isfinite(bias[2:]).all()
    expected_bias = encoder.never_recommended + getattr(encoder, "item_bias", 0.0)
    torch.testing.assert_close(bias, expected_bias.detach(), rtol=0, atol=0)

    meta = json.loads(files["metadata"].read_text())
    assert meta["user_encoder"]["input_names"] == list(INPUT_NAMES)
    assert meta["max_seq_len"] == SIZES["max_seq_len"]
    assert meta["torch_version"] == torch.__version__
    assert meta["item_table"]["keys"]["shape"] == [SIZES["num_items"], 16]
    assert "query @ keys.T + bias" in meta["scoring"]
    assert meta["encoder_config"] == encoder.config
    assert isinstance(torch.jit.load(str(files["user_encoder"])), torch.jit.ScriptModule)


def test_bad_inputs_raise(exported):
    _, _, folder, _ = exported
    model = load_exported(folder)
    too_long = make_batch([9], SIZES["max_seq_len"] + 1, seed=0).model_inputs()
    with pytest.raises(torch.jit.Error, match="exceeds max_seq_len=8"):
        model.score(*too_long)
    item, *rest = make_batch([2, 3], 4, seed=0).model_inputs()
    with pytest.raises(torch.jit.Error, match="item must be int64"):
        model.score(item.int(), *rest)
    with pytest.raises(torch.jit.Error, match="padding_mask has shape"):
        model.score(item, rest[0], rest[1], rest[2][:, 1:], rest[3])


def test_caller_module_is_left_alone(tmp_path):
    encoder = make_encoder("sasrec").train()
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    export_model(encoder, tmp_path / "export")
    assert encoder.training
    assert all(p.requires_grad for p in encoder.parameters())
    after = encoder.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_refuses_non_empty_folder_unless_overwrite(tmp_path):
    encoder = make_encoder("sasrec")
    folder = tmp_path / "export"
    folder.mkdir()
    export_model(encoder, folder)  # an existing empty folder is fine
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        export_model(encoder, folder)
    assert (folder / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temporary folder left

    export_model(encoder, folder, overwrite=True)
    assert not (folder / "keep.txt").exists()
    assert (folder / "user_encoder.pt").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        export_model(encoder, a_file, overwrite=True)


def test_an_export_onto_a_full_disk_names_the_file_and_keeps_the_earlier_export(
    tmp_path, monkeypatch
):
    """torch's writer fails on a full disk with "[enforce fail at inline_container.cc]
    unexpected pos ...", which says nothing of the disk: the export's error names the file,
    its folder and the full disk, and the earlier export stays as it was."""
    encoder = make_encoder("sasrec")
    folder = tmp_path / "export"
    export_model(encoder, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    save = torch.save

    def full(obj, target):  # the item table: half of it reaches the disk, then it is full
        if isinstance(target, (str, Path)):
            Path(target).write_bytes(b"half")
        else:
            target.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=r"no space left on the device of .* item_table\.pt") as info:
        export_model(encoder, folder, overwrite=True)
    monkeypatch.setattr(torch, "save", save)
    assert info.value.errno == errno.ENOSPC and str(tmp_path) in str(info.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temporary folder left


def write_checkpoint(encoder: torch.nn.Module, config: dict, path: Path) -> Path:
    vocab = Vocab.from_plain(
        {
            "item_id": [f"item{i}" for i in range(2, SIZES["num_items"])],
            "item_attributes": [[2, 3]] * (SIZES["num_items"] - 2),
            "item_train_count": [1] * (SIZES["num_items"] - 2),
            "attribute": [f"a{i}" for i in range(2, SIZES["num_attributes"])],
            "behaviors": ["view", "buy"],
        }
    )
    extra = checkpoint_extra(
        vocab=vocab,
        schema=EventSchema(),
        time_buckets=TimeBuckets(num_buckets=5),
        max_seq_len=SIZES["max_seq_len"],
        data_fingerprint="test",
    )
    meta = {"encoder_target": "recsys.model.atrank.ATRank", "encoder_config": config}
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    torch.save({"recsys": {**meta, **extra}, "state_dict": state}, path)
    return path


def test_checkpoint_written_before_the_item_side_switches_loads_as_it_was(tmp_path):
    """Configs saved before ``key_projection`` / ``item_bias`` / ``behavior_projection``
    existed had F_target keys, an item bias and F_g; they rebuild that model, not today's
    defaults."""
    torch.manual_seed(0)
    old = ATRank(
        **SIZES,
        d_model=16,
        num_heads=2,
        key_projection=True,
        item_bias=True,
        behavior_projection=True,
    )
    with torch.no_grad():
        old.item_bias.normal_()
    switches = ("key_projection", "item_bias", "behavior_projection")
    # twelfth session: as causal, no token norm; nineteenth: no attribute attention scores
    later = ("causal_attention", "token_norm", "attribute_attention")
    config = {k: v for k, v in old.config.items() if k not in switches + later}
    loaded = load_checkpoint(write_checkpoint(old, config, tmp_path / "old.ckpt")).encoder
    assert all(loaded.config[k] is True for k in switches)
    assert loaded.config["causal_attention"] is old.causal is True
    assert loaded.config["token_norm"] is False
    assert loaded.config["attribute_attention"] is False
    old.eval()
    batch = make_batch([4, 8], 8, seed=3)
    with torch.no_grad():
        expected = python_scores(old, *batch.model_inputs())
        assert_same_scores(python_scores(loaded, *batch.model_inputs()), expected)


def test_loaded_checkpoint_exports_with_its_vocabulary(tmp_path):
    encoder = make_encoder("atrank")
    path = write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt")
    loaded = load_checkpoint(path)

    files = export_model(loaded, tmp_path / "export")
    assert set(files) == {"user_encoder", "item_table", "metadata", "vocab"}
    plain = json.loads(Path(files["vocab"]).read_text())
    assert plain["item_id"][5 - 2] == "item5"
    assert plain["behaviors"] == ["view", "buy"]
    assert plain["time_buckets"]["num_buckets"] == 5
    # the rule a server copies gives the buckets scoring gives (it named only the settings)
    gaps = np.array([-5, 0, 59, 60, 179, 180, 419, 420, 10**5, 10**9])
    for settings in ({**plain["time_buckets"]}, {"unit_seconds": 86400.0, "num_buckets": 12}):
        names = {"floor": math.floor, "log2": math.log2, "max": max, "min": min, **settings}
        rule = [eval(plain["time_buckets_rule"], {}, {**names, "gap": int(g)}) for g in gaps]
        buckets = TimeBuckets(**{k: v for k, v in settings.items() if k != "reference"})
        assert rule == buckets(gaps).tolist()
    meta = json.loads(Path(files["metadata"]).read_text())
    assert meta["checkpoint"]["path"] == str(path)
    batch = make_batch([4, 8], 8, seed=7)
    assert_same_scores(
        load_exported(tmp_path / "export").score(*batch.model_inputs()),
        python_scores(loaded.encoder, *batch.model_inputs()),
    )


def test_an_empty_item_id_of_an_earlier_vocabulary_is_never_served(tmp_path, caplog):
    """A model of a recsys before an empty text id read as missing holds "" as an item: the
    export served it (vocab.json's "" at its index, a finite bias) where scoring never
    recommends it. Its bias is -inf, as PAD's and UNK's, with the scoring job's warning."""
    encoder = make_encoder("atrank")
    loaded = load_checkpoint(write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt"))
    plain = loaded.vocab.to_plain()
    plain["item_id"] = ["" if i == "item5" else i for i in plain["item_id"]]
    old = dataclasses.replace(loaded, vocab=Vocab.from_plain(plain))
    with caplog.at_level("WARNING"):
        files = export_model(old, tmp_path / "export")
    assert 'item id ""' in caplog.text
    assert json.loads(Path(files["vocab"]).read_text())["item_id"][5 - 2] == ""
    served = load_exported(tmp_path / "export")
    assert served.bias[5] == -math.inf and torch.isfinite(served.bias[NUM_RESERVED:]).sum() == (
        SIZES["num_items"] - NUM_RESERVED - 1
    )
    batch = make_batch([4, 8], 8, seed=7)
    got, expected = (
        served.score(*batch.model_inputs()),
        python_scores(loaded.encoder, *batch.model_inputs()),
    )
    assert torch.isneginf(got[:, 5]).all()
    others = [i for i in range(SIZES["num_items"]) if i != 5]
    assert_same_scores(got[:, others], expected[:, others])


def test_a_trained_rerank_head_is_named_not_silently_dropped(tmp_path, caplog):
    """The export is stage 1 only: a model whose target-attention head is trained ranks
    otherwise in a job that re-ranks (retrieval.rerank_top_n > 0; atrank_faithful's
    objective), so the export says so in the log and in export.json."""
    untrained = make_encoder("atrank")
    with caplog.at_level("WARNING", logger="recsys.export"):
        export_model(untrained, tmp_path / "untrained")
    assert "re-rank head" not in caplog.text
    meta = json.loads((tmp_path / "untrained" / "export.json").read_text())
    assert meta["rerank_head"] == "none"

    trained = make_encoder("atrank_faithful")
    with torch.no_grad():
        trained.rerank_output.weight.normal_()
    with caplog.at_level("WARNING", logger="recsys.export"):
        export_model(trained, tmp_path / "trained")
    assert "trained target-attention re-rank head" in caplog.text
    assert "retrieval.rerank_top_n=0" in caplog.text
    meta = json.loads((tmp_path / "trained" / "export.json").read_text())
    assert meta["rerank_head"].startswith("trained, not exported")
    export_model(make_encoder("sasrec"), tmp_path / "sasrec")  # has no head
    assert json.loads((tmp_path / "sasrec" / "export.json").read_text())["rerank_head"] == "none"


def test_a_transition_prior_is_exported_and_added_to_the_served_scores(tmp_path):
    """training.transition_prior: the export carries the counts and the weight, and the served
    scores are the encoder's plus weight * log(1 + count(last item -> item)), as evaluation and
    scoring rank them; UNK as the last item adds nothing."""
    encoder = make_encoder("atrank")
    loaded = load_checkpoint(write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt"))
    # user 0: 3 4 3 4 3 7 (all training); user 1: UNK 5 4 3 (all training)
    item = np.array([3, 4, 3, 4, 3, 7, 1, 5, 4, 3])
    counts = TransitionCounts.from_sequences(
        item, np.array([0, 6, 10]), np.array([6, 4]), SIZES["num_items"]
    )
    prior = TransitionPrior(counts, 0.75)
    files = export_model(dataclasses.replace(loaded, transition_prior=prior), tmp_path / "export")
    assert json.loads(files["metadata"].read_text())["transition_prior"] == {
        "weight": 0.75,
        "window": 1,
        "recent": 1,
        "decay": 1.0,
    }
    table = torch.load(files["item_table"], weights_only=True)
    assert torch.equal(table["transition_count"], counts.count)

    batch = make_batch([4, 8, 1], 8, seed=7)
    batch.item[:, -1] = torch.tensor([3, UNK_IDX, 4])  # the most recent items
    inputs = batch.model_inputs()
    plain = python_scores(loaded.encoder, *inputs)
    got = load_exported(tmp_path / "export").score(*inputs)
    assert_same_scores(got, prior.add_to(plain, batch.item))
    gain = got - plain
    assert gain[0, 4] == pytest.approx(0.75 * math.log(3))  # 3 -> 4 twice
    assert gain[0, 7] == pytest.approx(0.75 * math.log(2))  # 3 -> 7 once
    assert gain[2, 3] == pytest.approx(0.75 * math.log(4))  # 4 -> 3 three times
    assert torch.count_nonzero(gain[0, 2:]) == 2 and torch.count_nonzero(gain[1, 2:]) == 0
    # a wider prior (training.transition_window / _recent / _decay) is served as evaluated
    wide = TransitionPrior(
        TransitionCounts.from_sequences(
            item, np.array([0, 6, 10]), np.array([6, 4]), SIZES["num_items"], window=3
        ),
        0.5,
        recent=3,
        decay=0.5,
    )
    folder = tmp_path / "wide"
    files = export_model(dataclasses.replace(loaded, transition_prior=wide), folder)
    assert json.loads(files["metadata"].read_text())["transition_prior"] == wide.settings()
    served = load_exported(folder)
    assert served.transition_prior.settings() == wide.settings()
    assert_same_scores(served.score(*inputs), wide.add_to(plain, batch.item))
    assert (
        json.loads((export_model(loaded, tmp_path / "plain")["metadata"]).read_text())[
            "transition_prior"
        ]
        == "none"
    )


def test_indices_outside_the_tables_are_named(tmp_path):
    """An id mapped wrongly (an index past the catalogue, a negative one) is refused naming
    the input, not with torch's "index out of range in self"."""
    export_model(make_encoder("atrank"), tmp_path / "export")
    exported = load_exported(tmp_path / "export")
    batch = make_batch([3, 4], SIZES["max_seq_len"], seed=0)
    inputs = {
        "item": batch.item,
        "behavior": batch.behavior,
        "time_bucket": batch.time_bucket,
        "padding_mask": batch.padding_mask,
    }
    exported.score(**inputs)  # in range: fine
    for name, value in (
        ("item", SIZES["num_items"]),
        ("behavior", -1),
        ("time_bucket", SIZES["num_time_buckets"]),
    ):
        bad = {**inputs, name: inputs[name].clone().fill_(value)}
        with pytest.raises(Exception, match=rf"{name} holds indices outside \[0, "):
            exported.score(**bad)


@pytest.mark.parametrize(
    "content", [b"user_id,item_id\n1,2\n", b"PK\x03\x04truncated"], ids=["csv", "truncated zip"]
)
def test_a_file_that_is_no_checkpoint_is_named_without_torchs_unsafe_advice(tmp_path, content):
    path = tmp_path / "model.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="is not a recsys checkpoint") as info:
        load_checkpoint(path)
    assert "point model= at a .ckpt file the train task wrote" in str(info.value)
    assert "weights_only" not in str(info.value)


class _RunsCode:
    """What a hostile checkpoint holds: an object whose unpickling would call a function."""

    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "an empty file"),
        (b'{"fingerprint": "abc"}\n', "not a torch.save zip archive"),  # stats.json as model=
        (_RunsCode(), "would run code"),
    ],
    ids=["zero bytes", "json", "hostile pickle"],
)
def test_an_empty_text_or_hostile_file_is_named_with_the_reason(tmp_path, content, says):
    """torch's messages are no guide here: an empty file raised an IndexError from the message
    itself (EOFError has none), and a text file's excerpt of torch's message ended at "re-run
    with weights_only set to False", cut before its warning that doing so runs the file's
    code."""
    path = tmp_path / "best.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save({"recsys": content}, path)
    with pytest.raises(ValueError, match="is not a recsys checkpoint") as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and says in message
    assert "point model= at a .ckpt file the train task wrote" in message
    assert "set to `False`" not in message


@pytest.mark.parametrize(
    "damage",
    [
        "no vocab",
        "no time_buckets",
        "no encoder_target",
        "entry not a dict",
        "no state_dict",
        "other encoder's arguments",
        "unknown module",
        "weights of another size",
    ],
)
def test_a_checkpoint_of_another_layout_is_named_not_a_key_error(tmp_path, damage):
    """A checkpoint written by another version of recsys (a metadata key missing or renamed)
    or damaged inside is refused naming the file and the fix, not with a bare KeyError or
    TypeError from deep in the rebuild."""
    encoder = make_encoder("atrank")
    path = write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    meta = checkpoint["recsys"]
    if damage.startswith("no ") and damage != "no state_dict":
        del meta[damage.removeprefix("no ")]
    elif damage == "entry not a dict":
        checkpoint["recsys"] = "atrank"
    elif damage == "no state_dict":
        del checkpoint["state_dict"]
    elif damage == "other encoder's arguments":
        meta["encoder_target"] = "recsys.model.sasrec.SASRec"
    elif damage == "unknown module":
        meta["encoder_target"] = "recsys.model.removed.OldEncoder"
    else:
        name = next(k for k in checkpoint["state_dict"] if k.endswith("weight"))
        checkpoint["state_dict"][name] = torch.zeros(3)
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="cannot be loaded") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert "retrain" in str(info.value)


def test_a_checkpoint_of_a_newer_format_is_refused_not_read_as_this_versions(tmp_path):
    """A checkpoint's recsys entry carries its format: one a newer recsys wrote (a key renamed,
    or one read otherwise there) loaded as if this version had written it, its keys read as
    this code reads them; now it is refused, naming the file, both formats and the fix."""
    encoder = make_encoder("atrank")
    path = write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt")
    assert load_checkpoint(path).encoder.config == encoder.config  # no format: an older one
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["recsys"]["format_version"] = CHECKPOINT_FORMAT
    torch.save(checkpoint, path)
    assert load_checkpoint(path).encoder.config == encoder.config
    checkpoint["recsys"]["format_version"] = CHECKPOINT_FORMAT + 1
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match=f"of format {CHECKPOINT_FORMAT + 1}") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert f"reads format {CHECKPOINT_FORMAT}: load it with the recsys version" in str(info.value)


@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("export.json", "cut"),
        ("export.json", "a list"),
        ("user_encoder.pt", "missing"),
        ("user_encoder.pt", "cut"),
        ("item_table.pt", "missing"),
        ("item_table.pt", "empty"),
        ("item_table.pt", "a list"),
    ],
)
def test_a_damaged_export_folder_is_named_with_the_fix(tmp_path, file, damage):
    """A file of an export folder cut short, missing or replaced failed with a bare
    JSONDecodeError, torch's miniz or EOFError (naming no file), or a TypeError later."""
    folder = tmp_path / "export"
    export_model(make_encoder("atrank"), folder)
    path = folder / file
    if damage == "missing":
        path.unlink()
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "cut":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif file.endswith(".json"):
        path.write_text("[]")
    else:
        torch.save([1, 2], path)
    with pytest.raises((ValueError, FileNotFoundError), match="export_model") as info:
        load_exported(folder)
    assert str(path) in str(info.value)


def test_a_run_folder_given_as_a_checkpoint_names_the_checkpoint_in_it(tmp_path):
    """load_checkpoint(<run folder>) said the checkpoint "does not exist", though the folder
    does: it names the checkpoint to pass, as the pipelines' model= does."""
    encoder = make_encoder("atrank")
    (tmp_path / "checkpoints").mkdir()
    best = write_checkpoint(encoder, encoder.config, tmp_path / "checkpoints" / "best.ckpt")
    with pytest.raises(IsADirectoryError, match="is a folder, not a checkpoint file") as info:
        load_checkpoint(tmp_path)
    assert f"model={best}" in str(info.value)


def test_a_scoring_checkpoint_cut_by_a_failed_write_leaves_the_earlier_one(tmp_path, monkeypatch):
    """write_scoring_checkpoint wrote in place: a job killed mid-write left a cut model.ckpt
    that the next scoring job failed on. It now writes beside it and renames."""
    encoder = make_encoder("atrank")
    full = write_checkpoint(encoder, encoder.config, tmp_path / "best.ckpt")
    slim = write_scoring_checkpoint(full, tmp_path / "scoring" / "model.ckpt")
    before = slim.read_bytes()

    def cut_short(obj, target):  # (a path, or the file the bytes are made in)
        if isinstance(target, (str, Path)):
            Path(target).write_bytes(before[: len(before) // 2])
        else:
            target.write(before[: len(before) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("recsys.checkpoint.torch.save", cut_short)
    with pytest.raises(OSError, match=r"no space left on the device of .*model\.ckpt"):
        write_scoring_checkpoint(full, slim)
    assert slim.read_bytes() == before
    assert [p.name for p in slim.parent.iterdir()] == ["model.ckpt"]  # no temporary file left
    load_checkpoint(slim)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_checkpoint_with_weights_that_are_not_numbers_is_refused(tmp_path, value):
    """A checkpoint with one NaN item row (or NaN everywhere) loaded without a word: scoring
    wrote recommendations scored NaN, that item first for every user (NaN ranks first in a
    top-K), and evaluation reported NDCG 0. It is refused, naming the file and the tensor."""
    encoder = make_encoder("atrank")
    path = write_checkpoint(encoder, encoder.config, tmp_path / "model.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    name = next(k for k in checkpoint["state_dict"] if "item_embedding" in k)
    checkpoint["state_dict"][name][5] = value
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match=r"not finite \(NaN or inf\) in 1 of its") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value) and f"({name})" in str(info.value)
    assert "training.optimizer.lr" in str(info.value)


def test_a_bare_encoder_with_weights_that_are_not_numbers_is_not_exported(tmp_path):
    """export_model(<encoder>) from a notebook (no checkpoint, so no load-time check) wrote a
    model whose every score was NaN; it is refused as a checkpoint would be, naming the
    module and the tensor, and nothing is written."""
    encoder = make_encoder("atrank")
    weight = next(w for k, w in encoder.state_dict().items() if "item_embedding" in k)
    with torch.no_grad():
        weight[5] = math.nan
    with pytest.raises(ValueError, match=r"the ATRank encoder holds weights that are not finite"):
        export_model(encoder, tmp_path / "export")
    assert not (tmp_path / "export").exists()
