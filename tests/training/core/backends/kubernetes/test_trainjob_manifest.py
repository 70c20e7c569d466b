"""The generated TrainJob (Kubeflow Trainer v2.3.0): snapshots, the CRD schema (strict), the rules of Trainer's
webhook that a schema cannot say, the settings checks, and how a deployment picks it.

Snapshots live in snapshots/*.yaml. After an intended change, regenerate them with
RINGFLOW_UPDATE_SNAPSHOTS=1 and review the diff.
"""
from __future__ import annotations

import json
import re

import pytest

import strict_schema
from test_mpijob_manifest import IMAGE, LABELS, _check_snapshot, spec
from ringflow.training.core.backends.job_spec import JobSpecError
from ringflow.training.core.backends.kubernetes import labels as L
from ringflow.training.core.backends.kubernetes.mpijob_backend import backend_from_env
from ringflow.training.core.backends.kubernetes.job_parts import build_configmap
from ringflow.training.core.backends.kubernetes.settings import SettingsError, TrainJobSettings
from ringflow.training.core.backends.kubernetes.trainjob import PATCH_MANAGER, build_trainjob

DEFAULT = dict(image=IMAGE, namespace="training", s3_secret_name="ringflow-minio",
               s3_endpoint="http://minio.ringflow:9000")
CASES = {
    "trainjob-horovod": (spec(), DEFAULT),
    "trainjob-ddp-spread-gpu": (
        spec(config={"engine": "ddp", "epochs": 3}, num_workers=4, env={"NCCL_DEBUG": "WARN"}),
        dict(image=IMAGE + "-cuda", namespace="training", placement="spread",
             worker={"cpu": "8", "memory": "32Gi", "memory_limit": "40Gi", "gpu": 2}, node_selector={"pool": "gpu"},
             tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             service_account="ringflow-training", image_pull_secrets=["regcred"], active_deadline_seconds=7200),
    ),
    "trainjob-tensorflow": (spec(config={"engine": "tensorflow", "epochs": 2}, num_workers=3), DEFAULT),
}


def trainjob(name="trainjob-horovod", **spec_changes):
    job_spec, settings = CASES[name]
    if spec_changes:
        job_spec = spec(**spec_changes)
    return build_trainjob(job_spec, TrainJobSettings.from_dict(settings))


def _patched_pods(tj):
    (patch,) = tj["spec"]["runtimePatches"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return {j["name"]: j["template"]["spec"]["template"] for j in jobs}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trainjob_matches_snapshot_and_the_crd_schema(name):
    tj = trainjob(name)
    strict_schema.assert_valid(tj)
    _check_snapshot(name, tj)


def test_strict_schema_rejects_unknown_fields_and_what_a_patch_may_not_touch():
    tj = trainjob()
    tj["spec"]["trainer"]["numNode"] = 2
    # A runtime patch may set a container's env, securityContext and mounts, never its image.
    _patched_pods(tj)["node"]["spec"]["containers"][0]["image"] = IMAGE
    problems = "\n".join(strict_schema.errors(tj))
    assert "'numNode' was unexpected" in problems and "'image' was unexpected" in problems


def test_each_engine_runs_on_its_runtime_with_its_launcher():
    horovod, ddp = trainjob(), trainjob("trainjob-ddp-spread-gpu")
    assert horovod["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                             "name": "ringflow-horovod"}
    assert ddp["spec"]["runtimeRef"]["name"] == "ringflow-torch"
    h, d = horovod["spec"]["trainer"], ddp["spec"]["trainer"]
    assert h["command"] == ["mpirun"] and h["args"][:2] == ["-np", "2"]
    assert d["command"] == ["python"] and d["args"][:2] == ["-m", "torch.distributed.run"]
    # torchrun's node count, rank and master come from Trainer's PET_* variables, never from us.
    assert not any(a.startswith("--nnodes") or a.startswith("--master") for a in d["args"])
    for t in (h, d):
        assert t["args"][-3:] == ["-m", "ringflow.training", "/etc/ringflow/job.json"]
    assert (d["numNodes"], d["numProcPerNode"]) == (4, 1)
    assert d["resourcesPerNode"] == {"requests": {"cpu": "8", "memory": "32Gi"},
                                     "limits": {"memory": "40Gi", "nvidia.com/gpu": 2}}
    assert {e["name"]: e.get("value") for e in d["env"]}["RINGFLOW_ENGINE"] == "ddp"
    assert horovod["metadata"]["annotations"][L.ENGINE_ANNOTATION] == "horovod"
    assert ddp["spec"]["activeDeadlineSeconds"] == 7200 and "activeDeadlineSeconds" not in horovod["spec"]


def test_tensorflow_runs_its_pod_entry_on_the_tf_venv_of_every_node():
    tj = trainjob("trainjob-tensorflow")
    assert tj["spec"]["runtimeRef"]["name"] == "ringflow-tensorflow"
    t = tj["spec"]["trainer"]
    # The pod derives TF_CONFIG (tf_pod.py) and becomes the rank on the same interpreter.
    assert t["command"] == ["/opt/tensorflow/bin/python"]
    assert t["args"] == ["-m", "ringflow.training.core.backends.kubernetes.tf_pod", "/etc/ringflow/job.json"]
    env = {e["name"]: e.get("value") for e in t["env"]}
    # The node count in both places from the one number; the index and the JobSet's name come from the pod.
    assert t["numNodes"] == 3 and env["RINGFLOW_NUM_WORKERS"] == "3" and env["RINGFLOW_ENGINE"] == "tensorflow"
    assert "TF_CONFIG" not in env and "JOB_COMPLETION_INDEX" not in env
    assert sorted(_patched_pods(tj)) == ["node"] and tj["metadata"]["annotations"][L.ENGINE_ANNOTATION] == "tensorflow"
    mine = TrainJobSettings.from_dict(DEFAULT | {"tensorflow_python": "/venvs/tf/bin/python3",
                                                "tensorflow_runtime": "team-tf"})
    mine_tj = build_trainjob(CASES["trainjob-tensorflow"][0], mine)
    assert mine_tj["spec"]["trainer"]["command"] == ["/venvs/tf/bin/python3"]
    assert mine_tj["spec"]["runtimeRef"]["name"] == "team-tf"


def test_mpirun_forwards_what_the_ranks_on_other_nodes_need():
    args = trainjob(num_workers=3, env={"NCCL_DEBUG": "WARN"})["spec"]["trainer"]["args"]
    assert args[:2] == ["-np", "3"] and "--allow-run-as-root" not in args
    exported = {args[i + 1] for i, arg in enumerate(args) if arg == "-x"}
    assert exported == {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "RINGFLOW_S3_ENDPOINT", "NCCL_DEBUG", "RINGFLOW_ENGINE"}


def test_credentials_come_only_from_the_secret():
    tj = trainjob()
    env = {e["name"]: e for e in tj["spec"]["trainer"]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "ringflow-minio", "key": key}}}
    assert env["RINGFLOW_S3_ENDPOINT"]["value"] == "http://minio.ringflow:9000"
    with pytest.raises(JobSpecError, match="s3_secret_name"):
        trainjob(env={"AWS_ACCESS_KEY_ID": "x"})


