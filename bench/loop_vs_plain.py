"""ringflow's training loop against a plain loop of the same library, inside one job, in alternating blocks.

Separate jobs differ by ±10 % or more from run to run on a shared machine, more than the few percent to
resolve. So each rank of one job (launched as ringflow launches it: horovodrun or torchrun, ringflow's
settings) runs ringflow's own Trainer, and a callback on its loop, every `block` steps, runs `block` steps of
the plain loop (bench/peer_worker.PlainLoop: its own model, optimizer and in-memory rows, the same library
underneath, and no checkpoint ever). ringflow's blocks take three settings in turn (SettingsSwitch): its
defaults (checkpoints every 50 steps into the local run folder, health monitoring on, a log line every 10
steps), checkpoints off, and checkpoints and health monitoring off. Each ringflow block is compared with the
plain blocks on either side, and with the nearest blocks of the other settings: a machine that speeds up or
slows down during the job cancels out. Other benches alternate something else with the same worker and
job runner (bind_in_job.py: the rank's CPU binding).

Blocks start at multiples of the default checkpoint interval: a block at the defaults takes its checkpoint
at its first step, after the plain block before it, so the snapshot and the background upload fall in it
(checkpoint_gate.py). The three settings in turn, with Python's collections every 100 steps (every other
block), give each setting its share of collections.

    .venv/bin/python -m bench.loop_vs_plain --engine horovod|ddp --np 1|2 [--steps 1600] [--block 50]

prints one JSON document: the blocks and the ratios. bench/throughput.py runs it and reports.
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
from .common import BATCH, FEATURES, HIDDEN, ROWS_PER_RANK, environment, shards
from .peer_worker import LEARNING_RATE  # the plain loop's, given to ringflow's job too
from .rank_script import rank_script_command, train_and_report

WARMUP_STEPS = DEFAULT_INTERVAL  # ringflow at its defaults, then the blocks
RF_DEFAULTS, RF_NO_CHECKPOINTS, RF_BARE, PLAIN = ("ringflow at defaults", "ringflow, checkpoints off",
                                                  "ringflow, checkpoints and health off", "plain")


class SettingsSwitch:
    """What alternates between ringflow's blocks here: its defaults first (the warm-up's too), then
    checkpoints off, then checkpoints and health monitoring off, then the defaults again, ..."""

    SETTINGS = (RF_DEFAULTS, RF_NO_CHECKPOINTS, RF_BARE)

    def __init__(self):
        self.setting = RF_DEFAULTS

    def attach(self, trainer) -> None:
        self.health = trainer.health  # the Trainer's HealthMonitoring
        # A checkpoint due at a block's first step is taken after flip() chose the block's setting.
        gate_checkpoints(trainer, lambda step: self.setting == RF_DEFAULTS)

    def kinds(self) -> tuple[str, str]:
        """The kinds of the ringflow block now ending and of the plain block that follows it."""
        return self.setting, PLAIN

    def flip(self) -> None:
        self.setting = self.SETTINGS[(self.SETTINGS.index(self.setting) + 1) % len(self.SETTINGS)]
        self.health.enabled = self.setting != RF_BARE


def alternating(plain, block: int, switch):
    """A callback on the Trainer's loop: at every `block`-th step it closes the ringflow block, runs a timed
    block of the plain loop, and flips `switch` (SettingsSwitch, or another bench's) for the next pair.
    Every rank switches at the same step, so the monitor's gathers stay matched."""
    from ringflow.training.rank.callbacks.base import Callback

    class Alternating(Callback):
        def __init__(self):
            self.blocks: list[tuple[str, float, float]] = []  # (kind, wall seconds, this process's CPU seconds)
            self.started: tuple[float, float] | None = None

        def on_step_end(self, loop, timing) -> None:
            if timing.step < WARMUP_STEPS or (timing.step - WARMUP_STEPS) % block:
                return
            now = time.perf_counter(), time.process_time()
            ringflow_kind, plain_kind = switch.kinds()
            if self.started is None:
                plain.run(10)  # the plain loop's warm-up
            else:
                self.blocks.append((ringflow_kind, now[0] - self.started[0], now[1] - self.started[1]))
            started = time.perf_counter(), time.process_time()
            plain.run(block)
            self.blocks.append((plain_kind, time.perf_counter() - started[0], time.process_time() - started[1]))
            if self.started is not None:  # the first ringflow block runs as the plain one before it did
                switch.flip()
            self.started = time.perf_counter(), time.process_time()

    return Alternating()


def worker(config_path: str, block: int, out: str, switch=None) -> None:
    """A rank's side: ringflow's Trainer with the alternating callback; rank 0 writes the blocks to `out`.
    switch: made before the engine starts (SettingsSwitch unless given)."""
    import torch

    from ringflow.training.formats.config import load_job_config
    from ringflow.training.rank.engines import start_engine
    from ringflow.training.rank.worker import Trainer

    from .peer_worker import plain_ddp, plain_horovod

    switch = switch or SettingsSwitch()
    cfg = load_job_config(config_path)
    engine = start_engine(cfg)  # the engine its launcher was chosen for
    threads = torch.get_num_threads()  # ringflow's choice for this rank; the plain loop runs under the same
    if engine.name == "horovod":
        plain = plain_horovod(engine.hvd, engine.rank, engine.size, FEATURES, HIDDEN, BATCH, prefix="plain.")
    else:
        plain = plain_ddp(engine.rank, engine.size, FEATURES, HIDDEN, BATCH)
    torch.set_num_threads(threads)
    callback = alternating(plain, block, switch)
    trainer = Trainer(cfg, engine, callbacks=[callback])
    switch.attach(trainer)
    train_and_report(trainer, engine, out, lambda: callback.blocks)


def neighbours(blocks: list, kind: str, against: str, field: int = 1) -> list[float]:
    """For each `kind` block, the mean time of the nearest `against` block before and after it, over its
    own time: the throughput of `kind` relative to `against` under the same load. field: which of the
    block's times (1: wall-clock time; 2: the process's CPU time, which a core taken by other work does not
    lengthen; a benchmark may record more)."""
    out = []
    for i, block in enumerate(blocks):
        k, t = block[0], block[field]
        if k != kind:
            continue
        before = next((b[field] for b in reversed(blocks[:i]) if b[0] == against), None)
        after = next((b[field] for b in blocks[i + 1:] if b[0] == against), None)
        if before is not None and after is not None:
            out.append((before + after) / 2 / t)
    return out


def run_job(root: Path, engine: str, np_: int, steps: int, block: int, env: dict,
            module: str = __spec__.name, settings: dict | None = None, on_run=None) -> list:
    """One job whose ranks run `python -m module --worker CONFIG --block N --blocks-out FILE` (this module's
    worker, or another bench's); env: from common.environment(); settings: more top-level job config fields;
    on_run: called with the job's run folder URI after it ends. Rank 0's blocks."""
    if block % DEFAULT_INTERVAL:
        raise ValueError(f"block {block}: use a multiple of the default checkpoint interval, {DEFAULT_INTERVAL} steps")
    tag = f"{engine}-{np_}-{time.monotonic_ns()}"
    # ringflow's defaults (checkpoints, health, logging) but for the model, its batch and learning rate (the
    # plain loop's), the epochs that make `steps` and `settings`.
    cfg = {"manifest_uri": str(root / f"shards{np_}" / "manifest.json"), "run_uri": str(root / f"run-{tag}"),
           "epochs": max(1, round(steps / (ROWS_PER_RANK // BATCH))), "batch_size": BATCH, "learning_rate": LEARNING_RATE,
           "model": {"hidden": HIDDEN}, "engine": engine, **(settings or {})}
    cfg_path, out = root / f"{tag}.json", root / f"blocks-{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    # The rank runs the module instead of `-m ringflow.training`, under the same launcher and settings.
    command = rank_script_command(engine, str(cfg_path), np_, module,
                                  ["--worker", str(cfg_path), "--block", str(block), "--blocks-out", str(out)])
    from ringflow.training.rank.engines import ENGINE_ENV

    proc = subprocess.run(command, capture_output=True, text=True, env=env | {ENGINE_ENV: engine}, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    if on_run is not None:
        on_run(cfg["run_uri"])
    return [tuple(b) for b in json.loads(out.read_text())]


def checkpoints_written(run_uri: str) -> int:
    """How many checkpoints the job's rank 0 wrote (its `checkpoint` health records), the final one included."""
    from ringflow.training.formats.run_folder import RunFolder

    return sum(1 for r in RunFolder.open(run_uri).read_health() if r.get("type") == "checkpoint")


def whole_run(blocks: list, kind: str, against: str, field: int = 1) -> float | None:
    """Throughput of `kind` relative to `against` over the whole run: the neighbours' mean times summed over
    every `kind` block, over those blocks' own times summed. Unlike the median of block ratios, a rare slow
    block (the one a checkpoint lands in when the cadence's time floor spaces them out) counts with its full
    weight."""
    own = theirs = 0.0
    for i, block in enumerate(blocks):
        if block[0] != kind:
            continue
        before = next((b[field] for b in reversed(blocks[:i]) if b[0] == against), None)
        after = next((b[field] for b in blocks[i + 1:] if b[0] == against), None)
        if before is not None and after is not None:
            own, theirs = own + block[field], theirs + (before + after) / 2
    return theirs / own if own else None


# Whole-run ratios (whole_run), each (kind, against, field).
WHOLE_RUN = {"defaults_vs_plain": (RF_DEFAULTS, PLAIN, 1), "defaults_vs_plain_cpu": (RF_DEFAULTS, PLAIN, 2),
             "checkpoints_on_vs_off": (RF_DEFAULTS, RF_NO_CHECKPOINTS, 1)}


# Throughput ratios, block by block against its neighbours, each (kind, against, field) for neighbours():
# wall time, and `_cpu`: the process's CPU time per step, the other's over this one's.
RATIOS = {"defaults_vs_plain": (RF_DEFAULTS, PLAIN, 1), "defaults_vs_plain_cpu": (RF_DEFAULTS, PLAIN, 2),
          "checkpoints_off_vs_plain": (RF_NO_CHECKPOINTS, PLAIN, 1),
          "checkpoints_off_vs_plain_cpu": (RF_NO_CHECKPOINTS, PLAIN, 2), "bare_vs_plain": (RF_BARE, PLAIN, 1),
          "checkpoints_on_vs_off": (RF_DEFAULTS, RF_NO_CHECKPOINTS, 1),
          "checkpoints_on_vs_off_cpu": (RF_DEFAULTS, RF_NO_CHECKPOINTS, 2),
          "health_on_vs_off": (RF_NO_CHECKPOINTS, RF_BARE, 1), "health_on_vs_off_cpu": (RF_NO_CHECKPOINTS, RF_BARE, 2)}


def job_ratios(blocks: list, ratios: dict[str, tuple[str, str, int]] = RATIOS) -> dict[str, list[float]]:
    return {name: neighbours(blocks, *pair) for name, pair in ratios.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["horovod", "ddp"])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--block", type=int, default=DEFAULT_INTERVAL,
                   help="steps per block: a multiple of the default checkpoint interval, and at least "
                        "checksum_every_steps, so every block with health on holds a checksum")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--blocks-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.block, args.blocks_out)
    root = Path(tempfile.mkdtemp(prefix="ringflow-loop-bench-"))
    shards(root, args.np)
    blocks = run_job(root, args.engine, args.np, args.steps, args.block, environment())
    ratios = job_ratios(blocks)
    print(json.dumps({"blocks": blocks, **{k: statistics.median(v) for k, v in ratios.items()}}, indent=1))


if __name__ == "__main__":
    main()
