"""The namespace hosts themselves: isolated as pods are, and gone without a trace when a test fails."""
from __future__ import annotations

import subprocess
import time

import pytest

from hosts import Cluster, sh

# own_lane: in the third lane (scripts/test.sh), before the real-size test, not beside the background lane's
# Airflow and TensorFlow tests: there, once, a retry's rank waited out start-up's 60 s in its rendezvous.
pytestmark = [pytest.mark.service, pytest.mark.background, pytest.mark.own_lane]


def _namespaces() -> set[str]:
    return {line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()}


def test_hosts_are_isolated_and_torn_down_when_a_test_fails(image_root, tmp_path):
    tmp_path.chmod(0o755)
    before = _namespaces()
    with pytest.raises(RuntimeError, match="the test failed"):
        with Cluster(image_root, tmp_path) as cluster:
            a, b = cluster.add_host("host-a"), cluster.add_host("host-b")
            made = _namespaces() - before
            assert made == {cluster.switch, a.netns, b.netns}
            # Own hostname, the image's user and files, and the other host by name over the link.
            out = a.run(["bash", "-c", "hostname; id -un; . /etc/os-release; echo $VERSION_CODENAME; "
                                       "getent hosts host-b"], timeout=60).stdout.split()
            assert out[:4] == ["host-a", "mpiuser", "bookworm", b.address]
            b.start(["sleep", "613"], tmp_path / "sleep.log")
            deadline = time.monotonic() + 20
            while not any(cmd.startswith("sleep 613") for cmd in b.process_names()):
                assert time.monotonic() < deadline, b.process_names()
                time.sleep(0.1)
            # A cut link partitions the hosts (a connect times out); back up, b answers (refuses port 9).
            b.set_link(False)
            assert a.run(["python", "-c", f"import socket; s=socket.socket(); s.settimeout(2); "
                                          f"print(s.connect_ex(('{b.address}', 9)))"], timeout=60).stdout.strip() != "111"
            b.set_link(True)
            # Back up, b answers once a's neighbour entry for it, failed while the link was cut, is probed
            # again: until then a connect ends "no route to host" (113), not refused (111).
            deadline = time.monotonic() + 30
            while (answer := a.run(["python", "-c", f"import socket; s=socket.socket(); s.settimeout(5); "
                                                    f"print(s.connect_ex(('{b.address}', 9)))"],
                                   timeout=60).stdout.strip()) != "111":
                assert answer == "113" and time.monotonic() < deadline, answer
                time.sleep(1)
            raise RuntimeError("the test failed")
    assert _namespaces() == before
    leftover = subprocess.run(["pgrep", "-f", "^sleep 613$"], capture_output=True, text=True).stdout.split()
    assert leftover == []
