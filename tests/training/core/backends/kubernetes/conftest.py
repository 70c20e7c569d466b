"""Fixtures for the Kubernetes backend tests: a kmock API emulator and settings that point at it."""
from __future__ import annotations

import pytest

from backend_checks import NS
from kmock_cluster import Cluster

IMAGE = "registry.example/ringflow-training:0.1.0"


@pytest.fixture
def cluster(tmp_path):
    """A fresh Kubernetes API emulator on 127.0.0.1 (the MPIJob, TrainJob, Pod and ConfigMap APIs) per test."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def settings_dict():
    return {"image": IMAGE, "namespace": NS, "s3_secret_name": "ringflow-minio",
            "s3_endpoint": "http://minio.ringflow:9000"}


@pytest.fixture
def backend(cluster, settings_dict):
    from ringflow.training.core.backends.kubernetes.mpijob_backend import MPIJobBackend

    # Tiny backoff and delete poll: retries and waits are tested for happening, not for their timing.
    return MPIJobBackend(settings_dict, kubeconfig_path=str(cluster.kubeconfig), backoff_s=0.01, delete_poll_s=0.05)


@pytest.fixture
def trainjob_backend(cluster, settings_dict):
    from ringflow.training.core.backends.kubernetes.trainjob_backend import TrainJobBackend

    return TrainJobBackend(settings_dict, kubeconfig_path=str(cluster.kubeconfig), backoff_s=0.01,
                           delete_poll_s=0.05)
