"""Side-by-side timing of ``recsys.data.prepare`` in two checkouts of this repository.

    git worktree add /tmp/before <commit>          # the version to compare with
    python -m benchmarks.prepare_ab --other /tmp/before --pairs 12

Each run is one ``prepare`` of the same generated log (``benchmarks/.data/events_<size>``, made
by ``python -m benchmarks.prepare_benchmark --sizes <size> --keep-data``) in a fresh interpreter
started in that checkout: ``prepare_benchmark --run-one recsys``, the benchmark's own measured
job. The two checkouts alternate (ABBA order), so that a machine whose speed drifts (shared
cores) moves both alike; the medians and their ratio are printed. Small differences (a few %)
need a dozen pairs or more to stand out of the noise of single runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(checkout: Path, events: Path, out: Path) -> float:
    """Wall seconds of one ``prepare`` of ``events`` by the recsys of ``checkout``."""
    cmd = [
        sys.executable, "-m", "benchmarks.prepare_benchmark", "--run-one", "recsys",
        "--events-dir", str(events), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: the prepare run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["wall_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.prepare_ab", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--other", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--size", default="1M", help="the generated log's size (default 1M)")
    parser.add_argument("--pairs", type=int, default=12, help="runs of each (default 12)")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "benchmarks" / ".data")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} must be >= 1")
    events = (args.data_dir / f"events_{args.size}").resolve()
    if not events.is_dir():
        parser.error(
            f"{events} does not exist: run python -m benchmarks.prepare_benchmark --sizes "
            f"{args.size} --keep-data first"
        )
    other = args.other.resolve()
    if not (other / "benchmarks" / "prepare_benchmark.py").is_file():
        parser.error(f"{other} is not a checkout of this repository")
    checkouts = {"this": ROOT, "other": other}
    walls: dict[str, list[float]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory(prefix="prepare_ab.") as tmp:
        for pair in range(args.pairs):
            order = list(checkouts) if pair % 2 == 0 else list(checkouts)[::-1]
            for name in order:
                walls[name].append(run(checkouts[name], events, Path(tmp) / name))
    medians = {name: statistics.median(values) for name, values in walls.items()}
    for name, checkout in checkouts.items():
        runs = ", ".join(f"{w:.3f}" for w in walls[name])
        print(f"{name:5s} {checkout}: median {medians[name]:.3f} s (runs {runs})")
    ratio = medians["this"] / medians["other"]
    print(f"this / other: {ratio:.3f} ({(ratio - 1) * 100:+.1f} %), {args.pairs} pairs, {events}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
