"""TensorFlow's MultiWorkerMirroredStrategy with Keras model.fit, as the design text writes it: ringflow writes
each worker's TF_CONFIG (the cluster and this worker's index) and sets TF_USE_LEGACY_KERAS=1 for it (tf.keras is
tf-keras: Keras 3's fit fails under this strategy, keras-team/keras#20585); trained on the job's sharded
dataset, its weights checkpointed and resumed through ringflow's API.

Resume is exact at epoch boundaries only: fit reads ahead of the batch it trains (tf.data and the strategy
prefetch), so the shard's cursor is past the trained batch mid-epoch. The script hands its weights over at the
last batch of each epoch, when the cursor and the weights agree; a crash mid-epoch resumes from the last
epoch's end. The optimizer is plain SGD, which has no state beyond the weights.
"""
import numpy as np
import tensorflow as tf

import ringflow.training.api as ringflow

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG
ctx = ringflow.get_context()
shard = ringflow.get_dataset_shard(format="numpy")
tf.keras.utils.set_random_seed(ctx.config.seed)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(shard.schema.num_features,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(shard.schema.num_outputs),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=ctx.config.learning_rate),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
state = ringflow.get_checkpoint()
if state is not None:
    model.set_weights(state["weights"])


class Report(tf.keras.callbacks.Callback):
    """Every batch a report (a heartbeat, the loss checked); the weights with the epoch's last one."""

    def on_train_batch_end(self, batch, logs=None):
        last = batch == shard.batches_per_epoch - 1
        ringflow.report({"loss": float(logs["loss"])}, checkpoint={"weights": model.get_weights()} if last else None)


spec = (tf.TensorSpec((None, shard.schema.num_features), tf.float32), tf.TensorSpec((None,), tf.int64))
for epoch in shard.epochs():
    # This worker's batches of the epoch, as they are: each worker's dataset is its own shard (nothing to
    # split again), a batch per replica.
    batches = strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_generator(lambda: iter(shard), output_signature=spec))
    model.fit(batches, initial_epoch=epoch, epochs=epoch + 1, steps_per_epoch=shard.batches_per_epoch,
              callbacks=[Report()], verbose=0)

if ctx.rank == 0:
    x, y = ringflow.get_eval_data(format="numpy")
    logits = model(x, training=False).numpy()  # this worker's copy of the weights: no collective
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    ringflow.report_eval({"accuracy": float(np.mean(logits.argmax(1) == y)), "loss": float(loss)})
