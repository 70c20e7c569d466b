"""What the replay of a non-finite step adds to a failing run: the same job, whose data holds a few rows that
make the loss infinite, run with replay (health.replay_seconds at its default) and without it
(health.replay_seconds 0), alternately, side by side; `ringflow train` timed whole, from start to exit.

The model is a medium MLP (FEATURES -> 2048 -> 2048 -> 1, 4.5 M parameters: a 54 MB checkpoint with Adam's
state) on 2 ranks, a checkpoint every 5 steps; the bad rows are targets of 1e30 in random regression data, so
the NaN/Inf step is the first minibatch that holds one. With replay, each rank reads the newest checkpoint
before that step, runs the step's forward and backward again in a model of its own, bisects the rows, and the
ranks' reports meet in the run folder; the result names the rows. The bench also reads, from the result, what
the replay itself took on each rank (its `seconds`) and how many row tests it ran.

    .venv/bin/python -m bench.replay_cost [--repeats 3] [--engines horovod ddp] [--out replay_cost]
                                          [--results-dir DIR]

Results: bench/results/replay_cost.json and bench/results/replay_cost.md.
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

from .common import machine, spread
from .results_file import add_results_arguments, write_results

FEATURES, HIDDEN, BATCH, ROWS_PER_RANK, BAD_ROWS = 128, [2048, 2048], 256, 4096, 4


def write_data(root: Path) -> str:
    """Random regression rows, BAD_ROWS of them with a target of 1e30, sharded for 2 ranks: the manifest."""
    import numpy as np
    import pandas as pd

    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    rng = np.random.default_rng(0)
    rows = int(ROWS_PER_RANK * 2 / 0.8) + 1  # 20 % goes to the eval split
    frame = pd.DataFrame(rng.standard_normal((rows, FEATURES)).astype(np.float32),
                         columns=[f"f{i}" for i in range(FEATURES)])
    frame["target"] = rng.standard_normal(rows).astype(np.float32)
    frame.loc[rng.choice(rows, BAD_ROWS, replace=False), "target"] = 1e30
    write_shards(frame, LocalFolderStore(str(root)), target="target", num_partitions=2, batch_size=BATCH,
                 task="regression")
    return str(root / "manifest.json")


def run_job(folder: Path, manifest: str, engine: str, replay: bool, n: int) -> dict:
    from .common import read_result
    from ringflow.training.store import LocalFolderStore

    run = folder / f"{engine}-{'replay' if replay else 'none'}-{n}"
    cfg = {"manifest_uri": manifest, "run_uri": str(run), "engine": engine, "epochs": 2, "batch_size": BATCH,
           "learning_rate": 0.001, "model": {"hidden": HIDDEN}, "checkpoint": {"every_steps": 5},
           "health": {"replay_seconds": 60.0 if replay else 0.0}}
    path = folder / f"{run.name}.json"
    path.write_text(json.dumps(cfg))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", "2",
                           "--controller", "gloo"], capture_output=True, text=True, timeout=900,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - started
    result = read_result(LocalFolderStore(str(run)))
    if result is None or result.verdict is None or result.verdict.status != "NONFINITE":
        raise SystemExit(f"{run.name}: expected a NONFINITE verdict, got {result}:\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-3000:]}")
    evidence = result.verdict.evidence
    out = {"engine": engine, "replay": replay, "seconds": seconds, "exit_code": proc.returncode,
           "step": evidence["step"]}
    if replay:
        found = evidence.get("replay")
        if found is None:
            raise SystemExit(f"{run.name}: no replay evidence: {evidence.get('replay_unavailable')}")
        out |= {"reproducible": found["reproducible"], "rows": found["rows"],
                "checkpoint_step": found["checkpoint_step"], "replay_wall_seconds": found["seconds"],
                "replay_seconds_by_rank": [r["seconds"] for r in found["ranks"].values()],
                "row_tests_by_rank": [r["tests"] for r in found["ranks"].values()]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", nargs="+", default=["horovod", "ddp"])
    add_results_arguments(p, "replay_cost")
    args = p.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ringflow-replay-cost-") as tmp:
        manifest = write_data(Path(tmp) / "shards")
        for n in range(args.repeats):
            for engine in args.engines:
                for replay in ((False, True) if n % 2 == 0 else (True, False)):  # alternate who goes first
                    runs.append(run_job(Path(tmp), manifest, engine, replay, n))
                    r = runs[-1]
                    print(f"{engine} {'replay' if replay else 'none  '} #{n}: {r['seconds']:.1f}s"
                          + (f", replay {max(r['replay_seconds_by_rank']):.2f}s on the slowest rank, rows "
                             f"{r['rows']}" if replay else ""), flush=True)
    rows = []
    for engine in args.engines:
        none = [r["seconds"] for r in runs if r["engine"] == engine and not r["replay"]]
        with_replay = [r for r in runs if r["engine"] == engine and r["replay"]]
        wall = [r["seconds"] for r in with_replay]
        inside = [max(r["replay_seconds_by_rank"]) for r in with_replay]
        on_rank0 = [r["replay_wall_seconds"] for r in with_replay]
        rows.append({"engine": engine, "none_seconds": none, "replay_seconds": wall, "replay_inside_seconds": inside,
                     "replay_on_rank0_seconds": on_rank0,
                     "added_median_seconds": statistics.median(wall) - statistics.median(none),
                     "row_tests": [max(r["row_tests_by_rank"]) for r in with_replay],
                     "rows_named": [len(r["rows"]) for r in with_replay]})
    doc = {"machine": machine(), "model": {"features": FEATURES, "hidden": HIDDEN, "batch": BATCH,
                                           "rows_per_rank": ROWS_PER_RANK, "bad_rows": BAD_ROWS},
           "repeats": args.repeats, "rows": rows, "runs": runs}
    lines = ["# What replaying a non-finite step costs", "",
             f"A failing run (2 ranks, MLP {FEATURES} -> {' -> '.join(map(str, HIDDEN))} -> 1, batch {BATCH}, "
             f"{BAD_ROWS} rows with a target of 1e30 among {ROWS_PER_RANK * 2} training rows, a checkpoint every 5 "
             f"steps) timed whole (`ringflow train`, start to exit), with replay and without "
             f"(health.replay_seconds 0), alternately, {args.repeats} times each; median (min–max) seconds.", "",
             "| engine | without replay (s) | with replay (s) | added (median, s) | added on rank 0, verdict to "
             "reports gathered (s) | the replay itself, slowest rank (s) | row tests | rows named |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {spread(r['none_seconds'], 1)} | {spread(r['replay_seconds'], 1)} | "
                     f"{r['added_median_seconds']:+.1f} | {spread(r['replay_on_rank0_seconds'])} | "
                     f"{spread(r['replay_inside_seconds'])} | "
                     f"{statistics.median(r['row_tests']):.0f} | {statistics.median(r['rows_named']):.0f} |")
    lines += ["", "What a replay adds to the run is the column 'added on rank 0' (evidence.replay.seconds: from the "
              "verdict to the ranks' reports gathered, measured inside the job): the wait for rank 0's checkpoint "
              "upload in flight, the plain verdict published first, the replay itself, and the reports meeting in "
              "the run folder (polled every 0.2 s). The replay itself (the checkpoint read, the step's forward "
              "and backward again, the row bisection) is the `seconds` each rank reports. The whole-run times "
              "beside them carry start-up and training, whose spread on this shared host is larger than the "
              "replay: read them for the order of magnitude only.",
              "", f"Machine: {doc['machine']['platform']}, {doc['machine']['cpus']} CPUs, "
                  f"Python {doc['machine']['python']}."]
    write_results(args, doc, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
