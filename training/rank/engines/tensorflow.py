"""The TensorFlow engine: tf.distribute.MultiWorkerMirroredStrategy's collectives under ringflow's own loop.

Started by `python -m ringflow.training` in the TF venv, one process per worker, each with the TF_CONFIG
ringflow wrote for it (formats/tf_config.py; core/launcher.py locally). Torch-free: the TF venv has no torch.

The strategy is used for its collectives only (all-reduce of the gradients, all-gather of the health
measurements), each its own tf.function call, and the model's variables are plain tf.Variables on every
worker, as Horovod keeps them: equal at the start (the same seeded init, or the same checkpoint) and kept
equal by applying the same averaged gradient (the replica checksum checks that they are). Why the all-reduce
is a call of its own: the time a worker spends in it is then the step's sync time, measured on the host as
Horovod's is, all-reduce and the wait for the slowest peer together; fused into one step function
TensorFlow gives no such split (docs/guides/engines.md "Choosing an engine").
"""
from __future__ import annotations

import os

import numpy as np

from ...formats.config import JobConfig
from ...formats.engines import TENSORFLOW
from ...formats.tf_config import LOCAL_PLACE_ENV
from ..cores import claim_cpu_share, local_rank_from_env

# What this rank's CPU line calls the threads its share sizes (cores.claim_cpu_share): TensorFlow's, not torch's.
TF_THREAD = "TensorFlow intra-op thread"


class TensorflowEngine:
    name = TENSORFLOW

    def __init__(self, strategy, rank: int, size: int):
        import tensorflow as tf

        self.tf, self.strategy, self.rank, self.size = tf, strategy, rank, size
        self._device = strategy.extended.worker_devices[0]

        def on_device(values):
            # An argument of strategy.run has no device inside the function, and MWMS's collectives then
            # have no destination ("destinations can not be empty"): place it on this worker's device.
            with tf.device(self._device):
                return [tf.identity(v) for v in values]

        def mean(grads):
            ctx = tf.distribute.get_replica_context()
            averaged = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, on_device(grads))
            # The averaged gradient's norm, the same on every worker: the health check's, and NaN/Inf's.
            return averaged, tf.linalg.global_norm(averaged)

        def gather(row):
            return tf.distribute.get_replica_context().all_gather(on_device([row])[0], axis=0)

        self._mean = tf.function(lambda grads: strategy.run(mean, args=(grads,)))
        self._gather = tf.function(lambda row: strategy.run(gather, args=(row,)))

    @classmethod
    def start(cls, cfg: JobConfig) -> "TensorflowEngine":
        """Join the job: threads for this worker's share of the CPUs, then the strategy from TF_CONFIG."""
        on_host = local_rank_from_env(os.environ, LOCAL_PLACE_ENV)  # before TF starts its thread pools
        share = claim_cpu_share(cfg.bind_cores, *on_host, thread=TF_THREAD) if on_host else None
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notices, not its errors
        import tensorflow as tf

        if share is not None:
            # Before any op runs: TensorFlow sizes its pools once. More threads than the worker's share of the
            # cores oversubscribes them (engine.share_host_cores says the same for torch).
            tf.config.threading.set_intra_op_parallelism_threads(share.threads)
            tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, share.threads)))
        kinds = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=kinds.RING if cfg.tensorflow.communication == "ring" else kinds.AUTO)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        resolver = strategy.cluster_resolver
        rank = int(resolver.task_id) if resolver is not None and resolver.task_id is not None else 0
        return cls(strategy, rank, int(strategy.num_replicas_in_sync))

    def all_reduce_mean(self, grads: list) -> tuple[list, float]:
        """Every worker's gradients averaged, and their global norm (a Python float)."""
        if self.size == 1:  # nothing to average with: no collective to start
            return list(grads), float(self.tf.linalg.global_norm(grads))
        averaged, norm = self._mean(list(grads))
        return list(averaged), float(norm)

    def allgather(self, row: np.ndarray) -> np.ndarray:
        """Every worker's `row` (shape [1, k], float64) stacked in rank order: [size, k]."""
        row = np.asarray(row, dtype=np.float64).reshape(1, -1)
        if self.size == 1:
            return row
        return self._gather(self.tf.constant(row)).numpy()

    def barrier(self) -> None:
        self.allgather(np.zeros((1, 1)))
