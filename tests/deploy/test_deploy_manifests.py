"""deploy/: every manifest loads and has a known kind, images are pinned, RBAC grants exactly what the client
calls, the example MPIJob and TrainJobs are what the backends generate and pass the CRD schemas strictly,
ringflow's ClusterTrainingRuntimes pass theirs and fit what the TrainJob backend submits, and the Helm values
wire Airflow to all of it."""
from __future__ import annotations

import os
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(ROOT / "tests" / "training" / "core" / "backends" / "kubernetes"))
import strict_schema  # noqa: E402  (the shared strict CRD validator)

KNOWN = {
    ("v1", "Namespace"), ("v1", "ServiceAccount"), ("v1", "Secret"), ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"), ("apps/v1", "Deployment"), ("batch/v1", "Job"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("kubeflow.org/v2beta1", "MPIJob"), ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"), ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}
HELM_VALUES = {"airflow-values.yaml"}


def manifests() -> list[tuple[pathlib.Path, dict]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name in HELM_VALUES:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path, doc))
    return out


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in manifests() if doc.get("kind") == kind]


def versions_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (ROOT / "versions.env").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_every_manifest_has_a_known_kind_and_api_version():
    docs = manifests()
    assert len(docs) >= 12
    for path, doc in docs:
        assert (doc.get("apiVersion"), doc.get("kind")) in KNOWN, f"{path}: {doc.get('apiVersion')} {doc.get('kind')}"
        if doc["kind"] != "Kustomization":
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"


def test_kustomizations_reference_existing_files():
    for path, doc in manifests():
        if doc["kind"] != "Kustomization":
            continue
        for resource in doc.get("resources", []):
            if resource.startswith("https://"):
                continue
            assert (path.parent / resource).exists(), f"{path} lists {resource}, which does not exist"


def test_mpi_operator_is_pinned_to_versions_env():
    version = versions_env()["MPI_OPERATOR_VERSION"]
    (kustomization,) = [doc for path, doc in manifests() if path.parent.name == "mpi-operator"]
    (url,) = kustomization["resources"]
    assert url == f"https://raw.githubusercontent.com/kubeflow/mpi-operator/{version}/deploy/v2beta1/mpi-operator.yaml"


