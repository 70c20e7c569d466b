"""The asynchronous checkpoint writer: training goes on while a snapshot uploads, one write in flight at most
(a due checkpoint waits, and the wait is the store's time, recorded), a NaN state is never written, a failed
upload is the store's verdict, and a write cut short leaves the previous checkpoint the newest valid one."""
import os
import sys
import threading
import time

import pytest
import torch

from ringflow.training.rank.callbacks.checkpointing import Checkpointing
from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.rank.checkpoint_writer import AsyncCheckpointWriter, NonFiniteState
from ringflow.training.health.progress import Progress
from ringflow.training.store import LocalFolderStore, StoreUnavailable
from ringflow.training.rank.training_state import STATE_FILE, TrainingState


def state(step, value=1.0):
    model = {"w": torch.full((4, 4), value)}
    optimizer = {"state": {0: {"momentum_buffer": torch.full((4, 4), value)}}, "param_groups": [{"lr": 0.1}]}
    return TrainingState(model=model, optimizer=optimizer, cursor=(0, step), step=step, torch_rng=torch.get_rng_state())


class GatedStore(LocalFolderStore):
    """Uploads of state.pt wait for `gate` (a slow store), or fail (a store that keeps failing)."""

    def __init__(self, root):
        super().__init__(root)
        self.gate, self.fail = threading.Event(), False
        self.gate.set()

    def put_file(self, key, path, *, progress=None):
        if key.endswith(STATE_FILE):
            if self.fail:
                raise StoreUnavailable("upload of s3://b/run/state.pt failed after 10 attempts (HTTP 503)")
            while not self.gate.wait(0.05):
                if progress is not None:
                    progress(1)  # a slow store still moves bytes
        super().put_file(key, path, progress=progress)


def test_the_snapshot_is_the_state_at_its_step_whatever_training_does_after(tmp_path):
    live = state(4)
    checkpoints = CheckpointStore(GatedStore(tmp_path))
    checkpoints.store.gate.clear()
    writer = AsyncCheckpointWriter(checkpoints, Progress())
    writer.submit(4, lambda: live.host_copy(), {})
    live.model["w"].add_(100.0)  # training goes on in place while the upload waits
    live.optimizer["state"][0]["momentum_buffer"].mul_(0)
    checkpoints.store.gate.set()
    writer.wait()
    saved = TrainingState.from_bytes(checkpoints.load("ckpt-000000004").files[STATE_FILE], "x")
    assert torch.equal(saved.model["w"], torch.ones(4, 4))
    assert torch.equal(saved.optimizer["state"][0]["momentum_buffer"], torch.ones(4, 4))


