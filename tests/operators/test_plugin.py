"""The ringflow Airflow plugin (operators/plugin.py): Airflow finds it through the entry point, mounts its app where
the links point, and it serves only run folders. Serving a real run through the UI's session, refusing a request
without one, is tests/dags/ui/test_airflow_ui.py's."""
from __future__ import annotations

import importlib.metadata

import pytest
from fastapi import HTTPException

from ringflow.operators import plugin
from ringflow.operators.links import STORE_ROUTE


def test_airflow_finds_the_plugin_and_mounts_it_where_the_links_point():
    from airflow import plugins_manager

    entry = [e for e in importlib.metadata.entry_points(group="airflow.plugins") if e.name == "ringflow"]
    assert [e.value for e in entry] == ["ringflow.operators.plugin:RingflowPlugin"], "reinstall: pip install -e ."
    apps, _ = plugins_manager.get_fastapi_plugins()
    mounted = {app["url_prefix"]: app["app"] for app in apps}
    assert "/ringflow" in mounted
    routes = [route.path for route in mounted["/ringflow"].routes]
    assert any(f"/ringflow{path}".startswith(STORE_ROUTE + "/") for path in routes), routes


@pytest.mark.parametrize("key, expected", [
    ("runs/ringflow_retrain/manual__x/digits/", ("runs/ringflow_retrain/manual__x/digits", "ringflow_retrain")),
    ("runs/d/r/digits/health.png", ("runs/d/r/digits/health.png", "d")),
    ("runs/d", ("runs/d", "d")),
])
def test_run_folder_keys_are_served_with_their_dag(key, expected):
    assert plugin._check_key(key) == expected


@pytest.mark.parametrize("key", ["models/digits/production.json", "shards/digits/w2/manifest.json", "runs",
                                 "runs/../models/x", "runs/d/../../etc/passwd", ""])
def test_anything_else_is_not_found(key):
    with pytest.raises(HTTPException) as refused:
        plugin._check_key(key)
    assert refused.value.status_code == 404


def test_an_s3_store_is_not_served(monkeypatch):
    monkeypatch.setenv("RINGFLOW_STORE", "s3://bucket/ringflow")
    with pytest.raises(HTTPException, match="presigned") as refused:
        plugin._store_root()
    assert refused.value.status_code == 404
