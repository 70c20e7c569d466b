"""A local elastic Horovod job's slots (core/elastic_hosts.py): a name of its own per worker, every name this
machine's loopback address (Horovod starts a worker without ssh when its host resolves to a local address, and
takes out a failed worker's host NAME), and the horovodrun command made elastic."""
import os
import socket
import subprocess

import pytest

from ringflow.training.core.elastic_hosts import elastic_command, slot_names, too_few_workers
from ringflow.training.formats.config import ElasticConfig
from ringflow.training.rank.worker_env import ELASTIC_SLOTS_ENV, elastic_slot


def test_each_slot_is_a_name_of_its_own_for_the_loopback_address():
    names = slot_names(6)
    assert len(set(names)) == 6 and names[0] == "127.0.0.1"
    assert {socket.gethostbyname(n) for n in names} == {"127.0.0.1"}


@pytest.mark.job  # runs the discovery script
@pytest.mark.parametrize("elastic, np_, expected", [
    (ElasticConfig(), 3, ["--min-np", "1", "--max-np", "3", "--elastic-timeout", "45"]),
    (ElasticConfig(min_workers=2, max_workers=4, rejoin_seconds=2.4, wait_seconds=5), 2,
     ["--min-np", "2", "--max-np", "4", "--elastic-timeout", "5", "--blacklist-cooldown-range", "2"]),
])
def test_horovodrun_is_made_elastic_on_gloo_with_the_discovery_script(tmp_path, elastic, np_, expected):
    plain = ["horovodrun", "-np", str(np_), "-H", f"localhost:{np_}", "--mpi", "python", "-m", "ringflow.training",
             "job.json"]
    command, env = elastic_command(plain, elastic, np_, str(tmp_path))
    assert command[:4] == ["horovodrun", "-np", str(np_), "--gloo"] and "-H" not in command and "--mpi" not in command
    assert command[-3:] == ["-m", "ringflow.training", "job.json"]
    for a, b in zip(expected[::2], expected[1::2]):
        assert command[command.index(a) + 1] == b
    assert command[command.index("--network-interface") + 1] == "lo"
    script = command[command.index("--host-discovery-script") + 1]
    listed = subprocess.run([script], capture_output=True, text=True, check=True).stdout.split()
    most = elastic.bounds(np_)[1]
    assert listed == [f"{n}:1" for n in slot_names(most)] and os.path.dirname(script) == str(tmp_path)
    assert env == {ELASTIC_SLOTS_ENV: ",".join(slot_names(most))}


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({ELASTIC_SLOTS_ENV: "127.0.0.1,127.0.1", "HOROVOD_HOSTNAME": "127.0.1"}, (1, 2)),
    ({ELASTIC_SLOTS_ENV: "127.0.0.1,127.0.1", "HOROVOD_HOSTNAME": "node-7"}, None),
])
def test_a_workers_place_on_this_machine_is_its_slots(environ, expected):
    assert elastic_slot(environ) == expected


@pytest.mark.parametrize("line, says", [
    ("horovod.runner.common.util.timeout.TimeoutException: Timed out waiting for {activity}. Please check that you "
     "have enough resources to run at least 2 Horovod processes. Timeout after 5 seconds.",
     "fewer workers than elastic.min_workers (2) stayed for elastic.wait_seconds (5 s)"),
    ("[0]<stdout>:[ringflow] step 40 loss 0.31", None),
    ("Timed out waiting for the rendezvous", None),
])
def test_the_drivers_word_that_too_few_workers_stayed_is_the_attempts_reason(line, says):
    reason = too_few_workers(line, ElasticConfig(min_workers=2, wait_seconds=5))
    assert reason == says if says is None else says in reason and "a retry resumes from the last checkpoint" in reason
