"""A user script's checkpoint state (training/api.py's `report(..., checkpoint=state)`) as the one file of a
checkpoint, written by the background writer (checkpoint_writer.py) and read back by `get_checkpoint()`.

A state is plain data: a dict of tensors or arrays, numbers, strings, and lists/dicts of them (a torch
`state_dict()`, an optimizer's, Keras `get_weights()`). Two files, by what it holds:

- `script_state.pt`: torch tensors in it (the torch engines' scripts), saved with torch.save and read back with
  `torch.load(weights_only=True)`, so a planted file can build tensors and containers and nothing else;
- `script_state.npz`: no torch tensor (the TensorFlow venv has no torch): every array and number as an array
  of an .npz (formats/weights_npz.py, no pickle), and the containers around them as JSON (`tree`).

The copy is taken when the state is handed over (host copies of tensors), so training goes on while the
writer uploads. Torch is imported only for a state that holds torch tensors.
"""
from __future__ import annotations

import dataclasses
import io
import json
import sys
from typing import Any, ClassVar, Mapping

import numpy as np

from ..formats.weights_npz import from_npz, to_npz

from ..formats.script_checkpoint import NUMPY_FILE, TORCH_FILE


class StateError(ValueError):
    """A state a checkpoint cannot hold; the message says what to hand over instead."""


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _has_torch(value: Any) -> bool:
    if _is_torch_tensor(value):
        return True
    if isinstance(value, Mapping):
        return any(_has_torch(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_torch(v) for v in value)
    return False


def _copy(value: Any, where: str) -> Any:
    """A copy of `value` that shares no memory with training: tensors on the host, arrays copied."""
    if _is_torch_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("numpy"):
        return np.array(value, copy=True)
    if hasattr(value, "numpy") and callable(value.numpy):  # a TensorFlow tensor or variable
        return np.array(value.numpy(), copy=True)
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, int) else k: _copy(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v, f"{where}[{i}]") for i, v in enumerate(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise StateError(f"checkpoint state {where} is a {type(value).__name__}: hand over plain data only (tensors, "
                     "arrays, numbers, strings, and dicts/lists of them, e.g. model.state_dict()), or a folder path")


def _nonfinite(value: Any, where: str, found: list[str]) -> None:
    if _is_torch_tensor(value):
        if value.is_floating_point() and not bool(value.isfinite().all()):
            found.append(where)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            found.append(where)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            found.append(where)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _nonfinite(v, f"{where}.{k}", found)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _nonfinite(v, f"{where}[{i}]", found)


def _flatten(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The JSON tree of `value` with each array (or number) replaced by {"a": its key in `arrays`}."""
    if isinstance(value, np.ndarray) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(value)
        return {"a": key, "n": not isinstance(value, np.ndarray)}
    if isinstance(value, Mapping):
        return {"d": [[k, _flatten(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"l": [_flatten(v, arrays) for v in value], "t": isinstance(value, tuple)}
    return {"v": value}  # None, bool, str


def _unflatten(tree: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if "a" in tree:
        array = arrays[tree["a"]]
        return array.item() if tree.get("n") else array
    if "d" in tree:
        return {k: _unflatten(v, arrays) for k, v in tree["d"]}
    if "l" in tree:
        items = [_unflatten(v, arrays) for v in tree["l"]]
        return tuple(items) if tree.get("t") else items
    return tree["v"]


@dataclasses.dataclass(frozen=True)
class ScriptState:
    """A host copy of a script's state, ready for the background writer (the duck type of TrainingState it
    takes: `file_name`, `save`, `nonfinite_tensors`)."""

    value: Any
    file_name: str = NUMPY_FILE
    writer_kind: ClassVar[str] = "script"

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> "ScriptState":
        if not isinstance(state, Mapping):
            raise StateError(f"checkpoint is a {type(state).__name__}: hand over a dict of the state (e.g. "
                             '{"model": model.state_dict(), "optimizer": optimizer.state_dict()}) or a folder path')
        copied = _copy(dict(state), "checkpoint")
        return cls(copied, TORCH_FILE if _has_torch(copied) else NUMPY_FILE)

    def nonfinite_tensors(self) -> list[str]:
        found: list[str] = []
        _nonfinite(self.value, "checkpoint", found)
        return found

    def to_bytes(self) -> bytes:
        if self.file_name == TORCH_FILE:
            import torch

            out = io.BytesIO()
            torch.save(self.value, out)
            return out.getvalue()
        arrays: dict[str, np.ndarray] = {}
        tree = _flatten(self.value, arrays)
        arrays["__tree__"] = np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)
        return to_npz(arrays)

    def save(self, path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(self.to_bytes())


def load_state(file_name: str, data: bytes, where: str) -> dict[str, Any]:
    """A state `ScriptState.save` wrote, read without running anything in it."""
    if file_name == TORCH_FILE:
        from .training_state import load_plain  # torch's weights_only loader: tensors and containers only

        return load_plain(data, where)
    arrays = from_npz(data, where)
    tree = json.loads(bytes(arrays.pop("__tree__")).decode())
    return _unflatten(tree, arrays)
