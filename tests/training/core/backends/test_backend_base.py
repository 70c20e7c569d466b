"""JobStatus with the job's own result: once a job has finished, its RunResult decides the exit code and the
reason, whatever the process layers in between made of them (horovodrun and mpirun report any failure as 1)."""
import pytest

from ringflow.training.core.backends.base import JobStatus, exit_reason, with_result
from ringflow.training.health.verdict import Verdict
from ringflow.training.formats.run_result import RunResult


def result(status="failed", verdict="NONFINITE"):
    return RunResult(status=status, attempt="rf-job-t1", step=12, epoch=0, world_size=2,
                     checkpoint="ckpt-000000012" if status == "succeeded" else None,
                     verdict=Verdict(verdict, f"{verdict} reason") if verdict else None)


@pytest.mark.parametrize("status, res, state, code, reason", [
    # mpirun's launcher exits 1 for a rank's NONFINITE: the result restores 3 and says why
    (JobStatus("failed", "MPIJob failed: BackoffLimitExceeded", 1), result(), "failed", 3,
     "health verdict NONFINITE: NONFINITE reason"),
    (JobStatus("failed", "the job failed", 1), result(verdict="STALLED"), "failed", 5,
     "health verdict STALLED: STALLED reason"),
    (JobStatus("failed", "the job failed", 1), result(verdict=None), "failed", 1, "the job failed"),
    (JobStatus("succeeded", exit_code=0), result("succeeded", "HEALTHY"), "succeeded", 0, ""),
    # the job finished its work, then its launcher failed: still a failure, with the result attached
    (JobStatus("failed", "killed (SIGKILL)", 137), result("succeeded", "HEALTHY"), "failed", 137, "killed (SIGKILL)"),
    # no result of this attempt: what the backend saw stands
    (JobStatus("failed", "killed (SIGKILL)", 137), None, "failed", 137, "killed (SIGKILL)"),
])
def test_a_finished_job_is_described_by_its_result(status, res, state, code, reason):
    got = with_result(status, res)
    assert (got.state, got.exit_code, got.reason, got.result) == (state, code, reason, res)


def test_a_running_job_keeps_its_status():
    running = JobStatus("running")
    assert with_result(running, result()) is running


def test_a_status_carries_only_a_run_result():
    with pytest.raises(ValueError, match="use a RunResult"):
        JobStatus("failed", result={"status": "failed"})


@pytest.mark.parametrize("code, words", [(0, "succeeded"), (1, "the job failed"), (2, "bad job config"),
                                         (5, "health verdict STALLED"), (143, "terminated (SIGTERM)"),
                                         (42, "exit code 42"), (None, "no exit status")])
def test_exit_reasons_come_from_the_one_table(code, words):
    assert exit_reason(code) == words
