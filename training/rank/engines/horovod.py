"""The Horovod engine: hvd.init with the config's knobs, the DistributedOptimizer, Horovod's allgather.

Started by horovodrun (local runs) or mpirun (an MPIJob); see launcher.py.
"""
from __future__ import annotations

import os
import sys

from ...formats.config import CYCLE_TIME_ENV, HorovodConfig, JobConfig
from ...formats.engines import HOROVOD
from ..cores import claim_cpu_share, local_rank_from_env
from ..devices import Placement, place_rank
from ..engine import Engine, share_host_cores
from ..training_state import on_cpu
from ..worker_env import elastic_slot
from .horovod_objects import broadcast_object

# Where the launchers Horovod runs under say which rank this is on its host, before hvd.init() can.
LOCAL_RANK_ENV = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI's mpirun: horovodrun --mpi, MPIJobs
    ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),                  # horovodrun --gloo
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),                        # MPICH's and Intel MPI's mpiexec (hydra)
)


# The patch of docker/build-horovod.sh that gives Gloo's collectives a timeout of their own
# (HOROVOD_GLOO_OP_TIMEOUT_SECONDS, ElasticConfig.environment), as the built package lists it.
GLOO_OP_TIMEOUT_PATCH = "gloo-op-timeout"


def has_gloo_op_timeout(horovod) -> bool:
    """Whether this Horovod reads HOROVOD_GLOO_OP_TIMEOUT_SECONDS (built by docker/build-horovod.sh)."""
    return GLOO_OP_TIMEOUT_PATCH in getattr(horovod, "RINGFLOW_PATCHES", ())


class HorovodEngine(Engine):
    name = HOROVOD

    def __init__(self, hvd, cfg: HorovodConfig, placement: Placement | None = None):
        self.hvd, self.cfg = hvd, cfg
        self.rank, self.size = hvd.rank(), hvd.size()
        self.accumulation_steps = cfg.backward_passes_per_step
        self._place(placement)  # where this rank computes (devices.py)

    @classmethod
    def start(cls, cfg: JobConfig) -> "HorovodEngine":
        """Initialize Horovod for this rank with the config's knobs."""
        # Set by the rank itself: mpirun under an MPIJob starts ranks with just the variables it forwards,
        # and Horovod and Open MPI read these once, in hvd.init().
        os.environ.update(cfg.horovod.environment(elastic=cfg.elastic is not None)
                          | (cfg.elastic.environment() if cfg.elastic is not None else {}))
        if cfg.elastic is not None:  # nor inherited: with it set, a survivor's hvd.init() segfaults (config.py)
            os.environ.pop(CYCLE_TIME_ENV, None)
        # Bound before hvd.init() starts Horovod's and MPI's threads, so they start on the rank's own CPUs.
        # Under elastic Horovod on one machine each worker is local rank 0 of 1 on a host name of its own: its
        # place among the machine's slots is its share (worker_env.elastic_slot).
        on_host = elastic_slot(os.environ) or local_rank_from_env(os.environ, LOCAL_RANK_ENV)
        share = claim_cpu_share(cfg.bind_cores, *on_host) if on_host else None
        import horovod.torch as hvd

        if cfg.elastic is not None and not has_gloo_op_timeout(sys.modules["horovod"]):
            print(f"[ringflow] rank {os.environ.get('HOROVOD_RANK', '?')}: this Horovod lacks the gloo-op-timeout "
                  f"patch of docker/build-horovod.sh, so a collective waits on a dead peer "
                  f"elastic.rendezvous_timeout_seconds ({cfg.elastic.rendezvous_timeout_seconds:g} s), not "
                  f"peer_timeout_seconds ({cfg.elastic.peer_timeout_seconds:g} s): build Horovod with that script "
                  f"for the faster recovery", file=sys.stderr, flush=True)
        hvd.init()
        if share is None:  # no launcher variable names the local rank: Horovod knows it now, and binding
            # reaches every thread, the ones hvd.init() started included
            share = claim_cpu_share(cfg.bind_cores, hvd.local_rank(), hvd.local_size())
        share_host_cores(share)
        # Horovod knows the local rank once initialized; its NCCL ops use the current device.
        placement = place_rank(cls.name, cfg.precision, hvd.local_rank(), bool(hvd.nccl_built()))
        return cls(hvd, cfg.horovod, placement)

    def distribute(self, model, optimizer):
        hvd = self.hvd
        compression = hvd.Compression.fp16 if self.cfg.fp16_compression else hvd.Compression.none
        # Wrap before loading any state: DistributedOptimizer builds a fresh optimizer from the param groups.
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=compression,
                                        backward_passes_per_step=self.accumulation_steps)

    def broadcast_state(self, model, optimizer) -> None:
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # Optimizer state travels pickled, so every rank gets rank 0's exact values and types (Adam's
        # tensor `step` included), and a resumed run matches an uninterrupted one bit for bit.
        # On the CPU: a pickled CUDA tensor would unpickle onto rank 0's GPU on every rank.
        state = broadcast_object(self.hvd, on_cpu(optimizer.state_dict()) if self.rank == 0 else None, root_rank=0,
                                 name="ringflow.optimizer_state")
        optimizer.load_state_dict(state)

    def sync_gradients(self, optimizer) -> None:
        optimizer.synchronize()
        self.precision.unscale(optimizer)  # fp16: the true gradient, for the health monitor and the step

    def apply_gradients(self, optimizer) -> None:
        with optimizer.skip_synchronize():
            self.precision.step(optimizer)

    def allgather(self, tensor, name):
        return self.hvd.allgather(tensor, name=name)

    def allgather_async(self, tensor, name):
        return self.hvd.allgather_async(tensor, name=name)

    def wait(self, handle):
        return self.hvd.synchronize(handle)
