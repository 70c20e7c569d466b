"""Airflow settings for operator tests: a throwaway AIRFLOW_HOME, no example DAGs.

Set at import, not only in a fixture: test modules import Airflow while pytest collects them, and
Airflow reads its configuration once, on first import. Tests must never touch a real AIRFLOW_HOME.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="ringflow-airflow-home-")
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["GX_ANALYTICS_ENABLED"] = "False"


@pytest.fixture(autouse=True)
def airflow_home(monkeypatch):
    """The same settings for each test, in case a test (or a library) changed them."""
    monkeypatch.setenv("AIRFLOW_HOME", _AIRFLOW_HOME)
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    return _AIRFLOW_HOME


@pytest.fixture
def s3_connection(s3_server, monkeypatch):
    """Airflow connection `ringflow_s3` pointing at the test S3 server, as an environment variable
    (the way a deployment can define it without the metadata database)."""
    conn = {"conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
            "extra": {"endpoint_url": s3_server.endpoint, "region_name": s3_server.region}}
    monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_S3", json.dumps(conn))
    # Nothing may come from the S3 variables of the environment: only the connection counts.
    for var in ("RINGFLOW_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    return "ringflow_s3"
