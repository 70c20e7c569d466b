"""TrainJobBackend end to end against a Kubernetes API emulator (kmock on 127.0.0.1), through the real
`kubernetes` and `kubernetes_asyncio` clients. The tests play Kubeflow Trainer and the JobSet controller:
they write the TrainJob's conditions and the pods its JobSet would create."""
from __future__ import annotations

import asyncio
import json
import re

import kmock
import pytest
import yaml

import backend_checks as checks
import strict_schema
from backend_checks import LABELS, NS
from kmock_cluster import CONFIGMAPS, TRAINJOBS
from ringflow.training.core.backends.base import JobState, backend_from_dict
from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.kubernetes.client import KubernetesApiError

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED = JobState

pytestmark = pytest.mark.job


def spec(name="retrain-1", engine="horovod", **kw):
    return JobSpec(**(dict(name=name, config={"epochs": 2, "engine": engine}, num_workers=2, labels=LABELS) | kw))


def running():
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "node", "restartCount": 0, "state": {"running": {}}}]}


def test_horovod_runs_and_succeeds(cluster, trainjob_backend):
    backend = trainjob_backend
    job_id = backend.launch(spec())
    assert job_id == "retrain-1"
    submitted = cluster.get(TRAINJOBS, NS, job_id)
    strict_schema.assert_valid(submitted)
    assert submitted["spec"]["runtimeRef"]["name"] == "ringflow-horovod"
    # The ConfigMap holds the config and is owned by the TrainJob, so deleting the job removes it.
    cm = cluster.get(CONFIGMAPS, NS, "retrain-1-ringflow")
    assert json.loads(cm["data"]["job.json"]) == {"epochs": 2, "engine": "horovod"}
    assert cm["metadata"]["ownerReferences"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                  "name": job_id, "uid": submitted["metadata"]["uid"]}]
    assert backend.status(job_id).state == PENDING

    cluster.add_jobset_pod(NS, job_id, "node", 0, status=running())
    launcher = cluster.add_jobset_pod(NS, job_id, "launcher", 0, status=running())
    assert backend.status(job_id).state == RUNNING

    checks.assert_logs_follow_the_pod(cluster, backend, job_id, launcher)

    cluster.set_conditions(NS, job_id, ("Complete", "AllJobsCompleted", "jobset completed successfully"),
                           resource=TRAINJOBS)
    status = asyncio.run(backend.astatus(job_id))  # the trigger's path
    assert status.state == SUCCEEDED and status.exit_code == 0
    assert backend.find({"dag": "retrain", "run": LABELS["run"]}) is None  # finished: nothing to reattach to


def test_ddp_runs_on_the_torch_runtime_and_follows_node_0(cluster, trainjob_backend):
    job_id = trainjob_backend.launch(spec(engine="ddp"))
    assert cluster.get(TRAINJOBS, NS, job_id)["spec"]["runtimeRef"]["name"] == "ringflow-torch"
    node1 = cluster.add_jobset_pod(NS, job_id, "node", 1, status=running())
    node0 = cluster.add_jobset_pod(NS, job_id, "node", 0, status=running())
    cluster.logs[(NS, node1)] = "rank 1\n"
    cluster.logs[(NS, node0)] = "rank 0 step 1\n"
    assert trainjob_backend.status(job_id).state == RUNNING
    assert asyncio.run(trainjob_backend.alogs(job_id)).lines == ["rank 0 step 1"]


