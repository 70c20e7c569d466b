"""Bound and not bound inside one job, in alternating blocks: ringflow's loop and the plain loop of its library.

Separate jobs on this shared 2-core machine differ by tens of percent when other work runs (bench/results/
bind_cores.md gives the load), more than binding's effect. So each rank of one job (launched as ringflow
launches it, bind_cores true) runs bench/loop_vs_plain.py's worker: ringflow's own Trainer, with blocks of
the plain loop of its library between its blocks. What alternates is the binding: after each pair of blocks
every thread of the rank moves (cores.bind_process) between its own share and every CPU it started with,
on every rank at the same step. Each bound block is compared with the not-bound blocks of its kind on
either side (loop_vs_plain.neighbours), so a machine that speeds up or slows down during the job cancels
out. At np=1 the share is every CPU: the two kinds are the same, and their ratio is the method's own noise.

Run by bench/bind_cores.py (`--in-job`), which reports.
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import os
from pathlib import Path

from . import loop_vs_plain  # its rank worker, job runner and block comparison
from .checkpoint_gate import CHECKPOINTS_OFF

# Checkpoints off: the plain loop, and the plain peers of bind_cores.py's separate jobs, never checkpoint, and
# binding is what is measured.
SETTINGS = CHECKPOINTS_OFF

RF_BOUND, RF_FLOATING = "ringflow, bound", "ringflow, not bound"
PLAIN_BOUND, PLAIN_FLOATING = "plain, bound", "plain, not bound"
# Throughput ratios, block by block against its neighbours (higher: the first kind is faster): (kind,
# against, field) for loop_vs_plain.neighbours, field 1 wall-clock time, 2 the process's CPU time.
RATIOS = {"ringflow_bound_vs_not": (RF_BOUND, RF_FLOATING, 1), "plain_bound_vs_not": (PLAIN_BOUND, PLAIN_FLOATING, 1),
          "ringflow_vs_plain_bound": (RF_BOUND, PLAIN_BOUND, 1),
          "ringflow_vs_plain_not_bound": (RF_FLOATING, PLAIN_FLOATING, 1),
          "ringflow_bound_vs_not_cpu": (RF_BOUND, RF_FLOATING, 2), "plain_bound_vs_not_cpu": (PLAIN_BOUND, PLAIN_FLOATING, 2)}


class BindingSwitch:
    """What alternates: the rank bound to its own share (as the engine started it, bind_cores true), then on
    every CPU it started with, then bound again, ..."""

    def __init__(self):
        self.floating = os.sched_getaffinity(0)  # made before the engine starts and binds the rank
        self.is_bound = True

    def attach(self, trainer) -> None:
        self.bound = os.sched_getaffinity(0)  # the engine's binding

    def kinds(self) -> tuple[str, str]:
        return (RF_BOUND, PLAIN_BOUND) if self.is_bound else (RF_FLOATING, PLAIN_FLOATING)

    def flip(self) -> None:
        from ringflow.training.rank.cores import bind_process

        self.is_bound = not self.is_bound
        bind_process(sorted(self.bound if self.is_bound else self.floating))


def run_job(root: Path, engine: str, np_: int, steps: int, block: int, env: dict) -> list:
    """One job, bind_cores true, its ranks running this module; rank 0's blocks."""
    return loop_vs_plain.run_job(root, engine, np_, steps, block, env, module=__spec__.name,
                                 settings=SETTINGS | {"bind_cores": True})


def job_ratios(blocks: list) -> dict[str, list[float]]:
    return loop_vs_plain.job_ratios(blocks, RATIOS)


def main() -> None:
    """A rank's side."""
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True, help="the job config")
    p.add_argument("--block", type=int, required=True)
    p.add_argument("--blocks-out", required=True)
    args = p.parse_args()
    loop_vs_plain.worker(args.worker, args.block, args.blocks_out, BindingSwitch())


if __name__ == "__main__":
    main()
