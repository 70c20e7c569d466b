"""An audit of the data order: each rank appends one JSON line per micro-batch it trains on to a file of its
own in a local folder (the config's `row_log_dir`), naming the rows by (file, row in that file):

    {"attempt": "…", "rank": 1, "world_size": 3, "step": 12, "epoch": 0, "rows": [[0, 417], [2, 35], …]}

`step` is the optimizer step the micro-batch's gradient goes into; `file` indexes the manifest's partitions.
What it is for: showing that a run trained on every row of an epoch exactly once, across resumes on other
numbers of workers (tests/training/test_elastic_resume.py): rows of steps after the checkpoint a resume went
back to were trained on again by the next try, and are not counted.

A local file, not the run folder: written on the training thread after every backward pass, it must cost a
buffered write, never a store round trip; each line is flushed, so a killed rank keeps what it trained on.
"""
from __future__ import annotations

import json
import os

from .base import Callback


class RowLog(Callback):
    def __init__(self, folder: str, attempt: str | None, rank: int, world_size: int, round_: int | None = None):
        """round_: an elastic job's round (rank/elastic.py: a new one after each change of workers), in every
        line; None outside one."""
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"rows-{attempt or 'unknown'}-rank{rank}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")
        self._head = {"attempt": attempt, "rank": rank, "world_size": world_size}
        if round_ is not None:
            self._head["round"] = round_

    def after_backward(self, loop) -> None:
        line = self._head | {"step": loop.step + 1, "epoch": loop.epoch, "rows": loop.data.row_ids.tolist()}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def on_train_end(self, loop) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
