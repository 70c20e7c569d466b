"""A TensorFlow model factory (docs/guides/engines.md, "Your own TF model") one of whose workers runs out of memory for real at a
chosen step (imported by the TF workers through PYTHONPATH; used by test_out_of_memory.py).

The forward runs inside the worker's tf.function, so Python in it runs only when traced: the worker that is to
run out gets a tf.py_function in its forward, which counts the forward's runs and, at `at_step`, asks numpy for
2**48 bytes (256 TiB). The allocator refuses (a real MemoryError, no cap needed: no machine has that much), and
TensorFlow raises it out of the step as its own OOM error, ResourceExhaustedError.
"""
import os

import numpy as np
import tensorflow as tf

from ringflow.training.formats.tf_config import RANK_ENV
from ringflow.training.rank.tf_models import default_loss


class Hungry(tf.Module):
    def __init__(self, num_features, num_outputs, at_step, oom):
        super().__init__()
        self.w = tf.Variable(tf.zeros([num_features, num_outputs]))
        self.b = tf.Variable(tf.zeros([num_outputs]))
        self.at_step, self.oom, self.calls = at_step, oom, 0

    def __call__(self, x, training=False):
        logits = tf.matmul(tf.reshape(x, [tf.shape(x)[0], -1]), self.w) + self.b
        if self.oom:  # added to the logits (as 0) so the step waits for it
            logits += tf.cast(tf.py_function(self.count_and_run_out, [], tf.int64), logits.dtype)
        return logits

    def count_and_run_out(self):
        self.calls += 1
        if self.calls == self.at_step:
            np.empty(2**48, np.uint8)
        return np.int64(0)


def build(num_features, num_outputs, task, oom_rank=1, at_step=3):
    return Hungry(num_features, num_outputs, at_step, int(os.environ[RANK_ENV]) == oom_rank), default_loss(task)
