"""What asynchronous checkpoints cost a model of 100 MB at ringflow's default interval (every 50 steps), in
one job: blocks of steps with checkpoints on alternate with blocks with them off (the same loop, the same
process; checkpoint_gate.py), and each "on" block is compared with the "off" blocks on either side, so a
machine that speeds up or slows down during the job cancels out.

The model: an MLP on wide rows, 1024 features -> [4096, 4096, 1024] -> 10, 25.2 M parameters (100.7 MB in
fp32; with Adam's two moments a checkpoint is ~300 MB), a small batch so that compute stays modest on 2
cores. Every other setting is ringflow's default: Adam, health on, a log line every 10 steps, checkpoints
every 50 steps into a local run folder (the embedded default's store). One rank (np=1): rank 0 is the one
that checkpoints, and the 100 MB all-reduce of np=2 on 2 cores would swamp what is measured.

Each block is 50 steps, the default checkpoint interval, and an epoch (so every block starts one, and holds
one health checksum); an "on" block takes its one checkpoint at its first step, so the snapshot and the
background write fall in it. Python's collection every 100 steps falls in the "on" blocks, a cost counted
against checkpoints (a few milliseconds). The warm-up (two blocks) takes a checkpoint, so the measured ones
are not the first. The jobs' own `checkpoint` health records say what each checkpoint cost: the snapshot on
the training thread, the wait for the previous upload, the background write, and its bytes.

    .venv/bin/python -m bench.checkpoint_overhead [--jobs 3] [--blocks 17] [--batch 16] [--out NAME]
                                                  [--results-dir DIR]

Results: bench/results/<out>.json and .md (linked from docs/benchmarks.md).
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

from .checkpoint_gate import DEFAULT_INTERVAL, gate_checkpoints
from .common import environment, quartiles, write_random_shards
from .loop_vs_plain import neighbours
from .rank_script import rank_script_command, train_and_report
from .results_file import add_results_arguments, write_results

FEATURES, HIDDEN, CLASSES = 1024, [4096, 4096, 1024], 10
BLOCK_STEPS = DEFAULT_INTERVAL  # one checkpoint a block at the defaults
WARMUP_BLOCKS = 2  # checkpoints on: the first snapshot and upload are not measured
ON, OFF = "checkpoints on", "checkpoints off"
TARGET = 0.03


def kind_of_block(index: int) -> str:
    """Blocks after the warm-up: off, on, off, on, ..., off, so every "on" block has an "off" on either side."""
    return ON if index % 2 else OFF


def checkpoints_on_at(step: int) -> bool:
    """A checkpoint due at `step` is taken in the warm-up and in "on" blocks (the block starting at `step`)."""
    block = step // BLOCK_STEPS - WARMUP_BLOCKS
    return block < 0 or kind_of_block(block) == ON


def block_timer():
    """A callback that times each block of steps after the warm-up: (kind, wall seconds, this process's CPU
    seconds, all its threads: the training thread, the checkpoint writer and the rest, the training thread's
    own CPU seconds)."""
    from ringflow.training.rank.callbacks.base import Callback

    class BlockTimer(Callback):
        def __init__(self):
            self.blocks: list[tuple[str, float, float, float]] = []
            self.started: tuple[float, float, float] | None = None

        def on_step_end(self, loop, timing) -> None:
            if timing.step % BLOCK_STEPS or timing.step < WARMUP_BLOCKS * BLOCK_STEPS:
                return
            now = time.perf_counter(), time.process_time(), time.thread_time()  # on the training thread
            if self.started is not None:
                self.blocks.append((kind_of_block(len(self.blocks)),
                                    *(end - start for end, start in zip(now, self.started))))
            self.started = now

    return BlockTimer()


def worker(config_path: str, out: str) -> None:
    from ringflow.training.formats.config import load_job_config
    from ringflow.training.rank.engines import start_engine
    from ringflow.training.rank.worker import Trainer

    cfg = load_job_config(config_path)
    engine = start_engine(cfg)
    timer = block_timer()
    trainer = Trainer(cfg, engine, callbacks=[timer])
    gate_checkpoints(trainer, checkpoints_on_at)
    train_and_report(trainer, engine, out, lambda: timer.blocks)


def shards(root: Path, batch: int) -> str:
    # One epoch is one block: BLOCK_STEPS minibatches.
    return write_random_shards(root / "shards", partitions=1, rows_per_partition=BLOCK_STEPS * batch,
                               features=FEATURES, classes=CLASSES, batch=batch)


def run_job(root: Path, manifest: str, blocks: int, batch: int, env: dict) -> tuple[list, list[dict], dict]:
    """One job: its blocks, its `checkpoint` health records and its result (as a dict)."""
    from ringflow.training.rank.engines import ENGINE_ENV
    from .common import read_health, read_result
    from ringflow.training.store import LocalFolderStore

    tag = f"job-{time.monotonic_ns()}"
    run = root / f"run-{tag}"
    # ringflow's defaults but for the model, its batch and the epochs that make the blocks.
    cfg = {"manifest_uri": manifest, "run_uri": str(run), "batch_size": batch,
           "model": {"hidden": HIDDEN}, "epochs": WARMUP_BLOCKS + blocks}
    cfg_path, out = root / f"{tag}.json", root / f"blocks-{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    command = rank_script_command("horovod", str(cfg_path), 1, __spec__.name,
                                  ["--worker", str(cfg_path), "--blocks-out", str(out)])
    proc = subprocess.run(command, capture_output=True, text=True, env=env | {ENGINE_ENV: "horovod"}, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    store = LocalFolderStore(str(run))
    records = [r for r in read_health(store) if r["type"] == "checkpoint"]
    result = read_result(store)
    return [tuple(b) for b in json.loads(out.read_text())], records, {
        "checkpoint_blocked_seconds": result.checkpoint_blocked_seconds,
        "samples_per_sec_after_warmup": result.samples_per_sec_after_warmup}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--blocks", type=int, default=17, help="blocks after the warm-up (odd: off, on, ..., off)")
    p.add_argument("--batch", type=int, default=16)
    add_results_arguments(p, "checkpoint_overhead")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--blocks-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.blocks_out)
    if args.blocks < 3 or args.blocks % 2 == 0:
        raise SystemExit(f"--blocks {args.blocks}: give an odd number >= 3, so every 'on' block has an 'off' on either side")
    root = Path(tempfile.mkdtemp(prefix="ringflow-checkpoint-bench-"))
    manifest = shards(root, args.batch)
    wall: list[float] = []
    cpu: list[float] = []
    thread: list[float] = []
    records: list[dict] = []
    jobs = []
    for job in range(args.jobs):
        blocks, job_records, result = run_job(root, manifest, args.blocks, args.batch, environment())
        # Each "on" block's time over the mean of the "off" blocks on either side, minus one: its overhead.
        job_wall = [1 / r - 1 for r in neighbours(blocks, ON, OFF)]
        job_cpu = [1 / r - 1 for r in neighbours(blocks, ON, OFF, 2)]
        job_thread = [1 / r - 1 for r in neighbours(blocks, ON, OFF, 3)]
        wall += job_wall
        cpu += job_cpu
        thread += job_thread
        records += [r for r in job_records if not r["final"]]
        jobs.append({"blocks": blocks, "overhead_wall": job_wall, "overhead_cpu": job_cpu,
                     "overhead_training_thread_cpu": job_thread, "checkpoints": job_records, **result})
        print(f"job {job}: overhead per 'on' block, wall {[f'{v:.1%}' for v in job_wall]}, "
              f"CPU {[f'{v:.1%}' for v in job_cpu]}, training thread's CPU {[f'{v:.1%}' for v in job_thread]}",
              flush=True)

    def per_checkpoint(field: str) -> tuple[float, float, float]:
        return quartiles([r[field] for r in records])

    from ringflow.training.rank.models import TabularMLP

    params = sum(p.numel() for p in TabularMLP(FEATURES, CLASSES, tuple(HIDDEN)).parameters())
    step_seconds = statistics.median(b[1] for job in jobs for b in job["blocks"] if b[0] == OFF) / BLOCK_STEPS
    summary = {"model": {"features": FEATURES, "hidden": HIDDEN, "parameters": params, "megabytes": params * 4 / 1e6,
                         "batch": args.batch}, "np": 1, "block_steps": BLOCK_STEPS, "jobs": jobs,
               "overhead_wall": quartiles(wall), "overhead_cpu": quartiles(cpu),
               "overhead_training_thread_cpu": quartiles(thread), "pairs": len(wall),
               "step_seconds_off": step_seconds, "target": TARGET,
               "per_checkpoint": {f: per_checkpoint(f) for f in ("snapshot_seconds", "waited_seconds", "write_seconds", "bytes")}}

    def pct(q):
        return f"{q[0]:.1%} (quartiles {q[1]:.1%} to {q[2]:.1%})"

    snap, waited, write, size = (summary["per_checkpoint"][f] for f in ("snapshot_seconds", "waited_seconds",
                                                                          "write_seconds", "bytes"))
    lines = [f"Checkpoint overhead at the default interval (every {BLOCK_STEPS} steps), one job side by side: MLP {FEATURES}->"
             f"{HIDDEN}->{CLASSES}, {params / 1e6:.1f} M parameters ({params * 4 / 1e6:.0f} MB in fp32), Adam, batch "
             f"{args.batch}, np=1, every other setting ringflow's default, checkpoints into a local run folder. "
             f"{args.jobs} jobs of {WARMUP_BLOCKS} warm-up blocks and {args.blocks} blocks of {BLOCK_STEPS} steps, "
             f"checkpoints off and on in turn; each 'on' block (one checkpoint) against the mean of the 'off' blocks "
             f"on either side. 2 cores shared with other work: read the spreads.", "",
             f"- block pairs: {len(wall)}; a step with checkpoints off: {step_seconds * 1000:.0f} ms (median)",
             f"- overhead, wall time: {pct(summary['overhead_wall'])}",
             f"- overhead, the process's CPU time (all its threads, the writer's too): {pct(summary['overhead_cpu'])}",
             f"- overhead, the training thread's own CPU time: {pct(summary['overhead_training_thread_cpu'])}",
             f"- per checkpoint ({len(records)}, the jobs' `checkpoint` health records; median, quartiles): "
             f"snapshot on the training thread {snap[0] * 1000:.0f} ms ({snap[1] * 1000:.0f}–{snap[2] * 1000:.0f}), "
             f"wait for the previous upload {waited[0] * 1000:.0f} ms ({waited[1] * 1000:.0f}–{waited[2] * 1000:.0f}), "
             f"background write {write[0]:.2f} s ({write[1]:.2f}–{write[2]:.2f}), {size[0] / 2**20:.0f} MiB",
             f"- so the training thread spends {(snap[0] + waited[0]) / (BLOCK_STEPS * step_seconds):.2%} of a "
             f"checkpoint interval in the checkpoint (median snapshot and wait over {BLOCK_STEPS} median steps)",
             "- rank 0's training thread in checkpoints (result.json `checkpoint_blocked_seconds`, whole job, the "
             "final checkpoint's wait included): " + ", ".join(f"{job['checkpoint_blocked_seconds']:.2f} s" for job in jobs),
             f"- target: <= {TARGET:.0%}"]
    write_results(args, summary, lines)


if __name__ == "__main__":
    main()
