"""Rank 0's side of the run folder's fence (run_folder.py): claim the folder when the attempt starts, check
before each write that it is still the current attempt, publish checkpoints and the result by compare-and-
swap, and stop at once, writing nothing more, when a newer attempt has claimed the folder.

Every writer of the attempt (the heartbeat's thread, the health log's, the checkpoint writer's, the training
thread) goes through one guard, so "fenced" means the same everywhere: print why, exit with FENCED's code.
The check before a write narrows the window in which a fenced attempt writes; the prefix of its own and the
compare-and-swap of publishing close it: whatever it writes in that window is never read.
"""
from __future__ import annotations

import os
import sys

from ..formats import exit_codes
from ..health.verdict import FENCED
from ..formats.run_folder import Attempt, Fenced, RunFolder
from ..store.base import ObjectStore


class FenceGuard:
    def __init__(self, attempt: Attempt):
        self.attempt = attempt

    @classmethod
    def claim(cls, run_store: ObjectStore, attempt_id: str) -> "FenceGuard":
        """Make this attempt the run folder's current one (the previous one is fenced from here on)."""
        attempt = RunFolder(run_store).claim(attempt_id)
        print(f"[ringflow] attempt {attempt_id} is number {attempt.number} of {run_store.uri} (writes under "
              f"{attempt.ref.prefix}/)", flush=True)
        return cls(attempt)

    @property
    def store(self) -> ObjectStore:
        """Where this attempt writes: invisible to readers until published."""
        return self.attempt.store

    def check(self, max_age: float = 0.0) -> None:
        """Before a write: exit FENCED if a newer attempt claimed the folder (re-read when older than max_age)."""
        try:
            self.attempt.check(max_age)
        except Fenced as exc:
            self.fenced(exc)

    def publish_checkpoint(self, name: str, keep_last: int | None) -> list[str]:
        try:
            return self.attempt.publish_checkpoint(name, keep_last)
        except Fenced as exc:
            self.fenced(exc)

    def publish_result(self, raw: bytes) -> None:
        try:
            self.attempt.publish_result(raw)
        except Fenced as exc:
            self.fenced(exc)

    @staticmethod
    def fenced(exc: Fenced) -> None:
        print(f"[ringflow] {FENCED}: {exc}", file=sys.stderr, flush=True)
        os._exit(exit_codes.BY_VERDICT[FENCED])
