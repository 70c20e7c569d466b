"""A folder on the local disk as an object store: the embedded default, no server needed.

Keys map to files under the root. Every write lands in a temporary file in the destination's own
directory and is then renamed over the target, so readers (another rank, the promote step, a
restarted task) see the old object or the new one, never a half-written file. Renames are only
atomic inside one filesystem, which is why the temporary file is never put in /tmp.

Conditional writes: a create links the finished temporary file to the target (`os.link` fails if
the target exists, atomically, even across processes and NFS clients), so a half-written object is
never visible and of many creators exactly one wins. A replace-if-unchanged holds an exclusive
`flock` on a hidden lock file beside the target while it compares and renames; every replacer of
that key takes the same lock. The etag is the sha256 of the content.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import secrets
import shutil
from typing import Callable, Iterator

from .base import (InvalidKey, ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed, Progress, check_key,
                   check_prefix, check_range, join_key, short_range)

# Temporary files end with this, so `list` can skip the leftovers of a writer that crashed, and keys
# may not end with it (a real object could otherwise hide from listings).
TMP_SUFFIX = ".ringflow-tmp"
# Lock files of conditional replaces end with this. They stay after use: removing one while another
# writer waits on it would let two writers hold "the" lock at once.
LOCK_SUFFIX = ".ringflow-lock"
_RESERVED_SUFFIXES = (TMP_SUFFIX, LOCK_SUFFIX)
_CHUNK = 1 << 20


class LocalFolderStore(ObjectStore):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        # Absolute from the start: a relative root would silently change meaning when a task chdirs.
        self._root = pathlib.Path(os.path.abspath(os.fspath(root)))

    def __repr__(self) -> str:
        return f"LocalFolderStore({str(self._root)!r})"

    @property
    def root(self) -> pathlib.Path:
        return self._root

    @property
    def uri(self) -> str:
        return self._root.as_uri()

    def child(self, prefix: str) -> "LocalFolderStore":
        return LocalFolderStore(self._path(join_key(prefix)))

    # -- writes ---------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(self._path(key), lambda f: f.write(data))

    def put_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        with open(path, "rb") as src:
            self._atomic_write(self._path(key), lambda f: _copy(src, f, progress))

    def copy(self, src_key: str, dst_key: str) -> None:
        self._path(dst_key)  # a bad destination is the caller's bug even when the source is missing
        src = self._existing(src_key)
        try:
            with open(src, "rb") as f_src:
                self._atomic_write(self._path(dst_key), lambda f: shutil.copyfileobj(f_src, f, _CHUNK))
        except FileNotFoundError as exc:  # deleted between the check and the open
            raise ObjectNotFound(f"{src_key!r} not found in {self.uri}") from exc

    def put_bytes_if_absent(self, key: str, data: bytes) -> str:
        target = self._path(key)
        tmp = self._write_temp(target, lambda f: f.write(data))
        try:
            os.link(tmp, target)
        except FileExistsError as exc:
            raise PreconditionFailed(f"{key!r} already exists in {self.uri}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def put_bytes_if_match(self, key: str, data: bytes, etag: str) -> str:
        target = self._path(key)
        # The new content is written and synced before the lock, which is held only to compare and rename
        # (microseconds, not an fsync's time on a busy disk): a writer frozen while holding it (a stopped
        # attempt, run_folder.py's fencing) blocks every later writer of the key until it is killed.
        tmp = self._write_temp(target, lambda f: f.write(data))
        try:
            with self._locked(key, target):
                try:
                    current = target.read_bytes()
                except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                    raise PreconditionFailed(f"{key!r} no longer exists in {self.uri}") from exc
                if _etag(current) != etag:
                    raise PreconditionFailed(f"{key!r} in {self.uri} changed since it was read (etag {etag[:12]}…)")
                os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except IsADirectoryError:  # a "directory" is not an object; nothing to delete
            return
        self._prune_empty_dirs(path.parent)

    # -- reads ----------------------------------------------------------------------------------

    def get_bytes(self, key: str, *, progress: Progress | None = None) -> bytes:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc
        if progress is not None:
            progress(len(data))
        return data

    def get_range(self, key: str, start: int, length: int, *, progress: Progress | None = None) -> bytes:
        check_range(key, start, length)
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                data = os.pread(fh.fileno(), length, start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc
        if len(data) != length:
            raise short_range(key, start, length, len(data))
        if progress is not None:
            progress(len(data))
        return data

    def get_bytes_tagged(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, _etag(data)

    def get_file(self, key: str, path: str, *, progress: Progress | None = None) -> None:
        src = self._path(key)
        try:
            with open(src, "rb") as f_src:
                # Same atomicity for the download: a crash never leaves a truncated local copy.
                self._atomic_write(pathlib.Path(os.path.abspath(path)),
                                   lambda f: _copy(f_src, f, progress), fsync=False)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            if src.is_file():  # the destination's folder was the missing part
                raise
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def stat(self, key: str) -> ObjectInfo:
        path = self._existing(key)
        return ObjectInfo(key=key, size=path.stat().st_size)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names in full, not the whole root.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self._root / base if base else self._root
        found: list[ObjectInfo] = []
        for dirpath, _dirs, files in os.walk(top):
            rel_dir = os.path.relpath(dirpath, self._root).replace(os.sep, "/")
            for name in files:
                if name.endswith(_RESERVED_SUFFIXES):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    size = os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:  # deleted while we walked
                    continue
                found.append(ObjectInfo(key=key, size=size))
        found.sort(key=lambda info: info.key)
        return iter(found)

    # -- helpers --------------------------------------------------------------------------------

    def _path(self, key: str) -> pathlib.Path:
        check_key(key)
        if key.endswith(_RESERVED_SUFFIXES):
            raise InvalidKey(f"object key {key!r} ends with one of {_RESERVED_SUFFIXES}, which are reserved for "
                             f"temporary and lock files")
        return self._root.joinpath(*key.split("/"))

    def _existing(self, key: str) -> pathlib.Path:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(f"{key!r} not found in {self.uri}")
        return path

    def _atomic_write(self, target: pathlib.Path, write: Callable, fsync: bool = True) -> None:
        tmp = self._write_temp(target, write, fsync)
        try:
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @contextlib.contextmanager
    def _locked(self, key: str, target: pathlib.Path) -> Iterator[None]:
        if not target.is_file():  # checked again under the lock; this only avoids stray lock files
            raise PreconditionFailed(f"{key!r} does not exist in {self.uri}")
        lock = target.parent / f".{target.name}{LOCK_SUFFIX}"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileNotFoundError, NotADirectoryError) as exc:  # no folder, so no object to replace
            raise PreconditionFailed(f"{key!r} does not exist in {self.uri}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write_temp(self, target: pathlib.Path, write: Callable, fsync: bool = True) -> pathlib.Path:
        """A finished temporary file beside `target`, for the caller to rename or link."""
        tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}{TMP_SUFFIX}"
        for attempt in range(3):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                f = open(tmp, "xb")
            except FileNotFoundError:
                # A concurrent delete pruned the folder we just made; make it again.
                if attempt == 2:
                    raise
                continue
            break
        try:
            with f:
                write(f)
                if fsync:
                    # Without it a power cut can leave a renamed but empty file, which for a
                    # checkpoint MANIFEST would claim data that never reached the disk.
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _prune_empty_dirs(self, folder: pathlib.Path) -> None:
        # S3 has no folders; removing empty ones keeps `ls` of a pruned checkpoint tree honest.
        while folder != self._root and self._root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent


def _copy(src, dst, progress: Progress | None) -> None:
    if progress is None:
        shutil.copyfileobj(src, dst, _CHUNK)
        return
    while chunk := src.read(_CHUNK):
        dst.write(chunk)
        progress(len(chunk))


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
