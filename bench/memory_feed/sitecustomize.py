"""A bench's switch, not ringflow's: on the PYTHONPATH of a job's ranks (bench/sharding_order.py's
`--feeds memory`), every rank's `PartitionBatches.batches` reads and decodes its whole epoch before it serves the
first micro-batch, then serves the same micro-batches (and their row ids) from memory. The reading then
happens inside the first step, which the job's samples/s leaves out (samples_rate.WARMUP_STEPS), and the loader
thread is idle while the timed steps run: what is left is the training loop's own pace, for any revision whose
reader has `PartitionBatches.batches(seed, cursor)` yielding (index, x, y).

The module is patched as it is imported (a finder ahead of the others), so a process that never imports it
(horovodrun's launcher) loads nothing more.
"""
import importlib.abc
import importlib.machinery
import sys

TARGET = "ringflow.training.rank.partition_batches"
SAID = "[bench] memory feed: each epoch read whole before its first micro-batch"


def _fed_from_memory(cls) -> None:
    stream = cls.batches

    def batches(self, seed, cursor):
        served = [(item, getattr(self, "row_ids", None)) for item in stream(self, seed, cursor)]
        for item, ids in served:
            if ids is not None:
                self.row_ids = ids
            yield item

    cls.batches = batches
    print(SAID, file=sys.stderr, flush=True)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _fed_from_memory(module.PartitionBatches)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
