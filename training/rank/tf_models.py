"""The TensorFlow engine's models: the built-in MLP and the image CNN as twins of models.py's torch modules
(the same layers and hyperparameters, parameters under the same state_dict names and in torch's layouts), or
a user's factory by import path.

Why twins in torch's layouts: a TensorFlow checkpoint (formats/weights_npz.py) then loads into the torch
module the evaluate step builds for every engine's runs, so evaluate and promote need nothing of TensorFlow.
The layout costs a transpose of each weight per step (a few KB for these models), not a copy of the data.

Plain tf.Module and tf.Variable, no Keras: the engine trains with a custom loop (rank/tensorflow_worker.py;
docs/guides/engines.md "Choosing an engine" says why not Keras's fit).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from ..formats.config import ConfigError, ModelConfig
from ..formats.model_factory import find_factory
from .model_inputs import accepts, square_image_shape

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

# ringflow's own torch factories a config may name, and their TensorFlow twins: the same config trains on
# every engine, and its checkpoint evaluates with the factory the config names.
TWINS = {"ringflow.training.rank.models:conv_net": "ringflow.training.rank.tf_models:conv_net"}


def _uniform(rng: np.random.Generator, shape: Sequence[int], fan_in: int) -> tf.Variable:
    """torch's default init for Linear and Conv2d weights and biases, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (kaiming_uniform with a=sqrt(5)), drawn from numpy with the job's seed: every worker draws the same
    values, so the replicas start equal without a broadcast."""
    bound = 1.0 / math.sqrt(fan_in)
    return tf.Variable(rng.uniform(-bound, bound, size=tuple(shape)).astype(np.float32))


class TorchLayoutModule(tf.Module):
    """A model whose parameters are kept by torch's state_dict names, in torch's layouts."""

    def __init__(self):
        super().__init__()
        self.params: dict[str, tf.Variable] = {}

    def named_parameters(self) -> dict[str, tf.Variable]:
        return self.params

    @property
    def trainable_variables(self) -> tuple[tf.Variable, ...]:
        return tuple(self.params.values())

    def _linear(self, rng, name: str, fan_in: int, fan_out: int) -> None:
        self.params[f"{name}.weight"] = _uniform(rng, (fan_out, fan_in), fan_in)
        self.params[f"{name}.bias"] = _uniform(rng, (fan_out,), fan_in)

    def _apply_linear(self, name: str, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, self.params[f"{name}.weight"], transpose_b=True) + self.params[f"{name}.bias"]


class TabularMLP(TorchLayoutModule):
    """models.TabularMLP's twin: Linear-ReLU(-Dropout) blocks and a linear head, names net.<index>.*."""

    def __init__(self, num_features: int, num_outputs: int, hidden: tuple[int, ...] = (64, 64),
                 dropout: float = 0.0, seed: int = 0):
        super().__init__()
        rng = np.random.default_rng([seed, 0x7F])
        self.dropout, self.layers, width, index = float(dropout), [], num_features, 0
        for h in hidden:
            self._linear(rng, f"net.{index}", width, h)
            self.layers.append(f"net.{index}")
            index += 3 if dropout else 2  # torch's Sequential counts the ReLU and Dropout too
            width = h
        self._linear(rng, f"net.{index}", width, num_outputs)
        self.head = f"net.{index}"

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        x = tf.reshape(x, (tf.shape(x)[0], -1))  # an image is its elements side by side, as in torch
        for name in self.layers:
            x = tf.nn.relu(self._apply_linear(name, x))
            if training and self.dropout:
                x = tf.nn.dropout(x, rate=self.dropout)
        return self._apply_linear(self.head, x)


