"""A user's size, measured: 1 GB of shards in S3 behind a slow link, a 25 M-parameter model (300 MB
checkpoints with Adam's state), ringflow at its defaults (checkpoints every 50 steps, health on), beside the
same job with checkpoints off, through the same link, in alternating runs.

The workload is the slow test's (tests/real_size_workload.py: the shards, the link of 8 MB/s shared by both
ranks with 20 ms per request, the job and the outside watcher the Airflow trigger runs); the S3 server is moto
on 127.0.0.1 and the link a throttling proxy in front of it (tests/s3_fault_proxy.py).

    .venv/bin/python bench/real_sizes.py [--repeats 1] [--out real_sizes]

Per run: start-up (launch to the first step record, and the heartbeat's phases), samples/s after warm-up
(result.json), checkpoints (snapshot on the training thread, upload in the background, waits for a previous
upload, bytes; from the `checkpoint` health records), the training thread's time blocked in checkpoints, and
every verdict the outside watcher returned. Results: bench/results/<out>.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the workload and the proxy are the slow test's own
from real_size_workload import (BATCH, FEATURES, HIDDEN, LINK_BYTES_PER_SECOND, LINK_LATENCY,  # noqa: E402
                                PARTITIONS, ROWS_PER_PARTITION, RealSizeJob, parameters, write_wide_shards)
from s3_fault_proxy import FaultProxy  # noqa: E402


class Moto:
    """moto's S3 server on 127.0.0.1, and what the job and the shard step need to reach it."""

    access_key, secret_key, region = "ringflow-bench", "ringflow-bench-secret", "us-east-1"

    def __init__(self, log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def env(self) -> dict[str, str]:
        return {"RINGFLOW_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region}

    def settings(self):
        from ringflow.training.store import S3Settings

        return S3Settings(self.endpoint, self.access_key, self.secret_key, self.region)

    def new_bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                     aws_secret_access_key=self.secret_key, region_name=self.region).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()


def measure(job: RealSizeJob, folder: Path, run_uri: str, settings, label: str) -> dict:
    from ringflow.training.health.records import read_health
    from ringflow.training.formats.run_result import read_result
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
    parser.add_argument("--out", default="real_sizes")
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
        manifest_uri = write_wide_shards(S3Store.from_settings(bucket, "shards", moto.settings()))
        shard_seconds = time.monotonic() - began
        sizes = [i.size for i in S3Store.from_settings(bucket, "shards", moto.settings()).list("part-")]
        with FaultProxy(moto.endpoint) as proxy:
            proxy.link(bytes_per_second=LINK_BYTES_PER_SECOND, latency=LINK_LATENCY)
            for repeat in range(args.repeats):
                for label, overrides in (("defaults", {}),
                                         ("checkpoints off", {"checkpoint": {"every_steps": 10**6}})):
                    run_uri = f"s3://{bucket}/runs/{label.replace(' ', '-')}-{repeat}"
                    job = RealSizeJob(proxy.endpoint, Server, run_uri, manifest_uri, **overrides)
                    rows.append(measure(job, tmp, run_uri, moto.settings(), label))
    finally:
        moto.stop()
    doc = {"command": "bench/real_sizes.py " + " ".join(sys.argv[1:]), "parameters": parameters(),
           "features": FEATURES, "hidden": HIDDEN, "rows_per_partition": ROWS_PER_PARTITION, "batch": BATCH,
           "partitions": PARTITIONS, "partition_bytes": sizes, "link_bytes_per_second": LINK_BYTES_PER_SECOND,
           "link_latency_s": LINK_LATENCY, "shard_seconds": shard_seconds, "runs": rows}
    results = HERE / "results"
    (results / f"{args.out}.json").write_text(json.dumps(doc, indent=1))
    (results / f"{args.out}.md").write_text(markdown(doc))
    print(markdown(doc))


def markdown(doc: dict) -> str:
    def med(label, key):
        values = [r[key] for r in doc["runs"] if r["label"] == label and r[key] is not None]
        return statistics.median(values) if values else None

    lines = [
        f"`{doc['command']}`: a {doc['parameters'] / 1e6:.1f} M-parameter MLP ({doc['features']} -> {doc['hidden']}), "
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
    return "\n".join(lines) + "\n"


def _f(value, digits: int = 0):
    return "—" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
