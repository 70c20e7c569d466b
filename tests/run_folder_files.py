"""A run folder's result and health records read, and a result or a checkpoint published, by a test that holds
only its store: each through the RunFolder, the one way a run is read or written (training/formats/
run_folder.py). They live here, not beside the formats, because only tests call them."""
from __future__ import annotations

from typing import Any

from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.formats.run_folder import Attempt, RunFolder
from ringflow.training.formats.run_result import RunResult
from ringflow.training.store.base import ObjectStore


def read_result(store: ObjectStore, attempt: str | None = None) -> RunResult | None:
    """The run folder's published result, if `attempt` wrote it (any attempt when None)."""
    return RunFolder(store).read_result(attempt)


def write_result(store: ObjectStore, result: RunResult) -> None:
    """`result` as the run folder's published result: an attempt of its own (`result.attempt`) claims the
    folder and publishes it."""
    RunFolder(store).claim(result.attempt).publish_result(result.to_json())


def current_attempt(store: ObjectStore, attempt_id: str = "a1") -> Attempt:
    """The run folder's current attempt, claimed by `attempt_id` when no attempt has claimed it yet (a test
    that writes several checkpoints into one run folder writes them all as one attempt)."""
    folder = RunFolder(store)
    pointer, etag = folder.pointer()
    return Attempt(folder, pointer.attempt, etag) if pointer is not None else folder.claim(attempt_id)


def publish_checkpoint(attempt: Attempt, step: int, files: dict[str, bytes], meta: dict[str, Any]) -> str:
    """A checkpoint of `files` written under `attempt` and published as the run's newest; its name."""
    name = CheckpointStore(attempt.store, keep_last=None).save(step, files, meta)
    attempt.publish_checkpoint(name, keep_last=None)
    return name


def read_health(store: ObjectStore) -> list[dict[str, Any]]:
    """All of the run's visible health records, in order."""
    return RunFolder(store).read_health()
