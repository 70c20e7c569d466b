"""How the ranks' replays of a non-finite step reach rank 0: through the run folder, not a collective.

Each rank writes its report as a file of its own under the attempt's prefix (RunFolder.write_replay_report);
rank 0 reads them until every rank's is there or the time is up, and names the ranks it did not hear from.
A collective (one allgather of the reports) would be quicker by a store round trip, but a rank stuck in its
replay, or already gone, would hang it, and rank 0 with it: the verdict would then be lost to a STALLED one.
Files survive a stuck or dead rank; rank 0 waits at most until the deadline and decides with what it has.

Rank 0 first waits for its checkpoint upload in flight, then publishes the plain verdict (RunResult.replaying)
and replays; the other ranks wait for that result before they read the newest checkpoint, so every rank
replays on the same one. Once their report is written, they wait (as long as rank 0 may) for rank 0's result
to carry the replay: a rank that exits early makes the launcher (horovodrun, torchrun) end the whole job,
rank 0's gather with it. Since the plain verdict was published first, even then it is never lost.
"""
from __future__ import annotations

import time
from typing import Callable

from ..formats.replay_report import ReplayReport
from ..formats.run_folder import RunFolder
from ..formats.run_result import ResultError, RunResult

# How often rank 0 looks for the others' reports, and they for rank 0's result.
POLL_SECONDS = 0.2
# How long after the replay's own deadline rank 0 still waits for reports (a report's upload, a slow start).
GRACE_SECONDS = 10.0


def publish_report(folder: RunFolder, attempt: str, report: ReplayReport) -> None:
    folder.write_replay_report(attempt, report.rank, report.to_json())


def gather_reports(folder: RunFolder, attempt: str, world_size: int, until: float,
                   alive: Callable[[], None] = lambda: None) -> list[ReplayReport]:
    """The reports of attempt `attempt` by monotonic time `until`, or as soon as every rank's is there."""
    while True:
        reports = {}
        for raw in folder.read_replay_reports(attempt):
            try:
                report = ReplayReport.from_json(raw)
            except (ValueError, TypeError):
                continue  # a report being written: read again on the next round
            reports[report.rank] = report
        alive()
        if len(reports) >= world_size or time.monotonic() >= until:
            return [reports[r] for r in sorted(reports)]
        time.sleep(POLL_SECONDS)


def wait_for_result(folder: RunFolder, attempt: str, until: float, done: Callable[[RunResult], bool],
                    alive: Callable[[], None] = lambda: None) -> bool:
    """Wait (at most until monotonic time `until`) for rank 0's result of `attempt` to be `done`."""
    while time.monotonic() < until:
        try:
            result = folder.read_result(attempt)
        except (ResultError, OSError):
            result = None  # being written, or the store hiccuped: read again until `until`
        if result is not None and done(result):
            return True
        alive()
        time.sleep(POLL_SECONDS)
    return False


def replay_started(result: RunResult) -> bool:
    """Rank 0 published its verdict and replays: the checkpoint in flight, if any, is published too."""
    return result.replaying or gathered(result)


def gathered(result: RunResult) -> bool:
    """Rank 0's result carries what the replay found (or why it found nothing)."""
    evidence = result.verdict.evidence if result.verdict is not None else {}
    return "replay" in evidence or "replay_unavailable" in evidence
