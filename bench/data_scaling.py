"""Peak resident memory of the data steps as the dataset grows: validate, shard and one rank streaming its
partition, on generated tables of 1x, 4x and 16x a base size. Target: flat, each step's peak at 16x within 20 %
of its peak at 1x. Also a rank's training throughput when it streams its partition (row groups, shuffle window,
prefetch) against the same minibatches already in memory, in alternating epochs of one process.

Every measurement is a fresh process (`--child`), so its peak RSS (getrusage ru_maxrss) is that step's alone,
imports included; "after imports" is the RSS before the step starts.

    .venv/bin/python -m bench.data_scaling [--base-rows 300000] [--features 16] [--sizes 1,4,16]
                                           [--out data_scaling] [--results-dir DIR]

Results: bench/results/data_scaling.json and bench/results/data_scaling.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from .common import REPO, importable, machine, module_command, use_throwaway_airflow_home
from .results_file import add_results_arguments, write_results

TARGET_GROWTH = 1.20
REPEATS = 5  # alternating streamed/in-memory epochs for the throughput comparison
INPUT_ROW_GROUP = 65_536  # rows per row group of the generated input (a writer's choice, not the data's size)
STEPS = ("validate", "shard", "rank")


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_table(path: Path, rows: int, features: int, row_group_rows: int = INPUT_ROW_GROUP) -> int:
    """Standard-normal float32 features and a 10-class int64 target, written a row group at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    schema = pa.schema([*[(f"f{i}", pa.float32()) for i in range(features)], ("target", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, rows, row_group_rows):
            n = min(row_group_rows, rows - start)
            data = [pa.array(rng.standard_normal(n, dtype=np.float32)) for _ in range(features)]
            writer.write_batch(pa.record_batch([*data, pa.array(rng.integers(0, 10, n))], schema=schema),
                               row_group_size=n)
    return path.stat().st_size


def suite(features: int) -> dict:
    exps = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "target"}},
            {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "target", "value_set": list(range(10))}},
            {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "target", "min_value": 3, "max_value": 6}}]
    for i in range(features):
        exps.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": f"f{i}"}})
        exps.append({"type": "expect_column_values_to_be_between",
                     "kwargs": {"column": f"f{i}", "min_value": -20, "max_value": 20}})
    return {"name": "bench", "expectations": exps}


# -- children: one step each ----------------------------------------------------------------------------

