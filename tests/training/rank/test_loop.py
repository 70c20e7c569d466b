"""The training loop and its callback seam, in one process: a stand-in engine (what a single rank would
do) and a stand-in for PartitionData's interface. The loop's behaviour with Horovod underneath is covered
by test_horovod_training.py and test_health_faults.py."""
import pytest
import torch

from ringflow.training.rank.callbacks.base import Callback
from ringflow.training.rank.callbacks.checkpointing import Checkpointing
from ringflow.training.formats.checkpoint import CheckpointStore
from ringflow.training.rank.checkpoint_writer import AsyncCheckpointWriter
from ringflow.training.rank.data import Cursor
from ringflow.training.rank.engine import Engine
from ringflow.training.health.progress import Progress
from ringflow.training.health.verdict import Verdict
from ringflow.training.rank.loop import TrainingLoop
from ringflow.training.store import LocalFolderStore
from ringflow.training.rank.training_state import STATE_FILE, TrainingState


class OneRank(Engine):
    """A world of one: nothing to average, gathers return the rank's own tensor."""

    rank, size = 0, 1

    def __init__(self, accumulation_steps=1):
        from ringflow.training.rank.devices import Precision, choose_placement

        self.accumulation_steps = accumulation_steps
        self.placement = choose_placement(0, 0, "horovod", "fp32")  # the CPU, fp32: what every engine declares
        self.precision = Precision(self.placement)

    def distribute(self, model, optimizer):
        return optimizer

    def broadcast_state(self, model, optimizer):
        pass

    def sync_gradients(self, optimizer):
        pass

    def apply_gradients(self, optimizer):
        optimizer.step()

    def allgather(self, tensor, name):
        return tensor

    def allgather_async(self, tensor, name):
        return tensor

    def wait(self, handle):
        return handle


class Batches:
    """PartitionData's interface: `micro_batches(cursor)`, `settled(cursor)`, and `batches(seed, cursor)` from the
    cursor on."""

    def __init__(self, batches_per_epoch=3, batch_size=4):
        self.batches_per_epoch, self.batch_size = batches_per_epoch, batch_size

    def micro_batches(self, cursor):
        return self.batches_per_epoch

    def settled(self, cursor):
        return cursor

    def batches(self, seed, cursor):
        for b in range(cursor.batch, self.batches_per_epoch):
            g = torch.Generator().manual_seed(seed * 1000 + cursor.epoch * 100 + b)
            yield b, torch.randn(self.batch_size, 3, generator=g), torch.randn(self.batch_size, 1, generator=g)


class Recorder(Callback):
    def __init__(self, stop_at=None, hook="on_gradients_ready", verdict="NONFINITE"):
        self.calls, self.stop_at, self.hook, self.verdict = [], stop_at, hook, verdict

    def _stop(self, hook, loop):
        if hook == self.hook and loop.step == self.stop_at:
            return Verdict(self.verdict, "stop here")
        return None

    def on_train_start(self, loop):
        self.calls.append(("on_train_start", loop.step))

    def before_backward(self, loop, loss):
        self.calls.append(("before_backward", loop.step + 1))
        return loss

    def on_gradients_ready(self, loop, timing):
        self.calls.append(("on_gradients_ready", timing.step, timing.samples))
        return self._stop("on_gradients_ready", loop)

    def after_optimizer_step(self, loop, timing):
        self.calls.append(("after_optimizer_step", timing.step))
        return self._stop("after_optimizer_step", loop)

    def on_step_end(self, loop, timing):
        self.calls.append(("on_step_end", timing.step, loop.cursor))
        return self._stop("on_step_end", loop)

    def on_train_end(self, loop):
        self.calls.append(("on_train_end", loop.step))


