"""The three engines side by side: Horovod, DDP and TensorFlow train the same data, model, batch and steps, at
np=1 and np=2, through `ringflow train` as a user runs it; each job's samples/s (its result.json), the accuracy
the evaluate step gives its final checkpoint (the torch evaluate, which reads the TF ranks' model.npz too), and
each engine's rate over Horovod's in the same repeat.

The data is learnable, so the metric says whether every engine trained the same model: random features and
a target that a fixed random linear map of them decides (argmax), an eval split held out by ringflow's own
shard step. np=1 and np=2 read the same rows (one partition, or two halves), for the same epochs: np=2 takes
half the steps per rank with twice the global batch. Jobs alternate engine by engine within each repeat, so
drifting load on this shared machine hits all three alike; the host's load average is noted before and after.

    .venv/bin/python -m bench.engines_crosscheck [--repeats 2] [--epochs 4] [--out NAME] [--results-dir DIR]

Results: bench/results/<out>.json and <out>.md, with the command (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BATCH, CLASSES, FEATURES, HIDDEN, ROWS_PER_RANK, environment, machine, shown_environment, spread
from .peer_worker import LEARNING_RATE  # the learning rate the throughput benches train with
from .results_file import add_results_arguments, write_results
from ringflow.training.formats.engines import ENGINES, HOROVOD

BIN = Path(sys.executable).parent
BASELINE = HOROVOD
# Rows held out for the evaluate step: its accuracy is each engine's final metric.
EVAL_FRACTION = 0.2


def write_learnable_shards(folder: Path, partitions: int) -> str:
    """Shards of 2 * ROWS_PER_RANK training rows (plus the eval split) whose target a fixed linear map of the
    features decides, seeded: the same rows for every engine and both worker counts; their manifest's path."""
    import numpy as np
    import pandas as pd

    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    rng = np.random.default_rng(0)
    rows = round(2 * ROWS_PER_RANK / (1 - EVAL_FRACTION))
    features = rng.standard_normal((rows, FEATURES)).astype("float32")
    frame = pd.DataFrame(features, columns=[f"f{i}" for i in range(FEATURES)])
    frame["target"] = np.argmax(features @ rng.standard_normal((FEATURES, CLASSES)), axis=1)
    write_shards(frame, LocalFolderStore(str(folder)), target="target", num_partitions=partitions,
                 batch_size=BATCH, eval_fraction=EVAL_FRACTION)
    return str(folder / "manifest.json")