def test_patch_mounts_the_config_and_places_every_pod_of_the_job():
    tj = trainjob("trainjob-ddp-spread-gpu")
    pods = _patched_pods(tj)
    assert sorted(pods) == ["node"]
    assert sorted(_patched_pods(trainjob())) == ["launcher", "node"]
    pod = pods["node"]
    assert pod["metadata"]["labels"] == tj["metadata"]["labels"]
    assert pod["spec"]["volumes"] == [{"name": "ringflow-job", "configMap": {"name": f"{tj['metadata']['name']}-ringflow"}}]
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "ringflow-job", "mountPath": "/etc/ringflow", "readOnly": True}]}]
    term = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": {L.JOBSET_NAME_LABEL: tj["metadata"]["name"]}}
    assert pod["spec"]["serviceAccountName"] == "ringflow-training" and pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_what_trainers_webhook_checks_beyond_the_schema():
    # kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go Validate: a domain-prefixed
    # manager, containers that exist in the runtime ("node"), no env on them (env goes in spec.trainer.env).
    for name in CASES:
        (patch,) = trainjob(name)["spec"]["runtimePatches"]
        domain, _, path = patch["manager"].partition("/")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", domain) and path
        for pod in _patched_pods(trainjob(name)).values():
            for container in pod["spec"]["containers"]:
                assert container["name"] == "node" and "env" not in container
    assert PATCH_MANAGER.startswith("ringflow/")


@pytest.mark.parametrize("config, env, message", [
    ({"engine": "jax"}, {}, "engine' is 'jax'; use one of"),
    ({"engine": "ddp"}, {"PET_MASTER_ADDR": "x"}, "PET_MASTER_ADDR, which the backend manages"),
    ({}, {"OMPI_MCA_orte_default_hostfile": "/x"}, "OMPI_MCA_orte_default_hostfile, which the backend manages"),
    ({}, {"RINGFLOW_ENGINE": "ddp"}, "RINGFLOW_ENGINE, which the backend manages"),
    ({}, {"bad-name": "1"}, "not a valid variable name"),
    ({"engine": "tensorflow"}, {"TF_CONFIG": "{}"}, "TF_CONFIG, which the backend manages"),
    ({"engine": "tensorflow"}, {"RINGFLOW_NUM_WORKERS": "4"}, "RINGFLOW_NUM_WORKERS, which the backend manages"),
    ({"engine": "tensorflow"}, {"JOB_COMPLETION_INDEX": "0"}, "JOB_COMPLETION_INDEX, which the backend manages"),
])
def test_spec_errors_say_what_to_fix(config, env, message):
    with pytest.raises(JobSpecError, match=message):
        trainjob(config=config, env=env)


