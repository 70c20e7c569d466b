"""Airflow connections -> the core's settings: S3/MinIO credentials for object stores, cluster access for the
Kubernetes client (`AirflowConnections`, the core's backends/connections.Connections).

The connection (type `aws`) holds everything about the server: login = access key, password = secret
key, extra `{"endpoint_url": "http://minio.data.svc:9000", "region_name": "us-east-1"}`. DAG code
passes only URIs and a connection id, so no key is ever written in code, rendered in the UI or
stored in XCom.

Retries and timeouts may be tuned in the extra the way the Amazon provider reads them (botocore's
client config): `"config_kwargs": {"connect_timeout": 10, "read_timeout": 60, "retries":
{"total_max_attempts": 6}}` (`max_attempts` there counts retries after the first try, as in
botocore). Training processes get them with the credentials (S3Settings.to_env).

A Kubernetes connection (type `kubernetes`) is read the way the cncf.kubernetes provider reads it: extras
in_cluster / kube_config_path / kube_config (inline YAML or JSON) / namespace / cluster_context, also with
the "extra__kubernetes__" prefix (`cluster_from_extras`).

`conn_id` means the same in every operator, the trigger, the backends and the pipeline factory: the id
of such a connection, by default DEFAULT_S3_CONN_ID. `conn_id=None` means no connection: s3:// URIs use the
S3 settings of the process's environment (RINGFLOW_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY;
training/store/s3.py), as training processes do, and a local job inherits them. Local paths never need
one.
"""
from __future__ import annotations

import urllib.parse
from typing import Any

from ringflow.training.core.backends.kubernetes.settings import ClusterConfig
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import ObjectStore, S3Settings, StoreConfigError, open_store

# The S3 connection (type aws) a task reads and writes the store with, unless told another.
DEFAULT_S3_CONN_ID = "ringflow_s3"
CONN_TYPE = "aws"


class S3ConnectionError(StoreConfigError):
    """The Airflow connection cannot be turned into S3 settings; the message says what to set."""


def _how_to_define(conn_id: str) -> str:
    return (f"define it in Admin > Connections, or as the environment variable AIRFLOW_CONN_{conn_id.upper()}="
            f'\'{{"conn_type": "aws", "login": "<access key>", "password": "<secret key>", '
            f'"extra": {{"endpoint_url": "http://<host>:9000"}}}}\'')


def s3_settings_from_connection(conn_id: str = DEFAULT_S3_CONN_ID) -> S3Settings:
    """S3 settings from the Airflow connection `conn_id` (looked up through Airflow's secrets backends)."""
    from airflow.sdk import BaseHook  # here, not at import: only S3 tasks need a connection lookup

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or the API server's own error in a worker
        raise S3ConnectionError(f"cannot read Airflow connection {conn_id!r} ({exc}): {_how_to_define(conn_id)}") from exc

    if conn.conn_type != CONN_TYPE:
        raise S3ConnectionError(
            f"Airflow connection {conn_id!r} has type {conn.conn_type!r}; make it type {CONN_TYPE!r} "
            f"(Amazon Web Services), which is also what MinIO connections use"
        )
    extra = conn.extra_dejson or {}
    # The Amazon provider also accepts the keys in the extra; honour that so an existing aws
    # connection works unchanged.
    access_key = conn.login or extra.get("aws_access_key_id")
    secret_key = conn.password or extra.get("aws_secret_access_key")
    endpoint = extra.get("endpoint_url")
    missing = [what for what, value in (("login (the access key)", access_key),
                                        ("password (the secret key)", secret_key),
                                        ('extra "endpoint_url"', endpoint)) if not value]
    if missing:
        raise S3ConnectionError(
            f"Airflow connection {conn_id!r} lacks {', '.join(missing)}: set it on the connection "
            f"(the endpoint is the MinIO/S3 URL, like http://minio.data.svc:9000)"
        )
    region = extra.get("region_name") or None
    try:  # the endpoint alone first, so that its error names the connection's field
        S3Settings(endpoint=endpoint, access_key=access_key, secret_key=secret_key, region=region)
    except StoreConfigError as exc:
        # S3Settings names the environment variable; here the fix is on the connection.
        raise S3ConnectionError(
            f'Airflow connection {conn_id!r}: extra "endpoint_url" is {endpoint!r}, not a URL like '
            f"http://minio.data.svc:9000 or https://s3.example.com; fix the connection"
        ) from exc
    return S3Settings(endpoint=endpoint, access_key=access_key, secret_key=secret_key, region=region,
                      **_tuning(conn_id, extra.get("config_kwargs")))


