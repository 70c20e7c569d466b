"""What a deleted job's wait names as still there (cluster_job.still_there), and the wait's settings."""
import pytest

from ringflow.training.core.backends.kubernetes.mpijob_backend import MPIJobBackend
from ringflow.training.core.backends.kubernetes.cluster_job import still_there

DELETING = {"metadata": {"name": "j", "deletionTimestamp": "2030-01-01T00:00:00Z",
                         "finalizers": ["foregroundDeletion"]}}
TERMINATING = {"metadata": {"name": "j-worker-0", "deletionTimestamp": "2030-01-01T00:00:01Z"},
               "spec": {"nodeName": "node-3"}, "status": {"phase": "Running"}}
PENDING = {"metadata": {"name": "j-launcher-0"}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize("job, pods, expected", [
    (None, [], []),
    (DELETING, [], ["MPIJob ns/j (deleting since 2030-01-01T00:00:00Z, finalizers ['foregroundDeletion'])"]),
    ({"metadata": {"name": "j"}}, [], ["MPIJob ns/j (not being deleted)"]),
    (None, [TERMINATING, PENDING], ["pod ns/j-worker-0 (Running, terminating since 2030-01-01T00:00:01Z, on node "
                                    "node-3)", "pod ns/j-launcher-0 (Pending)"]),
    (None, [{"metadata": {"name": "p"}}], ["pod ns/p (no phase)"]),
])
def test_still_there(job, pods, expected):
    assert still_there("MPIJob", "ns", "j", job, pods) == expected


@pytest.mark.parametrize("kwargs", [{"delete_timeout_s": -1}, {"delete_poll_s": 0}])
def test_wait_settings_are_checked(kwargs):
    with pytest.raises(ValueError, match="delete_timeout_s .* delete_poll_s .*: use seconds"):
        MPIJobBackend({"image": "registry.example/ringflow-training:0.1.0"}, **kwargs)
