"""Promotion cost on S3 (moto's server on this machine): the promote task (PromoteModelOperator, which copies
the checkpoint server-side and reads the copy once to check its sha256) against the plain way, downloading
the checkpoint to the worker and uploading it again (and the registry's own copy-through path, the same
checks and bookkeeping with the bytes through the worker). Counts the bytes through the worker's sockets (both
directions, HTTP included) and the wall time, side by side, for a few checkpoint sizes.

    .venv/bin/python -m bench.promotion [--sizes-mib 1 64] [--repeats 3] [--out promotion] [--results-dir DIR]

Results: bench/results/promotion.json and bench/results/promotion.md.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import contextlib
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from .common import Moto, machine, use_throwaway_airflow_home
from .results_file import add_results_arguments, write_results


class SocketBytes:
    """Bytes sent and received by this process's sockets while active (socket.socket methods wrapped)."""

    def __init__(self) -> None:
        self.sent = self.received = 0

    @contextlib.contextmanager
    def counting(self):
        cls, saved = socket.socket, {}
        counter = self

        def wrap(name, count):
            original = getattr(cls, name)
            saved[name] = original

            def wrapper(sock, *args, **kwargs):
                result = original(sock, *args, **kwargs)
                count(args, result)
                return result
            setattr(cls, name, wrapper)

        def add_sent(n):
            counter.sent += n

        def add_received(n):
            counter.received += n

        wrap("send", lambda args, r: add_sent(r))
        wrap("sendall", lambda args, r: add_sent(len(memoryview(args[0]).cast("B"))))
        wrap("recv", lambda args, r: add_received(len(r)))
        wrap("recv_into", lambda args, r: add_received(r))
        try:
            yield self
        finally:
            for name, original in saved.items():
                setattr(cls, name, original)

    @property
    def total(self) -> int:
        return self.sent + self.received


def make_run(store, run_key: str, size: int) -> str:
    """A run folder as the train and evaluate steps leave it (a checkpoint of `size` random bytes, its typed
    result and evaluation, written by ringflow's own formats); the checkpoint's name."""
    from ringflow.training.formats.checkpoint import CheckpointStore
    from ringflow.training.formats.eval_result import EvalResult
    from ringflow.training.formats.run_folder import RunFolder
    from ringflow.training.formats.run_result import RunResult
    from ringflow.training.health.verdict import Verdict

    run = RunFolder(store.child(run_key))
    attempt = run.claim("bench-a1")
    name = CheckpointStore(attempt.store).save(100, {"state.pt": os.urandom(size)}, {"step": 100})
    attempt.publish_checkpoint(name, keep_last=None)
    attempt.publish_result(RunResult(status="succeeded", attempt="bench-a1", step=100, epoch=1, world_size=1,
                                     checkpoint=name, verdict=Verdict("HEALTHY", "as judged")).to_json())
    run.write_eval(EvalResult(metrics={"accuracy": 0.9}, checkpoint=name, step=100, rows=100,
                              task="classification", evaluated_at="2026-01-01T00:00:00Z"))
    return name


def promote_task(bucket: str, run_key: str, model: str) -> dict:
    from ringflow.operators.promote import PromoteModelOperator

    op = PromoteModelOperator(task_id="promote", name=model, store_uri=f"s3://{bucket}/ml",
                              run_uri=f"s3://{bucket}/ml/{run_key}", compare_to_production=False)
    result = op.execute(context={})
    assert result["promoted"], result
    return result


def promote_through_worker(store, run_key: str, checkpoint: str, model: str) -> None:
    """The registry's own copy-through path (what it does for runs in another store): the same checks and
    bookkeeping as the promote task, but every file downloaded and uploaded by the worker."""
    from ringflow.training.core.registry.model_registry import ModelRegistry

    ModelRegistry(store).promote(model, run_uri=f"{store.uri.rstrip('/')}/{run_key}", checkpoint=checkpoint,
                                 metrics={"accuracy": 0.9}, source_store=store)


