"""Model families: the built-in tabular MLP, or a user factory named by import path."""
from __future__ import annotations

import importlib
from typing import Callable

import torch
from torch import nn

from ringflow.training.config import ConfigError, ModelConfig

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
        return self.net(x)


def default_loss(task: str) -> LossFn:
    if task == "classification":
        return nn.functional.cross_entropy
    return lambda out, y: nn.functional.mse_loss(out.squeeze(-1), y)


def resolve_factory(path: str) -> Callable:
    """Import `package.module:function`; a bad path fails with a message saying what was not found."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("model.factory", f"module {module_name!r} cannot be imported ({exc})",
                          "install the package on every worker or fix the import path") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError("model.factory", f"{module_name!r} has no callable {attr!r}",
                          "name a function that returns (model, loss_fn)")
    return factory


def build_model(cfg: ModelConfig, num_features: int, num_outputs: int, task: str) -> tuple[nn.Module, LossFn]:
    if cfg.kind == "mlp":
        return TabularMLP(num_features, num_outputs, cfg.hidden, cfg.dropout), default_loss(task)
    built = resolve_factory(cfg.factory)(num_features, num_outputs, task, **dict(cfg.kwargs))
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module) and callable(built[1])):
        raise ConfigError("model.factory", f"{cfg.factory} returned {type(built).__name__}",
                          "return a (torch.nn.Module, loss_fn) tuple")
    return built
