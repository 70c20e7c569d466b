"""The byte ranges a rank read from the store (partition footers and row groups), kept on its host's memory disk
for the workers torchrun restarts in an elastic DDP job (ddp_elastic.py): they read their first windows after the
copy they resume from out of memory, not through the link again. Behind a slow link that read was most of a
restart: 2 windows of ~17 MB through 8 MB/s, 4.3 s of the 9.9 s the real-size bench measured before
(bench/results/elastic_recovery_real_size-ddp-before_host_ranges.md).

    where       <the host's copy folder>/ranges/rank-<rank>/<sha256>: each rank writes and deletes in its own
                folder only, any rank reads from all (a restarted rank mostly from the folder of the process
                that had its rank before, which it takes over)
    names       a range's sha256 as the manifest lists it: one name is one content, checked again when read
    kept        what this rank's last reads held (`kept_reads`: the window it trains on and the one loading) and
                what its last PINNED_COMMITS commits pinned (the windows its first micro-batches after the commit
                read: PartitionBatches.first_ranges); the rest is deleted as each read is kept. About six windows
                a rank (~100 MB with the shard step's ~4 MiB row groups; a stream decoded once and kept: the
                whole stream, at most ~32 MB), the pins of the newest commit mostly the windows held; right after
                a restart, also what the process before it kept, until its own commits pin theirs
    the disk    the host's copy of the state comes first: keeping pauses while the memory disk would have less
                free than a quarter of its size or 1 GiB, the smaller (free_floor), and a copy that fails to be written removes every rank's kept ranges
                and stops keeping on the host (give_way) before it tries again; a disk full or over quota
                stops this rank's keeping too. Each said once: a restart then reads through the store, as
                without it

Torch-free; thread-safe (the loader thread keeps, the training thread pins).
"""
from __future__ import annotations

import collections
import errno
import os
import re
import shutil
import stat
import threading
from typing import Callable, Iterable, Sequence

from ..formats.manifest import ByteRange, sha256_hex

RANGES_FOLDER = "ranges"
# Written by give_way: the host's copy needed the space, and no rank keeps ranges on this host any more.
GIVEN_WAY = "given-way"
# Commits whose pins stay: the host's copy of the newest is written after the commit, by a thread of its own,
# so until it is there a restart resumes from the one before.
PINNED_COMMITS = 2
# Keeping pauses while the memory disk would have less free than this share of its size, or than FREE_BYTES,
# the smaller: the host's copy of the state (written beside the one before it, which is deleted after) and a GPU
# job's NCCL shared memory need it more. (A copy that fails anyway makes the ranges give way: give_way.)
FREE_SHARE, FREE_BYTES = 0.25, 2**30
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NAME = re.compile(r"[0-9a-f]{64}")
_PREFIX = "rank-"


def free_floor(disk_bytes: int) -> int:
    """What keeping leaves free on a memory disk of `disk_bytes`."""
    return min(int(FREE_SHARE * disk_bytes), FREE_BYTES)


def rank_folder(folder: str, rank: int) -> str:
    return os.path.join(folder, RANGES_FOLDER, f"{_PREFIX}{rank}")


def give_way(folder: str) -> None:
    """The host's copy needs the memory disk (its write failed): every rank's kept ranges removed, and none kept
    on this host after (each rank's next keep sees GIVEN_WAY)."""
    ranges = os.path.join(folder, RANGES_FOLDER)
    os.makedirs(ranges, exist_ok=True)
    with open(os.path.join(ranges, GIVEN_WAY), "w", encoding="utf-8"):
        pass
    for entry in os.listdir(ranges):
        if entry.startswith(_PREFIX):
            shutil.rmtree(os.path.join(ranges, entry), ignore_errors=True)


