"""Recovery inside the job (the config's `elastic`, rank/elastic.py): three Horovod workers, rank 0 (the run
folder's writer) SIGKILLed mid-epoch 0; the two survivors go back to their last commit, deal the epoch's unseen
rows between them and go on without a retry, the new rank 0 claiming the run folder; the dead worker's slot
comes back after its cooldown and a new worker joins, receiving the state by broadcast. One `ringflow train`,
one try: every training row of every epoch is trained on exactly once (the ranks' row logs, less the steps each
round trained after the commit the next round went back to), and each change is in result.json, the health
records and the log."""
import json

import pytest

from elastic_rows import assert_every_row_once

pytestmark = pytest.mark.job

KILLED_AT = 13  # mid-epoch 0: 15 steps an epoch on 3 workers


@pytest.fixture(scope="module")
def elastic_job(module_jobs):
    # Epochs enough for the rejoin: the killed slot comes back after rejoin_seconds and its new worker imports
    # torch (~2 s here), while the two survivors ran 40 epochs of digits in 2 s once recovery got quick (the
    # job once ended before anyone rejoined).
    cfg = module_jobs.config("elastic-horovod", engine="horovod", epochs=100, checkpoint={"every_steps": 20},
                             health={"every_steps": 5},
                             elastic={"min_workers": 1, "commit_every_steps": 5, "rejoin_seconds": 2},
                             faults=[{"kind": "crash", "rank": 0, "step": KILLED_AT}],
                             row_log_dir=str(module_jobs.root / "elastic-rows"))
    code, out = module_jobs.run(cfg, np=3, timeout=300)
    return cfg, code, out


def test_a_killed_writer_is_replaced_and_a_worker_rejoins_without_a_retry(elastic_job, module_jobs):
    cfg, code, out = elastic_job
    assert code == 0 and f"fault: SIGKILL at step {KILLED_AT}" in out, out[-5000:]
    result = module_jobs.result(cfg)
    assert result.succeeded and result.world_size == 3 and result.resumed_from is None, result
    # rank 0's commits, its first round's and the later ones (the last rank 0 joined in round 0, as a survivor)
    assert result.elastic_commits > 3 and 0 < result.elastic_commit_seconds < 5, result
    left, joined = result.membership_changes
    assert (left["why"], left["from_world_size"], left["to_world_size"], left["rank0_changed"]) == ("left", 3, 2, True)
    assert left["commit_step"] <= KILLED_AT and left["steps_redone"] == KILLED_AT - 1 - left["commit_step"]
    assert (joined["why"], joined["from_world_size"], joined["to_world_size"], joined["steps_redone"]) == ("joined", 2, 3, 0)
    assert "workers changed (left" in out and "workers changed (joined" in out
    # who: the killed worker's slot left, and the worker started on that slot after its cooldown joined
    assert len(left["left"]) == 1 and not left["joined"] and joined["joined"] == left["left"] and not joined["left"]
    assert left["seen_at_step"] == KILLED_AT - 1, left
    # The new rank 0 claimed the run folder (the old writer, were it alive, is fenced): one attempt id, two claims.
    pointer = json.loads((module_jobs.root / "elastic-horovod" / "run.json").read_text())
    claims = [a["id"] for a in pointer["history"]] + [pointer["attempt"]["id"]]
    assert len(claims) == 2 and len(set(claims)) == 1 == len({result.attempt} | set(claims)), pointer
    records = module_jobs.health(cfg)
    assert [r["type"] for r in records].count("start") == 1
    assert [(r["why"], r["to_world_size"]) for r in records if r["type"] == "membership"] == [("left", 2), ("joined", 3)]


def test_every_row_of_every_epoch_is_trained_on_exactly_once(elastic_job, module_jobs):
    cfg, code, out = elastic_job
    assert_every_row_once(cfg, list(module_jobs.result(cfg).membership_changes))
