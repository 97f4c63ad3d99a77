"""Settings refused before the work they would spoil: model and training settings before the
data is prepared (``train.check_model_settings``: a trial build with placeholder data sizes),
the main job's scoring settings before it trains, a reused prepared folder that does not match
the data settings. Each message names the config key the user sets."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from recsys.data.sequences import TimeBuckets
from recsys.data.synthetic import generate_events
from recsys.tasks import main, prepare, train


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_heads=0", r"^model.num_heads=0 is invalid"),
        ("model.dropout=1.5", r"^model.dropout=1.5 is invalid"),
        ("model.d_model=-16", r"^model.d_model=-16 is invalid"),
        ("model.num_heads=7", r"^model.d_model=16 is not divisible by num_heads=7"),
        ("training.optimizer.lr=-1", r"^training.optimizer.lr=-1 must be a number > 0"),
        ("training.optimizer.lr=null", r"^training.optimizer.lr=None must be a number > 0"),
        ("data.max_seq_len=0", r"^data.max_seq_len=0 is invalid"),
        ("training.optimizer.weight_decay=-1", r"^training.optimizer.weight_decay=-1 must be"),
        # trained without a word: every step set the weights to 0 (or flipped their sign)
        (
            "training.optimizer.weight_decay=1000",
            r"^training.optimizer.lr=0.001 with weight_decay=1000: AdamW multiplies every "
            r"weight by 1 - lr \* weight_decay = 0 at each step",
        ),
        (
            "training.optimizer.lr=1e3",
            r"^training.optimizer.lr=1000.0 with weight_decay=0.01: .* = -9 at each step",
        ),
        ("training.rerank_top_n=-3", r"^training.rerank_top_n=-3 and rerank_loss_weight"),
        (
            "+training.optimizer.betas=[1.5,0.9]",
            r"^training.optimizer: Invalid beta parameter at index 0: 1.5 .*'betas': \[1.5, 0.9\]",
        ),
        ("+trainer.accumulate_grad_batches=0", r"^trainer.accumulate_grad_batches=0 must be an"),
        ("+trainer.limit_train_batches=0", r"^trainer.limit_train_batches=0: 0 trains nothing"),
        ("+trainer.limit_val_batches=0", r"^trainer.limit_val_batches=0: 0 validates nothing"),
        ("+trainer.limit_val_batches=1.5", r"^trainer.limit_val_batches=1.5: .* \(0, 1\]"),
        ("callbacks.model_checkpoint.mode=min", r"^callbacks.model_checkpoint.mode=min with"),
        ("+callbacks.early_stopping.min_delta=nan", r"^callbacks.early_stopping.min_delta=nan"),
        ("trainer.deterministic=maybe", r"^trainer.deterministic='maybe' must be true, false or"),
        ("trainer.enable_progress_bar=maybe", r"^trainer.enable_progress_bar='maybe' must be true"),
        (
            "callbacks.training_clock.test_curve=maybe",
            r"^callbacks.training_clock.test_curve='maybe' must be true or false",
        ),
        ("training.loss=gbce training.gbce_t=5", r"^training.gbce_t=5 must lie in \[0, 1\]"),
        ("training.negative_sampler=foo", r"^training.negative_sampler='foo' is not supported"),
        ("training.sampled_metrics={sampler:foo}", r"^training.sampled_metrics.sampler='foo'"),
        ("data.time_buckets.reference=target", r"^data.time_buckets.reference=target gives"),
        (
            "model=atrank_faithful model.causal=true training.objective=retrieval"
            " data.loader.train_samples=windows",
            r"^data.time_buckets.reference=target gives",
        ),
        # refused only after the data was prepared, or not at all, or by a raw error
        ("data.loader.train_samples=prefix", r"^data.loader.train_samples='prefix' is not supp"),
        ("+data.loader.batchsize=32", r"^unknown data.loader option\(s\) \['batchsize'\]"),
        (
            "training.contrastive_weight=0.1 training.contrastive_positive=same_target",
            r"need data.loader.train_samples=prefixes, got 'windows'",
        ),
        # trained with a contrastive loss of 0 at every step: one position per batch, no negative
        (
            "training.contrastive_weight=0.1 data.loader.batch_size=1"
            " data.loader.train_samples=prefixes",
            r"^training.contrastive_weight=0.1 contrasts .* data.loader.batch_size=1 .* one "
            r"position per batch",
        ),
        (
            "model.causal=false training.contrastive_weight=0.1 data.loader.batch_size=1",
            r"^training.contrastive_weight=0.1 contrasts .* model.causal=false",
        ),
        ("+data.min_user_event=3", r"^unknown data option\(s\) \['min_user_event'\]"),
        ("data.behaviors=[]", r"behaviors is empty"),
        ("data.behaviors=null", r"^data.behaviors=None must be a list of names"),
        ("data.split.target_behaviors=[]", r"^data.split.target_behaviors=\[\] names no behav"),
        ("data.time_buckets.unit_seconds=inf", r"^data.time_buckets.unit_seconds=inf must be a"),
        ("trainer.precision=33", r"^trainer.precision=33: recsys trains in float32"),
        # accepted before, then a dtype error after the data was prepared
        ("trainer.precision=64-true", r"^trainer.precision=64-true: .* is not supported$"),
        ("trainer.precision=bf16-true", r"^trainer.precision=bf16-true: .* is not supported$"),
        # on the CPU Lightning trained in bf16-mixed, and the run recorded 16-mixed
        (
            "trainer.precision=16-mixed trainer.accelerator=cpu",
            r"^trainer.precision=16-mixed: float16 mixed precision needs a GPU",
        ),
        (
            "trainer.precision=16 trainer.accelerator=cpu",
            r"^trainer.precision=16: .* use trainer.precision=bf16-mixed, or 32-true$",
        ),
        # Lightning's second process found the run folder held by the first
        ("trainer.devices=2", r"^trainer.devices=2: recsys trains on one device"),
        # trained every epoch, then "training produced no checkpoint"
        (
            "trainer.check_val_every_n_epoch=3 trainer.max_epochs=2",
            r"^trainer.check_val_every_n_epoch=3 with trainer.max_epochs=2: no validation",
        ),
        ("+trainer.max_steps=0", r"^trainer.max_steps=0 trains nothing"),
        ("callbacks.model_checkpoint=null", r"^callbacks.model_checkpoint is not set: it keeps"),
        # an average that never leaves the initial weights: the untrained model selected
        (
            "callbacks.weight_averaging={_target_:pytorch_lightning.callbacks.EMAWeightAveraging"
            ",decay:1.0}",
            r"^callbacks.weight_averaging.decay=1.0 must lie strictly between 0 and 1",
        ),
        ("+trainer.max_epoch=3", r"^trainer: .*unexpected keyword argument 'max_epoch'"),
        ("callbacks.model_checkpoint.mode=maximum", r"^callbacks.model_checkpoint: `mode` can"),
        ("trainer.gradient_clip_val=-1", r"^trainer.gradient_clip_val=-1 must be a number >= 0"),
        ("trainer.gradient_clip_val=nan", r"^trainer.gradient_clip_val=nan must be a finite"),
        (
            "trainer.check_val_every_n_epoch=0",
            r"^trainer.check_val_every_n_epoch=0 must be an integer >= 1",
        ),
        (
            "training.metric_ks=[5,20]",
            r"monitor='val/ndcg_at_10' is not a metric this run logs: its cutoff 10 is not",
        ),
        ("training.metric_ks=10", r"^training.metric_ks=10 must be a list of positive whole"),
        ("training.metric_ks=[a]", r"^training.metric_ks=\['a'\] must be a list"),
        ("training.rerank_top_n=abc", r"^training.rerank_top_n='abc' and rerank_loss_weight"),
        ("training.rerank_loss_weight=nan", r"^training.rerank_top_n=20 and rerank_loss_weight=n"),
        ("training.shared_negatives=maybe", r"^training.shared_negatives='maybe' must be true"),
        ("+training.behavior_weights={view:nan}", r"^training.behavior_weights=\{'view': nan\}"),
        ("+training.behavior_weights={view:abc}", r"^training.behavior_weights=\{'view': 'abc'"),
        # a list: an error of OmegaConf's ("ListConfig does not support attribute access");
        # one name: "names ['a', 'c', 'e', 'h', ...]", the letters of purchase
        (
            "+training.behavior_weights=[purchase]",
            r"^training.behavior_weights=\['purchase'\] must be a mapping of behaviours to "
            r"weights, e.g. \{purchase: 1.0, cart: 0.3\}",
        ),
        ("+training.behavior_weights=purchase", r"^training.behavior_weights='purchase' must be"),
        ("model.ffn_multiplier=nan", r"^model.ffn_multiplier=nan gives a feed-forward width"),
        # settings of the learned position table, trained without effect on another encoding
        ("model.position_std=0.02", r"^model.position_std=0.02 sets the learned position table"),
        (
            "model=atrank_faithful model.position_std=0.02",
            r"^model.position_std=0.02 .* model.positional='none'",
        ),
        (
            "model=atrank_faithful model.position_origin=first",
            r"^model.position_origin='first' sets where positions count from, .*'none'",
        ),
        # a window of one event has one frequency: no c filters it (the advice was "at most 0")
        (
            "model.filter_mix=0.7 data.max_seq_len=1",
            r"^model.filter_mix=0.7 needs windows of at least 2 events: .* max_seq_len=1 ",
        ),
        ("+model.dropuot=0.1", r"^model.dropuot is not an option of recsys.model.atrank.ATRank"),
        ("+training.dropuot=0.1", r"^training.dropuot is not an option of recsys.training"),
        # a teacher given as the whole setting: named, not an AttributeError on str.get
        ("training.distillation=teacher.ckpt", r"^training.distillation='teacher.ckpt' must be"),
        ("training.distillation=true", r"^training.distillation=True must be null or a mapping"),
        ("training.optimizer=null", r"^training.optimizer=null must be a partial"),
        # a bound on the catalogue: not the trial build's placeholder size
        (
            "training.loss=sampled_softmax training.num_negatives=-3",
            r"^training.num_negatives=-3 must be an integer in \[1, the catalogue's size - 1\] "
            r"\(its size is known once prepared\)$",
        ),
        (
            "training.sampled_metrics={num_negatives:0}",
            r"num_negatives=0 must be an integer in \[1, the catalogue's size - 1\]$",
        ),
        ("training.scheduler=5", r"^training.scheduler=5 must be a partial .* or null for none"),
        (
            "training.scheduler={_target_:torch.optim.lr_scheduler.StepLR,_partial_:true,step_size:0}",
            r"^training.scheduler fails on its first steps \(ZeroDivisionError",
        ),
    ],
)
def test_model_and_training_settings_are_refused_before_preparing(
    make_config, monkeypatch, override, message
):
    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the settings were checked")

    monkeypatch.setattr(prepare, "run", no_preparing)
    cfg = make_config("config", ["experiment=tiny", "logger=none", *override.split()])
    with pytest.raises(ValueError, match=message):
        train.run(cfg)


def test_a_metric_added_to_ranking_metrics_is_monitored_as_higher_is_better(
    make_config, monkeypatch
):
    """The mode=min refusal read a list of metric-name prefixes of its own, in tasks/train.py,
    which a metric added to ``ranking_metrics`` was not in: it now asks ``ranking_metrics``."""
    from recsys.training import metrics

    ranking_metrics = metrics.ranking_metrics

    def with_precision(ranks, ks):
        out = ranking_metrics(ranks, ks)
        return {**out, **{f"precision_at_{k}": out[f"hr_at_{k}"] / k for k in ks}}

    monkeypatch.setattr(metrics, "ranking_metrics", with_precision)
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared before the check"))
    for monitor in ("val/precision_at_10", "val/retrieval_precision_at_10"):
        overrides = [f"callbacks.model_checkpoint.monitor={monitor}"]
        cfg = make_config("config", ["experiment=tiny", "logger=none", *overrides])
        cfg.callbacks.model_checkpoint.mode = "min"
        with pytest.raises(ValueError, match=f"mode=min with monitor='{monitor}': higher is"):
            train.run(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=sasrec"],
        ["model=atrank_faithful"],
        ["training.loss=gbce", "training.num_negatives=256"],
        ["training.loss=sampled_softmax", "training.negative_sampler=popularity"],
        # the last position trained, or no time read: gaps to the target's time leak nothing
        ["data.time_buckets.reference=target", "data.loader.train_samples=prefixes"],
        ["data.time_buckets.reference=target", "model=sasrec"],
        ["model=atrank_faithful", "model.causal=true"],  # target_attention: the last position
        [
            "training.scheduler={_target_:recsys.training.schedules.warmup_cosine,"
            "_partial_:true,epochs:5,warmup_epochs:1}"
        ],
        [
            "training.scheduler={_target_:torch.optim.lr_scheduler.StepLR,_partial_:true,step_size:2}"
        ],
    ],
)
def test_the_trial_build_takes_the_shipped_settings(make_config, overrides):
    """No false refusal: the presets and losses pass the trial build (its catalogue of
    TRIAL_ITEMS items is larger than any bound a setting has on it)."""
    train.check_model_settings(make_config("config", ["experiment=tiny", *overrides]))


def test_a_model_too_large_for_memory_names_the_window(make_config, monkeypatch):
    """An absurd window: the position table cannot be allocated (1e15 rows, past any address
    space), refused as a MemoryError naming data.max_seq_len, before the data is prepared."""
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared first"))
    cfg = make_config(
        "config", ["experiment=tiny", "logger=none", "data.max_seq_len=1000000000000000"]
    )
    with pytest.raises(MemoryError, match=r"does not fit in memory with data.max_seq_len=10+ \("):
        train.run(cfg)


def test_the_prepare_pipeline_writes_into_data_prepared_dir(make_config, tmp_path):
    """``pipelines.prepare data.prepared_dir=<folder>`` prepares into that folder (it was
    ignored: the data went to the run folder), the folder a training then reuses."""
    folder = tmp_path / "shared" / "prepared"
    cfg = make_config("config", ["experiment=tiny", f"data.prepared_dir={folder}"])
    assert prepare.run(cfg) == folder
    assert (folder / "stats.json").is_file()
    assert not (Path(cfg.paths.run_dir) / "prepared").exists()
    assert prepare.prepared(cfg) == folder  # the training's reuse finds it as prepared


def test_a_prepared_dir_that_holds_no_prepared_data_is_named_with_the_fix(make_config, tmp_path):
    """``data.prepared_dir=<a folder not prepared yet>`` said only "<folder>/stats.json not
    found: run the prepare step first", naming neither the option nor the command."""
    folder = tmp_path / "not-yet"
    cfg = make_config("config", ["experiment=tiny", "logger=none", f"data.prepared_dir={folder}"])
    fix = f"python -m pipelines.prepare data.prepared_dir={folder}, with this job's data"
    with pytest.raises(FileNotFoundError, match=rf"^data.prepared_dir={folder} holds no") as info:
        train.run(cfg)
    assert fix in str(info.value)


