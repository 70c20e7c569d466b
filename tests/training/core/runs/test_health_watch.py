"""The outside watcher's view of a run (HealthWatch): it judges only the watched attempt, calls a stall on
the heartbeat and reads each record once."""
import time

import pytest

from ringflow.training.health.heartbeat import ATTEMPT_LINE, Heartbeat
from ringflow.training.health.records import HealthLog, record
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.formats.run_layout import HEARTBEAT
from ringflow.training.core.runs.health_watch import HealthWatch, read_verdict
from ringflow.training.store import LocalFolderStore

HEALTH = {"stall_seconds": 30, "window_steps": 5}


class Run:
    """A run folder written the way rank 0 writes it: each attempt claims the folder, then writes its records
    and its heartbeat under its own prefix."""

    def __init__(self, path):
        self.uri = str(path)
        self.store = LocalFolderStore(self.uri)
        self._attempts = {}  # attempt id -> (its claim, its health log)

    def attempt(self, attempt, *records, segment_lines=2_000):
        if attempt not in self._attempts:
            claim = RunFolder(self.store).claim(attempt)
            self._attempts[attempt] = claim, HealthLog(claim.store, flush_seconds=0.0, attempt=attempt,
                                                       segment_lines=segment_lines, first_seq=claim.ref.first_seq)
        log = self._attempts[attempt][1]
        for rec in records:
            log.append(rec)
        return log

    def beat(self, attempt, seq, silent, step=5, state="running", at=None, write_seconds=0.0):
        at = time.time() if at is None else at
        self._attempts[attempt][0].store.put_bytes(HEARTBEAT, Heartbeat(attempt, seq, at, step, silent, at - silent,
                                                                        state, write_seconds=write_seconds).to_json())


def steps(first, last):
    return [record("step", step=n, step_time=[0.02, 0.02], sync_time=[0.001, 0.001], compute_time=[0.019, 0.019],
                   nonfinite_ranks=[], grad_norm=1.0, loss=0.5) for n in range(first, last + 1)]


def stalled_first_attempt(run):
    run.attempt("a1", record("start", step=0), *steps(1, 5),
                record("stall", rank=1, last_step=5, seconds=31.0, limit=30.0))
    run.beat("a1", 9, silent=31.0, at=time.time() - 600)


def test_retry_is_not_judged_on_its_previous_attempts_stall(tmp_path):
    run = Run(tmp_path)
    stalled_first_attempt(run)
    watch, since = HealthWatch(run.store, HEALTH), time.time()
    # The retry's pods are starting: a1's stall and its stale heartbeat are not this job's.
    assert watch.poll(since + 1, since) is None
    assert watch.poll(since + 20, since) is None
    run.attempt("a2", record("start", step=0), *steps(1, 3))
    run.beat("a2", 0, silent=0.1)  # a heartbeat that changed while watching: a live attempt, this job's
    got = watch.poll(since + 21, since)
    assert got["status"] == "HEALTHY" and got["attempt"] == "a2" and not got["fatal"]


def test_attempt_from_the_log_is_judged_at_once(tmp_path):
    run = Run(tmp_path)
    stalled_first_attempt(run)
    run.attempt("a2", record("start", step=0), *steps(1, 3))
    watch = HealthWatch(run.store, HEALTH)
    watch.learn_from_log(["[ringflow] resuming", "[1,0]<stdout>:" + ATTEMPT_LINE.format(attempt="a2")])
    assert watch.poll(None, None)["status"] == "HEALTHY"
    run.attempt("a2", record("step", step=4, step_time=[0.1], sync_time=[0.0], compute_time=[0.1],
                             nonfinite_ranks=[1], grad_norm="nan", loss="nan"))
    got = watch.poll(None, None)
    assert got["status"] == "NONFINITE" and got["fatal"]


def test_a_verdict_a_rank_said_in_the_log_is_the_watch_s_at_once(tmp_path):
    """A script's NaN on rank 1 alone: rank 1 writes no record and rank 0 fails without one; the line rank 1
    printed is the verdict (health/verdict_line.py), fatal, though the records say HEALTHY."""
    from ringflow.training.health.verdict import Verdict
    from ringflow.training.health.verdict_line import verdict_line

    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 3))
    watch = HealthWatch(run.store, HEALTH, attempt="a1")
    assert watch.poll(None, None)["status"] == "HEALTHY"
    said = Verdict("NONFINITE", "the script reported a NaN/Inf loss at step 4 on rank 1", {"step": 4, "ranks": [1]})
    watch.learn_from_log(["[default0]:step 4", "[default1]:" + verdict_line(said)])
    got = watch.poll(None, None)
    assert (got["status"], got["reason"], got["fatal"]) == ("NONFINITE", said.reason, True), got


