"""The generated MPIJob and ConfigMap: snapshots, the CRD schema (strict), and the settings checks.

Snapshots live in snapshots/*.yaml. After an intended change, regenerate them with
RINGFLOW_UPDATE_SNAPSHOTS=1 and review the diff.
"""
from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

import strict_schema
from ringflow.training.core.backends.job_spec import JobSpec, JobSpecError
from ringflow.training.core.backends.kubernetes import labels as L
from ringflow.training.core.backends.kubernetes.mpijob import (MPIJobSettings, SettingsError, build_configmap, build_mpijob,
                                                  mpirun_command)

SNAPSHOTS = pathlib.Path(__file__).parent / "snapshots"
IMAGE = "registry.example/ringflow-training:0.1.0"
LABELS = {"dag": "retrain_digits", "run": "scheduled__2024-01-01T00:00:00+00:00", "task": "train", "try": "1"}


def spec(**kw):
    fields = dict(name="retrain-digits-20240101-1", config={"model": "mlp", "epochs": 3, "batch_size": 32},
                  num_workers=2, labels=LABELS)
    return JobSpec(**(fields | kw))


CASES = {
    "mpijob-default": (spec(), dict(image=IMAGE, namespace="training", s3_secret_name="ringflow-minio",
                                    s3_endpoint="http://minio.ringflow:9000")),
    "mpijob-spread-gpu-root": (
        spec(num_workers=4, env={"NCCL_DEBUG": "WARN"}),
        dict(image=IMAGE + "-cuda", namespace="training", placement="spread", run_as_root=True,
             worker={"cpu": "8", "memory": "32Gi", "memory_limit": "40Gi", "cpu_limit": "10", "gpu": 2},
             launcher={"cpu": "500m", "memory": "1Gi"}, node_selector={"pool": "gpu"},
             tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             service_account="ringflow-training", image_pull_secrets=["regcred"], image_pull_policy="Always",
             run_policy={"clean_pod_policy": "All", "backoff_limit": 0, "active_deadline_seconds": 7200,
                         "ttl_seconds_after_finished": 600}),
    ),
    "mpijob-elastic": (
        spec(num_workers=3, config={"engine": "horovod", "epochs": 3, "elastic": {
            "min_workers": 2, "max_workers": 4, "rejoin_seconds": 30, "wait_seconds": 40}}),
        dict(image=IMAGE, namespace="training", s3_secret_name="ringflow-minio",
             s3_endpoint="http://minio.ringflow:9000"),
    ),
}


