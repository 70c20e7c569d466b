"""What the train operator asks a backend to run: one data-parallel training job (any engine), described in plain JSON-able data."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from ...formats.engines import CONTROLLERS, DEFAULT_CONTROLLER

_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class JobSpecError(ValueError):
    """The job spec cannot be launched; the message says which field to fix."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A data-parallel training job.

    name: DNS-1123 label (lowercase, digits, '-', at most 63 chars): the MPIJob name, or the local run folder.
    config: the training job config (ringflow.training.formats.config.JobConfig as a dict): what every rank runs.
    num_workers: the world size: one rank per worker (a local process, an MPIJob worker pod, a TrainJob node).
    controller: "gloo" or "mpi" for local runs (default: the faster here, see bench/); MPIJobs always launch through mpirun.
    labels: identify the job for reattach: dag, run, task, try.
    env: extra environment for every rank. Never secrets: backends bring those from their own config.
    avoid_nodes: Kubernetes nodes the job's pods must not run on (a straggler's node, after a remedy:
      core/remediation.py); the Kubernetes backends make it node anti-affinity, the local backend has no nodes.
    """

    name: str
    config: dict[str, Any]
    num_workers: int
    controller: str = DEFAULT_CONTROLLER
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    avoid_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and len(self.name) <= 63 and _DNS_1123.match(self.name)):
            raise JobSpecError(
                f"job name {self.name!r} must be a DNS-1123 label: lowercase letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters"
            )
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise JobSpecError(f"num_workers is {self.num_workers!r}; set it to a whole number >= 1")
        if self.controller not in CONTROLLERS:
            raise JobSpecError(f"controller is {self.controller!r}; use one of {CONTROLLERS}")
        if not isinstance(self.config, dict):
            raise JobSpecError("config must be the training job config as a dict")
        if not all(isinstance(n, str) and n for n in self.avoid_nodes):
            raise JobSpecError(f"avoid_nodes is {self.avoid_nodes!r}; give node names (non-empty strings)")
        object.__setattr__(self, "avoid_nodes", tuple(self.avoid_nodes))