def child(step: str, data: Path, shards: Path, features: int, batch: int) -> dict:
    os.environ.setdefault("RINGFLOW_STORE", str(shards.parent / "store"))
    if step == "validate":
        from ringflow.training.core.validation.stream import validate_dataset
        from ringflow.training.core.validation.suite import load_suite
        from ringflow.training.formats.datasets import open_dataset
        baseline = rss_mb()
        started = time.perf_counter()
        with open_dataset(str(data)) as dataset:
            summary = validate_dataset(dataset, load_suite(suite(features)), target="target")
        assert summary.success, summary.message(str(data))
        extra = {"rows": summary.rows, "sample_rows": summary.sample_rows}
    elif step == "shard":
        from ringflow.operators.shard import shard_dataset
        baseline = rss_mb()
        started = time.perf_counter()
        result = shard_dataset(str(data), str(shards), num_partitions=2, batch_size=batch)
        (shards / "manifest_uri").write_text(result["manifest_uri"])
        extra = {"rows_per_partition": result["rows_per_partition"]}
    elif step in ("rank", "rank_throughput"):
        import statistics

        import torch
        from ringflow.training.formats.config import ModelConfig
        from ringflow.training.rank.data import Cursor, PartitionData
        from ringflow.training.formats.manifest import load_manifest
        from ringflow.training.rank.models import build_model

        torch.set_num_threads(1)
        manifest, store = load_manifest((shards / "manifest_uri").read_text())
        baseline = rss_mb()
        data_ = PartitionData(store, manifest, rank=0, world_size=2, batch_size=batch)
        model, loss_fn = build_model(ModelConfig(), manifest.schema.num_features, manifest.schema.num_outputs,
                                     manifest.schema.task)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def train(batches) -> float:
            began, samples = time.perf_counter(), 0
            for _, x, y in batches:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                samples += len(x)
            return samples / (time.perf_counter() - began)

        started = time.perf_counter()
        if step == "rank":  # one epoch, streamed: the memory figure
            extra = {"samples_per_s": round(train(data_.batches(seed=0, cursor=Cursor(0, 0))))}
        else:  # epochs streamed and the same epochs' minibatches from memory, alternating (this VM drifts)
            streamed, in_memory = [], []
            for epoch in range(REPEATS):
                streamed.append(train(data_.batches(seed=0, cursor=Cursor(epoch, 0))))
                held = [(b, x.clone(), y.clone()) for b, x, y in data_.batches(seed=0, cursor=Cursor(epoch, 0))]
                in_memory.append(train(held))
                del held
            ratios = [s / m for s, m in zip(streamed, in_memory)]
            extra = {"streamed_samples_per_s": [round(v) for v in streamed],
                     "in_memory_samples_per_s": [round(v) for v in in_memory],
                     "ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3)}
    else:
        raise SystemExit(f"unknown step {step!r}")
    return {"step": step, "seconds": round(time.perf_counter() - started, 2), "after_imports_mb": round(baseline, 1),
            "peak_mb": round(peak_mb(), 1), **extra}


def run_child(step: str, data: Path, shards: Path, args) -> dict:
    cmd = module_command(__spec__.name, "--child", step, "--data", str(data), "--shards", str(shards),
                         "--features", str(args.features), "--batch", str(args.batch))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=importable(dict(os.environ)),
                          timeout=900)
    if proc.returncode:
        raise SystemExit(f"{step} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base-rows", type=int, default=300_000)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--sizes", default="1,4,16")
    p.add_argument("--batch", type=int, default=64)
    add_results_arguments(p, "data_scaling")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--shards", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.data), Path(args.shards), args.features, args.batch)))
        return
    use_throwaway_airflow_home()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[str, dict] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-scaling-") as tmp:
        root = Path(tmp)
        for size in sizes:
            rows = args.base_rows * size
            data = root / f"table-{size}x.parquet"
            file_bytes = make_table(data, rows, args.features)
            shards = root / f"shards-{size}x"
            entry = {"rows": rows, "parquet_mib": round(file_bytes / 2**20, 1),
                     "raw_mib": round(rows * (args.features * 4 + 8) / 2**20, 1)}
            for step in STEPS:
                entry[step] = run_child(step, data, shards, args)
                print(f"{size:>3}x {rows:>9} rows: {step:<8} peak {entry[step]['peak_mb']:7.1f} MB "
                      f"(after imports {entry[step]['after_imports_mb']:.1f}) in {entry[step]['seconds']:.1f}s",
                      flush=True)
            if size == sizes[min(1, len(sizes) - 1)]:  # long enough epochs to time, small enough to hold
                entry["rank_throughput"] = run_child("rank_throughput", data, shards, args)
                print(f"{size:>3}x rank streamed vs in memory: {entry['rank_throughput']['ratios']}", flush=True)
                throughput = entry["rank_throughput"]
            runs[f"{size}x"] = entry
            data.unlink()
    first, last = runs[f"{sizes[0]}x"], runs[f"{sizes[-1]}x"]
    growth = {step: round(last[step]["peak_mb"] / first[step]["peak_mb"], 3) for step in STEPS}
    streaming_ratio = throughput["median_ratio"]
    summary = {
        "base_rows": args.base_rows, "features": args.features, "batch_size": args.batch, "sizes": sizes,
        "peak_growth_largest_vs_smallest": growth, "target_growth": TARGET_GROWTH,
        "meets_target": all(g <= TARGET_GROWTH for g in growth.values()),
        "rank_streaming_vs_in_memory_samples_per_s": streaming_ratio,
        "total_seconds": round(time.perf_counter() - started, 1),
        "machine": machine(), "runs": runs,
    }
    lines = [f"Peak resident memory (MB, whole process) on a {os.cpu_count()}-core machine; "
             f"{args.features} float32 features + int64 target, base {args.base_rows} rows.", "",
             "| size | rows | raw data MiB | validate | shard | one rank (1 epoch) |", "|---|---|---|---|---|---|"]
    for key, entry in runs.items():
        lines.append(f"| {key} | {entry['rows']:,} | {entry['raw_mib']} | " + " | ".join(
            f"{entry[s]['peak_mb']:.0f} ({entry[s]['seconds']:.1f}s)" for s in STEPS) + " |")
    lines += ["", f"Growth of the peak from {sizes[0]}x to {sizes[-1]}x: "
              + ", ".join(f"{s} {g:.2f}x" for s, g in growth.items())
              + f" (target <= {TARGET_GROWTH}: {'met' if summary['meets_target'] else 'NOT met'}).",
              f"A rank streaming its partition trains at {streaming_ratio:.2f} (median of {REPEATS} alternating "
              f"epochs: {throughput['ratios']}) of the samples/s of the same minibatches already in memory "
              f"(1 torch thread, the default MLP on {args.features} features: a model so small that data "
              f"loading is the largest share it can ever be)."]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
