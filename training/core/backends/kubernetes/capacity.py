"""How many workers a Kubernetes cluster can place now: its Ready, schedulable nodes that the job's node
selector picks and whose taints it tolerates, one worker per node (a training worker asks for a node's worth
of CPUs or a GPU, and two on one node would share its cores or its accelerator). Pure: the node objects as
the API lists them, in; a count, out. What the operator's `min_workers` compares against (core/worker_count.py).

Not the scheduler: a node's free resources are not looked at (the pods of other tenants come and go), so this
is the count of nodes the job could land on, an upper bound the launch may still wait on.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

# Taints that keep a pod off a node unless tolerated; PreferNoSchedule only discourages.
_REPELLING = ("NoSchedule", "NoExecute")


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' matching rule: the effect (empty: any), then Exists (any value; no key: any taint) or Equal."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")


def placeable(node: Mapping[str, Any], node_selector: Mapping[str, str],
              tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a worker pod of these settings could be scheduled there now."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or not is_ready(node):
        return False
    if any(labels.get(k) != v for k, v in node_selector.items()):
        return False
    return all(any(_tolerates(t, taint) for t in tolerations)
               for taint in spec.get("taints") or () if taint.get("effect") in _REPELLING)


def worker_capacity(nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str],
                    tolerations: Sequence[Mapping[str, Any]], avoid_nodes: Sequence[str] = ()) -> int:
    """Workers placeable now: one per Ready, schedulable node the job may use, less the nodes a remedy keeps
    it off (the job's required node anti-affinity, remediation.AVOID_NODE)."""
    return sum(placeable(n, node_selector, tolerations) and (n.get("metadata") or {}).get("name") not in avoid_nodes
               for n in nodes)
