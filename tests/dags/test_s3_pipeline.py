"""The whole ringflow_retrain DAG on an S3 store: `RINGFLOW_STORE=s3://...` and the Airflow connection
`ringflow_s3`, against moto's server on 127.0.0.1 with credentials enforced.

The connection holds the only credentials anything in the run has: a user allowed on this one bucket and
nothing else, so a process that reached the bucket any other way (keys from a job spec, an XCom, the test's
environment) would be refused. Shards, checkpoints, health records, result/eval, the health plot and the
promoted model all land in the bucket; nothing lands in a local folder; the secret key is in no file the
run leaves behind (job folder, Airflow's database, logs).

Then the same DAG through a fault-injecting proxy (tests/s3_fault_proxy.py): 5xx answers, reset connections
and slow answers during shard reads, checkpoint uploads and the promotion copy are retried by the store and
lose nothing (the train task does not even retry); a checkpoint upload that fails for good fails the job, and
the task's retry resumes from the previous checkpoint.
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


def connection_env(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """The `ringflow_s3` connection in the environment-variable form (JSON) Airflow reads."""
    conn = {"conn_type": "aws", "login": access_key, "password": secret_key,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
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


@pytest.mark.pipeline
def test_pipeline_script_promotes_through_s3_with_the_connection_only(s3_server_with_auth, clean_env, tmp_path):
    """scripts/run-pipeline.sh as a team runs it, on a fresh AIRFLOW_HOME, with an s3:// store."""
    server = s3_server_with_auth
    bucket = server.new_bucket("rf-pipeline")
    access, secret = bucket_user(server, bucket, f"user-{bucket}")
    home, jobs = tmp_path / "airflow", tmp_path / "jobs"
    model = "digits-s3"
    env = {k: v for k, v in clean_env.items() if not k.startswith("AIRFLOW")} | {
        "AIRFLOW_HOME": str(home), "RINGFLOW_STORE": f"s3://{bucket}/{STORE_PREFIX}",
        "RINGFLOW_LOCAL_JOBS": str(jobs), "RINGFLOW_VENV": sys.prefix,
    } | connection_env(server.endpoint, access, secret)

    proc = subprocess.run(["bash", str(REPO / "scripts" / "run-pipeline.sh"), json.dumps(CONF | {"model_name": model})],
                          env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    logs = "\n".join(p.read_text(errors="replace")[-4000:] for p in (home / "logs").glob("pipeline-*.log"))
    assert proc.returncode == 0, out[-4000:] + logs
    assert f"model '{model}' version 1 is in production" in out, out[-3000:]

    pointer = check_bucket(server, bucket, model)
    assert f"s3://{bucket}/{STORE_PREFIX}/models/{model}/production.json" in out
    assert pointer["run_uri"] in out

    # Nothing written to a local store: not the default folder, not a folder named after the URI.
    assert not (home / "ringflow-data").exists()
    for where in (tmp_path, REPO):
        assert not list(where.glob("s3*")), list(where.glob("s3*"))
    job_dirs = list(jobs.iterdir())
    assert len(job_dirs) == 1, job_dirs
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


# -- transient faults ---------------------------------------------------------------------------------------

# The connection's client settings for the fault runs: a read timeout well below the injected delays, so a
# slow answer is given up on and retried; they reach the training processes with the credentials.
FAULT_TUNING = {"connect_timeout": 5, "read_timeout": 2, "retries": {"total_max_attempts": 5}}
DELAY_SECONDS = 5


@pytest.fixture
def proxied_store(s3_server_with_auth, clean_env, airflow_db, monkeypatch, tmp_path):
    """A fresh bucket behind a FaultProxy, its own user, the ringflow_s3 connection pointing at the proxy
    and RINGFLOW_STORE at the bucket; returns (proxy, bucket, secret, parsed DagBag)."""
    from airflow.dag_processing.dagbag import DagBag
    from s3_fault_proxy import FaultProxy

    server = s3_server_with_auth
    bucket = server.new_bucket("rf-faults")
    access, secret = bucket_user(server, bucket, f"user-{bucket}")
    with FaultProxy(server.endpoint) as proxy:
        conn = json.loads(connection_env(proxy.endpoint, access, secret)["AIRFLOW_CONN_RINGFLOW_S3"])
        conn["extra"]["config_kwargs"] = FAULT_TUNING
        monkeypatch.setenv("AIRFLOW_CONN_RINGFLOW_S3", json.dumps(conn))
        monkeypatch.setenv("RINGFLOW_STORE", f"s3://{bucket}/{STORE_PREFIX}")
        monkeypatch.setenv("RINGFLOW_LOCAL_JOBS", str(tmp_path / "jobs"))
        bag = DagBag(str(REPO / "dags"))
        assert not bag.import_errors, bag.import_errors
        yield proxy, bucket, secret, bag


def failure(out: str) -> str:
    """The task log from the first traceback on (what a failed run's assertion shows)."""
    start = out.find("Traceback")
    return out[start:start + 5000] if start >= 0 else out[-5000:]


def run_dag(dag, conf: dict):
    dr = dag.test(run_conf=conf)
    tis = {ti.task_id.split(".", 1)[1]: ti for ti in dr.get_task_instances()}
    return dr, tis


@pytest.mark.pipeline
def test_transient_s3_faults_are_retried_and_lose_nothing(proxied_store, s3_server_with_auth, capfd):
    from ringflow.training.core.registry.model_registry import ModelRegistry
    from ringflow.training.store import open_store

    proxy, bucket, secret, bag = proxied_store
    model = "digits-faults"
    ckpt = r"/runs/.*/checkpoints/{}/{}$"
    rules = {
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

    dr, tis = run_dag(bag.dags[DAG_ID], CONF | {"model_name": model})
    out = "".join(capfd.readouterr())
    assert dr.state == "success", f"{ {step: str(tis[step].state) for step in STEPS} }\n{failure(out)}"
    assert tis["train"].try_number == 1  # the store's own retries absorbed every fault; the task never retried

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

    pointer = check_bucket(s3_server_with_auth, bucket, model)  # nothing lost, nothing extra
    result = read_result(open_store(pointer["run_uri"], s3=s3_server_with_auth.settings()))
    assert result.resumed_from is None
    registry = ModelRegistry(open_store(f"s3://{bucket}/{STORE_PREFIX}", s3=s3_server_with_auth.settings()))
    assert [p.version for p in registry.history(model)] == [1]  # the retried pointer write promoted once
    # The job had the secret in its environment only: not in its folder, the task log or Airflow's database.
    assert secret not in out
    assert files_holding(pathlib.Path(os.environ["RINGFLOW_LOCAL_JOBS"]), secret) == []
    home = pathlib.Path(os.environ["AIRFLOW_HOME"])
    assert any(pathlib.Path(p).name.startswith("airflow.db") for p in files_holding(home, pointer["run_uri"]))
    assert files_holding(home, secret) == []


@pytest.mark.pipeline
def test_checkpoint_upload_failing_for_good_resumes_from_the_previous_checkpoint(proxied_store, s3_server_with_auth,
                                                                                 tmp_path, capfd):
    """Every attempt to upload ckpt-40 fails while the first job runs: that job stops with STORE_UNAVAILABLE
    (the background writer's failure, not a crash), and the task's retry resumes from ckpt-20, the last
    complete checkpoint, losing only the steps after it."""
    import datetime as dt
    import threading

    proxy, bucket, _, bag = proxied_store
    model = "digits-ckpt-lost"
    dag = bag.dags[DAG_ID]
    dag.get_task("digits.train").retry_delay = dt.timedelta(seconds=1)
    proxy.fail("PUT", r"/runs/.*/checkpoints/ckpt-000000040/state\.pt$", times=None)

    first_job_ended, stop = threading.Event(), threading.Event()

    def heal_when_the_first_job_ends():  # the outage lasts exactly as long as the first try's job
        while not stop.wait(0.2):
            jobs = tmp_path / "jobs"  # it exits, or the trigger stops it once it has stopped itself
            if list(jobs.glob("*-t1/exit_code")) or list(jobs.glob("*-t1/deleted")):
                proxy.clear()
                first_job_ended.set()
                return

    healer = threading.Thread(target=heal_when_the_first_job_ends, daemon=True)
    healer.start()
    try:
        dr, tis = run_dag(dag, CONF | {"model_name": model})
    finally:
        stop.set()
        healer.join(timeout=5)
    out = "".join(capfd.readouterr())
    assert first_job_ended.is_set(), failure(out)
    assert dr.state == "success", f"{ {step: str(tis[step].state) for step in STEPS} }\n{failure(out)}"
    assert tis["train"].try_number == 2

    lost = proxy.requests("PUT", r"/checkpoints/ckpt-000000040/state\.pt$")
    attempts = [e for e in lost if e.fault == "fail"]
    assert len(attempts) == FAULT_TUNING["retries"]["total_max_attempts"], lost  # retried, then given up
    assert lost[-1].fault is None and 200 <= (lost[-1].status or 0) < 300  # the retried task uploaded it
    first_log = next((tmp_path / "jobs").glob("*-t1/output.log")).read_text(errors="replace")
    assert "ckpt-000000040" in first_log and "STORE_UNAVAILABLE" in first_log, first_log[-3000:]

    pointer = check_bucket(s3_server_with_auth, bucket, model)
    result = read_result(open_store(pointer["run_uri"], s3=s3_server_with_auth.settings()))
    assert result.resumed_from == "ckpt-000000020" and result.step == 44