def make_loop(callbacks, epochs=2, k=1, stop_on_degraded=False, data=None, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return TrainingLoop(OneRank(k), model, torch.nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                        data or Batches(), epochs=epochs, seed=0, stop_on_degraded=stop_on_degraded,
                        callbacks=callbacks, **kwargs)


def test_every_step_goes_through_the_hooks_in_order():
    rec = Recorder()
    loop = make_loop([rec])
    assert loop.run() is None
    assert rec.calls[:6] == [("on_train_start", 0), ("before_backward", 1), ("on_gradients_ready", 1, 4),
                             ("after_optimizer_step", 1), ("on_step_end", 1, Cursor(0, 1)), ("before_backward", 2)]
    assert [c[1:] for c in rec.calls if c[0] == "on_step_end"][-1] == (6, Cursor(2, 0))
    assert rec.calls[-1] == ("on_train_end", 6) and loop.finished and loop.last_step == 6


def test_gradients_of_k_micro_batches_make_one_step():
    rec = Recorder()
    loop = make_loop([rec], k=2, data=Batches(batches_per_epoch=4))
    loop.run()
    assert [c for c in rec.calls if c[0] == "on_gradients_ready"] == [("on_gradients_ready", s, 8) for s in (1, 2, 3, 4)]
    assert sum(c[0] == "before_backward" for c in rec.calls) == 8


def test_the_runs_last_step_takes_the_passes_left():
    """k=3 over 2 epochs of 4 micro-batches: steps of 3, 3 and the last 2; no micro-batch is left out of
    the model (the last epoch's tail was dropped before), and the engine is told the step ends early."""
    rec = Recorder()
    loop = make_loop([rec], k=3, data=Batches(batches_per_epoch=4))
    ended_early = []
    loop.engine.end_step_early = lambda: ended_early.append(loop.step)
    assert loop.last_step == 3
    assert loop.run() is None and loop.step == 3 and loop.finished
    assert [c[2] for c in rec.calls if c[0] == "on_gradients_ready"] == [12, 12, 8]  # samples per step
    assert ended_early == [2]  # before the run's last pass, in step 3


def test_a_resumed_loop_starts_at_its_cursor():
    rec = Recorder()
    loop = make_loop([rec], step=4, cursor=Cursor(1, 1))
    loop.run()
    steps = [c[1] for c in rec.calls if c[0] == "on_step_end"]
    assert steps == [5, 6] and rec.calls[0] == ("on_train_start", 4)


def test_a_stop_before_the_update_keeps_the_gradients_out_of_the_model():
    rec, later = Recorder(stop_at=2), Recorder()
    loop = make_loop([rec, later])
    before = {}

    class Snapshot(Callback):
        def on_step_end(self, loop, timing):
            before.update({k: v.clone() for k, v in loop.model.state_dict().items()})

    loop.callbacks.append(Snapshot())
    stop = loop.run()
    assert stop.status == "NONFINITE" and loop.step == 2 and loop.cursor == Cursor(0, 1)
    assert all(torch.equal(before[k], v) for k, v in loop.model.state_dict().items())  # step 2 never applied
    assert ("on_gradients_ready", 2, 4) not in later.calls  # a stop ends the hook for the callbacks after it
    assert not [c for c in rec.calls if c[0] in ("after_optimizer_step", "on_step_end") and c[1] == 2]
    assert not [c for c in rec.calls if c[0] == "on_train_end"]


@pytest.mark.parametrize("verdict, stop_on_degraded, stops", [
    ("NONFINITE", False, True), ("DIVERGED", False, True), ("STALLED", False, True),
    ("DEGRADED", False, False), ("DEGRADED", True, True), ("HEALTHY", True, False),
])
def test_which_verdicts_stop_the_loop(verdict, stop_on_degraded, stops):
    loop = make_loop([Recorder(stop_at=3, hook="on_step_end", verdict=verdict)], stop_on_degraded=stop_on_degraded)
    stop = loop.run()
    assert (stop is not None) == stops and loop.step == (3 if stops else 6)


def test_checkpointing_writes_on_its_cadence_and_a_final_one_with_what_callbacks_add(tmp_path):
    store = CheckpointStore(LocalFolderStore(tmp_path), keep_last=None)
    seen = []

    class Adds(Callback):
        def before_checkpoint(self, loop, meta, final):
            meta["note"] = "final" if final else "periodic"

        def on_checkpoint(self, loop, name, final):
            seen.append((name, final))

    writer = AsyncCheckpointWriter(store, Progress())
    checkpointing = Checkpointing(writer, every_steps=4, world_size=1, run_meta={"manifest_uri": "m"})
    loop = make_loop([Adds(), checkpointing])
    assert loop.run() is None
    assert seen == [("ckpt-000000004", False), ("ckpt-000000006", True)] and checkpointing.final == "ckpt-000000006"
    assert store.names() == ["ckpt-000000006", "ckpt-000000004"]  # the final one is complete when run() returns
    meta = store.read_manifest("ckpt-000000006").meta
    assert meta["final"] and meta["note"] == "final" and meta["cursor"] == [2, 0] and meta["manifest_uri"] == "m"
    state = TrainingState.from_bytes(store.load("ckpt-000000004").files[STATE_FILE], "ckpt-000000004")
    assert state.step == 4 and state.cursor == (1, 1)
    other_rank = Checkpointing(None, every_steps=4, world_size=2, run_meta={})
    # Rank 1 of 2: the allgather brings rank 0's word that its last upload is done.
    loop.engine.allgather = lambda tensor, name: torch.cat([torch.zeros_like(tensor), tensor])
    assert other_rank.on_train_end(loop) is None and other_rank.final == "ckpt-000000006"  # rank 1 writes nothing


def test_the_loop_leaves_the_loss_a_tensor_until_it_is_read():
    loop = make_loop([Recorder()])
    loop.run()
    assert loop._loss_value is None  # no float() of the loss per step: on a GPU each would wait for the device
    assert isinstance(loop.loss, torch.Tensor) and not loop.loss.requires_grad
    assert loop.last_loss == float(loop.loss) and loop._loss_value == loop.last_loss
    resumed = make_loop([], last_loss=0.25)
    assert resumed.last_loss == 0.25  # before its first step: the checkpoint's


def test_each_hook_is_called_on_the_callbacks_that_implement_it():
    from ringflow.training.rank.loop import implementing

    class OnlyStepEnd(Callback):
        def on_step_end(self, loop, timing):
            return None

    rec, plain, step_end = Recorder(), Callback(), OnlyStepEnd()
    assert implementing([rec, plain, step_end], "on_step_end") == [rec.on_step_end, step_end.on_step_end]
    assert implementing([rec, plain, step_end], "after_backward") == []
    assert implementing([plain, rec], "before_backward") == [rec.before_backward]


class Ticker(Callback):
    """Moves a fake clock on by `seconds` at every step's end (before the checkpointing callback looks)."""

    def __init__(self, seconds):
        self.now, self.seconds = 0.0, seconds

    def clock(self):
        return self.now

    def on_step_end(self, loop, timing):
        self.now += self.seconds


@pytest.mark.parametrize("every_steps, floor_seconds, step_seconds, taken, skipped", [
    (1, 0.0, 3.0, [1, 2, 3, 4, 5, 6], 0),  # no floor: every due step (what an explicit every_steps means)
    (1, 10.0, 3.0, [4, 6], 5),             # 12 s at step 4; 15 and 18 s are too soon; the final always
    (2, 5.0, 3.0, [2, 4, 6], 0),           # due every 2 steps = 6 s apart, over the 5 s floor: all taken
    (2, 7.0, 3.0, [4, 6], 2),              # 6 s after the start is too soon, 12 s is not, 18 s too soon
    (1, 100.0, 3.0, [6], 6),               # a floor longer than the run: only the final one
])
def test_the_time_floor_skips_due_steps_until_it_has_passed(tmp_path, every_steps, floor_seconds, step_seconds,
                                                            taken, skipped):
    store = CheckpointStore(LocalFolderStore(tmp_path), keep_last=None)
    ticker = Ticker(step_seconds)
    checkpointing = Checkpointing(AsyncCheckpointWriter(store, Progress()), every_steps=every_steps, world_size=1,
                                  run_meta={}, floor_seconds=floor_seconds, clock=ticker.clock)
    loop = make_loop([ticker, checkpointing])
    assert loop.run() is None
    assert sorted(int(name.split("-")[1]) for name in store.names()) == taken
    assert checkpointing.skipped == skipped


def test_rank_0s_skip_word_makes_every_rank_skip_the_due_step():
    """The other ranks have no clock of their own in it: rank 0's word (SKIP) in the allgather decides."""
    from ringflow.training.rank.callbacks.checkpointing import SKIP

    loop = make_loop([])
    words = []

    def allgather(tensor, name):
        words.append(name)
        return torch.cat([torch.full_like(tensor, float(SKIP)), tensor])  # rank 0 says SKIP, rank 1 its own

    loop.engine.allgather = allgather
    rank1 = Checkpointing(None, every_steps=1, world_size=2, run_meta={})
    assert rank1.on_step_end(loop, type("T", (), {"step": 1})()) is None
    assert rank1.skipped == 1 and words == ["ringflow.checkpoint_wait"] and rank1.final is None


def test_a_slow_sync_fault_is_timed_as_the_steps_all_reduce_not_its_compute():
    """faults' slow_sync sleeps in before_sync, inside the loop's timed all-reduce wait: the step's sync time
    grows by it (a sync-bound step as health sees it), from its step on."""
    from ringflow.training.formats.config import JobConfig
    from ringflow.training.rank.callbacks.faults import FaultInjection

    cfg = JobConfig.from_dict({"manifest_uri": "m.json", "run_uri": "run",
                               "faults": [{"kind": "slow_sync", "rank": 0, "step": 3, "seconds": 0.05}]})
    timings = []

    class Timings(Callback):
        def on_gradients_ready(self, loop, timing):
            timings.append(timing)

    make_loop([FaultInjection(cfg, rank=0), Timings()]).run()
    slow = {t.step for t in timings if t.sync_time >= 0.05}
    assert slow == {3, 4, 5, 6}
    assert all(t.step_time >= t.sync_time for t in timings)
class UnevenBatches(Batches):
    """A run that ends in a partial micro-batch (2 rows of 4), then an empty one (another rank's run is longer)."""

    def __init__(self):
        super().__init__(batches_per_epoch=3, batch_size=4)

    def batches(self, seed, cursor):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(6, 3, generator=g), torch.randn(6, 1, generator=g)
        for b, (lo, hi) in enumerate([(0, 4), (4, 6), (6, 6)][cursor.batch:], start=cursor.batch):
            yield b, x[lo:hi], y[lo:hi]


def test_a_partial_micro_batch_weighs_its_rows_and_an_empty_one_joins_the_step_with_no_gradient():
    """k=3: one step of 4 + 2 + 0 rows; its gradient is the sum over the 6 rows' losses / (3 x 4): every row
    weighs as a row of a full micro-batch, and the empty micro-batch adds nothing."""
    data = UnevenBatches()
    loop = make_loop([], epochs=1, k=3, data=data)
    start = {n: p.detach().clone() for n, p in loop.model.named_parameters()}
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(start)
    x, y = torch.cat([b[1] for b in data.batches(0, Cursor())]), torch.cat([b[2] for b in data.batches(0, Cursor())])
    (torch.nn.functional.mse_loss(reference(x), y, reduction="sum") / 12).backward()
    assert loop.run() is None and loop.step == 1
    for name, p in loop.model.named_parameters():
        torch.testing.assert_close(p.detach(), start[name] - 0.1 * dict(reference.named_parameters())[name].grad)
