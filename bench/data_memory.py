"""The data steps inside a memory cgroup: validate and shard, each in its own process inside a 512 MiB memory
cgroup, against a plain pyarrow copy of the same file (read each row group, write it to a new Parquet file)
in the same cgroup, run side by side. Targets: both steps pass (no OOM kill) on every table, and run at
>= 0.9x the plain copy's speed.

The tables: `--rows` rows of `--features` float32 features and an int64 10-class target in `--row-groups`
row groups (a 3 M x 64 table is 792 MB of raw values), and each `--scales` multiple of it with the same
number of row groups, so that both the rows and the input's row groups grow.

Each run is what the task runs: the shard task's `ShardDatasetOperator.execute` (2 workers, batch 64) and the
validate task's `ValidateDatasetOperator.execute` (a small suite: a column map expectation on every row, an
aggregate on a sample, the row count; the input gate on every feature and the target), Airflow imported as in a
task. Recorded per run: pass/OOM, the cgroup's peak usage (memory.max_usage_in_bytes: the process and the page
cache it charged, so it reaches the limit whenever a step writes more than the limit), the cgroup's peak
anonymous memory (sampled every 20 ms: what the kernel cannot reclaim), the process's peak RSS (wait4; shared
libraries included), the step's own seconds and the process's wall seconds. Repeats alternate the order of
copy and step, and each repeat's ratio is copy seconds / step seconds (> 1: the step is faster).

Run it as root: it creates memory cgroups (v1 or v2), and says so and exits 1 when it cannot. It needs about
3x the largest table's size of free disk in $TMPDIR.

    .venv/bin/python -m bench.data_memory [--rows 3000000] [--features 64] [--row-groups 12] \\
        [--scales 1,2] [--limit-mib 512] [--repeats 3] [--out data_memory] [--results-dir DIR]

Results: bench/results/data_memory.json and bench/results/data_memory.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .common import REPO, importable, machine, module_command, tests_module, use_throwaway_airflow_home
from .data_scaling import make_table
from .results_file import add_results_arguments, write_results

TARGET_RATIO = 0.9
STEPS = ("shard", "validate")
COPY = "copy"


def suite(features: int) -> dict:
    """Every row: a column map expectation on a feature and on the target (plus the input gate, which the task
    runs on every feature and the target); a sample: an aggregate; the exact row count."""
    return {"name": "bench", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "f0", "min_value": -20, "max_value": 20}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "target", "value_set": list(range(10))}},
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": f"f{features - 1}", "min_value": -0.1,
                                                                "max_value": 0.1}},
    ]}


# -- children: one run each, inside the cgroup -------------------------------------------------------

def child(step: str, data: Path, out: Path, features: int) -> dict:
    """One run; its seconds start once the imports are done (they do not grow with the data; the process's
    wall time, measured outside, has them)."""
    import pyarrow.parquet as pq

    if step == COPY:
        started = time.perf_counter()
        source = pq.ParquetFile(data)
        with pq.ParquetWriter(out / "copy.parquet", source.schema_arrow, compression="zstd") as writer:
            for g in range(source.num_row_groups):
                writer.write_table(source.read_row_group(g))
        return {"seconds": time.perf_counter() - started}
    use_throwaway_airflow_home()
    if step == "shard":
        from ringflow.operators.shard import ShardDatasetOperator

        started = time.perf_counter()
        result = ShardDatasetOperator(task_id="shard", dataset_uri=str(data), output_uri=str(out), num_partitions=2,
                                      batch_size=64).execute({})
        assert not result["reused"], result
        return {"seconds": time.perf_counter() - started, "rows_per_partition": result["rows_per_partition"]}
    import great_expectations  # noqa: F401  (the validate task imports it on its first call)

    from ringflow.operators.validate import ValidateDatasetOperator

    started = time.perf_counter()
    result = ValidateDatasetOperator(task_id="validate", dataset_uri=str(data), suite=suite(features)).execute({})
    return {"seconds": time.perf_counter() - started, "rows": result["rows"], "sample_rows": result["sample_rows"]}


def run_child(group, step: str, data: Path, out: Path, features: int) -> dict:
    out.mkdir()
    try:
        measured = group.run(module_command(__spec__.name, "--child", step, "--data", str(data), "--child-out",
                                            str(out), "--features", str(features)),
                             env=importable(dict(os.environ)), cwd=str(REPO), timeout=1800)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    entry = measured.summary()
    if measured.passed:
        entry.update(json.loads(measured.stdout.strip().splitlines()[-1]))
        entry["seconds"] = round(entry["seconds"], 2)
    else:
        entry["stderr_tail"] = measured.stderr[-1500:]
    return entry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--row-groups", type=int, default=12)
    p.add_argument("--scales", default="1,2")
    p.add_argument("--limit-mib", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    add_results_arguments(p, "data_memory")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.data), Path(args.child_out), args.features)))
        return
    cgroups = tests_module("memory_cgroup")  # the memory tests' own cgroup runner
    CgroupUnavailable, memory_cgroup = cgroups.CgroupUnavailable, cgroups.memory_cgroup
    limit = args.limit_mib * 2**20
    try:
        with memory_cgroup(limit, "bench-probe"):
            pass
    except CgroupUnavailable as exc:
        raise SystemExit(f"bench.data_memory measures inside memory cgroups and cannot make one here: {exc}")
    scales = [int(s) for s in args.scales.split(",")]
    tables: dict[str, dict] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-memory-") as tmp:
        root = Path(tmp)
        for scale in scales:
            rows = args.rows * scale
            data = root / f"table-{scale}x.parquet"
            size = make_table(data, rows, args.features, row_group_rows=-(-rows // args.row_groups))
            entry = {"rows": rows, "row_groups": args.row_groups, "parquet_mib": round(size / 2**20, 1),
                     "raw_mb": round(rows * (args.features * 4 + 8) / 1e6), "runs": {s: [] for s in (COPY, *STEPS)}}
            print(f"{scale}x: {rows:,} rows x {args.features + 1} columns, {args.row_groups} row groups, "
                  f"{entry['raw_mb']} MB raw, {entry['parquet_mib']} MiB Parquet", flush=True)
            for repeat in range(args.repeats):
                for step in STEPS:  # side by side with the copy, which goes first in every other repeat
                    order = (COPY, step) if repeat % 2 == 0 else (step, COPY)
                    pair = {}
                    for name in order:
                        with memory_cgroup(limit, f"bench-{name}") as group:
                            pair[name] = run_child(group, name, data, root / "out", args.features)
                        entry["runs"][name].append(pair[name])
                        print(f"  repeat {repeat} {name:<8} {pair[name]['outcome']:<5} "
                              f"{pair[name].get('seconds', float('nan')):6.1f}s (process {pair[name]['wall_s']:.1f}s) "
                              f"anon peak {pair[name]['anon_peak_mib']:6.1f} MiB, cgroup peak "
                              f"{pair[name]['cgroup_peak_mib']:6.1f}, RSS peak {pair[name]['peak_rss_mib']:6.1f}",
                              flush=True)
                    if pair[COPY]["outcome"] == pair[step]["outcome"] == "pass":
                        pair[step]["ratio_vs_copy"] = round(pair[COPY]["seconds"] / pair[step]["seconds"], 3)
            data.unlink()
            tables[f"{scale}x"] = entry
    summary = {"limit_mib": args.limit_mib, "features": args.features, "scales": scales, "repeats": args.repeats,
               "target_ratio": TARGET_RATIO, "total_seconds": round(time.perf_counter() - started, 1),
               "machine": machine(), "tables": tables}
    for entry in tables.values():
        entry["summary"] = {}
        for name, runs in entry["runs"].items():
            ratios = [r["ratio_vs_copy"] for r in runs if "ratio_vs_copy" in r]
            passed = [r for r in runs if r["outcome"] == "pass"]
            entry["summary"][name] = {
                "passed": f"{len(passed)}/{len(runs)}",
                "anon_peak_mib": max(r["anon_peak_mib"] for r in runs),
                "cgroup_peak_mib": max(r["cgroup_peak_mib"] for r in runs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                "median_seconds": statistics.median(r["seconds"] for r in passed) if passed else None,
                "median_process_wall_s": statistics.median(r["wall_s"] for r in passed) if passed else None,
                "median_process_cpu_s": statistics.median(r["cpu_s"] for r in passed) if passed else None,
                "ratios_vs_copy": ratios, "median_ratio_vs_copy": statistics.median(ratios) if ratios else None}
    summary["meets_target"] = all(
        s["passed"].split("/")[0] == s["passed"].split("/")[1]
        and (name == COPY or (s["median_ratio_vs_copy"] or 0) >= TARGET_RATIO)
        for entry in tables.values() for name, s in entry["summary"].items() if name in STEPS)
    lines = [f"Each run in its own process inside a {args.limit_mib} MiB memory cgroup (swap included), on a "
             f"{os.cpu_count()}-core machine; {args.features} float32 features + an int64 target, "
             f"{args.row_groups} row groups. Peaks are the largest over the repeats: anon = the cgroup's "
             "anonymous memory (sampled every 20 ms; what cannot be reclaimed), cgroup = memory.max_usage_in_bytes "
             "(page cache of files read and written included, reclaimed at the limit), RSS = the process's "
             "(shared libraries included). Speed: the plain copy's seconds / the step's seconds in the same "
             "repeat, copy and step side by side in alternating order; a step's seconds start after its imports "
             "(the process's wall and CPU seconds include them). The plain copy: ParquetFile.read_row_group and "
             "ParquetWriter(compression='zstd'), pyarrow's defaults otherwise.", "",
             "| table | step | passed | anon peak MiB | cgroup peak MiB | RSS peak MiB | median s (process wall, cpu) "
             "| speed vs plain copy (median; each repeat) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, entry in tables.items():
        for name in (COPY, *STEPS):
            s = entry["summary"][name]
            speed = "—" if name == COPY else (
                f"**{s['median_ratio_vs_copy']:.2f}** ({', '.join(f'{r:.2f}' for r in s['ratios_vs_copy'])})"
                if s["ratios_vs_copy"] else "n/a")
            seconds = (f"{s['median_seconds']:.1f} ({s['median_process_wall_s']:.1f}, {s['median_process_cpu_s']:.1f})"
                       if s["median_seconds"] is not None else "—")
            label = "plain pyarrow copy" if name == COPY else name
            lines.append(f"| {key}: {entry['rows']:,} rows, {entry['raw_mb']} MB raw | {label} | {s['passed']} | "
                         f"{s['anon_peak_mib']:.0f} | {s['cgroup_peak_mib']:.0f} | {s['peak_rss_mib']:.0f} | "
                         f"{seconds} | {speed} |")
    lines += ["", f"Target: shard and validate pass every run and run at >= {TARGET_RATIO}x the plain copy's speed: "
              f"{'met' if summary['meets_target'] else 'NOT met'}."]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