def test_each_snapshot_is_copied_into_the_last_one_written_never_into_one_being_written(tmp_path):
    live = state(4)
    checkpoints = CheckpointStore(GatedStore(tmp_path))
    writer = AsyncCheckpointWriter(checkpoints, Progress())
    taken = []

    def take():
        taken.append(writer.snapshot(live))
        return taken[-1]

    checkpoints.store.gate.clear()
    writer.submit(4, take, {})
    in_flight = writer.snapshot(live)  # the first is still being written: not its memory
    assert in_flight.model["w"].data_ptr() != taken[0].model["w"].data_ptr()
    checkpoints.store.gate.set()
    live.model["w"].fill_(8.0)
    writer.submit(8, take, {})  # after the first is written: into its memory
    writer.wait()
    assert taken[1].model["w"].data_ptr() == taken[0].model["w"].data_ptr()
    assert taken[1].model["w"].data_ptr() != live.model["w"].data_ptr()
    saved = {n: TrainingState.from_bytes(checkpoints.load(n).files[STATE_FILE], n).model["w"] for n in checkpoints.names()}
    assert torch.equal(saved["ckpt-000000004"], torch.ones(4, 4))
    assert torch.equal(saved["ckpt-000000008"], torch.full((4, 4), 8.0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is Linux's setpriority")
def test_the_writer_runs_nicer_than_training(tmp_path):
    from ringflow.training.rank.checkpoint_writer import WRITER_NICENESS

    seen = []

    class Recording(LocalFolderStore):
        def put_file(self, key, path, *, progress=None):
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            super().put_file(key, path, progress=progress)

    writer = AsyncCheckpointWriter(CheckpointStore(Recording(tmp_path)), Progress())
    writer.submit(4, lambda: state(4), {})
    writer.wait()
    training = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(19, training + WRITER_NICENESS)] and (seen[0] > training or training == 19)


def test_a_checkpoint_due_while_the_last_one_uploads_waits_for_it_as_a_wait_for_the_store(tmp_path):
    checkpoints = CheckpointStore(GatedStore(tmp_path))
    checkpoints.store.gate.clear()
    progress = Progress(step=4)
    written = []
    writer = AsyncCheckpointWriter(checkpoints, progress, written.append)
    writer.submit(4, lambda: state(4), {})
    seen_waiting = []
    threading.Thread(target=lambda: (time.sleep(0.3), seen_waiting.append(progress.read().waiting),
                                     checkpoints.store.gate.set())).start()
    writer.submit(8, lambda: state(8), {})  # blocks until the first upload is through
    writer.wait()
    assert seen_waiting[0].what == "upload of checkpoint ckpt-000000004" and seen_waiting[0].bytes > 0
    assert [w.name for w in written] == ["ckpt-000000004", "ckpt-000000008"]
    assert written[0].waited_seconds < 0.1 and written[1].waited_seconds >= 0.25
    assert writer.blocked_seconds >= 0.25
    assert checkpoints.names() == ["ckpt-000000008", "ckpt-000000004"]


class ChunkedUploads(LocalFolderStore):
    """Uploads of state.pt report their bytes in chunks, as an S3 upload does: `chunks` counts those sent."""

    def __init__(self, root):
        super().__init__(root)
        self.chunks = 0

    def put_file(self, key, path, *, progress=None):
        if key.endswith(STATE_FILE) and progress is not None:
            for _ in range(20):
                progress(1)
                self.chunks += 1
        super().put_file(key, path, progress=progress)


def test_an_upload_holds_back_while_the_training_thread_waits_for_its_data(tmp_path):
    """Data first on a shared link: while the training thread waits for a window its step needs, the upload
    sends no further chunk; it goes on once the data came."""
    from ringflow.training.health.store_ops import StoreOp

    store, progress = ChunkedUploads(tmp_path), Progress(step=4)
    writer = AsyncCheckpointWriter(CheckpointStore(store), progress)
    with progress.awaiting_data(StoreOp("read of part-00000.parquet row groups [0, 1]", store.uri)):
        writer.submit(4, lambda: state(4), {})
        time.sleep(0.5)
        held = store.chunks
    writer.wait()
    assert (held, store.chunks) == (0, 20)


def test_a_state_holding_nan_is_never_written(tmp_path):
    checkpoints = CheckpointStore(LocalFolderStore(tmp_path))
    writer = AsyncCheckpointWriter(checkpoints, Progress())
    writer.submit(4, lambda: state(4), {})
    writer.submit(8, lambda: state(8, value=float("nan")), {})
    with pytest.raises(NonFiniteState, match=r"step 8 holds NaN/Inf in model.w, optimizer.state.0.momentum_buffer"):
        writer.wait()
    assert checkpoints.names() == ["ckpt-000000004"]




@pytest.mark.parametrize("fault, status", [("nan", "NONFINITE"), ("store", "STORE_UNAVAILABLE")])
def test_a_failed_write_stops_the_loop_with_its_verdict(tmp_path, fault, status):
    from test_loop import make_loop

    store = GatedStore(tmp_path)
    checkpoints = CheckpointStore(store)
    writer = AsyncCheckpointWriter(checkpoints, Progress())
    checkpointing = Checkpointing(writer, every_steps=2, world_size=1, run_meta={})
    loop = make_loop([checkpointing], epochs=4)
    if fault == "nan":
        loop.model.weight.data[0, 0] = float("nan")  # health checks off: only the writer's own check sees it
    else:
        store.fail = True
    verdict = loop.run()
    assert verdict is not None and verdict.status == status, verdict
    assert checkpoints.names() == [] and checkpointing.final is None
    if fault == "nan":
        assert "model.weight" in verdict.reason and "model.weight" in verdict.evidence["tensors"]
    else:
        assert "HTTP 503" in verdict.reason and verdict.evidence["store"] == store.uri


def test_a_write_cut_short_leaves_the_previous_checkpoint_the_newest_valid(tmp_path):
    class DiesBeforeTheManifest(LocalFolderStore):
        def put_bytes(self, key, data):
            if key == "checkpoints/ckpt-000000008/MANIFEST.json":
                raise KeyboardInterrupt("killed mid-write")
            super().put_bytes(key, data)

    checkpoints = CheckpointStore(DiesBeforeTheManifest(tmp_path), prefix="checkpoints")
    writer = AsyncCheckpointWriter(checkpoints, Progress())
    writer.submit(4, lambda: state(4), {})
    writer.submit(8, lambda: state(8), {})
    with pytest.raises(KeyboardInterrupt):
        writer.wait()
    assert checkpoints.latest_valid().step == 4


def test_every_ranks_wait_for_the_previous_upload_is_recorded_with_the_checkpoint(tmp_path):
    """The wait in the checkpoint callback's rounds (all ranks, before submit) is this checkpoint's wait: in
    its record and in the training thread's checkpoint time; the snapshot's time is its own."""
    written = []
    writer = AsyncCheckpointWriter(CheckpointStore(LocalFolderStore(tmp_path)), Progress(), on_written=written.append)
    writer.submit(4, lambda: (time.sleep(0.05), state(4))[1], {}, waited_before=2.5)
    writer.wait()
    (record,) = written
    assert 2.5 <= record.waited_seconds < 2.6 and 0.05 <= record.snapshot_seconds < 1.0
    assert writer.blocked_seconds >= 2.55
