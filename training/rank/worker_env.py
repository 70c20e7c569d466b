"""Environment variables the launcher sets for every rank (kept torch-free: the launcher imports it), and what
a rank can learn from its launcher's environment before its engine starts."""
from __future__ import annotations

from typing import Mapping

# Identifies one launch, so the launcher can tell this attempt's result.json from an earlier attempt's.
ATTEMPT_ENV = "RINGFLOW_ATTEMPT_ID"

# Where each launcher says which rank a process is, before hvd.init or the c10d rendezvous: Open MPI's
# mpirun (horovodrun --mpi, an MPIJob's launcher), horovodrun's Gloo controller, torchrun.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK", "PMI_RANK")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "WORLD_SIZE", "PMI_SIZE")


def _first_int(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def launcher_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank as its launcher set it, or None when started some other way."""
    return _first_int(environ, _RANK_VARS)


def launcher_world_size(environ: Mapping[str, str]) -> int | None:
    return _first_int(environ, _SIZE_VARS)

# The Kubernetes node a rank's pod runs on, set by the Kubernetes backends from the downward API
# (spec.nodeName): a straggler's node is what the next try keeps off (training/core/remediation.py). Where it
# is not set (local processes, ranks an MPIJob's mpirun starts over ssh with a bare environment) the rank
# names its host instead.
NODE_NAME_ENV = "RINGFLOW_NODE_NAME"


def node_name(environ: Mapping[str, str]) -> str:
    """The Kubernetes node this rank runs on (NODE_NAME_ENV, from the downward API), or "" when it is not
    known. Not the host name: in a pod that is the pod's name, and a rank mpirun starts over ssh on an MPIJob
    worker never sees the downward API's variables, so a host name would send a straggler remedy after a node
    that does not exist (it keeps off nothing, and the policy then blames the job)."""
    return environ.get(NODE_NAME_ENV, "")


# Where each launcher says which rank a process is on its host: torchrun, Open MPI's mpirun, horovodrun's Gloo
# controller, MPICH's hydra.
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "MPI_LOCALRANKID")


def launcher_local_rank(environ: Mapping[str, str]) -> int:
    """This process's rank on its host as its launcher set it; 0 when none did."""
    return _first_int(environ, _LOCAL_RANK_VARS) or 0


# An elastic Horovod job on one machine (core/elastic_hosts.py): the slot names of this machine, in order, one
# per worker; a worker's HOROVOD_HOSTNAME is one of them, and its index is its place on this machine.
ELASTIC_SLOTS_ENV = "RINGFLOW_ELASTIC_SLOTS"


def elastic_slot(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(this worker's place among the machine's elastic slots, how many there are), or None outside one: under
    elastic Horovod every worker is local rank 0 of 1 on a host name of its own."""
    names = [n for n in environ.get(ELASTIC_SLOTS_ENV, "").split(",") if n]
    host = environ.get("HOROVOD_HOSTNAME", "")
    return (names.index(host), len(names)) if host in names else None
