"""The cost of world-size-free shards (issue 21): per-rank partitions (the code of the last revision that had them,
or --baseline's, run from a temporary export of that revision) against this checkout's layout (a v4 manifest: one global stream per epoch,
dealt to the ranks by the global cursor), on the same dataset of a few hundred MB of float32 rows.

1. Shard time: `ringflow shard` of the same Parquet dataset into 2 partition files, by each revision, in
   alternating order, `--repeats` times each.
2. Training throughput: a 2-worker Horovod job (the small MLP of the throughput benches, one epoch, the
   defaults otherwise, but Horovod's cycle time, which both revisions get at the baseline's default,
   SAME_TUNING, so the jobs differ by their data path and loop, not by a knob) on each revision's shards, by
   that revision, alternating; samples/s after warm-up as the job's result.json counts it (the slowest
   rank's rate times the ranks).

3. With `--feeds stream memory`, each revision's job is run twice a repeat: streaming (as above) and fed from
   memory (bench/memory_feed/: each rank reads its whole epoch before the first step, outside the timed
   steps, and the loader thread is idle after it). Between the revisions, the memory-fed ratio is the training
   loops' alone; each revision's streaming / memory-fed ratio is what its reader costs the job.

Ratios are this checkout's over the baseline's: the ratio of the medians, and the ratio within each repeat
(median, min–max), measured side by side: the machine is shared, so absolute figures vary run to run and only
the ratios are meant to be compared.

    .venv/bin/python -m bench.sharding_order [--rows 400000] [--repeats 4] [--baseline REV]
                                             [--feeds stream [memory]] [--out NAME] [--results-dir DIR]

Results: bench/results/<out>.json and <out>.md, with the command (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BATCH, CLASSES, FEATURES, HIDDEN, REPO, importable, machine, spread
from .results_file import add_results_arguments, write_results

THIS, BASELINE = "this checkout (v4: one global stream)", "baseline (per-rank partitions)"
# The last revision whose shards were per-rank partitions (this branch's starting point on main): the default
# baseline, which stays right after the world-size-free layout is merged into main.
PER_RANK_REVISION = "eed7b695ae67ef67003cf6a07a9b4db3b78e2b95"


def export_revision(revision: str, into: Path) -> dict[str, str]:
    """`revision`'s training package under into/, importable as `ringflow.training` ahead of the editable
    install (PYTHONPATH wins over its finder); the environment that runs it (its ranks inherit it)."""
    src, pkg = into / "src", into / "pkg" / "ringflow"
    src.mkdir(parents=True)
    pkg.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "training"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (pkg / "training").symlink_to(src / "training")
    (pkg / "__init__.py").write_text("")
    env = importable(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join([str(into / "pkg"), env["PYTHONPATH"]])
    return env


def write_dataset(path: Path, rows: int) -> int:
    """Random classification rows (FEATURES float32 columns, an int target), seeded; its size in bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    schema = pa.schema([*[(f"f{i}", pa.float32()) for i in range(FEATURES)], ("target", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            x = rng.standard_normal((n, FEATURES)).astype("float32")
            columns = [pa.array(x[:, i]) for i in range(FEATURES)] + [pa.array(rng.integers(0, CLASSES, n))]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return rows * (FEATURES * 4 + 8)


def partitions_flag(env: dict[str, str]) -> str:
    """How the revision `env` runs names the shard step's file count: `--partitions` since 6134c7d, `--workers`
    before (the per-rank baseline's spelling, which this checkout refuses)."""
    help_text = subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "shard", "--help"], env=env,
                               capture_output=True, text=True).stdout
    return "--partitions" if "--partitions" in help_text else "--workers"


def shard(env: dict[str, str], dataset: Path, out: Path) -> float:
    flag = partitions_flag(env)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "shard", str(dataset), str(out),
                    flag, "2", "--batch-size", str(BATCH), "--eval-fraction", "0.0"],
                   env=env, check=True, capture_output=True)
    return time.perf_counter() - started


# What both revisions' jobs are given beside their defaults: the baseline's Horovod cycle time (this checkout's
# default is shorter, bench/results/scaling_breakdown.md).
SAME_TUNING = {"horovod": {"cycle_time_ms": 1.0}}


STREAM, MEMORY = "stream", "memory"
FEEDS = {STREAM: "streaming", MEMORY: "fed from memory"}
MEMORY_FEED = Path(__file__).parent / "memory_feed"


def fed(env: dict[str, str], feed: str) -> dict[str, str]:
    """`env` whose ranks are fed as `feed` says: the memory feed's sitecustomize first on their PYTHONPATH."""
    if feed == STREAM:
        return env
    return env | {"PYTHONPATH": os.pathsep.join([str(MEMORY_FEED), env["PYTHONPATH"]])}


def train(env: dict[str, str], manifest: Path, run: Path, feed: str = STREAM) -> float:
    config = run.with_suffix(".json")
    config.write_text(json.dumps({"manifest_uri": str(manifest), "run_uri": str(run), "epochs": 1,
                                  "batch_size": BATCH, "learning_rate": 0.01, "engine": "horovod",
                                  "model": {"hidden": HIDDEN}} | SAME_TUNING))
    proc = subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "train", str(config), "--np", "2"],
                          env=fed(env, feed), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the job on {manifest} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    said = (proc.stdout + proc.stderr).count("[bench] memory feed:")
    if said != (2 if feed == MEMORY else 0):  # both ranks, or neither
        raise SystemExit(f"the {FEEDS[feed]} job on {manifest}: {said} rank(s) said they were fed from memory")
    from .common import read_result
    from ringflow.training.store import LocalFolderStore

    return float(read_result(LocalFolderStore(str(run))).samples_per_sec_after_warmup)


