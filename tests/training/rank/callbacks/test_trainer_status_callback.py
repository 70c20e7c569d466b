"""Rank 0's trainerStatus callback (rank/callbacks/trainer_status.py) on a loop without torch: one report at the
start, then at most one every 5 s of steps, and the last one (100%) at the end, after which the reporter closes."""
from __future__ import annotations

import types

from ringflow.training.rank.callbacks.trainer_status import TrainerStatusReporting


class Reporter:
    def __init__(self):
        self.reports, self.closed = [], False

    def submit(self, status):
        self.reports.append(status)

    def close(self):
        self.closed = True


class Data:
    """The reader's row count (partition_batches.PartitionBatches.epoch_rows / rows_seen): 10 micro-batches of 32."""
    epoch_rows = 320

    @staticmethod
    def rows_seen(cursor):
        return cursor.batch * 32


def test_reports_follow_the_data_order_at_most_every_five_seconds():
    now = [100.0]
    reporter = Reporter()
    callback = TrainerStatusReporting(reporter, world_size=2, clock=lambda: now[0])
    # resumed at epoch 1, batch 0 of 2 epochs x 10 batches: half done before this attempt
    loop = types.SimpleNamespace(data=Data(), epochs=2, step=10, last_loss=0.5,
                                 cursor=types.SimpleNamespace(epoch=1, batch=0))
    callback.on_train_start(loop)
    for batch in range(1, 11):
        now[0] += 1.5  # a step every 1.5 s
        loop.step += 1
        loop.cursor = types.SimpleNamespace(epoch=1 if batch < 10 else 2, batch=batch % 10)
        callback.on_step_end(loop, types.SimpleNamespace(samples=32, epoch=1))
    callback.on_train_end(loop)
    progress = [r.progress_percentage for r in reporter.reports]
    # the start (50%), the 4th step at +6 s (70%), the 8th at +12 s (90%; the 5th..7th came under 5 s after the
    # last report), none for the 9th and 10th, then the end
    assert progress == [50, 70, 90, 100], progress
    assert reporter.reports[0].estimated_remaining_seconds is None  # nothing done by this attempt yet
    assert reporter.reports[1].estimated_remaining_seconds == 9  # 6 batches' rows left at 4 / 6 s
    assert reporter.reports[-1].estimated_remaining_seconds == 0 and reporter.closed
    last = reporter.reports[-1].metrics
    assert last["step"] == "20" and last["epoch"] == "2" and last["workers"] == "2" and last["loss"] == "0.5"
