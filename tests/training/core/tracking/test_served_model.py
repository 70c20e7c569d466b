"""The registered model's files are data (state.pt, JSON); loading them rebuilds the model that predicts what
the checkpoint's model predicts on the same rows, normalized the way training normalized them."""
import json
import os

import numpy as np
import pytest
import torch

from ringflow.training.formats.config import ModelConfig
from ringflow.training.rank.data import to_tensors
from ringflow.training.formats.manifest import load_manifest
from ringflow.training.rank.models import build_model
from ringflow.training.core.sharding import read_partition
from ringflow.training.core.tracking import served_model
from ringflow.training.rank.training_state import STATE_FILE, TrainingState


def write(folder, manifest_path, seed=0):
    manifest, store = load_manifest(manifest_path)
    schema = manifest.schema
    torch.manual_seed(seed)
    model, _ = build_model(ModelConfig(kind="mlp", hidden=(16,)), schema.num_features, schema.num_outputs, schema.task)
    state = TrainingState(model=model.state_dict(), optimizer={}, cursor=(0, 0), step=3, torch_rng=torch.get_rng_state())
    served_model.write_model_data(str(folder), state=state.to_bytes(), model={"kind": "mlp", "hidden": [16]},
                                  schema=schema, input_shape=list(schema.input_shape), source={"run_uri": "/r"})
    return model.eval(), manifest, store


def test_predicts_what_the_checkpoint_model_predicts(tmp_path, digits_manifest):
    model, manifest, store = write(tmp_path, digits_manifest)
    table = read_partition(store, manifest.eval)
    x, y = to_tensors(table, manifest.schema)
    with torch.no_grad():
        expected = model(x).argmax(dim=1).numpy()
    loaded = served_model._load_pyfunc(str(tmp_path))  # what MLflow's pyfunc calls
    features = table.to_pandas()[list(manifest.schema.features)]  # as stored: not normalized, no target
    assert np.array_equal(loaded.predict(features), expected)
    assert isinstance(loaded.get_raw_model(), torch.nn.Module)
    with pytest.raises(ValueError, match="lacks feature columns"):
        loaded.predict(features.drop(columns=[manifest.schema.features[0]]))


def test_the_folder_holds_data_only(tmp_path, digits_manifest):
    write(tmp_path, digits_manifest)
    assert sorted(os.listdir(tmp_path)) == sorted([STATE_FILE, served_model.MODEL_META])
    meta = json.loads((tmp_path / served_model.MODEL_META).read_text())
    assert meta["format"] == served_model.FORMAT and meta["schema"]["feature_mean"]
    meta["format"] = "something/v9"
    (tmp_path / served_model.MODEL_META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="load it with the ringflow that registered it"):
        served_model.load(str(tmp_path))


def test_the_signature_names_the_features(digits_manifest):
    manifest, _ = load_manifest(digits_manifest)
    signature = served_model.signature_for(manifest.schema)
    assert signature.inputs.input_names() == list(manifest.schema.features)
