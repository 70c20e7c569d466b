"""Credentials the core is named, not given: a connection id in, settings out.

Backends are rebuilt from plain JSON (`Backend.to_dict`), which travels through Airflow's database to
the triggerer, so they carry the *id* of a connection and never its secrets. Whoever runs a backend
hands it a `Connections` that resolves such ids: operators/connections.py's `AirflowConnections` reads
Airflow connections; without one (the CLI, scripts, tests), a backend with a connection id fails and says
so, and `conn_id=None` means "from the environment" as everywhere (operators/connections.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .kubernetes.settings import ClusterConfig
    from ...store import S3Settings


class Connections(Protocol):
    def s3_settings(self, conn_id: str) -> "S3Settings":
        """S3 settings (endpoint, keys, retries) of connection `conn_id`."""

    def cluster(self, conn_id: str) -> "ClusterConfig":
        """Kubernetes cluster access of connection `conn_id`."""

    async def acluster(self, conn_id: str) -> "ClusterConfig":
        """`cluster`, for an event loop that must not block on the lookup (the triggerer's)."""


class MissingConnections(LookupError):
    """A backend was given a connection id but nothing to resolve it with."""


def require(connections: Connections | None, conn_id: str, what: str) -> Connections:
    if connections is None:
        raise MissingConnections(
            f"{what} names connection {conn_id!r} but was built without a `connections` lookup: build it with "
            f"connections=AirflowConnections() (ringflow.operators.connections) inside Airflow, or pass "
            f"conn_id=None to take credentials from the environment")
    return connections
