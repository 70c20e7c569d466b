"""The whole ringflow_user_script DAG with `dag.test()`: the form's default script (dags/scripts/ddp_digits, PyTorch
DDP under torchrun on 2 local workers) trained on the built-in digits, evaluated on the metrics it reported,
promoted to version 1 with how to load it. One whole-DAG run (CI time)."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(420)]

DAG_ID = "ringflow_user_script"


def test_the_ddp_example_script_trains_from_the_form_and_is_promoted_to_version_1(airflow_db, dagbag, store):
    import torch

    from ringflow.training.core.runs import store_layout
    from ringflow.training.formats.script_checkpoint import TORCH_FILE

    dr = dagbag.dags[DAG_ID].test(run_conf={"epochs": 2, "model_name": "digits-ddp-script"})
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    assert dr.state == "success", states

    folder = pathlib.Path(store_layout.run_uri(str(store), DAG_ID, dr.run_id, "digits"))
    jobs = pathlib.Path(os.environ["RINGFLOW_LOCAL_JOBS"])
    [config] = [c for c in (json.loads(p.read_text()) for p in jobs.glob("*/job.json")) if c["run_uri"] == str(folder)]
    entry = config["entry"]  # what the backend got: the bundle's sha256, never the folder
    assert (entry["script"], entry["folder"], config["engine"]) == ("train.py", None, "ddp")
    assert (folder / "code" / f"{entry['bundle_sha256']}.tar.gz").is_file()

    evaluation = json.loads((folder / "eval.json").read_text())
    version = store / "models" / "digits-ddp-script" / "v1"
    model_json = json.loads((version / "MODEL.json").read_text())
    assert evaluation["metrics"] == model_json["checkpoint_meta"]["eval_metrics"]  # the script's own report_eval
    assert evaluation["metrics"]["accuracy"] > 0.5
    pointer = json.loads((store / "models" / "digits-ddp-script" / "production.json").read_text())
    assert (pointer["version"], pointer["run_uri"]) == (1, str(folder))
    script = model_json["script"]
    assert (script["script"], script["bundle_sha256"], script["engine"], script["state_file"]) == (
        "train.py", entry["bundle_sha256"], "ddp", TORCH_FILE)

    # Loaded as MODEL.json says, into the script's model (dags/scripts/ddp_digits/train.py's).
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    model.load_state_dict(torch.load(version / TORCH_FILE, weights_only=True)["model"])
    assert model(torch.zeros(3, 64)).shape == (3, 10)
