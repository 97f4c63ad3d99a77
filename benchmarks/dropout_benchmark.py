"""Dropout on CPU: ``recsys.model.layers.Dropout`` against ``torch.nn.Dropout``, side by side.

    python -m benchmarks.dropout_benchmark                  # one torch thread, as the suite runs
    python -m benchmarks.dropout_benchmark --threads 2 --repeats 30

Two measurements, each taking turns between the two implementations in one process:

- **op**: forward + backward of one dropout (p 0.5) on the activations of BSARec's Beauty
  recipe: (256, 50, 64) hidden states and (256, 50, 256) feed-forward activations.
- **step**: one optimizer step of ATRank as the Beauty suite trains it (``atrank_bsarec``:
  d_model 64, 2 post-norm layers, 1 head, FFN 256, dropout 0.5, the low-pass branch,
  random attribute sets of Beauty's sizes; 256 rows of 50 random events, full-softmax CE at
  the last position over Beauty's 12,070 item indices). The same model runs with its
  ``Dropout`` modules and with each swapped for ``nn.Dropout`` (same p); the attention's own
  dropout (inside ``scaled_dot_product_attention``) is the same in both.

Prints the median milliseconds of each and the ratio. Figures, not a test: see
``benchmarks/README.md``, "Dropout on CPU".
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from recsys.model.atrank import ATRank
from recsys.model.layers import Dropout

P = 0.5
OP_SHAPES = ((256, 50, 64), (256, 50, 256))
# Beauty (S3-Rec files) as the suite prepares it (stats.json): 12,070 item and 639 attribute
# indices, attribute sets of up to 6
NUM_ITEMS, NUM_ATTRIBUTES, WIDTH, BATCH, LENGTH = 12_070, 639, 6, 256, 50


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def alternate(fns: dict, repeats: int) -> dict[str, float]:
    """Median ms of each function, run in turns (one call of each per round) after a warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed_ms(fn))
    return {name: statistics.median(values) for name, values in times.items()}


def op_rows(repeats: int) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for shape in OP_SHAPES:
        x = torch.randn(*shape, requires_grad=True)
        grad = torch.randn(*shape)
        ours = Dropout(P).train()

        def torch_dropout(x=x, grad=grad):
            F.dropout(x, P, True).backward(grad)

        def recsys_dropout(x=x, grad=grad, ours=ours):
            ours(x).backward(grad)

        medians = alternate({"nn.Dropout": torch_dropout, "recsys": recsys_dropout}, repeats)
        rows.append((f"op: forward + backward {tuple(shape)}", medians))
    return rows


def with_torch_dropout(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose recsys ``Dropout`` modules are ``nn.Dropout`` (same p)."""
    twin = copy.deepcopy(model)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Dropout):
                setattr(parent, name, nn.Dropout(child.p))
    return twin


def step_row(repeats: int) -> tuple[str, dict[str, float]]:
    torch.manual_seed(0)
    model = ATRank(
        num_items=NUM_ITEMS,
        num_attributes=NUM_ATTRIBUTES,
        num_behaviors=3,
        num_time_buckets=2,
        max_seq_len=LENGTH,
        item_attribute_width=WIDTH,
        d_model=64,
        num_heads=1,
        num_layers=2,
        dropout=P,
        positional="learned",
        norm_first=False,
        causal=False,
        filter_mix=0.7,
        filter_frequencies=5,
        embedding_std=0.02,
    )
    model.set_item_attributes(torch.randint(2, NUM_ATTRIBUTES, (NUM_ITEMS, WIDTH)))
    item = torch.randint(2, NUM_ITEMS, (BATCH, LENGTH))
    behavior = torch.full_like(item, 2)
    time_bucket = torch.zeros_like(item)
    padding = torch.ones_like(item, dtype=torch.bool)
    target = torch.randint(2, NUM_ITEMS, (BATCH,))
    models = {"nn.Dropout": with_torch_dropout(model), "recsys": model}
    assert sum(isinstance(m, Dropout) for m in models["nn.Dropout"].modules()) == 0
    steps = {}
    for name, encoder in models.items():
        encoder.train()
        optimizer = torch.optim.Adam(encoder.parameters(), lr=5e-4)

        def step(encoder=encoder, optimizer=optimizer):
            output = encoder(item, behavior, time_bucket, padding)
            loss = F.cross_entropy(encoder.score_items(output.query), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        steps[name] = step
    return "step: ATRank, BSARec's Beauty recipe, 256 x 50", alternate(steps, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=20, help="rounds per measurement")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    torch.set_num_threads(args.threads)
    rows = [*op_rows(args.repeats), step_row(args.repeats)]
    out = sys.stdout
    out.write(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}\n\n")
    out.write("| measured | nn.Dropout ms | recsys Dropout ms | speed-up |\n|---|---:|---:|---:|\n")
    for label, medians in rows:
        ours, theirs = medians["recsys"], medians["nn.Dropout"]
        out.write(f"| {label} | {theirs:.1f} | {ours:.1f} | {theirs / ours:.2f}x |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
