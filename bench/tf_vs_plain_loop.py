"""A plain TensorFlow multi-worker training loop, the yardstick of bench/tf_vs_plain.py: written the way
TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial writes one, with
nothing of ringflow's. One worker of a job: TF_CONFIG (from the bench) says which.

- the strategy: MultiWorkerMirroredStrategy() with its default communication options;
- the data: this worker's partition (the same Parquet file ringflow's rank reads), loaded into memory,
  served by tf.data (shuffled each pass, batched, repeated, prefetched) through
  strategy.distribute_datasets_from_function;
- the model and optimizer: a Keras MLP of the same widths, Adam at the same learning rate (× workers, as
  ringflow scales it), built under strategy.scope() (tf-keras: TF_USE_LEGACY_KERAS=1, as Keras 3 does not
  run under the strategy here);
- the step: one tf.function holding strategy.run of forward, backward and apply_gradients (whose gradient
  all-reduce is the Keras optimizer's), and the loss's strategy.reduce; the loop adds the returned losses
  up per epoch, as the tutorial does.

Timed as ringflow's result.json counts its rate (rank/samples_rate.py): a barrier after WARMUP steps, the
rest of the steps, a barrier; each worker writes its (samples, seconds) to --out, the bench combines them.
One intra-op and one inter-op thread per worker, as a ringflow TensorFlow rank sets for a one-core share.

    <tf venv>/bin/python -m bench.tf_vs_plain_loop --partition FILE --steps N --out FILE [...]
"""
from __future__ import annotations

if not __package__:  # run as a file: its relative imports would fail with a message that does not say why
    raise SystemExit(f"run it as a module from the repository root: python -m bench.{__file__.rsplit('/', 1)[-1][:-3]}")

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WARMUP = 10  # rank/samples_rate.WARMUP_STEPS (not imported: this loop uses nothing of ringflow)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--partition", required=True, help="this worker's Parquet partition")
    p.add_argument("--hidden", default="256,256")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=256, help="rows per worker per step")
    p.add_argument("--lr", type=float, default=1e-3, help="per worker (× workers, as ringflow scales it)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    table = pq.read_table(args.partition)
    features = [c for c in table.column_names if c != "target"]
    x = np.stack([table[c].to_numpy() for c in features], axis=1).astype(np.float32)
    y = table["target"].to_numpy().astype(np.int64)
    global_batch = args.batch * workers

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0, reshuffle_each_iteration=True)
        return ds.batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)

    with strategy.scope():
        hidden = [tf.keras.layers.Dense(int(h), activation="relu") for h in args.hidden.split(",")]
        model = tf.keras.Sequential([tf.keras.Input((len(features),)), *hidden, tf.keras.layers.Dense(args.classes)])
        optimizer = tf.keras.optimizers.Adam(args.lr * workers)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    reduction=tf.keras.losses.Reduction.NONE)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            xb, yb = inputs
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(yb, model(xb, training=True)),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    @tf.function
    def barrier_step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)

    total_loss, started = 0.0, None
    for step in range(1, args.steps + 1):
        total_loss += train_step(iterator)
        if step == WARMUP:
            barrier_step().numpy()
            started = time.perf_counter()
    barrier_step().numpy()
    seconds = time.perf_counter() - started
    with open(args.out, "w") as f:
        json.dump({"samples": (args.steps - WARMUP) * args.batch, "seconds": seconds,
                   "mean_loss": float(total_loss) / args.steps}, f)


if __name__ == "__main__":
    main()
