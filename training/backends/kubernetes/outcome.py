"""What state a training MPIJob is in, and why it failed, in words a person can act on.

One pure function over the MPIJob (its status conditions) and its pods (as the API returns them, as dicts).
The v2 MPI Operator only sets Created/Running/Succeeded/Failed (and Suspended); it never sets Restarting,
and its Failed reason is often just "BackoffLimitExceeded". The pods say more: an OOM-killed worker, an
eviction, an image that cannot be pulled, a launcher that could not reach the workers.
"""
from __future__ import annotations

import re
from typing import Any

from ringflow.training.backends.base import (FAILED, PENDING, RESTARTING, RUNNING, SUCCEEDED, JobStatus,
                                              exit_reason)
from ringflow.training.backends.kubernetes.labels import JOB_ROLE_LABEL

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


def _conditions(mpijob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    conds = (mpijob.get("status") or {}).get("conditions") or []
    return {c.get("type"): c for c in conds if c.get("status") == "True"}


def _role(pod: dict[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_ROLE_LABEL, "")


def _name(pod: dict[str, Any]) -> str:
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


def _memory_limit(pod: dict[str, Any]) -> str:
    for c in (pod.get("spec") or {}).get("containers") or []:
        limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if limit:
            return f" (memory limit {limit})"
    return ""


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(cs.get("restartCount") or 0) for cs in _statuses(pod))


def _created(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("creationTimestamp") or ""


def _launcher_retries(pods: list[dict[str, Any]]) -> int:
    launchers = [p for p in pods if _role(p) == "launcher"]
    return sum((1 if (p.get("status") or {}).get("phase") == "Failed" else 0) + _restarts(p) for p in launchers)


def _restarting(pods: list[dict[str, Any]]) -> bool:
    """Whether a launcher or worker is between a failure and its retry (not once it runs again)."""
    for pod in pods:
        if _role(pod) not in ("launcher", "worker"):
            continue
        for cs in _statuses(pod):
            if int(cs.get("restartCount") or 0) > 0 and "running" not in (cs.get("state") or {}):
                return True
    launchers = sorted((p for p in pods if _role(p) == "launcher"), key=_created)
    if not launchers:
        return False
    newest = (launchers[-1].get("status") or {}).get("phase")
    failed_before = any((p.get("status") or {}).get("phase") == "Failed" for p in launchers[:-1])
    # The launcher Job replaces a failed pod: the gap between the two, and the new pod's start, is a restart.
    return newest == "Failed" or (failed_before and newest in (None, "Pending"))


def _launcher_exit_code(pods: list[dict[str, Any]]) -> int | None:
    launchers = [p for p in pods if _role(p) == "launcher"]
    for pod in sorted(launchers, key=_created, reverse=True):
        for term, _current in _terminations(pod):
            if term.get("exitCode") is not None:
                return int(term["exitCode"])
    return None


def _problem(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The most actionable problem visible on the pods, or None. Keys: kind, pod, reason, final."""
    found: list[dict[str, Any]] = []
    for pod in pods:
        name, role = _name(pod), _role(pod)
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
                found.append({
                    "kind": "oom_killed", "pod": name, "final": failed and current,
                    "reason": f"{role or 'pod'} {name} was OOMKilled{_memory_limit(pod)}; use a smaller per-worker "
                              "batch size (or fewer slots per worker), or raise the worker memory",
                })
            elif role == "launcher" and _UNREACHABLE.search(term.get("message") or ""):
                lines = [ln.strip() for ln in (term.get("message") or "").splitlines() if _UNREACHABLE.search(ln)]
                found.append({
                    "kind": "unreachable_workers", "pod": name, "final": False,
                    "reason": f"launcher {name} could not reach the workers ({' / '.join(lines[:2])[:300]}); check that the "
                              "worker pods are Ready, that sshd runs on the image's port, and that no "
                              "NetworkPolicy blocks pod-to-pod traffic",
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


def _workers_not_ready(pods: list[dict[str, Any]]) -> list[str]:
    out = []
    for pod in pods:
        if _role(pod) != "worker":
            continue
        conds = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        if conds.get("Ready") != "True":
            out.append(_name(pod))
    return sorted(out)


def outcome_from_status(mpijob: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    """The state of an MPIJob: pending, running, restarting, succeeded or failed (with a reason to act on)."""
    conds = _conditions(mpijob)
    detail: dict[str, Any] = {
        "conditions": sorted(conds),
        "pods": {_name(p): (p.get("status") or {}).get("phase", "Unknown") for p in pods},
    }
    exit_code = _launcher_exit_code(pods)
    problem = _problem(pods)
    if problem:
        detail.update(problem=problem["kind"], pod=problem["pod"])

    if "Succeeded" in conds:
        return JobStatus(SUCCEEDED, reason=conds["Succeeded"].get("message", ""), exit_code=0, detail=detail)
    if "Failed" in conds:
        cond = conds["Failed"]
        said = f"MPIJob failed: {cond.get('reason') or 'unknown'}: {cond.get('message') or ''}".strip(": ")
        if exit_code is not None:
            # mpirun reports any rank's failure as 1; the job's own RunResult, which the trigger attaches
            # (backends.base.with_result), says which failure it was.
            said += f" (launcher exit code {exit_code}: {exit_reason(exit_code)})"
        if problem is None:
            not_ready = _workers_not_ready(pods)
            if not_ready and (exit_code or 0) != 0:
                problem = {"reason": f"the launcher failed while workers {', '.join(not_ready)} were not Ready; "
                                     "check the worker pods' events"}
        reason = f"{problem['reason']} ({said})" if problem else said
        return JobStatus(FAILED, reason=reason, exit_code=exit_code, detail=detail)

    if problem and problem["final"]:
        # The operator has not given up yet, but this cannot recover: a failed worker pod is never recreated,
        # and a missing image stays missing.
        return JobStatus(FAILED, reason=problem["reason"], exit_code=exit_code, detail=detail)
    retries = _launcher_retries(pods)
    if retries:
        detail["launcher_retries"] = retries
    if _restarting(pods):
        why = problem["reason"] if problem else "the launcher failed and is being retried"
        return JobStatus(RESTARTING, reason=why, detail=detail)
    if "Suspended" in conds:
        return JobStatus(PENDING, reason="the MPIJob is suspended", detail=detail)
    if "Running" in conds:
        return JobStatus(RUNNING, detail=detail)
    if problem:
        return JobStatus(PENDING, reason=problem["reason"], detail=detail)
    not_ready = _workers_not_ready(pods)
    if not_ready:
        return JobStatus(PENDING, reason=f"waiting for workers to be Ready: {', '.join(not_ready)}", detail=detail)
    return JobStatus(PENDING, reason="waiting for the MPI Operator to start the job", detail=detail)
