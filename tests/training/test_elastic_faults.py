"""Recovery inside the job, the deaths a commit and an upload make harder (rank/elastic.py; the mid-epoch kill
and the rejoin are test_elastic_horovod.py's): a worker SIGKILLed inside an elastic commit, rank 0 SIGKILLed while
its checkpoint upload is in flight, a rank that hangs (alive, silent) and one that is frozen (SIGSTOP), each
dropped, and a death that leaves fewer than min_workers, which falls back to the retry. Each is one
`ringflow train`; every training row of every epoch is trained on exactly once."""
import pytest

from elastic_rows import assert_every_row_once
from ringflow.training.formats.checkpoint import MANIFEST_NAME

pytestmark = pytest.mark.job

# Steps an epoch: digits' 1,437 training rows in batches of 32 per worker: 15 on 3 workers, 23 on 2.
COMMIT_EVERY = 5
CHECKPOINT_EVERY = 10


def elastic_config(module_jobs, run: str, faults: list[dict], epochs: int = 4, **elastic) -> dict:
    return module_jobs.config(run, engine="horovod", epochs=epochs, checkpoint={"every_steps": CHECKPOINT_EVERY},
                              health={"every_steps": 5},
                              elastic={"min_workers": 1, "commit_every_steps": COMMIT_EVERY} | elastic,
                              faults=faults, row_log_dir=str(module_jobs.root / f"{run}-rows"))


def only_change(module_jobs, cfg: dict, code: int, out: str) -> dict:
    """The one change of workers of a job that succeeded in one try."""
    assert code == 0, out[-5000:]
    result = module_jobs.result(cfg)
    assert result.succeeded and result.resumed_from is None, result
    (change,) = result.membership_changes
    assert [(r["why"], r["to_world_size"]) for r in module_jobs.health(cfg) if r["type"] == "membership"] == [
        (change["why"], change["to_world_size"])]
    return change


def test_a_worker_killed_inside_a_commit(module_jobs):
    """The commit of step 10 copied every rank's state; rank 1 dies before the collective check: the survivors'
    check fails, and they go back to that very commit, nothing redone."""
    cfg = elastic_config(module_jobs, "elastic-in-commit", [{"kind": "crash_in_commit", "rank": 1, "step": 10}])
    code, out = module_jobs.run(cfg, np=3, timeout=240)
    assert "fault: SIGKILL in the commit of step 10" in out, out[-5000:]
    change = only_change(module_jobs, cfg, code, out)
    assert (change["why"], change["from_world_size"], change["to_world_size"], change["rank0_changed"]) == (
        "left", 3, 2, False)
    assert (change["commit_step"], change["steps_redone"]) == (10, 0), change
    assert_every_row_once(cfg, [change])


def test_rank_0_killed_while_its_checkpoint_uploads(module_jobs):
    """Rank 0, the run folder's writer, dies with the checkpoint of step 10 half written (its file, not its
    MANIFEST): the survivor becomes rank 0, claims the run folder, and its own checkpoints are the valid ones."""
    cfg = elastic_config(module_jobs, "elastic-in-upload", [{"kind": "crash_in_upload", "rank": 0, "step": 10}])
    code, out = module_jobs.run(cfg, np=2, timeout=240)
    assert "fault: SIGKILL in the upload of the checkpoint of step 10" in out, out[-5000:]
    change = only_change(module_jobs, cfg, code, out)
    assert (change["why"], change["from_world_size"], change["to_world_size"], change["rank0_changed"]) == (
        "left", 2, 1, True)
    # The upload runs beside training: the training thread may have committed step 15 before the kill came.
    assert change["commit_step"] >= 10, change
    assert_every_row_once(cfg, [change])
    # The killed upload left no checkpoint of step 10 that claims to be complete; the survivor's final one is.
    newest = module_jobs.checkpoints(cfg).latest_valid()
    assert newest.manifest.step > 10 and newest.manifest.meta.get("final"), newest.manifest