def test_failures_read_as_for_an_mpijob(cluster, trainjob_backend):
    job_id = trainjob_backend.launch(spec())
    cluster.add_jobset_pod(NS, job_id, "launcher", 0, status=running())
    cluster.add_jobset_pod(NS, job_id, "node", 0, status={"phase": "Failed", "containerStatuses": [{
        "name": "node", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]})
    status = trainjob_backend.status(job_id)
    assert status.state == FAILED
    assert "retrain-1-node-0-0" in status.reason and "OOMKilled" in status.reason and "batch size" in status.reason


def test_a_launcher_that_cannot_reach_the_nodes_restarts_then_fails(cluster, trainjob_backend):
    job_id = trainjob_backend.launch(spec())
    cluster.add_jobset_pod(NS, job_id, "node", 0, status=running())
    cluster.add_jobset_pod(NS, job_id, "launcher", 0, status={"phase": "Failed", "containerStatuses": [{
        "name": "node", "restartCount": 0, "state": {"terminated": {
            "reason": "Error", "exitCode": 1,
            "message": "ssh: connect to host retrain-1-node-0-0.retrain-1 port 2222: Connection refused"}}}]})
    status = trainjob_backend.status(job_id)
    assert status.state == RESTARTING and "could not reach the workers" in status.reason
    cluster.set_conditions(NS, job_id, ("Failed", "FailedJobs", "jobset failed due to reaching max number of "
                                        "restarts"), resource=TRAINJOBS)
    status = trainjob_backend.status(job_id)
    assert status.state == FAILED and "FailedJobs" in status.reason and "port 2222" in status.reason
    assert status.exit_code == 1


def jobset_pods(cluster, job_id):
    """Both nodes of the TrainJob's JobSet, running."""
    return [cluster.add_jobset_pod(NS, job_id, "node", i, status=checks.RUNNING_POD) for i in (0, 1)]


def test_delete_waits_until_the_trainjob_and_its_pods_are_gone(cluster, trainjob_backend):
    checks.assert_delete_waits_until_the_job_and_its_pods_are_gone(
        cluster, trainjob_backend, spec(), lambda job_id: jobset_pods(cluster, job_id), TRAINJOBS, "TrainJob")


def test_delete_on_kill_is_foreground_and_tolerates_404(cluster, trainjob_backend):
    job_id = trainjob_backend.launch(spec())
    checks.assert_delete_is_foreground_and_tolerates_404(cluster, trainjob_backend, job_id, TRAINJOBS, "TrainJob")


def test_reattach_via_find_on_retry(cluster, trainjob_backend, backend):
    job_id = trainjob_backend.launch(spec())
    trainjob_backend.launch(spec(name="other-run", labels=LABELS | {"run": "manual__2030-01-02"}))
    # Try 2 of the same task, in a fresh process (the backend rebuilt from JSON), looks for try 1's job.
    again = backend_from_dict("trainjob", json.loads(json.dumps(trainjob_backend.to_dict())))
    assert type(again) is type(trainjob_backend)
    assert again.find({"dag": "retrain", "run": LABELS["run"], "task": "train"}) == job_id
    assert again.find({"dag": "retrain", "run": "scheduled__2030-01-01T00:00:00+00:01"}) is None
    # Launching the same job again (a retry that did not look first) reattaches instead of failing.
    assert again.launch(spec()) == job_id
    cluster.set_conditions(NS, job_id, ("Failed", "DeadlineExceeded", "deadline"), resource=TRAINJOBS)
    assert again.find(LABELS) is None
    # An MPIJob backend on the same cluster never reattaches to a TrainJob.
    assert backend.find({"run": "manual__2030-01-02"}) is None


def test_create_conflict_with_a_foreign_object(cluster, trainjob_backend):
    checks.assert_a_foreign_object_is_left_alone(cluster, trainjob_backend, spec(), TRAINJOBS, "TrainJob")


def test_a_missing_runtime_says_how_to_install_it(cluster, trainjob_backend):
    # What Trainer's webhook answers when the ClusterTrainingRuntime does not exist.
    cluster.k["post", kmock.resource(TRAINJOBS)] << 422 << {
        "kind": "Status", "code": 422, "reason": "Invalid",
        "message": 'TrainJob.trainer.kubeflow.org "retrain-1" is invalid: spec.runtimeRef: Invalid value: '
                   '"ringflow-horovod": specified clusterTrainingRuntime must be created before the TrainJob is created'}
    with pytest.raises(KubernetesApiError, match="must be created.*kubectl apply -k deploy/trainer"):
        trainjob_backend.launch(spec())
    assert cluster.get(CONFIGMAPS, NS, "retrain-1-ringflow") is None


def test_failed_configmap_create_removes_the_trainjob(cluster, trainjob_backend):
    checks.assert_a_failed_configmap_create_removes_the_job(cluster, trainjob_backend, spec(), TRAINJOBS)


def _resolve_pod_env(trainjob, runtime, pod):
    """The environment a node pod of the TrainJob starts with: what Trainer copies from the TrainJob (plain
    values), the runtime container's own (its downward-API references read from the pod, as the kubelet does)
    and the Job controller's JOB_COMPLETION_INDEX (the pod's completion index)."""
    labels = pod["metadata"]["labels"]
    env = {e["name"]: e["value"] for e in trainjob["spec"]["trainer"]["env"] if "value" in e}
    (job,) = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
              if j["name"] == labels["jobset.sigs.k8s.io/replicatedjob-name"]]
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    for e in container.get("env", []):
        field = e["valueFrom"]["fieldRef"]["fieldPath"]
        key = re.fullmatch(r"metadata\.labels\['(.+)'\]", field).group(1)
        env[e["name"]] = labels[key]
    if job["template"]["spec"].get("completionMode") == "Indexed":
        env["JOB_COMPLETION_INDEX"] = labels["batch.kubernetes.io/job-completion-index"]
    return env


