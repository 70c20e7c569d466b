"""Replay of a non-finite step on one rank: that step's exact minibatches, on the newest checkpoint's state
(or the initial weights), in a model of its own. Reproducible means the data; not, a transient fault.

Local only, no collective: each rank runs forward and backward over its own minibatch(es) of the step (the
cursors step_minibatches.py gives; the rows partition_batches.minibatch_rows reads back), in a fresh copy of
the model (the live one may hold the NaN already), divided by the accumulation steps as the loop does. If the
loss or the gradient is NaN/Inf again, bad_rows.py bisects the step's rows to name those that are
non-finite alone. The weights are the checkpoint's, not the ones the step ran on (those may already be
poisoned, and are gone after the optimizer step): a row that overflows the loss does so on any weights,
while a NaN from a flipped bit or a race does not come back. Dropout draws from a generator seeded with
(seed, step), so a replay is itself repeatable.

Bounded: one step, at most bad_rows.MAX_ROW_TESTS passes of the row search, stopped at `deadline`; each pass
tells `alive()` (the stall watchdog) that the rank is working. Never raises: a replay that fails returns a
report that decides nothing, and the verdict stands as it was (formats/replay_report.py).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..formats.config import RowRef
from ..formats.replay_report import ReplayReport
from .bad_rows import MAX_ROW_TESTS, find_bad_rows
from .loop import partial_loss
from .partition_batches import Cursor, PartitionBatches

# (a fresh model on the rank's device, with the rank's precision, and its loss function)
ModelFactory = Callable[[], tuple[torch.nn.Module, Callable]]


def _finite(tensors: Sequence[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.stack([torch.linalg.vector_norm(t.detach().float()) for t in tensors])).all())


class StepReplay:
    def __init__(self, make_model: ModelFactory, data: PartitionBatches, seed: int, accumulation_steps: int,
                 rank: int, alive: Callable[[], None] = lambda: None, max_tests: int = MAX_ROW_TESTS):
        self.make_model, self.data, self.seed, self.k = make_model, data, seed, accumulation_steps
        self.rank, self.alive, self.max_tests = rank, alive, max_tests

    def run(self, step: int, cursors: Sequence[Cursor], state: dict[str, torch.Tensor] | None,
            checkpoint_step: int | None, deadline: float) -> ReplayReport:
        """Replay step `step` (its minibatches: `cursors`) on `state` (None: the initial weights)."""
        started = time.monotonic()
        try:
            return self._run(step, cursors, state, checkpoint_step, deadline, started)
        except Exception as exc:  # noqa: BLE001 - a failed replay decides nothing; the verdict stands
            return ReplayReport(self.rank, step, checkpoint_step, None, seconds=time.monotonic() - started,
                                error=f"replay failed: {type(exc).__name__}: {exc}"[:300])

    def _run(self, step, cursors, state, checkpoint_step, deadline, started) -> ReplayReport:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)  # the weights a run without a checkpoint starts from (worker.Trainer)
            model, loss_fn = self.make_model()
            if state is not None:
                model.load_state_dict(state)
            model.train()
            params = [p for p in model.parameters() if p.requires_grad]
            batches = [self.data.minibatch_rows(c, self.seed) for c in cursors]
            xs = [x for x, _, _ in batches]
            ys = [y for _, y, _ in batches]
            ids = np.concatenate([i for _, _, i in batches])
            parts = len(batches)

            def nonfinite(pieces: Sequence[tuple[Any, Any]]) -> bool:
                """Forward and backward over `pieces` as one step (each loss divided by the accumulation
                steps, as the loop's; a run's short last step too): whether the loss or the gradient is NaN/Inf."""
                torch.manual_seed(self.seed * 1_000_003 + step)  # dropout: the same draws at every test
                model.zero_grad(set_to_none=True)
                try:
                    for x, y in pieces:
                        if not len(x):  # an empty micro-batch (a run of the deal is over): a zero, as the loop's
                            continue
                        loss = loss_fn(model(x), y)
                        if not torch.isfinite(loss.detach()).all():
                            return True
                        if len(x) < self.data.batch_size:  # a partial micro-batch weighs its rows, as the loop's
                            loss = partial_loss(loss, len(x), self.data.batch_size)
                        (loss / self.k if self.k > 1 else loss).backward()
                    grads = [p.grad for p in params if p.grad is not None]
                    return bool(grads) and not _finite(grads)
                finally:
                    self.alive()

            if not nonfinite(list(zip(xs, ys))):
                return ReplayReport(self.rank, step, checkpoint_step, False, seconds=time.monotonic() - started)
            x_all = torch.cat(xs) if parts > 1 else xs[0]
            y_all = torch.cat(ys) if parts > 1 else ys[0]
            size = max(1, len(x_all) // parts)  # rows are tested in pieces no larger than a minibatch

            def is_bad(rows: Sequence[int]) -> bool:
                index = torch.as_tensor(list(rows), device=x_all.device)
                x, y = x_all[index], y_all[index]
                return nonfinite([(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)])

            try:
                search = find_bad_rows(range(len(ids)), is_bad, self.max_tests, lambda: time.monotonic() > deadline)
            except Exception as exc:  # noqa: BLE001 - e.g. a model that cannot take one row (batch norm)
                return ReplayReport(self.rank, step, checkpoint_step, True, complete=False,
                                    seconds=time.monotonic() - started,
                                    error=f"row search failed: {type(exc).__name__}: {exc}"[:300])
            rows = tuple(RowRef(self.data.entries[int(ids[p][0])].key, int(ids[p][1])) for p in search.rows)
            return ReplayReport(self.rank, step, checkpoint_step, True, rows, search.tests, search.complete,
                                time.monotonic() - started)
