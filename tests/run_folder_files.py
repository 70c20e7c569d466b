"""A run folder's result and health records read (and a result written) by a test that holds only its store:
each through the RunFolder, the one way a run is read or written (training/formats/run_folder.py). They live
here, not beside the formats, because only tests call them: the formats call the RunFolder itself."""
from __future__ import annotations

from typing import Any

from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.run_result import RunResult
from ringflow.training.store.base import ObjectStore


def read_result(store: ObjectStore, attempt: str | None = None) -> RunResult | None:
    """The run folder's published result, if `attempt` wrote it (any attempt when None)."""
    return RunFolder(store).read_result(attempt)


def write_result(store: ObjectStore, result: RunResult) -> None:
    """`result` as the run folder's published result."""
    RunFolder(store).write_result(result)


def read_health(store: ObjectStore) -> list[dict[str, Any]]:
    """All of the run's visible health records, in order."""
    return RunFolder(store).read_health()
