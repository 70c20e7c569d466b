"""2-process Horovod runs on CPU: learning and identical replicas, a plain mpirun's ranks.
(Kill-and-resume equality: test_resume.py; a truncated checkpoint skipped on resume:
rank/test_training_state.py, on the run that also skips a planted one.)"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.job


def test_loss_falls_and_replicas_stay_identical(jobs, uninterrupted):
    """On the shared plain run (tests/training/conftest.py), under Horovod's Gloo controller. Its MPI controller
    trains to the same parameters with identical replicas: test_resume.py, whose interrupted run uses it."""
    cfg, out = uninterrupted("horovod")
    assert [r["engine"] for r in jobs.health(cfg) if r["type"] == "start"] == ["horovod"]  # the default engine
    steps = [r for r in jobs.health(cfg) if r["type"] == "step"]
    assert len(steps) == 3 * 22
    first, last = sum(s["loss"] for s in steps[:5]) / 5, sum(s["loss"] for s in steps[-5:]) / 5
    assert last < first / 3, (first, last)
    checksums = [r["checksums"] for r in jobs.health(cfg) if r["type"] == "checksum"]
    assert checksums and all(len(c) == 2 and c[0] == c[1] for c in checksums)
    result = jobs.result(cfg)
    assert result.succeeded and result.world_size == 2
    assert result.samples_per_sec_after_warmup > 0  # both ranks' rows and times gathered after the closing barrier
    assert "step=10 epoch=1/3 loss=" in out and "samples/s=" in out


def test_plain_mpirun_ranks_take_the_horovod_knobs_from_the_config(jobs, tmp_path):
    """An MPIJob's launcher runs mpirun with only a few forwarded variables, not `ringflow train`'s
    environment: the rank itself must apply the config's Horovod/Open MPI settings. Health monitoring off."""
    seen = tmp_path / "rank-env"
    cfg = jobs.config("plain-mpirun", epochs=1, horovod={"cycle_time_ms": 3.0},
                      health={"enabled": False},
                      model={"kind": "custom", "factory": "env_recording_model:build", "kwargs": {"out": str(seen)}})
    path = tmp_path / "plain-mpirun.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_MCA_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    env.setdefault("LD_LIBRARY_PATH", "")  # forwarded with -x, so it must exist (the image sets it)
    # The launcher's own command line, from the MPIJob builder; only the hosts (the MPI Operator's hostfile
    # in a cluster) and the config's path (the ConfigMap's mount there) differ here.
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.mpijob import CONFIG_FILE, CONFIG_MOUNT_PATH, MPIJobSettings, mpirun_command

    command = mpirun_command(JobSpec(name="plain-mpirun", config=cfg, num_workers=2),
                             MPIJobSettings(image="local/ringflow-training:test", run_as_root=True,
                                            python=sys.executable))
    assert command[:3] == ["mpirun", "-np", "2"] and command[-1] == f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE}"
    command = command[:3] + ["-H", "localhost:2"] + command[3:-1] + [str(path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        knobs = json.loads((tmp_path / f"rank-env.{rank}").read_text())
        assert knobs["HOROVOD_CYCLE_TIME"] == "3.0" and knobs["OMPI_MCA_mpi_yield_when_idle"] == "1", knobs
    result = jobs.result(cfg)
    assert result.succeeded and result.verdict is None
    assert result.health_monitor_share_after_warmup == 0.0
    assert not [r for r in jobs.health(cfg) if r["type"] in ("step", "checksum")]