def test_no_records_for_longer_than_stall_seconds_is_not_a_stall(tmp_path):
    """health.enabled false (only start and end) or slow steps between records: the heartbeat decides."""
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0))
    watch, since = HealthWatch(run.store, HEALTH, attempt="a1"), time.time() - 1000
    for seq in range(5):
        run.beat("a1", seq, silent=25.0, step=seq)  # a step each 25 s, no record for 1000 s
        assert watch.poll(time.time(), since)["status"] == "HEALTHY"


@pytest.mark.parametrize("silent, late, stalled", [(29.0, 0, False), (31.0, 0, True), (20.0, 16, True),
                                                    (20.0, 5, False)])
def test_stall_is_judged_on_the_heartbeat(tmp_path, silent, late, stalled):
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 5))
    run.beat("a1", 3, silent=silent, at=time.time() - late)  # heartbeat every 7.5 s: late after 15 s
    watch, since = HealthWatch(run.store, HEALTH, attempt="a1"), time.time() - 100
    got = watch.poll(time.time(), since)
    if late > 15:  # a late beat is silence once the probe write the watcher began on seeing it late is back
        deadline = time.monotonic() + 30
        while got["status"] == "HEALTHY" and time.monotonic() < deadline:
            time.sleep(0.02)
            got = watch.poll(time.time(), since)
    assert (got["status"] == "STALLED") == stalled and got["fatal"] == stalled
    if stalled:
        assert got["evidence"]["last_step"] == 5 and got["evidence"]["limit"] == 30


def test_a_late_beat_that_reports_the_silence_itself_is_a_stall_however_slow_the_store(tmp_path):
    """A disk busy with fsyncs makes every heartbeat late (its write took 10 s): the silence the beat itself
    carries is still the job's own reading, judged at once (the store's slowness hid it before)."""
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 5))
    run.beat("a1", 3, silent=31.0, at=time.time() - 16, write_seconds=10.0)
    got = HealthWatch(run.store, HEALTH, attempt="a1").poll(time.time(), time.time() - 100)
    assert got["status"] == "STALLED" and got["evidence"]["seconds"] == 31.0, got


def test_an_ended_attempt_is_never_stalled(tmp_path):
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 5), record("end", status="succeeded"))
    run.beat("a1", 3, silent=1.0, state="ended", at=time.time() - 999)
    assert HealthWatch(run.store, HEALTH, attempt="a1").poll(time.time(), 0.0)["status"] == "HEALTHY"


def test_a_poll_reads_only_what_is_new(tmp_path, monkeypatch):
    run = Run(tmp_path)
    log = run.attempt("a1", record("start", step=0), *steps(1, 500), segment_lines=50)
    reads = []
    real = LocalFolderStore.get_bytes
    monkeypatch.setattr(LocalFolderStore, "get_bytes", lambda self, key: reads.append(key) or real(self, key))
    watch = HealthWatch(run.store, HEALTH, attempt="a1")
    assert watch.poll(None, None)["evidence"]["steps_measured"] == 500
    # run.json once (the current attempt, and where the watched one writes), health.jsonl, every segment once,
    # a probe, heartbeat.json
    assert len(reads) == 1 + 1 + 10 + 1 + 1
    for n in range(501, 521):
        log.append(steps(n, n)[0])
        reads.clear()
        assert watch.poll(None, None)["evidence"]["steps_measured"] == n
        assert len(reads) <= 5, reads  # run.json, health.jsonl, a new segment at most, a probe, heartbeat.json


def test_one_look_judges_the_attempt_that_started_last(tmp_path):
    run = Run(tmp_path)
    stalled_first_attempt(run)
    run.attempt("a2", record("start", step=0), *steps(1, 3))
    assert read_verdict(run.store, HEALTH)["status"] == "HEALTHY"
    assert read_verdict(run.store, HEALTH, attempt="a1")["status"] == "STALLED"
    run.beat("a2", 4, silent=45.0, step=3)
    got = read_verdict(run.store, HEALTH, now=time.time())
    assert got["status"] == "STALLED" and got["attempt"] == "a2"


