"""Two models on the same targets, target by target (a paired comparison).

    python -m pipelines.evaluate model=<a> per_target=a.parquet 'splits=[val,test]' ...
    python -m pipelines.evaluate model=<b> per_target=b.parquet 'splits=[val,test]' ...
    python -m benchmarks.compare_targets a.parquet b.parquet --split test [--users <file>]
        [--metric ndcg_at_10 --metric hr_at_10]
    python -m benchmarks.compare_targets a.parquet b_seed0.parquet,b_seed1.parquet ...

Prints a Markdown table: per metric, each model's mean, the difference b - a with its paired
standard error and 95 % interval, the standard error it would have as two independent samples,
and on how many targets each model is ahead (:func:`recsys.training.evaluation.
compare_per_target`). A comma-separated list of files (e.g. one per training seed) stands for
their per-target mean. The standard errors are over targets, not over training seeds.
"""

from __future__ import annotations

import argparse
import sys

from recsys.training.evaluation import compare_per_target

HEADER = (
    "| metric | targets | a | b | b − a (± paired SE) | 95 % interval | relative | "
    "unpaired SE | b ahead / a ahead / tied |\n|---|---:|---:|---:|---:|---|---:|---:|---|"
)


def row(metric: str, got: dict) -> str:
    return (
        f"| {metric} | {got['targets']} | {got['a']:.4f} | {got['b']:.4f} | "
        f"{got['difference']:+.4f} ± {got['stderr']:.4f} | "
        f"[{got['ci95_low']:+.4f}, {got['ci95_high']:+.4f}] | {got['relative']:+.1%} | "
        f"{got['unpaired_stderr']:.4f} | {got['b_better']} / {got['a_better']} / {got['ties']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "a", help="per-target file(s) of model a (pipelines.evaluate per_target=), comma-separated"
    )
    parser.add_argument("b", help="per-target file(s) of model b, on the same targets")
    parser.add_argument("--metric", action="append", help="default: ndcg_at_10 and hr_at_10")
    parser.add_argument("--split", help="val or test (needed when the files hold both)")
    parser.add_argument("--users", help="a CSV / Parquet file of user ids: only theirs")
    args = parser.parse_args(argv)
    a, b = (files.split(",") if "," in files else files for files in (args.a, args.b))
    lines = [HEADER]
    for metric in args.metric or ["ndcg_at_10", "hr_at_10"]:
        try:
            got = compare_per_target(a, b, metric, split=args.split, users=args.users)
        except (ValueError, TypeError) as err:  # DataError too: the message, not a traceback
            parser.error(str(err))
        lines.append(row(metric, got))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
