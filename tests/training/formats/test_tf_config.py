"""tf_config: the TF_CONFIG of one TensorFlow worker, over a table of clusters and indices, and the bad input
it refuses with what to give instead."""
import json

import pytest

from ringflow.training.formats.tf_config import TF_CONFIG_ENV, tf_config

HOSTS = ["127.0.0.1:41001", "127.0.0.1:41002", "127.0.0.1:41003"]
PODS = ["j-node-0-0.j:29500", "j-node-0-1.j:29500"]


@pytest.mark.parametrize("hosts, index, expected", [
    (["localhost:2222"], 0, {"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}}),
    (HOSTS, 0, {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 0}}),
    (HOSTS, 2, {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 2}}),
    (PODS, 1, {"cluster": {"worker": PODS}, "task": {"type": "worker", "index": 1}}),
    (["[::1]:41001", "[::1]:41002"], 1, {"cluster": {"worker": ["[::1]:41001", "[::1]:41002"]},
                                        "task": {"type": "worker", "index": 1}}),
])
def test_tf_config(hosts, index, expected):
    config = tf_config(hosts, index)
    assert config == expected
    assert json.loads(json.dumps(config)) == config  # what goes into the environment, as JSON


def test_every_worker_sees_the_same_cluster_and_only_its_index_differs():
    configs = [tf_config(HOSTS, i) for i in range(len(HOSTS))]
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert [c["task"]["index"] for c in configs] == [0, 1, 2]
    hosts = list(HOSTS)
    tf_config(hosts, 0)["cluster"]["worker"].append("x:1")
    assert hosts == HOSTS  # the caller's list is not shared with the result
    assert TF_CONFIG_ENV == "TF_CONFIG"


@pytest.mark.parametrize("hosts, index, message", [
    ([], 0, r"worker_hosts is \[\]; give one 'host:port' per worker, at least one"),
    (["j-node-0-0.j"], 0, "give one 'host:port' per worker"),
    (["j-node-0-0.j:port"], 0, "give one 'host:port' per worker"),
    (["j-node-0-0.j:0"], 0, "give one 'host:port' per worker"),
    ([":29500"], 0, "give one 'host:port' per worker"),
    (["a:1", "a:1"], 0, "names an address twice"),
    (HOSTS, 3, "index is 3; use the worker's position in worker_hosts, 0 to 2"),
    (HOSTS, -1, "index is -1"),
    (HOSTS, "0", "index is '0'"),
    (HOSTS, True, "index is True"),
])
def test_bad_input_says_what_to_give(hosts, index, message):
    with pytest.raises(ValueError, match=message):
        tf_config(hosts, index)