def test_a_reused_prepared_folder_must_match_the_data_settings(make_config, tmp_path):
    """``data.prepared_dir`` with a data override the folder was not prepared with is refused
    (the override would be logged as a run parameter while the folder's settings apply)."""
    folder = prepare.run(make_config("config", ["experiment=tiny"]), tmp_path / "prepared")
    reuse = ["experiment=tiny", f"data.prepared_dir={folder}"]
    assert prepare.prepared(make_config("config", reuse)) == folder
    for override, difference in (
        ("data.split.method=leave_one_out", "data.split.method: prepared 'temporal', config 'le"),
        ("data.behaviors=[view,purchase]", "data.behaviors: prepared ['view', 'click', 'cart'"),
    ):
        with pytest.raises(ValueError, match="was prepared with other data settings") as info:
            train.run(make_config("config", [*reuse, override]))
        assert difference in str(info.value)
    # the fix, as overrides to copy (the settings may be the config's defaults, as for a
    # folder prepared from Python: "drop those overrides" had told such a user nothing)
    assert "give the config the folder's settings (data.behaviors=[" in str(info.value)
    with pytest.raises(ValueError, match=r"folder's settings \(data.split.method=temporal\)"):
        train.run(make_config("config", [*reuse, "data.split.method=leave_one_out"]))


