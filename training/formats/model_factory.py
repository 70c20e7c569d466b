"""A custom model's factory, named in the job config as `package.module:function`, imported.

Both sides need it: the preflight (core) checks the path before anything is launched, and the rank (models.py)
calls the factory. Torch-free: importing the user's module is the only thing that may bring torch in.
"""
from __future__ import annotations

import importlib
import importlib.util
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


def find_factory_module(path: str, *, why: str) -> None:
    """Check that the module of `package.module:function` is installed here, without importing it (only its
    parent packages are imported, as Python must to find it): for a factory whose module imports what this
    interpreter lacks, as a TensorFlow factory in the Airflow/torch venv. `why` says, in the message, why it
    was not imported. The function itself is checked where the factory is called."""
    module_name = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name)
    except ImportError as exc:  # a parent package is missing, or fails to import
        raise ConfigError("model.factory", f"module {module_name!r} cannot be found ({exc}; {why})",
                          "install the package on every worker and where the job is checked, or fix the "
                          "import path") from exc
    if found is None:
        raise ConfigError("model.factory", f"module {module_name!r} is not installed here ({why})",
                          "install the package on every worker and where the job is checked, or fix the "
                          "import path")