def test_one_look_at_a_late_beat_waits_for_its_probe_and_calls_the_silence(tmp_path):
    """A frozen rank 0 whose last beat looked healthy (the multi-host dark host): a script's single look
    gets the store's answer in the same call, so the silence is STALLED, not left for a next poll."""
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 5))
    run.beat("a1", 3, silent=1.0, at=time.time() - 40)  # due every 7.5 s: 40 s late, silence 41 s > 30 s
    got = read_verdict(run.store, HEALTH, now=time.time(), attempt="a1")
    assert got["status"] == "STALLED" and got["evidence"]["seconds"] > 40, got


def reclaimed(run, attempt, *records):
    """An elastic job's new rank 0 claims the run folder again under the same attempt id (rank/elastic.py): its
    records and heartbeat go under the new claim's prefix."""
    claim = RunFolder(run.store).claim(attempt)
    log = HealthLog(claim.store, flush_seconds=0.0, attempt=attempt, first_seq=claim.ref.first_seq)
    for rec in records:
        log.append(rec)
    return claim


def membership(why="left", sizes=(3, 2), commit_step=5, redone=2):
    return record("membership", why=why, detail="Horovod has been shut down", from_world_size=sizes[0],
                  to_world_size=sizes[1], commit_step=commit_step, steps_redone=redone, failed_at=0.0,
                  resumed_at=0.6, rank0_changed=True, recovery_seconds=0.6)


def poll_until(watch, since, done, seconds=30.0):
    """Poll until `done(verdict)`: a late beat is judged once the probe write begun on seeing it late is back."""
    got = watch.poll(time.time(), since)
    deadline = time.monotonic() + seconds
    while not done(got) and time.monotonic() < deadline:
        time.sleep(0.02)
        got = watch.poll(time.time(), since)
    return got


def test_an_elastic_recovery_that_replaced_rank_0_is_watched_under_its_new_claim(tmp_path):
    """Rank 0 died (its last beat long ago, under the first claim); the new rank 0 claimed the folder again and
    beats under the new prefix: no stall, and every record is judged, the old writer's last ones included."""
    run = Run(tmp_path)
    old = run.attempt("a1", record("start", step=0), *steps(1, 5))
    run.beat("a1", 3, silent=0.5, at=time.time() - 100)  # the dead writer's last beat: 100 s late
    watch, since = HealthWatch(run.store, HEALTH, attempt="a1"), time.time() - 120
    assert watch.poll(time.time() - 99, since)["status"] == "HEALTHY"
    for rec in steps(6, 7):  # written before it died, after the watcher's last poll
        old.append(rec)
    claim = reclaimed(run, "a1", membership(commit_step=5, redone=2), *steps(6, 9))
    claim.store.put_bytes(HEARTBEAT, Heartbeat("a1", 0, time.time(), 9, 0.2, time.time() - 0.2, "running",
                                               "training").to_json())
    for _ in range(20):  # the probe of the old beat, begun at the first poll, comes back meanwhile
        got = watch.poll(time.time(), since)
        assert got["status"] == "HEALTHY" and not got["fatal"], got
        time.sleep(0.01)
    assert got["evidence"]["steps_measured"] == 9 + 2 and got["evidence"]["last_step"] == 9


def test_a_stall_after_an_elastic_recovery_is_still_a_stall(tmp_path):
    run = Run(tmp_path)
    run.attempt("a1", record("start", step=0), *steps(1, 5))
    claim = reclaimed(run, "a1", membership(), *steps(6, 9))
    claim.store.put_bytes(HEARTBEAT, Heartbeat("a1", 4, time.time() - 40, 9, 0.5, time.time() - 40.5, "running",
                                               "training").to_json())  # the new writer froze after step 9
    got = poll_until(HealthWatch(run.store, HEALTH, attempt="a1"), time.time() - 120,
                     lambda got: got["status"] != "HEALTHY")
    assert got["status"] == "STALLED" and got["evidence"]["last_step"] == 9 and got["fatal"], got
