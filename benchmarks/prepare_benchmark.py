"""Benchmark of recsys' data preparation against the same steps written plainly in pandas.

    python -m benchmarks.prepare_benchmark                      # 1M, 10M, 100M; pandas at 1M, 10M
    python -m benchmarks.prepare_benchmark --sizes 1M,10M --repeats 3
    python -m benchmarks.prepare_benchmark --check              # both agree on a tiny log

For each size a synthetic event log is generated once (cached under ``--data-dir``; generation
is not measured), then every measured job runs in a fresh subprocess (``--run-one``) so that its
peak RSS is its own. The child prints one JSON line (``wall_s``, ``peak_rss_gib``, ...) last on
stdout; the parent prints a Markdown table. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path

log = logging.getLogger("benchmarks.prepare")

DEFAULT_SIZES = "1M,10M,100M"
DEFAULT_PANDAS_SIZES = "1M,10M"
DEFAULT_DATA_DIR = Path(__file__).resolve().parent / ".data"

# Synthetic log: chunks of 100k users (~36 events each) over one shared catalogue.
USERS_PER_CHUNK = 100_000
NUM_ITEMS = 200_000
NUM_CATEGORIES = 500
SEED_BASE = 1_000
USER_ID_STRIDE = 10_000_000_000  # chunk k's users get + k * stride: unique across chunks
ITEM_ID_BASE = 10_000
EXPECTED_EVENTS_PER_CHUNK = 3_600_000  # only used to decide how many chunks to start at once

BEHAVIORS = ("view", "click", "cart", "purchase")
# The settings both implementations run with (the pandas side mirrors exactly these).
RECSYS_OPTIONS: dict = {
    "columns": {
        "user_id": "user_id",
        "item_id": "item_id",
        "timestamp": "timestamp",
        "event_type": "event_type",
        "category": "category",
    },
    "behaviors": list(BEHAVIORS),
    "split": {"method": "temporal", "val_fraction": 0.1, "test_fraction": 0.1},
    "min_user_events": 2,
    "min_item_events": 1,
    "min_item_count": 1,
}
PANDAS_OPTIONS: dict = {
    "behaviors": BEHAVIORS,
    "val_fraction": 0.1,
    "test_fraction": 0.1,
    "min_user_events": 2,
    "min_item_count": 1,
}
IMPLEMENTATIONS = ("recsys", "pandas")
SEQUENCE_COLUMNS = (
    "user_id",
    "item",
    "behavior",
    "timestamp",
    "train_end",
    "val_target",
    "test_start",
    "test_target",
)
GIB = 1024**3


# -- sizes and machine ---------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"1M"`` -> 1_000_000; also ``K``, ``B`` and plain integers (``_`` allowed)."""
    match = re.fullmatch(r"\s*([0-9_.]+)\s*([kKmMbBgG]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r}: use e.g. 1M, 500K, 10M, 100M")
    factor = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}[match.group(2).lower()]
    value = float(match.group(1).replace("_", "")) * factor
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive whole number")
    return int(value)


def parse_sizes(text: str) -> list[tuple[str, int]]:
    """``"1M,10M"`` -> ``[("1M", 1_000_000), ("10M", 10_000_000)]`` (an argparse type: a bad
    size is refused by name, before any work)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    return [(name, parse_size(name)) for name in names]


def json_path(text: str) -> Path:
    """``--json`` of the benchmark scripts (an argparse type): its folder must exist, checked
    before any work rather than when the figures are written at the end."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{path}: the folder {path.parent} does not exist; create it or name another file"
        )
    return path


def write_json(path: Path, data, **dumps) -> None:
    """``data`` as JSON in ``path``, replaced at once (``write_atomically``): an interrupted
    write leaves the file as it was, never half of it."""
    from recsys.retrieval.output import write_atomically

    text = json.dumps(data, **dumps)
    write_atomically(path, lambda tmp: Path(tmp).write_text(text))


def machine_facts() -> dict:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"

    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    cpu = platform.processor() or "-"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "ram_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "os": platform.platform(),
        "polars": version("polars"),
        "pandas": version("pandas"),
        "pyarrow": version("pyarrow"),
        "numpy": version("numpy"),
        "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "-"),
        "recsys": _git_state(),
    }


