"""torchrun whose ranks are forked from it, with torch and the rank's modules already imported.

A local DDP job (core/launcher.torchrun_command) runs `python -u -m ringflow.training.rank.forked_torchrun`
with torchrun's own arguments and `--run-path --start-method fork forked_rank.py CONFIG`. Plain torchrun
starts every rank as a new interpreter, which imports torch and ringflow's rank before its first step: ~1.9 s
a rank on this 2-core host, at the job's start and again at every elastic restart (rank/ddp_elastic.py),
where it was most of the time from a death to the next step (bench/results/ddp_restart_recovery.md). Here
they are imported once, in torchrun's own process, and each rank is a fork of it that runs forked_rank.py
(torchrun's --run-path: runpy, in the forked process). The rank itself runs as under plain torchrun: the
same variables, the same entry point and exit code.

Forking is safe here because this process runs no torch op before it forks (no OpenMP or Gloo threads to
lose); torchrun's rendezvous store serves from a C++ thread the ranks never touch (each round gets a store
of its own, launcher.RESTARTABLE_TORCHRUN_ENV).
"""
from torch.distributed import run

# Imported once here, inherited by every rank forked from this process.
from . import ddp_elastic, script_rank, worker  # noqa: F401
from .engines import ddp  # noqa: F401

if __name__ == "__main__":
    run.main()
