"""Model families and tensor-shaped inputs: the MLP flattens an image, conv_net takes (C, H, W), and a factory
is given the input shape only when it asks for it."""
from __future__ import annotations

import pytest
import torch

from ringflow.training.formats.config import ConfigError, ModelConfig
from ringflow.training.rank.models import ConvNet, build_model, conv_net


def test_the_mlp_takes_flat_rows_and_images_alike():
    model, _ = build_model(ModelConfig(), 64, 10, "classification", input_shape=(1, 8, 8))
    assert model(torch.zeros(4, 64)).shape == model(torch.zeros(4, 1, 8, 8)).shape == (4, 10)


def test_conv_net_gets_the_manifest_shape_through_the_custom_factory():
    cfg = ModelConfig(kind="custom", factory="ringflow.training.rank.models:conv_net", kwargs={"channels": [4]})
    model, loss_fn = build_model(cfg, 64, 10, "classification", input_shape=(1, 8, 8))
    assert isinstance(model, ConvNet)
    out = model(torch.zeros(5, 1, 8, 8))
    assert out.shape == (5, 10) and loss_fn(out, torch.zeros(5, dtype=torch.long)).ndim == 0
    # Evaluation rebuilds a model from the checkpoint's num_features alone: one square channel.
    again, _ = conv_net(64, 10, "classification", channels=[4])
    assert [p.shape for p in again.parameters()] == [p.shape for p in model.parameters()]


def test_conv_net_refuses_flat_inputs_with_what_to_do():
    with pytest.raises(ConfigError, match="needs \\(channels, height, width\\) inputs"):
        conv_net(13, 3, "classification", input_shape=(13,))


def flat_only(num_features, num_outputs, task):
    return torch.nn.Linear(num_features, num_outputs), torch.nn.functional.cross_entropy


def test_a_factory_without_input_shape_still_works():
    cfg = ModelConfig(kind="custom", factory=f"{__name__}:flat_only")
    model, _ = build_model(cfg, 64, 10, "classification", input_shape=(1, 8, 8))
    assert model.in_features == 64
