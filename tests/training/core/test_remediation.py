"""The remediation policy: one row per verdict kind and per bound (README: Job config, `remediation`)."""
import json

import pytest

from ringflow.training.core.remediation import (
    AS_IS, AVOID_NODE, CHANGE, COMPRESS_GRADIENTS, GIVE_UP, LOWER_LEARNING_RATE, MAX_AVOIDED_NODES,
    MAX_BATCH_SPLITS, MAX_BUCKET_RAISES, MAX_LEARNING_RATE_CUTS, MAX_STORE_WAIT_SECONDS, SMALLER_BATCH,
    STORE_WAIT_SECONDS, WAIT_FOR_STORE, WIDER_BUCKETS, Remedy, remedy,
)
from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.formats.engines import LOCAL, MPIJOB, TRAINJOB
from ringflow.training.health.verdict import Verdict


def config(**fields):
    return JobConfig.from_dict({"manifest_uri": "m/manifest.json", "run_uri": "runs/r", "remediation": "auto",
                                "learning_rate": 0.01, "batch_size": 32} | fields)


def taken(kind, times, **more):
    return [Remedy(CHANGE, "x", "earlier", kind, **more)] * times


NAN = Verdict("NONFINITE", "NaN", {"step": 40, "ranks": [1]})
SYNC = Verdict("DEGRADED", "sync-bound", {"kind": "sync_share", "share": 0.9, "steps": [10, 200]})
SLOW = Verdict("DEGRADED", "straggler", {"kind": "straggler", "rank": 1, "ratio": 2.0, "steps": [10, 200]})
STORE = Verdict("STORE_UNAVAILABLE", "store down", {"store": "s3://b/run", "operation": "get"})
OOM = Verdict("OOM", "out of memory", {"kind": "torch_oom", "rank": 0, "step": 3, "advice": []})
NODES = {0: "node-a", 1: "node-b"}

