"""When a job is stalled, when its store is, and when neither: the two liveness rules. Pure: no clocks, no I/O.

In the job (`judged_in_job`, the stall watchdog of every rank): the training thread's own progress decides
(progress.py). While it waits for a store operation, the store is judged, not the thread: a wait whose
operation moves no byte for `store_timeout_seconds` is STORE_UNAVAILABLE; one that moves bytes, however
slowly, is waited for. Otherwise STALLED means no progress for `stall_seconds`: no step completed, or,
before the first step, start-up showed no sign of progress (a phase begun, a wait for the store ended) for
that long, or STARTUP_SECONDS if longer (verdict.stall_limit says why), however long start-up takes. An elastic
job's round after a change of workers (rank/elastic.py) is start-up again, though steps were done: its phase
goes back to the rendezvous, where the survivors wait for Horovod's driver and for a joining worker to start and
import torch (or for a hung peer's own watchdog to end it), then on to the round's restore and first step; its
silence gets the same allowance (`starting`), so a recovery is not a stall, and a rendezvous that never ends (a
frozen peer Horovod still counts as alive) still is.

Outside the job (`judged_outside`, the Airflow trigger): rank 0's heartbeat carries the same reading, judged
as in the job however late the beat arrives. Late, it is either the job (a dead or frozen rank 0, a lost host)
or the store that does not take the heartbeat's writes; the watcher tells them apart by the store itself: how
long the heartbeat's own last write took, and how long the watcher's own read of the heartbeat and probe
write take (`StoreSeen`). A slow store is waited for up to store_timeout_seconds, then STORE_UNAVAILABLE; a store whose
probe write, begun after the beat went late, came back at once, and no heartbeat is silence, judged like the
job's.
"""
from __future__ import annotations

import dataclasses

from .heartbeat import Heartbeat, ENDED
from .progress import TRAINING, ProgressReading
from .verdict import Verdict, stall_limit, stalled, store_unavailable

# A heartbeat this many intervals old is late: the writer is dead or frozen, or the store does not take
# its writes. One interval of slack absorbs a slow write and the poll.
LATE_AFTER_INTERVALS = 2


# An elastic job's rank blocked in a collective waits this many stall_seconds before it judges itself stalled: the
# peer that hangs (alive, silent, not in the collective) judges itself at stall_seconds and leaves the job, and its
# death fails the collective, so the survivors go on (rank/elastic.py) instead of stalling with it.
PEER_WAIT_STALLS = 2


def starting(step: int | None, phase: str | None) -> bool:
    """Whether the training thread is in start-up: before its first step, or in a later round's (a phase other
    than training after steps: an elastic job's rendezvous after a change of workers, the round's restore and
    first step). A phase of None (a heartbeat from before phases were recorded) is training."""
    return step is None or phase not in (None, TRAINING)


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
    start_up = starting(reading.step, reading.phase)
    limit = stall_limit(stall_seconds, start_up) * (PEER_WAIT_STALLS if reading.waiting_on_peers else 1)
    return stalled(reading.silent_seconds, limit, reading.step, seen_by, rank=rank,
                   phase=reading.phase if start_up else None)


@dataclasses.dataclass(frozen=True)
class StoreSeen:
    """What the watcher knows of the run folder's store (core/runs/store_probe.py), on its own clock (unix
    seconds)."""
    slow_seconds: float         # how slow its access is now: this poll's reads, its probe write in flight or
                                # just finished; 0 for a store that answers at once
    answered_at: float | None   # when the newest probe write that has come back began; None: none has
    slow_spells: tuple[tuple[float, float], ...] = ()  # (from, to): a probe write or a poll's reads that was slow


def _slow_within(spells: tuple[tuple[float, float], ...], start: float, end: float) -> tuple[float, float]:
    """(seconds of [start, end] the store was seen slow in, when the last such spell ended, or `start`)."""
    covered, last_end, reach = 0.0, start, start
    for lo, hi in sorted(spells):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reach = last_end = hi
    return covered, last_end


