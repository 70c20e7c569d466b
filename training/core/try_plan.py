"""What one try of a training job runs with: the task's own config, the injected faults of that try only, and
every change the remedies planned so far make (remediation.apply_remedies), with the nodes it keeps off and
how long it waits before it starts. The same for the train operator's `_start` and `ringflow train --retries`.

The remedies are a run folder's remedies.jsonl (`planned_remedies`, `record_remedy`): read only for a retry
under `remediation: "auto"`, since the run folder may not exist before the first try.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from ..formats.config import REMEDIATION_AUTO, JobConfig
from .remediation import PlannedRemedy, apply_remedies, avoided_nodes, taken_before, wait_before


def faults_on_try(cfg: JobConfig, try_number: int) -> JobConfig:
    """`cfg` with only the injected faults (tests only) of try `try_number` (`on_try`, the first by default): a
    retry resumes from the last checkpoint and shows the recovery instead of failing at the same step again,
    or meets the next fault of a chain."""
    return dataclasses.replace(cfg, faults=tuple(f for f in cfg.faults if f.on_try == try_number))


@dataclasses.dataclass(frozen=True)
class TryPlan:
    """Try `try_number`: the `config` it runs with, and the remedies planned up to it (`planned`, oldest first)."""

    try_number: int
    config: JobConfig
    planned: tuple[PlannedRemedy, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.try_number, int) or isinstance(self.try_number, bool) or self.try_number < 1:
            raise ValueError(f"try number {self.try_number!r}: tries count from 1")
        object.__setattr__(self, "planned", tuple(self.planned))

    @property
    def own(self) -> PlannedRemedy | None:
        """The remedy planned for this very try (it runs changed), None when it runs as the one before."""
        return next((p for p in taken_before(self.planned, self.try_number) if p.try_number == self.try_number),
                    None)

    @property
    def wait_seconds(self) -> float:
        return wait_before(self.planned, self.try_number)

    @property
    def avoid_nodes(self) -> tuple[str, ...]:
        return avoided_nodes(self.planned, self.try_number)


def plan_try(base: JobConfig, try_number: int,
             read_planned: Callable[[], Iterable[PlannedRemedy]] = tuple) -> TryPlan:
    """Try `try_number` of a job whose own config is `base`. read_planned: the remedies planned so far, asked
    for only by a retry under `remediation: "auto"`."""
    own = faults_on_try(base, try_number)
    if try_number <= 1 or own.remediation != REMEDIATION_AUTO:
        return TryPlan(try_number, own)
    planned = tuple(read_planned())
    return TryPlan(try_number, apply_remedies(own, planned, try_number) if planned else own, planned)


def planned_remedies(run: Any) -> list[PlannedRemedy]:
    """The remedies planned in run folder `run` (a RunFolder): its remedies.jsonl, oldest first."""
    return [PlannedRemedy.from_dict(d) for d in run.read_remedies()]


def record_remedy(run: Any, planned: PlannedRemedy) -> str:
    """Keep `planned` in run folder `run`'s remedies.jsonl for the try it is for; its URI."""
    return run.append_remedy(planned.to_dict())


def recorded(run: Any, planned: PlannedRemedy, warn: Callable[[str], None]) -> bool:
    """Whether `planned` is now in run folder `run`'s remedies.jsonl (the run's record of what its tries
    changed). When it cannot be written, `warn` is told why and the caller's next try runs unchanged: a change
    nobody could see would not be the run's."""
    try:
        record_remedy(run, planned)
    except Exception as exc:  # noqa: BLE001 - which errors a store raises is its own business
        warn(f"could not record the remedy for try {planned.try_number} in {getattr(run, 'uri', run)}: {exc}; "
             "the next try runs unchanged")
        return False
    return True
