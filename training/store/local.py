"""A folder on the local disk as an object store: the embedded default, no server needed.

Keys map to files under the root. Every write lands in a temporary file in the destination's own
directory and is then renamed over the target, so readers (another rank, the promote step, a
restarted task) see the old object or the new one, never a half-written file. Renames are only
atomic inside one filesystem, which is why the temporary file is never put in /tmp.
"""
from __future__ import annotations

import os
import pathlib
import secrets
import shutil
from typing import Callable, Iterator

from .base import InvalidKey, ObjectInfo, ObjectNotFound, ObjectStore, check_key, check_prefix, join_key

# Temporary files end with this, so `list` can skip the leftovers of a writer that crashed, and keys
# may not end with it (a real object could otherwise hide from listings).
TMP_SUFFIX = ".ringflow-tmp"
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

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as src:
            self._atomic_write(self._path(key), lambda f: shutil.copyfileobj(src, f, _CHUNK))

    def copy(self, src_key: str, dst_key: str) -> None:
        self._path(dst_key)  # a bad destination is the caller's bug even when the source is missing
        src = self._existing(src_key)
        try:
            with open(src, "rb") as f_src:
                self._atomic_write(self._path(dst_key), lambda f: shutil.copyfileobj(f_src, f, _CHUNK))
        except FileNotFoundError as exc:  # deleted between the check and the open
            raise ObjectNotFound(f"{src_key!r} not found in {self.uri}") from exc

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

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc

    def get_file(self, key: str, path: str) -> None:
        src = self._path(key)
        try:
            with open(src, "rb") as f_src:
                # Same atomicity for the download: a crash never leaves a truncated local copy.
                self._atomic_write(pathlib.Path(os.path.abspath(path)),
                                   lambda f: shutil.copyfileobj(f_src, f, _CHUNK), fsync=False)
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
                if name.endswith(TMP_SUFFIX):
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
        if key.endswith(TMP_SUFFIX):
            raise InvalidKey(f"object key {key!r} ends with {TMP_SUFFIX!r}, which is reserved for temporary files")
        return self._root.joinpath(*key.split("/"))

    def _existing(self, key: str) -> pathlib.Path:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(f"{key!r} not found in {self.uri}")
        return path

    def _atomic_write(self, target: pathlib.Path, write: Callable, fsync: bool = True) -> None:
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
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _prune_empty_dirs(self, folder: pathlib.Path) -> None:
        # S3 has no folders; removing empty ones keeps `ls` of a pruned checkpoint tree honest.
        while folder != self._root and self._root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent
