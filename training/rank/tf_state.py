"""The TensorFlow engine's training state in a checkpoint: the files (formats/weights_npz.py) and what a resume
takes from them and from the manifest's meta. Torch-free, TensorFlow-free (numpy arrays in and out).

The cursor and step come from the meta every checkpoint carries (checkpointing writes the same keys for the
torch engines): the data order is a pure function of (seed, epoch, rank) (partition_batches.py), so the
cursor alone makes a resume sample-exact; the model and optimizer arrays make it step-exact. Not saved (yet):
TensorFlow's random state, which only dropout draws from (the MLP's `dropout` > 0): a resumed run with
dropout draws other masks than the uninterrupted run would have (torch's state.pt keeps its RNG state).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..formats.checkpoint import CheckpointCorrupt, LoadedCheckpoint, require_file
from ..formats.weights_npz import MODEL_FILE, OPTIMIZER_FILE, from_npz, to_npz


@dataclasses.dataclass(frozen=True)
class TfTrainingState:
    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    cursor: tuple[int, int]  # (epoch, next minibatch in that epoch)
    step: int

    def files(self) -> dict[str, bytes]:
        return {MODEL_FILE: to_npz(self.model), OPTIMIZER_FILE: to_npz(self.optimizer)}

    def nonfinite_arrays(self) -> list[str]:
        """The model and optimizer arrays holding NaN/Inf, by name: a checkpoint never holds one."""
        return [f"{part}.{name}" for part, arrays in (("model", self.model), ("optimizer", self.optimizer))
                for name, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]

    @classmethod
    def from_loaded(cls, loaded: LoadedCheckpoint, where: str) -> "TfTrainingState":
        """The state of a checkpoint a TensorFlow rank wrote; CheckpointOfAnotherEngine for a torch engine's
        (state.pt: its tensors cannot be read without torch), CheckpointCorrupt for a broken one."""
        for name in (MODEL_FILE, OPTIMIZER_FILE):
            require_file(loaded, name, where, "tensorflow")  # a torch engine's state.pt: refused, not skipped
        meta = loaded.manifest.meta
        try:
            epoch, batch = meta["cursor"]
            cursor, step = (int(epoch), int(batch)), int(meta["step"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"{where}'s meta has no cursor and step ({exc!r}); resume from another "
                                    "checkpoint") from None
        return cls(model=from_npz(loaded.files[MODEL_FILE], f"{where}/{MODEL_FILE}"),
                   optimizer=from_npz(loaded.files[OPTIMIZER_FILE], f"{where}/{OPTIMIZER_FILE}"),
                   cursor=cursor, step=step)