class ConvNet(TorchLayoutModule):
    """models.ConvNet's twin: 3x3 same-padded Conv-ReLU blocks, global average pooling, a linear head; it
    takes (N, C, H, W) like torch and computes in TensorFlow's NHWC."""

    def __init__(self, in_channels: int, num_outputs: int, channels: Sequence[int] = (16, 32), seed: int = 0):
        super().__init__()
        rng = np.random.default_rng([seed, 0xC0])
        self.convs, width = [], in_channels
        for i, c in enumerate(channels):
            name = f"features.{2 * i}"  # Conv2d, ReLU, Conv2d, ReLU, ... in torch's Sequential
            self.params[f"{name}.weight"] = _uniform(rng, (int(c), width, 3, 3), width * 9)
            self.params[f"{name}.bias"] = _uniform(rng, (int(c),), width * 9)
            self.convs.append(name)
            width = int(c)
        self._linear(rng, "head", width, num_outputs)

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        x = tf.transpose(x, (0, 2, 3, 1))
        for name in self.convs:
            kernel = tf.transpose(self.params[f"{name}.weight"], (2, 3, 1, 0))  # [out,in,kh,kw] -> [kh,kw,in,out]
            x = tf.nn.relu(tf.nn.conv2d(x, kernel, strides=1, padding="SAME") + self.params[f"{name}.bias"])
        return self._apply_linear("head", tf.reduce_mean(x, axis=(1, 2)))


def default_loss(task: str) -> LossFn:
    """models.default_loss's: mean cross-entropy of logits, or mean squared error."""
    if task == "classification":
        return lambda out, y: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out))
    return lambda out, y: tf.reduce_mean(tf.square(tf.squeeze(out, -1) - y))


def conv_net(num_features: int, num_outputs: int, task: str, input_shape: Sequence[int] | None = None,
             channels: Sequence[int] = (16, 32), seed: int = 0) -> tuple[ConvNet, LossFn]:
    """models.conv_net's twin (the same config: the torch factory's path is mapped here, TWINS)."""
    shape = square_image_shape(num_features, input_shape)
    return ConvNet(int(shape[0]), num_outputs, tuple(channels), seed=seed), default_loss(task)


def parameters(model) -> dict[str, tf.Variable]:
    """The model's parameters by name: a TorchLayoutModule's torch names, else each trainable variable's
    TensorFlow name (made unique in order), which is what a user model's checkpoint holds."""
    if hasattr(model, "named_parameters"):
        return dict(model.named_parameters())
    out: dict[str, tf.Variable] = {}
    for v in model.trainable_variables:
        name = v.name.split(":")[0]
        key, n = name, 1
        while key in out:
            n += 1
            key = f"{name}_{n}"
        out[key] = v
    return out


def build_model(cfg: ModelConfig, num_features: int, num_outputs: int, task: str,
                input_shape: Sequence[int] | None = None, seed: int = 0):
    """The model and its loss, as models.build_model builds them for torch. A custom factory is called as
    `factory(num_features, num_outputs, task, **kwargs)` (plus `input_shape` and `seed` when it takes
    them) and returns (model, loss_fn): model a tf.Module called as model(x, training=...) whose
    `trainable_variables` are tf.Variables; loss_fn(outputs, targets) a scalar tensor."""
    if cfg.kind == "mlp":
        return TabularMLP(num_features, num_outputs, cfg.hidden, cfg.dropout, seed=seed), default_loss(task)
    factory = find_factory(TWINS.get(cfg.factory, cfg.factory))
    kwargs = dict(cfg.kwargs)
    if input_shape is not None and "input_shape" not in kwargs and accepts(factory, "input_shape"):
        kwargs["input_shape"] = tuple(input_shape)
    if "seed" not in kwargs and accepts(factory, "seed"):
        kwargs["seed"] = seed
    built = factory(num_features, num_outputs, task, **kwargs)
    if not (isinstance(built, tuple) and len(built) == 2 and callable(built[0]) and callable(built[1])
            and all(isinstance(v, tf.Variable) for v in getattr(built[0], "trainable_variables", (None,)))):
        raise ConfigError("model.factory", f"{cfg.factory} returned {type(built).__name__}, not a TensorFlow "
                          "(model, loss_fn)", "return (a tf.Module whose trainable_variables are tf.Variables, "
                          "loss_fn) for the tensorflow engine")
    return built
