"""The in-job stall watchdog: the same rule (verdict.stalled) on the loop's progress."""
import threading
import time

from ringflow.training.health.progress import Progress
from ringflow.training.health.watchdog import StallWatchdog


def test_fires_once_when_no_step_completes():
    fired = []
    done = threading.Event()
    dog = StallWatchdog(Progress(step=4), stall_seconds=0.3, rank=1,
                        on_stall=lambda v: (fired.append(v), done.set()))
    dog.start()
    assert done.wait(3)
    dog.join(1)
    (verdict,) = fired
    assert verdict.status == "STALLED" and verdict.evidence["rank"] == 1 and verdict.evidence["last_step"] == 4
    assert verdict.evidence["seconds"] > 0.3 and verdict.evidence["limit"] == 0.3


def test_steps_that_keep_completing_are_never_a_stall():
    fired = []
    progress = Progress(step=0)
    dog = StallWatchdog(progress, stall_seconds=1.0, rank=0, on_stall=fired.append)
    dog.start()
    for step in range(1, 26):  # 2.5 s in all, each step well under the limit
        time.sleep(0.1)
        progress.beat(step)
    dog.stop()
    dog.join(1)
    assert fired == []
