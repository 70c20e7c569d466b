"""torchrun whose ranks are forked from it, with torch and the rank's modules already imported.

A local DDP job (core/launcher.torchrun_command) runs `python -u -m ringflow.training.rank.forked_torchrun`
with torchrun's own arguments and `--run-path --start-method fork forked_rank.py -m ringflow.training CONFIG`.
Plain torchrun starts every rank as a new interpreter, which imports torch and ringflow's rank before its first
step: ~1.9 s a rank on this 2-core host, at the job's start and again at every elastic restart
(rank/ddp_elastic.py), where it was most of the time from a death to the next step
(bench/results/ddp_restart_recovery.md). Here they are imported once, in torchrun's own process (with
torch._dynamo, which torch.optim imports, and botocore's models read: training/store/s3.py), and each rank is a
fork of it that runs forked_rank.py (torchrun's --run-path: runpy, in the forked process), which first puts back
what a new interpreter would have (its signal handlers, no multiprocessing start method chosen) and
ends as one would, handing its exit code to torchrun.

This process runs no torch op before it forks, so no OpenMP or Gloo thread is lost in the fork; torchrun's
rendezvous store serves from threads of its own that the ranks never touch (each round of ranks makes a store
of its own, launcher.RESTARTABLE_TORCHRUN_ENV). On a CUDA build of torch the ranks are spawned instead, as new
interpreters: torchrun asks whether CUDA is available before it starts them, which can initialize CUDA, and a
process forked after that cannot use it (not tried on a GPU here).
"""
import sys

import torch
# torch.optim imports torch._dynamo when a rank makes its first optimizer (0.9 s on this host), and torch's log
# formatter does when torchrun logs a failed worker's traceback, right before it restarts the workers: imported
# here, once, every rank forked at the start and at each restart inherits it. Each restarted rank of an elastic
# DDP job at a user's size had paid 0.5-0.9 s for it
# (bench/results/elastic_recovery_real_size-ddp-before_dynamo_in_torchrun.md).
import torch._dynamo  # noqa: F401
from torch.distributed import run

# Imported once here, inherited by every rank forked from this process.
from . import ddp_elastic, script_rank, worker  # noqa: F401
from .engines import ddp  # noqa: F401
from ..store import s3


def start_method(argv: list[str], cuda_build: bool) -> list[str]:
    """torchrun's arguments, with `--start-method fork` made `spawn` on a CUDA build of torch."""
    if not cuda_build or "--start-method" not in argv:
        return argv
    at = argv.index("--start-method") + 1
    return argv[:at] + ["spawn"] + argv[at + 1:]


if __name__ == "__main__":
    sys.argv = start_method(sys.argv, torch.version.cuda is not None)
    # botocore's models read once here too: each rank builds its S3 clients first thing (~50 ms each, ~0.25 s
    # with a restart's two ranks building theirs at once on two cores), before it rendezvouses.
    s3.load_models()
    run.main()