def test_a_worker_killed_while_rank_0_uploads_does_not_wait_for_the_upload(module_jobs):
    """Rank 0's checkpoint of step 10 is still uploading (held 8 s) when rank 1 dies at step 12: the survivor
    trains on at once, the upload going on beside it (the next round takes the writer over), and the checkpoint
    of step 10 is published and recorded; the next one waits for it, so checkpoints stay in step order."""
    cfg = elastic_config(module_jobs, "elastic-beside-upload", [
        {"kind": "slow_upload", "rank": 0, "step": 10, "seconds": 8}, {"kind": "crash", "rank": 1, "step": 12}])
    code, out = module_jobs.run(cfg, np=2, timeout=240)
    assert "fault: the upload of the checkpoint of step 10 held 8s" in out, out[-5000:]
    change = only_change(module_jobs, cfg, code, out)
    assert (change["why"], change["from_world_size"], change["to_world_size"], change["rank0_changed"]) == (
        "left", 2, 1, False)
    written = [r for r in module_jobs.health(cfg) if r["type"] == "checkpoint"]
    (ten,) = [r for r in written if r["step"] == 10]  # recorded once published (checkpoint_writer.py)
    assert change["resumed_at"] < ten["time"], (change, ten)  # the first step came before the upload ended
    assert [r["step"] for r in written] == sorted(r["step"] for r in written), written
    assert_every_row_once(cfg, [change])


@pytest.mark.background  # mostly a hang waited out (stall_seconds): beside the main lane (scripts/test.sh)
def test_a_hung_rank_is_dropped(module_jobs):
    """Rank 2 hangs (alive, its training thread blocked): its peers' collective times out after
    peer_timeout_seconds and they go back to their commit; the hung rank's own watchdog ends it after
    stall_seconds, which lets the survivors' rendezvous go on without it. The job succeeds in one try."""
    cfg = elastic_config(module_jobs, "elastic-hang", [{"kind": "hang", "rank": 2, "step": 8}], epochs=3,
                         peer_timeout_seconds=4)
    cfg["health"] = cfg["health"] | {"stall_seconds": 12}
    code, out = module_jobs.run(cfg, np=3, timeout=240)
    assert "fault: hanging at step 8" in out and "seen by the watchdog of rank 2" in out, out[-5000:]
    change = only_change(module_jobs, cfg, code, out)
    assert (change["why"], change["from_world_size"], change["to_world_size"]) == ("left", 3, 2), (change, out[-8000:])
    assert change["commit_step"] == 5 and change["steps_redone"] == 2, change
    assert_every_row_once(cfg, [change])


@pytest.mark.background  # mostly a frozen rank waited out (peer_timeout_seconds): beside the main lane (scripts/test.sh)
def test_a_frozen_rank_is_dropped(module_jobs):
    """Rank 2 is SIGSTOPped (every thread frozen, its watchdog too, so it cannot end itself as a hung rank
    does): the launcher sees it stopped for peer_timeout_seconds, kills it and says so, and the survivors go on
    from their commit. The job succeeds in one try."""
    cfg = elastic_config(module_jobs, "elastic-frozen", [{"kind": "stop", "rank": 2, "step": 8}], epochs=3,
                         peer_timeout_seconds=4)
    code, out = module_jobs.run(cfg, np=3, timeout=240)
    assert "fault: SIGSTOP at step 8" in out, out[-5000:]
    assert "(T stopped)" in out and "over elastic.peer_timeout_seconds (4 s): killed" in out, out[-5000:]
    change = only_change(module_jobs, cfg, code, out)
    assert (change["why"], change["from_world_size"], change["to_world_size"]) == ("left", 3, 2), (change, out[-8000:])
    assert change["commit_step"] == 5 and change["steps_redone"] == 2, change
    assert_every_row_once(cfg, [change])


@pytest.mark.background  # mostly wait_seconds waited out, then a retry: beside the main lane (scripts/test.sh)
def test_fewer_than_min_workers_falls_back_to_the_retry(module_jobs):
    """min_workers 2 of 2 and a worker dies with no slot to come back: the job ends once wait_seconds pass, the
    log says why in one line, and the retry (`--retries 1`) resumes from the last checkpoint as without elastic."""
    cfg = elastic_config(module_jobs, "elastic-too-few", [{"kind": "crash", "rank": 1, "step": 15}], epochs=2,
                         min_workers=2, wait_seconds=3)
    code, out = module_jobs.run(cfg, np=2, timeout=240, args=("--retries", "1"))
    assert code == 0 and "fault: SIGKILL at step 15" in out, out[-5000:]
    assert "fewer workers than elastic.min_workers (2) stayed for elastic.wait_seconds (3 s)" in out, out[-5000:]
    result = module_jobs.result(cfg)
    assert result.succeeded and result.resumed_from == "ckpt-000000010" and not result.membership_changes, result
