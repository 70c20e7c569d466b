"""Exit statuses of a training job: the launcher, the Airflow operator and the MPIJob outcome read them."""
from ringflow.training.health.verdict import DEGRADED, DIVERGED, NONFINITE, STALLED

OK = 0
ERROR = 1
CONFIG = 2
BY_VERDICT = {NONFINITE: 3, DIVERGED: 4, STALLED: 5, DEGRADED: 6}
MEANING = {OK: "succeeded", ERROR: "failed", CONFIG: "bad config"} | {v: k for k, v in BY_VERDICT.items()}
