"""What to change after an OOM (health/oom_advice.py): one row per job shape."""
import pytest

from ringflow.training.formats.config import JobConfig
from ringflow.training.health.oom_advice import (ACCUMULATE, MORE_MEMORY, MORE_WORKERS, SMALLER_MODEL, JobShape,
                                                 advise, smallest_factor)

MiB = 2**20

# (shape, limit_bytes) -> [(option, settings)] best first
ROWS = {
    "even batch: halve it, double the passes, same global batch": (
        JobShape(32, 1, 2, "horovod", (64, 64)), None,
        [(ACCUMULATE, {"batch_size": 16, "horovod.backward_passes_per_step": 2}),
         (SMALLER_MODEL, {"model.hidden": [32, 32]}),
         (MORE_WORKERS, {"num_workers": 4, "batch_size": 16})]),
    "already accumulating, under ddp": (
        JobShape(8, 4, 4, "ddp", (128,)), None,
        [(ACCUMULATE, {"batch_size": 4, "ddp.backward_passes_per_step": 8}),
         (SMALLER_MODEL, {"model.hidden": [64]}),
         (MORE_WORKERS, {"num_workers": 8, "batch_size": 4})]),
    "odd batch: its smallest factor, so it still divides the partitions": (
        JobShape(45, 1, 2, "horovod", (64,)), None,
        [(ACCUMULATE, {"batch_size": 15, "horovod.backward_passes_per_step": 3}),
         (SMALLER_MODEL, {"model.hidden": [32]}),
         (MORE_WORKERS, {"num_workers": 6, "batch_size": 15})]),
    "batch of one: only the model and the memory are left": (
        JobShape(1, 1, 2, "horovod", None), 512 * MiB,
        [(SMALLER_MODEL, {}), (MORE_MEMORY, {"memory_bytes": 1024 * MiB})]),
    "a custom model and a known limit": (
        JobShape(64, 1, 2, "horovod", None), 256 * MiB,
        [(ACCUMULATE, {"batch_size": 32, "horovod.backward_passes_per_step": 2}), (SMALLER_MODEL, {}),
         (MORE_WORKERS, {"num_workers": 4, "batch_size": 32}), (MORE_MEMORY, {"memory_bytes": 512 * MiB})]),
    "tensorflow: no accumulation to offer, more workers at a smaller batch keep the global batch": (
        JobShape(32, 1, 2, "tensorflow", (64,), accumulates=False), None,
        [(SMALLER_MODEL, {"model.hidden": [32]}), (MORE_WORKERS, {"num_workers": 4, "batch_size": 16})]),
    "the job's config not known (seen by Kubernetes): words, no numbers": (
        None, 2 * 2**30,
        [(ACCUMULATE, {}), (SMALLER_MODEL, {}), (MORE_WORKERS, {}), (MORE_MEMORY, {"memory_bytes": 4 * 2**30})]),
}


@pytest.mark.parametrize("name", ROWS)
def test_advice(name):
    shape, limit, expected = ROWS[name]
    got = advise(shape, limit, "a limit")
    assert [(a.option, dict(a.settings)) for a in got] == expected
    assert all(a.words for a in got)


@pytest.mark.parametrize("shape", [JobShape(32, 1, 2), JobShape(45, 3, 5), JobShape(6, 2, 7, "ddp")])
def test_the_first_advice_keeps_the_global_batch(shape):
    settings = advise(shape)[0].settings
    passes = settings[f"{shape.engine}.backward_passes_per_step"]
    assert settings["batch_size"] * passes * shape.world_size == shape.global_batch
    assert shape.batch_size % settings["batch_size"] == 0  # it divides every partition the old one did


def test_the_shape_of_a_job_config():
    cfg = JobConfig.from_dict({"manifest_uri": "/data/manifest.json", "run_uri": "/data/run", "batch_size": 16,
                               "engine": "ddp", "ddp": {"backward_passes_per_step": 2}})
    assert JobShape.of(cfg, 4) == JobShape(16, 2, 4, "ddp", (64, 64))
    assert JobShape.of(cfg, 4, engine="horovod").backward_passes_per_step == 1
    # TensorFlow's section has no backward_passes_per_step: one pass per step, nothing to accumulate.
    tf_shape = JobShape.of(cfg, 4, engine="tensorflow")
    assert (tf_shape.backward_passes_per_step, tf_shape.accumulates) == (1, False)


@pytest.mark.parametrize("n, f", [(2, 2), (9, 3), (45, 3), (49, 7), (13, 13)])
def test_smallest_factor(n, f):
    assert smallest_factor(n) == f


def test_bad_shape_is_named():
    with pytest.raises(ValueError, match="JobShape.batch_size is 0"):
        JobShape(0, 1, 2)
