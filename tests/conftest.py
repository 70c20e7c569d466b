"""Shared fixtures.

`s3_server` runs a real S3 API (moto's server) in a subprocess once per session, so S3 code is
tested over HTTP with the same SDK calls as production, not against an in-process mock.
`object_store` runs a test once per store implementation (local folder, S3).
Imports of ringflow stay inside fixtures: a broken module should fail its own tests, not collection
of every test in the tree.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

import tiers


def pytest_configure(config):
    tiers.register(config)
    # croniter (Airflow's cron timetables) runs `file` on the interpreter when first imported, to learn its word
    # size: imported here, once, so that probe is the session's and not the first pure test's process.
    import croniter  # noqa: F401
    # Likewise the platform module asks `uname -p` once for the processor (MLflow's environment records it).
    import platform

    platform.processor()


def pytest_collection_modifyitems(config, items):
    tiers.assign(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with tiers.guard(item):
        return (yield)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:<port>
    access_key: str = "ringflow-test-key"
    secret_key: str = dataclasses.field(default="ringflow-test-secret", repr=False)
    region: str = "us-east-1"
    _counter: itertools.count = dataclasses.field(default_factory=itertools.count, repr=False)

    def boto3_client(self, **overrides):
        import boto3

        kwargs = dict(endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                      aws_secret_access_key=self.secret_key, region_name=self.region)
        return boto3.client("s3", **(kwargs | overrides))

    def new_bucket(self, prefix: str = "rf-test") -> str:
        """A fresh, empty bucket: tests never see each other's objects."""
        name = f"{prefix}-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        self.boto3_client().create_bucket(Bucket=name)
        return name

    def settings(self, **overrides):
        from ringflow.training.store import S3Settings

        fields = dict(endpoint=self.endpoint, access_key=self.access_key, secret_key=self.secret_key,
                      region=self.region)
        return S3Settings(**(fields | overrides))

    def env(self) -> dict[str, str]:
        """The variables S3Settings.from_env reads, for monkeypatch.setenv or a subprocess env."""
        return {"RINGFLOW_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region}


class _MotoProcess:
    def __init__(self, log_path: pathlib.Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_", "INITIAL_NO_AUTH"))}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )
        self.log_path = log_path

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                # The moto API answers without counting as an S3 action (matters for auth mode).
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer within {timeout}s:\n{self.log_path.read_text()}")

    def enforce_auth(self) -> None:
        """From now on every request needs IAM credentials that exist on this server."""
        # Not form-encoded (urllib's default): Flask would swallow the body as a form.
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=5):
            pass

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A permissive S3 server (any credentials accepted) for the whole session."""
    moto = _MotoProcess(tmp_path_factory.mktemp("moto") / "server.log")
    try:
        moto.wait_ready()
        yield S3Server(endpoint=moto.endpoint)
    finally:
        moto.stop()


@pytest.fixture(scope="session")
def s3_server_with_auth(tmp_path_factory):
    """An S3 server that checks credentials like AWS does. Its `access_key`/`secret_key` belong to
    an IAM user allowed everything on S3; `limited` credentials belong to a user allowed nothing."""
    import json

    moto = _MotoProcess(tmp_path_factory.mktemp("moto-auth") / "server.log")
    try:
        moto.wait_ready()
        import boto3

        iam = boto3.client("iam", endpoint_url=moto.endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        keys = {}
        for user, actions in (("ringflow-admin", ["s3:*"]), ("ringflow-nobody", [])):
            iam.create_user(UserName=user)
            if actions:
                iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps({
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
                }))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        moto.enforce_auth()
        server = S3Server(endpoint=moto.endpoint, access_key=keys["ringflow-admin"][0],
                          secret_key=keys["ringflow-admin"][1])
        server.limited = keys["ringflow-nobody"]  # type: ignore[attr-defined]
        yield server
    finally:
        moto.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, s3_server):
    """A real `mlflow server` (tests/mlflow_test_server.py), once per session: `.uri`, `.port`, `.bucket`."""
    from mlflow_test_server import running_mlflow_server

    with running_mlflow_server(tmp_path_factory.mktemp("mlflow"), s3_server) as server:
        yield server


@pytest.fixture
def object_store(request, tmp_path):
    """An empty local folder store, for code that stores through the store interface (registry, checkpoints,
    run folders). The S3 store is proven to keep the same contract where the store itself is under test
    (tests/training/store/test_store_contract.py runs every contract test on both), so those tests need not
    run again on the S3 double."""
    from empty_stores import empty_store

    return empty_store("local", request, tmp_path)


@pytest.fixture(scope="session")
def digits_manifest(tmp_path_factory) -> str:
    """scikit-learn's digits, sharded for 2 workers in batches of 32: the manifest's path."""
    from ringflow.training.formats.datasets import load_builtin
    from ringflow.training.core.sharding import write_shards
    from ringflow.training.store import LocalFolderStore

    out = tmp_path_factory.mktemp("digits-shards")
    write_shards(load_builtin("digits"), LocalFolderStore(str(out)), target="target", num_partitions=2, batch_size=32)
    return str(out / "manifest.json")


@pytest.fixture(scope="session")
def tf_python() -> str:
    """The TensorFlow engine's interpreter (the TF venv scripts/setup.sh makes). Skips, saying why, only where
    the venv is missing and RINGFLOW_REQUIRE_TF is unset: scripts/test.sh sets it, so CI never skips."""
    from ringflow.training.core.launcher import tensorflow_python

    try:
        return tensorflow_python()
    except FileNotFoundError as exc:
        if os.environ.get("RINGFLOW_REQUIRE_TF"):
            raise
        pytest.skip(f"no TF venv ({exc}); RINGFLOW_REQUIRE_TF is unset")


@pytest.fixture(autouse=True)
def no_attempt_id_from_another_test():
    """A rank started in this process (RankStart.begin) names its attempt in os.environ, as a rank process
    does; removed before and after every test, so no later `ringflow train` child inherits an earlier test's
    attempt id (two runs of one config would then be one attempt) — module-scoped fixtures included, which
    run before this one. Not through monkeypatch: an autouse monkeypatch would be undone after every other
    fixture's teardown, and a test's patches would then outlive the fixtures that restore state."""
    from ringflow.training.rank.worker_env import ATTEMPT_ENV

    os.environ.pop(ATTEMPT_ENV, None)
    yield
    os.environ.pop(ATTEMPT_ENV, None)
