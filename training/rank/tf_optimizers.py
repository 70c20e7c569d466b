"""The TensorFlow engine's optimizers: torch's Adam and SGD with momentum 0.9 (worker.make_optimizer), the
same update rules in TensorFlow ops, with their state in tf.Variables that checkpoint as named arrays.

Written out rather than Keras's: the engine uses no Keras (docs/guides/engines.md "Choosing an engine"), and the same rules
as the torch engines' make their runs comparable step for step (bench/engines_crosscheck.py).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

# torch.optim.Adam's defaults.
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
MOMENTUM = 0.9  # worker.make_optimizer's SGD


class Optimizer:
    """Applies averaged gradients to `params` (name -> tf.Variable); its state by name (`state`, `load`)."""

    def __init__(self, kind: str, params: Mapping[str, tf.Variable], learning_rate: float):
        self.kind, self.lr = kind, float(learning_rate)
        self.params = dict(params)
        self.step = tf.Variable(0, dtype=tf.int64)
        slots = ("exp_avg", "exp_avg_sq") if kind == "adam" else ("momentum_buffer",)
        # torch's state names (exp_avg, exp_avg_sq, momentum_buffer), zeros: torch's first SGD step sets the
        # buffer to the gradient, which momentum * 0 + g is too.
        self.slots = {f"{slot}.{name}": tf.Variable(tf.zeros_like(v)) for slot in slots for name, v in params.items()}

    def apply(self, grads: list[tf.Tensor]) -> None:
        """One step on `grads`, in `params` order. Call inside a tf.function."""
        self.step.assign_add(1)
        if self.kind == "adam":
            t = tf.cast(self.step, tf.float32)
            correction1, correction2 = 1.0 - BETA1 ** t, 1.0 - BETA2 ** t
            for (name, p), g in zip(self.params.items(), grads):
                m, v = self.slots[f"exp_avg.{name}"], self.slots[f"exp_avg_sq.{name}"]
                m.assign(BETA1 * m + (1.0 - BETA1) * g)
                v.assign(BETA2 * v + (1.0 - BETA2) * tf.square(g))
                denom = tf.sqrt(v) / tf.sqrt(correction2) + EPS
                p.assign_sub((self.lr / correction1) * m / denom)
        else:
            for (name, p), g in zip(self.params.items(), grads):
                buf = self.slots[f"momentum_buffer.{name}"]
                buf.assign(MOMENTUM * buf + g)
                p.assign_sub(self.lr * buf)

    def state(self) -> dict[str, np.ndarray]:
        return {"step": self.step.numpy(), **{k: v.numpy() for k, v in self.slots.items()}}

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        missing = sorted({"step", *self.slots} - set(state))
        if missing:
            raise ValueError(f"the optimizer state lacks {missing[:3]}: it was saved by another optimizer or model")
        self.step.assign(int(state["step"]))
        for k, v in self.slots.items():
            v.assign(state[k])