def _check_snapshot(name: str, obj: dict) -> None:
    path = SNAPSHOTS / f"{name}.yaml"
    if os.environ.get("RINGFLOW_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(obj, sort_keys=False, width=120))
    assert path.exists(), f"no snapshot {path.name}: run with RINGFLOW_UPDATE_SNAPSHOTS=1 and review it"
    assert obj == yaml.safe_load(path.read_text()), (
        f"{name} differs from {path}; if intended, regenerate with RINGFLOW_UPDATE_SNAPSHOTS=1 and review the diff")


@pytest.mark.parametrize("name", sorted(CASES))
def test_mpijob_matches_snapshot_and_the_crd_schema(name):
    job_spec, settings = CASES[name]
    mpijob = build_mpijob(job_spec, MPIJobSettings.from_dict(settings))
    strict_schema.assert_valid(mpijob)
    _check_snapshot(name, mpijob)


def test_configmap_matches_snapshot_and_holds_the_job_config():
    job_spec, settings = CASES["mpijob-default"]
    cm = build_configmap(job_spec, MPIJobSettings.from_dict(settings))
    _check_snapshot("configmap-default", cm)
    assert json.loads(cm["data"]["job.json"]) == job_spec.config


def test_strict_schema_rejects_unknown_fields():
    # The validator itself: a misspelt field must fail (Kubernetes would silently drop it).
    job_spec, settings = CASES["mpijob-default"]
    mpijob = build_mpijob(job_spec, MPIJobSettings.from_dict(settings))
    mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resource"] = {}
    mpijob["spec"]["slotPerWorker"] = 1
    problems = "\n".join(strict_schema.errors(mpijob))
    assert "'resource' was unexpected" in problems and "'slotPerWorker' was unexpected" in problems


def test_launcher_runs_mpirun_with_world_size_and_forwarded_env():
    job_spec, settings = CASES["mpijob-default"]
    s = MPIJobSettings.from_dict(settings)
    cmd = mpirun_command(job_spec, s)
    assert cmd[:3] == ["mpirun", "-np", "2"] and "--allow-run-as-root" not in cmd
    assert cmd[-4:] == ["python", "-m", "ringflow.training", "/etc/ringflow/job.json"]
    exported = {cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-x"}
    assert exported == {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "RINGFLOW_S3_ENDPOINT"}
    root = mpirun_command(spec(num_workers=3), MPIJobSettings(image=IMAGE, run_as_root=True))
    assert root[:4] == ["mpirun", "-np", "3", "--allow-run-as-root"]


def test_an_elastic_job_runs_horovods_elastic_driver_over_the_operators_discovery_script():
    """The launcher: horovodrun's elastic driver (Gloo) over the worker pods /etc/mpi/discover_hosts.sh lists,
    one slot each, over the workers' sshd port; the launch's count of worker pods (spare ones would hold the
    launcher back); no Service variables in the environment it forwards; at least two worker pods."""
    job_spec, settings = CASES["mpijob-elastic"]
    mpijob = build_mpijob(job_spec, MPIJobSettings.from_dict(settings))
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] + launcher["args"] == [
        "horovodrun", "-np", "3", "--gloo", "--min-np", "2", "--max-np", "4",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh", "--elastic-timeout", "40",
        "--blacklist-cooldown-range", "30", "30", "--slots-per-host", "1", "--ssh-port", "2222",
        "python", "-m", "ringflow.training", "/etc/ringflow/job.json"]
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["enableServiceLinks"] is False
    with pytest.raises(JobSpecError, match="starts only with two worker pods or more"):
        build_mpijob(spec(num_workers=1, config={"elastic": {}}), MPIJobSettings(image=IMAGE))
    venv = build_mpijob(job_spec, MPIJobSettings(image=IMAGE, python="/opt/venv/bin/python"))
    assert venv["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"] == [
        "/opt/venv/bin/horovodrun"]
    with pytest.raises(JobSpecError, match="elastic.min_workers"):
        build_mpijob(spec(config={"elastic": {"min_workers": 0}}), MPIJobSettings(image=IMAGE))


def test_credentials_come_only_from_the_secret():
    job_spec, settings = CASES["mpijob-default"]
    mpijob = build_mpijob(job_spec, MPIJobSettings.from_dict(settings))
    text = json.dumps(mpijob)
    env = {e["name"]: e for e in mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "ringflow-minio", "key": key}}}
    assert env["RINGFLOW_S3_ENDPOINT"]["value"] == "http://minio.ringflow:9000"
    # Workers only run sshd; ranks get the variables through mpirun -x.
    assert "AWS_" not in json.dumps(mpijob["spec"]["mpiReplicaSpecs"]["Worker"])
    assert "ringflow-test-secret" not in text and '"value": "AKIA' not in text
    with pytest.raises(JobSpecError, match="s3_secret_name"):
        build_mpijob(spec(env={"AWS_SECRET_ACCESS_KEY": "x"}), MPIJobSettings.from_dict(settings))


def test_labels_are_valid_and_distinct_for_distinct_ids():
    a = L.job_labels({"run": "manual__2024-01-01T00:00:00.000001+00:00"})
    b = L.job_labels({"run": "manual__2024-01-01T00:00:00.000002+00:00"})
    assert a != b
    for value in list(a.values()) + list(L.job_labels({"run": "x" * 200}).values()):
        assert len(value) <= 63 and L._VALUE_OK.match(value), value
    assert L.job_labels({"dag": "plain"})["ringflow/dag"] == "plain"
    assert a[L.MANAGED_BY_KEY] == "ringflow"


