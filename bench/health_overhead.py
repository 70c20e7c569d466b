"""Health monitoring overhead: step time with the monitor against without it, inside the same np=2 jobs.

Separate jobs with and without the monitor differ by ±10 % from run to run on this VM, more than the
3 % to resolve. So each job runs ringflow's own Trainer with one more callback on its loop, which switches
the health callback off and on in alternate blocks of steps; a block with it on is compared with the
blocks on either side (off), under the same load.

    .venv/bin/python -m bench.health_overhead [--engine horovod|ddp] [--jobs 8] [--steps 1600] [--block 100]
                                              [--health JSON] [--out NAME] [--results-dir DIR]

(bench/throughput.py also measures the monitor's cost, for both engines at np=1 and np=2, in its in-job
comparison with a plain loop.)

Results: bench/results/health_overhead.json and .md (linked from docs/benchmarks.md).
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from .common import BATCH, CLASSES, FEATURES, HIDDEN, ROWS_PER_RANK, environment, shards
from .rank_script import rank_script_command, train_and_report
from .results_file import add_results_arguments, write_results

WARMUP_STEPS = 20


def alternating_health(block: int):
    """A callback on the Trainer's loop that times each block of steps and switches the health callback
    off or on between blocks (on through warm-up). Every rank switches at the same step, so the monitor's
    gathers stay matched."""
    from ringflow.training.rank.callbacks.base import Callback

    class AlternatingHealth(Callback):
        def __init__(self):
            self.health = None  # the Trainer's HealthMonitoring callback, set once the Trainer is built
            self.blocks: list[tuple[bool, float]] = []
            self.started = None

        def on_step_end(self, loop, timing) -> None:
            if timing.step < WARMUP_STEPS or (timing.step - WARMUP_STEPS) % block:
                return
            now = time.perf_counter()
            if self.started is not None:
                self.blocks.append((self.health.enabled, now - self.started))
            self.health.enabled = not self.health.enabled
            self.started = now

    return AlternatingHealth()


def worker(config_path: str, block: int, out: str) -> None:
    from ringflow.training.formats.config import load_job_config
    from ringflow.training.rank.engines import start_engine
    from ringflow.training.rank.worker import Trainer

    cfg = load_job_config(config_path)
    engine = start_engine(cfg)  # the one its launcher was chosen for
    alternating = alternating_health(block)
    trainer = Trainer(cfg, engine, callbacks=[alternating])
    alternating.health = trainer.health
    train_and_report(trainer, engine, out, lambda: alternating.blocks)


def run_job(root: Path, index: int, steps: int, block: int, health: dict,
            engine: str = "horovod") -> tuple[list[tuple[bool, float]], float | None]:
    """One np=2 job: its blocks, and the share of its time rank 0's training thread spent in the health monitor
    (result.json: the job's own accounting, over all its steps after warm-up, the monitor on and off alike)."""
    from ringflow.training.rank.engines import ENGINE_ENV
    from .common import read_result
    from ringflow.training.store import LocalFolderStore

    run = root / f"run-{index}"
    # ringflow's defaults (checkpoints every 50 steps into the run folder, a log line every 10 steps) but for
    # the model, its batch, the health settings under test and the epochs that make `steps`.
    cfg = {"manifest_uri": str(root / "shards2" / "manifest.json"), "run_uri": str(run),
           "epochs": max(1, round(steps / (ROWS_PER_RANK // BATCH))), "batch_size": BATCH, "model": {"hidden": HIDDEN},
           "health": health, "engine": engine}
    cfg_path, out = root / f"run-{index}.json", root / f"blocks-{index}.json"
    cfg_path.write_text(json.dumps(cfg))
    command = rank_script_command(engine, str(cfg_path), 2, __spec__.name,
                                  ["--worker", str(cfg_path), "--block", str(block), "--blocks-out", str(out)])
    # What every benchmark job runs with (one core per rank, ringflow's Horovod settings: common.environment).
    proc = subprocess.run(command, capture_output=True, text=True, env=environment() | {ENGINE_ENV: engine},
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    result = read_result(LocalFolderStore(str(run)))
    return [tuple(b) for b in json.loads(out.read_text())], result.health_monitor_share_after_warmup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["horovod", "ddp"], default="horovod")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--block", type=int, default=100,
                   help="steps per block; at least checksum_every_steps, so every 'on' block holds a checksum")
    p.add_argument("--health", type=json.loads, default={},
                   help='health settings to measure, as JSON (default: ringflow\'s), e.g. \'{"every_steps": 1}\'')
    add_results_arguments(p, "health_overhead")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--blocks-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.block, args.blocks_out)

    root = Path(tempfile.mkdtemp(prefix="ringflow-health-bench-"))
    shards(root, 2)
    ratios: list[float] = []
    shares: list[float] = []
    on_total = off_total = 0.0
    for index in range(args.jobs):
        blocks, share = run_job(root, index, args.steps, args.block, args.health, args.engine)
        shares.append(share)
        # Each block with the monitor on against the mean of the blocks before and after it, which ran
        # without: a machine speeding up or slowing down during the job cancels out.
        pairs = [((blocks[i - 1][1] + blocks[i + 1][1]) / 2, blocks[i][1]) for i in range(1, len(blocks) - 1)
                 if blocks[i][0]]
        ratios += [on / off for off, on in pairs]
        on_total += sum(on for _, on in pairs)
        off_total += sum(off for off, _ in pairs)
        print(f"job {index}: {len(pairs)} block pairs, median overhead "
              f"{statistics.median(on / off for off, on in pairs) - 1:.1%}, monitor share {share:.2%}", flush=True)
    if len(ratios) < 2:
        raise SystemExit(f"{len(ratios)} block pair(s) measured: raise --steps or --jobs, or lower --block")
    quartiles = statistics.quantiles(ratios, n=4)
    summary = {"engine": args.engine, "health": args.health, "jobs": args.jobs, "steps": args.steps,
               "block_steps": args.block, "pairs": len(ratios),
               "overhead_median": statistics.median(ratios) - 1, "overhead_total": on_total / off_total - 1,
               "overhead_quartiles": [quartiles[0] - 1, quartiles[2] - 1], "target": 0.03,
               "monitor_share_of_jobs": shares}
    lines = [f"Health monitoring overhead of the {args.engine} engine at np=2 (MLP {FEATURES}->{HIDDEN}->{CLASSES}, "
             f"{BATCH} rows per worker per step, one core per rank, health settings "
             f"{args.health or 'ringflow defaults'}, every other setting ringflow's default: checkpoints every 50 steps, a log line every 10): {args.jobs} jobs of "
             f"{args.steps} steps, the monitor off and on in alternate blocks of {args.block} steps, each 'on' block "
             f"against the mean of the 'off' blocks on either side. 2 cores shared with other work: read the spreads.",
             "",
             f"- block pairs: {len(ratios)}",
             f"- overhead, median of the pairs: {summary['overhead_median']:.1%} "
             f"(quartiles {summary['overhead_quartiles'][0]:.1%} to {summary['overhead_quartiles'][1]:.1%})",
             f"- overhead, total time on / total time off: {summary['overhead_total']:.1%}",
             f"- the jobs' own accounting (result.json `health_monitor_share_after_warmup`: rank 0's training thread "
             f"in the monitor, over every step after warm-up, the monitor on in half of them): median "
             f"{statistics.median(shares):.2%} ({min(shares):.2%}–{max(shares):.2%} over the jobs)",
             "- target: <= 3%"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
