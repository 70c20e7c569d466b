"""The ringflow Airflow plugin (operators/plugin.py): Airflow finds it through the entry point, mounts its app where
the links point, and it serves only run folders. Serving a real run through the UI's session, refusing a request
without one, is tests/dags/ui/test_airflow_ui.py's."""
from __future__ import annotations

import importlib.metadata

import pytest
from fastapi import HTTPException

from ringflow.operators import plugin
from ringflow.operators.links import RUN_PAGE, RUN_PAGE_ROUTE, STORE_ROUTE, TASK_RUN_PAGE_ROUTE


def test_airflow_finds_the_plugin_and_mounts_it_where_the_links_point():
    from airflow import plugins_manager

    entry = [e for e in importlib.metadata.entry_points(group="airflow.plugins") if e.name == "ringflow"]
    assert [e.value for e in entry] == ["ringflow.operators.plugin:RingflowPlugin"], "reinstall: pip install -e ."
    apps, _ = plugins_manager.get_fastapi_plugins()
    mounted = {app["url_prefix"]: app["app"] for app in apps}
    assert "/ringflow" in mounted
    routes = [route.path for route in mounted["/ringflow"].routes]
    assert any(f"/ringflow{path}".startswith(STORE_ROUTE + "/") for path in routes), routes
    for route in (RUN_PAGE_ROUTE, TASK_RUN_PAGE_ROUTE):
        assert any(f"/ringflow{path}".startswith(route + "/") for path in routes), (route, routes)


def test_the_run_page_is_a_tab_on_every_task_instance():
    from airflow import plugins_manager

    views = [v for v in plugins_manager._get_ui_plugins()[0] if v["name"] == RUN_PAGE]
    assert len(views) == 1 and views[0]["destination"] == "task_instance"
    # the UI fills these in (and leaves {MAP_INDEX} as it is for an unmapped task: the page reads that as unmapped)
    assert views[0]["href"] == f"{TASK_RUN_PAGE_ROUTE}/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}?map_index={{MAP_INDEX}}"


@pytest.mark.parametrize("task, index, key", [
    ("digits.train", "{MAP_INDEX}", "runs/d/r_1/digits"),
    ("digits.promote", "-1", "runs/d/r_1/digits"),
    ("sweep.candidate.train", "2", "runs/d/r_1/sweep.candidate/m2"),
    ("train", None, "runs/d/r_1"),
])
def test_a_task_instance_finds_its_pipelines_run_folder(task, index, key):
    assert plugin.task_run_key("d", "r:1", task, index) == key


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