def test_pod_templates_carry_the_job_labels():
    job_spec, settings = CASES["mpijob-default"]
    mpijob = build_mpijob(job_spec, MPIJobSettings.from_dict(settings))
    for role in ("Launcher", "Worker"):
        assert mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["metadata"]["labels"] == mpijob["metadata"]["labels"]


@pytest.mark.parametrize("change, message", [
    ({"image": "ringflow-training"}, "not pinned"),
    ({"image": "ringflow-training:latest"}, "not pinned"),
    ({"image": ""}, "set it to the training image"),
    ({"placement": "scatter"}, "'pack' or 'spread'"),
    ({"worker": {"memory": "2"}}, "did you forget the unit"),
    ({"worker": {"cpu": "two"}}, "worker.cpu is 'two'"),
    ({"worker": {"memory": "4Gi", "memory_limit": "2Gi"}}, "below the request"),
    ({"worker": {"gpu": -1}}, "worker.gpu"),
    ({"run_policy": {"clean_pod_policy": "Sometimes"}}, "clean_pod_policy"),
    ({"run_policy": {"backoff_limit": -1}}, "backoff_limit"),
    ({"tolerations": [{"key": "a", "operater": "Exists"}]}, "toleration"),
    ({"s3_secret_name": "Bad_Name"}, "s3_secret_name"),
    ({"s3_endpoint": "minio:9000"}, "s3_endpoint"),
    ({"image_pull_policy": "Sometimes"}, "image_pull_policy"),
    ({"ssh_auth_mount_path": "relative/.ssh"}, "ssh_auth_mount_path"),
    ({"nodeSelector": {}}, "unknown keys"),
])
def test_settings_errors_say_what_to_fix(change, message):
    with pytest.raises(SettingsError, match=message):
        MPIJobSettings.from_dict({"image": IMAGE} | change)


def test_settings_round_trip_through_json():
    _, settings = CASES["mpijob-spread-gpu-root"]
    s = MPIJobSettings.from_dict(settings)
    again = MPIJobSettings.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.ssh_path == "/root/.ssh"
    assert MPIJobSettings(image=IMAGE).ssh_path == "/home/mpiuser/.ssh"


def test_names_the_operator_would_reject_fail_early():
    settings = MPIJobSettings(image=IMAGE)
    build_mpijob(spec(name="a" * 54, num_workers=10), settings)  # "<54>-worker-9": 63 characters
    with pytest.raises(JobSpecError, match="at most 63 characters"):
        build_mpijob(spec(name="a" * 54, num_workers=11), settings)
    with pytest.raises(JobSpecError, match="start with a letter"):
        build_mpijob(spec(name="1-job"), settings)


@pytest.mark.parametrize("config, refused", [
    ({"epochs": 3}, False), ({"engine": "horovod"}, False), ({"engine": "ddp"}, True),
])
def test_only_the_horovod_engine_runs_as_an_mpijob(config, refused):
    settings = MPIJobSettings(image=IMAGE)
    if not refused:
        assert build_mpijob(spec(config=config), settings)["kind"] == "MPIJob"
        return
    with pytest.raises(JobSpecError, match="engine 'ddp' cannot run as an MPIJob.*TrainJob.*"
                                           "RINGFLOW_TRAINJOB_SETTINGS.*LocalProcessBackend.*\"horovod\""):
        build_mpijob(spec(config=config), settings)


def test_backend_from_env():
    from ringflow.training.core.backends.kubernetes.mpijob_backend import backend_from_env

    assert backend_from_env({}) is None
    backend = backend_from_env({"RINGFLOW_MPIJOB_SETTINGS": json.dumps({"image": IMAGE})})
    assert backend.conn_id == "ringflow_k8s" and backend.settings.image == IMAGE
    with pytest.raises(ValueError, match="not valid JSON"):
        backend_from_env({"RINGFLOW_MPIJOB_SETTINGS": "{image: x}"})
    with pytest.raises(SettingsError, match="not pinned"):
        backend_from_env({"RINGFLOW_MPIJOB_SETTINGS": json.dumps({"image": "ringflow-training"})})
