"""Health monitoring overhead: step time with the monitor against without it, inside the same np=2 jobs.

Separate jobs with and without the monitor differ by ±10 % from run to run on this VM, more than the
3 % to resolve. So each job runs ringflow's own Trainer with one more callback on its loop, which switches
the health callback off and on in alternate blocks of steps; a block with it on is compared with the
blocks on either side (off), under the same load.

    .venv/bin/python bench/health_overhead.py [--engine horovod|ddp] [--jobs 8] [--steps 1600] [--block 100]
                                              [--health JSON] [--out NAME]

(bench/throughput.py also measures the monitor's cost, for both engines at np=1 and np=2, in its in-job
comparison with a plain loop.)

Results: bench/results/health_overhead.json and .md (linked from the README).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH = 256
WARMUP_STEPS = 20


def alternating_health(block: int):
    """A callback on the Trainer's loop that times each block of steps and switches the health callback
    off or on between blocks (on through warm-up). Every rank switches at the same step, so the monitor's
    gathers stay matched."""
    from ringflow.training.callbacks.base import Callback

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
    from ringflow.training.config import load_job_config
    from ringflow.training.engines import start_engine
    from ringflow.training.worker import Trainer

    cfg = load_job_config(config_path)
    engine = start_engine(cfg)  # the one its launcher was chosen for
    alternating = alternating_health(block)
    trainer = Trainer(cfg, engine, callbacks=[alternating])
    alternating.health = trainer.health
    if trainer.train() != 0:
        raise SystemExit("the training job failed")
    if engine.rank == 0:
        Path(out).write_text(json.dumps(alternating.blocks))


def run_job(root: Path, index: int, steps: int, block: int, health: dict, engine: str = "horovod") -> list[tuple[bool, float]]:
    run = root / f"run-{index}"
    cfg = {"manifest_uri": str(root / "shards2" / "manifest.json"),
           "run_uri": str(run), "checkpoint": {"every_steps": 10**6}, "epochs": max(1, round(steps / (8192 // BATCH))),
           "batch_size": BATCH, "model": {"hidden": [256, 256]}, "log_every_steps": 10**6, "health": health,
           "engine": engine}
    cfg_path, out = root / f"run-{index}.json", root / f"blocks-{index}.json"
    cfg_path.write_text(json.dumps(cfg))
    from ringflow.training.cores import TORCH_THREADS_ENV
    from ringflow.training.engines import ENGINE_ENV
    from ringflow.training.launcher import launch_command, rank_environment

    # one core per rank, as bench/throughput.py
    env = rank_environment() | {TORCH_THREADS_ENV: "1", ENGINE_ENV: engine}

    command = launch_command(engine, str(cfg_path), 2)
    last_m = len(command) - 1 - command[::-1].index("-m")  # torchrun's own `-m torch.distributed.run` comes first
    command = command[:last_m] + [str(Path(__file__).resolve()), "--worker", str(cfg_path),
                                              "--block", str(block), "--blocks-out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return [tuple(b) for b in json.loads(out.read_text())]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["horovod", "ddp"], default="horovod")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--block", type=int, default=100,
                   help="steps per block; at least checksum_every_steps, so every 'on' block holds a checksum")
    p.add_argument("--health", type=json.loads, default={},
                   help='health settings to measure, as JSON (default: ringflow\'s), e.g. \'{"every_steps": 1}\'')
    p.add_argument("--out", default="health_overhead", help="results file name under bench/results/")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--blocks-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.block, args.blocks_out)

    sys.path.insert(0, str(HERE))
    from throughput import shards

    root = Path(tempfile.mkdtemp(prefix="ringflow-health-bench-"))
    shards(root, 2)
    ratios: list[float] = []
    on_total = off_total = 0.0
    for index in range(args.jobs):
        blocks = run_job(root, index, args.steps, args.block, args.health, args.engine)
        # Each block with the monitor on against the mean of the blocks before and after it, which ran
        # without: a machine speeding up or slowing down during the job cancels out.
        pairs = [((blocks[i - 1][1] + blocks[i + 1][1]) / 2, blocks[i][1]) for i in range(1, len(blocks) - 1)
                 if blocks[i][0]]
        ratios += [on / off for off, on in pairs]
        on_total += sum(on for _, on in pairs)
        off_total += sum(off for off, _ in pairs)
        print(f"job {index}: {len(pairs)} block pairs, median overhead "
              f"{statistics.median(on / off for off, on in pairs) - 1:.1%}", flush=True)
    if len(ratios) < 2:
        raise SystemExit(f"{len(ratios)} block pair(s) measured: raise --steps or --jobs, or lower --block")
    quartiles = statistics.quantiles(ratios, n=4)
    summary = {"engine": args.engine, "health": args.health, "jobs": args.jobs, "steps": args.steps, "block_steps": args.block, "pairs": len(ratios),
               "overhead_median": statistics.median(ratios) - 1, "overhead_total": on_total / off_total - 1,
               "overhead_quartiles": [quartiles[0] - 1, quartiles[2] - 1], "target": 0.03}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{args.out}.json").write_text(json.dumps(summary, indent=1))
    lines = [f"Health monitoring overhead of the {args.engine} engine at np=2 (MLP 128->[256, 256]->10, {BATCH} rows per worker per step, one core "
             f"per rank, health settings {args.health or 'ringflow defaults'}): {args.jobs} jobs of {args.steps} steps, "
             f"the monitor off and on in alternate blocks of {args.block} steps, each 'on' block against the mean of "
             f"the 'off' blocks on either side.", "",
             f"- block pairs: {len(ratios)}",
             f"- overhead, median of the pairs: {summary['overhead_median']:.1%} "
             f"(quartiles {summary['overhead_quartiles'][0]:.1%} to {summary['overhead_quartiles'][1]:.1%})",
             f"- overhead, total time on / total time off: {summary['overhead_total']:.1%}",
             "- target: <= 3%"]
    (HERE / "results" / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
