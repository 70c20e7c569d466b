"""What post-local SGD (ddp.local_sgd) trades: throughput against the final eval metric, DDP at np=2, fully
synchronous against averaging the parameters every H = 1, 4, 16 steps, on the same data, model, batch and
steps.

The workload is chosen so that communication matters: a wide MLP (FEATURES -> 1024 -> 1024 -> CLASSES, 1.2 M
parameters, 4.8 MB of gradient a step) on a small per-rank batch, one torch thread per rank, so the
synchronous job's gradient all-reduce is a visible share of its step (the table says how much, from its
health records). The data is learnable (scikit-learn's make_classification, seeded), sharded by ringflow's
own shard step with a held-out split; each run is evaluated by ringflow's evaluate step (eval.json), so the
accuracy and loss are what the promotion gate would see. Warm-up is 0 (local from the first step), so the
rows show the trade itself. Every job runs at ringflow's defaults otherwise (checkpoints, health on).
Configurations are interleaved in each repeat; throughput is each job's own samples/s after warm-up
(result.json), as a ratio to the synchronous job of the same repeat, then the median over repeats.

    .venv/bin/python -m bench.local_sgd [--repeats 3] [--epochs 2] [--results-dir DIR] [--out NAME]

Results: bench/results/<out>.json and <out>.md, with the command (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import environment, machine, shown_environment, spread
from .results_file import add_results_arguments, write_results

BIN = Path(sys.executable).parent
FEATURES, CLASSES, ROWS, HIDDEN, BATCH = 128, 10, 40_000, [1024, 1024], 64
LEARNING_RATE = 0.001  # Adam; x2 for the two workers (worker.make_optimizer)
EVAL_FRACTION = 0.1
NP = 2
SYNCHRONOUS = "synchronous"
PERIODS = (1, 4, 16)


def write_data(folder: Path) -> str:
    """make_classification's rows (seeded: the same every time), sharded for NP workers with an eval split."""
    import pandas as pd
    from sklearn.datasets import make_classification

    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    x, y = make_classification(n_samples=ROWS, n_features=FEATURES, n_informative=64, n_redundant=16,
                               n_classes=CLASSES, n_clusters_per_class=2, class_sep=1.0, random_state=0)
    frame = pd.DataFrame(x.astype("float32"), columns=[f"f{i}" for i in range(FEATURES)])
    frame["target"] = y
    write_shards(frame, LocalFolderStore(str(folder)), target="target", num_partitions=NP, batch_size=BATCH,
                 eval_fraction=EVAL_FRACTION)
    return str(folder / "manifest.json")


