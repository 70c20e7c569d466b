"""A user script's checkpoint state (rank/script_state.py): torch states round-trip through torch's weights-only
loader, torch-free ones through an .npz with their containers as JSON; a planted pickle runs nothing."""
import io
import pickle

import numpy as np
import pytest
import torch

from ringflow.training.formats.checkpoint import CheckpointCorrupt
from ringflow.training.formats.script_checkpoint import NUMPY_FILE, TORCH_FILE
from ringflow.training.rank.script_state import ScriptState, StateError, load_state


def round_trip(state):
    kept = ScriptState.of(state)
    return kept.file_name, load_state(kept.file_name, kept.to_bytes(), "test")


def test_a_torch_state_round_trips_with_its_nested_containers():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3, "lr": 0.5,
             "history": [1.5, (2, "two"), [None, True]]}
    file_name, back = round_trip(state)
    assert file_name == TORCH_FILE
    assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)  # a tuple stays a tuple
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert (back["epoch"], back["lr"], back["history"]) == (3, 0.5, [1.5, (2, "two"), [None, True]])


def test_a_numpy_state_round_trips_its_numbers_lists_and_tuples():
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(3, dtype=np.float64)]
    state = {"weights": weights, "step": 7, "lr": 0.25, "done": False, "name": "keras",
             "nested": {"pair": (1, 2.5), "deep": [[np.int64(4)], ()], "none": None}}
    file_name, back = round_trip(state)
    assert file_name == NUMPY_FILE
    assert [w.dtype for w in back["weights"]] == [np.float32, np.float64]
    assert all(np.array_equal(a, b) for a, b in zip(back["weights"], weights))
    assert (back["step"], back["lr"], back["done"], back["name"]) == (7, 0.25, False, "keras")
    assert type(back["step"]) is int and type(back["lr"]) is float
    assert back["nested"]["pair"] == (1, 2.5) and back["nested"]["none"] is None
    assert back["nested"]["deep"][0][0] == 4 and back["nested"]["deep"][1] == ()


def test_the_state_is_copied_when_handed_over():
    tensor, array = torch.zeros(2), np.zeros(2)
    kept = ScriptState.of({"t": tensor, "a": array})
    tensor += 1
    array += 1
    assert kept.value["t"].sum() == 0 and kept.value["a"].sum() == 0


def test_non_finite_values_are_named_and_objects_refused():
    kept = ScriptState.of({"ok": np.ones(2), "bad": [np.array([np.nan])], "loss": float("inf"), "t": torch.ones(1)})
    assert kept.nonfinite_tensors() == ["checkpoint.bad[0]", "checkpoint.loss"]
    with pytest.raises(StateError, match="checkpoint.model is a Linear: hand over plain data only"):
        ScriptState.of({"model": torch.nn.Linear(1, 1)})
    with pytest.raises(StateError, match="checkpoint is a list: hand over a dict"):
        ScriptState.of([np.ones(1)])


RAN: list[str] = []


def run_on_load(what: str) -> None:
    RAN.append(what)


class Planted:
    def __reduce__(self):
        return run_on_load, ("ran",)


def test_a_planted_pickle_runs_nothing():
    planted = io.BytesIO()
    torch.save({"model": Planted()}, planted)
    with pytest.raises(CheckpointCorrupt, match="refused to load .*nothing in it was run"):
        load_state(TORCH_FILE, planted.getvalue(), "planted.pt")
    raw = io.BytesIO()
    np.savez(raw, __tree__=np.frombuffer(b'{"a": "a0"}', dtype=np.uint8),
             a0=np.array([Planted()], dtype=object))
    with pytest.raises(CheckpointCorrupt, match="is not a numpy .npz of arrays"):
        load_state(NUMPY_FILE, raw.getvalue(), "planted.npz")
    assert RAN == []
    pickle.loads(pickle.dumps(Planted()))  # what either would have done, unpickled
    assert RAN == ["ran"]
