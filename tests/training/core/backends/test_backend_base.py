"""What a backend sees of a job: its state (a JobState) and the words of its exit status (the job's own
result is the failure policy's to read: tests/training/core/test_failure_policy.py)."""
import pytest

from ringflow.training.core.backends.base import JobState, JobStatus, exit_reason


def test_a_status_is_a_job_state_read_from_its_words():
    assert JobStatus("failed").state is JobState.FAILED and JobStatus(JobState.RUNNING).state == "running"
    with pytest.raises(ValueError, match="job state 'finished': use one of"):
        JobStatus("finished")
    with pytest.raises(ValueError, match="use a health Verdict"):
        JobStatus("failed", verdict={"status": "OOM"})


@pytest.mark.parametrize("code, words", [(0, "succeeded"), (1, "the job failed"), (2, "bad job config"),
                                         (5, "health verdict STALLED"), (143, "terminated (SIGTERM)"),
                                         (42, "exit code 42"), (None, "no exit status")])
def test_exit_reasons_come_from_the_one_table(code, words):
    assert exit_reason(code) == words
