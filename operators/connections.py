"""Object stores for tasks, with S3/MinIO credentials taken from an Airflow connection.

The connection (type `aws`) holds everything about the server: login = access key, password = secret
key, extra `{"endpoint_url": "http://minio.data.svc:9000", "region_name": "us-east-1"}`. DAG code
passes only URIs and a connection id, so no key is ever written in code, rendered in the UI or
stored in XCom.
"""
from __future__ import annotations

import urllib.parse

from ringflow.training.store import ObjectStore, S3Settings, StoreConfigError, open_store

DEFAULT_CONN_ID = "ringflow_s3"
CONN_TYPE = "aws"


class S3ConnectionError(StoreConfigError):
    """The Airflow connection cannot be turned into S3 settings; the message says what to set."""


def _how_to_define(conn_id: str) -> str:
    return (f"define it in Admin > Connections, or as the environment variable AIRFLOW_CONN_{conn_id.upper()}="
            f'\'{{"conn_type": "aws", "login": "<access key>", "password": "<secret key>", '
            f'"extra": {{"endpoint_url": "http://<host>:9000"}}}}\'')


def s3_settings_from_connection(conn_id: str = DEFAULT_CONN_ID) -> S3Settings:
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
    try:
        return S3Settings(endpoint=endpoint, access_key=access_key, secret_key=secret_key,
                          region=extra.get("region_name") or None)
    except StoreConfigError as exc:
        # S3Settings names the environment variable; here the fix is on the connection.
        raise S3ConnectionError(
            f'Airflow connection {conn_id!r}: extra "endpoint_url" is {endpoint!r}, not a URL like '
            f"http://minio.data.svc:9000 or https://s3.example.com; fix the connection"
        ) from exc


def open_store_for(uri: str, conn_id: str | None = DEFAULT_CONN_ID) -> ObjectStore:
    """Open the store at `uri`: a local path or file:// URI as is, an s3:// URI with the credentials
    of connection `conn_id`."""
    if isinstance(uri, str) and urllib.parse.urlsplit(uri).scheme == "s3":
        if not conn_id:
            raise S3ConnectionError(
                f"{uri!r} is an S3 location but no conn_id was given: pass the id of an Airflow "
                f"connection of type aws (default {DEFAULT_CONN_ID!r})"
            )
        return open_store(uri, s3=s3_settings_from_connection(conn_id))
    return open_store(uri)
