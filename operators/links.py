"""The train task's extra links in the Airflow UI: the run page, the run's health plot and its run folder.

Airflow 3 computes an operator's links where the task runs: after each try (and each deferral) the task runner
calls `get_link` on every link in `operator_extra_links` and stores the URL in XCom under the link's
`xcom_key`; the API server shows what XCom holds (it never imports these classes, so no plugin has to register
them). An empty URL shows no button. The UI renders only http(s) links and links to its own origin (a file://
URL is dropped), so a link is:

- S3 store: presigned URLs, signed with the task's connection (`PRESIGN_SECONDS`, SigV4's 7-day maximum): a
  GET of health.png, and a ListObjectsV2 of the run folder (an XML list of its keys). They point at the
  connection's endpoint, which the browser must reach too.
- local store: the run-file endpoint that operators/plugin.py adds to the API server (`STORE_ROUTE`), which
  serves its default store (`store_layout.default_store_uri()`, so `RINGFLOW_STORE` must say the same for the
  API server as for the workers) to logged-in users who may read the DAG's task logs. A local run folder outside
  that store gets no link.
- the run page (either store): `RUN_PAGE_ROUTE` on the API server, which reads the run folder itself (through the
  store, with the API server's connection for s3://) and renders it (operators/run_page.py); a run folder outside
  the API server's store gets no link.
"""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

from ringflow.training.core.runs import store_layout
from ringflow.training.store.s3 import PRESIGN_MAX_SECONDS

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

HEALTH_PLOT = "Health plot"
RUN_FOLDER = "Run folder"
RUN_PAGE = "Run page"
# A presigned link lives as long as SigV4 allows: people open a run's links days after it ran.
PRESIGN_SECONDS = PRESIGN_MAX_SECONDS
# Where operators/plugin.py serves the local store on the API server (below Airflow's base URL).
STORE_ROUTE = "/ringflow/store"
# Where operators/plugin.py renders a run page: by the run folder's key in the API server's store (the extra link),
# and by task instance (the UI's task-instance tab, an external view whose URL the UI fills in).
RUN_PAGE_ROUTE = "/ringflow/run-page"
TASK_RUN_PAGE_ROUTE = "/ringflow/task-run-page"


@dataclasses.dataclass(frozen=True)
class RunLinks:
    """The URLs of one run's links; None: no button (not written yet, or nowhere a browser can open)."""
    run_folder: str | None
    health_plot: str | None
    run_page: str | None = None

    def __post_init__(self) -> None:
        for name in ("run_folder", "health_plot", "run_page"):
            url = getattr(self, name)
            if url is not None and not (url.startswith("/") or urllib.parse.urlsplit(url).scheme in ("http", "https")):
                raise ValueError(f"{name} link {url!r} is neither http(s) nor a path on the API server: the Airflow "
                                 f"UI would not show it; build it with run_links()")

    def by_name(self) -> dict[str, str]:
        """What each link class returns, by its name; "" for no link."""
        return {RUN_FOLDER: self.run_folder or "", HEALTH_PLOT: self.health_plot or "", RUN_PAGE: self.run_page or ""}


def local_link(path: str, store_root: str, base_path: str = "", folder: bool = False) -> str | None:
    """The API-server URL of a local `path` inside `store_root` (a path or file:// URI): `STORE_ROUTE` and the
    key under the root, each segment quoted; None outside the root's runs/, which the endpoint does not serve."""
    root, target = _local_folder(store_root), _local_folder(path)
    if root is None or target is None:
        return None  # an s3:// store: the API server serves no local folder
    if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
        return None
    key = os.path.relpath(target, root).replace(os.sep, "/")
    if key.split("/")[0] != store_layout.RUNS:
        return None  # the endpoint serves run folders only, never the store's models or shards
    quoted = "/".join(urllib.parse.quote(part, safe="") for part in key.split("/"))
    return f"{base_path.rstrip('/')}{STORE_ROUTE}/{quoted}{'/' if folder else ''}"


def run_page_link(run_uri: str, store_root: str, base_path: str = "") -> str | None:
    """The API-server URL of the run page of `run_uri` (a path, file:// or s3:// URI) inside `store_root`, the API
    server's store: `RUN_PAGE_ROUTE` and the run folder's key, each segment quoted; None outside its runs/."""
    from ringflow.training.core.registry.model_registry import RegistryError, run_key_in

    if urllib.parse.urlsplit(store_root).scheme in ("", "file"):  # a local store: as the file links read it
        store_root = _local_folder(store_root) or store_root
        run_uri = _local_folder(run_uri) or run_uri
    try:
        key = run_key_in(store_root, run_uri)
    except RegistryError:
        return None  # not inside the API server's store: it could not read it
    if key.split("/")[0] != store_layout.RUNS:
        return None
    quoted = "/".join(urllib.parse.quote(part, safe="") for part in key.split("/"))
    return f"{base_path.rstrip('/')}{RUN_PAGE_ROUTE}/{quoted}"


def _local_folder(uri: str) -> str | None:
    """The real path of a local path or file:// URI (read as the store reads it); None for any other URI."""
    from ringflow.training.store import open_store

    if urllib.parse.urlsplit(uri).scheme not in ("", "file"):
        return None
    return os.path.realpath(open_store(uri).root)


def run_links(run_uri: str, *, plot_saved: bool, store_root: str, base_path: str = "",
              conn_id: str | None = None, presign_seconds: int = PRESIGN_SECONDS, run_folder: Any = None) -> RunLinks:
    """The links of the run folder `run_uri` (and its health plot, once `plot_saved`). An s3:// run folder is
    presigned with the connection `conn_id` (or `run_folder`, the RunFolder at run_uri when the caller has it
    open); a local one is served by the API server when it lies in `store_root`, the API server's store. The run
    page is the API server's for both, when the run folder lies in `store_root`."""
    from ringflow.training.formats.run_folder import RunFolder

    page = run_page_link(run_uri, store_root, base_path)
    if urllib.parse.urlsplit(run_uri).scheme == "s3":
        from ringflow.operators.connections import open_run_folder

        run = run_folder if run_folder is not None else open_run_folder(run_uri, conn_id)
        return RunLinks(run_folder=run.store.presigned_listing("", presign_seconds),
                        health_plot=run.presigned_health_plot(presign_seconds) if plot_saved else None, run_page=page)
    run = run_folder if run_folder is not None else RunFolder.open(run_uri)  # a local folder: no settings
    folder = local_link(run_uri, store_root, base_path, folder=True)
    plot = local_link(run.health_plot_uri, store_root, base_path) if plot_saved and folder else None
    return RunLinks(run_folder=folder, health_plot=plot, run_page=page)


def api_base_path() -> str:
    """The path of Airflow's `[api] base_url` ("" at the root), which the API server's routes sit under."""
    from airflow.sdk.configuration import conf  # the task SDK's: workers may lack airflow-core

    return urllib.parse.urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class _RunLink(BaseOperatorLink):
    """A link whose URL the train operator computed when it ran (`operator.run_links`, a RunLinks)."""

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        links = getattr(operator, "run_links", None)
        return links.by_name()[self.name] if isinstance(links, RunLinks) else ""


class RunFolderLink(_RunLink):
    name = RUN_FOLDER


class HealthPlotLink(_RunLink):
    name = HEALTH_PLOT


class RunPageLink(_RunLink):
    name = RUN_PAGE