def download_upload(store, run_key: str, checkpoint: str, model: str) -> None:
    from ringflow.training.formats.checkpoint import CheckpointStore

    manifest = CheckpointStore(store.child(run_key)).read_manifest(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        for file in manifest.files:
            local = os.path.join(tmp, file)
            store.get_file(f"{run_key}/{manifest.key(file)}", local)
            store.put_file(f"models/{model}/v1/{file}", local)


def measure(fn) -> tuple[float, int]:
    counter = SocketBytes()
    with counter.counting():
        started = time.perf_counter()
        fn()
        seconds = time.perf_counter() - started
    return seconds, counter.total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 64])
    p.add_argument("--repeats", type=int, default=3)
    add_results_arguments(p, "promotion")
    args = p.parse_args()
    use_throwaway_airflow_home()
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-promote-") as tmp, Moto(Path(tmp) / "moto.log") as moto:
        os.environ["AIRFLOW_CONN_RINGFLOW_S3"] = json.dumps(
            {"conn_type": "aws", "login": moto.access_key, "password": moto.secret_key,
             "extra": {"endpoint_url": moto.endpoint}})
        rows = run_all(moto, args.sizes_mib, args.repeats)

    summary = {"sizes_mib": args.sizes_mib, "repeats": args.repeats, "results": rows,
               "machine": machine(),
               "note": "S3 is moto's server on 127.0.0.1: a server-side copy costs the server's CPU and memory, "
                       "not the network, so on real S3/MinIO the time gap is wider."}
    lines = [f"| promote {r['size_mib']:g} MiB checkpoint (moto S3) | promote task {r['promote_s']:.2f}s, "
             f"{r['promote_mib_through_worker']:.1f} MiB through the worker | download+upload {r['download_upload_s']:.2f}s, "
             f"{r['download_upload_mib_through_worker']:.1f} MiB | registry copy-through {r['registry_copy_through_s']:.2f}s, "
             f"{r['registry_copy_through_mib_through_worker']:.1f} MiB | promote / download+upload: bytes {r['bytes_ratio']:.2f}, "
             f"time {r['time_ratio']:.2f} |" for r in rows]
    print(json.dumps(rows, indent=1))
    write_results(args, summary, lines)


def run_all(moto: Moto, sizes_mib: list[float], repeats: int) -> list[dict]:
    from ringflow.training.store import S3Store

    settings, client = moto.settings(), moto.client()
    rows = []
    for size_mib in sizes_mib:
        size = int(size_mib * 2**20)
        promote, plain, through = [], [], []
        for i in range(repeats + 1):  # the first pair warms up connections and imports
            bucket = f"bench-{int(size_mib * 1000)}-{i}-{os.getpid()}"
            client.create_bucket(Bucket=bucket)
            store = S3Store.from_settings(bucket, "ml", settings)
            a = make_run(store, "runs/a", size)
            make_run(store, "runs/b", size)
            c = make_run(store, "runs/c", size)
            kinds = ("promote", "plain", "through")
            for kind in (kinds if i % 2 else kinds[::-1]):  # alternate the order
                if kind == "promote":
                    promote.append(measure(lambda: promote_task(bucket, "runs/b", "model-b")))
                elif kind == "plain":
                    plain.append(measure(lambda: download_upload(store, "runs/a", a, "model-a")))
                else:
                    through.append(measure(lambda: promote_through_worker(store, "runs/c", c, "model-c")))
            for key in [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]:
                client.delete_object(Bucket=bucket, Key=key)
            client.delete_bucket(Bucket=bucket)
        promote, plain, through = promote[1:], plain[1:], through[1:]
        p_s, p_b = statistics.median(s for s, _ in promote), statistics.median(b for _, b in promote)
        d_s, d_b = statistics.median(s for s, _ in plain), statistics.median(b for _, b in plain)
        t_s, t_b = statistics.median(s for s, _ in through), statistics.median(b for _, b in through)
        row = {"size_mib": size_mib, "promote_s": round(p_s, 3), "promote_mib_through_worker": round(p_b / 2**20, 2),
               "download_upload_s": round(d_s, 3), "download_upload_mib_through_worker": round(d_b / 2**20, 2),
               "registry_copy_through_s": round(t_s, 3),
               "registry_copy_through_mib_through_worker": round(t_b / 2**20, 2),
               "bytes_ratio": round(p_b / d_b, 3), "time_ratio": round(p_s / d_s, 3),
               "all": {"promote": promote, "download_upload": plain, "registry_copy_through": through}}
        print(json.dumps({k: v for k, v in row.items() if k != "all"}), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
