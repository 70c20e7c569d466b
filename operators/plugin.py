"""The ringflow Airflow plugin: the API server serves local run folders, so that the train task's extra links
(operators/links.py) open in a browser when the store is a local folder (the UI shows no file:// link).

Registered through the `airflow.plugins` entry point (pyproject.toml); nothing to copy into a plugins folder.
It serves, read-only, what lies under `runs/` of the API server's default store
(`store_layout.default_store_uri()`), at `links.STORE_ROUTE`: a file as itself, a folder as a list of links.
Only to a logged-in user (the UI's session cookie or a bearer token) whom the auth manager lets read the task
logs of the DAG the run folder belongs to (runs/<dag_id>/...). An s3:// store is not served here: its links are
presigned.
"""
from __future__ import annotations

import html
import pathlib
import urllib.parse

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from ringflow.operators.links import STORE_ROUTE
from ringflow.training.core.runs import store_layout
from ringflow.training.store import open_store
from ringflow.training.store.base import InvalidKey, check_key

# The plugin's app is mounted at the first segment; its own route is the rest.
PREFIX, _, ROUTE = STORE_ROUTE[1:].partition("/")


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

    return app


class RingflowPlugin(AirflowPlugin):
    name = "ringflow"
    fastapi_apps = [{"app": create_app(), "url_prefix": f"/{PREFIX}", "name": "ringflow run files"}]
