"""`ringflow health RUN` judges a run by the thresholds it ran with (its `start` record), not the defaults."""
import json

import pytest

from ringflow.training.core import cli
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.health.records import HealthLog, record
from ringflow.training.store import LocalFolderStore


def straggling_run(path, health):
    """Rank 1 computes 1.7x slower than rank 0 in every step: DEGRADED by the default ratio (1.5)."""
    log = HealthLog(RunFolder(LocalFolderStore(str(path))).claim("a1").store, flush_seconds=0.0, attempt="a1")
    if health is not None:
        log.append(record("start", step=0, health=health))
    for n in range(1, 21):
        log.append(record("step", step=n, step_time=[0.11, 0.11], sync_time=[0.05, 0.008],
                          compute_time=[0.06, 0.102], nonfinite_ranks=[], grad_norm=1.0, loss=0.5))


@pytest.mark.parametrize("health, status, thresholds, code", [
    (None, "DEGRADED", "defaults: the run stored none", 0),
    ({"straggler_ratio": 2.0}, "HEALTHY", "stored with the run", 0),
    ({"straggler_ratio": 1.5, "stop_on_degraded": True}, "DEGRADED", "stored with the run", 1),
])
def test_health_command_uses_the_runs_thresholds(tmp_path, capsys, health, status, thresholds, code):
    straggling_run(tmp_path, health)
    assert cli.main(["health", str(tmp_path)]) == code
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == status and shown["thresholds"] == thresholds
