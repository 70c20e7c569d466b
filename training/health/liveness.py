"""When a job is stalled, when its store is, and when neither: the two liveness rules. Pure: no clocks, no I/O.

In the job (`judged_in_job`, the stall watchdog of every rank): the training thread's own progress decides
(progress.py). While it waits for a store operation, the store is judged, not the thread: a wait whose
operation moves no byte for `store_timeout_seconds` is STORE_UNAVAILABLE; one that moves bytes, however
slowly, is waited for. Otherwise STALLED means no progress for `stall_seconds`: no step completed, or,
before the first step, start-up showed no sign of progress (a phase begun, a wait for the store ended) for
that long, or STARTUP_SECONDS if longer (verdict.stall_limit says why), however long start-up takes.

Outside the job (`judged_outside`, the Airflow trigger): rank 0's heartbeat carries the same reading. On
time, it is judged as in the job. Late, it is either the job (a dead or frozen rank 0, a lost host) or the
store that does not take the heartbeat's writes; the watcher tells them apart by the store itself: how long
the heartbeat's own last write took, and how long the watcher's own reads and probe write take
(`store_slow_seconds`). A slow store is waited for up to store_timeout_seconds, then STORE_UNAVAILABLE;
a fast store and no heartbeat is silence, judged like the job's.
"""
from __future__ import annotations

from .heartbeat import Heartbeat, ENDED
from .progress import ProgressReading
from .verdict import Verdict, stall_limit, stalled, store_unavailable

# A heartbeat this many intervals old is late: the writer is dead or frozen, or the store does not take
# its writes. One interval of slack absorbs a slow write and the poll.
LATE_AFTER_INTERVALS = 2


def judged_in_job(reading: ProgressReading, stall_seconds: float, store_timeout_seconds: float,
                  rank: int) -> Verdict | None:
    """The watchdog's verdict on this rank's progress, or None while it is alive."""
    seen_by = f"the watchdog of rank {rank}"
    waiting = reading.waiting
    if waiting is not None:
        if waiting.idle_seconds > store_timeout_seconds:
            return store_unavailable(waiting.store_uri, waiting.what, waiting.idle_seconds, store_timeout_seconds,
                                     seen_by, last_step=reading.step)
        return None
    limit = stall_limit(stall_seconds, reading.step is None)
    return stalled(reading.silent_seconds, limit, reading.step, seen_by, rank=rank,
                   phase=reading.phase if reading.step is None else None)


def judged_outside(beat: Heartbeat | None, now: float, interval: float, stall_seconds: float,
                   store_timeout_seconds: float, watching_since: float, store_slow_seconds: float,
                   store_uri: str, records_step: int | None = None) -> Verdict | None:
    """The watcher's verdict on the attempt whose last heartbeat is `beat` (None: none yet, counted from
    `watching_since`, when the watcher saw the job running); None while it is alive or once it has ended.
    store_slow_seconds: how long the watcher's own access to the run folder's store has been slow (its
    reads this poll, its probe write in flight or just finished); 0 when the store answers at once.
    records_step: the last step the attempt's health records show: a late beat written during start-up
    (rank 0 went silent between two beats, after its first step) is judged as training, not start-up."""
    if beat is not None and beat.state == ENDED:
        return None
    late = now - (beat.time if beat is not None else watching_since)
    if beat is not None and late <= LATE_AFTER_INTERVALS * interval:  # on time: the job's own reading
        if beat.waiting is not None:
            if beat.waiting.idle_seconds > store_timeout_seconds:
                return store_unavailable(beat.waiting.store_uri, beat.waiting.what, beat.waiting.idle_seconds,
                                         store_timeout_seconds, "the heartbeat of rank 0", last_step=beat.step)
            return None
        return stalled(beat.silent_seconds, _limit(beat, stall_seconds), beat.step, "the heartbeat of rank 0",
                       phase=beat.phase if beat.step is None else None)
    writes_slow = beat is not None and beat.write_seconds > interval
    if writes_slow or store_slow_seconds > interval:  # the store, not the job, keeps the heartbeat away
        if late > store_timeout_seconds:
            return store_unavailable(store_uri, "writes of heartbeat.json", late, store_timeout_seconds,
                                     f"the watcher: no heartbeat for {late:.0f}s while the store answered in "
                                     f"{max(store_slow_seconds, beat.write_seconds if beat else 0):.0f}s",
                                     last_step=beat.step if beat else None)
        return None
    if beat is None:
        return stalled(late, stall_limit(stall_seconds, True), None,
                       "the watcher: no heartbeat from this attempt since it started")
    # The store answers at once and rank 0 says nothing: silence since its last word (a wait for the
    # store it reported then is not silence, but nothing since is).
    silent = late if beat.waiting is not None else beat.silent_seconds + late
    step = beat.step if beat.step is not None else records_step
    return stalled(silent, stall_limit(stall_seconds, step is None), step,
                   f"the watcher: no heartbeat for {late:.0f}s (due every {interval:g}s)",
                   phase=beat.phase if step is None else None)


def _limit(beat: Heartbeat, stall_seconds: float) -> float:
    return stall_limit(stall_seconds, beat.step is None)
