"""Which health records a training attempt logs to MLflow: those past the seq an earlier attempt logged,
whether the caller hands over every record it read (the train task reads them once for the plot too) or
they are read here from the run folder; sealed segments and health.jsonl alike."""
import pytest

from ringflow.training.health.records import HealthLog, record
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import LocalFolderStore
from ringflow.training.core.tracking.mlflow_runs import records_after


@pytest.fixture
def run_folder(tmp_path):
    store = LocalFolderStore(str(tmp_path))
    log = HealthLog(RunFolder(store).claim("a1").store, flush_seconds=0, segment_lines=4,
                    attempt="a1")  # 10 records: 2 sealed segments
    for step in range(10):
        log.append(record("step", step=step), force_flush=True)
    return RunFolder(store)


@pytest.mark.parametrize("logged_up_to, seqs, last", [
    (-1, list(range(10)), 9),   # a first attempt: everything
    (5, [6, 7, 8, 9], 9),       # a retry: only what came after
    (9, [], 9),                 # nothing new: the seq stays
])
@pytest.mark.parametrize("handed_over", [True, False])
def test_only_records_after_the_logged_seq(run_folder, logged_up_to, seqs, last, handed_over):
    every = run_folder.read_health() if handed_over else None
    records, last_seq = records_after(logged_up_to, run_folder, every)
    assert [r["seq"] for r in records] == seqs and last_seq == last
    assert [r["step"] for r in records] == seqs  # the records themselves, in order