def _pod_specs(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc.get("kind") == "ClusterTrainingRuntime":
        return [j["template"]["spec"]["template"]["spec"] for j in spec["template"]["spec"]["replicatedJobs"]]
    return [spec.get("template", {}).get("spec", {})]


def _containers(doc: dict) -> list[dict]:
    return [c for pod in _pod_specs(doc) for c in pod.get("containers", []) + pod.get("initContainers", [])]


def test_kubeflow_trainer_is_pinned_to_the_release_of_the_schemas():
    from ringflow.training.core.backends.kubernetes.trainjob import TRAINER_RELEASE

    (kustomization,) = [doc for path, doc in manifests() if path.parent.name == "kubeflow-trainer"]
    assert kustomization["resources"] == [
        f"https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref={TRAINER_RELEASE}"]
    readme = (ROOT / "tests" / "fixtures" / "README.md").read_text()
    assert f"kubeflow/trainer](https://github.com/kubeflow/trainer) {TRAINER_RELEASE}" in readme


def test_images_are_pinned():
    images = [c["image"] for _, doc in manifests() for c in _containers(doc)]
    assert images
    for image in images:
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest" and re.search(r"\d", tag), f"image {image} is not pinned"


def _rules(role: dict) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def _named(kind: str, name: str) -> dict:
    (doc,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return doc


def test_rbac_grants_exactly_what_the_client_calls():
    from ringflow.training.core.backends.kubernetes.client import API_CALLS

    role = _named("Role", "ringflow-airflow-mpijobs")
    (cluster_role,) = of_kind("ClusterRole")
    assert _rules(role) | _rules(cluster_role) == set(API_CALLS)
    assert _rules(cluster_role) == {("", "nodes", "list")}  # cluster-wide: counting nodes, nothing more
    # Both job kinds: what the MPIJob backend and the TrainJob backend create, read, list and delete.
    for group, resource in (("kubeflow.org", "mpijobs"), ("trainer.kubeflow.org", "trainjobs")):
        assert {(group, resource, verb) for verb in ("create", "get", "list", "delete")} <= _rules(role)
    assert not any("jobsets" in resource for _, resource, _ in _rules(role))  # pods are found by label
    binding, account = _named("RoleBinding", "ringflow-airflow-mpijobs"), _named("ServiceAccount", "ringflow-airflow")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": role["metadata"]["namespace"]}]
    (cluster_binding,) = of_kind("ClusterRoleBinding")
    assert cluster_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                          "name": cluster_role["metadata"]["name"]}
    assert cluster_binding["subjects"] == binding["subjects"]
    assert len(of_kind("Role")) == 2  # this one and the training pods' (next test): nothing else is granted


def test_training_pods_may_patch_their_trainjobs_status_and_nothing_else():
    from ringflow.training.health.trainer_status import API_CALLS, TRAINJOB_NAME_ENV, TRAINJOB_NAMESPACE_ENV
    from ringflow.training.core.backends.kubernetes import labels as L

    role, binding = _named("Role", "ringflow-training-status"), _named("RoleBinding", "ringflow-training-status")
    account = _named("ServiceAccount", "ringflow-training")
    assert _rules(role) == set(API_CALLS) == {("trainer.kubeflow.org", "trainjobs/status", "patch")}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": role["metadata"]["namespace"]}]
    # The pod that hosts rank 0 runs as that account and learns its TrainJob through the downward API: node 0 of
    # the torch runtime, the launcher of the Horovod one (mpirun runs rank 0 there: runLauncherAsNode).
    runtimes = _runtimes()
    for runtime, job in (("ringflow-torch", "node"), ("ringflow-horovod", "launcher")):
        pod = _replicated_jobs(runtimes[runtime])[job]["template"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account["metadata"]["name"], runtime
        (container,) = pod["containers"]
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env == {TRAINJOB_NAME_ENV: f"metadata.labels['{L.JOBSET_NAME_LABEL}']",
                       TRAINJOB_NAMESPACE_ENV: "metadata.namespace"}, runtime


def test_minio_and_the_training_pods_read_the_same_secret_keys():
    from ringflow.training.core.backends.kubernetes.mpijob import S3_SECRET_KEYS

    (secret,) = [doc for _, doc in manifests() if doc["kind"] == "Secret" and doc["metadata"]["name"] == "ringflow-minio"]
    assert set(secret["stringData"]) == set(S3_SECRET_KEYS)
    refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for kind in ("Deployment", "Job") for doc in of_kind(kind) for c in _containers(doc)
            for e in c.get("env", []) if "valueFrom" in e}
    assert refs == {("ringflow-minio", key) for key in S3_SECRET_KEYS}


def test_secret_templates_hold_no_real_credentials():
    for doc in of_kind("Secret"):
        for key, value in doc.get("stringData", {}).items():
            if any(word in key for word in ("SECRET", "ACCESS_KEY")) or '"password"' in value or '"login"' in value:
                assert "CHANGE-ME" in value, f"Secret {doc['metadata']['name']}/{key} must be a placeholder"
    assert not any(doc["kind"] == "Secret" for path, doc in manifests()
                   if "secrets" not in path.parts), "real Secrets never live in deploy/; only templates"


def _example_backend_manifests():
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings, build_mpijob

    settings = MPIJobSettings(image="REGISTRY/ringflow-training:0.1.0", namespace="ringflow",
                              s3_secret_name="ringflow-minio", s3_endpoint="http://minio.ringflow.svc:9000")
    spec = JobSpec(name="rf-retrain-digits-train-0123456789-t1", config={"manifest_uri": "s3://ringflow/..."},
                   num_workers=2, labels={"dag": "retrain_digits", "run": "manual__2030-01-01", "task": "train",
                                          "try": "1"})
    return build_mpijob(spec, settings)


def test_example_mpijob_is_generated_and_valid():
    path = DEPLOY / "examples" / "mpijob-example.yaml"
    generated = _example_backend_manifests()
    if os.environ.get("RINGFLOW_UPDATE_SNAPSHOTS") == "1":
        header = ("# What MPIJobBackend submits for a 2-worker run (generated by tests/deploy; regenerate with\n"
                  "# RINGFLOW_UPDATE_SNAPSHOTS=1). For reading, and for `kubectl apply --dry-run=server` checks.\n")
        path.write_text(header + yaml.safe_dump(generated, sort_keys=False, width=120))
    assert yaml.safe_load(path.read_text()) == generated, f"{path} is stale: regenerate with RINGFLOW_UPDATE_SNAPSHOTS=1"
    mpijobs = of_kind("MPIJob")
    assert mpijobs
    for mpijob in mpijobs:
        strict_schema.assert_valid(mpijob)


def _example_trainjobs():
    from ringflow.training.core.backends.job_spec import JobSpec
    from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings
    from ringflow.training.core.backends.kubernetes.trainjob import build_trainjob

    settings = TrainJobSettings(image="REGISTRY/ringflow-training:0.1.0", namespace="ringflow",
                                s3_secret_name="ringflow-minio", s3_endpoint="http://minio.ringflow.svc:9000")
    labels = {"dag": "retrain_digits", "run": "manual__2030-01-01", "task": "train", "try": "1"}
    return [build_trainjob(JobSpec(name=f"rf-retrain-digits-train-0123456789-{engine}-t1",
                                   config={"manifest_uri": "s3://ringflow/...", "engine": engine}, num_workers=2,
                                   labels=labels), settings) for engine in ("horovod", "ddp", "tensorflow")]


def test_example_trainjobs_are_generated_and_valid():
    path = DEPLOY / "examples" / "trainjob-examples.yaml"
    generated = _example_trainjobs()
    if os.environ.get("RINGFLOW_UPDATE_SNAPSHOTS") == "1":
        header = ("# What TrainJobBackend submits for a 2-worker run of each engine (generated by tests/deploy;\n"
                  "# regenerate with RINGFLOW_UPDATE_SNAPSHOTS=1). For reading, and for\n"
                  "# `kubectl apply --dry-run=server` checks once deploy/trainer is applied.\n")
        path.write_text(header + yaml.safe_dump_all(generated, sort_keys=False, width=120))
    assert list(yaml.safe_load_all(path.read_text())) == generated, (
        f"{path} is stale: regenerate with RINGFLOW_UPDATE_SNAPSHOTS=1")
    for trainjob in of_kind("TrainJob"):
        strict_schema.assert_valid(trainjob)


def _runtimes() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in of_kind("ClusterTrainingRuntime")}


