"""A user script's promoted checkpoint in MLflow's registry (mlflow_registry.py): a model version holding the
state file and script.json (how to load it), the alias on it; not a pyfunc (the model's class is the script's).
A real MLflow server (tests/conftest.py's mlflow_server)."""
from __future__ import annotations

import json

import pytest
from evaluated_runs import make_script_run

from ringflow.training.core.tracking.mlflow_registry import SCRIPT_FILE, register_promotion
from ringflow.training.core.tracking.settings import TrackingSettings
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.script_checkpoint import TORCH_FILE
from ringflow.training.store import LocalFolderStore, open_store

pytestmark = [pytest.mark.job, pytest.mark.timeout(300)]


def test_a_script_models_version_holds_its_state_file_and_how_to_load_it(tmp_path, digits_manifest, mlflow_server,
                                                                         monkeypatch):
    import mlflow
    import torch
    from mlflow import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    run_uri = str(tmp_path / "runs" / "r1")
    model, checkpoint = make_script_run(LocalFolderStore(run_uri), digits_manifest, {"accuracy": 0.9})
    settings = TrackingSettings(mlflow_server.uri)

    number = register_promotion(settings, experiment="ringflow_script_test", run_uri=run_uri,
                                run_folder=RunFolder(LocalFolderStore(run_uri), uri=run_uri), checkpoint=checkpoint,
                                model_name="digits-script", store_version=1, open_store=open_store)

    client = MlflowClient(mlflow_server.uri)
    assert client.get_model_version_by_alias("digits-script", settings.alias).version == str(number)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    folder = mlflow.artifacts.download_artifacts(f"models:/digits-script@{settings.alias}", dst_path=str(tmp_path / "dl"))
    script = json.loads(open(f"{folder}/{SCRIPT_FILE}").read())
    assert (script["script"], script["state_file"]) == ("train.py", TORCH_FILE)
    loaded = torch.nn.Linear(64, 10)
    loaded.load_state_dict(torch.load(f"{folder}/{TORCH_FILE}", weights_only=True)["model"])
    assert torch.equal(loaded.weight, model.weight)
