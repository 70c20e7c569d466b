"""The peer copy of an elastic DDP job (rank/ddp_elastic.py): the newest training state kept on each host's
own memory disk, so that when torchrun restarts every worker after a death, the restarted workers read the
state from a host that survived instead of from the store.

    where       one folder per run and attempt under /dev/shm (a memory file system) where it exists, else
                the temp dir: a restart keeps the attempt id (the launcher's), a retry has a new one, so a
                retry never reads an earlier try's copy and a copy is never another run's
    what        `step-<step>/`: a checkpoint's training state (state.pt) and its manifest meta (meta.json),
                written into a temporary folder and renamed, the older ones deleted after, so a reader sees
                whole copies only
    beat        `beat`: the last step a worker of this host ended and when, written in place every step (an
                mmap, no system call): after a restart it says how many steps the death cost and roughly when
    ranges      `ranges/rank-<rank>/`: the byte ranges each rank read from the store, for the restarted
                workers' first windows (host_ranges.py)
    ended       `ended`: the exit code of a rank that ended on purpose (a verdict): the restart torchrun makes
                anyway ends at once with it, so the failure policy still sees the verdict, not a fresh try
    choice      the newest of the hosts' copies and the store's newest checkpoint (a copy on equal steps: it
                is local)

Torch-free: the launcher names the folder to remove it when the job ends.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import mmap
import os
import re
import shutil
import struct
import tempfile
import time

# A memory file system on Linux: a copy there costs no disk write and survives its writer's death (not the
# host's: then the store's checkpoint is the newest left).
MEMORY_DISK = "/dev/shm"
PREFIX = "ringflow-peer-"
COPY_PATTERN = re.compile(r"^step-(\d{12})$")
META_FILE = "meta.json"
BEAT_FILE = "beat"
# A rank's deliberate end (a verdict, bad input, out of memory: run_rank's exit code), which a restart must not
# undo: torchrun restarts on any failure, and the restarted ranks then end at once with this code.
END_FILE = "ended"
# The beat: the step, its unix end time, the world size it was trained on.
_BEAT = struct.Struct("<qdq")


def base_folder(memory_disk: str = MEMORY_DISK) -> str:
    """Where copies go on this host: the memory disk when it is a writable folder, else the temp dir."""
    if os.path.isdir(memory_disk) and os.access(memory_disk, os.W_OK | os.X_OK):
        return memory_disk
    return tempfile.gettempdir()


def folder_name(run_uri: str, attempt: str) -> str:
    """The folder of one run's attempt: a digest of the run's URI (any characters) and the attempt id, kept
    as it is when it is a plain name (the launcher's uuid, an operator's job id), else digested too."""
    run = hashlib.sha256(run_uri.encode()).hexdigest()[:16]
    safe = attempt if re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", attempt) and attempt not in (".", "..") else \
        hashlib.sha256(attempt.encode()).hexdigest()[:32]
    return f"{PREFIX}{run}-{safe}"


def copy_folder(run_uri: str, attempt: str, base: str | None = None) -> str:
    return os.path.join(base or base_folder(), folder_name(run_uri, attempt))


def copy_name(step: int) -> str:
    return f"step-{step:012d}"


def newest_copy(names) -> tuple[int, str] | None:
    """(step, name) of the newest whole copy among a folder's `names` (a temporary file is no copy)."""
    found = [(int(m.group(1)), name) for name in names if (m := COPY_PATTERN.match(name))]
    return max(found) if found else None


def remove(folder: str) -> bool:
    """Delete a copy folder and what it holds (the job ended); whether one was there."""
    if not os.path.isdir(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


class Source(enum.Enum):
    """What a restarted job resumes from."""

    PEER_COPY = "peer copy"  # a host's copy, the newest state there is
    STORE = "store"          # the run folder's newest checkpoint, or a fresh start when it has none


@dataclasses.dataclass(frozen=True)
class Choice:
    source: Source
    holder: int | None  # the rank whose host holds the copy (the lowest, when several hold it)
    step: int | None    # the step resumed from; None: the store's, found as an attempt's start finds it


def choose(copy_steps: list[int], store_step: int | None, epochs_done: list[bool] | None = None) -> Choice:
    """copy_steps: each rank's newest copy step on its host (-1: none, or not the rank that reads its host's);
    store_step: the store's newest checkpoint step (None: none). The newest wins, a copy on equal steps. A
    copy of a finished run is never chosen (epochs_done[rank]): a finished run resumes from its final
    checkpoint, which carries the verdict its result needs."""
    usable = [s if s >= 0 and not (epochs_done and epochs_done[r]) else -1 for r, s in enumerate(copy_steps)]
    newest = max(usable, default=-1)
    if newest < 0 or (store_step is not None and store_step > newest):
        return Choice(Source.STORE, None, None)
    return Choice(Source.PEER_COPY, usable.index(newest), newest)


def same_host_only(hosts: list[str], holder: int) -> bool:
    """Whether every rank runs on the holder's host: then each reads the copy from the host's memory disk
    itself, else the holder broadcasts it."""
    return all(h == hosts[holder] for h in hosts)


@dataclasses.dataclass(frozen=True)
class Beat:
    step: int
    at: float
    world_size: int


class BeatFile:
    """The last step a worker of this host ended: 24 bytes in the copy folder, mapped into memory and written in
    place every step (no system call), read back by the restarted worker."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, BEAT_FILE)
        self._map: mmap.mmap | None = None

    def write(self, step: int, world_size: int) -> None:
        if self._map is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, _BEAT.size)
                self._map = mmap.mmap(fd, _BEAT.size)
            finally:
                os.close(fd)
        _BEAT.pack_into(self._map, 0, step, time.time(), world_size)

    def read(self) -> Beat | None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(_BEAT.size)
        except OSError:
            return None
        if len(data) != _BEAT.size:
            return None
        step, at, world_size = _BEAT.unpack(data)
        return Beat(step, at, world_size) if at > 0 else None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def write_end(folder: str, code: int) -> None:
    """Note that a rank of this host ended on purpose with `code` (a torchrun restart then ends with it)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, END_FILE), "w", encoding="utf-8") as fh:
        fh.write(str(code))


def read_end(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, END_FILE), encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None
