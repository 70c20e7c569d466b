"""The image example end to end with `dag.test()`: the digits as 1x8x8 images, validated by a suite that checks
the image column, sharded with the tensor column's shape in the manifest, trained by the conv_net factory on
2 local Horovod workers, evaluated and promoted."""
from __future__ import annotations

import json
import pathlib

import pytest

from ringflow.training.formats.manifest import FORMAT
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(420)]

DAG_ID = "ringflow_images"


@pytest.fixture
def images_dag(store):
    """This DAG file alone, parsed now (so it uses this test's store)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(pathlib.Path(__file__).resolve().parents[2] / "dags" / f"{DAG_ID}.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[DAG_ID]


def test_images_train_through_the_custom_factory_and_are_promoted(airflow_db, images_dag, store):
    dr = images_dag.test(run_conf={"epochs": 3})
    tis = {ti.task_id.split(".", 1)[1]: str(ti.state) for ti in dr.get_task_instances()}
    assert dr.state == "success", tis

    manifest_path, = (store / "shards" / "digits_images").glob("*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["format"] == FORMAT
    assert manifest["schema"]["columns"][0] == {"name": "image", "shape": [1, 8, 8], "dtype": "float32"}

    pointer = json.loads((store / "models" / "digits-cnn" / "production.json").read_text())
    assert pointer["version"] == 1 and pointer["metrics"]["accuracy"] > 0.5
    run = pathlib.Path(pointer["run_uri"])
    published = RunFolder(LocalFolderStore(str(run))).checkpoints()
    checkpoint_meta = published.read_manifest(published.names()[0]).meta
    assert checkpoint_meta["model"]["factory"] == "ringflow.training.rank.models:conv_net"
    assert checkpoint_meta["schema"]["input_shape"] == [1, 8, 8]
