"""Object stores behind one interface, chosen by URI.

    /data/ringflow  or  file:///data/ringflow   -> LocalFolderStore (the embedded default)
    s3://bucket/prefix                          -> S3Store, settings from the environment

Pipelines pass URIs around (XCom, job specs), never store objects or credentials, so a task on any
machine can reopen the same store with its own environment.
"""
from __future__ import annotations

import os
import urllib.parse

from .base import (InvalidKey, ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed, StoreConfigError,
                   StoreUnavailable)
from .local import LocalFolderStore
from .s3 import S3Settings, S3Store

__all__ = [
    "InvalidKey",
    "LocalFolderStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "S3Settings",
    "S3Store",
    "StoreConfigError",
    "StoreUnavailable",
    "open_store",
    "split_uri",
]


def _local_path(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise StoreConfigError(
            f"{uri!r} names host {parts.netloc!r}; file URIs must be local, like file:///data/ringflow"
        )
    if not parts.path:
        raise StoreConfigError(f"{uri!r} has no path; use file:///absolute/path")
    return urllib.parse.unquote(parts.path)


def open_store(uri: str, s3: S3Settings | None = None) -> ObjectStore:
    """Open the store rooted at `uri`. S3 settings default to `S3Settings.from_env()`, read only
    when an s3:// URI is actually opened, so local runs need no S3 variables."""
    if not isinstance(uri, str) or not uri.strip():
        raise StoreConfigError(f"store URI must be a non-empty string, got {uri!r}")
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "s3":
        parts = urllib.parse.urlsplit(uri)
        if not parts.netloc:
            raise StoreConfigError(f"{uri!r} names no bucket; use s3://bucket/prefix")
        return S3Store.from_settings(parts.netloc, urllib.parse.unquote(parts.path).strip("/"),
                                     s3 or S3Settings.from_env())
    if scheme == "file":
        return LocalFolderStore(_local_path(uri))
    if scheme and len(scheme) > 1:  # one letter would be a Windows drive, i.e. a plain path
        raise StoreConfigError(f"unsupported store URI scheme {scheme!r} in {uri!r}; use a path, file:// or s3://")
    return LocalFolderStore(os.path.expanduser(uri))


def split_uri(uri: str) -> tuple[str, str]:
    """Split the URI of one object into (URI of the store holding it, key of the object).

    `s3://b/shards/manifest.json` -> (`s3://b/shards`, `manifest.json`), so a task handed the URI of
    a manifest can `open_store(parent).get_bytes(name)`.
    """
    if not isinstance(uri, str) or not uri or uri.endswith("/"):
        raise StoreConfigError(f"{uri!r} does not name a single object (it is empty or ends with '/')")
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "s3":
        parts = urllib.parse.urlsplit(uri)
        path = parts.path.strip("/")
        if not parts.netloc or not path:
            raise StoreConfigError(f"{uri!r} does not name an object inside a bucket; use s3://bucket/key")
        parent, _, name = path.rpartition("/")
        return (f"s3://{parts.netloc}/{parent}" if parent else f"s3://{parts.netloc}"), name
    if scheme == "file":
        path = _local_path(uri)
        parent, _, name = path.rpartition("/")
        return f"file://{parent or '/'}", name
    head, name = os.path.split(uri)
    return (head or "."), name
