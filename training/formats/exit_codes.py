"""Exit statuses of a training job, and what each means: the one table every layer imports.

The job's outcome travels as its RunResult (run_result.py); an exit status is only how a process reports
it. `horovodrun` and `mpirun` collapse any rank's failure to 1, so the launcher restores the job's own
code from the result (`RunResult.exit_code`), and the backends describe a code with `meaning`.
"""
from ..health.verdict import DEGRADED, DIVERGED, FENCED, NONFINITE, OOM, STALLED, STORE_UNAVAILABLE

OK = 0
ERROR = 1
CONFIG = 2
BY_VERDICT = {NONFINITE: 3, DIVERGED: 4, STALLED: 5, DEGRADED: 6, STORE_UNAVAILABLE: 7, FENCED: 8, OOM: 9}
VERDICT_OF = {code: verdict for verdict, code in BY_VERDICT.items()}
# 128 + the signal: a process killed from outside (the backend's delete, the OOM killer, a node going away).
KILLED, TERMINATED = 137, 143
MEANING = ({OK: "succeeded", ERROR: "the job failed", CONFIG: "bad job config",
            KILLED: "killed (SIGKILL)", TERMINATED: "terminated (SIGTERM)"}
           | {code: f"health verdict {verdict}" for verdict, code in BY_VERDICT.items()})


def meaning(code: int | None) -> str:
    if code is None:
        return "no exit status"
    return MEANING.get(code, f"exit code {code}")


def for_verdict(status: str | None) -> int:
    """The code of a job that stopped on a verdict with this status; ERROR for anything else."""
    return BY_VERDICT.get(status, ERROR) if status else ERROR
