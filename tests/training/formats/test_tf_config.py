"""TF_CONFIG for each worker: one pure function, the same for the local launcher and for Kubernetes."""
import pytest

from ringflow.training.formats.tf_config import tf_config

HOSTS = ["127.0.0.1:20001", "127.0.0.1:20002", "127.0.0.1:20003"]


@pytest.mark.parametrize("hosts, index, expected", [
    (HOSTS, 0, {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 0}}),
    (HOSTS, 2, {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 2}}),
    (["w-0.svc:2222"], 0, {"cluster": {"worker": ["w-0.svc:2222"]}, "task": {"type": "worker", "index": 0}}),
])
def test_tf_config(hosts, index, expected):
    assert tf_config(hosts, index) == expected


def test_every_worker_gets_the_same_cluster_in_the_same_order():
    configs = [tf_config(HOSTS, i) for i in range(len(HOSTS))]
    assert all(c["cluster"] == {"worker": HOSTS} for c in configs)
    assert [c["task"]["index"] for c in configs] == [0, 1, 2]


@pytest.mark.parametrize("hosts, index, refused", [
    ([], 0, "no worker hosts"),
    (["127.0.0.1"], 0, "is not host:port"),
    (["127.0.0.1:0"], 0, "is not host:port"),
    (["127.0.0.1:x"], 0, "is not host:port"),
    (["127.0.0.1:1", "127.0.0.1:1"], 0, "repeat one"),
    (HOSTS, 3, "is not one of the 3 workers; use 0..2"),
    (HOSTS, -1, "is not one of the 3 workers"),
    (HOSTS, True, "is not one of the 3 workers"),
])
def test_bad_input_says_what_to_fix(hosts, index, refused):
    with pytest.raises(ValueError, match=refused):
        tf_config(hosts, index)
