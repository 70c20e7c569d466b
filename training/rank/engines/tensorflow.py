"""The TensorFlow engine: tf.distribute.MultiWorkerMirroredStrategy's collectives under ringflow's own loop.

Started by `python -m ringflow.training` in the TF venv, one process per worker, each with the TF_CONFIG
ringflow wrote for it (formats/tf_config.py; core/launcher.py locally). Torch-free: the TF venv has no torch.

A training step is one compiled call (`compile_step`): forward, backward, the gradients' all-reduce and the
optimizer update in one tf.function under strategy.run, as TensorFlow's own multi-worker custom loop writes
it, so a step costs one trip through Python and no wait for a value on the host. The model's variables are
plain tf.Variables on every worker, as Horovod keeps them: equal at the start (the same seeded init, or the
same checkpoint) and kept equal by applying the same averaged gradient (the replica checksum checks that
they are). The health measurements are taken inside the step so that they do not split it:

- sync time: tf.timestamp() just before the all-reduce (once every gradient exists) and just after it (once
  every averaged gradient exists), inside the step: the collective plus the wait for the slowest worker,
  as before, now clocked by TensorFlow's op timestamps rather than by the host around a call of its own;
- gradient norm: the averaged gradient's, the same on every worker, an output of the step;
- NaN/Inf: decided inside the step, on the averaged gradient's norm: a non-finite gradient is never
  applied (the update runs under tf.cond), and the first step that had one, and the first step whose own
  loss was not finite on this worker, are kept in variables that the loop reads when it measures.

The loop converts these outputs to Python only when it measures (health.every_steps, before a checkpoint
step, at the last step; every step with health.nonfinite_every_step) or logs, not every step. The health
gathers (all-gather of every worker's measurements, checksums) stay calls of their own, at those steps only.

The collective: MWMS's all-reduce flattens the gradient list into one pack, one collective per step
(CommunicationOptions' bytes_per_pack at its default 0; not measured against smaller packs, which could
only pay where a pack starts while the backward pass still runs, and the sync timestamps wait for every
gradient). `tensorflow.communication` chooses ring or auto; on these CPU-only ranks auto has no NCCL to
pick and runs the ring too, so the default stays ring (config.TensorflowConfig).
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

# The step's outputs, one float64 vector (one read when the loop needs any of them): this worker's loss, the
# averaged gradient's norm, the seconds in the all-reduce (0 in a world of one).
LOSS, NORM, SYNC = 0, 1, 2


class TensorflowEngine:
    name = TENSORFLOW

    def __init__(self, strategy, rank: int, size: int, options=None):
        import tensorflow as tf

        self.tf, self.strategy, self.rank, self.size = tf, strategy, rank, size
        self._options = options
        self._device = strategy.extended.worker_devices[0]

        def gather(row):
            return tf.distribute.get_replica_context().all_gather(self._on_device([row])[0], axis=0)

        self._gather = tf.function(lambda row: strategy.run(gather, args=(row,)))

    def _on_device(self, values):
        # An argument of strategy.run has no device inside the function, and MWMS's collectives then have no
        # destination ("destinations can not be empty"): place it on this worker's device.
        tf = self.tf
        with tf.device(self._device):
            return [tf.identity(v) for v in values]

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
        return cls(strategy, rank, int(strategy.num_replicas_in_sync), options)

    def compile_step(self, compute, apply) -> "CompiledStep":
        """One training step as one tf.function: `compute(x, y, scale)` -> (loss, grads) on this worker, the
        gradients averaged over the workers, `apply(averaged)` unless their norm is NaN/Inf."""
        tf, size = self.tf, self.size
        with tf.device(self._device):
            number = tf.Variable(0, dtype=tf.int64, trainable=False)  # the step's number: the loop's step + 1
            first_loss = tf.Variable(-1, dtype=tf.int64, trainable=False)
            first_gradient = tf.Variable(-1, dtype=tf.int64, trainable=False)

        def replica_step(x, y, scale):
            step = number.assign_add(1)
            loss, grads = compute(x, y, scale)
            if size > 1:
                with tf.control_dependencies(grads):  # every gradient exists: the sync starts now
                    started = tf.timestamp()
                with tf.control_dependencies([started]):
                    grads = [tf.identity(g) for g in grads]
                averaged = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.MEAN, grads, options=self._options)
                with tf.control_dependencies(averaged):
                    sync = tf.timestamp() - started
            else:  # nothing to average with: no collective to start
                averaged, sync = list(grads), tf.constant(0.0, tf.float64)
            norm = tf.linalg.global_norm(averaged)
            finite = tf.math.is_finite(norm)
            # Where it began, kept on the device and read when the loop measures: this worker's own loss (the
            # verdict names the worker), and the averaged gradient (the same on every worker).
            first_loss.assign(tf.where((first_loss < 0) & ~tf.math.is_finite(loss), step, first_loss))
            first_gradient.assign(tf.where((first_gradient < 0) & ~finite, step, first_gradient))

            def update():
                apply(averaged)
                return tf.constant(True)

            # A NaN/Inf gradient never reaches the model, whenever the loop next reads the norm.
            tf.cond(finite, update, lambda: tf.constant(False))
            return tf.stack([tf.cast(loss, tf.float64), tf.cast(norm, tf.float64), sync])

        run = tf.function(lambda x, y, scale: self.strategy.run(replica_step, args=(x, y, scale)))
        return CompiledStep(run, number, first_loss, first_gradient)

    def allgather(self, row: np.ndarray) -> np.ndarray:
        """Every worker's `row` (shape [1, k], float64) stacked in rank order: [size, k]."""
        row = np.asarray(row, dtype=np.float64).reshape(1, -1)
        if self.size == 1:
            return row
        return self._gather(self.tf.constant(row)).numpy()

    def barrier(self) -> None:
        self.allgather(np.zeros((1, 1)))


class CompiledStep:
    """TensorflowEngine.compile_step's step: called with (x, y, scale) it trains one step and returns the
    float64 vector [loss, norm, sync seconds] (LOSS, NORM, SYNC) as a tensor, read by the caller when it needs
    it. `first_nonfinite_loss` / `first_nonfinite_gradient`: the first step at which this worker's loss, and
    the averaged gradient, was NaN/Inf, or None (each read is a copy to the host: when measuring)."""

    def __init__(self, run, number, first_loss, first_gradient):
        self._run, self._number, self._first_loss, self._first_gradient = run, number, first_loss, first_gradient

    def start_at(self, step: int) -> None:
        """The loop's step before the first call (a resumed run's): the steps count on from there."""
        self._number.assign(step)

    def __call__(self, x, y, scale):
        return self._run(x, y, scale)

    def first_nonfinite_loss(self) -> int | None:
        first = int(self._first_loss.numpy())
        return first if first >= 0 else None

    def first_nonfinite_gradient(self) -> int | None:
        first = int(self._first_gradient.numpy())
        return first if first >= 0 else None
