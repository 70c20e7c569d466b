"""The whole ringflow_retrain DAG on an S3 store: `RINGFLOW_STORE=s3://...` and the Airflow connection
`ringflow_s3`, against moto's server on 127.0.0.1 with credentials enforced, reached through a fault-injecting
proxy (tests/s3_fault_proxy.py).

The connection holds the only credentials anything in the run has: a user allowed on this one bucket and
nothing else, so a process that reached the bucket any other way (keys from a job spec, an XCom, the test's
environment) would be refused. Shards, checkpoints, health records, result/eval, the health plot and the
promoted model all land in the bucket; nothing lands in a local folder; the secret key is in no file the
run leaves behind (job folder, Airflow's database, logs).

The same run meets transient faults: 5xx answers, reset connections and slow answers during shard reads,
checkpoint uploads and the promotion are retried by the store and lose nothing (the train task does not even
retry). A checkpoint upload that fails for good, and the next try resuming from the previous checkpoint, is a
job's test (tests/training/test_s3_checkpoint_outage.py): the task's retry itself is the failure policy's.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.request

import pytest

from ringflow.training.formats.run_folder import RunFolder
from run_folder_files import read_result
from ringflow.training.store import open_store

pytestmark = [pytest.mark.job, pytest.mark.timeout(600)]

REPO = pathlib.Path(__file__).resolve().parents[2]
DAG_ID = "ringflow_retrain"
STEPS = ["validate", "shard", "train", "evaluate", "promote"]
STORE_PREFIX = "team-a/ringflow"  # a store below the bucket root: every key is relative to it
# 2 workers x 32 rows x 22 minibatches = one epoch of digits; a checkpoint every 20 steps gives three
# (20, 40 and the final 44), so uploads of non-final checkpoints are exercised too.
CONF = {"epochs": 2, "job_overrides": {"checkpoint": {"every_steps": 20}}}
CHECKPOINTS = ["ckpt-000000020", "ckpt-000000040", "ckpt-000000044"]
# What would hand a process S3 credentials other than the connection.
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
                   "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "RINGFLOW_S3_ENDPOINT")


def _set_auth(endpoint: str, free_actions: str) -> None:
    """moto's switch: the next `free_actions` requests skip authentication ("0": every request is checked)."""
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=free_actions.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=5):
        pass


def bucket_user(server, bucket: str, name: str) -> tuple[str, str]:
    """An IAM user allowed everything on `bucket` and nothing else: (access key, secret key).

    The session's server already checks every request and its users may not touch IAM, so authentication is
    lifted for the few IAM calls (nothing else runs meanwhile: tests of one session run one at a time)."""
    import boto3

    iam = boto3.client("iam", endpoint_url=server.endpoint, region_name=server.region,
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    _set_auth(server.endpoint, "inf")
    try:
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="one-bucket", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*"],
                           "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}],
        }))
        key = iam.create_access_key(UserName=name)["AccessKey"]
    finally:
        _set_auth(server.endpoint, "0")
    return key["AccessKeyId"], key["SecretAccessKey"]