def test_a_reused_prepared_folder_takes_the_configs_time_buckets(make_config, tmp_path):
    """Time buckets are computed from the stored times per batch, so a folder prepared with
    the default buckets serves ``model=atrank_faithful`` (whose preset measures gaps to the
    target) and any ``data.time_buckets``: such a folder was refused, naming as the fix
    ``data.time_buckets.reference=previous``, which is not the faithful model."""
    folder = prepare.run(make_config("config", ["experiment=tiny"]), tmp_path / "prepared")
    reuse = ["experiment=tiny", f"data.prepared_dir={folder}", "model=atrank_faithful"]
    cfg = make_config("config", [*reuse, "data.time_buckets.unit_seconds=86400"])
    assert prepare.prepared(cfg) == folder
    buckets = train.build_datamodule(cfg, folder).time_buckets
    assert buckets == TimeBuckets(unit_seconds=86400, reference="target")


def test_the_overrides_a_refused_prepared_folder_names_make_the_config_reuse_it(
    make_config, tmp_path
):
    """The refusal's overrides, copied onto the command line, must be accepted and make the
    config the folder's: an alias the config lacked was given as
    ``data.behavior_aliases.<raw>=<behaviour>``, which Hydra refuses ("Key ... is not in
    struct"), and a log file's ``data.source`` was left out of them."""
    log = tmp_path / "events.parquet"
    generate_events(num_users=60, num_items=40, num_categories=4, seed=3).write_parquet(log)
    data = [
        "data=events_file",
        f"data.source={log}",
        "data.columns.category=category",
        "data.behaviors=[view,cart,purchase]",
        "data.behavior_aliases={click: view}",
        "data.bad_rows.null_id=drop",
    ]
    folder = prepare.run(make_config("config", data), tmp_path / "prepared")
    for config in (
        ["experiment=tiny"],  # the default data: the training's data overrides forgotten
        [*data, "++data.behavior_aliases.fav=purchase"],  # an alias the folder lacks
    ):
        reuse = [*config, f"data.prepared_dir={folder}"]
        with pytest.raises(ValueError, match="was prepared with other data settings") as info:
            prepare.prepared(make_config("config", reuse))
        fix = re.search(
            r"give the config the folder's settings \((.*)\), or unset", str(info.value)
        )
        assert fix is not None, str(info.value)
        assert prepare.prepared(make_config("config", [*reuse, *fix[1].split()])) == folder


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["retrieval.index=bogus"], r"retrieval.index='bogus': use one of \['exact', 'faiss'\]"),
        (["retrieval.as_of=notadate"], r"retrieval.as_of='notadate' is not an ISO 8601 time"),
        (["retrieval.output.formats=[json]"], r"retrieval.output.formats=\['json'\]: parquet"),
        (
            [
                "data.columns.timestamp=null",
                "data.split.method=leave_one_out",
                "retrieval.as_of=2024-03-01T00:00:00Z",
            ],
            r"retrieval.as_of=2024-03-01T00:00:00Z, but the log is order-only",
        ),
        (["retrieval.rules.allow_list=[]"], r"allow_list is empty, which allows no item"),
        (["retrieval.accelerator=tpu"], r"retrieval.accelerator='tpu': use one of"),
        (
            ["retrieval.index=faiss", "retrieval.faiss.kind=hnws"],
            r"retrieval.faiss.kind='hnws': use one of \['hnsw', 'ivf', 'flat'\]",
        ),
        (
            ["retrieval.index=faiss", "retrieval.faiss.metric=cosine"],
            r"retrieval.faiss.metric='cosine': use one of",
        ),
        (
            ["retrieval.index=faiss", "retrieval.faiss.ef_search=0"],
            r"retrieval.faiss.ef_search=0 must be a positive integer",
        ),
        (["+retrieval.output.overwite=true"], r"retrieval.output has unknown keys \['overwite'\]"),
        (["retrieval.output.overwrite=maybe"], r"retrieval.output.overwrite='maybe' must be true"),
        (["retrieval.output.path=null"], r"retrieval.output.path=None: give the folder"),
        (
            [
                "+training.behavior_weights={cart: 1.0}",
                "data.split.target_behaviors=[cart]",
                "retrieval.rules.target_behavior=purchase",
            ],
            r"target_behavior='purchase', but the model is trained to predict \['cart'\]",
        ),
    ],
)
def test_the_main_job_checks_its_scoring_settings_before_it_trains(
    make_config, monkeypatch, overrides, message
):
    def no_training(*args, **kwargs):
        raise AssertionError("trained before the scoring settings were checked")

    monkeypatch.setattr(train, "run", no_training)
    with pytest.raises(ValueError, match=message):
        main.run(make_config("config", ["experiment=tiny", "logger=none", *overrides]))


