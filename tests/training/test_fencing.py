"""A stopped attempt never writes again. Every process of a running job is frozen (SIGSTOP, as a host or a
container runtime that stops scheduling them would), a retry claims the run folder and succeeds, a model is
promoted from it, then the frozen processes are thawed: they end FENCED, and nothing anyone reads changed:
the result, the checkpoints, the health records, the promoted model. On S3 (conditional writes over HTTP); the
fencing code is the store interface's alone, and the local folder keeps the same conditional-write contract
(tests/training/store/test_store_contract.py runs it on both, across processes too), so it is not run again on
the local folder."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringflow.training.formats import exit_codes
from run_folder_files import read_health, read_result
from ringflow.training.core.registry.model_registry import ModelRegistry
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.store import S3Store

# background: mostly a frozen attempt and its retry waited out, beside the main lane (scripts/test.sh).
pytestmark = [pytest.mark.job, pytest.mark.background]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (a job's launcher, its mpirun, the ranks), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def published(store) -> dict:
    """Everything a reader of the run folder sees (run_folder.py), to compare before and after the thaw."""
    folder = RunFolder(store)
    result = read_result(store)
    return {"result": result.to_dict() if result else None, "checkpoints": folder.checkpoints().names(),
            "records": read_health(store), "pointer": json.loads(store.get_bytes("run.json"))}


@pytest.fixture
def root(s3_server):
    """(the store runs and models share, the environment a job needs for it)."""
    return S3Store.from_settings(s3_server.new_bucket("rf-fence"), "", s3_server.settings()), s3_server.env()


def test_a_frozen_attempt_thawed_after_its_retry_succeeded_ends_fenced_and_changes_nothing(
        root, digits_manifest, tmp_path):
    models, env = root
    store = models.child("runs/r1")
    run_uri = store.uri
    cfg = {"manifest_uri": digits_manifest, "run_uri": run_uri, "checkpoint": {"every_steps": 10}, "epochs": 30,
           "batch_size": 32, "learning_rate": 0.002, "health": {"every_steps": 5, "stall_seconds": 8}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(cfg))
    run_env = os.environ | env | {"PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "ringflow.training.core.cli", "train", str(path), "--np", "2", "--controller", "gloo"]
    old_log = open(tmp_path / "old.log", "w")
    old = subprocess.Popen(command, stdout=old_log, stderr=subprocess.STDOUT, env=run_env | {
        "RINGFLOW_ATTEMPT_ID": "old-attempt"}, start_new_session=True)
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not RunFolder(store).checkpoints().names():  # it trained and published a checkpoint
            assert old.poll() is None and time.monotonic() < deadline, (tmp_path / "old.log").read_text()[-3000:]
            time.sleep(0.5)
        frozen = [old.pid, *descendants(old.pid)]
        signal_all(frozen, signal.SIGSTOP)

        # The retry: a new attempt in the same run folder, while the old one's processes live on, frozen.
        retry = subprocess.run(command, capture_output=True, text=True, timeout=600,
                               env=run_env | {"RINGFLOW_ATTEMPT_ID": "retry-attempt"})
        assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
        result = read_result(store)
        assert result.succeeded and result.attempt == "retry-attempt" and result.resumed_from is not None
        registry = ModelRegistry(models)  # a promoted model, to see it stay intact
        promotion = registry.promote("fenced", run_uri=run_uri, checkpoint=result.checkpoint, metrics={"accuracy": 1.0})
        assert promotion.promoted
        promoted = {i.key: models.get_bytes(i.key) for i in models.list("models/fenced/")}
        before = published(store)

        signal_all(frozen, signal.SIGCONT)  # thawed: its watchdog sees a long silence and wakes up
        code = old.wait(timeout=120)
        out = (tmp_path / "old.log").read_text()
        assert "FENCED: attempt 1 is fenced: attempt 2 (retry-attempt) claimed the run folder" in out, out[-3000:]
        assert code != 0 and exit_codes.BY_VERDICT["FENCED"] == 8
        assert published(store) == before  # no visible write
        assert registry.production("fenced").version == promotion.version
        assert {i.key: models.get_bytes(i.key) for i in models.list("models/fenced/")} == promoted
    finally:
        signal_all(frozen, signal.SIGCONT)
        try:
            os.killpg(old.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        signal_all(descendants(old.pid), signal.SIGKILL)
        old.wait(timeout=30)
        old_log.close()
    time.sleep(1)
    assert not [p for p in frozen if Path(f"/proc/{p}").exists() and "Z" not in
                Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]], "a process of the old attempt lives"
