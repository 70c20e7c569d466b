"""The local-process backend with real horovodrun jobs. A job that succeeds (found by its labels while it runs,
its log streamed from a cursor, its name launched once) and one that fails with its verdict's exit code and
reason: checked on the two jobs tests/operators/test_trigger.py::test_success_and_fatal_verdict runs through this
backend, not on two more."""
import json
from pathlib import Path

import pytest

from polling import wait_for
from ringflow.training.core.backends.base import JobNotFound, backend_from_dict
from ringflow.training.core.backends.job_spec import JobSpec, JobSpecError
from ringflow.training.core.backends.local import LocalProcessBackend, job_environment

pytestmark = pytest.mark.job


def spec(name, manifest, run_dir, **config):
    cfg = {"manifest_uri": manifest, "run_uri": str(run_dir), "epochs": 1, "log_every_steps": 5} | config
    return JobSpec(name=name, config=cfg, num_workers=2, labels={"dag": "d", "run": "r1", "task": "train"})


def processes_mentioning(text: str) -> list[str]:
    """Command lines (from /proc: ps truncates them) of live processes that mention `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in args and state != "Z":
            found.append(args)
    return found


def test_delete_leaves_no_process(tmp_path, digits_manifest):
    backend = LocalProcessBackend(work_dir=str(tmp_path / "jobs"), stop_grace_seconds=3)
    job_id = backend.launch(spec("rf-hang", digits_manifest, tmp_path / "run",
                                 faults=[{"kind": "hang", "rank": 1, "step": 2}]))
    job_dir = str(tmp_path / "jobs" / job_id)
    assert wait_for(lambda: len(processes_mentioning(job_dir)) >= 3, timeout=30), (backend.status(job_id), (tmp_path / "jobs" / job_id / "output.log").read_text()[-1500:])  # sh, cli, horovodrun, ranks
    backend.delete(job_id)
    assert wait_for(lambda: not processes_mentioning(job_dir), timeout=20), processes_mentioning(job_dir)
    assert backend.status(job_id).state == "failed"
    backend.delete(job_id)  # twice is fine
    backend.delete("rf-never-launched")


def test_unknown_job_and_round_trip(tmp_path):
    backend = LocalProcessBackend(work_dir=str(tmp_path))
    with pytest.raises(JobNotFound):
        backend.status("nope")
    rebuilt = backend_from_dict("local", json.loads(json.dumps(backend.to_dict())))
    assert rebuilt.to_dict() == backend.to_dict()
    with pytest.raises(ValueError, match="unknown backend kind"):
        backend_from_dict("slurm", {})


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "Bad_Name"}, "DNS-1123"),
    ({"num_workers": 0}, "num_workers"),
    ({"controller": "nccl"}, "controller"),
])
def test_job_spec_checks(kwargs, message):
    with pytest.raises(JobSpecError, match=message):
        JobSpec(**({"name": "ok", "config": {}, "num_workers": 2} | kwargs))


@pytest.mark.parametrize("worker, spec, s3, expected", [
    # Airflow's own settings and connections never reach a job; everything else is inherited.
    ({"PATH": "/bin", "AIRFLOW_HOME": "/a", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://u:pw@db/af",
      "AIRFLOW_CONN_RINGFLOW_S3": '{"password": "secret"}', "_AIRFLOW_PROCESS_CONTEXT": "x"}, {}, {},
     {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}),
    # The connection's S3 settings win over whatever the worker had; the spec's variables over the worker's.
    ({"AWS_ACCESS_KEY_ID": "worker-key", "OMP_NUM_THREADS": "8"}, {"OMP_NUM_THREADS": "1"},
     {"AWS_ACCESS_KEY_ID": "conn-key", "AWS_SECRET_ACCESS_KEY": "conn-secret"},
     {"AWS_ACCESS_KEY_ID": "conn-key", "AWS_SECRET_ACCESS_KEY": "conn-secret", "OMP_NUM_THREADS": "1",
      "PYTHONUNBUFFERED": "1"}),
])
def test_job_environment(worker, spec, s3, expected):
    assert job_environment(worker, spec, s3) == expected
