"""The process environment changed for one block, then put back exactly as it was.

For clients configured only through the environment (boto3 in the evaluate step, MLflow's client): the
settings, credentials included, hold for the call and outlive it in no variable.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator, Mapping


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str], unset: Iterable[str] = ()) -> Iterator[None]:
    """Within the block, `unset` are removed and `values` set; afterwards every name touched has its
    earlier value again, or is gone if it had none."""
    names = set(values) | set(unset)
    saved = {name: os.environ.get(name) for name in names}
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