# (verdict, config fields, history, backend, action, remedy, settings, words contain, more fields)
ROWS = {
    # --- NONFINITE: back before the NaN, learning rate halved, twice at most
    "NaN: halve the learning rate, resume before the NaN": (
        NAN, {}, [], LOCAL, CHANGE, LOWER_LEARNING_RATE, {"learning_rate": 0.005}, "before step 40",
        {"resume_before_step": 40}),
    "NaN after one cut: the second": (
        NAN, {"learning_rate": 0.005}, taken(LOWER_LEARNING_RATE, 1), LOCAL, CHANGE, LOWER_LEARNING_RATE,
        {"learning_rate": 0.0025}, "cut 2 of 2", {}),
    "NaN after the cuts: fail, the data or the model": (
        NAN, {}, taken(LOWER_LEARNING_RATE, MAX_LEARNING_RATE_CUTS), LOCAL, GIVE_UP, None, {}, "input data", {}),
    # --- sync-bound: larger buckets twice, then fp16 compression (Horovod)
    "sync-bound, Horovod: double the fusion threshold": (
        SYNC, {}, [], LOCAL, CHANGE, WIDER_BUCKETS, {"horovod.fusion_threshold_mb": 128.0}, "90%", {}),
    "sync-bound, Horovod with fusion off: the default back": (
        SYNC, {"horovod": {"fusion_threshold_mb": 0}}, [], LOCAL, CHANGE, WIDER_BUCKETS,
        {"horovod.fusion_threshold_mb": 64.0}, "0 -> 64", {}),
    "sync-bound, Horovod, buckets raised: fp16 compression": (
        SYNC, {}, taken(WIDER_BUCKETS, MAX_BUCKET_RAISES), LOCAL, CHANGE, COMPRESS_GRADIENTS,
        {"horovod.fp16_compression": True}, "fp16_compression", {}),
    "sync-bound, Horovod, compressed already: fail": (
        SYNC, {"horovod": {"fp16_compression": True}}, taken(WIDER_BUCKETS, MAX_BUCKET_RAISES), LOCAL, GIVE_UP,
        None, {}, "no remedy left", {}),
    "sync-bound, DDP: double the bucket": (
        SYNC, {"engine": "ddp"}, taken(WIDER_BUCKETS, 1), LOCAL, CHANGE, WIDER_BUCKETS, {"ddp.bucket_cap_mb": 50.0},
        "raise 2 of 2", {}),
    "sync-bound, DDP, buckets raised: fail (no compression knob)": (
        SYNC, {"engine": "ddp"}, taken(WIDER_BUCKETS, MAX_BUCKET_RAISES), LOCAL, GIVE_UP, None, {}, "'ddp'", {}),
    "sync-bound, TensorFlow: no knob": (
        SYNC, {"engine": "tensorflow"}, [], LOCAL, GIVE_UP, None, {}, "fewer workers", {}),
    # --- straggler: keep off its node, on Kubernetes only, two nodes at most
    "straggler on a TrainJob: keep off its node": (
        SLOW, {}, [], TRAINJOB, CHANGE, AVOID_NODE, {}, "node-b", {"avoid_nodes": ("node-b",)}),
    "straggler on an MPIJob after one node: both nodes": (
        SLOW, {}, taken(AVOID_NODE, 1, avoid_nodes=("node-x",)), MPIJOB, CHANGE, AVOID_NODE, {}, "node-x",
        {"avoid_nodes": ("node-x", "node-b")}),
    "straggler after two nodes: fail, it follows the job": (
        SLOW, {}, [Remedy(CHANGE, "x", "", AVOID_NODE, avoid_nodes=("node-x", "node-y")[:MAX_AVOIDED_NODES])],
        TRAINJOB, GIVE_UP, None,
        {}, "data partition", {}),
    "straggler on a node avoided already: fail": (
        SLOW, {}, taken(AVOID_NODE, 1, avoid_nodes=("node-b",)), TRAINJOB, GIVE_UP, None, {}, "follows the job", {}),
    "straggler, locally: fail, the same host every try": (
        SLOW, {}, [], LOCAL, GIVE_UP, None, {}, "same host", {}),
    # --- the store: wait, longer each time, capped
    "store unavailable: wait, retry": (
        STORE, {}, [], LOCAL, CHANGE, WAIT_FOR_STORE, {}, "s3://b/run", {"wait_seconds": STORE_WAIT_SECONDS}),
    "store unavailable again: wait twice as long": (
        STORE, {}, taken(WAIT_FOR_STORE, 1), LOCAL, CHANGE, WAIT_FOR_STORE, {}, "wait", {"wait_seconds": 120.0}),
    "store unavailable many times: the wait is capped": (
        STORE, {}, taken(WAIT_FOR_STORE, 9), LOCAL, CHANGE, WAIT_FOR_STORE, {}, "wait",
        {"wait_seconds": MAX_STORE_WAIT_SECONDS}),
    # --- OOM: the advice that keeps the global batch, twice at most
    "OOM: half the batch, twice the backward passes": (
        OOM, {}, [], LOCAL, CHANGE, SMALLER_BATCH, {"batch_size": 16, "horovod.backward_passes_per_step": 2},
        "global batch stays 64", {}),
    "OOM under DDP: its own accumulation key": (
        OOM, {"engine": "ddp", "batch_size": 9}, [], LOCAL, CHANGE, SMALLER_BATCH,
        {"batch_size": 3, "ddp.backward_passes_per_step": 3}, "split 1 of 2", {}),
    "OOM after two splits: fail": (
        OOM, {}, taken(SMALLER_BATCH, MAX_BATCH_SPLITS), LOCAL, GIVE_UP, None, {}, "smaller model", {}),
    "OOM at batch 1: nothing to split": (
        OOM, {"batch_size": 1}, [], LOCAL, GIVE_UP, None, {}, "cannot be split", {}),
    "OOM under TensorFlow: no accumulation": (
        OOM, {"engine": "tensorflow"}, [], LOCAL, GIVE_UP, None, {}, "cannot be split", {}),
    # --- nothing to change: the failure policy decides alone
    "stalled: as is": (Verdict("STALLED", "hang", {"rank": 1}), {}, [], LOCAL, AS_IS, None, {}, "no remedy", {}),
    "diverged: as is (the failure policy fails it)": (
        Verdict("DIVERGED", "replicas differ", {"rank": 1}), {}, [], LOCAL, AS_IS, None, {}, "DIVERGED", {}),
    "no verdict (a crash): as is": (None, {}, [], LOCAL, AS_IS, None, {}, "none", {}),
    "remediation off: as is, and says how to turn it on": (
        NAN, {"remediation": "off"}, [], LOCAL, AS_IS, None, {}, '"remediation": "auto"', {}),
    # --- what earlier tries did not change does not count against a bound
    "as-is entries in the history count for nothing": (
        NAN, {}, [Remedy(AS_IS, "STALLED", "")] * 5, LOCAL, CHANGE, LOWER_LEARNING_RATE, {"learning_rate": 0.005},
        "cut 1 of 2", {}),
}


@pytest.mark.parametrize("name", ROWS)
def test_remedy(name):
    verdict, fields, history, backend, action, kind, settings, says, more = ROWS[name]
    cfg = config(**fields)
    got = remedy(verdict, cfg, history, world_size=2, backend_kind=backend, rank_nodes=NODES)
    assert (got.action, got.remedy, dict(got.settings)) == (action, kind, settings), got
    assert says in got.words, got.words
    for field, value in more.items():
        assert getattr(got, field) == value
    if got.changes:
        changed = got.applied_to(cfg)  # every change is a config JobConfig accepts
        for key, value in settings.items():
            section, _, leaf = key.rpartition(".")
            assert getattr(getattr(changed, section) if section else changed, leaf) == value
    assert Remedy.from_dict(json.loads(json.dumps(got.to_dict()))) == got  # recorded in a result, read back


def test_a_straggler_whose_node_is_not_known_fails_and_says_where_to_look():
    got = remedy(SLOW, config(), [], world_size=2, backend_kind=TRAINJOB, rank_nodes={})
    assert got.action == GIVE_UP and "pods" in got.words


def test_a_remedy_that_changes_nothing_carries_nothing():
    with pytest.raises(ValueError, match="changes nothing"):
        Remedy(GIVE_UP, "OOM", "no", settings={"batch_size": 1})
    with pytest.raises(ValueError, match="a change names one of"):
        Remedy(CHANGE, "OOM", "which?")


@pytest.mark.parametrize("value", ["on", True, None, "AUTO"])
def test_the_remediation_knob_says_what_to_use(value):
    with pytest.raises(ConfigError, match=r"config field 'remediation'.*\"off\".*\"auto\""):
        config(remediation=value)


def test_remediation_is_off_by_default():
    assert JobConfig(manifest_uri="m/manifest.json", run_uri="r").remediation == "off"
