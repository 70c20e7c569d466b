"""Throughput of ringflow's engines against the peers, at equal tuning, and the training loop's overhead.

1. The fair peer table: separate jobs at np=1 and np=2 of ringflow's Horovod and DDP engines and of the
   peers (plain Horovod+MPI, Horovod+Gloo, torch DDP+Gloo; bench/peer_worker.py) on the same model. Every
   peer runs with the settings ringflow's ranks run with (`environment()`: Open MPI's mpi_yield_when_idle,
   Horovod's fusion threshold and cycle time from ringflow's HorovodConfig, the launcher's rank
   environment, one core per rank, the CPU binding ringflow's default bind_cores gives its ranks), so the
   ratios compare engines, not tuning. Interleaved repeats.
   ringflow runs at its defaults (checkpoints every 50 steps into the local run folder, health on, a log
   line every 10 steps) and, in rows of their own, with checkpoints off. Every job's rate is counted the
   same way: the slowest rank's rate up to a closing barrier, times the ranks (ringflow's in its
   result.json; callbacks/throughput.job_samples_per_sec for both).
2. Each engine against a plain loop of its library that never checkpoints, inside one job
   (bench/loop_vs_plain.py): ringflow's loop at its defaults, with checkpoints off, and with checkpoints and
   health off, in turn, in blocks alternating with the plain loop's, at np=1 and np=2. Separate jobs differ
   by ±10 % here; blocks side by side in one job see the same machine.

    .venv/bin/python -m bench.throughput [--steps 1600] [--repeats 3] [--jobs 3] [--only NAME ...]
                                         [--alternatives] [--skip-table] [--skip-loop] [--out NAME]
                                         [--results-dir DIR]

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

from . import loop_vs_plain
from .checkpoint_gate import CHECKPOINTS_OFF  # the "checkpoints off" rows
from .common import (BATCH, FEATURES, HIDDEN, ROWS_PER_RANK, environment, module_command, quartiles, shards,
                     shown_environment, spread)
from .peer_worker import LEARNING_RATE  # the peers' and ringflow's jobs train with the same
from .results_file import add_results_arguments, write_results

BIN = Path(sys.executable).parent
TARGET_VS_PLAIN, TARGET_HEALTH = 0.97, 0.03
NOISE_FLOOR = "horovod + mpi, again (noise floor)"
HVD_DEFAULTS, HVD_NO_CHECKPOINTS = "ringflow horovod (defaults)", "ringflow horovod (checkpoints off)"
DDP_DEFAULTS, DDP_NO_CHECKPOINTS = "ringflow ddp (defaults)", "ringflow ddp (checkpoints off)"


def peer(framework: str, controller: str | None, np_: int, steps: int,
         bind_cores: str | bool | None = None) -> tuple[float, None]:
    """samples/s after warm-up as the peer's job counted it (peer_worker.py); it has no health monitor.
    bind_cores: as a ringflow rank's config says (None: ringflow's default)."""
    worker = module_command("bench.peer_worker", "--framework", framework, "--steps", str(steps),
                            "--batch", str(BATCH), "--features", str(FEATURES), "--hidden", *map(str, HIDDEN))
    if bind_cores is not None:
        worker += ["--bind-cores", json.dumps(bind_cores).strip('"')]
    if framework == "horovod":
        cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", f"--{controller}", *worker]
    else:
        from ringflow.training.core.launcher import free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", f"--nproc-per-node={np_}", "--rdzv-backend",
               "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1", *worker[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, env=environment(), timeout=600)
    for line in out.stdout.splitlines():
        if '"samples_per_sec"' in line:
            return json.loads(line[line.index("{"):line.index("}") + 1])["samples_per_sec"], None
    raise RuntimeError(f"{cmd} printed no rate:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def ringflow(root: Path, np_: int, steps: int, engine: str, controller: str | None = None,
             horovod: dict | None = None, settings: dict | None = None) -> tuple[float, float | None]:
    """samples/s after warm-up as the job itself counted it (result.json): the slowest rank's rate up to a
    closing barrier, times the ranks, as the peers count theirs (callbacks/throughput.job_samples_per_sec).
    ringflow's defaults (checkpoints every 50 steps into the local run folder, health on, a log line every
    10 steps) but for the model, its batch, the peers' learning rate and `settings` (more top-level job
    config fields, e.g. bind_cores). Also the share of the time rank 0's training thread spent in the health
    monitor (result.json: the job's own accounting)."""
    from ringflow.training.formats.engines import DEFAULT_CONTROLLER

    run = root / f"run-{engine}-{np_}-{time.monotonic_ns()}"
    # One epoch is ROWS_PER_RANK rows per rank; run as many epochs as reach `steps`.
    cfg = {"manifest_uri": str(root / f"shards{np_}" / "manifest.json"), "engine": engine,
           "run_uri": str(run), "epochs": max(1, round(steps / (ROWS_PER_RANK // BATCH))), "batch_size": BATCH,
           "learning_rate": LEARNING_RATE, "model": {"hidden": HIDDEN}, "horovod": horovod or {}, **(settings or {})}
    cfg_path = root / f"{run.name}.json"
    cfg_path.write_text(json.dumps(cfg))
    out = subprocess.run([str(BIN / "ringflow"), "train", str(cfg_path), "--np", str(np_), "--engine", engine,
                          "--controller", controller or DEFAULT_CONTROLLER],
                         capture_output=True, text=True, env=environment(), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stdout[-3000:])
    from .common import read_result
    from ringflow.training.store import LocalFolderStore

    result = read_result(LocalFolderStore(str(run)))
    return result.samples_per_sec_after_warmup, result.health_monitor_share_after_warmup


def peer_table(root: Path, args) -> tuple[dict, list[str]]:
    configs = {
        HVD_DEFAULTS: lambda n: ringflow(root, n, args.steps, "horovod"),
        HVD_NO_CHECKPOINTS: lambda n: ringflow(root, n, args.steps, "horovod", settings=CHECKPOINTS_OFF),
        DDP_DEFAULTS: lambda n: ringflow(root, n, args.steps, "ddp"),
        DDP_NO_CHECKPOINTS: lambda n: ringflow(root, n, args.steps, "ddp", settings=CHECKPOINTS_OFF),
        "horovod + mpi": lambda n: peer("horovod", "mpi", n, args.steps),
        "horovod + gloo": lambda n: peer("horovod", "gloo", n, args.steps),
        "torch DDP + gloo": lambda n: peer("ddp", None, n, args.steps),
        # The same job again in each repeat: its ratio to the first is this host's noise between jobs, the
        # floor under which the engines' ratios say nothing.
        NOISE_FLOOR: lambda n: peer("horovod", "mpi", n, args.steps),
    }
    if args.alternatives:  # the alternatives ringflow's Horovod defaults were chosen from
        configs["ringflow horovod gloo, cycle 1 ms"] = lambda n: ringflow(root, n, args.steps, "horovod", "gloo",
                                                                          {"cycle_time_ms": 1})
        configs["ringflow horovod mpi, busy polling"] = lambda n: ringflow(root, n, args.steps, "horovod", "mpi",
                                                                           {"mpi_yield_when_idle": False})
    if args.only:
        unknown = set(args.only) - set(configs)
        if unknown:
            raise SystemExit(f"unknown configurations {sorted(unknown)}; choose from {list(configs)}")
        configs = {name: run for name, run in configs.items() if name in args.only}
    rates: dict[str, dict[int, list[float]]] = {name: {1: [], 2: []} for name in configs}
    # ringflow's jobs' own accounting: rank 0's training thread's share in the health monitor.
    monitor: dict[str, dict[int, list[float]]] = {name: {1: [], 2: []} for name in configs}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits every configuration alike
        for name, run in configs.items():
            for np_ in (1, 2):
                rate, share = run(np_)
                rates[name][np_].append(rate)
                if share is not None:
                    monitor[name][np_].append(share)
                print(f"{name} np={np_}: {rate:.0f} samples/s", flush=True)
    # Each engine against its own library's plain loop; ratios within each repeat, then their median.
    pairs = {HVD_DEFAULTS: "horovod + mpi", HVD_NO_CHECKPOINTS: "horovod + mpi", DDP_DEFAULTS: "torch DDP + gloo",
             DDP_NO_CHECKPOINTS: "torch DDP + gloo", NOISE_FLOOR: "horovod + mpi"}
    vs = {f"{a} / {b} np={n}": [rates[a][n][i] / rates[b][n][i] for i in range(args.repeats)]
          for a, b in pairs.items() if a in rates and b in rates for n in (1, 2)}
    rows = [{"config": name, "np1_samples_per_sec": statistics.median(r[1]),
             "np2_samples_per_sec": statistics.median(r[2]), "np1_runs": r[1], "np2_runs": r[2]}
            for name, r in rates.items()]
    lines = ["## The fair peer table (separate jobs, equal tuning)", "",
             f"Every job runs with {json.dumps(shown_environment())}"
             f"; median of {args.repeats} interleaved repeats (min–max in brackets). ringflow at its defaults "
             "(checkpoints every 50 steps into the local run folder, health on, a log line every 10 steps) and with "
             "checkpoints off. Every rate is the slowest rank's over the same steps up to a closing barrier, times "
             "the ranks (ringflow's as its result.json counts it).", "",
             "| configuration | np=1 samples/s | np=2 samples/s | np=2 / np=1 |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['np1_samples_per_sec']:.0f} ({min(r['np1_runs']):.0f}–{max(r['np1_runs']):.0f}) | "
                     f"{r['np2_samples_per_sec']:.0f} ({min(r['np2_runs']):.0f}–{max(r['np2_runs']):.0f}) | "
                     f"{r['np2_samples_per_sec'] / r['np1_samples_per_sec']:.2f}x |")
    # Per-job noise here is not shared by the two jobs of a repeat, so the ratio of the medians is quoted too.
    of_medians = {f"{a} / {b} np={n}": statistics.median(rates[a][n]) / statistics.median(rates[b][n])
                  for a, b in pairs.items() if a in rates and b in rates for n in (1, 2)}
    lines += ["", "Engine / its plain peer, per repeat then median (min–max), and the ratio of the medians: " +
              "; ".join(f"{k}: {spread(v)}, {of_medians[k]:.2f}" for k, v in vs.items()), ""]
    shares = {f"{name} np={n}": v[n] for name, v in monitor.items() for n in (1, 2) if v[n]}
    if shares:
        lines += ["ringflow's jobs' own accounting, rank 0's training thread in the health monitor (result.json "
                  "`health_monitor_share_after_warmup`), median (min–max): " +
                  "; ".join(f"{k}: {statistics.median(v):.2%} ({min(v):.2%}–{max(v):.2%})" for k, v in shares.items()), ""]
    return {"rows": rows, "engine_vs_peer": vs, "ratio_of_medians": of_medians, "monitor_share": shares}, lines


def loop_overhead(root: Path, args) -> tuple[dict, list[str]]:
    results: dict[str, dict[str, list[float]]] = {}
    whole: dict[str, dict[str, list[float]]] = {}  # per job: whole-run ratios, checkpoints written, seconds
    for job in range(args.jobs):  # interleaved, as above
        for engine in ("horovod", "ddp"):
            for np_ in (1, 2):
                runs: list[str] = []
                blocks = loop_vs_plain.run_job(root, engine, np_, args.steps, args.block, environment(),
                                               on_run=runs.append)
                key = f"{engine} np={np_}"
                for name, pair in loop_vs_plain.WHOLE_RUN.items():
                    whole.setdefault(key, {}).setdefault(name, []).append(loop_vs_plain.whole_run(blocks, *pair))
                whole[key].setdefault("checkpoints", []).append(loop_vs_plain.checkpoints_written(runs[0]))
                whole[key].setdefault("seconds", []).append(sum(b[1] for b in blocks))
                job_ratios = loop_vs_plain.job_ratios(blocks)
                for name, ratios in job_ratios.items():
                    results.setdefault(key, {}).setdefault(name, []).extend(ratios)
                med = {k: round(statistics.median(v), 3) for k, v in job_ratios.items() if v}
                print(f"loop {key} job {job}: {med}", flush=True)
    lines = ["## Each engine against a plain loop of its library, inside one job", "",
             f"{args.jobs} jobs per row of {args.steps} ringflow steps; ringflow's loop in blocks of {args.block} steps "
             "alternating with the same number of plain-loop steps (a plain loop that never checkpoints; "
             "bench/loop_vs_plain.py). ringflow's blocks take three settings in turn: its defaults (checkpoints "
             "every 50 steps into the local run folder, health monitoring on, a log line every 10 steps), checkpoints "
             "off, and checkpoints and health off. Each ratio: a block's throughput over its neighbours'; median of "
             "all blocks, quartiles in brackets. Wall: throughput; CPU: the job's CPU seconds per step, all threads "
             "(the checkpoint writer's too), which other work on the machine does not lengthen (the neighbour's over "
             f"this one's, so higher is cheaper). Targets: ringflow at its defaults >= {TARGET_VS_PLAIN:.2f}x the plain "
             f"loop; the health monitor's cost <= {TARGET_HEALTH:.0%}. The defaults take a checkpoint every 50 "
             "steps at most once per 30 s (checkpoint.min_interval_seconds), so in a run of this model most "
             "default blocks hold none: the whole-run table below weighs every block by its time.", "",
             "| engine | ringflow at defaults / plain, wall | same, CPU | checkpoints off / plain, wall | same, CPU "
             "| checkpoints and health off / plain, wall | checkpoints' cost (defaults vs checkpoints off), wall "
             "| same, CPU | health monitor's cost (checkpoints off, health on vs off), wall | same, CPU | blocks at defaults |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for key, r in results.items():
        if not all(r.values()):
            raise SystemExit(f"{key}: too few blocks for every comparison; raise --steps (at least 7 blocks a job)")
        q = {name: quartiles(v) for name, v in r.items()}
        # A cost is one minus the throughput ratio; its quartiles swap ends.
        cost = {name: (1 - q[name][0], 1 - q[name][2], 1 - q[name][1])
                for name in ("checkpoints_on_vs_off", "checkpoints_on_vs_off_cpu", "health_on_vs_off", "health_on_vs_off_cpu")}
        summary[key] = {**q, **{f"{name}_cost": c for name, c in cost.items()},
                        "blocks": {k: len(v) for k, v in r.items()}, "ratios": r}

        def ratio(name):
            return f"{q[name][0]:.3f} ({q[name][1]:.3f}–{q[name][2]:.3f})"

        def share(name):
            return f"{cost[name][0]:.1%} ({cost[name][1]:.1%} to {cost[name][2]:.1%})"

        lines.append(f"| {key} | {ratio('defaults_vs_plain')} | {ratio('defaults_vs_plain_cpu')} | "
                     f"{ratio('checkpoints_off_vs_plain')} | {ratio('checkpoints_off_vs_plain_cpu')} | "
                     f"{ratio('bare_vs_plain')} | {share('checkpoints_on_vs_off')} | {share('checkpoints_on_vs_off_cpu')} | "
                     f"{share('health_on_vs_off')} | {share('health_on_vs_off_cpu')} | {len(r['defaults_vs_plain'])} |")
    lines += ["", "Over the whole run (loop_vs_plain.whole_run: every block's time summed, so the blocks a checkpoint "
              "lands in weigh in full), per job, median (min–max) of the jobs; checkpoints: how many rank 0 wrote "
              "in the job, the final one included; seconds: the job's timed blocks, ringflow's and the plain "
              "loop's.", "",
              "| engine | ringflow at defaults / plain, wall | same, CPU | checkpoints' cost (defaults vs "
              "checkpoints off), wall | checkpoints | seconds |", "|---|---|---|---|---|---|"]
    for key, w in whole.items():
        cost = [1 - v for v in w["checkpoints_on_vs_off"]]
        lines.append(f"| {key} | {spread(w['defaults_vs_plain'], 3)} | {spread(w['defaults_vs_plain_cpu'], 3)} | "
                     f"{spread(cost, 3)} | {spread(w['checkpoints'], 0)} | {spread(w['seconds'], 0)} |")
        summary[key]["whole_run"] = w
    return summary, lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--repeats", type=int, default=3, help="repeats of the peer table")
    p.add_argument("--jobs", type=int, default=3, help="in-job comparisons per engine and np")
    p.add_argument("--block", type=int, default=50,
                   help="steps per block: a multiple of the checkpoint interval (50), and at least "
                        "checksum_every_steps, so every block with health on holds a checksum")
    p.add_argument("--only", nargs="+", help="peer-table configurations to run (names as in the table)")
    p.add_argument("--alternatives", action="store_true", help="also the Horovod settings ringflow's were chosen from")
    p.add_argument("--skip-table", action="store_true")
    p.add_argument("--skip-loop", action="store_true")
    add_results_arguments(p, "throughput")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ringflow-bench-"))
    for np_ in (1, 2):
        shards(root, np_)
    from ringflow.training.formats.config import HorovodConfig, DdpConfig
    from ringflow.training.formats.engines import DEFAULT_CONTROLLER
    import dataclasses
    import os

    summary = {"model": {"features": FEATURES, "hidden": HIDDEN, "batch_per_worker": BATCH}, "cores": os.cpu_count(),
               "steps": args.steps, "ringflow_horovod": {"controller": DEFAULT_CONTROLLER, **dataclasses.asdict(HorovodConfig())},
               "ringflow_ddp": dataclasses.asdict(DdpConfig())}
    lines = [f"Model: MLP {FEATURES}->{HIDDEN}->10, {BATCH} rows per worker per step, one core per rank, "
             f"{args.steps} steps after warm-up, {os.cpu_count()} cores shared with other work (noisy: read the "
             f"spreads). ringflow Horovod defaults: controller {DEFAULT_CONTROLLER}, {HorovodConfig()}; "
             f"DDP: {DdpConfig()}.", ""]
    if not args.skip_loop:
        summary["loop_vs_plain"], more = loop_overhead(root, args)
        lines += more + [""]
    if not args.skip_table:
        summary["peer_table"], more = peer_table(root, args)
        lines += more
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
