"""The train task's extra links (operators/links.py): the URLs a browser opens for a run page, a run folder and its
health plot, local (the API server's run-file endpoint) and S3 (presigned), and how the operator hands them to Airflow."""
from __future__ import annotations

import urllib.parse

import pytest

from ringflow.operators.links import (HEALTH_PLOT, PRESIGN_SECONDS, RUN_FOLDER, RUN_PAGE, RUN_PAGE_ROUTE, STORE_ROUTE,
                                      HealthPlotLink, RunFolderLink, RunLinks, RunPageLink, local_link, run_links,
                                      run_page_link)

ROOT = "/srv/ringflow-data"
RUN = f"{ROOT}/runs/ringflow_retrain/manual__2026-01-01T00:00:00+00:00/digits"


@pytest.mark.parametrize("path, root, base, folder, expected", [
    (RUN, ROOT, "", True,
     f"{STORE_ROUTE}/runs/ringflow_retrain/manual__2026-01-01T00%3A00%3A00%2B00%3A00/digits/"),
    (f"{RUN}/health.png", ROOT, "", False,
     f"{STORE_ROUTE}/runs/ringflow_retrain/manual__2026-01-01T00%3A00%3A00%2B00%3A00/digits/health.png"),
    (f"file://{RUN}/", f"file://{ROOT}/", "/airflow", True,
     f"/airflow{STORE_ROUTE}/runs/ringflow_retrain/manual__2026-01-01T00%3A00%3A00%2B00%3A00/digits/"),
    (f"{ROOT}/runs/d/r/a b#c", ROOT, "/af/", False, f"/af{STORE_ROUTE}/runs/d/r/a%20b%23c"),
    ("/elsewhere/runs/d/r", ROOT, "", True, None),                  # not in the store the API server serves
    (f"{ROOT}-other/runs/d/r", ROOT, "", True, None),               # a sibling folder sharing the prefix
    (f"{ROOT}/runs/../../etc", ROOT, "", True, None),               # climbs out
    (ROOT, ROOT, "", True, None),                                   # the whole store: never served
    (f"{ROOT}/models/digits", ROOT, "", True, None),                # nor anything but run folders
    (RUN, "s3://bucket/ringflow", "", True, None),                  # the API server's store is S3
])
def test_local_link(path, root, base, folder, expected):
    assert local_link(path, root, base, folder) == expected


def test_local_links_resolve_symlinks(tmp_path):
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (store / "runs" / "escape").symlink_to(tmp_path / "outside")
    assert local_link(str(store / "runs" / "escape"), str(store), folder=True) is None
    (tmp_path / "alias").symlink_to(store)
    assert local_link(str(tmp_path / "alias" / "runs" / "d"), str(store), folder=True) == f"{STORE_ROUTE}/runs/d/"


@pytest.mark.parametrize("run, root, base, expected", [
    (RUN, ROOT, "/af", f"/af{RUN_PAGE_ROUTE}/runs/ringflow_retrain/manual__2026-01-01T00%3A00%3A00%2B00%3A00/digits"),
    ("s3://b/ml/runs/d/r/g", "s3://b/ml", "", f"{RUN_PAGE_ROUTE}/runs/d/r/g"),  # the API server reads S3 itself
    ("s3://b/other/runs/d/r/g", "s3://b/ml", "", None),                      # not in the API server's store
    ("s3://b/ml/models/x", "s3://b/ml", "", None),                           # nor anything but run folders
    ("/elsewhere/runs/d/r", ROOT, "", None),
    (RUN, "s3://b/ml", "", None),
])
def test_the_run_page_link_names_the_run_folder_in_the_api_servers_store(run, root, base, expected):
    assert run_page_link(run, root, base) == expected


def test_local_run_links_show_the_plot_once_it_is_saved():
    before = run_links(RUN, plot_saved=False, store_root=ROOT)
    after = run_links(f"{RUN}/", plot_saved=True, store_root=ROOT, base_path="/af")
    assert before.run_folder.endswith("/digits/") and before.health_plot is None
    assert after.run_folder.startswith(f"/af{STORE_ROUTE}/runs/") and after.health_plot.endswith("/digits/health.png")
    assert run_links("/elsewhere/run", plot_saved=True, store_root=ROOT) == RunLinks(None, None)
    assert before.run_page.endswith("/digits") and after.run_page.startswith(f"/af{RUN_PAGE_ROUTE}/runs/")


def test_s3_run_links_are_presigned_with_the_tasks_settings(monkeypatch):
    monkeypatch.setenv("RINGFLOW_S3_ENDPOINT", "http://minio.example:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "team-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "team-secret")
    links = run_links("s3://models/team-a/runs/d/r/digits", plot_saved=True, store_root=ROOT, conn_id=None)
    plot, folder = urllib.parse.urlsplit(links.health_plot), urllib.parse.urlsplit(links.run_folder)
    assert (plot.scheme, plot.netloc) == ("http", "minio.example:9000")
    assert plot.path == "/models/team-a/runs/d/r/digits/health.png"
    assert (folder.netloc, folder.path) == ("minio.example:9000", "/models")
    folder_query = urllib.parse.parse_qs(folder.query)
    assert folder_query["list-type"] == ["2"] and folder_query["prefix"] == ["team-a/runs/d/r/digits/"]
    for query in (urllib.parse.parse_qs(plot.query), folder_query):
        assert query["X-Amz-Expires"] == [str(PRESIGN_SECONDS)] and query["X-Amz-Credential"][0].startswith("team-key/")
    assert "team-secret" not in links.health_plot + links.run_folder
    assert run_links("s3://models/team-a/runs/d/r/digits", plot_saved=False, store_root=ROOT).health_plot is None


@pytest.mark.parametrize("url", ["file:///srv/run/health.png", "s3://b/run/", "javascript:alert(1)", "runs/x"])
def test_a_link_the_ui_would_not_show_is_refused(url):
    with pytest.raises(ValueError, match="neither http"):
        RunLinks(run_folder=url, health_plot=None)


def test_each_link_returns_what_the_operator_computed():
    class Ran:
        run_links = RunLinks(run_folder="/ringflow/store/runs/d/r/g/", health_plot=None)

    assert RunFolderLink().get_link(Ran(), ti_key=None) == "/ringflow/store/runs/d/r/g/"
    assert HealthPlotLink().get_link(Ran(), ti_key=None) == ""  # no button until the plot exists
    assert RunFolderLink().get_link(object(), ti_key=None) == ""  # the task never got as far as its run folder
    assert (RunFolderLink().name, HealthPlotLink().name, RunPageLink().name) == (RUN_FOLDER, HEALTH_PLOT, RUN_PAGE)
    assert RunFolderLink().xcom_key != HealthPlotLink().xcom_key


def test_the_train_operator_declares_both_links_and_they_are_serialized():
    import datetime as dt

    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from ringflow.operators.train import TrainOperator

    with DAG("links_dag", schedule=None, start_date=dt.datetime(2026, 1, 1)) as dag:
        TrainOperator(task_id="train", manifest_uri="/m/manifest.json", store_uri=ROOT)
    task = DagSerialization.to_dict(dag)["dag"]["tasks"][0]["__var"]
    # what the API server reads back: each link's name and the XCom key its URL is stored under
    assert task["_operator_extra_links"] == {RUN_FOLDER: RunFolderLink().xcom_key,
                                             HEALTH_PLOT: HealthPlotLink().xcom_key, RUN_PAGE: RunPageLink().xcom_key}
