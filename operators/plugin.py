"""The ringflow Airflow plugin: the API server serves local run folders, so that the train task's extra links
(operators/links.py) open in a browser when the store is a local folder (the UI shows no file:// link), and renders
a run page for any store: verdict and reason, evidence, the health plot, remedies, world-size changes, checkpoints,
evaluation against the models in production (operators/run_page.py from core/runs/run_overview.py).

Registered through the `airflow.plugins` entry point (pyproject.toml); nothing to copy into a plugins folder.
It serves, read-only, what lies under `runs/` of the API server's default store
(`store_layout.default_store_uri()`), at `links.STORE_ROUTE`: a file as itself, a folder as a list of links.
Only to a logged-in user (the UI's session cookie or a bearer token) whom the auth manager lets read the task
logs of the DAG the run folder belongs to (runs/<dag_id>/...). An s3:// store is not served here: its links are
presigned.

The run page is reached two ways, under the same access rule: by the run folder's key (`links.RUN_PAGE_ROUTE`, the
train task's "Run page" link, which names the folder the task actually used), and from any task instance of a
pipeline (`links.TASK_RUN_PAGE_ROUTE`, an external view with destination "task_instance": a "Run page" tab beside
Logs and XCom; the UI fills in the DAG, run, task and map index, and the page derives the run folder as the train
task does, store_layout.run_uri with the task's group). An s3:// store is read with the API server's own connection
(`connections.DEFAULT_S3_CONN_ID`); without one the page says so and what to define.
"""
from __future__ import annotations

import html
import pathlib
import urllib.parse

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from ringflow.operators import run_page
from ringflow.operators.links import RUN_PAGE, RUN_PAGE_ROUTE, STORE_ROUTE, TASK_RUN_PAGE_ROUTE, local_link
from ringflow.training.core.runs import store_layout
from ringflow.training.core.runs.run_overview import read_overview
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import ObjectStore, open_store
from ringflow.training.store.base import InvalidKey, check_key

# The plugin's app is mounted at the first segment; its own routes are the rest.
PREFIX, _, ROUTE = STORE_ROUTE[1:].partition("/")
PAGE_ROUTE = RUN_PAGE_ROUTE[1:].partition("/")[2]
TASK_PAGE_ROUTE = TASK_RUN_PAGE_ROUTE[1:].partition("/")[2]
assert RUN_PAGE_ROUTE.startswith(f"/{PREFIX}/") and TASK_RUN_PAGE_ROUTE.startswith(f"/{PREFIX}/")


def _store_root() -> pathlib.Path:
    uri = store_layout.default_store_uri()
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "s3":
        raise HTTPException(404, f"the store is {uri}: its run folders are not served here, the train task's links "
                                 f"to it are presigned S3 URLs")
    return open_store(uri).root  # a local folder: read as every task reads it


def _check_key(key: str) -> tuple[str, str]:
    """(the key without a trailing slash, its DAG id): only keys under runs/<dag_id>/ are served."""
    key = key.strip("/")
    try:
        check_key(key)
    except (InvalidKey, ValueError) as exc:
        raise HTTPException(404, f"{key!r} is not a key of the store: {exc}") from None
    parts = key.split("/")
    if len(parts) < 2 or parts[0] != store_layout.RUNS:
        raise HTTPException(404, f"only run folders are served: give a key under {store_layout.RUNS}/<dag_id>/")
    return key, parts[1]


def _authorize(dag_id: str, user) -> None:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_LOGS,
                                                details=DagDetails(id=dag_id), user=user):
        raise HTTPException(403, f"you may not read the task logs of DAG {dag_id!r}, so not its run folders either")


def _listing(key: str, folder: pathlib.Path) -> HTMLResponse:
    rows = []
    for entry in sorted(folder.iterdir()):
        name = entry.name + ("/" if entry.is_dir() else "")
        size = "" if entry.is_dir() else f" ({entry.stat().st_size} bytes)"
        rows.append(f'<li><a href="{urllib.parse.quote(name)}">{html.escape(name)}</a>{size}</li>')
    title = html.escape(key + "/")
    return HTMLResponse(f"<!doctype html><title>{title}</title><h1>{title}</h1><ul>{''.join(rows)}</ul>")


class _Unavailable(Exception):
    """The run page cannot be shown; the message says why (and what to do), the status says how."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def _page_store() -> tuple[ObjectStore, str]:
    """The API server's store, for the run page: a local folder as every task reads it, an s3:// one with the API
    server's own connection."""
    from ringflow.operators.connections import DEFAULT_S3_CONN_ID, open_store_for
    from ringflow.training.store import StoreConfigError

    uri = store_layout.default_store_uri()
    if urllib.parse.urlsplit(uri).scheme != "s3":
        return open_store(uri), uri
    try:
        return open_store_for(uri, DEFAULT_S3_CONN_ID), uri
    except StoreConfigError as exc:
        raise _Unavailable(503, f"the store is {uri}, and the API server cannot open it: {exc}. The run page reads "
                                f"the run folder through the store with the API server's connection "
                                f"{DEFAULT_S3_CONN_ID!r}; the workers' connection is not enough") from None