def test_the_main_job_refuses_a_read_only_output_folder_before_it_trains(
    make_config, monkeypatch, tmp_path
):
    """A retrieval.output.path on a read-only mount was found out when scoring, after the
    training (hours of it), as "[Errno 30] Read-only file system: '<folder>/.recs.lock'"; it
    is refused before the data is prepared, naming the folder and the setting. (Root writes
    through permission bits, so os.access stands in for a read-only mount here.)"""
    import os

    read_only = tmp_path / "shared"
    read_only.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and Path(p) != read_only)
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared first"))
    cfg = make_config(
        "config", ["experiment=tiny", "logger=none", f"retrieval.output.path={read_only}/recs"]
    )
    with pytest.raises(PermissionError, match=rf"retrieval.output.path={read_only}/recs: "):
        main.run(cfg)


def test_a_reused_prepared_folder_must_come_from_the_configured_source(
    make_config, tmp_path, monkeypatch
):
    folder = prepare.run(make_config("config", ["experiment=tiny"]), tmp_path / "prepared")
    reuse = ["experiment=tiny", f"data.prepared_dir={folder}"]
    with pytest.raises(ValueError, match=r"data.source: prepared 'generate_events\(num_users=150"):
        prepare.prepared(make_config("config", [*reuse, "data.source.num_users=50"]))
    # a log file named by a relative or an absolute path is the same source
    log = tmp_path / "events.parquet"
    generate_events(num_users=60, num_items=40, num_categories=4, seed=3).write_parquet(log)
    file_data = ["data=events_file", "data.split.method=leave_one_out"]
    at = prepare.run(make_config("config", [*file_data, f"data.source={log}"]), tmp_path / "f")
    monkeypatch.chdir(tmp_path)
    relative = [*file_data, "data.source=events.parquet", f"data.prepared_dir={at}"]
    assert prepare.prepared(make_config("config", relative)) == at


def test_a_loader_file_spelt_two_ways_is_the_same_source(make_config, tmp_path):
    """A loader's path argument is compared as a file, as a plain path is: the folder prepared
    from ``read_s3rec(<dir>/raw/../Beauty.txt)`` is reused for ``read_s3rec(<dir>/Beauty.txt)``
    (they were compared as text and the folder refused as "other data settings")."""
    (tmp_path / "raw").mkdir()
    items = [" ".join(str(1 + (user * 7 + i) % 40) for i in range(6)) for user in range(60)]
    lines = [f"{user + 1} {row}" for user, row in enumerate(items)]
    (tmp_path / "Beauty.txt").write_text("\n".join(lines) + "\n")
    data = ["data=amazon_s3rec", "data.items=null"]
    spelt = f"data.source.path={tmp_path / 'raw' / '..' / 'Beauty.txt'}"
    folder = prepare.run(make_config("config", [*data, spelt]), tmp_path / "prepared")
    reuse = [*data, f"data.source.path={tmp_path / 'Beauty.txt'}", f"data.prepared_dir={folder}"]
    assert prepare.prepared(make_config("config", reuse)) == folder
    other = tmp_path / "Other.txt"
    other.write_text((tmp_path / "Beauty.txt").read_text())
    with pytest.raises(ValueError, match=r"data.source: prepared 'read_s3rec\("):
        prepare.prepared(make_config("config", [*data, f"data.source.path={other}", reuse[-1]]))


def test_a_missing_item_table_is_named_as_data_items(make_config, tmp_path):
    """A missing item table was reported as "event log ... check data.source.path"."""
    from recsys.data.io import DataError

    data = ["experiment=tiny", f"+data.items={tmp_path / 'items.csv'}"]
    with pytest.raises(
        DataError, match=r"^item table .*items.csv does not exist: check data.items$"
    ):
        prepare.run(make_config("config", data), tmp_path / "prepared")
    assert not (tmp_path / "prepared").exists()


def favourites_after_training(path: Path) -> None:
    """The tiny experiment's log plus 40 users' favourites, one in the validation and one in
    the test window each (none in the training window), written to ``path``."""
    events = generate_events(num_users=150, num_items=120, num_categories=8, seed=42)
    last = events["timestamp"].max()
    later = events.group_by("user_id").agg(pl.all().last()).head(40)
    favourites = later.with_columns(
        pl.lit("fav").alias("event_type"),
        pl.Series("timestamp", [last] * 40).dt.offset_by("1s"),
    )
    val = favourites.with_columns(pl.col("timestamp").dt.offset_by("-200h"))
    pl.concat([events, val, favourites]).write_parquet(path)


def fav_log(path: Path) -> list[str]:
    return [
        "data=events_file",
        f"data.source={path}",
        "data.columns.category=category",
        "data.behaviors=[view,click,cart,purchase,fav]",
        "trainer.max_epochs=1",
        "model.d_model=16",
        "model.num_layers=1",
    ]


def test_behavior_weights_on_behaviours_no_training_target_has_are_refused(make_config, tmp_path):
    """{fav: 1} where favourites come only after the training window would train nothing
    (loss 0 at every step) and still save a "best" checkpoint."""
    log = tmp_path / "events.parquet"
    favourites_after_training(log)
    weights = [
        *fav_log(log),
        "data.split.target_behaviors=[fav]",
        "+training.behavior_weights={fav: 1.0}",
    ]
    cfg = make_config("config", ["logger=none", *weights])
    with pytest.raises(ValueError, match=r"weighs \['fav'\], but no training target is one of"):
        train.run(cfg)
    assert not list(Path(cfg.paths.run_dir).rglob("*.ckpt"))


def test_a_weighted_behaviour_no_training_target_has_is_named_beside_others(
    make_config, tmp_path, monkeypatch, caplog
):
    """{fav: 1, purchase: 1} where favourites come only after the training window trained
    purchases alone, without a word, while favourites were validation and test targets."""
    log = tmp_path / "events.parquet"
    favourites_after_training(log)
    overrides = [
        *fav_log(log),
        "data.split.target_behaviors=[fav,purchase]",
        "+training.behavior_weights={fav: 1.0, purchase: 1.0}",
    ]

    class Checked(Exception):
        pass

    def checked(*args, **kwargs):
        raise Checked

    monkeypatch.setattr(train, "build_encoder", checked)  # the check comes before it
    with caplog.at_level("WARNING", logger="recsys.tasks.train"), pytest.raises(Checked):
        train.run(make_config("config", ["logger=none", *overrides]))
    assert (
        "training.behavior_weights weighs ['fav'], which no training target is: its weight "
        "trains nothing (the training window's targets are ['cart', 'click', 'purchase', 'view'])"
    ) in caplog.text


