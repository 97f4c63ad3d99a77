"""Training speed on CPU and GPU, side by side, on a synthetic log of a chosen size (or any
data the overrides name).

    python -m benchmarks.train_benchmark                                  # CPU only here
    python -m benchmarks.train_benchmark --accelerators cpu,gpu --epochs 4 \
        data.source.num_users=6000 data.source.num_items=3400 \
        +data.source.sessions_per_user=30 data.max_seq_len=200             # ML-1M-like lengths
    python -m benchmarks.train_benchmark --cpu-chunks off,on experiment=ml1m  # CPU A/B

Each accelerator trains the same configuration (``conf/config.yaml``, the default data and
model, plus the Hydra overrides given after the options) for ``--epochs`` epochs through
``recsys.tasks.train``: ``cpu`` is ``trainer.accelerator=cpu`` (float32), ``gpu`` is
``trainer=gpu`` (bf16-mixed). Early stopping is off, so every run trains the same epochs.
``--cpu-chunks off`` makes a CPU run compute the full softmax's logits as one table however
large (``on``, the default: in chunks under glibc's mmap
threshold, :mod:`recsys.allocation`); with ``off,on`` each accelerator runs both ways, one
after the other.

Printed per run: the median seconds of a training epoch after the first (which holds
the warm-up; validation excluded, as ``time/train_seconds`` counts it), training events per
second, the last validation NDCG@10, each epoch's seconds, and the speed-up against the
first row. ``--step-times`` also times every training step (the device synchronised around it)
and splits each epoch's seconds into steps whose batch shape (rows x width) the run had not
seen before and the others: where a GPU's first epochs lose their time. Batches are as wide
as their longest row, rounded up to ``data.loader.width_multiple`` (pass it as an override to
compare).
Figures, not a test: see ``benchmarks/README.md``, "Training speed".
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.prepare_benchmark import json_path, write_json

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("benchmarks.train")
ACCELERATORS = {
    "cpu": ["trainer.accelerator=cpu", "retrieval.accelerator=cpu"],
    "gpu": ["trainer=gpu", "retrieval.accelerator=gpu"],
}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import recsys.config  # noqa: F401  (the ${abspath:} resolver)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def epoch_seconds(history: list[dict[str, float]]) -> list[float]:
    """Seconds of each training epoch, from the clock's cumulative ``train_seconds``."""
    totals = [entry["train_seconds"] for entry in history]
    return [b - a for a, b in zip([0.0, *totals], totals, strict=False)]


def train_events(prepared_dir: Path) -> int:
    stats = json.loads((prepared_dir / "stats.json").read_text())
    return int(stats["train_events"])


STEPS: list[tuple[int, tuple[int, int], float]] = []  # (epoch, (rows, width), seconds)


def step_times_callback():
    """A Lightning callback appending each training step's epoch, batch shape and seconds to
    :data:`STEPS` (built here so that importing this module does not import Lightning)."""
    import time

    import pytorch_lightning as pl
    import torch

    class _StepTimes(pl.Callback):
        def _sync(self, module) -> None:
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            self._sync(module)
            self._start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self._sync(module)
            shape = tuple(batch.item.shape)
            STEPS.append((trainer.current_epoch, shape, time.perf_counter() - self._start))

    return _StepTimes()


def step_summary(steps: list[tuple[int, tuple[int, int], float]]) -> list[dict]:
    """Per epoch: steps and seconds of batch shapes new to the run, and of the others."""
    seen: set[tuple[int, int]] = set()
    epochs: dict[int, dict] = {}
    for epoch, shape, seconds in steps:
        row = epochs.setdefault(
            epoch, {"epoch": epoch, "new_steps": 0, "new_s": 0.0, "seen_steps": 0, "seen_s": 0.0}
        )
        kind = "seen" if shape in seen else "new"
        seen.add(shape)
        row[f"{kind}_steps"] += 1
        row[f"{kind}_s"] += seconds
    return list(epochs.values())


