"""After which steps every rank holds the same parameters: always under synchronous training, only at the
averages under post-local SGD (ddp.local_sgd). Pure decisions on step numbers, no torch.

Under local SGD the replicas differ between averages by design, so two things move to the steps where they
agree: the health monitor's checksum comparison (a healthy run is never called DIVERGED, and a replica
changed right after an average still is) and the checkpoint (rank 0's replica is then every rank's, so a
resume restarts every rank where it was).

Steps are the loop's: 1 is the first optimizer step. torch's PeriodicModelAverager(period=H, warmup_steps=W)
averages after the optimizer step when its own counter, which starts at 0 and counts the steps before this
one, is >= W and (counter - W) % H == 0: after steps W+1, W+1+H, W+1+2H, ... Steps 1..W all-reduce their
gradients (post_localSGD_hook), so every replica agrees after each of them. The engine also averages after
the last step, so the model a run ends with is the replicas' average whatever H divides.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReplicaSchedule:
    """period None: synchronous training, every step agrees. last_step: the run's last step (averaged)."""

    period: int | None = None
    warmup_steps: int = 0
    last_step: int | None = None

    def __post_init__(self) -> None:
        if self.period is not None and self.period < 1:
            raise ValueError(f"ReplicaSchedule.period is {self.period!r}; use a whole number >= 1, or None")
        if self.warmup_steps < 0:
            raise ValueError(f"ReplicaSchedule.warmup_steps is {self.warmup_steps!r}; use a whole number >= 0")

    @property
    def synchronous(self) -> bool:
        return self.period is None

    def averages_at(self, step: int) -> bool:
        """Whether torch's averager averages the parameters after `step` (never under synchronous training)."""
        return self.period is not None and step > self.warmup_steps and (step - 1 - self.warmup_steps) % self.period == 0

    def forced_average_at(self, step: int) -> bool:
        """Whether the engine averages after `step` itself: the last step, when torch's averager does not."""
        return self.period is not None and step == self.last_step and not self.averages_at(step)

    def agree_after(self, step: int) -> bool:
        """Whether every rank holds the same parameters after `step`'s optimizer step (and average)."""
        return (self.period is None or step <= self.warmup_steps or self.averages_at(step)
                or step == self.last_step)

    def previous_agreement(self, step: int) -> int:
        """The last step before `step` after which the replicas agreed (0: the start, where they do)."""
        if self.period is None or step <= self.warmup_steps + 1:
            return max(step - 1, 0)
        # The periodic averages are W+1+kH; the newest at or before step-1.
        k = (step - 2 - self.warmup_steps) // self.period
        return self.warmup_steps + 1 + k * self.period

    def due(self, step: int, every_steps: int) -> bool:
        """Whether something asked for every `every_steps` steps (a checksum comparison, a checkpoint) is due
        after `step`: at a step where the replicas agree, the first at or after each multiple of
        `every_steps`. Synchronous: step % every_steps == 0, as before."""
        return self.agree_after(step) and step // every_steps > self.previous_agreement(step) // every_steps


SYNCHRONOUS = ReplicaSchedule()