def arm(name: str, feed: str) -> str:
    """A job's row in the results: the revision, and how it was fed when more than one feed was run."""
    return name if feed == STREAM else f"{name}, {FEEDS[feed]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000, help="dataset rows (default: ~200 MB of float32)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--baseline", default=PER_RANK_REVISION,
                        help="the git revision to compare against (default: the last with per-rank partitions)")
    parser.add_argument("--feeds", nargs="+", choices=list(FEEDS), default=[STREAM],
                        help="how each revision's job is fed: streaming (the default), and/or from memory "
                             "(bench/memory_feed/)")
    add_results_arguments(parser, "sharding_order")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-sharding-order-"))
    try:
        envs = {BASELINE: export_revision(args.baseline, root / "baseline"), THIS: importable(dict(os.environ))}
        dataset = root / "data.parquet"
        data_bytes = write_dataset(dataset, args.rows)
        shard_seconds: dict[str, list[float]] = {name: [] for name in envs}
        rates: dict[str, list[float]] = {arm(name, feed): [] for feed in args.feeds for name in envs}
        for r in range(args.repeats):
            order = list(envs) if r % 2 == 0 else list(reversed(envs))
            feeds = args.feeds if r % 2 == 0 else list(reversed(args.feeds))
            for name in order:
                out = root / f"shards-{r}-{list(envs).index(name)}"
                shard_seconds[name].append(shard(envs[name], dataset, out))
            for feed in feeds:
                for name in order:
                    index = list(envs).index(name)
                    rates[arm(name, feed)].append(train(envs[name], root / f"shards-{r}-{index}" / "manifest.json",
                                                        root / f"run-{r}-{index}-{feed}", feed))
            for name in envs:  # a few hundred MB each: only one repeat's on disk at a time
                shutil.rmtree(root / f"shards-{r}-{list(envs).index(name)}", ignore_errors=True)
                for feed in args.feeds:
                    shutil.rmtree(root / f"run-{r}-{list(envs).index(name)}-{feed}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def ratio(series: dict[str, list[float]], this: str = THIS, base: str = BASELINE) -> float:
        return statistics.median(series[this]) / statistics.median(series[base])

    def per_repeat(series: dict[str, list[float]], this: str = THIS, base: str = BASELINE) -> list[float]:
        return [a / b for a, b in zip(series[this], series[base])]

    summary = {"rows": args.rows, "data_mb": round(data_bytes / 2**20), "baseline": args.baseline,
               "repeats": args.repeats, "feeds": args.feeds, "shard_seconds": shard_seconds,
               "samples_per_sec": rates, "shard_time_ratio": ratio(shard_seconds),
               "shard_time_ratio_per_repeat": per_repeat(shard_seconds), "same_tuning": SAME_TUNING,
               "machine": machine()}
    lines = [f"# World-size-free shards against per-rank partitions ({args.rows:,} rows, "
             f"{summary['data_mb']} MB of float32 rows, 2 files, 2 Horovod workers)", "",
             "| | shard time, s | training, samples/s |", "|---|---|---|"]
    for feed in args.feeds:
        for name in (BASELINE, THIS):
            shard_cell = spread(shard_seconds[name], 1) if feed == args.feeds[0] else ""
            lines.append(f"| {arm(name, feed)} | {shard_cell} | {spread(rates[arm(name, feed)], 0)} |")
    for feed in args.feeds:
        this, base = arm(THIS, feed), arm(BASELINE, feed)
        summary[f"throughput_ratio_{feed}"] = ratio(rates, this, base)
        summary[f"throughput_ratio_{feed}_per_repeat"] = per_repeat(rates, this, base)
        shard_cells = (f"**{summary['shard_time_ratio']:.2f}**", spread(summary["shard_time_ratio_per_repeat"])) \
            if feed == args.feeds[0] else ("", "")
        what = "" if len(args.feeds) == 1 else f", {FEEDS[feed]}"
        lines += [f"| **ratio, this / baseline{what}** | {shard_cells[0]} | "
                  f"**{summary[f'throughput_ratio_{feed}']:.2f}** |",
                  f"| ratio within each repeat{what} | {shard_cells[1]} | "
                  f"{spread(summary[f'throughput_ratio_{feed}_per_repeat'])} |"]
    if set(args.feeds) == set(FEEDS):  # what each revision's reader costs its job
        for name in (BASELINE, THIS):
            key = "reader_cost_" + ("this" if name == THIS else "baseline")
            summary[key] = per_repeat(rates, arm(name, STREAM), arm(name, MEMORY))
            lines.append(f"| {name}: streaming / fed from memory, within each repeat | | {spread(summary[key])} |")
    lines += ["", f"Medians (min–max) of {args.repeats} repeats, the revisions (and feeds) alternating; baseline = "
              f"`{args.baseline}`, run from an export of that revision. Every job is given {json.dumps(SAME_TUNING)} "
              f"beside its defaults. Machine: {machine()['cpus']} CPUs, shared."]
    if MEMORY in args.feeds:
        lines.append("Fed from memory: each rank reads its whole epoch before the first step (bench/memory_feed/), "
                     "outside the timed steps, its loader thread idle after it.")
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