def connection_env(endpoint: str, access_key: str, secret_key: str, config_kwargs: dict) -> dict[str, str]:
    """The `ringflow_s3` connection in the environment-variable form (JSON) Airflow reads."""
    conn = {"conn_type": "aws", "login": access_key, "password": secret_key,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1", "config_kwargs": config_kwargs}}
    return {"AIRFLOW_CONN_RINGFLOW_S3": json.dumps(conn)}


def bucket_keys(client, bucket: str) -> list[str]:
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys += [obj["Key"] for obj in page.get("Contents", [])]
    return sorted(keys)


def files_holding(root: pathlib.Path, secret: str) -> list[str]:
    """Every file under `root` whose bytes contain `secret`."""
    needle = secret.encode()
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle in path.read_bytes():
            found.append(str(path))
    return found


def check_bucket(server, bucket: str, model: str, health_steps=frozenset({10, 20, 30, 40})) -> dict:
    """Everything the run should have left in the bucket; returns the production pointer.
    health_steps: steps that must have a health record (measured every 10)."""
    from run_folder_files import read_health
    from ringflow.training.store import open_store

    client = server.boto3_client()
    keys = bucket_keys(client, bucket)
    rel = [k[len(STORE_PREFIX) + 1:] for k in keys if k.startswith(STORE_PREFIX + "/")]
    assert len(rel) == len(keys), f"objects outside the store prefix: {sorted(set(keys) - set(rel))}"

    manifests = [k for k in rel if re.fullmatch(r"shards/digits/[^/]+/manifest\.json", k)]
    assert len(manifests) == 1, rel
    shard_folder = manifests[0].rsplit("/", 1)[0]
    partitions = ("part-00000.parquet", "part-00001.parquet", "eval.parquet")
    assert {f"{shard_folder}/{name}" for name in partitions} <= set(rel), rel

    runs = sorted({k.split("/")[2] for k in rel if k.startswith(f"runs/{DAG_ID}/")})
    assert len(runs) == 1, runs
    run = f"runs/{DAG_ID}/{runs[0]}/digits"
    for name in ("run.json", "eval.json", "health.png"):
        assert f"{run}/{name}" in rel, (name, rel)
    run_store = open_store(f"s3://{bucket}/{STORE_PREFIX}/{run}", s3=server.settings())
    published = RunFolder(run_store).checkpoints()  # what the run folder's pointer names (run_folder.py)
    assert sorted(published.names()) == sorted(CHECKPOINTS)
    checkpoint_files = {k[len(run) + 1:] for k in rel if k.startswith(f"{run}/") and "/checkpoints/" in k}
    assert checkpoint_files == {f"{published.prefix_of(c)}/{c}/{f}" for c in CHECKPOINTS
                                for f in ("state.pt", "MANIFEST.json")}

    def get(key):
        return client.get_object(Bucket=bucket, Key=f"{STORE_PREFIX}/{key}")["Body"].read()

    result = read_result(run_store)
    assert result.succeeded and result.checkpoint == CHECKPOINTS[-1] and result.step == 44
    assert result.verdict.status in ("HEALTHY", "DEGRADED")
    evaluation = json.loads(get(f"{run}/eval.json"))
    assert evaluation["checkpoint"] == CHECKPOINTS[-1] and evaluation["metrics"]["accuracy"] > 0.5
    assert get(f"{run}/health.png").startswith(b"\x89PNG")
    # The health records, read the way the trigger and `ringflow health` read them (however they are filed).
    records = read_health(open_store(f"s3://{bucket}/{STORE_PREFIX}/{run}", s3=server.settings()))
    measured = {r["step"] for r in records if r.get("type") == "step"}
    assert measured >= health_steps, (sorted(measured), records[-3:])

    pointer = json.loads(get(f"models/{model}/production.json"))
    assert pointer["version"] == 1 and pointer["checkpoint"] == CHECKPOINTS[-1]
    assert pointer["run_uri"] == f"s3://{bucket}/{STORE_PREFIX}/{run}"
    assert pointer["metrics"] == evaluation["metrics"]
    version = f"models/{model}/v1"
    assert {f"{version}/state.pt", f"{version}/MODEL.json"} <= set(rel), rel
    # The promoted copy is the checkpoint's own bytes (a server-side copy of what was verified).
    final = CHECKPOINTS[-1]
    assert get(f"{version}/state.pt") == get(f"{run}/{published.prefix_of(final)}/{final}/state.pt")
    return pointer


@pytest.fixture
def clean_env(monkeypatch):
    """No S3 credentials in this process's environment: whatever reaches the bucket got them from the
    Airflow connection."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    return {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS and not k.startswith("AIRFLOW_CONN_")}


def test_scoped_user_reaches_its_bucket_only(s3_server_with_auth):
    """The premise of the pipeline tests: the server refuses what the connection's user may not do."""
    from botocore.exceptions import ClientError

    server = s3_server_with_auth
    bucket, other = server.new_bucket("rf-scoped"), server.new_bucket("rf-other")
    access, secret = bucket_user(server, bucket, f"user-{bucket}")
    scoped = server.boto3_client(aws_access_key_id=access, aws_secret_access_key=secret)
    scoped.put_object(Bucket=bucket, Key="k", Body=b"1")
    for call in (lambda: scoped.put_object(Bucket=other, Key="k", Body=b"1"),
                 lambda: server.boto3_client(aws_access_key_id=access, aws_secret_access_key="wrong")
                 .get_object(Bucket=bucket, Key="k"),
                 lambda: server.boto3_client(aws_access_key_id="unknown", aws_secret_access_key=secret)
                 .get_object(Bucket=bucket, Key="k")):
        with pytest.raises(ClientError):
            call()


# The connection's client settings: a read timeout well below the injected delays, so a slow answer is given up on
# and retried; they reach the training processes with the credentials.
FAULT_TUNING = {"connect_timeout": 5, "read_timeout": 2, "retries": {"total_max_attempts": 5}}
DELAY_SECONDS = 5


def transient_faults(proxy, model: str) -> dict:
    """One fault of each kind on each part of a run that reads or writes the store: {what: rule}."""
    ckpt = r"/runs/.*/checkpoints/{}/{}$"
    return {
        # Shard reads: each training rank reads its partition once; the evaluate task reads the eval split.
        "503 on rank 0's partition": proxy.fail("GET", r"/shards/digits/.*/part-00000\.parquet$", times=2),
        "reset reading rank 1's partition": proxy.reset("GET", r"/shards/digits/.*/part-00001\.parquet$"),
        "slow eval split": proxy.delay("GET", r"/shards/digits/.*/eval\.parquet$", seconds=DELAY_SECONDS),
        # Checkpoint uploads, from rank 0 of the training job.
        "503 uploading ckpt-20": proxy.fail("PUT", ckpt.format("ckpt-000000020", r"state\.pt"), times=2),
        "reset uploading ckpt-40": proxy.reset("PUT", ckpt.format("ckpt-000000040", r"state\.pt")),
        "slow ckpt-40 manifest": proxy.delay("PUT", ckpt.format("ckpt-000000040", r"MANIFEST\.json"),
                                             seconds=DELAY_SECONDS),
        # The promotion's server-side copy (a PUT with x-amz-copy-source: nothing else writes v1/state.pt).
        "500 on the promotion copy": proxy.fail("PUT", rf"/models/{model}/v1/state\.pt$", status=500),
        "reset on the promotion copy": proxy.reset("PUT", rf"/models/{model}/v1/state\.pt$"),
        # The pointer's conditional write lands but its answer is lost: the retry meets that write.
        "reset on the pointer write": proxy.reset("PUT", rf"/models/{model}/production\.json$"),
    }


@pytest.mark.pipeline
def test_pipeline_script_promotes_through_s3_with_the_connection_only(s3_server_with_auth, clean_env, tmp_path):
    """scripts/run-pipeline.sh as a team runs it, on a fresh AIRFLOW_HOME, with an s3:// store behind the proxy."""
    from s3_fault_proxy import FaultProxy

    from ringflow.training.core.registry.model_registry import ModelRegistry

    server = s3_server_with_auth
    bucket = server.new_bucket("rf-pipeline")
    access, secret = bucket_user(server, bucket, f"user-{bucket}")
    home, jobs = tmp_path / "airflow", tmp_path / "jobs"
    model = "digits-s3"
    with FaultProxy(server.endpoint) as proxy:
        env = {k: v for k, v in clean_env.items() if not k.startswith("AIRFLOW")} | {
            "AIRFLOW_HOME": str(home), "RINGFLOW_STORE": f"s3://{bucket}/{STORE_PREFIX}",
            "RINGFLOW_LOCAL_JOBS": str(jobs), "RINGFLOW_VENV": sys.prefix,
        } | connection_env(proxy.endpoint, access, secret, FAULT_TUNING)
        rules = transient_faults(proxy, model)

        proc = subprocess.run(["bash", str(REPO / "scripts" / "run-pipeline.sh"),
                               json.dumps(CONF | {"model_name": model})],
                              env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    logs = "\n".join(p.read_text(errors="replace")[-4000:] for p in (home / "logs").glob("pipeline-*.log"))
    assert proc.returncode == 0, out[-4000:] + logs
    assert f"model '{model}' version 1 is in production" in out, out[-3000:]

    assert proxy.pending() == []  # every fault was served ...
    for what, rule in rules.items():
        log = proxy.requests(rule.method, rule.path)
        last_fault = max(i for i, e in enumerate(log) if e.fault is not None)
        # ... and the same request went through after it: a conditional write whose first try landed is
        # answered 412 (the object is no longer what the condition said), which the store knows as its own.
        conditional = what == "reset on the pointer write"
        assert any(e.fault is None and e.status is not None
                   and (200 <= e.status < 300 or (conditional and e.status == 412))
                   for e in log[last_fault + 1:]), (what, log)

    pointer = check_bucket(server, bucket, model)  # nothing lost, nothing extra
    assert f"s3://{bucket}/{STORE_PREFIX}/models/{model}/production.json" in out
    assert pointer["run_uri"] in out
    assert read_result(open_store(pointer["run_uri"], s3=server.settings())).resumed_from is None
    registry = ModelRegistry(open_store(f"s3://{bucket}/{STORE_PREFIX}", s3=server.settings()))
    assert [p.version for p in registry.history(model)] == [1]  # the retried pointer write promoted once

    # Nothing written to a local store: not the default folder, not a folder named after the URI.
    assert not (home / "ringflow-data").exists()
    for where in (tmp_path, REPO):
        assert not list(where.glob("s3*")), list(where.glob("s3*"))
    job_dirs = list(jobs.iterdir())
    # One job, of the train task's first try: the store's own retries absorbed every fault.
    assert len(job_dirs) == 1 and job_dirs[0].name.endswith("-t1"), job_dirs
    assert {p.name for p in job_dirs[0].iterdir()} <= {"job.json", "labels.json", "output.log", "pid", "exit_code",
                                                        "processes.json"}
    # The job's spec holds URIs only; its keys came in its environment, from the connection.
    job = json.loads((job_dirs[0] / "job.json").read_text())
    assert job["run_uri"] == pointer["run_uri"] and job["manifest_uri"].startswith(f"s3://{bucket}/")
    assert secret not in out
    assert files_holding(jobs, secret) == []
    # Airflow's database (XComs, rendered templates, trigger state; with its WAL file) and logs: they hold
    # the run, not the secret.
    assert any(pathlib.Path(p).name.startswith("airflow.db") for p in files_holding(home, pointer["run_uri"]))
    assert files_holding(home, secret) == []
    assert access not in (job_dirs[0] / "job.json").read_text()