def _read_kept(path: str, length: int) -> bytes | None:
    """A kept range's bytes: a regular file of exactly `length` bytes (no link followed, nothing that blocks),
    else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_size != length:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError:
        return None
    finally:
        os.close(fd)


class HostRanges:
    """This rank's kept ranges in `folder` (the host's copy folder), and every rank's to read from."""

    def __init__(self, folder: str, rank: int, kept_reads: int, say: Callable[[str], None] = lambda line: None):
        self.ranges_folder = os.path.join(folder, RANGES_FOLDER)
        self.own_folder = rank_folder(folder, rank)
        self._disk = os.path.dirname(os.path.abspath(folder))  # the memory disk, there before the folder is
        self._say = say
        self._lock = threading.Lock()
        self._reads: collections.deque[set[str]] = collections.deque(maxlen=kept_reads)
        self._pins: collections.deque[set[str]] = collections.deque(maxlen=PINNED_COMMITS)
        self._said: set[str] = set()
        try:
            names = os.listdir(self.own_folder)
        except OSError:
            names = []
        for name in names:  # a write its rank's process before died in
            if name.endswith(".tmp"):
                _unlink(os.path.join(self.own_folder, name))
        # What the folder holds: a restarted rank takes over what its rank's process before it kept, as a pin of
        # its own (the windows it reads first are among them), dropped as its own commits pin theirs.
        self._held = {name for name in names if _NAME.fullmatch(name)}
        self._pins.append(set(self._held))
        self.writing = True
        self.hit_bytes = 0  # what this rank read from the host (a restart's first reads)

    def get(self, wanted: ByteRange) -> bytes | None:
        """The range's bytes from this host (this rank's folder first, then the others'), checked against the
        manifest; None when no rank kept it (or a rank deleted it meanwhile)."""
        if not _NAME.fullmatch(wanted.sha256):
            return None
        try:
            others = [os.path.join(self.ranges_folder, o) for o in sorted(os.listdir(self.ranges_folder))
                      if o.startswith(_PREFIX)]
        except OSError:
            return None
        for folder in dict.fromkeys([self.own_folder, *others]):
            data = _read_kept(os.path.join(folder, wanted.sha256), wanted.length)
            if data is not None and sha256_hex(data) == wanted.sha256:
                with self._lock:
                    self.hit_bytes += len(data)
                return data
        return None

    def keep(self, read: Sequence[tuple[ByteRange, bytes]]) -> None:
        """One read's ranges with their bytes: written unless this rank's folder holds them (the writes outside
        the lock, so a pin never waits for them), then whatever neither the last reads nor the pins name
        deleted."""
        names = {r.sha256 for r, _ in read if _NAME.fullmatch(r.sha256)}
        with self._lock:
            new = {r.sha256: data for r, data in read if r.sha256 in names and r.sha256 not in self._held}
        written = []
        if new and self._may_write():
            for name, data in new.items():
                if not self._room_for(len(data)) or not self._write(name, data):
                    break
                written.append(name)
        with self._lock:
            self._held.update(written)
            self._reads.append(names)
            self._evict()

    def pin(self, ranges: Iterable[ByteRange]) -> None:
        """Keep `ranges` while this commit is one of the last PINNED_COMMITS (those not read yet: once read)."""
        with self._lock:
            self._pins.append({r.sha256 for r in ranges if _NAME.fullmatch(r.sha256)})
            self._evict()

    def _may_write(self) -> bool:
        if self.writing and os.path.exists(os.path.join(self.ranges_folder, GIVEN_WAY)):
            self.writing = False
            self._say_once("given way", "the host's copy of the state needed the memory disk: no ranges are kept "
                                        "on this host any more, a restart reads its first windows through the store")
        return self.writing

    def _room_for(self, size: int) -> bool:
        try:
            disk = os.statvfs(self._disk)
        except OSError:
            return True
        floor = free_floor(disk.f_blocks * disk.f_frsize)
        if disk.f_bavail * disk.f_frsize - size >= floor:
            return True
        self._say_once("full", f"the memory disk ({self._disk}) is down to {floor / 2**20:.0f} MiB free: no ranges "
                               "are kept while it is (the host's copy of the state comes first)")
        return False

    def _write(self, name: str, data: bytes) -> bool:
        path, temporary = os.path.join(self.own_folder, name), os.path.join(self.own_folder, f".{name}.tmp")
        try:
            os.makedirs(self.own_folder, exist_ok=True)
            with open(temporary, "wb") as fh:
                fh.write(data)
            os.rename(temporary, path)
        except OSError as exc:
            _unlink(temporary)
            if exc.errno in _DISK_FULL:
                self.writing = False
                self._say_once("disk full", f"the rows read are no longer kept on this host for a restart "
                                            f"({exc.strerror}: {self.own_folder}); a restart reads its first windows "
                                            "through the store")
            return False
        return True

    def _say_once(self, what: str, line: str) -> None:
        if what not in self._said:
            self._said.add(what)
            self._say(line)

    def _evict(self) -> None:
        keep = set().union(*self._reads, *self._pins)
        for name in self._held - keep:
            try:
                os.unlink(os.path.join(self.own_folder, name))
            except FileNotFoundError:
                pass
            except OSError:
                continue
            self._held.discard(name)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
