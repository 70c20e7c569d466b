"""Real TensorFlow jobs (np=2, MultiWorkerMirroredStrategy in the TF venv, started by `ringflow train`), run once
for the module: one uninterrupted, one that a worker's crash stops mid-epoch and a rerun resumes from its last
checkpoint. The tests read their run folders.

Skipped, saying why, only where the TF venv is missing and RINGFLOW_REQUIRE_TF is unset (scripts/test.sh sets it:
CI runs scripts/setup.sh, which makes the venv)."""
import concurrent.futures

import numpy as np
import pytest

from ringflow.training.formats.weights_npz import MODEL_FILE, from_npz

# background: most of each launch is two workers importing TensorFlow, one core each at most; scripts/test.sh
# runs these beside the CPU-bound main lane to even the two lanes out.
pytestmark = [pytest.mark.job, pytest.mark.background]


def tf_config(runner, run: str, **overrides) -> dict:
    # A checkpoint every 5 steps with no time floor: the crash at step 28 leaves step 25's, mid-epoch 2.
    return runner.config(run, engine="tensorflow", checkpoint={"every_steps": 5, "min_interval_seconds": 0},
                         health={"every_steps": 2, "checksum_every_steps": 5}, **overrides)


@pytest.fixture(scope="module")
def jobs_run(digits_manifest, tmp_path_factory, job_runner_type, tf_python):
    runner = job_runner_type(digits_manifest, tmp_path_factory.mktemp("tf-jobs"))
    whole = tf_config(runner, "whole")
    resumed = tf_config(runner, "resumed")
    crashed = resumed | {"faults": [{"kind": "crash", "rank": 1, "step": 28}]}
    nan = nan_config(runner)
    # The uninterrupted job and the one that crashes share nothing (run folders, ports), so they run side by
    # side: most of a launch is its two workers importing TensorFlow (~7 s of CPU each), and the rerun needs
    # only the crashed job's folder. One launch's wait less than running all three in turn.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = {"whole": pool.submit(runner.run, whole), "crashed": pool.submit(runner.run, crashed)}
        running["resumed"] = pool.submit(lambda: (running["crashed"].result(), runner.run(resumed))[1])
        running["nan"] = pool.submit(runner.run, nan)
        out = {name: job.result() for name, job in running.items()}
    return runner, whole, resumed, out | {"nan_config": nan}


def nan_config(runner) -> dict:
    # Measured every 4th step, a checkpoint due every 5th: rank 1's NaN gradient at step 9 is skipped in the
    # step, and step 10 (a checkpoint step, before measurement step 12) measures because one was skipped.
    return runner.config("nan", engine="tensorflow", checkpoint={"every_steps": 5, "min_interval_seconds": 0},
                         health={"every_steps": 4, "checksum_every_steps": 20},
                         faults=[{"kind": "nan_gradient", "rank": 1, "step": 9}])


def final_model(runner, cfg: dict) -> dict[str, np.ndarray]:
    loaded = runner.checkpoints(cfg).latest_valid()
    return from_npz(loaded.files[MODEL_FILE], cfg["run_uri"])


def test_the_job_trains_and_publishes_its_result(jobs_run):
    runner, whole, _, out = jobs_run
    code, log = out["whole"]
    assert code == 0, log[-3000:]
    result = runner.result(whole)
    assert (result.status, result.world_size, result.step, result.epoch) == ("succeeded", 2, 44, 2)
    assert result.checkpoint == "ckpt-000000044" and result.verdict.status == "HEALTHY"
    assert result.samples_per_sec_after_warmup > 0 and result.loss < 1.0
    assert "with tensorflow" in log


def test_the_health_records_are_the_torch_ranks_shape(jobs_run):
    runner, whole, _, _ = jobs_run
    records = runner.health(whole)
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(2, 45, 2))
    assert all(len(r["step_time"]) == len(r["sync_time"]) == 2 and r["nonfinite_ranks"] == [] for r in steps)
    assert all(0 <= s <= t for r in steps for s, t in zip(r["sync_time"], r["step_time"]))
    sums = [r["checksums"] for r in records if r["type"] == "checksum"]
    assert len(sums) == 8 and all(a == b for a, b in sums)  # the replicas stayed equal
    assert records[0]["type"] == "start" and records[0]["engine"] == "tensorflow"


def test_a_crashed_worker_stops_the_job_and_the_rerun_resumes_sample_exact(jobs_run):
    runner, whole, resumed, out = jobs_run
    code, log = out["crashed"]
    assert code != 0 and "fault: crash at step 28" in log
    code, log = out["resumed"]
    assert code == 0, log[-3000:]
    result = runner.result(resumed)
    assert result.resumed_from == "ckpt-000000025" and result.step == 44
    assert "resuming from checkpoint ckpt-000000025 (step 25, epoch 1, batch 3)" in log
    # The same minibatches in the same order from the cursor on: the same weights as the uninterrupted run.
    mine, theirs = final_model(runner, resumed), final_model(runner, whole)
    assert mine.keys() == theirs.keys()
    for name in mine:
        np.testing.assert_allclose(mine[name], theirs[name], rtol=0, atol=1e-6, err_msg=name)


def test_the_torch_evaluate_step_loads_its_checkpoint(jobs_run):
    from ringflow.training.core.evaluate import evaluate

    _, whole, _, _ = jobs_run
    doc = evaluate(whole["run_uri"])
    assert doc["checkpoint"] == "ckpt-000000044" and doc["metrics"]["accuracy"] > 0.8


def test_a_nan_gradient_is_never_applied_and_stops_the_job_before_the_next_checkpoint(jobs_run):
    """The step skips a NaN/Inf averaged gradient on the device and keeps where it began; the loop reads that
    at the next measurement or checkpoint-cadence step, whichever comes first: the verdict names rank 1 and
    step 9, found at step 10, and no checkpoint after it was written."""
    from ringflow.training.formats import exit_codes

    runner, _, _, out = jobs_run
    cfg = out["nan_config"]
    code, log = out["nan"]
    assert code == exit_codes.BY_VERDICT["NONFINITE"], log[-3000:]
    verdict = runner.result(cfg).verdict.to_dict()
    assert verdict["status"] == "NONFINITE" and verdict["evidence"]["step"] == 9, verdict
    assert verdict["evidence"]["ranks"] == [1] and verdict["evidence"]["detected_at_step"] == 10, verdict
    assert runner.result(cfg).checkpoint is None and runner.checkpoints(cfg).names() == ["ckpt-000000005"]
    steps = [r for r in runner.health(cfg) if r["type"] == "step"]
    assert [r["step"] for r in steps] == [4, 8, 10] and steps[-1]["first_nonfinite_step"] == [None, 9]


def test_a_resume_on_another_number_of_workers_is_refused(jobs_run):
    """The TensorFlow rank's cursor counts micro-batches of its world size's deal: another one is refused with
    what to do, before any training (last in this module: the refused try is an attempt of that run folder)."""
    runner, _, resumed, _ = jobs_run
    code, log = runner.run(resumed, np=1)
    assert code != 0
    assert "written by 2 TensorFlow workers and this try runs 1" in log and "resumes on any number" in log
