"""The one OOM verdict (health/oom.py): an exception classified by its type's name (TensorFlow's without
TensorFlow), the evidence and its words (the log line that carries it out of a rank other than 0:
test_verdict_line.py)."""
import pytest
import torch

from ringflow.training.health.oom import (KERNEL_OOM_KILLER, MEMORY_ERROR, TF_RESOURCE_EXHAUSTED, TORCH_OOM,
                                         MemoryEvidence, classify, oom_verdict, requested_bytes, with_step)
from ringflow.training.health.oom_advice import JobShape
from ringflow.training.health.verdict import FATAL, OOM

MiB = 2**20


class ResourceExhaustedError(Exception):
    """Named as tensorflow.errors.ResourceExhaustedError is (its base there is OpError)."""


class TfOpError(Exception):
    pass


class TfResourceExhausted(TfOpError):
    pass


TfResourceExhausted.__name__ = "ResourceExhaustedError"

CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
               "to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)")

CLASSIFY = {
    "torch.OutOfMemoryError (what CUDA raises)": (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                                         "2.00 GiB"), TORCH_OOM),
    "torch.cuda.OutOfMemoryError, the same class": (torch.cuda.OutOfMemoryError("x"), TORCH_OOM),
    "torch's CPU allocator: a RuntimeError": (RuntimeError(CPU_MESSAGE), TORCH_OOM),
    "an older CUDA RuntimeError": (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), TORCH_OOM),
    "TensorFlow's ResourceExhaustedError, by name": (ResourceExhaustedError("OOM when allocating tensor"),
                                                     TF_RESOURCE_EXHAUSTED),
    "a subclass named so, below another base": (TfResourceExhausted("OOM"), TF_RESOURCE_EXHAUSTED),
    "MemoryError": (MemoryError(), MEMORY_ERROR),
    "a subclass of MemoryError": (type("ArenaFull", (MemoryError,), {})(), MEMORY_ERROR),
    "another RuntimeError is no OOM": (RuntimeError("Connection closed by peer"), None),
    "a ValueError is no OOM": (ValueError("out of range"), None),
}


@pytest.mark.parametrize("name", CLASSIFY)
def test_classify(name):
    exc, kind = CLASSIFY[name]
    assert classify(exc) == kind


def test_classify_the_real_torch_cpu_oom():
    """torch on CPU raises its allocator's RuntimeError only where malloc fails: asked for more than any
    machine has (2^60 bytes), it fails here without a cap."""
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**57, dtype=torch.float64)
    assert classify(caught.value) == TORCH_OOM
    assert requested_bytes(str(caught.value)) == 2**60


@pytest.mark.parametrize("message, expected", [
    (CPU_MESSAGE, 8589934592),
    ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)", 2 * 2**30),
    ("Tried to allocate 20.50 MiB", int(20.5 * MiB)),
    ("out of memory", None),
])
def test_requested_bytes(message, expected):
    assert requested_bytes(message) == expected


def evidence(**kw):
    fields = dict(kind=MEMORY_ERROR, rank=1, step=12, seen_by="rank 1 itself", limit_bytes=512 * MiB,
                  limit_source="memory cgroup /sys/fs/cgroup/memory/job", peak_rss_bytes=500 * MiB)
    return MemoryEvidence(**(fields | kw))


def test_the_verdict_names_rank_step_memory_and_what_to_change():
    verdict = oom_verdict(evidence(), JobShape(batch_size=32, backward_passes_per_step=1, world_size=2))
    assert verdict.status == OOM and verdict.is_fatal() and OOM in FATAL
    for words in ("rank 1 ran out of memory at step 12", "MemoryError", "limit 512 MiB", "peak RSS 500 MiB",
                  "batch_size 32 -> 16 and horovod.backward_passes_per_step 1 -> 2", "global batch stays 64"):
        assert words in verdict.reason, (words, verdict.reason)
    e = verdict.evidence
    assert (e["rank"], e["step"], e["kind"], e["limit_bytes"]) == (1, 12, MEMORY_ERROR, 512 * MiB)
    assert e["advice"][0]["settings"] == {"batch_size": 16, "horovod.backward_passes_per_step": 2}


def test_bad_kind_is_named():
    with pytest.raises(ValueError, match="OOM kind 'swap'"):
        evidence(kind="swap")


def test_a_step_learnt_elsewhere_fills_one_not_known():
    outside = oom_verdict(evidence(kind=KERNEL_OOM_KILLER, step=None, seen_by="the launcher"), None)
    assert "at a step not known" in outside.reason
    filled = with_step(outside, 8)
    assert filled.evidence["step"] == 8 and "at step 8" in filled.reason
    assert with_step(filled, 9) == filled  # a known step stays
    assert with_step(outside, None) == outside