def test_a_reused_prepared_folder_must_have_the_configured_item_table(make_config, tmp_path):
    """The item side table is data too: a folder prepared with one (or none) is refused for a
    config naming another, or other columns of it (its attributes would not be the ones the
    run logs)."""
    events = generate_events(num_users=60, num_items=40, num_categories=4, seed=3)
    log, table = tmp_path / "events.parquet", tmp_path / "items.parquet"
    events.write_parquet(log)
    events.select("item_id", "category").unique("item_id").write_parquet(table)
    other = tmp_path / "other_items.parquet"
    events.select("item_id", pl.col("category").alias("genre")).unique("item_id").write_parquet(
        other
    )
    data = ["data=events_file", "data.split.method=leave_one_out", f"data.source={log}"]
    with_items = [
        *data,
        f"+data.items={table}",
        "data.item_columns.category=category",
        "data.item_columns.attributes=null",
    ]
    folder = prepare.run(make_config("config", with_items), tmp_path / "prepared")
    reuse = [f"data.prepared_dir={folder}"]
    assert prepare.prepared(make_config("config", [*with_items, *reuse])) == folder
    for overrides, difference in (
        (data, f"data.items: prepared '{table}', config None"),
        (
            [
                *data,
                f"+data.items={other}",
                "data.item_columns.category=genre",
                "data.item_columns.attributes=null",
            ],
            f"data.item_columns.category: prepared 'category', config 'genre'; data.items: "
            f"prepared '{table}', config '{other}'",
        ),
    ):
        with pytest.raises(ValueError, match="was prepared with other data settings") as info:
            prepare.prepared(make_config("config", [*overrides, *reuse]))
        assert difference in str(info.value)
    plain = prepare.run(make_config("config", data), tmp_path / "plain")
    with pytest.raises(ValueError, match=r"data.items: prepared None, config '.*items.parquet'"):
        prepare.prepared(make_config("config", [*with_items, f"data.prepared_dir={plain}"]))


@pytest.mark.parametrize(
    ("config_name", "overrides", "task", "message"),
    [
        ("config", ["data=events_file"], "main", r"^data.source not set: give data.source=<"),
        ("config", ["data=events_file"], "train", r"^data.source not set"),
        ("config", ["data=taobao"], "prepare", r"^data.source.path not set: give data.source"),
        ("score", [], "score", r"^model= not set: give model=<checkpoint path \| MLflow run id"),
        ("evaluate", [], "evaluate", r"^model= not set: give model=<checkpoint path"),
    ],
)
def test_unset_mandatory_values_are_named_before_any_work(
    make_config, monkeypatch, config_name, overrides, task, message
):
    """A ``???`` left unset (data=events_file without data.source, pipelines.score without
    model=) is refused by name, with how to give it, before a tracking run opens or the data
    is prepared, not as OmegaConf's MissingMandatoryValue midway."""
    from recsys import tracking
    from recsys.tasks import evaluate, score

    def no_tracking(*args, **kwargs):
        raise AssertionError("a tracking run was opened before the config was checked")

    monkeypatch.setattr(tracking.Tracker, "__init__", no_tracking)
    cfg = make_config(config_name, overrides)
    run = {"main": main, "train": train, "prepare": prepare, "score": score, "evaluate": evaluate}
    with pytest.raises(ValueError, match=message):
        run[task].run(cfg)


@pytest.mark.parametrize("value", ["no", "off", "1", "'false'"])
def test_other_data_that_is_not_true_or_false_is_refused_before_the_model_loads(
    make_config, monkeypatch, value
):
    """``other_data=no`` (a text, not Hydra's false) counted as true: a model trained on another
    log was evaluated on this one instead of being refused as another vocabulary."""
    from recsys.tasks import evaluate

    monkeypatch.setattr(evaluate, "load_model", lambda *a: pytest.fail("loaded before checking"))
    cfg = make_config("evaluate", ["logger=none", "model_ref=m.ckpt", f"other_data={value}"])
    with pytest.raises(ValueError, match=r"^other_data='?\w+'? must be true or false$"):
        evaluate.run(cfg)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.loader.batch_size=0", r"^data.loader.batch_size=0 must be a whole number >= 1"),
        ("data.loader.eval_batch_size=-1", r"^data.loader.eval_batch_size=-1 must be a whole"),
        ("data.loader.num_workers=-1", r"^data.loader.num_workers=-1 must be a whole number >= 0"),
        ("data.loader.batch_size=2.5", r"^data.loader.batch_size=2.5 must be a whole number"),
        ("data.loader.width_multiple=0", r"^data.loader.width_multiple=0 must be auto or a whole"),
        ("data.loader.width_multiple=1000", r"^data.loader.width_multiple=1000 must be auto or"),
        ("data.loader.width_multiple=gpu", r"^data.loader.width_multiple='gpu' must be auto or"),
    ],
)
def test_loader_sizes_are_refused_by_their_key_before_preparing(
    make_config, monkeypatch, override, message
):
    """data.loader's batch sizes and workers are checked before the data is prepared (they
    were refused only when the first loader was built, eval_batch_size as "batch_size")."""

    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the settings were checked")

    monkeypatch.setattr(prepare, "run", no_preparing)
    cfg = make_config("config", ["experiment=tiny", "logger=none", override])
    with pytest.raises(ValueError, match=message):
        train.run(cfg)


def test_a_checkpoint_callback_that_keeps_none_is_refused_before_preparing(
    make_config, monkeypatch
):
    """callbacks.model_checkpoint.save_top_k=0 trained every epoch, then failed with "training
    produced no checkpoint: keep callbacks.model_checkpoint" (which was kept)."""

    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the settings were checked")

    monkeypatch.setattr(prepare, "run", no_preparing)
    overrides = ["experiment=tiny", "logger=none", "callbacks.model_checkpoint.save_top_k=0"]
    with pytest.raises(ValueError, match=r"^callbacks.model_checkpoint.save_top_k=0 keeps no"):
        train.run(make_config("config", overrides))


def test_a_gpu_trainer_on_a_machine_without_one_is_refused_before_preparing(
    make_config, monkeypatch
):
    """trainer=gpu where there is no CUDA device: refused by its key before the data is
    prepared, not by Lightning's Trainer once the data is ready."""
    import torch

    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the settings were checked")

    monkeypatch.setattr(prepare, "run", no_preparing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = make_config("config", ["experiment=tiny", "logger=none", "trainer=gpu"])
    with pytest.raises(ValueError, match=r"^trainer.accelerator=gpu: this machine has no CUDA"):
        train.run(cfg)


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ("init_from=missing.ckpt", FileNotFoundError, r"^init_from='missing.ckpt': no such"),
        (
            "training.distillation={teachers:[missing.ckpt]}",
            FileNotFoundError,
            r"^training.distillation.teachers='missing.ckpt': no such checkpoint",
        ),
        (
            "training.distillation={teachers:[recs@champion]}",
            ValueError,
            r"^training.distillation.teachers='recs@champion' names an MLflow .* tracking is off",
        ),
    ],
)
def test_a_reference_to_no_model_is_refused_before_preparing(
    make_config, monkeypatch, override, error, message
):
    """init_from and the distillation teachers are loaded before the data is prepared (as
    evaluate and score load their model first): a misspelt path or a registry name without
    tracking was refused only once the data had been prepared."""

    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the references were loaded")

    monkeypatch.setattr(prepare, "run", no_preparing)
    cfg = make_config("config", ["experiment=tiny", "logger=none", override])
    with pytest.raises(error, match=message):
        train.run(cfg)


