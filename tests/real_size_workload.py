"""A user's size, on this machine: shards of >= 1 GB in an S3 bucket (moto) behind a slow link, a model of
25 M parameters (checkpoints of 300 MB with Adam's state), trained at ringflow's defaults.

Shared by the slow test (tests/training/test_real_sizes.py) and the benchmark (bench/real_sizes.py):

    shards = write_wide_shards(store)                 # 2 partitions of 525 MB, one tensor feature of 16,384
    with FaultProxy(s3.endpoint) as proxy:
        proxy.link(bytes_per_second=LINK_BYTES_PER_SECOND, latency=LINK_LATENCY)
        job = RealSizeJob(proxy.endpoint, s3, run_uri, shards)
        outcome = job.run(faults=[...])                # ringflow train, watched from outside as Airflow does

Why these numbers: each rank's partition must take longer to fetch than the default stall_seconds (120 s)
and a checkpoint's upload longer than a step, while the compute stays small on 2 cores: a wide input (16,384
float32 = 64 KiB a row) into one hidden layer of 1,536 is 25.2 M parameters (100 MB; with Adam's two
moments state.pt is 300 MB) at ~10 GFLOP a step per rank. 8,704 rows a partition (525 MB as Parquet: random
floats do not compress) at 64 a batch are 136 steps an epoch; through an 8 MB/s link shared by both ranks a
partition takes ~130 s, a checkpoint ~40 s.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FEATURES = 16_384
HIDDEN = [1_536]
CLASSES = 10
ROWS_PER_PARTITION = 8_704
PARTITIONS = 2
BATCH = 64
# The link to the "store in another building": both directions share it.
LINK_BYTES_PER_SECOND = 8e6
LINK_LATENCY = 0.02


def parameters() -> int:
    sizes = [FEATURES, *HIDDEN, CLASSES]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def write_wide_shards(store, rows_per_partition: int = ROWS_PER_PARTITION, partitions: int = PARTITIONS,
                      features: int = FEATURES) -> str:
    """Random rows (seeded) with one tensor feature `x` of `features` float32 and a class target, sharded by
    ringflow's own shard step into `store` with no eval split; the manifest's URI."""
    import numpy as np
    import pyarrow as pa

    from ringflow.training.core.sharding import write_shards

    rows = rows_per_partition * partitions
    rng = np.random.default_rng(0)
    values = rng.standard_normal((rows, features), dtype=np.float32)
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), features),
                      "target": rng.integers(0, CLASSES, rows)})
    del values
    write_shards(table, store, target="target", num_partitions=partitions, batch_size=BATCH, eval_fraction=0.0)
    return f"{store.uri.rstrip('/')}/manifest.json"


@dataclasses.dataclass
class Watched:
    """What the watcher outside the job saw while it ran."""

    verdicts: list[dict]          # the verdicts HealthWatch returned, up to the first fatal one
    phases: list[tuple[float, str, dict]]  # (seconds since launch, heartbeat phase, what it had done)
    waits: list[tuple[float, str]]         # (seconds since launch, the store op the job waited for)


@dataclasses.dataclass
class Outcome:
    code: int
    output: str
    seconds: float
    watched: Watched


class RealSizeJob:
    """`ringflow train` of the real-size job on 2 local ranks with S3 at `endpoint` (the proxy), watched
    every `poll` seconds by the same HealthWatch the Airflow trigger runs."""

    def __init__(self, endpoint: str, s3_server, run_uri: str, manifest_uri: str, watch_endpoint: str | None = None,
                 **overrides: Any):
        """endpoint: the S3 endpoint the job uses (the proxy); watch_endpoint: the watcher's (default: the
        server itself, as a triggerer beside the store would; the proxy where the store itself misbehaves)."""
        self.endpoint, self.s3_server, self.run_uri, self.manifest_uri = endpoint, s3_server, run_uri, manifest_uri
        self.watch_endpoint = watch_endpoint or s3_server.endpoint
        self.config = {"manifest_uri": manifest_uri, "run_uri": run_uri, "model": {"kind": "mlp", "hidden": HIDDEN},
                       "epochs": 1, "batch_size": BATCH, "learning_rate": 0.0005} | overrides

    def env(self) -> dict[str, str]:
        # One thread a rank: deterministic sums, so a resumed attempt recomputes a step bit for bit.
        return os.environ | self.s3_server.env() | {"RINGFLOW_S3_ENDPOINT": self.endpoint, "PYTHONUNBUFFERED": "1",
                                                    "RINGFLOW_TORCH_THREADS": "1"}

    def run(self, folder: Path, faults: list[dict] | None = None, poll: float = 2.0, timeout: float = 1200,
            health: dict | None = None) -> Outcome:
        from ringflow.training.formats.config import HealthConfig
        from ringflow.training.core.runs.health_watch import HealthWatch
        from ringflow.training.store import open_store

        cfg = dict(self.config) | ({"faults": faults} if faults else {}) | ({"health": health} if health else {})
        path = folder / f"job-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(cfg))
        env = self.env()
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np",
                                 str(PARTITIONS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)
        lines: list[str] = []
        log_path = path.with_suffix(".log")  # the job's output, kept for whoever reads a failure

        def read_output() -> None:
            with open(log_path, "w") as log:
                for line in proc.stdout:
                    lines.append(line)
                    log.write(line)
                    log.flush()

        reader = threading.Thread(target=read_output, daemon=True)
        reader.start()
        from ringflow.training.store import S3Settings

        settings = S3Settings.from_env(env | {"RINGFLOW_S3_ENDPOINT": self.watch_endpoint})
        run_store = open_store(self.run_uri, settings)
        watch = HealthWatch(run_store, dataclasses.asdict(HealthConfig(**(health or {}))))
        watched = Watched([], [], [])
        while proc.poll() is None and time.monotonic() - started < timeout:
            time.sleep(poll)
            watch.learn_from_log(list(lines))
            # Judged until the first fatal verdict, as the trigger is: it yields that one and stops watching.
            if not any(v.get("fatal") for v in watched.verdicts):
                verdict = watch.poll(time.time(), time.time() - (time.monotonic() - started))
                if verdict is not None:
                    watched.verdicts.append(verdict)
            self._note_heartbeat(run_store, watch.attempt, time.monotonic() - started, watched)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(10)
        return Outcome(proc.returncode, "".join(lines), time.monotonic() - started, watched)

    @staticmethod
    def _note_heartbeat(run_store, attempt, at: float, watched: Watched) -> None:
        from ringflow.training.health.heartbeat import read_heartbeat
        from ringflow.training.formats.run_folder import RunFolder

        beat = read_heartbeat(RunFolder(run_store).current_store())  # the current attempt's (run_folder.py)
        if beat is None or beat.attempt != attempt:
            return
        if beat.step is None:
            watched.phases.append((at, beat.phase, dict(beat.done)))
        if beat.waiting is not None:
            watched.waits.append((at, beat.waiting.what))
