"""Recovery inside the job under DDP (the config's `elastic` with engine "ddp", rank/ddp_elastic.py): three
workers, rank 1 SIGKILLed mid-epoch 0; torchrun restarts every worker at once, in the same try and attempt, and
they resume from the copy of the state the host keeps in memory (newer than the store's newest checkpoint), the
new rank 0 claiming the run folder. One `ringflow train`, one try: every training row of every epoch is trained
on exactly once (the ranks' row logs, less the steps the first round trained after the copy the restart went
back to; a row log's "round" is torchrun's restart count), the change is in result.json, the health records
and the log, and the copies are gone when the job has ended. Then the deaths a copy and an upload make harder:
a worker killed inside a copy, rank 0 killed while its checkpoint uploads."""
import json
import os

import pytest

from elastic_rows import assert_every_row_once
from ringflow.training.rank.peer_copy import copy_folder

pytestmark = pytest.mark.job

KILLED_AT = 13  # mid-epoch 0: 15 steps an epoch on 3 workers
COMMIT_EVERY = 5  # copies at steps 5 and 10 before the death; the store's first checkpoint comes at step 20


@pytest.fixture(scope="module")
def elastic_job(module_jobs):
    cfg = module_jobs.config("elastic-ddp", engine="ddp", epochs=3, checkpoint={"every_steps": 20},
                             health={"every_steps": 5},
                             elastic={"commit_every_steps": COMMIT_EVERY},
                             faults=[{"kind": "crash", "rank": 1, "step": KILLED_AT}],
                             row_log_dir=str(module_jobs.root / "elastic-rows"))
    code, out = module_jobs.run(cfg, np=3, timeout=180)
    return cfg, code, out


def test_a_killed_worker_restarts_every_worker_from_the_peer_copy_without_a_retry(elastic_job, module_jobs):
    cfg, code, out = elastic_job
    assert code == 0 and f"fault: SIGKILL at step {KILLED_AT}" in out, out[-6000:]
    assert out.count("fault: SIGKILL") == 1, out[-6000:]  # the fault fires in round 0 only
    went_back = KILLED_AT - 1 - (KILLED_AT - 1) % COMMIT_EVERY  # the newest copy before the death: step 10
    assert f"resuming from the peer copy of step {went_back}" in out, out[-6000:]
    assert "the store's newest checkpoint is step None" in out, out[-6000:]
    assert out.count("job exited with") == 1, out[-6000:]  # one try (no --retries): recovered inside it
    result = module_jobs.result(cfg)
    assert result.succeeded and result.world_size == 3 and result.resumed_from is None, result
    (change,) = result.membership_changes
    assert (change["why"], change["from_world_size"], change["to_world_size"], change["commit_step"],
            change["rank0_changed"]) == ("left", 3, 3, went_back, True), change
    # The host's beat: the last step ended before the death (rank 0 ended step 12; rank 1 died in 13).
    assert change["steps_redone"] == KILLED_AT - 1 - went_back, change
    assert 0 < change["recovery_seconds"] < 60, change
    # The restarted rank 0 read its first data from what the host kept (rank/host_ranges.py), not the store: the
    # copy of step 10 pinned the small stream whole (decoded once and kept).
    assert change["data_from_host_bytes"] > 0, change
    assert "workers changed (left: a worker failed; torchrun restarted every worker (restart 1))" in out
    # The restarted rank 0 claimed the run folder again: one attempt id, two claims.
    pointer = json.loads((module_jobs.root / "elastic-ddp" / "run.json").read_text())
    claims = [a["id"] for a in pointer["history"]] + [pointer["attempt"]["id"]]
    assert len(claims) == 2 and {result.attempt} == set(claims), pointer
    records = module_jobs.health(cfg)
    assert [(r["why"], r["commit_step"]) for r in records if r["type"] == "membership"] == [("left", went_back)]
    # The first round's rank 0, its collective failed or stopped by torchrun's SIGTERM (rank/last_word.py), wrote
    # its records before it went, not only those its log's thread had flushed (every second): the history keeps
    # the step and checksum records of step 5, appended at step 10 (the gathers are collected one measurement
    # later), a moment before the death. Step 10's, still in flight, died with the round.
    assert "writing the health records not yet written" in out, out[-6000:]
    round_0 = [(r["type"], r["step"]) for r in records[:[r["type"] for r in records].index("membership")]]
    assert round_0 == [("start", 0), ("step", 5), ("checksum", 5)], round_0
    # Removed when the job ended.
    assert not os.path.exists(copy_folder(cfg["run_uri"], result.attempt))


