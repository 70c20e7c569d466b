"""The run folder's fence (run_folder.py), on a local folder and on S3: each claim is a newer attempt, an
older one can publish nothing once fenced, and readers see only what the current attempt published and
what earlier attempts showed when they were fenced; a folder from before run.json is refused."""
import concurrent.futures
import json

import pytest

from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.health.records import HealthLog, record
from run_folder_files import read_health, read_result
from ringflow.training.formats.run_folder import POINTER, Fenced, RunFolder, RunFolderError
from ringflow.training.formats.run_result import RunResult


def result(attempt, step, checkpoint="ckpt-000000010"):
    return RunResult(status="succeeded", attempt=attempt, step=step, epoch=1, world_size=2, checkpoint=checkpoint)


def write_checkpoint(attempt, step):
    return CheckpointStore(attempt.store, keep_last=None).save(step, {"state.pt": f"state {step}".encode()},
                                                              {"step": step})


def records(attempt, *steps):
    log = HealthLog(attempt.store, flush_seconds=0.0, attempt=attempt.ref.id, first_seq=attempt.ref.first_seq)
    for step in steps:
        log.append(record("step", step=step), force_flush=True)
    return log


def test_claims_are_numbered_and_a_newer_one_fences_the_older(object_store):
    folder = RunFolder(object_store)
    first = folder.claim("t1")
    assert first.number == 1 and first.ref.prefix == "attempts/000001"
    first.publish_checkpoint(write_checkpoint(first, 10), keep_last=3)
    second = folder.claim("t2")
    assert second.number == 2 and folder.checkpoints().names() == ["ckpt-000000010"]  # inherited
    with pytest.raises(Fenced, match="attempt 1 is fenced: attempt 2 \\(t2\\) claimed the run folder"):
        first.check()
    with pytest.raises(Fenced):
        first.publish_checkpoint(write_checkpoint(first, 20), keep_last=3)
    with pytest.raises(Fenced):
        first.publish_result(result("t1", 20).to_json())
    assert folder.checkpoints().names() == ["ckpt-000000010"] and read_result(object_store) is None
    second.publish_checkpoint(write_checkpoint(second, 20), keep_last=3)
    second.publish_result(result("t2", 20, "ckpt-000000020").to_json())
    assert folder.checkpoints().latest_valid().step == 20
    assert read_result(object_store).attempt == "t2" and read_result(object_store, "t1") is None


def test_a_stale_attempts_checkpoint_of_the_same_step_is_never_the_one_read(object_store):
    folder = RunFolder(object_store)
    stale = folder.claim("t1")
    current = folder.claim("t2")
    current.publish_checkpoint(write_checkpoint(current, 30), keep_last=3)
    write_checkpoint(stale, 30)  # the same name, written later by the fenced attempt: never published
    loaded = folder.checkpoints().load("ckpt-000000030")
    assert loaded.files["state.pt"] == b"state 30" and loaded.manifest.prefix == "attempts/000002/checkpoints"


def test_keep_last_drops_the_oldest_published(object_store):
    attempt = RunFolder(object_store).claim("t1")
    dropped = [attempt.publish_checkpoint(write_checkpoint(attempt, step), keep_last=2) for step in (10, 20, 30)]
    assert dropped == [[], [], ["attempts/000001/checkpoints/ckpt-000000010"]]
    assert RunFolder(object_store).checkpoints().names() == ["ckpt-000000030", "ckpt-000000020"]


def test_a_fenced_attempts_later_records_are_never_read(object_store):
    folder = RunFolder(object_store)
    first = folder.claim("t1")
    late = records(first, 1, 2, 3)
    second = folder.claim("t2")
    late.append(record("stall", rank=0, last_step=3, seconds=999.0, limit=10.0), force_flush=True)  # thawed
    records(second, 4, 5)
    seen = read_health(object_store)
    assert [(r["type"], r.get("step")) for r in seen] == [("step", 1), ("step", 2), ("step", 3), ("step", 4),
                                                          ("step", 5)]
    assert [r["seq"] for r in seen] == [0, 1, 2, 3, 4]  # seq counts on across attempts
    assert RunFolder(object_store).records_after(2) == seen[3:]