def _replicated_jobs(runtime: dict) -> dict[str, dict]:
    return {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def test_runtimes_pass_the_crd_schema_strictly():
    runtimes = _runtimes()
    assert sorted(runtimes) == ["ringflow-horovod", "ringflow-tensorflow", "ringflow-torch"]
    for runtime in runtimes.values():
        strict_schema.assert_valid(runtime)
    # The check itself: a misspelt field in a runtime fails.
    broken = yaml.safe_load(yaml.safe_dump(runtimes["ringflow-torch"]))
    broken["spec"]["mlPolicy"]["torch"]["numProcPerNod"] = 1
    _replicated_jobs(broken)["node"]["template"]["spec"]["template"]["spec"]["containers"][0]["readyProbe"] = {}
    problems = "\n".join(strict_schema.errors(broken))
    assert "'numProcPerNod' was unexpected" in problems and "'readyProbe' was unexpected" in problems


def test_runtimes_are_the_ones_the_trainjob_backend_names_and_patches():
    from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings
    from ringflow.training.core.backends.kubernetes.trainjob import LAUNCHER, NODE, replicated_jobs

    runtimes, settings = _runtimes(), TrainJobSettings(image="REGISTRY/ringflow-training:0.1.0")
    for engine in ("horovod", "ddp", "tensorflow"):
        runtime = runtimes[settings.runtime(engine)]
        jobs = _replicated_jobs(runtime)
        # Trainer refuses patches of replicated jobs or containers its runtime does not have.
        assert sorted(jobs) == sorted(replicated_jobs(engine))
        trainer_jobs = [name for name, j in jobs.items()
                        if j["template"].get("metadata", {}).get("labels", {}).get(
                            "trainer.kubeflow.org/trainjob-ancestor-step") == "trainer"]
        # The TrainJob's image and command go to the container "node" of the one trainer job.
        assert trainer_jobs == [LAUNCHER if engine == "horovod" else NODE]
        for name, j in jobs.items():
            pod = j["template"]["spec"]["template"]["spec"]
            assert [c["name"] for c in pod["containers"]] == [NODE]
            # One failed rank fails the job at once; the JobSet restarts all pods (failurePolicy).
            assert j["template"]["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
            assert pod["containers"][0]["image"] == settings.image
            assert pod["containers"][0]["securityContext"]["runAsUser"] == 1000
        assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 1
    assert "torch" in runtimes[settings.ddp_runtime]["spec"]["mlPolicy"]


def test_the_tensorflow_runtime_gives_each_pod_what_its_tf_config_is_derived_from():
    from ringflow.training.core.backends.kubernetes import labels as L, tf_pod
    from ringflow.training.core.backends.kubernetes.jobset_names import TRAINER_PORT

    runtime = _runtimes()["ringflow-tensorflow"]
    # The plain policy: Trainer sets the node count and the TrainJob's image, command and env, nothing else
    # (a framework policy would set its own variables, or mpirun, in the pods).
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1}
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "tensorflow"
    network = runtime["spec"]["template"]["spec"]["network"]
    # The headless Service is named like the JobSet (no subdomain of its own), and names resolve before Ready.
    assert network == {"publishNotReadyAddresses": True}
    node = _replicated_jobs(runtime)["node"]["template"]["spec"]
    assert node["completionMode"] == "Indexed"  # JOB_COMPLETION_INDEX in every pod
    (container,) = node["template"]["spec"]["containers"]
    assert container["env"] == [{"name": tf_pod.JOBSET_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{L.JOBSET_NAME_LABEL}']"}}}]
    assert container["ports"] == [{"name": "tf-worker", "containerPort": TRAINER_PORT, "protocol": "TCP"}]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # What the TrainJob's env carries and the runtime does not, and the reverse: together, tf_pod's inputs.
    (trainjob,) = [t for t in _example_trainjobs() if t["spec"]["runtimeRef"]["name"] == "ringflow-tensorflow"]
    given = {e["name"] for e in trainjob["spec"]["trainer"]["env"]} | {e["name"] for e in container["env"]}
    assert {tf_pod.NUM_WORKERS_ENV, tf_pod.JOBSET_ENV} <= given and tf_pod.INDEX_ENV not in given


def test_the_horovod_runtime_runs_the_images_sshd_like_the_mpijob_path():
    from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings, build_mpijob
    from ringflow.training.core.backends.job_spec import JobSpec

    runtime = _runtimes()["ringflow-horovod"]
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    mpijob_settings = MPIJobSettings(image="REGISTRY/ringflow-training:0.1.0")
    assert mpi == {"numProcPerNode": 1, "mpiImplementation": "OpenMPI", "runLauncherAsNode": True,
                   "sshAuthMountPath": mpijob_settings.ssh_path}
    jobs = _replicated_jobs(runtime)
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]  # waits for ready nodes
    node = jobs["node"]["template"]["spec"]["template"]["spec"]["containers"][0]
    worker = build_mpijob(JobSpec(name="j", config={}, num_workers=1), mpijob_settings)[
        "spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    for key in ("command", "args", "ports"):
        assert node[key] == worker[key], key
    assert node["readinessProbe"]["tcpSocket"] == {"port": mpijob_settings.ssh_port}
    assert runtime["spec"]["template"]["spec"]["network"]["publishNotReadyAddresses"] is True
    assert runtime["spec"]["template"]["spec"]["successPolicy"] == {"operator": "All",
                                                                    "targetReplicatedJobs": ["launcher"]}
    # Trainer mounts the private key group-readable (0640): the pods' group must be mpiuser's.
    for j in jobs.values():
        assert j["template"]["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 1000


def test_airflow_values_wire_the_deployment():
    values = yaml.safe_load((DEPLOY / "airflow-values.yaml").read_text())
    versions = versions_env()
    assert values["airflowVersion"] == versions["AIRFLOW_VERSION"]
    assert values["images"]["airflow"]["repository"].endswith("/ringflow-airflow")
    assert values["executor"] in ("LocalExecutor", "KubernetesExecutor")
    assert values["triggerer"]["enabled"] is True
    assert values["postgresql"]["enabled"] is True or values.get("data", {}).get("metadataSecretName")
    account = _named("ServiceAccount", "ringflow-airflow")
    for component in ("scheduler", "triggerer"):
        assert values[component]["serviceAccount"] == {"create": False, "name": account["metadata"]["name"]}
    (connections,) = [d for d in of_kind("Secret") if d["metadata"]["name"] == "ringflow-airflow-connections"]
    wired = {(s["envName"], s["secretName"], s["secretKey"]) for s in values["secret"]}
    assert wired == {(key, "ringflow-airflow-connections", key) for key in connections["stringData"]}
    assert all(env.startswith("AIRFLOW_CONN_") for env, _, _ in wired)
    assert "password" not in yaml.safe_dump(values).lower()


def test_airflow_values_configure_a_valid_mpijob_backend():
    from ringflow.training.core.backends.kubernetes.mpijob_backend import backend_from_env

    values = yaml.safe_load((DEPLOY / "airflow-values.yaml").read_text())
    env = {e["name"]: e["value"] for e in values["env"]}
    backend = backend_from_env(env)  # validates the settings, touches no cluster
    assert backend.settings.namespace == "ringflow" and backend.settings.s3_secret_name == "ringflow-minio"
    (connections,) = [d for d in of_kind("Secret") if d["metadata"]["name"] == "ringflow-airflow-connections"]
    assert f"AIRFLOW_CONN_{backend.conn_id.upper()}" in connections["stringData"]
    assert backend_from_env({}) is None


def test_airflow_values_settings_also_configure_the_trainjob_backend():
    # The values' comment says: rename the variable to RINGFLOW_TRAINJOB_SETTINGS to run TrainJobs instead.
    from ringflow.training.core.backends.kubernetes.mpijob_backend import backend_from_env

    values = yaml.safe_load((DEPLOY / "airflow-values.yaml").read_text())
    env = {e["name"]: e["value"] for e in values["env"]}
    env["RINGFLOW_TRAINJOB_SETTINGS"] = env.pop("RINGFLOW_MPIJOB_SETTINGS")
    backend = backend_from_env(env)
    assert backend.kind == "trainjob" and backend.settings.image == "REGISTRY/ringflow-training:0.1.0"
    assert {r["metadata"]["name"] for r in of_kind("ClusterTrainingRuntime")} == {
        backend.settings.horovod_runtime, backend.settings.ddp_runtime, backend.settings.tensorflow_runtime}
