"""A remedy's avoided nodes (a straggler's node, core/remediation.py) in the generated MPIJob and TrainJob:
required node anti-affinity on every pod that hosts a rank, beside the placement, strict-valid against the
CRD schemas; and the rank's node from the downward API where the rank reads it."""
from __future__ import annotations

import pytest

import strict_schema
from test_mpijob_manifest import CASES as MPIJOB_CASES, spec
from test_trainjob_manifest import CASES as TRAINJOB_CASES, _patched_pods
from ringflow.training.core.backends.job_spec import JobSpecError
from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings, build_mpijob
from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings
from ringflow.training.core.backends.kubernetes.trainjob import build_trainjob
from ringflow.training.rank.worker_env import NODE_NAME_ENV

AVOID = ("node-a", "node-b")
NOT_ON_THEM = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(AVOID)}]}]}}


@pytest.mark.parametrize("name", sorted(MPIJOB_CASES))
def test_mpijob_workers_keep_off_the_avoided_nodes(name):
    _, settings = MPIJOB_CASES[name]
    job = build_mpijob(spec(avoid_nodes=AVOID), MPIJobSettings.from_dict(settings))
    strict_schema.assert_valid(job)
    specs = job["spec"]["mpiReplicaSpecs"]
    worker = specs["Worker"]["template"]["spec"]["affinity"]
    assert worker["nodeAffinity"] == NOT_ON_THEM
    assert "podAffinity" in worker or "podAntiAffinity" in worker  # the placement stays
    # without avoided nodes, no node affinity at all
    plain = build_mpijob(spec(), MPIJobSettings.from_dict(settings))
    assert "nodeAffinity" not in plain["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]


@pytest.mark.parametrize("name", sorted(TRAINJOB_CASES))
def test_every_trainjob_pod_keeps_off_the_avoided_nodes_and_knows_its_node(name):
    job_spec, settings = TRAINJOB_CASES[name]
    tj = build_trainjob(spec(config=job_spec.config, num_workers=job_spec.num_workers, avoid_nodes=AVOID),
                        TrainJobSettings.from_dict(settings))
    strict_schema.assert_valid(tj)
    pods = _patched_pods(tj)
    assert pods and all(p["spec"]["affinity"]["nodeAffinity"] == NOT_ON_THEM for p in pods.values())
    env = {e["name"]: e for e in tj["spec"]["trainer"]["env"]}
    assert env[NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_an_avoided_node_must_be_named():
    with pytest.raises(JobSpecError, match="avoid_nodes"):
        spec(avoid_nodes=("",))
