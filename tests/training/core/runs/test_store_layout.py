"""Where the pipeline puts things under one store: pure string functions; the run folder of a train task has
no try number in it (a retry resumes there)."""
import pytest

from ringflow.training.core.runs import store_layout


@pytest.mark.parametrize("base, dag_id, run_id, group, expect", [
    ("/d", "dag", "r", None, "/d/runs/dag/r"),
    ("/d", "dag", "r", "digits", "/d/runs/dag/r/digits"),
    ("s3://b/ml/", "ringflow_retrain", "manual__2025-01-01T00:00:00+00:00", "digits",
     "s3://b/ml/runs/ringflow_retrain/manual__2025-01-01T00_00_00_00_00/digits"),
    ("s3://b/ml", "ringflow_retrain", "scheduled__2025-06-02T03:00:00+00:00", None,
     "s3://b/ml/runs/ringflow_retrain/scheduled__2025-06-02T03_00_00_00_00"),
    ("file:///data", "d", "asset_triggered__x/y", "outer.inner", "file:///data/runs/d/asset_triggered__x_y/outer.inner"),
    ("/d", "dag", "..", "..", "/d/runs/dag/_/_"),  # never climbs out of the store
])
def test_run_uri(base, dag_id, run_id, group, expect):
    assert store_layout.run_uri(base, dag_id, run_id, group) == expect


@pytest.mark.parametrize("group, map_index, expect", [
    ("sweep.candidate", None, "/d/runs/dag/r/sweep.candidate"),
    ("sweep.candidate", -1, "/d/runs/dag/r/sweep.candidate"),  # Airflow's map index of an unmapped task
    ("sweep.candidate", 0, "/d/runs/dag/r/sweep.candidate/m0"),
    ("sweep.candidate", 12, "/d/runs/dag/r/sweep.candidate/m12"),
    (None, 3, "/d/runs/dag/r/m3"),
])
def test_run_uri_of_a_mapped_task_has_one_folder_per_map_index(group, map_index, expect):
    assert store_layout.run_uri("/d", "dag", "r", group, map_index=map_index) == expect


@pytest.mark.parametrize("map_index", [-2, 1.0, "0", True])
def test_run_uri_refuses_a_map_index_that_is_not_one(map_index):
    with pytest.raises(ValueError, match="map_index"):
        store_layout.run_uri("/d", "dag", "r", "g", map_index=map_index)


def test_file_names_come_from_their_owners():
    from ringflow.training.core.registry.model_registry import POINTER_FILE
    from ringflow.training.formats.manifest import MANIFEST_NAME

    assert store_layout.manifest_uri("/s/digits/k") == f"/s/digits/k/{MANIFEST_NAME}"
    assert store_layout.production_pointer_uri("/d", "m") == f"/d/models/m/{POINTER_FILE}"


def test_default_store_is_env_or_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RINGFLOW_STORE", "s3://bucket/ml")
    assert store_layout.default_store_uri() == "s3://bucket/ml"
    monkeypatch.delenv("RINGFLOW_STORE")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert store_layout.default_store_uri() == str(tmp_path / "ringflow-data")


def test_paths_stay_inside_the_store_and_name_their_content():
    assert store_layout.join("s3://b/ml/", "/runs/", "x") == "s3://b/ml/runs/x"
    assert store_layout.join("/data", "") == "/data"
    assert store_layout.dataset_slug("builtin:digits") == "digits"
    assert store_layout.dataset_slug("s3://b/in/wine v2.csv") == "wine_v2"
    assert store_layout.dataset_slug("file:///data/x.parquet") == "x"
    assert store_layout.safe_segment("..") == "_"
    a = store_layout.shard_key("abc", {"num_partitions": 2, "batch_size": 32})
    assert a.startswith("w2-b32-") and a == store_layout.shard_key("abc", {"batch_size": 32, "num_partitions": 2})
    assert a != store_layout.shard_key("abd", {"num_partitions": 2, "batch_size": 32})