def run(root: Path, manifest: str, name: str, epochs: int) -> dict:
    """One np=2 DDP job and its evaluation: samples/s, steps, final loss, eval metrics, sync share."""
    from ringflow.training.core.evaluate import evaluate_run
    from ringflow.training.formats.run_folder import RunFolder
    from .common import read_health, read_result
    from ringflow.training.store import LocalFolderStore

    folder = root / f"run-{name.replace(' ', '-').replace('=', '')}-{time.monotonic_ns()}"
    ddp: dict = {} if name == SYNCHRONOUS else {"local_sgd": {"period": int(name.split("=")[1]), "warmup_steps": 0}}
    cfg = {"manifest_uri": manifest, "run_uri": str(folder), "engine": "ddp", "epochs": epochs,
           "batch_size": BATCH, "learning_rate": LEARNING_RATE, "optimizer": "adam",
           "model": {"hidden": HIDDEN}, "ddp": ddp}
    path = root / f"{folder.name}.json"
    path.write_text(json.dumps(cfg))
    out = subprocess.run([str(BIN / "ringflow"), "train", str(path), "--np", str(NP), "--engine", "ddp"],
                         capture_output=True, text=True, env=environment(), timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    store = LocalFolderStore(str(folder))
    result = read_result(store)
    evaluated = evaluate_run(RunFolder(store))
    steps = [r for r in read_health(store) if r.get("type") == "step"]
    shares = [min(s / max(t, 1e-9) for s, t in zip(r["sync_time"], r["step_time"])) for r in steps]
    return {"samples_per_sec": result.samples_per_sec_after_warmup, "steps": result.step,
            "train_loss": result.loss, "verdict": result.verdict.status if result.verdict else None,
            "accuracy": evaluated.metrics["accuracy"], "eval_loss": evaluated.metrics["loss"],
            "sync_share": statistics.median(shares) if shares else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    add_results_arguments(parser, "local_sgd")
    args = parser.parse_args()
    names = [SYNCHRONOUS, *(f"H={h}" for h in PERIODS)]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="ringflow-bench-local-sgd-") as tmp:
        root = Path(tmp)
        manifest = write_data(root / "shards")
        for repeat in range(args.repeats):  # interleaved: drifting load hits every configuration alike
            for name in names:
                got = run(root, manifest, name, args.epochs)
                runs[name].append(got)
                print(f"repeat {repeat + 1} {name}: {got['samples_per_sec']:.0f} samples/s, accuracy "
                      f"{got['accuracy']:.4f}, eval loss {got['eval_loss']:.4f}, {got['verdict']}", flush=True)
    sync = runs[SYNCHRONOUS]
    rows, summary = [], {}
    for name in names:
        ratios = [r["samples_per_sec"] / s["samples_per_sec"] for r, s in zip(runs[name], sync)]
        summary[name] = {"runs": runs[name], "throughput_vs_synchronous": ratios,
                         "throughput_vs_synchronous_median": statistics.median(ratios)}
        acc = [r["accuracy"] for r in runs[name]]
        loss = [r["eval_loss"] for r in runs[name]]
        rate = [r["samples_per_sec"] for r in runs[name]]
        verdicts = sorted({str(r["verdict"]) for r in runs[name]})
        rows.append(f"| {name} | {spread(rate, 0)} | {spread(ratios)}x | {spread(acc, 4)} | {spread(loss, 4)} "
                    f"| {', '.join(verdicts)} |")
    sync_share = statistics.median(r["sync_share"] for r in sync)
    steps = sync[0]["steps"]
    lines = [
        "# Post-local SGD against synchronous DDP (np=2)",
        "",
        f"`ddp.local_sgd: {{period: H, warmup_steps: 0}}` against synchronous gradient all-reduce, on the same "
        f"data, model, batch and steps: {ROWS} rows of `make_classification` ({FEATURES} features, {CLASSES} "
        f"classes, {EVAL_FRACTION:.0%} held out), MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-{CLASSES} "
        f"(1.2 M parameters), batch {BATCH} per rank, Adam at {LEARNING_RATE} x 2 workers, {args.epochs} epochs "
        f"= {steps} steps, one torch thread per rank, ringflow's defaults otherwise (checkpoints, health on). "
        f"In the synchronous jobs the gradient all-reduce took a median {sync_share:.0%} of the step "
        "(their health records), the share local SGD can save. Each cell: median (min-max) over "
        f"{args.repeats} interleaved repeats; throughput is the job's own samples/s after warm-up (result.json), "
        "the ratio against the synchronous job of the same repeat; accuracy and loss are ringflow's evaluate "
        "step's on the held-out rows, of the final checkpoint (under local SGD the replicas' average: the "
        "engine averages after the last step).",
        "",
        "| run | samples/s | vs synchronous | eval accuracy | eval loss | verdicts |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Machine: {machine()['cpus']} CPUs shared with other work; settings: {shown_environment()}.",
    ]
    write_results(args, {"machine": machine(), "workload": {
        "rows": ROWS, "features": FEATURES, "classes": CLASSES, "hidden": HIDDEN, "batch": BATCH, "np": NP,
        "learning_rate": LEARNING_RATE, "epochs": args.epochs, "steps": steps, "eval_fraction": EVAL_FRACTION,
        "warmup_steps": 0}, "synchronous_sync_share": sync_share, "configurations": summary}, lines)


if __name__ == "__main__":
    main()