def test_concurrent_claims_each_get_their_own_number(object_store):
    folder = RunFolder(object_store)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        numbers = sorted(pool.map(lambda i: folder.claim(f"t{i}").number, range(4)))
    assert numbers == [1, 2, 3, 4]


@pytest.mark.parametrize("key", ["result.json", "health.jsonl", "health/000000.jsonl",
                                 "checkpoints/ckpt-000000010/MANIFEST.json"])
def test_a_folder_from_before_run_json_is_refused_saying_to_start_a_new_run(object_store, key):
    """Its files at the top and no run.json (an earlier ringflow's layout, before the first release): neither
    read nor claimed."""
    object_store.put_bytes(key, b"{}")
    folder = RunFolder(object_store)
    for call in (folder.read_result, folder.read_health, lambda: folder.checkpoints().names(),
                 lambda: folder.claim("t1")):
        with pytest.raises(RunFolderError, match=rf"holds {key} but no run.json: an earlier ringflow wrote it; start "
                                                 rf"a new run \(a new run_uri\) and retrain"):
            call()
    assert not object_store.exists(POINTER)


def test_a_pointer_that_took_over_a_folder_from_before_run_json_is_refused(object_store):
    doc = json.loads(RunFolder(object_store).claim("t1").folder.store.get_bytes(POINTER))
    doc["history"] = [{"number": 0, "id": None, "prefix": "", "first_seq": 0, "last_seq": 1}]
    object_store.put_bytes(POINTER, json.dumps(doc).encode())
    with pytest.raises(RunFolderError, match="names the files of a run folder from before run.json.*start a new run"):
        RunFolder(object_store).read_result()


def test_a_resume_before_a_step_takes_the_newest_checkpoint_before_it(object_store):
    """JobConfig.resume_before_step (a remedy after a NaN at that step): the newest published checkpoint
    taken before the step, and once the retry publishes its own, that one (published last) is the newest."""
    folder = RunFolder(object_store)
    first = folder.claim("t1")
    for step in (10, 20, 30):
        first.publish_checkpoint(write_checkpoint(first, step), keep_last=None)
    assert folder.checkpoints().latest_valid().step == 30
    assert folder.checkpoints().latest_valid(before_step=30).step == 20
    assert folder.checkpoints().latest_valid(before_step=25).step == 20
    assert folder.checkpoints().latest_valid(before_step=10) is None  # none before it: from the start
    second = folder.claim("t2")
    second.publish_checkpoint(write_checkpoint(second, 30), keep_last=None)  # the retry's own step 30
    newest = folder.checkpoints().latest_valid()
    assert newest.step == 30 and newest.files["state.pt"] == b"state 30"
    assert folder.checkpoints().prefix_of("ckpt-000000030").startswith("attempts/000002")


def test_remedies_are_kept_in_order_beside_the_attempts(object_store):
    folder = RunFolder(object_store)
    assert folder.read_remedies() == []
    folder.append_remedy({"try": 2, "remedy": "lower_learning_rate"})
    folder.claim("t2")  # a claim does not touch them
    folder.append_remedy({"try": 3, "remedy": "smaller_batch"})
    assert [r["try"] for r in folder.read_remedies()] == [2, 3]
    object_store.put_bytes("remedies.jsonl", b"{not json\n")
    with pytest.raises(ValueError, match="remedies.jsonl is not JSON lines.*delete it"):
        folder.read_remedies()
def test_each_rank_writes_its_replay_report_under_its_attempt_and_an_unknown_attempt_writes_none(object_store):
    folder = RunFolder(object_store)
    folder.claim("rf-a")
    assert folder.write_replay_report("rf-a", 1, b'{"rank": 1}') and folder.write_replay_report("rf-a", 0, b"{}")
    assert sorted(folder.read_replay_reports("rf-a")) == [b'{"rank": 1}', b"{}"]
    folder.claim("rf-b")
    assert folder.read_replay_reports("rf-b") == []
    assert not folder.write_replay_report("rf-unknown", 0, b"{}") and folder.read_replay_reports("rf-unknown") == []