def test_a_reference_is_tagged_with_the_model_it_named():
    """name@alias moves: the run records which version and run the alias named when it
    started (init_from's and each teacher's), not only the reference as given."""
    found = {"model.uri": "recs@champion", "model.version": "7", "model.run_id": "abc"}
    reference = train.Reference("recs@champion", model=None, tags=found)
    assert reference.run_tags("train.teacher.0") == {
        "train.teacher.0": "recs@champion",
        "train.teacher.0.uri": "recs@champion",
        "train.teacher.0.version": "7",
        "train.teacher.0.run_id": "abc",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["logger.model_alias=champion"], r"^logger.model_alias=champion .*\.registered_model_n"),
        (["logger.registered_model_name=a/b"], r"^logger.registered_model_name='a/b' must be"),
        (["logger.registered_model_name=a@b"], r"^logger.registered_model_name='a@b' must be"),
        # names MLflow reads as paths: refused only when registering, after the scoring
        (["logger.registered_model_name=.."], r"^logger.registered_model_name='..' must be"),
        (["logger.registered_model_name=."], r"^logger.registered_model_name='.' must be"),
        (["logger.registered_model_name=..recs"], r"'..recs' must be a non-empty name"),
        (["logger.registered_model_name=m", "logger.model_alias=v2"], r"'v2' is not an alias"),
        (["logger.registered_model_name=m", "logger.model_alias=latest"], r"'latest' is not an"),
        (["logger.registered_model_name=m", "logger.model_alias='to prod'"], r"'to prod' is not"),
        (["logger=none", "+logger.registered_model_name=m"], r"tracking is off \(logger=none\)"),
    ],
)
def test_registry_settings_mlflow_would_refuse_after_training_are_refused_first(
    make_config, monkeypatch, overrides, message
):
    """A model alias without a model name was ignored; a name or alias MLflow refuses (a '/',
    a reserved alias) failed only at registration, after the whole training."""
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared before checking"))
    logger = [] if overrides[0].startswith("logger=") else ["logger=mlflow"]
    with pytest.raises(ValueError, match=message):
        train.run(make_config("config", ["experiment=tiny", *logger, *overrides]))


@pytest.mark.parametrize(
    ("config", "override", "meant"),
    [
        ("config", "+trainig.seen_items=zero", "training"),
        ("config", "+max_epochs=3", "trainer.max_epochs"),
        ("config", "+seeds=3", "seed"),
        ("score", "+top_k=5", "retrieval.top_k"),
        ("evaluate", "+user=u.csv", "users"),
    ],
)
def test_a_top_level_key_added_by_mistake_is_refused_naming_the_one_meant(
    make_config, config, override, meant
):
    """A misspelt group or a key without its group, added with +, was accepted and read by
    nothing: the job ran without the setting."""
    from recsys.config import check_required

    key = override[1:].split("=")[0].split(".")[0]
    with pytest.raises(ValueError, match=rf"^{key} is not a top-level config key.*mean {meant}\?"):
        check_required(make_config(config, ["logger=none", override]), model_given=True)


@pytest.mark.parametrize("config", ["config", "score", "evaluate"])
@pytest.mark.parametrize("logger", ["logger=mlflow", "logger=none"])
def test_a_misspelt_logger_key_is_refused_before_any_work(make_config, config, logger):
    """``+logger.experiment=x`` (for ``experiment_name``) was ignored with tracking off; with it
    on, a training prepared its data and a scoring wrote its output before the run opened and
    failed on ``Tracker.__init__() got an unexpected keyword argument 'experiment'``."""
    from recsys.config import check_required

    cfg = make_config(config, [logger, "+logger.experiment=x"])
    with pytest.raises(ValueError, match=r"^logger has unknown keys \['experiment'\]; allowed: "):
        check_required(cfg, model_given=True)


def test_a_training_with_a_misspelt_logger_key_prepares_nothing(make_config, monkeypatch):
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared before checking"))
    cfg = make_config("config", ["experiment=tiny", "+logger.registered_model=recsys"])
    with pytest.raises(ValueError, match=r"unknown keys \['registered_model'\]"):
        train.run(cfg)


def test_a_top_level_key_of_the_users_own_passes(make_config):
    """A new key far from recsys' names (kept for an interpolation) is not refused."""
    from recsys.config import check_required

    check_required(make_config("config", ["+dataset_root=/srv/logs"]))


@pytest.mark.parametrize(("config", "suffix"), [("config", ""), ("score", "_score")])
def test_compose_gives_the_run_folder_the_command_line_would(tmp_path, config, suffix):
    """recsys.config.compose without paths.run_dir failed in the task with Hydra's
    "HydraConfig was not set" (``${hydra:runtime.output_dir}``): it now names the dated folder
    the command line's job would get, and creates nothing."""
    import re

    from omegaconf import OmegaConf

    from recsys.config import compose

    out = tmp_path / "outputs"
    model = ["model=x"] if config == "score" else []  # (a score job's model: not loaded)
    cfg = compose(config, ["logger=none", f"paths.output_dir={out}", *model])
    plain = OmegaConf.to_container(cfg, resolve=True)  # every value resolves
    assert re.fullmatch(
        rf"{out}/runs/\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{{6}}{suffix}", plain["paths"]["run_dir"]
    )
    assert "hydra" not in plain and not out.exists()
    assert compose(config, [f"paths.run_dir={tmp_path / 'mine'}"]).paths.run_dir == str(
        tmp_path / "mine"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=atrank_faithful"], 100),  # evaluation re-ranks its top 100: scoring too
        (["model=atrank_faithful", "retrieval.rerank_top_n=30"], 30),  # a depth given: kept
        ([], 0),  # no head trained: retrieval alone
    ],
)
def test_the_main_job_scores_as_deep_as_it_evaluates(make_config, overrides, expected):
    """model=atrank_faithful's headline test metrics re-ranked the top 100, while its
    recommendations were retrieval-only (a lower test NDCG@10 than the one printed)."""
    from recsys.tasks import main

    cfg = make_config("config", ["logger=none", *overrides])
    main.follow_trained_rerank(cfg)
    assert cfg.retrieval.rerank_top_n == expected


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.split.target_behaviors=[purchase]"], "purchase"),  # next purchase: its fallback
        (
            ["data.split.target_behaviors=[purchase]", "retrieval.rules.target_behavior=cart"],
            "cart",
        ),
        (["data.split.target_behaviors=[cart,purchase]"], None),  # two: neither chosen
        ([], None),
    ],
)
def test_the_main_job_scores_for_the_behaviour_it_evaluates(make_config, overrides, expected):
    """A main job evaluated on next purchases wrote recommendations whose cold-start fallback
    counted every behaviour's events (the most viewed items): its scoring now ranks for the
    one behaviour the split evaluates, unless retrieval.rules.target_behavior says otherwise."""
    from recsys.tasks import main

    cfg = make_config("config", ["logger=none", *overrides])
    main.follow_evaluated_target(cfg)
    assert cfg.retrieval.rules.target_behavior == expected


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["training.objective=target_attention", "training.loss=bce"], True),
        (["model=atrank_faithful"], False),  # prefixes: every training event is a row's target
        (["model=atrank_faithful", "data.loader.train_samples=windows"], True),
        ([], False),
    ],
)
def test_target_attention_over_windows_is_named_as_training_one_target_per_window(
    make_config, caplog, overrides, warned
):
    """The target-attention objective trains each row's last position: over windows, the
    other T-1 targets went unused without a word (an audit's finding, with model.causal=true
    on the faithful preset, which the README lists as an ablation)."""
    with caplog.at_level("WARNING", logger="recsys.tasks.train"):
        train.check_settings(make_config("config", ["experiment=tiny", *overrides]))
    assert ("trains the last position of each row only" in caplog.text) == warned