def judged_outside(beat: Heartbeat | None, now: float, interval: float, stall_seconds: float,
                   store_timeout_seconds: float, watching_since: float, store: StoreSeen,
                   store_uri: str, records_step: int | None = None) -> Verdict | None:
    """The watcher's verdict on the attempt whose last heartbeat is `beat` (None: none yet, counted from
    `watching_since`, when the watcher saw the job running); None while it is alive or once it has ended.
    records_step: the last step the attempt's health records show: a late beat written during start-up
    (rank 0 went silent between two beats, after its first step) is judged as training, not start-up."""
    if beat is not None and beat.state == ENDED:
        return None
    if beat is not None:
        # What rank 0 read when it wrote the beat holds however late the beat arrives: a store slow to take
        # heartbeats (a disk busy with fsyncs) must not hide a silence the beat itself already reports.
        own = _as_written(beat, stall_seconds, store_timeout_seconds)
        if own is not None:
            return own
    last_word = beat.time if beat is not None else watching_since
    late = now - last_word
    due = LATE_AFTER_INTERVALS * interval
    if beat is not None and late <= due:  # on time: the job's own reading said it
        return None
    writes_slow = beat is not None and beat.write_seconds > interval
    if writes_slow or store.slow_seconds > interval:  # the store, not the job, keeps the heartbeat away
        if late > store_timeout_seconds:
            return store_unavailable(store_uri, "writes of heartbeat.json", late, store_timeout_seconds,
                                     f"the watcher: no heartbeat for {late:.0f}s while the store answered in "
                                     f"{max(store.slow_seconds, beat.write_seconds if beat else 0):.0f}s",
                                     last_step=beat.step if beat else None)
        return None
    # The store answers now. The time it was seen slow is no silence: the heartbeats it held back (and rank
    # 0's writes queued behind them) get their interval again after it, and only that time is taken out.
    slow, settled = _slow_within(store.slow_spells, last_word, now)
    unheard = late - slow
    if beat is not None and unheard <= due:
        return None
    if store.answered_at is None or store.answered_at < max(last_word + due, settled):
        # The watcher's probe has not come back since the beat went late (or the store was last slow): a
        # store that just stopped taking writes looks fast until its probe write is seen to hang. Silence is
        # called only against a store seen to answer.
        return None
    if beat is None:
        return stalled(unheard, stall_limit(stall_seconds, True), None,
                       "the watcher: no heartbeat from this attempt since it started")
    # Rank 0 says nothing: silence since its last word (a wait for the store it reported then is not
    # silence, but nothing since is), less the time the store was seen slow.
    silent = unheard if beat.waiting is not None else beat.silent_seconds + unheard
    step = beat.step if beat.step is not None else records_step
    # A beat from the first start-up whose records show steps since: training, whatever phase it said then.
    start_up = starting(step, beat.phase if beat.step is not None or step is None else TRAINING)
    return stalled(silent, stall_limit(stall_seconds, start_up), step,
                   f"the watcher: no heartbeat for {late:.0f}s (due every {interval:g}s)",
                   phase=beat.phase if start_up else None)


def _as_written(beat: Heartbeat, stall_seconds: float, store_timeout_seconds: float) -> Verdict | None:
    """The in-job rule on the reading the beat carries."""
    if beat.waiting is not None:
        if beat.waiting.idle_seconds > store_timeout_seconds:
            return store_unavailable(beat.waiting.store_uri, beat.waiting.what, beat.waiting.idle_seconds,
                                     store_timeout_seconds, "the heartbeat of rank 0", last_step=beat.step)
        return None
    start_up = starting(beat.step, beat.phase)
    limit = stall_limit(stall_seconds, start_up) * (PEER_WAIT_STALLS if beat.waiting_on_peers else 1)
    return stalled(beat.silent_seconds, limit, beat.step, "the heartbeat of rank 0",
                   phase=beat.phase if start_up else None)
