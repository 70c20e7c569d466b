"""`remediation: "auto"` in the train operator: a failed try's verdict gets the remediation policy's change,
kept in the run folder's remedies.jsonl; the retry launches with it (the config the ranks get, the nodes it
keeps off, a wait deferred without a worker slot), or the task fails without retry when no remedy is left.
The launch is recorded, not run: the rank side of each change is tested where the ranks run (docs/guides/fault-table.md)."""
import json

import pytest
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from ringflow.operators.train import TrainOperator
from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings
from ringflow.training.core.backends.kubernetes.trainjob import build_trainjob
from ringflow.training.core.backends.kubernetes.trainjob_backend import TrainJobBackend
from ringflow.training.core.backends.local import LocalProcessBackend
from ringflow.training.formats.run_folder import RunFolder
from ringflow.training.health.records import HealthLog, record
from ringflow.training.health.verdict import Verdict

from test_train_operator import context, finished_event

AUTO = {"remediation": "auto"}
NAN = Verdict("NONFINITE", "NaN/Inf in rank(s) [1]", {"step": 40, "ranks": [1]})
SYNC = Verdict("DEGRADED", "sync-bound", {"kind": "sync_share", "share": 0.9, "steps": [10, 200]})
STORE = Verdict("STORE_UNAVAILABLE", "the store is down", {"store": "s3://b/run", "operation": "get"})
SLOW = Verdict("DEGRADED", "straggler", {"kind": "straggler", "rank": 1, "ratio": 2.0, "steps": [10, 200]})
TRAINJOB_SETTINGS = {"image": "registry.example/ringflow-training:0.1.0", "namespace": "training",
                     "s3_secret_name": "ringflow-minio", "s3_endpoint": "http://minio.ringflow:9000"}


@pytest.fixture
def launched(monkeypatch):
    """Every JobSpec the operator launches (local or TrainJob backend), instead of starting it."""
    specs = []

    def launch(self, spec):
        specs.append(spec)
        return spec.name

    for cls in (LocalProcessBackend, TrainJobBackend):
        monkeypatch.setattr(cls, "launch", launch)
        monkeypatch.setattr(cls, "find", lambda self, labels: None)
    return specs


def operator(tmp_path, manifest, backend=None, **job_config):
    return TrainOperator(task_id="train", manifest_uri=manifest, run_uri=str(tmp_path / "run"),
                         backend=backend or LocalProcessBackend(work_dir=str(tmp_path / "jobs")),
                         job_config=AUTO | job_config)


def fail_then_retry(op, verdict, try_number=1):
    """The try fails on `verdict` (retried, not failed for good); the next try's launch, deferred."""
    with pytest.raises(AirflowException) as failed:
        op.execute_complete(context(try_number), finished_event(verdict=verdict))
    assert not isinstance(failed.value, AirflowFailException), failed.value
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(try_number + 1))
    return str(failed.value), deferred.value


def remedies(tmp_path):
    return RunFolder.open(str(tmp_path / "run")).read_remedies()


def test_a_nan_is_retried_with_a_lower_learning_rate_from_before_its_step(tmp_path, digits_manifest, launched):
    op = operator(tmp_path, digits_manifest, learning_rate=0.01)
    said, deferred = fail_then_retry(op, NAN)
    assert "the next try: NaN/Inf at step 40" in said and "0.01 -> 0.005" in said
    assert deferred.method_name == "execute_complete"
    (spec,) = launched
    assert spec.config["learning_rate"] == 0.005 and spec.config["resume_before_step"] == 40
    assert [r["remedy"] for r in spec.config["remedies"]] == ["lower_learning_rate"]
    assert [(r["try"], r["remedy"]) for r in remedies(tmp_path)] == [(2, "lower_learning_rate")]


def test_remediation_off_keeps_todays_policy(tmp_path, digits_manifest, launched):
    op = operator(tmp_path, digits_manifest, remediation="off")
    with pytest.raises(AirflowFailException, match="NONFINITE"):
        op.execute_complete(context(), finished_event(verdict=NAN))
    assert remedies(tmp_path) == []


def test_no_remedy_left_fails_without_retry(tmp_path, digits_manifest, launched):
    op = operator(tmp_path, digits_manifest)
    for try_number in (1, 2):
        fail_then_retry(op, NAN, try_number)
    assert launched[-1].config["learning_rate"] == pytest.approx(0.0025)  # both cuts, in order
    with pytest.raises(AirflowFailException, match="no remedy left: NaN/Inf again after the learning rate was cut 2"):
        op.execute_complete(context(3), finished_event(verdict=NAN))
    assert len(remedies(tmp_path)) == 2