@pytest.mark.parametrize("damage", ["cut in half", "empty", "text"])
def test_a_damaged_last_checkpoint_is_named_before_resuming(make_config, tmp_path, damage):
    """A last.ckpt cut short (a full disk, a killed copy) raised a bare ``OSError: [Errno 22]
    Invalid argument`` naming no file; an empty or text one torch's advice to save it with
    ``_use_new_zipfile_serialization=True``. Both now name the file and what to do."""
    import torch

    cfg = make_config("config", ["experiment=tiny", "resume=last"])
    last = Path(cfg.callbacks.last_checkpoint.dirpath) / "last.ckpt"
    last.parent.mkdir(parents=True)
    # (torch 2.13 fails on this one cut in half with OSError, on a smaller one RuntimeError)
    torch.save({"recsys": {}, "state_dict": {"w": torch.zeros(1000), "v": torch.ones(1000)}}, last)
    whole = last.read_bytes()
    last.write_bytes(
        {"cut in half": whole[: len(whole) // 2], "empty": b"", "text": b"x\n"}[damage]
    )
    with pytest.raises(ValueError, match="could not be read as a training checkpoint") as info:
        train.resumed_run_id(cfg)
    message = str(info.value)
    assert str(last) in message and "train afresh into a new folder" in message
    assert "_use_new_zipfile_serialization" not in message


def test_a_damaged_init_from_checkpoint_names_init_from(make_config, tmp_path, monkeypatch):
    """A damaged checkpoint named by init_from (or a teacher) said "point model= at ...", a key
    the train pipeline does not have."""

    def no_preparing(*args, **kwargs):
        raise AssertionError("the data was prepared before the references were loaded")

    monkeypatch.setattr(prepare, "run", no_preparing)
    empty = tmp_path / "best.ckpt"
    empty.write_bytes(b"")
    cfg = make_config("config", ["experiment=tiny", "logger=none", f"init_from={empty}"])
    with pytest.raises(ValueError, match="an empty file") as info:
        train.run(cfg)
    assert "point init_from= at" in str(info.value) and "model=" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ([], None),  # the defaults
        (["training.num_negatives=64"], "training.num_negatives=64"),
        (["training.negative_sampler=popularity"], "training.negative_sampler='popularity'"),
        (["training.gbce_t=0.5", "training.loss=bce"], "training.gbce_t=0.5"),
        (["training.gbce_t=0.5", "training.loss=gbce"], None),
        (["training.num_negatives=64", "training.loss=sampled_softmax"], None),
        (["model=atrank_faithful"], None),  # target attention draws its one negative
    ],
)
def test_negative_settings_a_loss_does_not_use_are_named(make_config, caplog, overrides, warned):
    """training.num_negatives=64 under the default full softmax changed nothing, silently: a
    sweep over negative counts with loss=full_softmax trained the same model N times."""
    with caplog.at_level("WARNING", logger="recsys.tasks.train"):
        train.check_settings(make_config("config", ["experiment=tiny", *overrides]))
    idle = [
        r.getMessage() for r in caplog.records if "no effect with training.loss" in r.getMessage()
    ]
    if warned is None:
        assert idle == []
    else:
        (message,) = idle
        assert message.startswith(warned + ": no effect with training.loss=")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (  # every behaviour a target, purchases and carts trained
            ["+training.behavior_weights={purchase: 1.0, cart: 0.3}"],
            r"^data.split.target_behaviors=null makes \['view', 'click'\] validation and test "
            r"targets, but training.behavior_weights=.* trains the model to predict only "
            r"\['cart', 'purchase'\]: .* set data.split.target_behaviors=\[cart, purchase\]",
        ),
        (
            ["data.split.target_behaviors=[purchase]", "+training.behavior_weights={cart: 1}"],
            r"^data.split.target_behaviors=\[purchase\] makes \['purchase'\] validation and .* "
            r"set data.split.target_behaviors=\[cart\]",
        ),
    ],
)
def test_targets_of_behaviours_the_model_is_not_trained_for_are_refused_before_training(
    make_config, monkeypatch, overrides, message
):
    """``training.behavior_weights={purchase: 1}`` without ``data.split.target_behaviors``
    validated (and selected the checkpoint) on the next event of any behaviour, mostly views
    the model never learns to predict."""
    monkeypatch.setattr(prepare, "run", lambda *a, **k: pytest.fail("prepared before checking"))
    cfg = make_config("config", ["experiment=tiny", "logger=none", *overrides])
    with pytest.raises(ValueError, match=message):
        main.run(cfg)


def test_targets_among_the_trained_behaviours_are_accepted(make_config):
    for overrides in (
        ["data.split.target_behaviors=[purchase]", "+training.behavior_weights={purchase: 1}"],
        ["data.split.target_behaviors=[purchase]"],  # every behaviour trained
        ["+training.behavior_weights={view: 1, click: 1, cart: 1, purchase: 0.5}"],
    ):
        train.check_config(make_config("config", ["experiment=tiny", "logger=none", *overrides]))


def test_evaluating_a_model_on_targets_it_was_not_trained_for_is_refused(
    make_config, monkeypatch, tmp_path
):
    """A checkpoint trained for purchases (``training.behavior_weights={purchase: 1}``) was
    evaluated by ``pipelines.evaluate`` on the next event of every behaviour when the command
    did not repeat ``data.split.target_behaviors``, without a word."""
    from types import SimpleNamespace

    from recsys.data.sequences import TimeBuckets
    from recsys.schema import EventSchema
    from recsys.tasks import evaluate

    model = SimpleNamespace(  # what evaluation reads of a model before the data is prepared
        encoder=None,
        schema=EventSchema(),
        max_seq_len=20,
        time_buckets=TimeBuckets(),
        target_behaviors=("purchase",),
        vocab=SimpleNamespace(behaviors=("view", "click", "cart", "purchase")),
        data_settings=None,  # (a checkpoint that records none)
    )

    monkeypatch.setattr(evaluate, "load_model", lambda ref, logger: (model, {}))
    monkeypatch.setattr(evaluate, "_evaluation_module", lambda *a, **k: None)
    monkeypatch.setattr(prepare, "prepared", lambda *a, **k: pytest.fail("prepared"))
    settings = ["+experiment=tiny", "logger=none", f"model_ref={tmp_path / 'best.ckpt'}"]
    with pytest.raises(
        ValueError,
        match=r"^data.split.target_behaviors=null makes \['view', 'click', 'cart'\] test "
        r"targets, but model=.*best.ckpt was trained \(by its training.behavior_weights\) to "
        r"predict only \['purchase'\]: .* set "
        r"data.split.target_behaviors=\[purchase\]",
    ):
        evaluate.run(make_config("evaluate", settings))
    # the behaviour it was trained for is evaluated as before (here: up to preparing)
    with pytest.raises(pytest.fail.Exception, match="prepared"):
        evaluate.run(make_config("evaluate", [*settings, "data.split.target_behaviors=[purchase]"]))


