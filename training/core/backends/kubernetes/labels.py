"""Kubernetes labels for ringflow jobs: the same mapping on launch and on find(), so reattach works.

Airflow ids (run ids such as "scheduled__2024-01-01T00:00:00+00:00") are not valid label values, so
values are sanitized; a value that had to change gets a short hash suffix, so two different run ids
can never map to the same label and make find() reattach to the wrong job. The exact original values
travel in an annotation, which find() compares as well.
"""
from __future__ import annotations

import hashlib
import json
import re

MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = "ringflow"
# Our keys get a prefix so they cannot collide with labels of other tools (e.g. Airflow's own pods).
PREFIX = "ringflow/"
ORIGINAL_LABELS_ANNOTATION = "ringflow/labels"
# Set by the MPI Operator on every pod of an MPIJob (kubeflow/mpi-operator v2beta1 constants.go).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# Set by the JobSet controller on every pod of a TrainJob's JobSet (named like the TrainJob; sigs.k8s.io/jobset
# constants.go), and by the Job controller (the index of an Indexed Job's pod).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Which engine a TrainJob runs (formats/engines.py: ENGINES): how to read its pods, without asking for its runtime.
ENGINE_ANNOTATION = "ringflow/engine"

_VALUE_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_OK = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def label_value(value: str) -> str:
    """A valid label value (at most 63 characters) that is unique for each distinct input."""
    value = str(value)
    if len(value) <= 63 and _VALUE_OK.match(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "_", value)[:54].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def label_key(key: str) -> str:
    if not (isinstance(key, str) and len(key) <= 63 and _NAME_OK.match(key)):
        raise ValueError(
            f"label key {key!r} must be letters, digits, '-', '_' or '.', start and end with a letter or digit, "
            "at most 63 characters"
        )
    return PREFIX + key


def job_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels for the MPIJob, its pods and its ConfigMap."""
    out = {label_key(k): label_value(v) for k, v in sorted(labels.items())}
    out[MANAGED_BY_KEY] = MANAGED_BY
    return out


def original_labels_annotation(labels: dict[str, str]) -> str:
    return json.dumps({str(k): str(v) for k, v in labels.items()}, sort_keys=True)


def selector(labels: dict[str, str]) -> str:
    """A label selector (equality-based) for `job_labels(labels)`."""
    return ",".join(f"{k}={v}" for k, v in sorted(job_labels(labels).items()))


def carries(obj: dict, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes object carries all these (ringflow) labels, with their exact original values."""
    meta = obj.get("metadata") or {}
    have = meta.get("labels") or {}
    if any(have.get(k) != v for k, v in job_labels(labels).items()):
        return False
    try:
        original = json.loads((meta.get("annotations") or {}).get(ORIGINAL_LABELS_ANNOTATION, "{}"))
    except ValueError:
        return False
    return all(original.get(str(k)) == str(v) for k, v in labels.items())