def test_names_whose_pod_hostnames_would_be_invalid_fail_early():
    settings = TrainJobSettings(image=IMAGE)
    build_trainjob(spec(name="a" * 50), settings)  # "<50>-launcher-0-0": 63 characters
    with pytest.raises(JobSpecError, match="at most 63 characters"):
        build_trainjob(spec(name="a" * 51), settings)
    build_trainjob(spec(name="a" * 54, config={"engine": "ddp"}, num_workers=10), settings)  # "<54>-node-0-9"
    with pytest.raises(JobSpecError, match="at most 63 characters"):
        build_trainjob(spec(name="a" * 54, config={"engine": "ddp"}, num_workers=11), settings)
    build_trainjob(spec(name="a" * 54, config={"engine": "tensorflow"}, num_workers=10), settings)
    with pytest.raises(JobSpecError, match="'a{54}-node-0-10' must start with a letter and have at most 63"):
        build_trainjob(spec(name="a" * 54, config={"engine": "tensorflow"}, num_workers=11), settings)
    with pytest.raises(JobSpecError, match="start with a letter"):
        build_trainjob(spec(name="1-job"), settings)


@pytest.mark.parametrize("change, message", [
    ({"image": "ringflow-training:latest"}, "not pinned"),
    ({"worker": {"memory": "2"}}, "did you forget the unit"),
    ({"placement": "scatter"}, "'pack' or 'spread'"),
    ({"active_deadline_seconds": 0}, "active_deadline_seconds"),
    ({"ddp_runtime": "Torch_Runtime"}, "ddp_runtime"),
    ({"tensorflow_runtime": "TF"}, "tensorflow_runtime"),
    ({"tensorflow_python": "python"}, "tensorflow_python is 'python'; give the absolute path"),
    ({"s3_endpoint": "minio:9000"}, "s3_endpoint"),
    # What only an MPIJob can set is refused by name, with the keys a TrainJob takes.
    ({"launcher": {"cpu": "1"}}, r"unknown keys \['launcher'\]; valid keys are .*horovod_runtime"),
    ({"ssh_port": 22}, r"unknown keys \['ssh_port'\]"),
])
def test_settings_errors_say_what_to_fix(change, message):
    with pytest.raises(SettingsError, match=message):
        TrainJobSettings.from_dict({"image": IMAGE} | change)


def test_settings_round_trip_through_json_and_the_configmap_is_the_mpijobs():
    s = TrainJobSettings.from_dict(CASES["trainjob-ddp-spread-gpu"][1])
    assert TrainJobSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    cm = build_configmap(spec(), TrainJobSettings.from_dict(DEFAULT))
    assert json.loads(cm["data"]["job.json"]) == spec().config and cm["metadata"]["labels"] == trainjob()["metadata"]["labels"]
    with pytest.raises(SettingsError, match="must be a TrainJobSettings"):
        build_trainjob(spec(), DEFAULT)


def test_backend_from_env_picks_the_job_kind():
    from ringflow.training.core.backends.kubernetes.mpijob_backend import MPIJobBackend
    from ringflow.training.core.backends.kubernetes.trainjob_backend import TrainJobBackend

    chosen = backend_from_env({"RINGFLOW_TRAINJOB_SETTINGS": json.dumps({"image": IMAGE}), "RINGFLOW_K8S_CONN_ID": "k"})
    assert isinstance(chosen, TrainJobBackend) and chosen.kind == "trainjob" and chosen.conn_id == "k"
    assert isinstance(backend_from_env({"RINGFLOW_MPIJOB_SETTINGS": json.dumps({"image": IMAGE})}), MPIJobBackend)
    assert backend_from_env({"RINGFLOW_TRAINJOB_SETTINGS": "  "}) is None
    with pytest.raises(ValueError, match="both .*set only the one"):
        backend_from_env({"RINGFLOW_MPIJOB_SETTINGS": json.dumps({"image": IMAGE}),
                          "RINGFLOW_TRAINJOB_SETTINGS": json.dumps({"image": IMAGE})})
    with pytest.raises(ValueError, match=r"\$RINGFLOW_TRAINJOB_SETTINGS is not valid JSON.*TrainJob settings"):
        backend_from_env({"RINGFLOW_TRAINJOB_SETTINGS": "{image: x}"})
    with pytest.raises(SettingsError, match="unknown keys"):
        backend_from_env({"RINGFLOW_TRAINJOB_SETTINGS": json.dumps({"image": IMAGE, "run_policy": {}})})


def test_labels_of_the_trainjob_are_the_reattach_labels():
    tj = trainjob()
    assert L.carries(tj, LABELS) and not L.carries(tj, LABELS | {"try": "2"})
