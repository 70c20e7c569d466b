"""One code path picks the launcher: horovodrun for the Horovod engine, torchrun for DDP, and every rank is
told which engine its launcher was chosen for."""
import json
import socket

import pytest

from ringflow.training.core import launcher
from ringflow.training.rank.engines import ENGINE_ENV


def test_ddp_runs_under_torchrun_with_a_loopback_c10d_rendezvous_and_forked_ranks():
    cmd = launcher.launch_command("ddp", "/j.json", 3, controller="mpi", python="/py")
    assert cmd[:4] == ["/py", "-u", "-m", "ringflow.training.rank.forked_torchrun"]
    flags = dict(zip(cmd[4:-7:2], cmd[5:-7:2]))
    assert flags == {"--nnodes": "1", "--nproc-per-node": "3", "--rdzv-backend": "c10d",
                     "--rdzv-endpoint": flags["--rdzv-endpoint"], "--local-addr": "127.0.0.1", "--max-restarts": "0"}
    host, port = flags["--rdzv-endpoint"].split(":")
    assert host == "127.0.0.1" and 1024 <= int(port) < 65536
    # each rank a fork of torchrun's process, running `-m ringflow.training CONFIG` there as python would
    assert cmd[-7:] == ["--run-path", "--start-method", "fork", str(launcher.FORKED_RANK), "-m", "ringflow.training",
                        "/j.json"]
    assert launcher.FORKED_RANK.is_file()


def test_an_elastic_ddp_job_is_restarted_by_torchrun_itself():
    cmd = launcher.torchrun_command("/j.json", 3, python="/py", restarts=launcher.DDP_ELASTIC_RESTARTS)
    flags = dict(zip(cmd[4:-7:2], cmd[5:-7:2]))
    assert flags["--max-restarts"] == str(launcher.DDP_ELASTIC_RESTARTS) and launcher.DDP_ELASTIC_RESTARTS > 0
    assert flags["--nnodes"] == "1"  # one agent for the host's workers: a restart brings back as many


def test_horovod_runs_under_horovodrun_with_its_controller():
    cmd = launcher.launch_command("horovod", "/j.json", 2, controller="gloo")
    assert cmd[0].endswith("horovodrun") and "--gloo" in cmd and cmd[-2:] == ["ringflow.training", "/j.json"]


def test_an_engine_without_a_local_launcher_here_is_refused_by_name_never_run_by_another(monkeypatch):
    import dataclasses

    from ringflow.training.formats import engines
    from ringflow.training.formats.engines import EngineError

    # TensorFlow has no launcher program: its workers are started one by one, never by horovodrun.
    with pytest.raises(ValueError, match=r"engine 'tensorflow' has no launcher program.*tf_worker_commands"):
        launcher.launch_command("tensorflow", "/j.json", 2)
    # An engine whose launcher this ringflow does not have is refused by name.
    other = dataclasses.replace(engines.TABLE["ddp"], name="jax", launcher="jaxrun")
    monkeypatch.setitem(engines.TABLE, "jax", other)
    with pytest.raises(EngineError, match=r"engine 'jax' has no local launcher.*'jaxrun'.*TrainJob") as err:
        launcher.launch_command("jax", "/j.json", 2)
    # The engines to use instead are the table's that run here: never the refused one.
    assert launcher.local_engines() == ("horovod", "ddp", "tensorflow")
    assert str(err.value).endswith('set engine to "horovod" or "ddp" or "tensorflow"')


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
    assert (launcher.FORKED_TORCHRUN in seen["command"]) == (expected == "ddp")
    assert seen["command"][-2:] == ["ringflow.training", str(path)]


def test_tensorflow_workers_each_get_their_tf_config_on_loopback_ports():
    commands = launcher.tf_worker_commands("/j.json", 2, "/tf/bin/python", ports=[20001, 20002])
    assert [argv for argv, _ in commands] == [["/tf/bin/python", "-m", "ringflow.training", "/j.json"]] * 2
    envs = [env for _, env in commands]
    assert [json.loads(env["TF_CONFIG"]) for env in envs] == [
        {"cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]}, "task": {"type": "worker", "index": i}}
        for i in (0, 1)]
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "2", "0", "2"), ("1", "2", "1", "2")]


def test_free_ports_are_distinct():
    ports = launcher.free_ports(4)
    assert len(set(ports)) == 4


def test_the_tensorflow_python_comes_from_the_environment_or_the_venv(tmp_path):
    python = tmp_path / "tf" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    assert launcher.tensorflow_python({"RINGFLOW_TF_PYTHON": str(python)}) == str(python)
    assert launcher.tensorflow_python({"RINGFLOW_TF_VENV": str(tmp_path / "tf")}) == str(python)
    with pytest.raises(FileNotFoundError, match="run scripts/setup.sh"):
        launcher.tensorflow_python({}, prefix=str(tmp_path / "nowhere"))


def test_a_missing_tf_venv_is_refused_in_one_line_before_anything_starts(jobs, monkeypatch, tmp_path):
    from ringflow.training.formats.engines import EngineError

    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may start"))
    monkeypatch.setenv("RINGFLOW_TF_PYTHON", str(tmp_path / "no-tf" / "bin" / "python"))
    path = jobs.root / "tf.json"
    path.write_text(json.dumps(jobs.config("tf") | {"engine": "tensorflow"}))
    with pytest.raises(EngineError, match="run scripts/setup.sh"):
        launcher.run_local(str(path), 2)