def test_a_sync_bound_try_gets_wider_buckets(tmp_path, digits_manifest, launched):
    """A DEGRADED verdict ends the job only with health.stop_on_degraded (not fatal by default: the job
    succeeds degraded, and nothing is retried); then the retry's all-reduces carry more."""
    op = operator(tmp_path, digits_manifest, health={"stop_on_degraded": True})
    said, _ = fail_then_retry(op, SYNC)
    assert "fusion_threshold_mb 64 -> 128" in said
    assert launched[-1].config["horovod"]["fusion_threshold_mb"] == 128.0


def test_a_degraded_verdict_that_did_not_end_the_try_is_not_remedied(tmp_path, digits_manifest, launched):
    """Without health.stop_on_degraded a sync-bound verdict is not what failed the try (the job crashed, or
    timed out): the retry runs unchanged, and nothing is recorded as a remedy."""
    op = operator(tmp_path, digits_manifest)
    said, _ = fail_then_retry(op, SYNC)
    assert "the next try" not in said and remedies(tmp_path) == []
    assert launched[-1].config["horovod"]["fusion_threshold_mb"] == 64.0 and launched[-1].config["remedies"] == []


def test_a_changed_retry_stops_a_live_job_of_the_earlier_try_instead_of_reattaching(tmp_path, digits_manifest,
                                                                                     launched, monkeypatch):
    """Stopping try 1's job failed and it still runs the old config: try 2 runs changed, so it stops that
    job and launches its own, never reporting a change that did not run."""
    deleted = []
    monkeypatch.setattr(LocalProcessBackend, "find", lambda self, labels: "rf-try-1")
    monkeypatch.setattr(LocalProcessBackend, "delete", lambda self, job_id: deleted.append(job_id))
    op = operator(tmp_path, digits_manifest, learning_rate=0.01)
    fail_then_retry(op, NAN)
    assert "rf-try-1" in deleted and launched[-1].config["learning_rate"] == 0.005


def test_a_store_outage_waits_deferred_then_launches(tmp_path, digits_manifest, launched):
    op = operator(tmp_path, digits_manifest)
    said, deferred = fail_then_retry(op, STORE)
    assert "wait 60s" in said and not launched  # nothing launched during the wait
    assert isinstance(deferred.trigger, TimeDeltaTrigger) and deferred.method_name == "launch_after_wait"
    with pytest.raises(TaskDeferred) as after:
        op.launch_after_wait(context(2), event=None)
    assert after.value.method_name == "execute_complete" and len(launched) == 1
    assert launched[0].config["remedies"][0]["remedy"] == "wait_for_store"


def test_a_straggler_on_kubernetes_keeps_the_next_try_off_its_node(tmp_path, digits_manifest, launched):
    folder = RunFolder.open(str(tmp_path / "run"))
    attempt = folder.claim("rf-1")
    log = HealthLog(attempt.store, flush_seconds=0.0, attempt=attempt.ref.id, first_seq=attempt.ref.first_seq)
    log.append(record("start", step=0, world_size=2, nodes=["node-a", "node-b"]), force_flush=True)
    backend = TrainJobBackend(TRAINJOB_SETTINGS, kubeconfig_path="/nonexistent")
    op = operator(tmp_path, digits_manifest, backend=backend, health={"stop_on_degraded": True})
    said, _ = fail_then_retry(op, SLOW)
    assert "rank 1 straggles on node node-b" in said
    (spec,) = launched
    assert spec.avoid_nodes == ("node-b",)
    pods = build_trainjob(spec, TrainJobSettings.from_dict(TRAINJOB_SETTINGS))["spec"]["runtimePatches"][0]
    for job in pods["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        affinity = job["template"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                             "values": ["node-b"]}]


def test_faults_fire_on_the_try_they_name(tmp_path, digits_manifest, launched):
    chain = [{"kind": "nan_gradient", "rank": 1, "step": 3}, {"kind": "oom", "step": 2, "above_batch": 16, "on_try": 2}]
    op = operator(tmp_path, digits_manifest, faults=chain)
    fail_then_retry(op, NAN)
    assert [f["kind"] for f in launched[-1].config["faults"]] == ["oom"]
    assert json.loads(json.dumps(launched[-1].config))["faults"][0]["on_try"] == 2