def task_run_key(dag_id: str, run_id: str, task_id: str, map_index: str | None) -> str:
    """The run folder key (under runs/) of the pipeline `task_id` belongs to: the train task's own derivation
    (store_layout.run_uri) with the task's group, the part of the task id before its last dot. Any task of the
    group finds the same run; a map index that is not a number (the UI leaves {MAP_INDEX} as it is for an unmapped
    task) means not mapped."""
    group = task_id.rpartition(".")[0] or None
    try:
        index = int(map_index) if map_index is not None else None
    except ValueError:
        index = None
    mapped = index if index is not None and index >= 0 else None
    return store_layout.run_uri("", dag_id, run_id, group, map_index=mapped).strip("/")


def _run_page(key: str, user, title: str) -> HTMLResponse:
    key, dag_id = _check_key(key)
    _authorize(dag_id, user)
    try:
        root, root_uri = _page_store()
        folder = RunFolder(root.child(key), uri=store_layout.join(root_uri, key))
        if not any(True for _ in folder.store.list("")):
            raise _Unavailable(404, f"no run folder at {folder.uri} yet: this task's pipeline has not started "
                                    f"training in this DAG run (or the store differs: RINGFLOW_STORE must be the same "
                                    f"for the API server as for the workers)")
        overview = read_overview(folder, registry_root=root)
        plot = folder.read_health_plot()
    except _Unavailable as exc:
        return HTMLResponse(run_page.unavailable(title, str(exc)), status_code=exc.status)
    except (OSError, ValueError) as exc:  # the store refused or failed (StoreUnavailable is an OSError)
        return HTMLResponse(run_page.unavailable(title, f"the store could not be read: {exc}"), status_code=503)
    # the files stay the file route's (local stores only: an s3:// run folder's listing is the task's presigned link)
    files = local_link(folder.uri, root_uri, _base_path(), folder=True)
    return HTMLResponse(run_page.render(overview, title=title, plot_png=plot, folder_link=files))


def _base_path() -> str:
    from ringflow.operators.links import api_base_path

    return api_base_path()


async def _current_user(request: Request):
    """Airflow's own check (a bearer token first, else the UI's session cookie), imported on the first request:
    every task process loads the plugins too, and needs none of the API server."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials
    from fastapi.security.utils import get_authorization_scheme_param

    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme and token else None
    return await get_user(request, None, bearer)


def create_app() -> FastAPI:
    app = FastAPI(title="ringflow run files", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(f"/{ROUTE}/{{key:path}}")
    def run_file(key: str, request: Request, user=Depends(_current_user)):
        key, dag_id = _check_key(key)
        _authorize(dag_id, user)
        root = _store_root().resolve()
        target = (root / key).resolve()
        if not target.is_relative_to(root / store_layout.RUNS):  # a symlink out of the store
            raise HTTPException(404, f"{key!r} is not inside the store's {store_layout.RUNS}/")
        if target.is_dir():
            if not request.url.path.endswith("/"):  # the listing's links are relative to the folder
                return RedirectResponse(request.url.path + "/")
            return _listing(key, target)
        if target.is_file():
            return FileResponse(target)
        raise HTTPException(404, f"{key!r} is not in the store {root} (not written yet, or removed)")

    @app.get(f"/{PAGE_ROUTE}/{{key:path}}", response_class=HTMLResponse)
    def run_page_by_key(key: str, user=Depends(_current_user)):
        return _run_page(key, user, f"{RUN_PAGE}: {key.strip('/')}")

    @app.get(f"/{TASK_PAGE_ROUTE}/{{dag_id}}/{{run_id}}/{{task_id}}", response_class=HTMLResponse)
    def run_page_by_task(dag_id: str, run_id: str, task_id: str, map_index: str | None = None,
                         user=Depends(_current_user)):
        key = task_run_key(dag_id, run_id, task_id, map_index)
        return _run_page(key, user, f"{RUN_PAGE}: {dag_id} / {run_id} / {task_id.rpartition('.')[0] or task_id}")

    return app


def _external_view() -> dict:
    """The "Run page" tab on every task instance: the UI fills in {DAG_ID}, {RUN_ID}, {TASK_ID} and {MAP_INDEX}
    and shows the page in an iframe, under the API server's base path."""
    return {"name": RUN_PAGE, "href": f"{_base_path()}{TASK_RUN_PAGE_ROUTE}/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}"
                                      f"?map_index={{MAP_INDEX}}",
            "destination": "task_instance", "url_route": "ringflow-run-page"}


class RingflowPlugin(AirflowPlugin):
    name = "ringflow"
    fastapi_apps = [{"app": create_app(), "url_prefix": f"/{PREFIX}", "name": "ringflow run files"}]
    external_views = [_external_view()]
