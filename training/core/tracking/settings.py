"""Where the MLflow server is, who logs in, and which alias a promotion moves.

MLflow's client reads credentials only from the environment (MLFLOW_TRACKING_USERNAME/PASSWORD), so
`tracking_env` sets them for the duration of a call and puts the previous values back: no credential
outlives the call, as with the S3 settings of the evaluate task.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import urllib.parse
from typing import Iterator

from ..scoped_environ import scoped_environ

DEFAULT_ALIAS = "champion"
# MLflow refuses these as aliases: "latest" names the newest version, v<N>/version<N> name version N.
_RESERVED_ALIAS = re.compile(r"^(latest|v\d+|version\d+)$", re.IGNORECASE)
_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


class TrackingConfigError(ValueError):
    """The MLflow settings cannot be used; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class TrackingSettings:
    """uri: the tracking server (http:// or https://); username/password: its basic auth, both or neither;
    alias: the registered-model alias a promotion moves (MLflow aliases, not the deprecated stages)."""

    uri: str
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    alias: str = DEFAULT_ALIAS

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.uri) if isinstance(self.uri, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise TrackingConfigError(f"MLflow tracking URI is {self.uri!r}; give the server's URL, like "
                                      f"http://mlflow.ml.svc:5000")
        if bool(self.username) != bool(self.password):
            raise TrackingConfigError("MLflow login: give both username and password (basic auth), or neither")
        check_alias(self.alias)

    def env(self) -> dict[str, str]:
        """The variables MLflow's client reads for this server."""
        env = {"MLFLOW_TRACKING_URI": self.uri}
        if self.username:
            env |= {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": str(self.password)}
        return env


def check_alias(alias: object) -> str:
    if not isinstance(alias, str) or not _ALIAS.match(alias) or _RESERVED_ALIAS.match(alias):
        raise TrackingConfigError(f"MLflow alias is {alias!r}; use letters, digits, '_' or '-' (not 'latest', "
                                  f"'v<N>' or 'version<N>', which MLflow reserves), e.g. 'champion'")
    return alias


@contextlib.contextmanager
def tracking_env(settings: TrackingSettings) -> Iterator[None]:
    """Within the block, the process environment points MLflow's client at `settings`' server."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    with scoped_environ(settings.env(), unset=names):
        yield
