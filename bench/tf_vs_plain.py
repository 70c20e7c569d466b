"""ringflow's TensorFlow engine against a plain TensorFlow multi-worker loop, side by side: np=1 and np=2.

ringflow: `ringflow train` with engine tensorflow at ringflow's defaults (checkpoints at the default cadence
and time floor into a local run folder, health on, a log line every 10 steps) but for the model, batch,
learning rate and epochs; its samples/s is its result.json's. The plain loop: bench/tf_vs_plain_loop.py,
written as TensorFlow's multi-worker custom training loop tutorial writes one (one tf.function step holding
forward, backward, all-reduce, Adam and the loss reduce under strategy.run), its workers started by this
bench in the TF venv with TF_CONFIG on 127.0.0.1 (the same variables ringflow's launcher gives its
workers: launcher.tf_worker_commands), timed the same way (a barrier after the warm-up steps, one at the
end; the slowest worker's rate times the workers). Both: the same Parquet partitions (ringflow's shard
step, bench/common.shards), MLP, batch per worker, Adam, learning rate, steps, one intra-op thread per
worker (bench/common.environment). Jobs alternate ringflow / plain within each repeat (the first of the
pair alternating too), so drifting load hits both alike; the ratio is taken within a repeat.

    .venv/bin/python -m bench.tf_vs_plain [--repeats 5] [--epochs 30] [--communication ring|auto] [--out NAME]

Results: bench/results/<out>.json and <out>.md, with the command (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import (BATCH, CLASSES, FEATURES, HIDDEN, ROWS_PER_RANK, environment, machine, read_health, read_result,
                     shards, spread)
from .peer_worker import LEARNING_RATE
from .results_file import add_results_arguments, write_results
from ringflow.training.rank.samples_rate import WARMUP_STEPS

BIN = Path(sys.executable).parent
RINGFLOW, PLAIN = "ringflow", "plain"
TARGET = 0.97  # ringflow / plain, at np=1 and np=2


def ringflow_job(root: Path, np_: int, epochs: int, communication: str) -> dict:
    """One `ringflow train` job, engine tensorflow: its samples/s after warm-up (result.json)."""
    from ringflow.training.store import LocalFolderStore

    run = root / f"run-{np_}-{time.monotonic_ns()}"
    cfg = {"manifest_uri": str(root / f"shards{np_}" / "manifest.json"), "run_uri": str(run), "engine": "tensorflow",
           "epochs": epochs, "batch_size": BATCH, "learning_rate": LEARNING_RATE, "model": {"hidden": HIDDEN},
           "tensorflow": {"communication": communication}}
    cfg_path = root / f"{run.name}.json"
    cfg_path.write_text(json.dumps(cfg))
    started = time.monotonic()
    out = subprocess.run([str(BIN / "ringflow"), "train", str(cfg_path), "--np", str(np_)],
                         capture_output=True, text=True, env=environment(), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"ringflow np={np_} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    store = LocalFolderStore(str(run))
    result = read_result(store)
    return {"samples_per_sec": result.samples_per_sec_after_warmup, "steps": result.step,
            "job_seconds": time.monotonic() - started, **step_split(read_health(store))}


def step_split(records: list[dict]) -> dict:
    """The measured steps' median step time and the median of the slowest worker's all-reduce time in them
    (the engine's own tf.timestamp()s, health records), in milliseconds: what the all-reduce costs a step."""
    steps = [r for r in records if r.get("type") == "step" and r["step"] > WARMUP_STEPS]
    return {"step_ms": 1e3 * statistics.median(max(r["step_time"]) for r in steps),
            "sync_ms": 1e3 * statistics.median(max(r["sync_time"]) for r in steps)} if steps else {}


def plain_job(root: Path, np_: int, steps: int) -> dict:
    """One job of the plain loop: np_ workers of bench.tf_vs_plain_loop, each on its own partition."""
    from ringflow.training.core.launcher import tf_worker_commands, tensorflow_python
    from ringflow.training.rank.samples_rate import job_samples_per_sec

    tag = time.monotonic_ns()
    procs, outs = [], []
    started = time.monotonic()
    for index, (_, env) in enumerate(tf_worker_commands("unused", np_, tensorflow_python())):
        out = root / f"plain-{np_}-{tag}-{index}.json"
        argv = [tensorflow_python(), "-m", "bench.tf_vs_plain_loop",
                "--partition", str(root / f"shards{np_}" / f"part-{index:05d}.parquet"),
                "--hidden", ",".join(map(str, HIDDEN)), "--classes", str(CLASSES), "--batch", str(BATCH),
                "--lr", str(LEARNING_RATE), "--steps", str(steps), "--out", str(out)]
        procs.append(subprocess.Popen(argv, env=environment() | env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    logs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"plain np={np_} failed:\n" + "\n".join(log[-3000:] for log in logs))
    rows = [json.loads(o.read_text()) for o in outs]
    rate = job_samples_per_sec([r["samples"] for r in rows], [r["seconds"] for r in rows])
    return {"samples_per_sec": rate, "steps": steps, "job_seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of both at np=1 and np=2")
    parser.add_argument("--epochs", type=int, default=30,
                        help=f"epochs of every job ({ROWS_PER_RANK // BATCH} steps per worker each)")
    parser.add_argument("--communication", choices=["ring", "auto"], default="ring",
                        help="ringflow's tensorflow.communication (default: ringflow's own default)")
    add_results_arguments(parser, "tf_vs_plain")
    args = parser.parse_args()
    from ringflow.training.core.launcher import tensorflow_python

    tensorflow_python()  # the TF venv, or a message saying how to make it, before any job runs
    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-tf-plain-"))
    for np_ in (1, 2):
        shards(root, np_)
    steps = args.epochs * (ROWS_PER_RANK // BATCH)
    load_before, started = [round(v, 2) for v in os.getloadavg()], time.monotonic()
    runs: dict[str, dict[int, list[dict]]] = {k: {1: [], 2: []} for k in (RINGFLOW, PLAIN)}
    for repeat in range(args.repeats):
        order = (RINGFLOW, PLAIN) if repeat % 2 == 0 else (PLAIN, RINGFLOW)
        for np_ in (1, 2):
            for kind in order:
                run = (ringflow_job(root, np_, args.epochs, args.communication) if kind == RINGFLOW
                       else plain_job(root, np_, steps))
                runs[kind][np_].append(run)
                print(f"{kind} np={np_}: {run['samples_per_sec']:.0f} samples/s ({run['job_seconds']:.0f} s)",
                      flush=True)
    load_after, minutes = [round(v, 2) for v in os.getloadavg()], (time.monotonic() - started) / 60

    ratio = {np_: [r["samples_per_sec"] / p["samples_per_sec"] for r, p in zip(runs[RINGFLOW][np_], runs[PLAIN][np_])]
             for np_ in (1, 2)}
    scaling = {kind: [b["samples_per_sec"] / a["samples_per_sec"] for a, b in zip(runs[kind][1], runs[kind][2])]
               for kind in (RINGFLOW, PLAIN)}
    lines = ["## ringflow's TensorFlow engine against a plain MultiWorkerMirroredStrategy loop", "",
             f"Data: {ROWS_PER_RANK} random rows of {FEATURES} features per worker (one Parquet partition each, "
             f"ringflow's shard step). Model: MLP {FEATURES} -> {' -> '.join(map(str, HIDDEN))} -> {CLASSES}, "
             f"batch {BATCH} per worker, Adam at {LEARNING_RATE} × workers, {steps} steps per worker "
             f"({args.epochs} epochs), one intra-op thread per worker, TF_CONFIG on 127.0.0.1. ringflow: "
             f"`ringflow train`, engine tensorflow, communication `{args.communication}`, its defaults otherwise "
             "(health on, checkpoints at the default cadence and time floor, a log line every 10 steps); "
             "samples/s from its result.json. plain: bench/tf_vs_plain_loop.py (TensorFlow's multi-worker custom "
             "loop tutorial: one tf.function step, tf.data input, Keras MLP and Adam, default communication "
             "options), timed the same way. "
             f"{args.repeats} repeats, ringflow and plain alternating (which goes first alternating too); "
             "median (min–max); ratios within a repeat.", "",
             f"Host: {machine()['cpus']} CPUs shared with other work; load average (1, 5, 15 min) {load_before} "
             f"before, {load_after} after; {minutes:.1f} minutes in all.", "",
             "| np | ringflow samples/s | plain samples/s | ringflow / plain | target |", "|---|---|---|---|---|"]
    for np_ in (1, 2):
        met = "met" if statistics.median(ratio[np_]) >= TARGET else "not met"
        lines.append(f"| {np_} | {spread([r['samples_per_sec'] for r in runs[RINGFLOW][np_]], 0)} | "
                     f"{spread([r['samples_per_sec'] for r in runs[PLAIN][np_]], 0)} | {spread(ratio[np_])} | "
                     f"≥ {TARGET} ({met}) |")
    lines += ["", "np=2 / np=1 samples/s, per repeat, median (min–max): " +
              "; ".join(f"{k}: {spread(v)}" for k, v in scaling.items()), "",
              "ringflow's step, from its health records (every 10th step after the warm-up; the slowest worker's "
              "step time, and its all-reduce time between the engine's tf.timestamp()s), median per job, then "
              "median (min–max) over the jobs, ms: " +
              "; ".join(f"np={np_}: step {spread([r['step_ms'] for r in runs[RINGFLOW][np_]], 3)}, all-reduce "
                        f"{spread([r['sync_ms'] for r in runs[RINGFLOW][np_]], 3)}" for np_ in (1, 2))]
    write_results(args, {"runs": runs, "ringflow_over_plain": ratio, "np2_over_np1": scaling, "target": TARGET,
                         "steps": steps, "epochs": args.epochs, "repeats": args.repeats,
                         "communication": args.communication, "load_average_before": load_before,
                         "load_average_after": load_after, "minutes": minutes, "machine": machine(),
                         "environment": {k: v for k, v in environment().items() if k.startswith("RINGFLOW")}}, lines)


if __name__ == "__main__":
    main()