def test_tensorflow_pods_derive_their_tf_config_from_what_the_jobset_gives_them(cluster, trainjob_backend):
    from ringflow.training.core.backends.kubernetes.tf_pod import pod_tf_config

    job_id = trainjob_backend.launch(spec(engine="tensorflow", num_workers=3))
    submitted = cluster.get(TRAINJOBS, NS, job_id)
    strict_schema.assert_valid(submitted)
    assert submitted["spec"]["runtimeRef"]["name"] == "ringflow-tensorflow"
    runtime = yaml.safe_load((strict_schema.REPO_ROOT / "deploy" / "trainer" / "ringflow-tensorflow.yaml").read_text())
    (port,) = [p["containerPort"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
               for c in j["template"]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    names = [cluster.add_jobset_pod(NS, job_id, "node", i, status=running()) for i in (2, 0, 1)]
    pods = {n: cluster.get("v1/pods", NS, n) for n in names}
    # JobSet's pod hostnames (<jobset>-<replicated job>-<job index>-<completion index>) on its headless
    # Service, named like the JobSet: what every worker must list, in index order.
    keys = ("jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index",
            "batch.kubernetes.io/job-completion-index")
    expected = sorted((int(p["metadata"]["labels"][keys[-1]]),
                       "-".join(p["metadata"]["labels"][k] for k in keys) + f".{job_id}:{port}") for p in pods.values())
    workers = [address for _, address in expected]
    assert workers == [f"retrain-1-node-0-{i}.retrain-1:29500" for i in range(3)]
    for name, pod in pods.items():
        index = int(pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
        config = pod_tf_config(_resolve_pod_env(submitted, runtime, pod))
        assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}, name
    # Running once every worker runs; the log followed is node 0's, worker 0: TF's chief and ringflow's rank 0.
    assert trainjob_backend.status(job_id).state == RUNNING
    cluster.logs[(NS, names[1])] = "rank 0 step 1\n"
    cluster.logs[(NS, names[0])] = "rank 2\n"
    assert asyncio.run(trainjob_backend.alogs(job_id)).lines == ["rank 0 step 1"]
    cluster.set_conditions(NS, job_id, ("Complete", "AllJobsCompleted", "jobset completed successfully"),
                           resource=TRAINJOBS)
    assert trainjob_backend.status(job_id).state == SUCCEEDED


def test_a_retry_that_avoids_a_node_submits_pods_that_keep_off_it(cluster, trainjob_backend):
    """A straggler's remedy (operators/train.py passes JobSpec.avoid_nodes): what reaches the API server."""
    job_id = trainjob_backend.launch(spec(name="retrain-2", avoid_nodes=("node-b",)))
    submitted = cluster.get(TRAINJOBS, NS, job_id)
    strict_schema.assert_valid(submitted)
    (patch,) = submitted["spec"]["runtimePatches"]
    for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        required = job["template"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["node-b"]
