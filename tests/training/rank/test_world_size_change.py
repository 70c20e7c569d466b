"""A resume on another world size keeps the per-worker micro-batch, picks the accumulation that brings the
global batch closest to the first try's, and scales the learning rate by the global batch (a table)."""
import pytest

from ringflow.training.rank.world_size_change import accumulation_for, plan_change


@pytest.mark.parametrize("base_world, base_k, world, k", [
    (2, 1, 3, 1),    # 2 -> 3: global 3 is nearer 2 than 6 is
    (2, 1, 1, 2),    # 2 -> 1: two passes keep the global batch
    (4, 1, 3, 1),    # 4 / 3 = 1.33: one pass (global 3) beats two (6)
    (4, 1, 8, 1),    # never fewer than one pass
    (3, 1, 2, 2),    # 1.5: a tie between 2 and 4 takes the larger
    (2, 3, 4, 2),    # 6 / 4 = 1.5 -> 2 (global 8 vs 4: a tie, the larger)
    (8, 2, 5, 3),    # 16 / 5 = 3.2 -> 3
])
def test_accumulation_brings_the_global_batch_closest_to_the_original(base_world, base_k, world, k):
    assert accumulation_for(base_world, base_k, world) == k


@pytest.mark.parametrize("from_world, from_k, to_world, k, lr_factor, global_batch", [
    (2, 1, 3, 1, 1.5, 96),
    (3, 1, 1, 2, 2 / 3, 64),
    (2, 1, 2, 1, 1.0, 64),   # unchanged: nothing to do
    (1, 2, 2, 1, 1.0, 64),   # back to the first world size: the original batch and rate again
])
def test_a_change_scales_the_learning_rate_by_the_global_batch(from_world, from_k, to_world, k, lr_factor,
                                                                global_batch):
    change = plan_change(from_world, from_k, base_world_size=2, base_accumulation_steps=1, to_world_size=to_world,
                         batch_size=32)
    assert (change.accumulation_steps, change.global_batch) == (k, global_batch)
    assert change.lr_factor == pytest.approx(lr_factor)
    assert change.changed == (from_world != to_world)
    record = change.as_record()
    assert record["base_global_batch"] == 64 and record["lr_factor"] == pytest.approx(lr_factor)


def test_the_same_world_size_keeps_the_checkpoint_s_accumulation():
    change = plan_change(3, 2, base_world_size=6, base_accumulation_steps=1, to_world_size=3, batch_size=8)
    assert change.accumulation_steps == 2 and change.lr_factor == 1.0 and not change.changed


def test_world_sizes_below_one_are_refused():
    with pytest.raises(ValueError, match="must be >= 1"):
        accumulation_for(2, 1, 0)


@pytest.mark.parametrize("from_batch, from_k, batch, k, lr_factor", [
    (32, 1, 16, 2, 1.0),     # the OOM remedy: half the batch, twice the passes, the same global batch and rate
    (16, 2, 8, 4, 1.0),      # split twice
    (32, 1, 12, 3, 72 / 64),  # no exact split: the nearest global batch (72), the rate scaled to it
])
def test_a_smaller_per_worker_batch_keeps_the_global_batch(from_batch, from_k, batch, k, lr_factor):
    change = plan_change(2, from_k, base_world_size=2, base_accumulation_steps=1, to_world_size=2, batch_size=batch,
                         from_batch_size=from_batch, base_batch_size=32)
    assert change.changed and change.accumulation_steps == k
    assert change.lr_factor == pytest.approx(lr_factor)
    assert change.as_record()["base_global_batch"] == 64

