"""The remediation policy: one row per verdict kind and per bound (docs/guides/job-config.md, `remediation`)."""
import json

import pytest

from ringflow.training.core.remediation import (
    MAX_AVOIDED_NODES, MAX_BATCH_SPLITS, MAX_BUCKET_RAISES, MAX_LEARNING_RATE_CUTS, MAX_PLAIN_RETRIES, MAX_ROW_SKIPS,
    MAX_STORE_WAIT_SECONDS, STORE_WAIT_SECONDS, PlannedRemedy, Remedy, RemedyAction, RemedyName, apply_remedies,
    avoided_nodes, rank_nodes, remedy, remedy_words, wait_before,
)
from ringflow.training.formats.config import ConfigError, JobConfig
from ringflow.training.formats.engines import LOCAL, MPIJOB, TRAINJOB
from ringflow.training.health.verdict import Verdict

CHANGE, AS_IS, GIVE_UP = RemedyAction
(LOWER_LEARNING_RATE, WIDER_BUCKETS, COMPRESS_GRADIENTS, AVOID_NODE, WAIT_FOR_STORE, SMALLER_BATCH, SKIP_ROWS,
 PLAIN_RETRY) = RemedyName


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


# --- NONFINITE with the rank's replay of the step (evidence "replay"; the rank side writes it)
def replayed(reproducible, rows=()):
    return Verdict("NONFINITE", "NaN", {"step": 40, "ranks": [1],
                                        "replay": {"reproducible": reproducible, "rows": list(rows)}})


ROW_A, ROW_B = {"file": "part-00001.parquet", "row": 7}, {"file": "part-00002.parquet", "row": 3}
# (verdict, history, action, remedy, settings, words contain)
REPLAY_ROWS = {
    "reproducible: skip the rows it names, resume before the step": (
        replayed(True, [ROW_A]), [], CHANGE, SKIP_ROWS, {"skip_rows": [ROW_A]}, "part-00001.parquet row 7"),
    "reproducible again: the earlier rows stay skipped": (
        replayed(True, [ROW_B]), [Remedy(CHANGE, "NONFINITE", "", SKIP_ROWS, {"skip_rows": [ROW_A]})], CHANGE,
        SKIP_ROWS, {"skip_rows": [ROW_A, ROW_B]}, "skip 2 of 3"),
    "reproducible after the skips: clean the data set": (
        replayed(True, [ROW_B]), [Remedy(CHANGE, "NONFINITE", "", SKIP_ROWS, {"skip_rows": [ROW_A]})] * MAX_ROW_SKIPS,
        GIVE_UP, None, {}, "clean the data set"),
    "reproducible, but no rows named: check the data": (
        replayed(True), [], GIVE_UP, None, {}, "named no rows"),
    "not reproducible: a transient fault, a plain retry before the step": (
        replayed(False), [], CHANGE, PLAIN_RETRY, {}, "transient"),
    "not reproducible, again and again: the machine's": (
        replayed(False), taken(PLAIN_RETRY, MAX_PLAIN_RETRIES), GIVE_UP, None, {}, "hardware"),
    "no replay evidence: the learning rate, as without replay": (
        NAN, [], CHANGE, LOWER_LEARNING_RATE, {"learning_rate": 0.005}, "learning_rate"),
    "a learning-rate cut does not count against the skips": (
        replayed(True, [ROW_A]), taken(LOWER_LEARNING_RATE, 2), CHANGE, SKIP_ROWS, {"skip_rows": [ROW_A]}, "skip 1"),
}


def test_the_owners_own_skip_rows_stay_skipped_beside_the_replays():
    """The config the failed try ran with already skipped a row (the owner's skip_rows): the remedy adds the
    replay's rows to it, never replaces it."""
    own = {"file": "part-00000.parquet", "row": 5}
    got = remedy(replayed(True, [ROW_A]), config(skip_rows=[own]), [], world_size=2, backend_kind=LOCAL)
    assert (got.remedy, dict(got.settings)) == (SKIP_ROWS, {"skip_rows": [own, ROW_A]}), got


@pytest.mark.parametrize("name", REPLAY_ROWS)
def test_nonfinite_with_replay(name):
    verdict, history, action, kind, settings, says = REPLAY_ROWS[name]
    got = remedy(verdict, config(), history, world_size=2, backend_kind=LOCAL)
    assert (got.action, got.remedy, dict(got.settings)) == (action, kind, settings), got
    assert says in got.words, got.words
    if got.changes:
        assert got.resume_before_step == 40  # back before the step, whatever the change
    assert Remedy.from_dict(json.loads(json.dumps(got.to_dict()))) == got


