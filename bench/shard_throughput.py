"""Shard step throughput against the floor: a plain pyarrow read of the same Parquet file and a write of it
back (zstd, like the shards). The shard step does more (input gate, content fingerprint, an exact shuffle in
bounded memory through a local spill, per-feature mean/std, one file per worker plus the eval split, sha256
while writing, a manifest): the target is at least 0.9 of the plain copy's throughput. Also the time of a
rerun, which finds the shards and rewrites nothing, and of the fingerprint alone (one streaming read).

    .venv/bin/python -m bench.shard_throughput [--rows 500000] [--cols 64] [--repeats 3] [--out NAME]
                                               [--results-dir DIR]

Results: bench/results/shard_throughput.json and bench/results/shard_throughput.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .common import machine, use_throwaway_airflow_home
from .results_file import add_results_arguments, write_results

TARGET_RATIO = 0.9


def make_table(path: Path, rows: int, cols: int) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    data = {f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(cols)}
    data["target"] = rng.integers(0, 10, rows, dtype=np.int64)
    pq.write_table(pa.table(data), path)
    return path.stat().st_size


def plain_copy(src: Path, out: Path) -> float:
    import pyarrow.parquet as pq

    started = time.perf_counter()
    table = pq.read_table(src)
    pq.write_table(table, out / "copy.parquet", compression="zstd")
    return time.perf_counter() - started


def shard(src: Path, out: Path, workers: int, batch: int) -> tuple[float, dict]:
    from ringflow.operators.shard import shard_dataset

    started = time.perf_counter()
    result = shard_dataset(str(src), str(out), num_partitions=workers, batch_size=batch)
    return time.perf_counter() - started, result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--cols", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    add_results_arguments(p, "shard_throughput")
    args = p.parse_args()
    use_throwaway_airflow_home()

    with tempfile.TemporaryDirectory(prefix="ringflow-bench-shard-") as tmp:
        root = Path(tmp)
        src = root / "table.parquet"
        size = make_table(src, args.rows, args.cols)
        print(f"input: {args.rows} rows x {args.cols + 1} columns, {size / 2**20:.0f} MiB Parquet", flush=True)
        shard(src, root / "warmup", args.workers, args.batch)  # imports, page cache
        plain_copy(src, root)
        from ringflow.training.formats.datasets import fingerprint, open_dataset

        copies, shards, reruns, reads = [], [], [], []
        for i in range(args.repeats):  # side by side, alternating
            copies.append(plain_copy(src, root))
            out = root / f"shards-{i}"
            seconds, result = shard(src, out, args.workers, args.batch)
            shards.append(seconds)
            reruns.append(shard(src, out, args.workers, args.batch)[0])
            shutil.rmtree(out)
            started = time.perf_counter()
            with open_dataset(str(src)) as dataset:
                fingerprint(dataset)
            reads.append(time.perf_counter() - started)
            print(f"  repeat {i + 1}: plain read+write {copies[-1]:.2f}s, shard {shards[-1]:.2f}s, "
                  f"rerun {reruns[-1]:.2f}s (a streaming read + fingerprint alone: {reads[-1]:.2f}s)", flush=True)

    copy_s, shard_s, rerun_s, read_s = (statistics.median(x) for x in (copies, shards, reruns, reads))
    ratio = copy_s / shard_s
    summary = {
        "rows": args.rows, "columns": args.cols + 1, "input_mib": round(size / 2**20, 1), "workers": args.workers,
        "batch_size": args.batch, "repeats": args.repeats,
        "plain_read_write_s": round(copy_s, 3), "shard_s": round(shard_s, 3), "rerun_s": round(rerun_s, 3),
        "read_and_fingerprint_alone_s": round(read_s, 3),
        "plain_rows_per_s": round(args.rows / copy_s), "shard_rows_per_s": round(args.rows / shard_s),
        "throughput_ratio": round(ratio, 3), "target_ratio": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO,
        "partitions": result["partitions"], "rows_per_partition": result["rows_per_partition"],
        "eval_rows": result["eval_rows"], "remainder_rows": result["remainder_rows"],
        "machine": machine(),
        # Each repeat's shard beside its own plain copy: on a busy VM the medians alone can mislead.
        "paired_ratios": [round(c / s_, 3) for c, s_ in zip(copies, shards)],
        "all_runs_s": {"plain": copies, "shard": shards, "rerun": reruns, "read_and_fingerprint": reads},
    }
    line = (f"| shard {args.rows // 1000}k x {args.cols + 1} ({size / 2**20:.0f} MiB) into {args.workers} workers "
            f"| plain pyarrow read+write {copy_s:.2f}s ({args.rows / copy_s / 1e6:.2f}M rows/s) | shard {shard_s:.2f}s "
            f"({args.rows / shard_s / 1e6:.2f}M rows/s) | ratio {ratio:.2f} (target >= {TARGET_RATIO}) "
            f"| each repeat {[round(c / s_, 2) for c, s_ in zip(copies, shards)]} | rerun {rerun_s:.2f}s, nothing rewritten |")
    print(json.dumps({k: v for k, v in summary.items() if k != "all_runs_s"}, indent=1))
    write_results(args, summary, [line])


if __name__ == "__main__":
    main()
