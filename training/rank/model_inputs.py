"""What a model factory is given, the same for every engine's models (models.py: torch, tf_models.py:
TensorFlow). Torch-free."""
from __future__ import annotations

import inspect
import math
from typing import Callable, Sequence

from ..formats.config import ConfigError


def accepts(factory: Callable, name: str) -> bool:
    """Whether `factory` takes a keyword argument `name` (by name or through **kwargs)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def square_image_shape(num_features: int, input_shape: Sequence[int] | None) -> tuple[int, ...]:
    """The (channels, height, width) a conv_net takes: `input_shape`, or without one (a caller that only
    knows the number of features) one square channel; ConfigError when the data is not such an image."""
    if input_shape is None:
        side = math.isqrt(num_features)
        input_shape = (1, side, side)
    if len(input_shape) != 3 or math.prod(input_shape) != num_features:
        raise ConfigError("model.factory", f"conv_net needs (channels, height, width) inputs; the data has shape "
                          f"{list(input_shape)} ({num_features} features)",
                          "shard a dataset with one C x H x W tensor column, or use the mlp")
    return tuple(int(d) for d in input_shape)