# --- the remedies of a run's tries: what each try runs with
CUT = Remedy(CHANGE, "NONFINITE", "NaN at step 40", LOWER_LEARNING_RATE, {"learning_rate": 0.005},
             resume_before_step=40)
SPLIT = Remedy(CHANGE, "OOM", "out of memory", SMALLER_BATCH, {"batch_size": 16, "horovod.backward_passes_per_step": 2})
AWAY = Remedy(CHANGE, "DEGRADED/straggler", "slow node", AVOID_NODE, avoid_nodes=("node-b",))
WAIT = Remedy(CHANGE, "STORE_UNAVAILABLE", "store down", WAIT_FOR_STORE, wait_seconds=60.0)
PLAN = [PlannedRemedy(2, CUT), PlannedRemedy(3, AWAY), PlannedRemedy(4, SPLIT), PlannedRemedy(5, WAIT)]


@pytest.mark.parametrize("try_number, learning_rate, batch, passes, resume, avoid, wait, kinds", [
    (1, 0.01, 32, 1, None, (), 0.0, []),
    (2, 0.005, 32, 1, 40, (), 0.0, [LOWER_LEARNING_RATE]),  # its own resume step
    (3, 0.005, 32, 1, None, ("node-b",), 0.0, [LOWER_LEARNING_RATE, AVOID_NODE]),  # not an earlier try's
    (4, 0.005, 16, 2, None, ("node-b",), 0.0, [LOWER_LEARNING_RATE, AVOID_NODE, SMALLER_BATCH]),
    (5, 0.005, 16, 2, None, ("node-b",), 60.0, [LOWER_LEARNING_RATE, AVOID_NODE, SMALLER_BATCH, WAIT_FOR_STORE]),
])
def test_each_try_runs_with_every_earlier_change(try_number, learning_rate, batch, passes, resume, avoid, wait,
                                                 kinds):
    cfg = apply_remedies(config(), PLAN, try_number)
    assert (cfg.learning_rate, cfg.batch_size, cfg.horovod.backward_passes_per_step) == (learning_rate, batch, passes)
    assert cfg.resume_before_step == resume
    assert [r["remedy"] for r in cfg.remedies] == kinds
    assert avoided_nodes(PLAN, try_number) == avoid and wait_before(PLAN, try_number) == wait
    assert JobConfig.from_dict(cfg.to_dict()) == cfg  # what the ranks get reads back the same


def test_a_planned_remedy_is_a_line_of_plain_json_for_a_retry():
    line = json.loads(json.dumps(PlannedRemedy(3, SPLIT).to_dict()))
    assert line["try"] == 3 and PlannedRemedy.from_dict(line) == PlannedRemedy(3, SPLIT)
    assert PlannedRemedy(3, SPLIT).applied() == {"try": 3, "verdict": "OOM", "remedy": SMALLER_BATCH,
                                                 "words": "out of memory"}
    assert remedy_words(PlannedRemedy(3, SPLIT).applied()) == "try 3: smaller_batch after OOM"
    with pytest.raises(ValueError, match="try >= 2"):
        PlannedRemedy(1, SPLIT)


def test_the_ranks_nodes_come_from_the_newest_start_record():
    records = [{"type": "start", "nodes": ["n0", "n1"]}, {"type": "step"}, {"type": "start", "nodes": ["n2", "n3"]},
               {"type": "start"}]
    assert rank_nodes(records) == {0: "n2", 1: "n3"}
    assert rank_nodes([{"type": "step"}]) == {} and rank_nodes(None) == {}
    # a rank whose node is not known (mpirun's ranks on MPIJob workers): left out, so a remedy says so
    assert rank_nodes([{"type": "start", "nodes": ["n0", ""]}]) == {0: "n0"}


def test_a_rank_knows_its_node_only_from_the_downward_api():
    from ringflow.training.rank.worker_env import NODE_NAME_ENV, node_name

    assert node_name({NODE_NAME_ENV: "node-7"}) == "node-7"
    assert node_name({"HOSTNAME": "rf-job-worker-1"}) == ""  # a pod's host name is not a node


def test_a_line_that_is_no_planned_remedy_says_what_to_do():
    with pytest.raises(ValueError, match="not a planned remedy.*delete the file"):
        PlannedRemedy.from_dict({"remedy": "smaller_batch"})
