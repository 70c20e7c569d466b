"""The registered model: an MLflow pyfunc whose files are data and whose code is ringflow's.

A checkpoint is data, not code (docs/guides/checkpoints.md, "Checkpoints are data, not code"), and the registered model keeps it
so: its folder holds the checkpoint's `state.pt` (tensors, loaded with weights_only=True) and
`ringflow-model.json` (the model config and the shard schema with the feature mean/std); MLflow loads it with
this module as the pyfunc `loader_module` (`_load_pyfunc`), so nothing pickled is ever unpickled. Loading
needs ringflow installed, as any pyfunc needs its flavor's package.

    model = mlflow.pyfunc.load_model("models:/digits-mlp@champion")
    model.predict(df)            # df: the dataset's feature columns, as stored (not normalized)
    model.get_raw_model()        # the torch.nn.Module

predict gives what ringflow's evaluate scores: the class index (argmax of the outputs) for classification,
the predicted value for regression.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from ...formats.manifest import ShardSchema
from ...rank.training_state import STATE_FILE

MODEL_META = "ringflow-model.json"
FORMAT = "ringflow.served-model/v1"


def write_model_data(folder: str, *, state: bytes, model: Mapping[str, Any], schema: ShardSchema,
                     input_shape: Any, source: Mapping[str, Any]) -> str:
    """The pyfunc's data folder: state.pt as the checkpoint holds it, and the JSON that rebuilds the model
    (`model` and `input_shape` as the checkpoint's meta says; evaluate builds it from the same).
    `source` says where it came from (run folder, checkpoint, registry version)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, STATE_FILE), "wb") as fh:
        fh.write(state)
    meta = {"format": FORMAT, "model": dict(model), "input_shape": input_shape, "schema": dataclasses.asdict(schema),
            "source": dict(source)}
    with open(os.path.join(folder, MODEL_META), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True, default=str)
    return folder


class ServedModel:
    """A ringflow model behind MLflow's pyfunc predict."""

    def __init__(self, module: Any, schema: ShardSchema) -> None:
        self.module, self.schema = module, schema

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> Any:
        import numpy as np
        import pandas as pd
        import pyarrow as pa
        import torch

        from ...rank.data import to_tensors

        table = model_input if isinstance(model_input, pa.Table) else pa.Table.from_pandas(
            pd.DataFrame(model_input), preserve_index=False)
        missing = [name for name in self.schema.features if name not in table.column_names]
        if missing:
            raise ValueError(f"the input lacks feature columns {missing}; give the dataset's feature columns "
                             f"{list(self.schema.features)}")
        if self.schema.target not in table.column_names:
            # to_tensors normalizes the features the way training did (one place for it) and reads the
            # target too; a request has none, so a placeholder stands in and its values are never used.
            table = table.append_column(self.schema.target, pa.array(np.zeros(len(table), dtype=np.int64)))
        x, _ = to_tensors(table, self.schema)
        with torch.no_grad():
            outputs = self.module(x)
        if self.schema.task == "classification":
            return outputs.argmax(dim=1).numpy()
        return outputs.squeeze(-1).numpy()

    def get_raw_model(self) -> Any:
        return self.module


def load(folder: str) -> ServedModel:
    """The model in a data folder written by write_model_data."""
    from ...formats.config import ModelConfig
    from ...rank.models import build_model
    from ...rank.training_state import TrainingState

    with open(os.path.join(folder, MODEL_META)) as fh:
        meta = json.load(fh)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}/{MODEL_META} is format {meta.get('format')!r}, not {FORMAT!r}: load it with "
                         f"the ringflow that registered it")
    schema = ShardSchema(**meta["schema"])
    model_cfg = dict(meta["model"])
    model_cfg["hidden"] = tuple(model_cfg.get("hidden", ()))
    module, _ = build_model(ModelConfig(**model_cfg), schema.num_features, schema.num_outputs, schema.task,
                            input_shape=meta.get("input_shape"))
    with open(os.path.join(folder, STATE_FILE), "rb") as fh:
        state = TrainingState.from_bytes(fh.read(), f"{folder}/{STATE_FILE}")
    module.load_state_dict(state.model)
    module.eval()
    return ServedModel(module, schema)


def _load_pyfunc(data_path: str) -> ServedModel:
    """MLflow's pyfunc entry point (loader_module): `data_path` is the model's data folder."""
    return load(data_path)


def signature_for(schema: ShardSchema) -> Any:
    """An MLflow signature naming the feature columns (numbers), when every feature is a scalar; a tensor
    feature (an image) has none, as its column holds nested lists."""
    if any(column.shape for column in schema.feature_columns):
        return None
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec
    import numpy as np

    inputs = Schema([ColSpec("double", name) for name in schema.features])
    dtype = np.dtype("int64") if schema.task == "classification" else np.dtype("float32")
    return ModelSignature(inputs=inputs, outputs=Schema([TensorSpec(dtype, (-1,))]))