def test_every_row_of_every_epoch_is_trained_on_exactly_once(elastic_job, module_jobs):
    cfg, code, out = elastic_job
    assert code == 0, out[-3000:]
    assert_every_row_once(cfg, list(module_jobs.result(cfg).membership_changes))


def test_a_rank_that_ends_on_a_verdict_is_not_restarted_into_training_again(module_jobs):
    """torchrun restarts on any failure; a rank that ended on purpose (here out of memory) noted its code, and the
    restarted ranks end with it at once: the job ends with the verdict, as without elastic."""
    from ringflow.training.formats import exit_codes

    cfg = module_jobs.config("elastic-ddp-oom", engine="ddp", epochs=1, elastic={"commit_every_steps": 5},
                             faults=[{"kind": "oom", "rank": 1, "step": 3, "above_batch": 0}])
    code, out = module_jobs.run(cfg, np=2, timeout=180)
    assert code == exit_codes.for_verdict("OOM") and "health verdict OOM" in out, out[-4000:]
    assert out.count("fault: out of memory") == 1, out[-4000:]  # never trained again
    assert "before torchrun restarted it: ending with it" in out, out[-4000:]


def ddp_faults_config(module_jobs, run: str, faults: list[dict]) -> dict:
    return module_jobs.config(run, engine="ddp", epochs=3, checkpoint={"every_steps": 10}, health={"every_steps": 5},
                              elastic={"commit_every_steps": COMMIT_EVERY}, faults=faults,
                              row_log_dir=str(module_jobs.root / f"{run}-rows"))


def one_restart(module_jobs, cfg: dict, code: int, out: str) -> dict:
    """The one change of a DDP job that succeeded in one try, without a retry."""
    assert code == 0 and out.count("job exited with") == 1, out[-6000:]
    result = module_jobs.result(cfg)
    assert result.succeeded and result.resumed_from is None, result
    (change,) = result.membership_changes
    assert change["why"] == "left" and change["from_world_size"] == change["to_world_size"], change
    assert_every_row_once(cfg, [change])
    return change


def test_a_worker_killed_inside_a_peer_copy_is_restarted_from_a_whole_copy(module_jobs):
    """Rank 1 dies in the commit of step 10 (the host's writer, rank 0, copies the state then): the restart goes
    back to a copy that was written whole, step 5's or step 10's, and every row is still trained once."""
    cfg = ddp_faults_config(module_jobs, "ddp-in-commit", [{"kind": "crash_in_commit", "rank": 1, "step": 10}])
    code, out = module_jobs.run(cfg, np=3, timeout=180)
    assert "fault: SIGKILL in the commit of step 10" in out, out[-6000:]
    change = one_restart(module_jobs, cfg, code, out)
    assert change["commit_step"] in (5, 10), change


def test_rank_0_killed_while_its_checkpoint_uploads_under_ddp(module_jobs):
    """Rank 0, the run folder's writer, dies with the checkpoint of step 10 half written: the restarted rank 0
    claims the run folder again, and the killed upload never counts as a complete checkpoint."""
    cfg = ddp_faults_config(module_jobs, "ddp-in-upload", [{"kind": "crash_in_upload", "rank": 0, "step": 10}])
    code, out = module_jobs.run(cfg, np=2, timeout=180)
    assert "fault: SIGKILL in the upload of the checkpoint of step 10" in out, out[-6000:]
    change = one_restart(module_jobs, cfg, code, out)
    assert change["commit_step"] >= 5, change
    newest = module_jobs.checkpoints(cfg).latest_valid()
    assert newest.manifest.step > 10 and newest.manifest.meta.get("final"), newest.manifest