def test_faiss_settings_with_the_exact_index_are_named_as_ignored(make_config, caplog):
    """``retrieval.faiss.nprobe=64`` without ``retrieval.index=faiss`` tuned nothing, silently;
    the scoring settings' check names it and the fix. The default config warns of nothing."""
    from recsys.tasks import score

    def warnings(overrides):
        caplog.clear()
        cfg = make_config("config", ["experiment=tiny", "logger=none", *overrides])
        score.check_options(cfg.retrieval, ["click"])
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    assert warnings([]) == []
    (message,) = warnings(["retrieval.faiss.nprobe=64", "retrieval.faiss.kind=ivf"])
    assert message.startswith(
        "retrieval.faiss.kind='ivf', retrieval.faiss.nprobe=64 ignored: retrieval.index=exact"
    )
    assert "set retrieval.index=faiss" in message


def test_init_from_and_teacher_references_are_checked_without_fetching(
    make_config, tmp_path, monkeypatch
):
    """``train.check_references`` (a ``-m`` sweep's check of every job before the first):
    a missing checkpoint, a file that is no checkpoint, an unknown run id or registered name
    are refused as the training would refuse them; a run the store holds is found without
    copying its model out of the store."""
    from recsys import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tracking.Tracker(tracking_uri=uri, experiment_name="t")
    run.finish()
    monkeypatch.setattr(tracking, "_download_checkpoint", lambda *a: pytest.fail("fetched"))
    tracked = ["experiment=tiny", "logger=mlflow", f"logger.tracking_uri={uri}"]
    not_a_checkpoint = tmp_path / "notes.ckpt"
    not_a_checkpoint.write_text("not weights")
    train.check_references(make_config("config", [*tracked, f"init_from={run.run_id}"]))
    for overrides, error, message in [
        ([f"init_from={tmp_path}/nope.ckpt"], FileNotFoundError, r"init_from='.*nope.ckpt': no"),
        ([f"init_from={not_a_checkpoint}"], ValueError, r"notes.ckpt is not a recsys checkpoint"),
        (["init_from=0123abcd"], ValueError, r"init_from='0123abcd': no MLflow run with that id"),
        (
            ["training.distillation={teachers: ['ranker@prod']}"],
            ValueError,
            r"training.distillation.teachers='ranker@prod': not found in the MLflow model",
        ),
    ]:
        with pytest.raises(error, match=message):
            train.check_references(make_config("config", [*tracked, *overrides]))


def test_a_training_step_larger_than_the_memory_left_is_refused_before_it_trains(
    make_config, monkeypatch
):
    """At a large catalogue the full softmax's (positions x items) scores, kept for the backward
    pass, need tens of GiB (1 M items, the default batch: 24 GiB): such a training was killed
    by the out-of-memory killer at its first step, with nothing in its log, or failed with a
    bare "DefaultCPUAllocator: can't allocate memory" under a limit. It is refused once the
    catalogue is known, before a run opens or a step is taken, naming the estimate and the
    fixes (here the tiny preset against a machine with 1 MiB left)."""
    monkeypatch.setattr(train, "available_memory", lambda device: (2**20, "a test's limit"))
    cfg = make_config("config", ["experiment=tiny", "logger=none", "training.rerank_top_n=0"])
    with pytest.raises(MemoryError) as info:
        train.run(cfg)
    message = str(info.value)
    assert re.match(
        r"one training step needs at least [\d.]+ MiB on the CPU \(parameters, gradients and "
        r"optimiser state [\d.]+ MiB, scores over the catalogue kept for the backward pass "
        r"[\d.]+ MiB, .*: the first epoch's largest batch, \d+ rows training [\d,]+ positions "
        r"over \d+ items\), more than the 1.0 MiB available \(a test's limit\)",
        message,
    )
    assert "training.loss=sampled_softmax (training.num_negatives=256" in message
    # the batch size it names fits the same machine
    smaller = re.search(
        r"smaller batches: data.loader.batch_size=(\d+) or lower \(now 128\)", message
    )
    overrides = ["training.rerank_top_n=0", f"data.loader.batch_size={smaller[1]}"]
    train.check_training_memory(*_checked_training(make_config, monkeypatch, overrides))
    assert f"data.prepared_dir={Path(cfg.paths.run_dir) / 'prepared'} reuses" in message
    assert not list(Path(cfg.paths.run_dir).rglob("*.ckpt"))
    # a sampled loss's step does not grow with the catalogue: the same machine takes it
    sampled = [
        "training.rerank_top_n=0",
        "training.loss=sampled_softmax",
        "training.num_negatives=50",
    ]
    train.check_training_memory(*_checked_training(make_config, monkeypatch, sampled))


class _Checked(Exception):
    pass


def _checked_training(make_config, monkeypatch, overrides):
    """(config, module, data module) that train.run checks the memory of, before it trains."""
    seen = []

    def record(*args):
        seen.append(args)
        raise _Checked

    with monkeypatch.context() as patched:
        patched.setattr(train, "check_training_memory", record)
        cfg = make_config("config", ["experiment=tiny", "logger=none", *overrides])
        with pytest.raises(_Checked):
            train.run(cfg)
    return seen[0]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["data.loader.batch_size=7"],
        [  # views and clicks are no target
            "+training.behavior_weights={purchase: 1.0, cart: 0.5}",
            "data.split.target_behaviors=[cart,purchase]",
        ],
        ["model.causal=false"],  # the last position only
        ["data.loader.train_samples=prefixes", "data.loader.batch_size=16"],
    ],
)
def test_the_memory_check_finds_the_batch_that_trains_the_most_positions(
    make_config, monkeypatch, overrides
):
    """The estimate is taken at the first epoch's batch with the most trained positions, as
    the module counts them (targets in the vocabulary, of a weighted behaviour, at the last
    position only for a non-causal model), and leaves the training's batch order as it was."""
    cfg, module, datamodule = _checked_training(make_config, monkeypatch, overrides)
    peak = train.peak_training_batch(datamodule, module)
    trained = [
        (len(batch), int(module._trained_positions(batch).sum()))
        for batch in datamodule.train_dataloader()
    ]
    assert peak == max(trained, key=lambda batch: batch[1])
    assert 0 < peak[1] < sum(count for _, count in trained)


def test_a_contrastive_loss_too_large_for_the_memory_left_is_named_with_its_fix(
    make_config, monkeypatch
):
    """The contrastive loss's (2M x 2M) scores grow with the batch, not the catalogue, so a
    sampled loss does not shrink them: the refusal names turning the loss off as well."""
    monkeypatch.setattr(train, "available_memory", lambda device: (2**16, "a test's limit"))
    overrides = ["training.loss=sampled_softmax", "training.num_negatives=20"]
    overrides += ["training.contrastive_weight=0.5", "training.rerank_top_n=0"]
    cfg, module, datamodule = _checked_training(make_config, monkeypatch, overrides)
    with pytest.raises(MemoryError, match="the contrastive loss's scores") as info:
        train.check_training_memory(cfg, module, datamodule)
    assert "no contrastive loss: training.contrastive_weight=0" in str(info.value)
    assert "training.loss=sampled_softmax" not in str(info.value)  # (it is on already)
