"""What state a training MPIJob is in, and why it failed, in words a person can act on.

One pure function over the MPIJob (its status conditions) and its pods (as the API returns them, as dicts).
The v2 MPI Operator only sets Created/Running/Succeeded/Failed (and Suspended); it never sets Restarting,
and its Failed reason is often just "BackoffLimitExceeded". The pods say more: an OOM-killed worker, an
eviction, an image that cannot be pulled, a launcher that could not reach the workers.

The pod readings, and how a job ends or waits (`read_pods`, `ended`, `waiting_or_running`), are shared with
the TrainJob's outcome (trainjob_outcome.py), through PodRoles: which label names a pod's role, and which
roles launch, host ranks, and show a rank that cannot reach the others; and JobWords: what the kind calls its
conditions and pods.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..base import JobState, JobStatus, exit_reason
from .labels import COMPLETION_INDEX_LABEL, JOB_ROLE_LABEL
from ....health.oom import KUBERNETES_OOMKILLED, MemoryEvidence, oom_verdict
from ....health.verdict import Verdict

# Messages of a pull that will never succeed by itself (wrong name or tag, no credentials).
_PULL_DEFINITIVE = re.compile(r"not found|manifest unknown|pull access denied|unauthorized|denied|invalid reference",
                              re.I)
# mpirun/ORTE/ssh errors: the launcher could not start ranks on the workers.
_UNREACHABLE = re.compile(
    r"ORTE was unable to reliably start|ORTE does not know how to route|daemon .*failed to start|"
    r"ssh: Could not resolve hostname|ssh: connect to host|Connection refused|Connection timed out|"
    r"Permission denied \(publickey|Host key verification failed|No route to host|"
    r"orted: command not found|remote daemon .* did not report back",
    re.I,
)


# torch.distributed/torchrun errors: a rank could not reach the rendezvous or the other ranks.
_TORCH_UNREACHABLE = re.compile(
    r"DistNetworkError|RendezvousTimeoutError|RendezvousConnectionError|client socket has timed out|"
    r"Connection refused|Connection reset by peer|No route to host|Name or service not known|"
    r"Temporary failure in name resolution|failed to connect",
    re.I,
)

# TensorFlow's gRPC errors: a worker could not reach the others (MultiWorkerMirroredStrategy's collectives).
_TF_UNREACHABLE = re.compile(
    r"UnavailableError|failed to connect to all addresses|DNS resolution failed|Connection refused|"
    r"Connection reset by peer|No route to host|Socket closed|Name or service not known",
    re.I,
)


@dataclasses.dataclass(frozen=True)
class PodRoles:
    """How to read a job kind's pods: which label names a pod's role, which role's exit code is the job's,
    which roles the start waits for, and where a rank that cannot reach the others shows.

    role_label: the pod label holding the role. launcher: the role whose exit code is the job's (mpirun's
    pod), or None when every rank's pod says it (torchrun on each node). workers: roles whose readiness the
    launch waits for. unreachable_roles/unreachable: whose termination messages to search, for what.
    unreachable_advice: what to check then.
    """

    role_label: str
    launcher: str | None
    workers: tuple[str, ...]
    unreachable_roles: tuple[str, ...]
    unreachable: re.Pattern
    unreachable_advice: str

    def role(self, pod: dict[str, Any]) -> str:
        return ((pod.get("metadata") or {}).get("labels") or {}).get(self.role_label, "")

    @property
    def exit_roles(self) -> tuple[str, ...]:
        return (self.launcher,) if self.launcher else self.workers


SSH_ADVICE = ("check that the worker pods are Ready, that sshd runs on the image's port, and that no "
              "NetworkPolicy blocks pod-to-pod traffic")
MPIJOB_ROLES = PodRoles(role_label=JOB_ROLE_LABEL, launcher="launcher", workers=("worker",),
                        unreachable_roles=("launcher",), unreachable=_UNREACHABLE, unreachable_advice=SSH_ADVICE)


def torch_roles(role_label: str, node: str, master_port: int) -> PodRoles:
    """Pods of a torchrun job: every node runs torchrun, node 0 hosts the rendezvous."""
    return PodRoles(role_label=role_label, launcher=None, workers=(node,), unreachable_roles=(node,),
                    unreachable=_TORCH_UNREACHABLE,
                    unreachable_advice=f"check that every node pod is Running, that node 0 accepts the rendezvous on "
                                       f"port {master_port}, and that no NetworkPolicy blocks pod-to-pod traffic")


def tf_roles(role_label: str, node: str, port: int) -> PodRoles:
    """Pods of a TensorFlow job: every node runs one worker, which talks to every other over gRPC."""
    return PodRoles(role_label=role_label, launcher=None, workers=(node,), unreachable_roles=(node,),
                    unreachable=_TF_UNREACHABLE,
                    unreachable_advice=f"check that every node pod is Running, that the workers accept connections "
                                       f"on port {port} (their TF_CONFIG's), and that no NetworkPolicy blocks "
                                       "pod-to-pod traffic")


def true_conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    conds = (job.get("status") or {}).get("conditions") or []
    return {c.get("type"): c for c in conds if c.get("status") == "True"}


def pod_name(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "?")


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])


def _terminations(pod: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """(terminated state, is_current) for each container: the current state and the one before a restart."""
    out = []
    for cs in _statuses(pod):
        current = (cs.get("state") or {}).get("terminated")
        if current:
            out.append((current, True))
        previous = (cs.get("lastState") or {}).get("terminated")
        if previous:
            out.append((previous, False))
    return out


def _memory_limit(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if limit:
            return str(limit)
    return None


_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?|k|m)?$")
_QUANTITY_UNITS = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(quantity: str) -> int | None:
    """A Kubernetes memory quantity ("512Mi", "1G", "1073741824") in bytes; None if it is not one."""
    match = _QUANTITY.match(quantity.strip())
    if not match or match.group(2) == "m":
        return None
    return int(float(match.group(1)) * _QUANTITY_UNITS[match.group(2)])


# The MPI Operator's and the Trainer's pods carry their index among their role's replicas.
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
_TRAILING_INDEX = re.compile(r"-(\d+)$")


def pod_rank(pod: dict[str, Any], roles: PodRoles) -> int | None:
    """The rank a rank-hosting pod runs (one rank per worker pod: mpijob.py's slotsPerWorker 1; a torchrun
    node of one process; a TensorFlow worker), from its Indexed Job's completion index (a TrainJob's JobSet
    pod), its replica-index label (an MPIJob's worker) or its name's trailing index; None for the launcher."""
    if roles.role(pod) not in roles.workers:
        return None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    # The completion index first: a JobSet pod has no replica-index label, and its name ends in a random
    # suffix (<jobset>-node-0-<i>-<rand5>) that can be all digits, so the name would give a wrong rank.
    index = labels.get(COMPLETION_INDEX_LABEL, labels.get(REPLICA_INDEX_LABEL))
    if index is None:
        match = _TRAILING_INDEX.search(pod_name(pod))
        index = match.group(1) if match else None
    return int(index) if index is not None and str(index).isdigit() else None


def oom_killed(pod: dict[str, Any], roles: PodRoles, term: dict[str, Any]) -> Verdict:
    """The OOM verdict of a pod whose container Kubernetes OOMKilled: its rank, its memory limit. The step
    is not the pod's to say: the trigger adds rank 0's last one (oom.with_step). The job's config is not
    known here, so the advice is in words."""
    limit = _memory_limit(pod)
    name, role = pod_name(pod), roles.role(pod) or "pod"
    evidence = MemoryEvidence(KUBERNETES_OOMKILLED, pod_rank(pod, roles), None, seen_by=f"Kubernetes ({role} {name} was OOMKilled)",
                              limit_bytes=quantity_bytes(limit) if limit else None,
                              limit_source=f"the pod's memory limit {limit}" if limit else None,
                              message=f"container terminated: OOMKilled, exit code {term.get('exitCode')}")
    return oom_verdict(evidence, None)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(cs.get("restartCount") or 0) for cs in _statuses(pod))


def _created(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("creationTimestamp") or ""


def launcher_retries(pods: list[dict[str, Any]], roles: PodRoles) -> int:
    launchers = [p for p in pods if roles.role(p) in roles.exit_roles]
    return sum((1 if (p.get("status") or {}).get("phase") == "Failed" else 0) + _restarts(p) for p in launchers)


def restarting_in_place(pods: list[dict[str, Any]], roles: PodRoles) -> bool:
    """Whether a launcher or worker is between a failure and its retry (not once it runs again)."""
    for pod in pods:
        if roles.role(pod) not in (*roles.exit_roles, *roles.workers):
            continue
        for cs in _statuses(pod):
            if int(cs.get("restartCount") or 0) > 0 and "running" not in (cs.get("state") or {}):
                return True
    if roles.launcher is None:
        return False
    launchers = sorted((p for p in pods if roles.role(p) == roles.launcher), key=_created)
    if not launchers:
        return False
    newest = (launchers[-1].get("status") or {}).get("phase")
    failed_before = any((p.get("status") or {}).get("phase") == "Failed" for p in launchers[:-1])
    # The launcher Job replaces a failed pod: the gap between the two, and the new pod's start, is a restart.
    return newest == "Failed" or (failed_before and newest in (None, "Pending"))


def rank_exit_code(pods: list[dict[str, Any]], roles: PodRoles) -> int | None:
    """The newest launcher's exit code; without a launcher (torchrun on every node), the first nonzero one of the
    rank pods', else the newest."""
    launchers = [p for p in pods if roles.role(p) in roles.exit_roles]
    codes = [int(term["exitCode"]) for pod in sorted(launchers, key=_created, reverse=True)
             for term, _current in _terminations(pod) if term.get("exitCode") is not None]
    if roles.launcher is None:
        return next((c for c in codes if c != 0), codes[0] if codes else None)
    return codes[0] if codes else None


def pod_problem(pods: list[dict[str, Any]], roles: PodRoles) -> dict[str, Any] | None:
    """The most actionable problem visible on the pods, or None. Keys: kind, pod, reason, final."""
    found: list[dict[str, Any]] = []
    for pod in pods:
        name, role = pod_name(pod), roles.role(pod)
        status = pod.get("status") or {}
        failed = status.get("phase") == "Failed"
        if status.get("reason") == "Evicted":
            found.append({
                "kind": "evicted", "pod": name, "final": True,
                "reason": f"{role or 'pod'} {name} was evicted: {status.get('message') or 'node under pressure'}; "
                          "give the pods memory/ephemeral-storage requests that match their use, or use nodes "
                          "with more room",
            })
        for term, current in _terminations(pod):
            if term.get("reason") == "OOMKilled":
                verdict = oom_killed(pod, roles, term)
                found.append({"kind": "oom_killed", "pod": name, "final": failed and current,
                              "reason": verdict.reason, "verdict": verdict})
            elif role in roles.unreachable_roles and roles.unreachable.search(term.get("message") or ""):
                message = term.get("message") or ""
                lines = [ln.strip() for ln in message.splitlines() if roles.unreachable.search(ln)]
                others = "the workers" if roles.launcher else "the other ranks"
                found.append({
                    "kind": "unreachable_workers", "pod": name, "final": False,
                    "reason": f"{role} {name} could not reach {others} ({' / '.join(lines[:2])[:300]}); "
                              f"{roles.unreachable_advice}",
                })
        for cs in _statuses(pod):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            why = waiting.get("reason")
            if why in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                message = waiting.get("message") or ""
                image = cs.get("image") or _container_image(pod, cs.get("name"))
                found.append({
                    "kind": "image_pull", "pod": name,
                    "final": why == "InvalidImageName" or bool(_PULL_DEFINITIVE.search(message)),
                    "reason": f"cannot pull image {image} for {role or 'pod'} {name} ({why}: {message[:200]}); "
                              "check the image name and tag, and the image_pull_secrets",
                })
            elif why == "CreateContainerConfigError":
                found.append({
                    "kind": "config_error", "pod": name, "final": False,
                    "reason": f"{role or 'pod'} {name} cannot start: {waiting.get('message') or why}; check that "
                              "the Secret (s3_secret_name) and the ConfigMap exist in the job's namespace",
                })
    order = {"oom_killed": 0, "evicted": 1, "image_pull": 2, "config_error": 3, "unreachable_workers": 4}
    found.sort(key=lambda p: (not p["final"], order[p["kind"]]))
    return found[0] if found else None


def _container_image(pod: dict[str, Any], container: str | None) -> str:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return c.get("image", "?")
    return "?"


def workers_not_ready(pods: list[dict[str, Any]], roles: PodRoles) -> list[str]:
    out = []
    for pod in pods:
        if roles.role(pod) not in roles.workers:
            continue
        conds = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        if conds.get("Ready") != "True":
            out.append(pod_name(pod))
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class JobWords:
    """How a job kind's outcome names things, so that both kinds say the same thing in their own words.

    kind: "MPIJob". succeeded: the condition that says the job succeeded. failed_first: who fails first when
    ranks are not Ready ("the launcher"). rank_pod: what a pod that hosts ranks is called ("worker").
    not_started: the reason while nothing is known yet (no pods, no problem).
    """

    kind: str
    succeeded: str
    failed_first: str
    rank_pod: str
    not_started: str

    @property
    def end_conditions(self) -> tuple[str, ...]:
        """The conditions after which the job never runs again."""
        return (self.succeeded, "Failed")


MPIJOB_WORDS = JobWords(kind="MPIJob", succeeded="Succeeded", failed_first="the launcher", rank_pod="worker",
                        not_started="waiting for the MPI Operator to start the job")


def read_pods(conds: dict[str, dict[str, Any]], pods: list[dict[str, Any]], roles: PodRoles,
              **more: Any) -> tuple[dict[str, Any], int | None, dict[str, Any] | None]:
    """What every status says about the pods: its detail (the conditions, each pod's phase, `more`, the
    problem and its pod), the ranks' exit code, and the most actionable problem."""
    detail: dict[str, Any] = {
        "conditions": sorted(conds),
        "pods": {pod_name(p): (p.get("status") or {}).get("phase", "Unknown") for p in pods},
        **more,
    }
    problem = pod_problem(pods, roles)
    if problem:
        detail.update(problem=problem["kind"], pod=problem["pod"])
    return detail, rank_exit_code(pods, roles), problem


def ended(conds: dict[str, dict[str, Any]], rank_pods: list[dict[str, Any]], roles: PodRoles, words: JobWords,
          exit_code: int | None, problem: dict[str, Any] | None, detail: dict[str, Any]) -> JobStatus | None:
    """The job's end: its success or failure condition, or a pod problem that cannot recover; None while it
    can still run. rank_pods: the pods whose readiness explains a failure (for a TrainJob, its current attempt's).
    """
    if words.succeeded in conds:
        return JobStatus(JobState.SUCCEEDED, reason=conds[words.succeeded].get("message", ""), exit_code=0, detail=detail)
    if "Failed" in conds:
        cond = conds["Failed"]
        said = f"{words.kind} failed: {cond.get('reason') or 'unknown'}: {cond.get('message') or ''}".strip(": ")
        if exit_code is not None:
            # mpirun and torchrun report any rank's failure as 1; the job's own RunResult, which the trigger
            # reads from the run folder, says which failure it was.
            said += f" ({'launcher' if roles.launcher else 'rank'} exit code {exit_code}: {exit_reason(exit_code)})"
        if problem is None:
            not_ready = workers_not_ready(rank_pods, roles)
            if not_ready and (exit_code or 0) != 0:
                problem = {"reason": f"{words.failed_first} failed while {words.rank_pod}s {', '.join(not_ready)} "
                                     f"were not Ready; check the {words.rank_pod} pods' events"}
        reason = f"{problem['reason']} ({said})" if problem else said
        return JobStatus(JobState.FAILED, reason=reason, exit_code=exit_code, detail=detail,
                         verdict=problem.get("verdict") if problem else None)
    if problem and problem["final"]:
        # The operator has not given up yet, but this cannot recover: a failed pod is not recreated, the
        # memory stays too small, a missing image stays missing.
        return JobStatus(JobState.FAILED, reason=problem["reason"], exit_code=exit_code, detail=detail,
                         verdict=problem.get("verdict"))
    return None


def waiting_or_running(conds: dict[str, dict[str, Any]], running: bool, rank_pods: list[dict[str, Any]],
                       roles: PodRoles, words: JobWords, problem: dict[str, Any] | None,
                       detail: dict[str, Any]) -> JobStatus:
    """A job that has not ended and is not restarting: suspended, running (as the kind tells), or pending with
    what it waits for."""
    if "Suspended" in conds:
        return JobStatus(JobState.PENDING, reason=f"the {words.kind} is suspended", detail=detail)
    if running:
        return JobStatus(JobState.RUNNING, detail=detail)
    if problem:
        return JobStatus(JobState.PENDING, reason=problem["reason"], detail=detail)
    not_ready = workers_not_ready(rank_pods, roles)
    if not_ready:
        return JobStatus(JobState.PENDING, reason=f"waiting for {words.rank_pod}s to be Ready: {', '.join(not_ready)}",
                         detail=detail)
    return JobStatus(JobState.PENDING, reason=words.not_started, detail=detail)


def outcome_from_status(mpijob: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    """The state of an MPIJob: pending, running, restarting, succeeded or failed (with a reason to act on)."""
    conds = true_conditions(mpijob)
    detail, exit_code, problem = read_pods(conds, pods, MPIJOB_ROLES)
    end = ended(conds, pods, MPIJOB_ROLES, MPIJOB_WORDS, exit_code, problem, detail)
    if end:
        return end
    retries = launcher_retries(pods, MPIJOB_ROLES)
    if retries:
        detail["launcher_retries"] = retries
    if restarting_in_place(pods, MPIJOB_ROLES):
        why = problem["reason"] if problem else "the launcher failed and is being retried"
        return JobStatus(JobState.RESTARTING, reason=why, detail=detail)
    return waiting_or_running(conds, "Running" in conds, pods, MPIJOB_ROLES, MPIJOB_WORDS, problem, detail)