def train_and_evaluate(root: Path, manifest: str, engine: str, np_: int, epochs: int) -> dict:
    """One `ringflow train` job at ringflow's defaults but for the model, batch, learning rate and epochs,
    then the evaluate step on its final checkpoint: its samples/s after warm-up, steps and accuracy."""
    from ringflow.training.core.evaluate import evaluate
    from .common import read_result
    from ringflow.training.store import LocalFolderStore

    run = root / f"run-{engine}-{np_}-{time.monotonic_ns()}"
    cfg = {"manifest_uri": manifest, "run_uri": str(run), "engine": engine, "epochs": epochs, "batch_size": BATCH,
           "learning_rate": LEARNING_RATE, "model": {"hidden": HIDDEN}}
    cfg_path = root / f"{run.name}.json"
    cfg_path.write_text(json.dumps(cfg))
    started = time.monotonic()
    out = subprocess.run([str(BIN / "ringflow"), "train", str(cfg_path), "--np", str(np_)],
                         capture_output=True, text=True, env=environment(), timeout=900)
    seconds = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(f"{engine} np={np_} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    result = read_result(LocalFolderStore(str(run)))
    metrics = evaluate(str(run))["metrics"]
    return {"samples_per_sec": result.samples_per_sec_after_warmup, "steps": result.step,
            "accuracy": metrics["accuracy"], "loss": metrics["loss"], "job_seconds": seconds}


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every engine at np=1 and np=2")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of every job (an epoch: 64 steps per rank at np=1, 32 at np=2)")
    add_results_arguments(parser, "engines_crosscheck")
    args = parser.parse_args()
    from ringflow.training.core.launcher import tensorflow_python

    tensorflow_python()  # the TF venv, or a message saying how to make it, before any job runs

    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-engines-"))
    manifests = {np_: write_learnable_shards(root / f"shards{np_}", np_) for np_ in (1, 2)}
    load_before, started = load_average(), time.monotonic()
    runs: dict[str, dict[int, list[dict]]] = {e: {1: [], 2: []} for e in ENGINES}
    for _ in range(args.repeats):  # interleaved: each repeat runs every engine at both worker counts in turn
        for np_ in (1, 2):
            for engine in ENGINES:
                run = train_and_evaluate(root, manifests[np_], engine, np_, args.epochs)
                runs[engine][np_].append(run)
                print(f"{engine} np={np_}: {run['samples_per_sec']:.0f} samples/s, {run['steps']} steps, "
                      f"accuracy {run['accuracy']:.3f} ({run['job_seconds']:.0f} s)", flush=True)
    load_after, minutes = load_average(), (time.monotonic() - started) / 60

    rows = []
    for engine in ENGINES:
        for np_ in (1, 2):
            mine, base = runs[engine][np_], runs[BASELINE][np_]
            rates = [r["samples_per_sec"] for r in mine]
            rows.append({"engine": engine, "np": np_, "steps": mine[0]["steps"], "samples_per_sec": rates,
                         "vs_horovod": [r["samples_per_sec"] / b["samples_per_sec"] for r, b in zip(mine, base)],
                         "accuracy": [r["accuracy"] for r in mine], "loss": [r["loss"] for r in mine],
                         "job_seconds": [r["job_seconds"] for r in mine]})
    lines = ["## The three engines on the same job", "",
             f"Data: {2 * ROWS_PER_RANK} training rows of {FEATURES} random features whose target (one of {CLASSES}) "
             f"a fixed linear map decides, {EVAL_FRACTION:.0%} more held out for the evaluate step; np=1 reads them "
             "as one partition, np=2 as two halves. Model: MLP "
             f"{FEATURES} -> {' -> '.join(map(str, HIDDEN))} -> {CLASSES}, batch {BATCH} per rank, learning rate "
             f"{LEARNING_RATE} per rank, {args.epochs} epochs, ringflow's defaults otherwise (checkpoints every 50 "
             "steps at most once per 30 s, health on). Every job runs with "
             f"{json.dumps(shown_environment())}. Median of {args.repeats} repeats (min–max); the jobs alternate "
             "engine by engine in each repeat. samples/s: the job's result.json (`samples_per_sec_after_warmup`, "
             "counted the same way for every engine); accuracy: the evaluate step on the final checkpoint; "
             "/ horovod: the rate over Horovod's in the same repeat.", "",
             f"Host: {machine()['cpus']} CPUs shared with other work; load average (1, 5, 15 min) {load_before} "
             f"before, {load_after} after; {minutes:.1f} minutes in all.", "",
             "| engine | np | steps per rank | samples/s | / horovod | eval accuracy | job seconds (start to end) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['np']} | {r['steps']} | {spread(r['samples_per_sec'], 0)} | "
                     f"{spread(r['vs_horovod'])} | {spread(r['accuracy'], 3)} | {spread(r['job_seconds'], 0)} |")
    scaling = {e: [b["samples_per_sec"] / a["samples_per_sec"] for a, b in zip(runs[e][1], runs[e][2])]
               for e in ENGINES}
    lines += ["", "np=2 / np=1 samples/s, per repeat then median (min–max): " +
              "; ".join(f"{e}: {spread(v)}" for e, v in scaling.items())]
    write_results(args, {"rows": rows, "np2_over_np1": scaling, "load_average_before": load_before,
                         "load_average_after": load_after, "minutes": minutes, "machine": machine(),
                         "environment": shown_environment(), "epochs": args.epochs, "repeats": args.repeats}, lines)


if __name__ == "__main__":
    main()
