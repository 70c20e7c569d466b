"""What state a training TrainJob is in, and why it failed, in the same words as for an MPIJob (mpijob_outcome.py).

One pure function over the TrainJob (its conditions, its engine annotation) and the pods of its JobSet (as
the API returns them). Kubeflow Trainer v2.3.0 sets only Suspended, Complete and Failed on a TrainJob (the
latter two copied from its JobSet; Failed also on DeadlineExceeded): there is no Running condition, so
running is read from the pods. The pods also say why: an OOM-killed node, an eviction, an image that cannot
be pulled, a rank that could not reach the others. A failed pod restarts the whole JobSet (the runtimes'
failurePolicy); its new pods carry the next `jobset.sigs.k8s.io/restart-attempt`.
"""
from __future__ import annotations

from typing import Any

from ..base import JobState, JobStatus
from . import labels as L
from .mpijob_outcome import (MPIJOB_ROLES, JobWords, PodRoles, ended, pod_name,
                                                           read_pods, restarting_in_place, tf_roles, torch_roles,
                                                           true_conditions, waiting_or_running)
from .jobset_names import TRAINER_PORT
from .trainjob import LAUNCHER, NODE, TORCH_MASTER_PORT
from ringflow.training.formats.engines import DEFAULT_ENGINE, TF_CONFIG_LAUNCHER, engine_spec

MPI_ROLES = PodRoles(role_label=L.REPLICATED_JOB_LABEL, launcher=LAUNCHER, workers=(NODE,),
                         unreachable_roles=(LAUNCHER,), unreachable=MPIJOB_ROLES.unreachable,
                         unreachable_advice="check that the node pods are Ready, that sshd runs on the image's port "
                                            "(the ringflow-horovod runtime's), and that no NetworkPolicy blocks "
                                            "pod-to-pod traffic")
TORCH_ROLES = torch_roles(L.REPLICATED_JOB_LABEL, NODE, TORCH_MASTER_PORT)
TF_ROLES = tf_roles(L.REPLICATED_JOB_LABEL, NODE, TRAINER_PORT)
# How to read the pods, by what starts the ranks in them (the engine table's pod_launcher).
ROLES = {"mpirun": MPI_ROLES, "torchrun": TORCH_ROLES, TF_CONFIG_LAUNCHER: TF_ROLES}
# Trainer says Complete where the MPI Operator says Succeeded; every pod of a TrainJob is a node.
TRAINJOB_WORDS = JobWords(kind="TrainJob", succeeded="Complete", failed_first="the job", rank_pod="node",
                          not_started="waiting for Kubeflow Trainer to start the job's pods")


def _roles(trainjob: dict[str, Any]) -> PodRoles:
    engine = ((trainjob.get("metadata") or {}).get("annotations") or {}).get(L.ENGINE_ANNOTATION, DEFAULT_ENGINE)
    return ROLES[engine_spec(engine).pod_launcher]


def _attempt(pod: dict[str, Any]) -> int:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(L.RESTART_ATTEMPT_LABEL) or "0"
    return int(value) if str(value).isdigit() else 0


def _phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _expected_nodes(trainjob: dict[str, Any]) -> int:
    return int(((trainjob.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)


def _ranks_running(pods: list[dict[str, Any]], roles: PodRoles, expected_nodes: int) -> bool:
    """Training has started: mpirun runs (it starts after every node is Ready), or every torchrun runs. A
    pod that already succeeded counts: the job is finishing, Trainer has not said Complete yet."""
    started = ("Running", "Succeeded")
    if roles.launcher:
        return any(roles.role(p) == roles.launcher and _phase(p) in started for p in pods)
    nodes = [p for p in pods if roles.role(p) in roles.workers]
    return len(nodes) >= expected_nodes and all(_phase(p) in started for p in nodes)


def outcome_from_trainjob(trainjob: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    """The state of a TrainJob: pending, running, restarting, succeeded or failed (with a reason to act on)."""
    roles = _roles(trainjob)
    conds = true_conditions(trainjob)
    restarts = max((_attempt(p) for p in pods), default=0)
    # Pods of an earlier attempt are on their way out; only the current attempt's say how it runs now.
    current = [p for p in pods if _attempt(p) == restarts]
    detail, exit_code, problem = read_pods(conds, pods, roles, **({"restarts": restarts} if restarts else {}))
    end = ended(conds, current, roles, TRAINJOB_WORDS, exit_code, problem, detail)
    if end:
        return end
    running = _ranks_running(current, roles, _expected_nodes(trainjob))
    failed_now = [pod_name(p) for p in current if _phase(p) == "Failed"]
    if failed_now or restarting_in_place(current, roles) or (restarts and not running):
        why = problem["reason"] if problem else (
            f"pod {', '.join(sorted(failed_now))} failed; the JobSet restarts every pod" if failed_now
            else f"every pod is being restarted (restart {restarts})")
        return JobStatus(JobState.RESTARTING, reason=why, detail=detail)
    return waiting_or_running(conds, running, current, roles, TRAINJOB_WORDS, problem, detail)