def _git_state() -> str:
    """The commit the measured recsys code is at, and whether recsys/ has uncommitted edits."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "-"
    dirty = git("status", "--porcelain", "--", "recsys")
    return f"commit {commit}" + (" + uncommitted changes in recsys/" if dirty else "")


# -- synthetic data ------------------------------------------------------------------------------
def _generate_chunk(chunk: int, path: str) -> int:
    """Write chunk ``chunk`` (100k users) to ``path``; return its number of events.

    ``generate_events`` draws a fresh catalogue (random item ids) for every seed, so each chunk's
    items are renamed by their popularity rank within the chunk (``ITEM_ID_BASE + rank``): all
    chunks share one catalogue of ~``NUM_ITEMS`` items whose popular items coincide. Categories
    are kept as generated, so an item can carry different categories in different chunks (the
    vocabulary then takes its most frequent one).
    """
    import polars as pl

    from recsys.data.synthetic import generate_events

    df = generate_events(
        num_users=USERS_PER_CHUNK,
        num_items=NUM_ITEMS,
        num_categories=NUM_CATEGORIES,
        seed=SEED_BASE + chunk,
    )
    shared_ids = (
        df.group_by("item_id")
        .len()
        .sort(["len", "item_id"], descending=[True, False])
        .with_row_index("rank")
        .select("item_id", (pl.col("rank").cast(pl.Int64) + ITEM_ID_BASE).alias("_shared"))
    )
    df = (
        df.join(shared_ids, on="item_id", how="left", maintain_order="left")
        .with_columns(
            pl.col("_shared").alias("item_id"),
            pl.col("user_id") + chunk * USER_ID_STRIDE,
        )
        .select("user_id", "item_id", "category", "event_type", "timestamp")
    )
    df.write_parquet(path)
    return df.height


def _part_name(chunk: int) -> str:
    return f"part-{chunk:05d}.parquet"


def count_rows(folder: Path) -> int | None:
    import pyarrow.parquet as pq

    files = sorted(folder.glob("*.parquet"))
    if not files:
        return None
    try:
        return sum(pq.read_metadata(f).num_rows for f in files)
    except Exception:  # a broken file: regenerate
        return None


def ensure_events(data_dir: Path, name: str, n_events: int, workers: int) -> Path:
    """``<data_dir>/events_<name>/`` holding exactly ``n_events`` events (generated if missing or
    of another size)."""
    folder = data_dir / f"events_{name}"
    if folder.is_dir() and count_rows(folder) == n_events:
        log.info("events_%s: cached (%d events) in %s", name, n_events, folder)
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".events_{name}.", dir=data_dir))
    t0 = time.perf_counter()
    log.info("events_%s: generating %d events into %s ...", name, n_events, folder)
    try:
        total, chunk, next_chunk, pending = 0, 0, 0, {}
        per_chunk = EXPECTED_EVENTS_PER_CHUNK
        # spawn, not fork: a forked child of a process whose polars thread pool is running
        # (a notebook, a test) can deadlock
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
            while total < n_events:
                # start chunks while the ones in flight are not expected to reach the size
                while len(pending) < workers and (
                    not pending or total + len(pending) * per_chunk < n_events
                ):
                    path = str(tmp / _part_name(next_chunk))
                    pending[next_chunk] = pool.submit(_generate_chunk, next_chunk, path)
                    next_chunk += 1
                rows = pending.pop(chunk).result()
                per_chunk = rows
                path = tmp / _part_name(chunk)
                if total + rows > n_events:  # the last chunk: cut to the exact size
                    import pyarrow.parquet as pq

                    table = pq.read_table(path).slice(0, n_events - total)
                    pq.write_table(table, path)
                    rows = table.num_rows
                total += rows
                log.info(
                    "  chunk %d: %d events (%d / %d, %.0f s)",
                    chunk,
                    rows,
                    total,
                    n_events,
                    time.perf_counter() - t0,
                )
                chunk += 1
            for extra, future in pending.items():  # started but not needed
                future.result()
                (tmp / _part_name(extra)).unlink(missing_ok=True)
        if count_rows(tmp) != n_events:
            raise RuntimeError(f"generated {count_rows(tmp)} events instead of {n_events}")
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("events_%s: %d events in %.0f s", name, n_events, time.perf_counter() - t0)
    return folder


def in_order(folder: Path, order: str) -> Path:
    """The events of ``folder`` (generated in user, then time order: a per-user export) in
    ``order``: ``user`` is the folder itself; ``time`` is a copy sorted by timestamp (stable:
    each user's events keep their order), the order of a log exported as it was recorded.
    Kept beside the folder as ``<folder>_by_time`` and reused while its row count matches."""
    import polars as pl

    if order == "user":
        return folder
    target = folder.with_name(f"{folder.name}_by_time")
    if target.is_dir() and count_rows(target) == count_rows(folder):
        log.info("%s: cached", target.name)
        return target
    shutil.rmtree(target, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=folder.parent))
    try:
        pl.scan_parquet(folder / "*.parquet").sort("timestamp", maintain_order=True).sink_parquet(
            tmp / _part_name(0)
        )
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: written", target.name)
    return target


# -- the measured jobs (child process) ---------------------------------------------------------
def new_prepare():
    """``recsys.data.prepare`` (the new API) or ``None`` while it does not exist yet."""
    try:
        from recsys.data import prepare
    except ImportError:
        return None
    return prepare if callable(prepare) else None  # (before: the module recsys.data.prepare)


def run_recsys(source, out_dir: Path) -> tuple[dict, str]:
    prepare = new_prepare()
    if prepare is not None:
        dataset = prepare(source, out_dir, **RECSYS_OPTIONS)
        return dict(dataset.stats), "recsys.data.prepare"
    # the same pipeline, called directly (while the prepare() wrapper does not exist yet)
    from recsys.data.options import event_schema, prepare_settings
    from recsys.data.pipeline import prepare_dataset

    stats, _ = prepare_dataset(
        source,
        schema=event_schema(RECSYS_OPTIONS),
        settings=prepare_settings(RECSYS_OPTIONS),
        out_dir=out_dir,
    )
    return stats, "recsys.data.pipeline.prepare_dataset"


def run_pandas(source, out_dir: Path) -> tuple[dict, str]:
    from benchmarks.pandas_reference import prepare_pandas

    return prepare_pandas(source, out_dir, **PANDAS_OPTIONS), "benchmarks.pandas_reference"


def run_one(impl: str, events_dir: Path, out_dir: Path) -> dict:
    """One measured job in this (fresh) process; the result is also printed as JSON."""
    runner = {"recsys": run_recsys, "pandas": run_pandas}[impl]
    if impl == "recsys":  # import outside the timed region, like pandas' import below
        import polars  # noqa: F401

        import recsys.data  # noqa: F401
    else:
        import pandas  # noqa: F401
        import pyarrow.dataset  # noqa: F401  (read_parquet of a folder goes through it)
        import pyarrow.parquet  # noqa: F401

        import benchmarks.pandas_reference  # noqa: F401
    if out_dir.exists():
        shutil.rmtree(out_dir)
    load_before = os.getloadavg()[0]
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    stats, api = runner(events_dir, out_dir)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out_bytes = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    return {
        "impl": impl,
        "api": api,
        "wall_s": wall,
        "cpu_s": (usage.ru_utime - usage0.ru_utime) + (usage.ru_stime - usage0.ru_stime),
        "peak_rss_gib": usage.ru_maxrss * 1024 / GIB,  # ru_maxrss: KiB on Linux
        "events_in": stats.get("rows_read"),
        "events": stats.get("events"),
        "users_out": stats.get("users"),
        "num_items": stats.get("num_items"),
        "out_mib": out_bytes / 2**20,
        "step_seconds": stats.get("step_seconds"),
        # 1-minute load average of the machine before / after: other work competing for cores
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


# -- the parent: one subprocess per job --------------------------------------------------------
def _rss_gib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError):
        pass
    return 0.0


def run_watched(
    cmd: list[str], *, max_rss_gib: float, timeout_s: float | None
) -> tuple[dict | None, str | None, float]:
    """Run a benchmark child (``python -m ...``) from the repository root; kill it when its RSS
    passes ``max_rss_gib`` (so an over-large run cannot push the machine into the OOM killer)
    or it runs past ``timeout_s``. Returns (the JSON of its last stdout line or None, why it
    failed, the largest RSS sampled in GiB)."""
    root = Path(__file__).resolve().parent.parent
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=None, text=True)
    killed: list[str] = []
    sampled = [0.0]

    def watch() -> None:
        while proc.poll() is None:
            rss = _rss_gib(proc.pid)
            sampled[0] = max(sampled[0], rss)
            over_time = timeout_s is not None and time.perf_counter() - t0 > timeout_s
            if rss > max_rss_gib or over_time:
                killed.append(
                    f"RSS {rss:.1f} GiB > {max_rss_gib:.1f}"
                    if rss > max_rss_gib
                    else f"ran past {timeout_s:.0f} s"
                )
                os.kill(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout, _ = proc.communicate()
    watcher.join()
    lines = [line for line in stdout.splitlines() if line.strip()]
    if killed or proc.returncode != 0 or not lines:
        return None, killed[0] if killed else f"exit status {proc.returncode}", sampled[0]
    return json.loads(lines[-1]), None, sampled[0]


def measure(
    impl: str, events_dir: Path, out_dir: Path, *, max_rss_gib: float, timeout_s: float | None
) -> dict:
    """Run one job in a fresh interpreter; kill it when its RSS passes ``max_rss_gib`` (so that
    an over-large run cannot push the machine into the OOM killer)."""
    cmd = [
        sys.executable, "-m", "benchmarks.prepare_benchmark", "--run-one", impl,
        "--events-dir", str(events_dir), "--out", str(out_dir),
    ]  # fmt: skip
    t0 = time.perf_counter()
    result, reason, sampled = run_watched(cmd, max_rss_gib=max_rss_gib, timeout_s=timeout_s)
    if result is None:
        log.error("%s on %s failed: %s", impl, events_dir.name, reason)
        return {"impl": impl, "error": reason, "sampled_rss_gib": sampled}
    result["process_wall_s"] = time.perf_counter() - t0
    result["sampled_rss_gib"] = sampled
    return result


def fmt_rate(events: float, seconds: float) -> str:
    rate = events / seconds
    return f"{rate / 1e6:.2f} M/s" if rate >= 1e6 else f"{rate / 1e3:.0f} k/s"


def summarise(rows: list[dict]) -> str:
    lines = [
        "| size | events | implementation | wall s (median) | events/s | peak RSS GiB "
        "| pandas/recsys |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    by_size: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault(row["size"], {})[row["impl"]] = row
    for size, impls in by_size.items():
        recsys_wall = impls.get("recsys", {}).get("wall_s")
        for impl in IMPLEMENTATIONS:
            row = impls.get(impl)
            if row is None:
                continue
            if "error" in row:
                lines.append(
                    f"| {size} | {row['n_events']:,} | {impl} | failed: {row['error']} | | "
                    f"{row.get('sampled_rss_gib', 0):.2f} (sampled) | |"
                )
                continue
            ratio = ""
            if impl == "pandas" and recsys_wall:
                ratio = f"{row['wall_s'] / recsys_wall:.1f}×"
            lines.append(
                f"| {size} | {row['events_in']:,} | {impl} | {row['wall_s']:.2f} | "
                f"{fmt_rate(row['events_in'], row['wall_s'])} | {row['peak_rss_gib']:.2f} | "
                f"{ratio} |"
            )
    return "\n".join(lines)


def targets(rows: list[dict], ram_gib: float) -> list[str]:
    out = []
    by_size: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault(row["size"], {})[row["impl"]] = row
    for size, impls in by_size.items():
        r, p = impls.get("recsys"), impls.get("pandas")
        if r and p and "error" not in r and "error" not in p:
            ratio = p["wall_s"] / r["wall_s"]
            verdict = "met" if ratio >= 10 else "NOT met"
            out.append(
                f"- {size}: recsys {ratio:.1f}× faster than pandas (target ≥ 10×): {verdict}"
            )
    for size, impls in by_size.items():
        r = impls.get("recsys")
        if r and r["n_events"] >= 100_000_000:
            if "error" in r:
                out.append(f"- {size}: recsys failed ({r['error']})")
            else:
                verdict = "met" if r["peak_rss_gib"] <= 24 else "NOT met"
                out.append(
                    f"- {size}: recsys peak RSS {r['peak_rss_gib']:.2f} GiB (target ≤ 24 GiB, "
                    f"machine {ram_gib} GiB): {verdict}"
                )
    return out


# -- self-check: both implementations agree on a tiny log ----------------------------------------
def _tiny_logs() -> dict:
    import numpy as np
    import polars as pl

    from recsys.data.synthetic import generate_events

    plain = generate_events(num_users=200, num_items=300, seed=1)
    rng = np.random.default_rng(7)
    # exact duplicates (dropped, the first kept), same-time ties of one user (input order kept),
    # then the whole log shuffled so that input order matters
    duplicates = plain[rng.choice(plain.height, 25, replace=False).tolist()]
    ties = plain[rng.choice(plain.height, 25, replace=False).tolist()].with_columns(
        pl.col("item_id").shuffle(seed=3),
        pl.col("event_type").shuffle(seed=4),
    )
    perturbed = pl.concat([plain, duplicates, ties])
    perturbed = perturbed[rng.permutation(perturbed.height).tolist()]
    return {"generated": plain, "duplicates+ties+shuffled": perturbed}


def _read(folder: Path, name: str) -> dict[str, list] | None:
    import pyarrow.parquet as pq

    path = folder / name
    return pq.read_table(path).to_pydict() if path.exists() else None


def compare_outputs(recsys_dir: Path, pandas_dir: Path, r_stats: dict, p_stats: dict) -> list[str]:
    """Differences between the two prepared folders (empty: they agree)."""
    problems = []
    for key in ("rows_read", "events", "users", "duplicates_removed", "num_items"):
        if key in r_stats and r_stats.get(key) != p_stats.get(key):
            problems.append(
                f"stats[{key!r}]: recsys {r_stats.get(key)} vs pandas {p_stats.get(key)}"
            )
    tables = {
        "sequences.parquet": ("user_id", SEQUENCE_COLUMNS),
        "items.parquet": ("index", ("item_id", "index", "attribute_indices", "train_count")),
        "attributes.parquet": ("index", ("attribute", "index")),
        "behaviors.parquet": ("index", ("index", "behavior")),
    }
    for name, (key, columns) in tables.items():
        r, p = _read(recsys_dir, name), _read(pandas_dir, name)
        if r is None:
            problems.append(f"recsys wrote no {name}")
            continue
        for column in columns:
            if column not in r:
                log.warning("check: recsys' %s has no column %r: not compared", name, column)
                continue
            r_order = sorted(range(len(r[key])), key=r[key].__getitem__)
            p_order = sorted(range(len(p[key])), key=p[key].__getitem__)
            r_values = [r[column][i] for i in r_order]
            p_values = [p[column][i] for i in p_order]
            if len(r_values) != len(p_values):
                problems.append(
                    f"{name}: {len(r_values)} rows (recsys) vs {len(p_values)} (pandas)"
                )
                break
            bad = [i for i, (a, b) in enumerate(zip(r_values, p_values)) if a != b]
            if bad:
                i = bad[0]
                problems.append(
                    f"{name}.{column}: {len(bad)} row(s) differ, e.g. {key}="
                    f"{r[key][r_order[i]]}: recsys {r_values[i]!r} vs pandas {p_values[i]!r}"
                )
    return problems


def check(workdir: Path | None = None) -> bool:
    """Run both implementations on tiny logs and compare every output table."""
    ok = True
    with tempfile.TemporaryDirectory(prefix="prepare-check-", dir=workdir) as tmp:
        for name, events in _tiny_logs().items():
            folder = Path(tmp) / f"events-{name}"
            folder.mkdir()
            events.write_parquet(folder / "part-00000.parquet")
            r_stats, api = run_recsys(folder, Path(tmp) / f"recsys-{name}")
            p_stats, _ = run_pandas(folder, Path(tmp) / f"pandas-{name}")
            problems = compare_outputs(
                Path(tmp) / f"recsys-{name}", Path(tmp) / f"pandas-{name}", r_stats, p_stats
            )
            summary = (
                f"{events.height} rows -> {p_stats['users']} users, {p_stats['events']} events, "
                f"{p_stats['num_items'] - 2} items, {p_stats['duplicates_removed']} duplicates "
                f"removed, val/test targets {p_stats['val_targets']}/{p_stats['test_targets']}"
            )
            if problems:
                ok = False
                print(f"check [{name}] FAILED against {api}: {summary}")
                for problem in problems:
                    print(f"  - {problem}")
            else:
                print(f"check [{name}] ok against {api}: {summary}")
    return ok


# -- command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.prepare_benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help="event counts, e.g. 500K,1M (default %(default)s)",
    )
    parser.add_argument(
        "--pandas-sizes",
        type=parse_sizes,
        default=DEFAULT_PANDAS_SIZES,
        help="sizes that also run the pandas reference ('' for none; default %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per job; the median is shown")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="uncounted runs per job before the measured ones (default %(default)s)",
    )
    parser.add_argument(
        "--order",
        choices=("user", "time"),
        default="user",
        help="row order of the log: user (as generated: by user, then time) or time (sorted by "
        "timestamp, as recorded); default %(default)s",
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the generated logs (and the last prepared folders) in --data-dir for the next "
        "run; by default they are deleted at the end",
    )
    parser.add_argument(
        "--gen-workers", type=int, default=min(2, os.cpu_count() or 1), help="generation processes"
    )
    parser.add_argument(
        "--max-rss-gib",
        type=float,
        default=None,
        help="kill a job whose RSS passes this (default: 90%% of the machine's RAM)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per job")
    parser.add_argument("--json", type=json_path, default=None, help="also write all results here")
    parser.add_argument("--check", action="store_true", help="compare both on a tiny log; exit")
    parser.add_argument(
        "--generate-only", action="store_true", help="generate (and keep) the logs; measure nothing"
    )
    parser.add_argument("--run-one", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--events-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"--repeats {args.repeats} must be >= 1 and --warmup {args.warmup} >= 0")
    if not args.sizes:
        parser.error("--sizes names no size: pass e.g. --sizes 1M")
    if args.gen_workers < 1:
        parser.error(f"--gen-workers {args.gen_workers} must be >= 1")
    for option, value, unset in (
        ("--max-rss-gib", args.max_rss_gib, "90 % of RAM"),
        ("--timeout", args.timeout, "no time limit"),
    ):  # (0 was read as unset by --max-rss-gib, and --timeout 0 killed every job)
        if value is not None and not value > 0:
            parser.error(f"{option} {value} must be a number > 0 (leave it out for {unset})")
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )

    if args.run_one:
        result = run_one(args.run_one, args.events_dir, args.out)
        print(json.dumps(result), flush=True)
        return 0
    if args.check:
        return 0 if check() else 1

    sizes = args.sizes
    if args.generate_only:
        for name, n_events in sizes:
            ensure_events(args.data_dir.resolve(), name, n_events, args.gen_workers)
        return 0
    pandas_sizes = {n for _, n in args.pandas_sizes}
    facts = machine_facts()
    max_rss = args.max_rss_gib or 0.9 * facts["ram_gib"]
    probe = "from benchmarks.prepare_benchmark import new_prepare; print(new_prepare() is not None)"
    has_new_api = (
        subprocess.run(
            [sys.executable, "-c", probe],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
        ).stdout.strip()
        == "True"
    )
    if not has_new_api:
        log.warning(
            "recsys.data.prepare does not exist yet: calling recsys.data.pipeline.prepare_dataset"
        )

    print("## Machine\n")
    for key, value in facts.items():
        print(f"- {key}: {value}")
    api = "recsys.data.prepare" if has_new_api else "recsys.data.pipeline.prepare_dataset"
    print(f"- recsys API: {api}")
    print(f"- command: {' '.join(['python -m benchmarks.prepare_benchmark', *sys.argv[1:]])}\n")
    sys.stdout.flush()

    data_dir = args.data_dir.resolve()
    created: list[Path] = []
    rows: list[dict] = []
    try:
        for name, n_events in sizes:
            jobs = [i for i in IMPLEMENTATIONS if i == "recsys" or n_events in pandas_sizes]
            if not jobs:
                continue
            folder = data_dir / f"events_{name}"
            existed = folder.exists()
            label = name if args.order == "user" else f"{name} by {args.order}"
            events_dir = ensure_events(data_dir, name, n_events, args.gen_workers)
            if not existed:
                created.append(events_dir)
            if args.order != "user":
                had_copy = events_dir.with_name(f"{events_dir.name}_by_{args.order}").exists()
                events_dir = in_order(events_dir, args.order)
                if not had_copy:
                    created.append(events_dir)
            out_dirs = {impl: data_dir / "out" / f"{name}-{impl}" for impl in jobs}
            all_runs: dict[str, list[dict]] = {impl: [] for impl in jobs}
            # Each implementation: its warm-up runs (not counted), then its measured runs, so
            # that every measured run follows a run of the same job (see benchmarks/README.md)
            schedule = [
                (repeat, impl)
                for impl in jobs
                for repeat in [-1 - w for w in range(args.warmup)] + list(range(args.repeats))
            ]
            for repeat, impl in schedule:
                runs = all_runs[impl]
                if runs and "error" in runs[-1]:
                    continue
                kind = "warm-up" if repeat < 0 else f"run {repeat + 1}/{args.repeats}"
                log.info("%s %s: %s ...", name, impl, kind)
                result = measure(
                    impl, events_dir, out_dirs[impl], max_rss_gib=max_rss, timeout_s=args.timeout
                )
                if repeat >= 0 or "error" in result:
                    runs.append(result)
                if "error" in result:
                    continue
                log.info(
                    "%s %s (%s): %.2f s wall, %.1f s CPU, peak RSS %.2f GiB, %d users",
                    name, impl, kind, result["wall_s"], result["cpu_s"], result["peak_rss_gib"],
                    result["users_out"],
                )  # fmt: skip
            for impl in jobs:
                out_dir, runs = out_dirs[impl], all_runs[impl]
                if not args.keep_data:
                    shutil.rmtree(out_dir, ignore_errors=True)
                # a killed job leaves recsys' staging folder (.<name>.<random>) behind
                for stale in out_dir.parent.glob(f".{out_dir.name}.*"):
                    shutil.rmtree(stale, ignore_errors=True)
                failed = [r for r in runs if "error" in r]
                if failed:
                    row = {**failed[0], "size": label, "n_events": n_events}
                else:
                    # the other figures (CPU, steps, load) are the median run's own: the run
                    # whose wall time is the median (of an even count, the upper middle one)
                    middle = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
                    row = {
                        **middle,
                        "cores_busy": middle["cpu_s"] / middle["wall_s"],
                        "size": label,
                        "n_events": n_events,
                        "wall_s": statistics.median(r["wall_s"] for r in runs),
                        "wall_s_runs": [r["wall_s"] for r in runs],
                        "peak_rss_gib": max(r["peak_rss_gib"] for r in runs),
                    }
                rows.append(row)
    finally:
        if not args.keep_data:
            for path in created:
                shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(data_dir / "out", ignore_errors=True)

    print("## Results\n")
    print(summarise(rows))
    print(
        f"\nwall s: the prepare call only (imports and interpreter start excluded), median of "
        f"{args.repeats} run(s) after {args.warmup} uncounted warm-up run(s) of the same job; "
        "events/s: input events / wall s; peak RSS: ru_maxrss "
        "of the job's own process (max over runs).\n"
    )
    print("## Details\n")
    for row in rows:
        if "error" in row:
            continue
        detail = (
            f"- {row['size']} {row['impl']}: CPU {row['cpu_s']:.1f} s "
            f"({row['cores_busy']:.2f} cores busy), {row['users_out']:,} users, "
            f"{row['events']:,} events kept, {row['num_items']:,} item indices, "
            f"output {row['out_mib']:.0f} MiB, process wall {row['process_wall_s']:.1f} s, "
            f"runs {[round(w, 2) for w in row['wall_s_runs']]}, load avg "
            f"{row['load_before']:.1f} -> {row['load_after']:.1f}, api {row['api']}"
        )
        if row.get("step_seconds"):
            steps = ", ".join(f"{k} {v:.2f}" for k, v in row["step_seconds"].items())
            detail += f"; steps (s): {steps}"
        print(detail)
    verdicts = targets(rows, facts["ram_gib"])
    if verdicts:
        print("\n## Targets\n")
        print("\n".join(verdicts))
    if args.json:
        write_json(args.json, {"machine": facts, "results": rows}, indent=2)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