def run_one(
    accelerator: str,
    chunks: str,
    epochs: int,
    extra: list[str],
    work: Path,
    step_times: bool = False,
) -> dict:
    from recsys import allocation
    from recsys.tasks import train

    threshold = allocation.MMAP_THRESHOLD_MAX
    if chunks == "off":
        allocation.MMAP_THRESHOLD_MAX = 2**62

    cfg = compose(
        [
            *extra,
            *ACCELERATORS[accelerator],
            f"trainer.max_epochs={epochs}",
            "callbacks.early_stopping=null",
            "logger=none",
            "trainer.enable_progress_bar=false",
            f"paths.run_dir={work / f'{accelerator}-{chunks}'}",
            f"paths.output_dir={work}",
        ]
    )
    if step_times:
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.callbacks.step_times = {"_target_": f"{__name__}.step_times_callback"}
        STEPS.clear()
    try:
        trained = train.run(cfg, register=False)
    finally:
        allocation.MMAP_THRESHOLD_MAX = threshold
    seconds = epoch_seconds(trained.history or [])
    steady = seconds[1:] or seconds
    events = train_events(trained.prepared_dir)
    steps = step_summary(STEPS) if step_times else None
    return {
        "accelerator": accelerator,
        "cpu_chunks": chunks,
        "precision": str(cfg.trainer.precision),
        "epochs": len(seconds),
        "epoch_seconds": seconds,
        "median_epoch_seconds": statistics.median(steady),
        "train_events": events,
        "events_per_second": events / statistics.median(steady),
        "val_ndcg_at_10": (trained.history or [{}])[-1].get("val/ndcg_at_10"),
        **({"steps": steps} if steps is not None else {}),
    }


def table(rows: list[dict]) -> str:
    base = rows[0]["median_epoch_seconds"]
    lines = [
        "| accelerator | cpu chunks | precision | epochs | s / epoch (median after the first) "
        "| training events / s | val NDCG@10 | speed-up | each epoch (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['accelerator']} | {r['cpu_chunks']} | {r['precision']} | {r['epochs']} "
            f"| {r['median_epoch_seconds']:.2f} | {r['events_per_second']:,.0f} "
            f"| {r['val_ndcg_at_10']:.4f} | {base / r['median_epoch_seconds']:.2f}x "
            f"| {' / '.join(f'{s:.1f}' for s in r['epoch_seconds'])} |"
        )
    for r in rows:
        if "steps" not in r:
            continue
        lines += [
            "",
            f"{r['accelerator']} (cpu chunks {r['cpu_chunks']}): training steps by batch shape",
            "| epoch | steps, new shape | their s | steps, shape seen before | their s |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {e['epoch']} | {e['new_steps']} | {e['new_s']:.2f} | {e['seen_steps']} "
            f"| {e['seen_s']:.2f} |"
            for e in r["steps"]
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accelerators", default="cpu", help="comma-separated: cpu, gpu")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs per run (>= 2)")
    parser.add_argument(
        "--cpu-chunks", default="on", help="comma-separated: on, off (CPU runs; see above)"
    )
    parser.add_argument(
        "--step-times", action="store_true", help="also time every training step (see above)"
    )
    parser.add_argument("--json", type=json_path, help="also write every figure here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    accelerators = [a.strip() for a in args.accelerators.split(",") if a.strip()]
    unknown = sorted(set(accelerators) - set(ACCELERATORS))
    if unknown or not accelerators:
        parser.error(f"--accelerators: {unknown or 'none'}; choose from {sorted(ACCELERATORS)}")
    chunks = [c.strip() for c in args.cpu_chunks.split(",") if c.strip()]
    if not chunks or set(chunks) - {"on", "off"}:
        parser.error(f"--cpu-chunks {args.cpu_chunks!r}: a comma-separated list of on, off")
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first epoch holds the warm-up")
    with tempfile.TemporaryDirectory(prefix="train_benchmark_") as tmp:
        rows = [
            run_one(a, c, args.epochs, args.overrides, Path(tmp), args.step_times)
            for a in accelerators
            for c in chunks
        ]
    sys.stdout.write(table(rows) + "\n")
    if args.json:
        write_json(args.json, rows, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
