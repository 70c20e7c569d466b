"""The object-store contract every backend honours (local folder, S3/MinIO).

Keys are '/'-separated relative paths. A store is rooted at a prefix, so the same code writes
`run-1/checkpoints/...` whether that lands in a folder or under `s3://bucket/prefix/`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Iterator

# Called with the number of bytes just moved by a transfer, from whichever thread moves them: how a
# watcher tells a slow store that still moves bytes from one that is stuck (health/store_ops.py). A read
# (get_bytes, get_range) lets it raise TransferCancelled to abandon the read.
Progress = Callable[[int], None]


class TransferCancelled(BaseException):
    """Raised by a read's Progress callback: whoever wanted the bytes has gone (a data reader closed while its
    next window was loading), so the rest is not fetched and the connection is closed. A BaseException, as
    KeyboardInterrupt is: no store's error handling or retry takes it for the store failing."""


class ObjectNotFound(KeyError):
    """The key does not exist in the store."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument, quotes and all
        return str(self.args[0]) if self.args else "object not found"


class StoreConfigError(ValueError):
    """The store cannot be opened as configured; the message says which setting to fix."""


class InvalidKey(ValueError):
    """The key is not a safe relative '/'-separated name."""


class PreconditionFailed(Exception):
    """A conditional write lost: the key already exists (create) or changed since it was read
    (replace). Read again and retry, or give up."""


class StoreUnavailable(OSError):
    """The store kept failing after every retry (server errors, resets, timeouts). The message says
    what failed, how often it was tried and what to check; nothing was half-written. `where`: the URI of
    the object or prefix it was about, when known."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message)
        self.where = where


def check_key(key: str) -> str:
    """Return `key` if it is a safe relative key, else raise InvalidKey.

    One rule for every backend, so a key that works on a laptop folder also works on S3 and
    cannot escape the store's root (`..`, absolute paths) on either.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/"):
        raise InvalidKey(f"object key {key!r} is absolute; keys are relative to the store root, like 'a/b.txt'")
    if "\\" in key:
        raise InvalidKey(f"object key {key!r} contains a backslash; separate key segments with '/'")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(
            f"object key {key!r} has an empty, '.' or '..' segment; use plain '/'-separated names"
        )
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix is a plain string prefix of keys ('ckpt-0' matches 'ckpt-01/x'), but it may
    not point outside the root either."""
    if prefix == "":
        return prefix
    check_key(prefix.rstrip("/") or "/")
    return prefix


def check_range(key: str, start: int, length: int) -> None:
    if isinstance(start, bool) or isinstance(length, bool) or not isinstance(start, int) \
            or not isinstance(length, int) or start < 0 or length < 1:
        raise ValueError(f"range of {key!r}: start {start!r}, length {length!r}; use start >= 0, length >= 1")


def short_range(key: str, start: int, length: int, got: int) -> ValueError:
    return ValueError(f"{key!r} holds {got} bytes from byte {start}, not the {length} asked for: the object was "
                      f"replaced or truncated after its index was made; re-run the step that wrote it")


def join_key(*parts: str) -> str:
    """Join key fragments, ignoring empty ones and stray slashes at the joins."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(abc.ABC):
    """Minimal, atomic-per-object storage. Writers rely on: a `put_*` is visible whole or not at all."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """A URI naming the store's root, e.g. file:///data/ringflow or s3://bucket/prefix."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def get_bytes(self, key: str, *, progress: Progress | None = None) -> bytes:
        """Raises ObjectNotFound."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int, *, progress: Progress | None = None) -> bytes:
        """`length` bytes of the object from byte `start` (a ranged GET on S3): what a rank streams its
        partition with, one Parquet row group at a time. Raises ObjectNotFound, or ValueError when the
        object is shorter than the range asks (it was replaced by a different one)."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        """Upload a local file (multipart where the backend needs it)."""

    @abc.abstractmethod
    def get_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        """Download to a local path. Raises ObjectNotFound."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Raises ObjectNotFound."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with prefix, recursively, sorted by key."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Deleting a missing key is not an error."""

    @abc.abstractmethod
    def copy(self, src_key: str, dst_key: str) -> None:
        """Server-side copy inside the store: no bytes pass through this process on S3."""

    # -- conditional writes: how concurrent writers (promoters of one model) agree --------------
    #
    # An etag is an opaque string naming one version of an object's content; equal contents may
    # share an etag. Pass it back unchanged. Plain `put_bytes` on the same key is not coordinated
    # with these: a key written conditionally should only ever be written conditionally.
    # Put something unique to the writer in `data` (an id, a timestamp): after a lost response the
    # S3 store decides "did my write land?" by comparing contents.

    @abc.abstractmethod
    def get_bytes_tagged(self, key: str) -> tuple[bytes, str]:
        """(data, etag) of one version, read together. Raises ObjectNotFound."""

    @abc.abstractmethod
    def put_bytes_if_absent(self, key: str, data: bytes) -> str:
        """Create `key`; returns the new etag. Raises PreconditionFailed if the key exists, so of
        many concurrent creators exactly one wins."""

    @abc.abstractmethod
    def put_bytes_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace `key` if its current etag is `etag`; returns the new etag. Raises
        PreconditionFailed if it changed since it was read, or is missing: no update is lost."""

    def delete_prefix(self, prefix: str) -> None:
        for info in list(self.list(prefix)):
            self.delete(info.key)

    def child(self, prefix: str) -> "ObjectStore":
        """The same store rooted one level deeper."""
        raise NotImplementedError
