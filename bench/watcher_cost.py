"""What one poll of the Airflow trigger's health watch costs as a run grows: the old way (read every record
of the run and judge them all, each poll) against the new one (training/core/runs/health_watch.HealthWatch: each sealed
segment read once, only health.jsonl's new lines parsed, the verdict's running state kept), side by side on
the same run folder, at 1 k, 10 k and 100 k records (100 k: a 1 M-step run at the default sampling).

Between polls the job adds `--per-poll` records, as a job measuring every 10th step at 50 steps/s does in the
trigger's 2 s. The run folder is a local folder (an S3 store adds a round trip per object read to both ways:
the old way reads every segment each poll, the new way health.jsonl, one probe and heartbeat.json).

    .venv/bin/python -m bench.watcher_cost [--sizes 1000 10000 100000] [--polls 5] [--per-poll 10]
                                           [--out watcher_cost] [--results-dir DIR]

Results: bench/results/watcher_cost.json and bench/results/watcher_cost.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import gc
import platform
import statistics
import sys
import tempfile
import time

from .results_file import add_results_arguments, write_results

HEALTH = {"every_steps": 10, "checksum_every_steps": 50}


def step_record(n: int):
    from ringflow.training.health.records import record

    return record("step", step=n * 10, epoch=0, step_time=[0.021, 0.022], sync_time=[0.004, 0.005],
                  compute_time=[0.017, 0.017], loss=0.5, grad_norm=1.3, nonfinite_ranks=[],
                  first_nonfinite_step=[None, None], samples_per_sec=3000.0)


def add(log, first: int, count: int) -> None:
    from ringflow.training.health.records import record

    for n in range(first, first + count):
        log.append(step_record(n))
        if n % 5 == 0:
            log.append(record("checksum", step=n * 10, checksums=[12.5, 12.5]))
    log.flush(force=True)


def old_poll(uri: str, cfg) -> str:
    """What the watcher's read_verdict did before: every record, every poll."""
    from .common import read_health
    from ringflow.training.health.verdict import judge
    from ringflow.training.store import open_store

    return judge(read_health(open_store(uri)), cfg).status


def measure(size: int, polls: int, per_poll: int) -> dict:
    from ringflow.training.formats.config import HealthConfig
    from ringflow.training.health.records import HealthLog, record
    from ringflow.training.core.runs.health_watch import HealthWatch
    from ringflow.training.store import LocalFolderStore

    cfg = HealthConfig(**HEALTH)
    with tempfile.TemporaryDirectory(prefix="ringflow-watcher-cost-") as tmp:
        # flush_seconds huge: add() flushes by hand, so segments are sealed at exactly 2,000 lines.
        log = HealthLog(LocalFolderStore(tmp), flush_seconds=1e9, attempt="a1")
        log.append(record("start", step=0, health=HEALTH), force_flush=True)
        steps = size * 5 // 6  # with a checksum every 5th step record, `size` records in all
        for first in range(0, steps, 1_000):
            add(log, first, min(1_000, steps - first))
        watch = HealthWatch(LocalFolderStore(tmp), HEALTH, attempt="a1")
        started = time.perf_counter()
        watch.poll(None, None)  # a (re)started trigger reads the run once
        catch_up = time.perf_counter() - started
        old, new, next_step = [], [], steps
        for _ in range(polls):  # interleaved, so drift in the machine's speed hits both alike
            add(log, next_step, per_poll)
            next_step += per_poll
            gc.collect()  # neither way pays for the other's garbage
            started = time.perf_counter()
            expected = old_poll(tmp, cfg)
            old.append(time.perf_counter() - started)
            gc.collect()
            started = time.perf_counter()
            got = watch.poll(None, None)["status"]
            new.append(time.perf_counter() - started)
            assert got == expected, (got, expected)
    return {"records": size, "old_ms": [t * 1000 for t in old], "new_ms": [t * 1000 for t in new],
            "old_median_ms": statistics.median(old) * 1000, "new_median_ms": statistics.median(new) * 1000,
            "catch_up_ms": catch_up * 1000}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    p.add_argument("--polls", type=int, default=5)
    p.add_argument("--per-poll", type=int, default=10)
    add_results_arguments(p, "watcher_cost")
    args = p.parse_args(argv)
    rows = []
    for size in args.sizes:
        rows.append(measure(size, args.polls, args.per_poll))
        r = rows[-1]
        print(f"{size:>7} records: old {r['old_median_ms']:8.1f} ms/poll, new {r['new_median_ms']:6.2f} ms/poll, "
              f"first poll after a restart {r['catch_up_ms']:.0f} ms", flush=True)
    doc = {"machine": platform.platform(), "polls": args.polls, "per_poll": args.per_poll, "rows": rows}
    lines = ["# Watcher cost per poll", "",
             f"{args.polls} polls per size, {args.per_poll} new step records before each "
             "(plus a checksum record every 5th), old and new way interleaved on the same local run folder; "
             "medians, every poll in watcher_cost.json.", "",
             "| records in the run | old: read and judge everything (ms/poll) | new: HealthWatch.poll (ms/poll) "
             "| old / new | new, first poll after a triggerer restart (ms) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['records']:,} | {r['old_median_ms']:.1f} | {r['new_median_ms']:.2f} | "
                     f"{r['old_median_ms'] / max(r['new_median_ms'], 1e-9):.0f}x | {r['catch_up_ms']:.0f} |")
    lines += ["", "The new poll reads health.jsonl (at most 2,000 lines before it is sealed), probes for the next "
              "sealed segment and reads heartbeat.json: what it costs depends on how full health.jsonl is at "
              "that moment, not on the length of the run. A restarted triggerer reads the run once "
              "(last column) and is flat from its next poll.",
              "", f"Machine: {platform.platform()}, Python {platform.python_version()}."]
    write_results(args, doc, lines, echo=False)  # each size's line is printed as it is measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
