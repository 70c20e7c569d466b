"""Rank 0 of a TrainJob updates its status.trainerStatus through the Kubernetes API (rank/trainer_status_reporter.py
with callbacks/trainer_status.py), here kmock's, which keeps a write to the status subresource to the status as a
real API server does (kmock_cluster.FaithfulEmulator). The report's contents and the throttle:
tests/training/health/test_trainer_status.py."""
from __future__ import annotations

import datetime
import json
import logging
import pathlib
import time

import jsonschema
import kmock
import pytest

from kmock_cluster import TRAINJOBS
from ringflow.training.health.trainer_status import TRAINJOB_NAME_ENV, TRAINJOB_NAMESPACE_ENV, TrainerStatus
from ringflow.training.rank.trainer_status_reporter import API_ENV, TrainerStatusReporter

NS, NAME = "ringflow", "digits-train-abc123"
SCHEMA = pathlib.Path(__file__).resolve().parents[4] / "fixtures" / "crds" / "trainjob-v1alpha1.schema.json"


def _trainjob(cluster) -> None:
    cluster.put(TRAINJOBS, NS, NAME, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                      "spec": {"trainer": {"numNodes": 1}}})


def _report(progress: int) -> TrainerStatus:
    return TrainerStatus(progress, 30, {"loss": "0.5"}, datetime.datetime.now(datetime.timezone.utc))


def _status_patches(cluster) -> list[dict]:
    return [r.data["status"]["trainerStatus"] for r in cluster.requests("patch", TRAINJOBS)
            if r.subresource == "status"]


def _wait(what, check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_failed_update_is_logged_once_and_the_next_report_retries(cluster, caplog):
    caplog.set_level(logging.WARNING, "ringflow.training.rank.trainer_status_reporter")
    reporter = TrainerStatusReporter(cluster.url, NS, NAME)
    started = time.monotonic()
    for progress in (10, 20, 30):  # no TrainJob yet: each update fails (404)
        reporter.submit(_report(progress))
        _wait("the failed update", lambda: len(_status_patches(cluster)) >= progress // 10)
    assert time.monotonic() - started < 5  # submit hands over and returns; the thread waits for the API
    assert reporter.sent == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "could not update" in warnings[0] and "trainjobs/status" in warnings[0]

    _trainjob(cluster)
    reporter.submit(_report(40))
    reporter.close(5)
    assert reporter.sent == 1 and len(caplog.records) == 1
    stored = cluster.get(TRAINJOBS, NS, NAME)
    assert stored["status"]["trainerStatus"]["progressPercentage"] == 40
    assert stored["spec"] == {"trainer": {"numNodes": 1}}  # a status write touches the status only


def test_a_pod_outside_a_trainjob_reports_nothing():
    assert TrainerStatusReporter.from_environ({}) is None
    assert TrainerStatusReporter.from_environ({TRAINJOB_NAME_ENV: NAME, TRAINJOB_NAMESPACE_ENV: NS}) is None  # no API
    reporter = TrainerStatusReporter.from_environ({TRAINJOB_NAME_ENV: NAME, TRAINJOB_NAMESPACE_ENV: NS,
                                                    "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert reporter.url == f"https://10.0.0.1:443/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/{NAME}/status"
    reporter.close(0)


@pytest.mark.job
def test_the_trainjob_status_follows_a_short_job(cluster, jobs, monkeypatch):
    """Two ranks, 2 epochs x 22 steps, rank 0 slowed to about 7 s in all: the TrainJob's trainerStatus goes from the
    start to 100%, an update at most every 5 s and one at the end, each a valid trainerStatus."""
    _trainjob(cluster)
    for name, value in {TRAINJOB_NAME_ENV: NAME, TRAINJOB_NAMESPACE_ENV: NS, API_ENV: cluster.url}.items():
        monkeypatch.setenv(name, value)
    cfg = jobs.config("status", faults=[{"kind": "slow_rank", "rank": 0, "step": 1, "seconds": 0.15}])
    started = time.monotonic()
    code, out = jobs.run(cfg)
    took = time.monotonic() - started
    assert code == 0, out

    patches = _status_patches(cluster)
    progress = [p["progressPercentage"] for p in patches]
    assert len(patches) >= 3, patches  # the start, at least one on the way, the end
    assert progress[0] == 0 and progress[-1] == 100 and progress == sorted(progress), progress
    assert len(patches) <= 2 + took / 5, progress  # throttled: not one a step
    final = cluster.get(TRAINJOBS, NS, NAME)["status"]["trainerStatus"]
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert metrics["step"] == str(jobs.result(cfg).step) and float(metrics["loss"]) > 0, metrics
    schema = json.loads(SCHEMA.read_text())["properties"]["status"]["properties"]["trainerStatus"]
    for patch in patches:
        jsonschema.validate({k: v for k, v in patch.items() if v is not None}, schema)
