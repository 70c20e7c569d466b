"""A custom model's factory, named in the job config as `package.module:function`, imported.

Both sides need it: the preflight (core) checks the path before anything is launched, and the rank (models.py)
calls the factory. Torch-free: importing the user's module is the only thing that may bring torch in.
"""
from __future__ import annotations

import importlib
from typing import Callable

from .config import ConfigError


def find_factory(path: str) -> Callable:
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
