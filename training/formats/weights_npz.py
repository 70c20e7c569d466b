"""The TensorFlow engine's checkpoint files: named arrays in numpy's .npz, read without pickle.

A TensorFlow rank has no torch to write `state.pt` with, so its checkpoint (the same ringflow.checkpoint/v1
layout and manifest: formats/checkpoint.py) holds:

    model.npz       the model's parameters under torch's state_dict names and in torch's layouts (Linear
                    weight [out, in], Conv2d weight [out, in, kh, kw]): the evaluate step loads them into the
                    same torch module the other engines train (core/evaluate.py), so evaluate and promote
                    work unchanged on a TensorFlow run
    optimizer.npz   the optimizer's state (rank/tf_optimizers.py), for resume only

and its cursor, step and epoch in the manifest's JSON meta (as every checkpoint's meta has them). np.load
runs with allow_pickle=False: an .npz from a bucket can only ever give arrays, never run code (the reason
state.pt loads with weights_only=True). Torch-free and TensorFlow-free: both sides read it.
"""
from __future__ import annotations

import io
from typing import Mapping

import numpy as np

from .checkpoint import CheckpointCorrupt

MODEL_FILE = "model.npz"
OPTIMIZER_FILE = "optimizer.npz"


def to_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The arrays as .npz bytes (uncompressed: the manifest's sha256 already checks them, and float weights
    barely compress)."""
    buf = io.BytesIO()
    np.savez(buf, **{name: np.asarray(a) for name, a in arrays.items()})
    return buf.getvalue()


def from_npz(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The named arrays of .npz bytes; CheckpointCorrupt (a resume skips the checkpoint) for anything else."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise CheckpointCorrupt(f"{where} is not a numpy .npz of arrays ({exc}); resume from another "
                                "checkpoint") from None
