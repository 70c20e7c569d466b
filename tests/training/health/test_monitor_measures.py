"""The monitor's local measurements: gradient norm and parameter checksum."""
import math

import torch

from ringflow.training.health.monitor import gradient_norm, parameter_checksum


def test_gradient_norm_is_the_norm_of_all_gradients_together():
    a, b, unused = torch.zeros(3, requires_grad=True), torch.zeros(2, 2, requires_grad=True), torch.zeros(4)
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([[0.0, 4.0], [0.0, 0.0]])
    assert gradient_norm([a, b, unused]) == 5.0  # a parameter without a gradient counts as none
    assert gradient_norm([unused]) == 0.0
    b.grad[1, 1] = float("nan")
    assert math.isnan(gradient_norm([a, b]))
    b.grad[1, 1] = float("inf")
    assert gradient_norm([a, b]) == float("inf")


def test_checksum_sees_swapped_values_a_sum_would_miss():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    before = parameter_checksum(model)
    with torch.no_grad():
        w = model.weight
        w[0, 0], w[0, 1] = w[0, 1].item(), w[0, 0].item()
    assert parameter_checksum(model) != before
