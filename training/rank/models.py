"""Model families: the built-in tabular MLP, or a user factory named by import path (and `conv_net`, a small
convolutional factory for image-shaped inputs, the example of one)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ..formats.config import ConfigError, ModelConfig
from ..formats.model_factory import find_factory
from .model_inputs import accepts, square_image_shape

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TabularMLP(nn.Module):
    """Feed-forward net for tabular rows: Linear-ReLU(-Dropout) blocks and a linear head."""

    def __init__(self, num_features: int, num_outputs: int, hidden: tuple[int, ...] = (64, 64), dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        width = num_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A tensor-valued example (an image) is its elements side by side for an MLP; flat rows stay as they are.
        return self.net(x.flatten(1))


def default_loss(task: str) -> LossFn:
    if task == "classification":
        return nn.functional.cross_entropy
    return lambda out, y: nn.functional.mse_loss(out.squeeze(-1), y)


class ConvNet(nn.Module):
    """Conv-ReLU blocks (3x3, same padding), global average pooling and a linear head: any height/width."""

    def __init__(self, in_channels: int, num_outputs: int, channels: Sequence[int] = (16, 32)):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_channels
        for c in channels:
            layers += [nn.Conv2d(width, int(c), kernel_size=3, padding=1), nn.ReLU()]
            width = int(c)
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def conv_net(num_features: int, num_outputs: int, task: str, input_shape: Sequence[int] | None = None,
             channels: Sequence[int] = (16, 32)) -> tuple[nn.Module, LossFn]:
    """A custom-model factory for (channels, height, width) inputs: `{"kind": "custom", "factory":
    "ringflow.training.rank.models:conv_net", "kwargs": {"channels": [16, 32]}}`. Without `input_shape` (a caller
    that only knows the number of features) the input is taken as one square channel."""
    input_shape = square_image_shape(num_features, input_shape)
    return ConvNet(int(input_shape[0]), num_outputs, tuple(channels)), default_loss(task)


def build_model(cfg: ModelConfig, num_features: int, num_outputs: int, task: str,
                input_shape: Sequence[int] | None = None) -> tuple[nn.Module, LossFn]:
    """The model and its loss. `num_features` is the length of the flat example; `input_shape` the shape a
    model receives (manifest ShardSchema.input_shape), passed to a factory that takes an `input_shape`
    argument, so factories written for flat features keep working."""
    if cfg.kind == "mlp":
        return TabularMLP(num_features, num_outputs, cfg.hidden, cfg.dropout), default_loss(task)
    factory = find_factory(cfg.factory)
    kwargs = dict(cfg.kwargs)
    if input_shape is not None and "input_shape" not in kwargs and accepts(factory, "input_shape"):
        kwargs["input_shape"] = tuple(input_shape)
    built = factory(num_features, num_outputs, task, **kwargs)
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module) and callable(built[1])):
        raise ConfigError("model.factory", f"{cfg.factory} returned {type(built).__name__}",
                          "return a (torch.nn.Module, loss_fn) tuple")
    return built
