"""A user's size, measured: 1 GB of shards in S3 behind a slow link, a 25 M-parameter model (300 MB
checkpoints with Adam's state), ringflow at its defaults (checkpoints every 50 steps, health on), beside the
same job with checkpoints off, through the same link, in alternating runs.

The workload is the slow test's (tests/real_size_workload.py: the shards, the link of 8 MB/s shared by both
ranks with 20 ms per request, the job and the outside watcher the Airflow trigger runs); the S3 server is moto
on 127.0.0.1 and the link a throttling proxy in front of it (tests/s3_fault_proxy.py).

    .venv/bin/python -m bench.real_sizes [--repeats 1] [--out real_sizes] [--results-dir DIR]

Per run: start-up (launch to the first step record, and the heartbeat's phases), samples/s after warm-up
(result.json), checkpoints (snapshot on the training thread, upload in the background, waits for a previous
upload, bytes; from the `checkpoint` health records), the training thread's time blocked in checkpoints, and
every verdict the outside watcher returned. Results: bench/results/<out>.md and .json.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from .common import Moto, tests_module
from .results_file import add_results_arguments, write_results

# The workload and the throttling proxy are the slow test's own (tests/real_size_workload.py, s3_fault_proxy.py).
workload = tests_module("real_size_workload")
FaultProxy = tests_module("s3_fault_proxy").FaultProxy


def measure(job, folder: Path, run_uri: str, settings, label: str) -> dict:
    from .common import read_health, read_result
    from ringflow.training.store import open_store

    outcome = job.run(folder)
    run = open_store(run_uri, settings)
    result = read_result(run)
    records = read_health(run)
    start = next(r for r in records if r.get("type") == "start")
    first_step = next((r for r in records if r.get("type") == "step"), None)
    written = [r for r in records if r.get("type") == "checkpoint"]
    phases = sorted({phase for _, phase, _ in outcome.watched.phases})
    row = {
        "label": label, "exit_code": outcome.code, "seconds": outcome.seconds,
        "samples_per_sec": result.samples_per_sec_after_warmup if result else None,
        "steps": result.step if result else None,
        "first_step_after_start_record_s": (first_step["time"] - start["time"]) if first_step else None,
        "startup_phases_seen": phases,
        "checkpoints": len(written),
        "checkpoint_bytes": statistics.median(w["bytes"] for w in written) if written else None,
        "snapshot_ms": statistics.median(w["snapshot_seconds"] * 1000 for w in written) if written else None,
        "upload_s": statistics.median(w["write_seconds"] for w in written) if written else None,
        "waited_s": sum(w["waited_seconds"] for w in written),
        "blocked_s": result.checkpoint_blocked_seconds if result else None,
        "step_time_s": statistics.median(max(r["step_time"]) for r in records if r.get("type") == "step"),
        "watcher_verdicts": sorted({v["status"] for v in outcome.watched.verdicts}),
        "verdict": result.verdict.status if result and result.verdict else None,
        "verdict_reason": result.verdict.reason if result and result.verdict else None,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    add_results_arguments(parser, "real_sizes")
    args = parser.parse_args()
    from ringflow.training.store import S3Store

    tmp = Path(tempfile.mkdtemp(prefix="ringflow-bench-real-"))
    moto = Moto(tmp / "moto.log")

    class Server:  # what RealSizeJob needs of the S3 server
        endpoint = moto.endpoint

        @staticmethod
        def env():
            return moto.env()

    rows = []
    try:
        bucket = moto.new_bucket("rf-bench-real")
        began = time.monotonic()
        manifest_uri = workload.write_wide_shards(S3Store.from_settings(bucket, "shards", moto.settings()))
        shard_seconds = time.monotonic() - began
        sizes = [i.size for i in S3Store.from_settings(bucket, "shards", moto.settings()).list("part-")]
        with FaultProxy(moto.endpoint) as proxy:
            proxy.link(bytes_per_second=workload.LINK_BYTES_PER_SECOND, latency=workload.LINK_LATENCY)
            for repeat in range(args.repeats):
                for label, overrides in (("defaults", {}),
                                         ("checkpoints off", {"checkpoint": {"every_steps": 10**6}})):
                    run_uri = f"s3://{bucket}/runs/{label.replace(' ', '-')}-{repeat}"
                    job = workload.RealSizeJob(proxy.endpoint, Server, run_uri, manifest_uri, **overrides)
                    rows.append(measure(job, tmp, run_uri, moto.settings(), label))
    finally:
        moto.stop()
    doc = {"parameters": workload.parameters(), "features": workload.FEATURES, "hidden": workload.HIDDEN,
           "rows_per_partition": workload.ROWS_PER_PARTITION, "batch": workload.BATCH,
           "partitions": workload.PARTITIONS, "partition_bytes": sizes,
           "link_bytes_per_second": workload.LINK_BYTES_PER_SECOND, "link_latency_s": workload.LINK_LATENCY,
           "shard_seconds": shard_seconds, "runs": rows}
    write_results(args, doc, markdown(doc))


def markdown(doc: dict) -> list[str]:
    def med(label, key):
        values = [r[key] for r in doc["runs"] if r["label"] == label and r[key] is not None]
        return statistics.median(values) if values else None

    lines = [
        f"A {doc['parameters'] / 1e6:.1f} M-parameter MLP ({doc['features']} -> {doc['hidden']}), "
        f"{len(doc['partition_bytes'])} partitions of {statistics.mean(doc['partition_bytes']) / 1e6:.0f} MB in S3 "
        f"(moto) behind a link of {doc['link_bytes_per_second'] / 1e6:g} MB/s shared by both ranks with "
        f"{doc['link_latency_s'] * 1000:g} ms a request; 1 epoch, batch {doc['batch']} per rank, 2 ranks on 2 shared "
        f"cores. Sharding the {sum(doc['partition_bytes']) / 1e9:.2f} GB took {doc['shard_seconds']:.0f} s.",
        "",
        "| run | exit | samples/s | step (s) | first step after start (s) | checkpoints | MB each | snapshot (ms) "
        "| upload (s) | waited (s) | training thread blocked (s) | watcher's verdicts | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        lines.append("| " + " | ".join(str(x) for x in (
            r["label"], r["exit_code"], _f(r["samples_per_sec"]), _f(r["step_time_s"], 2),
            _f(r["first_step_after_start_record_s"], 1), r["checkpoints"],
            _f(r["checkpoint_bytes"] / 1e6 if r["checkpoint_bytes"] else None), _f(r["snapshot_ms"]),
            _f(r["upload_s"], 1), _f(r["waited_s"], 1), _f(r["blocked_s"], 1),
            ", ".join(r["watcher_verdicts"]) or "none",
            r["verdict"] + (f": {r['verdict_reason']}" if r.get("verdict_reason") else ""))) + " |")
    on, off = med("defaults", "samples_per_sec"), med("checkpoints off", "samples_per_sec")
    if on and off:
        lines += ["", f"Throughput at the defaults / checkpoints off: {on / off:.3f} (median of runs; the link, "
                      f"not the compute, bounds both: a checkpoint's upload shares the link with the data)."]
    return lines


def _f(value, digits: int = 0):
    return "—" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
