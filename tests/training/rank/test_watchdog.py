"""The in-job stall watchdog: liveness.judged_in_job on the loop's progress (the rule's table: test_liveness.py)."""
import threading
import time

from ringflow.training.health.progress import Progress
from ringflow.training.rank.watchdog import StallWatchdog


def test_fires_once_when_no_step_completes():
    fired = []
    done = threading.Event()
    dog = StallWatchdog(Progress(step=4), stall_seconds=0.3, store_timeout_seconds=60, rank=1,
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
    dog = StallWatchdog(progress, stall_seconds=1.0, store_timeout_seconds=60, rank=0, on_stall=fired.append)
    dog.start()
    for step in range(1, 26):  # 2.5 s in all, each step well under the limit
        time.sleep(0.1)
        progress.beat(step)
    dog.stop()
    dog.join(1)
    assert fired == []


def test_a_wait_for_a_store_that_moves_is_never_a_stall_and_one_that_moves_nothing_is_the_stores():
    from ringflow.training.health.store_ops import StoreOp

    fired = []
    done = threading.Event()
    progress = Progress(step=7)
    dog = StallWatchdog(progress, stall_seconds=0.3, store_timeout_seconds=0.8, rank=0,
                        on_stall=lambda v: (fired.append(v), done.set()))
    op = StoreOp("upload of checkpoint ckpt-000000007", "s3://b/run")
    dog.start()
    with progress.waiting(op):
        for _ in range(10):  # 1 s of a slow upload, three times stall_seconds: bytes keep arriving
            time.sleep(0.1)
            op.moved(4096)
        assert fired == []
        assert done.wait(3)  # then nothing moves
    (verdict,) = fired
    assert verdict.status == "STORE_UNAVAILABLE" and verdict.evidence["store"] == "s3://b/run"
    assert "upload of checkpoint ckpt-000000007" in verdict.reason and verdict.evidence["seconds"] > 0.8
