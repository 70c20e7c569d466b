"""Bad configs fail before any process starts; the CLI says which field to fix."""
import json
import subprocess
import sys

import pytest

from ringflow.training.core import launcher
from ringflow.training.formats.config import ConfigError


@pytest.fixture
def no_processes(monkeypatch):
    started = []
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    return started


@pytest.mark.parametrize("change, field", [
    (lambda c: c.pop("run_uri"), "run_uri"),
    (lambda c: c.update(batch_size=-1), "batch_size"),
    (lambda c: c.update(model={"kind": "custom", "factory": "no_such_module_xyz:build"}), "model.factory"),
    (lambda c: c.update(model={"kind": "custom", "factory": "json:no_such_function"}), "model.factory"),
    (lambda c: c.update(manifest_uri="/nonexistent/manifest.json"), "manifest_uri"),
    (lambda c: c.update(batch_size=100000), "batch_size"),
])
def test_bad_config_fails_before_start(jobs, no_processes, change, field):
    cfg = jobs.config("bad")
    change(cfg)
    path = jobs.root / "bad.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        launcher.run_local(str(path), 2)
    assert err.value.field == field
    assert not no_processes
    assert not (jobs.root / "bad").exists()


def test_every_worker_needs_a_whole_micro_batch_of_the_shards(jobs, no_processes):
    path = jobs.root / "job.json"
    path.write_text(json.dumps(jobs.config("np3") | {"batch_size": 500}))
    with pytest.raises(ConfigError, match="3 workers x 500 rows exceeds the shards' 1408 training rows"):
        launcher.run_local(str(path), 3)


@pytest.mark.job
def test_cli_exit_code_and_message(jobs):
    path = jobs.root / "job.json"
    path.write_text(json.dumps(jobs.config("cli") | {"epochs": 0}))
    proc = subprocess.run([sys.executable, "-m", "ringflow.training.core.cli", "train", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "config field 'epochs'" in proc.stderr


def test_command_line(tmp_path):
    cmd = launcher.horovodrun_command("/j.json", 2, "mpi")
    assert cmd[1:7] == ["-np", "2", "-H", "localhost:2", "--mpi", sys.executable]
    assert cmd[-2:] == ["ringflow.training", "/j.json"]
    with pytest.raises(ValueError):
        launcher.horovodrun_command("/j.json", 2, "nccl")
