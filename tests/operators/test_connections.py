"""The ringflow_s3 connection: credentials, endpoint, and the retry/timeout settings training processes get."""
import json

import pytest

from ringflow.operators.connections import S3ConnectionError, cluster_from_extras, s3_settings_from_connection
from ringflow.training.store.s3 import DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_ATTEMPTS, DEFAULT_READ_TIMEOUT


def set_conn(monkeypatch, **conn):
    monkeypatch.setenv("AIRFLOW_CONN_TEST_S3", json.dumps(conn))


@pytest.mark.parametrize("config_kwargs, expected", [
    (None, (DEFAULT_MAX_ATTEMPTS, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)),
    ({"connect_timeout": 2, "read_timeout": 7.5}, (DEFAULT_MAX_ATTEMPTS, 2, 7.5)),
    ({"retries": {"total_max_attempts": 4}}, (4, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)),
    ({"retries": {"max_attempts": 4, "mode": "standard"}}, (5, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)),
    ({"retries": {"max_attempts": 0}}, (1, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)),
    ({"retries": {"total_max_attempts": 2, "max_attempts": 9}}, (2, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)),
])
def test_retries_and_timeouts_come_from_config_kwargs(monkeypatch, config_kwargs, expected):
    extra = {"endpoint_url": "http://m:9000"} | ({"config_kwargs": config_kwargs} if config_kwargs is not None else {})
    set_conn(monkeypatch, conn_type="aws", login="key-id", password="secret-key", extra=extra)
    s = s3_settings_from_connection("test_s3")
    assert (s.max_attempts, s.connect_timeout, s.read_timeout) == expected
    # ... and they travel to training processes with the credentials.
    env = s.to_env()
    assert all(str(v) in env.values() for v, d in zip(expected, (DEFAULT_MAX_ATTEMPTS, DEFAULT_CONNECT_TIMEOUT,
                                                                  DEFAULT_READ_TIMEOUT)) if v != d)


@pytest.mark.parametrize("config_kwargs, match", [
    ("fast", 'extra "config_kwargs" must be an object'),
    ({"retries": 3}, 'extra "config_kwargs" must be an object'),
    ({"read_timeout": "3"}, r"read_timeout is '3'; use a number of seconds above 0"),
    ({"connect_timeout": 0}, "connect_timeout is 0"),
    ({"retries": {"total_max_attempts": 0}}, r"retries.total_max_attempts is 0; use a whole number of at least 1"),
    ({"retries": {"max_attempts": -1}}, r"retries.max_attempts is -1; use a whole number of at least 0"),
    ({"retries": {"max_attempts": True}}, r"retries.max_attempts is True"),
])
def test_bad_config_kwargs_name_the_field(monkeypatch, config_kwargs, match):
    set_conn(monkeypatch, conn_type="aws", login="k", password="s",
             extra={"endpoint_url": "http://m:9000", "config_kwargs": config_kwargs})
    with pytest.raises(S3ConnectionError, match=match):
        s3_settings_from_connection("test_s3")


@pytest.mark.parametrize("extras, expected", [
    ({"in_cluster": True}, dict(in_cluster=True)),
    ({"extra__kubernetes__in_cluster": "true", "extra__kubernetes__namespace": "ml"},
     dict(in_cluster=True, namespace="ml")),
    ({"in_cluster": "false", "kube_config_path": "/etc/kube/config", "cluster_context": "prod"},
     dict(kubeconfig_path="/etc/kube/config", context="prod")),
    ({"kube_config": "apiVersion: v1\nkind: Config\n"}, dict(kubeconfig={"apiVersion": "v1", "kind": "Config"})),
    ({}, dict()),
])
def test_connection_extras(extras, expected):
    cfg = cluster_from_extras(extras)
    defaults = dict(in_cluster=False, kubeconfig_path=None, kubeconfig=None, context=None, namespace=None)
    assert {k: getattr(cfg, k) for k in defaults} == defaults | expected