def _tuning(conn_id: str, config_kwargs: Any) -> dict[str, Any]:
    """S3Settings' retry and timeout fields from the extra's `config_kwargs` (botocore Config arguments, as
    the Amazon provider reads them); the settings' defaults for what it does not say."""
    if config_kwargs is None:
        return {}
    example = '{"connect_timeout": 10, "read_timeout": 60, "retries": {"total_max_attempts": 6}}'
    retries = config_kwargs.get("retries", {}) if isinstance(config_kwargs, dict) else None
    if not isinstance(retries, dict):
        raise S3ConnectionError(f'Airflow connection {conn_id!r}: extra "config_kwargs" must be an object like '
                                f"{example}; fix the connection")

    def bad(field: str, value: Any, want: str) -> S3ConnectionError:
        return S3ConnectionError(f'Airflow connection {conn_id!r}: extra "config_kwargs" {field} is {value!r}; '
                                 f"use {want}, as in {example}")

    tuning: dict[str, Any] = {}
    for name in ("connect_timeout", "read_timeout"):
        if name in config_kwargs:
            value = config_kwargs[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise bad(name, value, "a number of seconds above 0")
            tuning[name] = value
    # botocore counts `max_attempts` as retries after the first try, `total_max_attempts` with it.
    for name, first_try in (("total_max_attempts", 0), ("max_attempts", 1)):
        if name in retries:
            value = retries[name]
            if isinstance(value, bool) or not isinstance(value, int) or value + first_try < 1:
                raise bad(f"retries.{name}", value, "a whole number of at least " + str(1 - first_try))
            tuning["max_attempts"] = value + first_try
            break
    return tuning


def s3_settings_for(uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID) -> S3Settings | None:
    """The S3 settings a task opens `uri` with: connection `conn_id`'s for an s3:// URI; None (the
    environment's, or none needed) for a local path or file:// URI, or when conn_id is None. The one
    credential route of the Airflow tasks: every store and run folder they open gets its settings here."""
    if conn_id and isinstance(uri, str) and urllib.parse.urlsplit(uri).scheme == "s3":
        return s3_settings_from_connection(conn_id)
    return None


def open_store_for(uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID) -> ObjectStore:
    """Open the store at `uri` with the settings s3_settings_for gives."""
    return open_store(uri, s3=s3_settings_for(uri, conn_id))


def open_run_folder(uri: str, conn_id: str | None = DEFAULT_S3_CONN_ID) -> RunFolder:
    """Open the run folder at `uri` with the settings s3_settings_for gives: what every task reads a run
    through (its result, eval, health records, checkpoints; the shards it names, with the same settings)."""
    return RunFolder.open(uri, s3_settings_for(uri, conn_id))


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def cluster_from_extras(extras: dict[str, Any]) -> ClusterConfig:
    """The cluster access that an Airflow "kubernetes" connection's extras describe."""
    def get(key: str) -> Any:
        value = extras.get(key)
        return extras.get(f"extra__kubernetes__{key}") if value in (None, "") else value

    inline = get("kube_config")
    if isinstance(inline, str) and inline.strip():
        import yaml  # a dependency of the kubernetes client

        inline = yaml.safe_load(inline)  # YAML is a superset of JSON: both forms work
    if inline is not None and not isinstance(inline, dict):
        raise ValueError("the connection's kube_config extra must be a kubeconfig document (YAML or JSON)")
    return ClusterConfig(
        in_cluster=_truthy(get("in_cluster")),
        kubeconfig_path=get("kube_config_path") or None,
        kubeconfig=inline or None,
        context=get("cluster_context") or None,
        namespace=get("namespace") or None,
    )


class AirflowConnections:
    """The core's connection lookup (training/core/backends/connections.py), through Airflow's secrets backends."""

    def s3_settings(self, conn_id: str) -> S3Settings:
        return s3_settings_from_connection(conn_id)

    def cluster(self, conn_id: str) -> ClusterConfig:
        from airflow.sdk import BaseHook  # here, not at import: only cluster tasks need the lookup

        return cluster_from_extras(BaseHook.get_connection(conn_id).extra_dejson)

    async def acluster(self, conn_id: str) -> ClusterConfig:
        from airflow.sdk import BaseHook

        return cluster_from_extras((await BaseHook.aget_connection(conn_id)).extra_dejson)
