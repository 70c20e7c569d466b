"""Throughput at np=2 against np=1 on this machine: ringflow's defaults against the peers' defaults on the
same model (Horovod+Gloo, Horovod+MPI, torch DDP+Gloo), and the alternatives ringflow's defaults were chosen
from. Also ringflow with the health monitor off: a coarse reading of the monitor's cost, as separate jobs
differ by ±10 % here (bench/health_overhead.py measures it inside one job). Runs each configuration side
by side in one go and reports ratios.

    .venv/bin/python bench/throughput.py [--steps 1600] [--repeats 3] [--only NAME ...] [--out NAME]

Results: bench/results/throughput.json and bench/results/throughput.md (linked from the README).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
PY = sys.executable
BIN = Path(PY).parent
FEATURES, HIDDEN, BATCH = 128, [256, 256], 256
# One core per rank for every configuration, so np=1 measures one core and np=2 can reach at most 2.0x.
ENV = os.environ | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONUNBUFFERED": "1",
                    "RINGFLOW_TORCH_THREADS": "1"}


def peer(framework: str, controller: str | None, np_: int, steps: int) -> float:
    worker = [PY, str(HERE / "peer_worker.py"), "--framework", framework, "--steps", str(steps),
              "--batch", str(BATCH), "--features", str(FEATURES), "--hidden", *map(str, HIDDEN)]
    if framework == "horovod":
        cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", f"--{controller}", *worker]
    else:
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={np_}", *worker[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    for line in out.stdout.splitlines():
        if '"samples_per_sec"' in line:
            return json.loads(line[line.index("{"):line.index("}") + 1])["samples_per_sec"]
    raise RuntimeError(f"{cmd} printed no rate:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def shards(root: Path, np_: int) -> str:
    from ringflow.training.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((8192 * np_, FEATURES)).astype("float32"),
                         columns=[f"f{i}" for i in range(FEATURES)])
    frame["target"] = rng.integers(0, 10, len(frame))
    write_shards(frame, LocalFolderStore(str(root / f"shards{np_}")), target="target", num_partitions=np_,
                 batch_size=BATCH, eval_fraction=0.0)
    return str(root / f"shards{np_}" / "manifest.json")


MONITOR_SHARE: dict[str, list[float]] = {}  # configuration -> the np=2 jobs' own share of time in the monitor


def ringflow(root: Path, np_: int, steps: int, health: bool, tag: str, controller: str = "gloo",
             horovod: dict | None = None) -> float:
    """samples/s after warm-up, as the job itself measured it (result.json), like the peers measure theirs."""
    run = root / f"run-{tag}-{np_}-{time.monotonic_ns()}"
    health_cfg = {} if health else {"enabled": False}
    # One epoch is 8192 rows per rank; run as many epochs as reach `steps`.
    cfg = {"manifest_uri": str(root / f"shards{np_}" / "manifest.json"),
           "run_uri": str(run), "checkpoint": {"every_steps": 10**6}, "epochs": max(1, round(steps / (8192 // BATCH))),
           "batch_size": BATCH, "model": {"hidden": HIDDEN}, "log_every_steps": 10**6, "health": health_cfg,
           "horovod": horovod or {}}
    cfg_path = root / f"{run.name}.json"
    cfg_path.write_text(json.dumps(cfg))
    out = subprocess.run([str(BIN / "ringflow"), "train", str(cfg_path), "--np", str(np_), "--controller", controller],
                         capture_output=True,
                         text=True, env=ENV, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stdout[-3000:])
    from ringflow.training.run_result import read_result
    from ringflow.training.store import LocalFolderStore

    result = read_result(LocalFolderStore(str(run)))
    if np_ == 2:
        MONITOR_SHARE.setdefault(tag, []).append(result.health_monitor_share_after_warmup)
    return result.samples_per_sec_after_warmup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="+", help="run these configurations alone (names as in the table)")
    p.add_argument("--out", default="throughput", help="results file name under bench/results/")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-"))
    for np_ in (1, 2):
        shards(root, np_)
    from ringflow.training.config import HorovodConfig
    from ringflow.training.launcher import DEFAULT_CONTROLLER

    configs = {
        "ringflow (defaults)": lambda n: ringflow(root, n, args.steps, True, "rf", DEFAULT_CONTROLLER),
        "ringflow, health off": lambda n: ringflow(root, n, args.steps, False, "rf-nohealth", DEFAULT_CONTROLLER),
        # the alternatives the defaults were chosen from
        "ringflow gloo, cycle 1 ms": lambda n: ringflow(root, n, args.steps, True, "g1", "gloo", {"cycle_time_ms": 1}),
        "ringflow mpi, busy polling": lambda n: ringflow(root, n, args.steps, True, "mb", "mpi",
                                                         {"mpi_yield_when_idle": False}),
        "horovod + gloo (defaults)": lambda n: peer("horovod", "gloo", n, args.steps),
        "horovod + mpi (defaults)": lambda n: peer("horovod", "mpi", n, args.steps),
        "torch DDP + gloo": lambda n: peer("ddp", None, n, args.steps),
    }
    if args.only:
        unknown = set(args.only) - set(configs)
        if unknown:
            raise SystemExit(f"unknown configurations {sorted(unknown)}; choose from {list(configs)}")
        configs = {name: run for name, run in configs.items() if name in args.only}
        if "ringflow (defaults)" not in configs or all(name.startswith("ringflow") for name in configs):
            raise SystemExit('--only needs "ringflow (defaults)" and at least one peer to compare it with')
    rates: dict[str, dict[int, list[float]]] = {name: {1: [], 2: []} for name in configs}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits every configuration alike
        for name, run in configs.items():
            for np_ in (1, 2):
                rates[name][np_].append(run(np_))
                print(f"{name} np={np_}: {rates[name][np_][-1]:.0f} samples/s", flush=True)
    rows = []
    for name in configs:
        r1, r2 = statistics.median(rates[name][1]), statistics.median(rates[name][2])
        rows.append({"config": name, "np1_samples_per_sec": r1, "np2_samples_per_sec": r2,
                     "speedup_np2_vs_np1": r2 / r1, "np2_runs": rates[name][2]})
    peers = [name for name in configs if not name.startswith("ringflow")]
    # Ratios within each repeat, then their median: this machine's speed drifts between repeats, and runs
    # side by side in one repeat see the same machine. The best peer is the one ringflow compares worst
    # with. (Not each repeat's fastest peer: the largest of three noisy rates is biased high.)
    per_peer = {p: [rates["ringflow (defaults)"][2][i] / rates[p][2][i] for i in range(args.repeats)] for p in peers}
    best_peer = min(per_peer, key=lambda p: statistics.median(per_peer[p]))
    vs_best_peer = per_peer[best_peer]
    overhead = ([1 - rates["ringflow (defaults)"][2][i] / rates["ringflow, health off"][2][i]
                 for i in range(args.repeats)] if "ringflow, health off" in configs else [float("nan")])
    defaults = HorovodConfig()
    summary = {"model": {"features": FEATURES, "hidden": HIDDEN, "batch_per_worker": BATCH},
               "ringflow_defaults": {"controller": DEFAULT_CONTROLLER, "cycle_time_ms": defaults.cycle_time_ms,
                                     "fusion_threshold_mb": defaults.fusion_threshold_mb, "wait": defaults.wait,
                                     "mpi_yield_when_idle": defaults.mpi_yield_when_idle,
                                     "fp16_compression": defaults.fp16_compression},
               "steps": args.steps, "repeats": args.repeats, "cores": os.cpu_count(), "rows": rows,
               "best_peer": best_peer, "ringflow_np2_vs_best_peer_np2": statistics.median(vs_best_peer),
               "ringflow_np2_vs_each_peer_np2": {p: statistics.median(r) for p, r in per_peer.items()},
               "health_monitor_share_np2": statistics.median(MONITOR_SHARE.get("rf", [float("nan")])),
               "ringflow_np2_vs_best_peer_np2_per_repeat": vs_best_peer,
               "health_overhead_np2": statistics.median(overhead), "health_overhead_np2_per_repeat": overhead}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{args.out}.json").write_text(json.dumps(summary, indent=1))
    lines = [f"Model: MLP {FEATURES}->{HIDDEN}->10, {BATCH} rows per worker per step, one core per rank, "
             f"{args.steps} steps after warm-up, median of {args.repeats} interleaved repeats; ringflow defaults: "
             f"{summary['ringflow_defaults']}.", "",
             "| configuration | np=1 samples/s | np=2 samples/s | np=2 / np=1 |", "|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['np1_samples_per_sec']:.0f} | {r['np2_samples_per_sec']:.0f} | "
              f"{r['speedup_np2_vs_np1']:.2f}x |" for r in rows]
    lines += ["", "ringflow np=2 / peer np=2 (median of per-repeat ratios): " + ", ".join(
              f"{p} {statistics.median(r):.2f}" for p, r in per_peer.items()),
              f"ringflow np=2 / best peer ({best_peer}) np=2: {summary['ringflow_np2_vs_best_peer_np2']:.2f} "
              f"(per repeat: {', '.join(f'{r:.2f}' for r in vs_best_peer)}; target >= 1.00)",
              f"health monitoring overhead at np=2 (median of per-repeat ratios): "
              f"{summary['health_overhead_np2']:.1%} (per repeat: {', '.join(f'{o:.1%}' for o in overhead)}; "
              f"target <= 3%)",
              f"time the training thread spends in the health monitor, as the np=2 jobs measure it: "
              f"{summary['health_monitor_share_np2']:.1%} of the time after warm-up (median)"]
    (HERE / "results" / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
