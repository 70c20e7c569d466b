"""Replay of a non-finite step in real jobs (torchrun, 2 ranks): rows whose loss overflows are named as the data
(file and row), and a run that skips the named rows trains HEALTHY past that step and records them. The jobs run
once per module; each test reads.

Under DDP only: the replay (rank/replay.py) and its exchange of reports (through the run folder,
rank/replay_exchange.py) are the engines' shared code; each engine's catch of a non-finite step, its replay and
that exchange run on both engines in tests/training/test_health_faults.py::
test_nan_gradient_on_one_rank_is_nonfinite_and_never_reaches_a_checkpoint (an injected NaN gradient replays
finite, as transient)."""
import pytest

from ringflow.training.formats import exit_codes
from ringflow.training.formats.config import RowRef
from ringflow.training.store import LocalFolderStore

from replay_data import huge_target_rows, write_bad_rows_shards

pytestmark = pytest.mark.job


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-rows-shards")
    manifest = write_bad_rows_shards(LocalFolderStore(str(root)))
    return str(root / "manifest.json"), huge_target_rows(str(root), manifest)


@pytest.fixture(scope="module")
def bad_jobs(bad_shards, job_runner_type, tmp_path_factory):
    return job_runner_type(bad_shards[0], tmp_path_factory.mktemp("replay-jobs"))


def config(jobs, name, **more):
    return jobs.config(name, batch_size=16, learning_rate=0.01, checkpoint={"every_steps": 2}, **more)


@pytest.fixture(scope="module")
def bad_rows_runs(bad_jobs):
    """The bad-rows dataset under DDP: (code, output, result) by engine."""
    runs = {}
    for engine in ("ddp",):
        cfg = config(bad_jobs, f"bad-{engine}", engine=engine)
        code, out = bad_jobs.run(cfg)
        runs[engine] = code, out, bad_jobs.result(cfg)
    return runs


@pytest.mark.parametrize("engine", ["ddp"])
def test_rows_that_overflow_the_loss_are_named_as_the_data(bad_rows_runs, bad_shards, engine):
    code, out, result = bad_rows_runs[engine]
    assert code == exit_codes.BY_VERDICT["NONFINITE"], out
    verdict = result.verdict
    assert verdict.status == "NONFINITE" and verdict.evidence["ranks"] == [1], verdict
    replay = verdict.evidence["replay"]
    assert replay["reproducible"] is True and replay["step"] == verdict.evidence["step"], replay
    named = [RowRef(**r) for r in replay["rows"]]
    assert named and set(named) <= set(bad_shards[1]), (named, bad_shards[1])  # only rows that are bad alone
    assert replay["reason"].startswith("data:") and "Replay: data" in verdict.reason
    assert replay["ranks"]["0"]["nonfinite"] is False and replay["ranks"]["1"]["nonfinite"] is True
    assert not result.replaying  # the final result, after the one published before the replay


def test_skipping_the_named_rows_trains_healthy_and_records_them(bad_jobs, bad_rows_runs, bad_shards):
    # Every bad row, as the retries would name them one step at a time; the first run's named ones among them.
    _, _, first = bad_rows_runs["ddp"]
    skip = [{"file": r.file, "row": r.row} for r in bad_shards[1]]
    assert all(r in skip for r in first.verdict.evidence["replay"]["rows"])
    cfg = config(bad_jobs, "skipping", engine="ddp", skip_rows=skip)
    code, out = bad_jobs.run(cfg)
    assert code == 0, out
    result = bad_jobs.result(cfg)
    assert result.verdict.status == "HEALTHY" and result.step > first.verdict.evidence["step"], result
    assert set(result.skipped_rows) == set(bad_shards[1])
    assert f"skip_rows: {len(skip)} row(s) never served" in out
