"""Waiting for something a test started in another process (on tests/training's path through its conftest)."""
import time


def wait_for(predicate, timeout: float = 120, every: float = 0.2) -> bool:
    """True once `predicate()` is, False if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False
