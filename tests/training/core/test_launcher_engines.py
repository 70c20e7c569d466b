"""One code path picks the launcher: horovodrun for the Horovod engine, torchrun for DDP, and every rank is
told which engine its launcher was chosen for."""
import json
import socket

import pytest

from ringflow.training.core import launcher
from ringflow.training.rank.engines import ENGINE_ENV


def test_ddp_runs_under_torchrun_with_a_loopback_c10d_rendezvous():
    cmd = launcher.launch_command("ddp", "/j.json", 3, controller="mpi", python="/py")
    assert cmd[:3] == ["/py", "-m", "torch.distributed.run"]
    flags = dict(zip(cmd[3:-3:2], cmd[4:-3:2]))
    assert flags == {"--nnodes": "1", "--nproc-per-node": "3", "--rdzv-backend": "c10d",
                     "--rdzv-endpoint": flags["--rdzv-endpoint"], "--local-addr": "127.0.0.1", "--max-restarts": "0"}
    host, port = flags["--rdzv-endpoint"].split(":")
    assert host == "127.0.0.1" and 1024 <= int(port) < 65536
    assert cmd[-3:] == ["-m", "ringflow.training", "/j.json"]


def test_horovod_runs_under_horovodrun_with_its_controller():
    cmd = launcher.launch_command("horovod", "/j.json", 2, controller="gloo")
    assert cmd[0].endswith("horovodrun") and "--gloo" in cmd and cmd[-2:] == ["ringflow.training", "/j.json"]


def test_an_engine_without_a_local_launcher_here_is_refused_by_name_never_run_by_another():
    from ringflow.training.formats.engines import EngineError

    # TensorFlow's local launcher comes with its rank (branch wt/tf); until then, no horovodrun in its place.
    with pytest.raises(EngineError, match=r"engine 'tensorflow' has no local launcher.*'tf_config'.*TrainJob"):
        launcher.launch_command("tensorflow", "/j.json", 2)


def test_free_port_is_free():
    port = launcher.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # nobody holds it


class Started(Exception):
    pass


@pytest.mark.parametrize("config_engine, flag, expected", [
    (None, None, "horovod"), ("ddp", None, "ddp"), (None, "ddp", "ddp"), ("ddp", "horovod", "horovod")])
def test_run_local_starts_the_chosen_engine_and_tells_the_ranks(jobs, monkeypatch, config_engine, flag, expected):
    seen = {}

    def popen(command, env, **kwargs):
        seen.update(command=command, env=env)
        raise Started

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    cfg = jobs.config("choice") | ({"engine": config_engine} if config_engine else {})
    path = jobs.root / "choice.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(Started):
        launcher.run_local(str(path), 2, "gloo", engine=flag)
    assert seen["env"][ENGINE_ENV] == expected
    assert ("torch.distributed.run" in seen["command"]) == (expected == "ddp")
    assert seen["command"][-2:] == ["ringflow.training", str(path)]
