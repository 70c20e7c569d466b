"""What a local job's folder and live processes say of it (local.local_job_status), and the backend's checks
of its own settings."""
import pytest

from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.local import LocalProcessBackend, local_job_status
from ringflow.training.core.backends.processes.proc import Process

RANK = Process(pid=4242, start=1, ppid=1, state="T", name="python", command="python -m ringflow.training job.json")


@pytest.mark.parametrize("exit_code, deleted, alive, state, reason, code", [
    (None, False, [RANK], "running", "", None),
    # Never finished while a process of the job lives, whatever the folder says.
    (0, False, [RANK], "running", "the job ended (succeeded), but 1 of its processes are still alive: pid 4242 "
                                  "(T stopped) python -m ringflow.training job.json", None),
    (None, True, [RANK], "running", "stopping on request, but 1 of its processes are still alive: pid 4242", None),
    (0, False, [], "succeeded", "", 0),
    (0, True, [], "succeeded", "", 0),  # it had ended well before the stop came
    (5, False, [], "failed", "health verdict STALLED", 5),
    (143, True, [], "failed", "stopped on request", 143),
    (None, True, [], "failed", "stopped on request", None),
    (None, False, [], "failed", "the job's processes are gone without an exit status", None),
])
def test_local_job_status(exit_code, deleted, alive, state, reason, code):
    status = local_job_status(exit_code, deleted, alive, lambda: "the log's last lines")
    assert (status.state, status.exit_code) == (state, code)
    assert status.reason.startswith(reason), status.reason
    if state == "running" and reason:
        assert status.detail["alive"][0]["pid"] == 4242
    if state == "failed" and not deleted:
        assert status.detail["log_tail"] == "the log's last lines"


def test_an_unknown_process_tracking_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="process tracking 'cgroup' is not one of .*'cgroup-v2'.*use 'auto'"):
        LocalProcessBackend(work_dir=str(tmp_path), process_tracking="cgroup")


@pytest.mark.job
def test_a_supervisor_that_cannot_start_fails_the_launch(tmp_path):
    backend = LocalProcessBackend(work_dir=str(tmp_path), python="/bin/false")
    with pytest.raises(RuntimeError, match="local job 'rf-x' ended before it started training \\(exit 1\\)"):
        backend.launch(JobSpec(name="rf-x", config={}, num_workers=1))
