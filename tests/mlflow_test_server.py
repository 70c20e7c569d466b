"""A real `mlflow server` for the tests: SQLite in a temporary folder, artifacts proxied by the server into a
bucket of the test S3 server (--artifacts-destination s3://..., the MinIO set-up of docs/guides/mlflow.md), on a free
port of 127.0.0.1. The `mlflow_server` fixture (tests/conftest.py) starts one per session.

The server runs from its own venv (scripts/setup.sh: $VENV/mlflow-server, or $RINGFLOW_MLFLOW_VENV): the full
mlflow package would move the Airflow venv's pins, which carries mlflow-skinny only."""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.request
from typing import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_binary() -> pathlib.Path:
    venv = os.environ.get("RINGFLOW_MLFLOW_VENV") or os.path.join(sys.prefix, "mlflow-server")
    path = pathlib.Path(venv) / "bin" / "mlflow"
    if not path.exists():
        pytest.fail(f"no MLflow server at {path}: run scripts/setup.sh (it makes that venv), or point "
                    f"RINGFLOW_MLFLOW_VENV at a venv with mlflow installed")
    return path


@contextlib.contextmanager
def running_mlflow_server(folder: pathlib.Path, s3_server) -> Iterator[types.SimpleNamespace]:
    """`mlflow server` on a free port of 127.0.0.1, its database and log in `folder`, artifacts in a fresh
    bucket of `s3_server`; stopped (its whole process group) on exit."""
    bucket = s3_server.new_bucket("mlflow")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    env |= {"MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key, "AWS_DEFAULT_REGION": s3_server.region}
    log = open(folder / "server.log", "wb")
    proc = subprocess.Popen(
        [str(mlflow_binary()), "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--artifacts-destination", f"s3://{bucket}/mlflow", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}: {(folder / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up after 120 s: {(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield types.SimpleNamespace(uri=uri, port=port, bucket=bucket, s3=s3_server)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
