"""`python -m ringflow.training.core.backends.kubernetes.tf_pod CONFIG`: what every node pod of a TensorFlow
TrainJob runs (the ringflow-tensorflow runtime): it works out the pod's TF_CONFIG, then becomes the rank.

Kubeflow Trainer v2.3.0 has no TensorFlow policy (its plain policy sets the node count and nothing else), so
the pod derives TF_CONFIG itself, from what Kubernetes, JobSet and the TrainJob give it:

- JOB_COMPLETION_INDEX, its index: the Job controller sets it in every pod of an Indexed Job, which JobSet's
  Jobs are (the runtime also says completionMode: Indexed);
- RINGFLOW_JOBSET_NAME, the JobSet's name: the runtime passes the pod's jobset-name label (downward API). It
  names the headless Service too, so every worker's DNS name follows from it (jobset_names.py);
- RINGFLOW_NUM_WORKERS, the node count: the TrainJob's env carries it (the builder writes the one number into
  both numNodes and this; no downward API field holds a Job's parallelism).

Python rather than shell in the runtime's YAML: one table-tested function builds every TF_CONFIG, the local
launcher's too (formats/tf_config.py), and a missing variable is named in the pod's termination message.
Imports nothing but the standard library and ringflow's formats: it runs in the TF venv, which has no torch
and no Kubernetes client.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from .jobset_names import NODE, TRAINER_PORT, pod_address
from ....formats import exit_codes
from ....formats.tf_config import TF_CONFIG_ENV, WORKER_ENV, tf_config, tf_worker_env

INDEX_ENV = "JOB_COMPLETION_INDEX"
JOBSET_ENV = "RINGFLOW_JOBSET_NAME"
NUM_WORKERS_ENV = "RINGFLOW_NUM_WORKERS"
# What the pod sets or is given; a TrainJob's own env must not set them (trainjob.RESERVED_ENV).
MANAGED_ENV = WORKER_ENV + (INDEX_ENV, JOBSET_ENV, NUM_WORKERS_ENV)


class PodEnvError(ValueError):
    """The pod lacks what TF_CONFIG is derived from; the message names the variable and who sets it."""


def _whole(environ: Mapping[str, str], name: str, who: str, minimum: int) -> int:
    value = environ.get(name, "")
    if not value.isdigit() or int(value) < minimum:
        raise PodEnvError(f"${name} is {value!r}, not a whole number >= {minimum}; {who}")
    return int(value)


def worker_hosts(jobset: str, num_workers: int) -> list[str]:
    """Every worker's address, in index order: node i of the JobSet, on Trainer's port."""
    return [f"{pod_address(jobset, NODE, i)}:{TRAINER_PORT}" for i in range(num_workers)]


def pod_workers(environ: Mapping[str, str]) -> tuple[list[str], int]:
    """Every worker's address and this pod's index, from its environment (see the module's docstring)."""
    num_workers = _whole(environ, NUM_WORKERS_ENV, "the TrainJob's env sets it (TrainJobBackend does)", 1)
    index = _whole(environ, INDEX_ENV, "the Job controller sets it in Indexed Jobs: run this in a pod of the "
                                       "ringflow-tensorflow runtime (kubectl apply -k deploy/trainer)", 0)
    jobset = environ.get(JOBSET_ENV, "")
    if not jobset:
        raise PodEnvError(f"${JOBSET_ENV} is empty; the ringflow-tensorflow runtime sets it from the pod's "
                          "jobset-name label: re-apply deploy/trainer")
    if index >= num_workers:
        raise PodEnvError(f"${INDEX_ENV} is {index} but ${NUM_WORKERS_ENV} is {num_workers}; the TrainJob's "
                          "numNodes and its env disagree: let TrainJobBackend write both")
    return worker_hosts(jobset, num_workers), index


def pod_tf_config(environ: Mapping[str, str]) -> dict:
    """This pod's TF_CONFIG."""
    return tf_config(*pod_workers(environ))


def pod_worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What this pod's worker is given (formats/tf_config.WORKER_ENV): its TF_CONFIG and rank variables, the
    only worker on its host (one worker per pod)."""
    hosts, index = pod_workers(environ)
    return tf_worker_env(hosts, index, 0, 1)


def rank_command(config_path: str) -> list[str]:
    """The rank, on this same interpreter (the TF venv's): the entry every launcher starts."""
    return [sys.executable, "-m", "ringflow.training", config_path]


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ringflow.training.core.backends.kubernetes.tf_pod JOB_CONFIG", file=sys.stderr)
        return exit_codes.CONFIG
    try:
        worker_env = pod_worker_env(environ)
    except ValueError as exc:  # PodEnvError, or tf_config's own
        print(f"[ringflow] cannot derive TF_CONFIG: {exc}", file=sys.stderr, flush=True)
        return exit_codes.CONFIG
    print(f"[ringflow] {TF_CONFIG_ENV}={worker_env[TF_CONFIG_ENV]}", file=sys.stderr, flush=True)
    command = rank_command(argv[0])
    # exec, not a child: the rank is the container's process, so the kubelet's SIGTERM reaches it directly
    # and its exit status is the container's, which the outcome reads (trainjob_outcome.py).
    os.execve(command[0], command, dict(environ) | worker_env)
    return exit_codes.ERROR  # not reached: execve returns only by raising


if __name__ == "__main__":
    sys.exit(main())
