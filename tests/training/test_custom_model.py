"""A user's own model and loss, plugged in by import path."""
import pytest
import torch

from ringflow.training.formats.config import ConfigError, ModelConfig
from ringflow.training.rank.models import TabularMLP, build_model


def linear_factory(num_features, num_outputs, task, scale=1.0):
    return torch.nn.Linear(num_features, num_outputs), lambda out, y: scale * torch.nn.functional.cross_entropy(out, y)


def not_a_model(num_features, num_outputs, task):
    return "nope"


def test_builtin_mlp_shapes():
    model, loss = build_model(ModelConfig(hidden=(8, 4)), 5, 3, "classification")
    assert isinstance(model, TabularMLP) and model(torch.zeros(2, 5)).shape == (2, 3)
    reg, reg_loss = build_model(ModelConfig(), 5, 1, "regression")
    assert reg_loss(reg(torch.zeros(4, 5)), torch.zeros(4)).ndim == 0


def test_factory_by_import_path():
    cfg = ModelConfig(kind="custom", factory="test_custom_model:linear_factory", kwargs={"scale": 2.0})
    model, loss = build_model(cfg, 4, 3, "classification")
    assert isinstance(model, torch.nn.Linear) and model.out_features == 3
    with pytest.raises(ConfigError, match="return a"):
        build_model(ModelConfig(kind="custom", factory="test_custom_model:not_a_model"), 4, 3, "classification")
