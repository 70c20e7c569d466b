"""A throwaway Airflow for the DAG tests: its own AIRFLOW_HOME and SQLite database, the repo's dags/ folder.

Set at import, not only in a fixture: Airflow reads its configuration once, on first import, and pytest
imports this file before any test module of this folder. The database URL is given explicitly, so it stays
right even if another conftest later points AIRFLOW_HOME elsewhere.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
_HOME = pathlib.Path(tempfile.mkdtemp(prefix="ringflow-dags-airflow-"))
ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
    # Deferred tasks resume faster than the default heartbeat check allows (an upstream race).
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
    "RINGFLOW_STORE": str(_HOME / "ringflow-data"),
    "RINGFLOW_LOCAL_JOBS": str(_HOME / "jobs"),
    "GX_ANALYTICS_ENABLED": "False",
    "MPLBACKEND": "Agg",
}
os.environ.update(ENV)


@pytest.fixture(autouse=True)
def dags_env(monkeypatch):
    """The same settings for every test here, whatever another conftest set in between."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    return ENV


def migrate(env: dict[str, str]) -> None:
    """`airflow db migrate` of the metadata database `env` names."""
    proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="session")
def airflow_db():
    """`airflow db migrate`, once per session."""
    migrate(ENV)
    return ENV["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


# The last test of this run that uses the shared real Airflow: its teardown stops it, so the four processes do
# not idle beside the rest of the session's tests (about a tenth of a core).
_last_airflow_test: list[str] = []
_live_airflow: list = []


def pytest_collection_modifyitems(items):
    users = [item.nodeid for item in items if "real_airflow" in getattr(item, "fixturenames", ())]
    _last_airflow_test[:] = users[-1:]


def pytest_runtest_teardown(item, nextitem):
    if _last_airflow_test and item.nodeid == _last_airflow_test[0]:
        for instance in _live_airflow:
            instance.stop()


@pytest.fixture(scope="session")
def real_airflow(tmp_path_factory):
    """The one real Airflow of this pytest run (real_airflow.py), logged in, with a home, a metadata database and
    a store of its own (`.store`: the DAGs' runs write there): the `dag.test()` runs of this process use the
    other database, which a live scheduler must not see. Its scheduler looks for timed-out approvals every 2 s
    (default 15)."""
    from real_airflow import running_airflow, shared_dag_folder

    home = tmp_path_factory.mktemp("real-airflow")
    airflow_home = home / "airflow-home"
    env = {**ENV, "AIRFLOW_HOME": str(airflow_home),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
           "RINGFLOW_LOCAL_JOBS": str(home / "jobs"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(shared_dag_folder(home / "dags")),
           "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "2"}
    airflow_home.mkdir()
    migrate(env)
    store = home / "store"
    with running_airflow(env, store, home, use_job_schedule=True) as instance:
        instance.store = store
        instance.log_in()
        _live_airflow.append(instance)
        yield instance


@pytest.fixture
def store(tmp_path, monkeypatch) -> pathlib.Path:
    """A fresh store for one test: the DAGs read RINGFLOW_STORE when they are parsed."""
    path = tmp_path / "store"
    monkeypatch.setenv("RINGFLOW_STORE", str(path))
    return path


@pytest.fixture
def dagbag(store):
    """The repo's DAGs, parsed now (so they use this test's store)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag
