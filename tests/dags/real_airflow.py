"""A real Airflow for the DAG tests: api-server, scheduler, triggerer and dag-processor as separate processes on
127.0.0.1, the simple auth manager, the REST API. Every wait is bounded; every process started here is stopped
at the end, with its process group.

One per pytest run (the `real_airflow` fixture, tests/dags/conftest.py): the REST, asset-event, approval and
browser tests share it, each with DAG runs and model names of its own. It parses the repo's DAGs and the test
DAGs below (`shared_dag_folder`), and its scheduler creates runs (asset-triggered runs need it), so the tests
unpause only DAGs without a time schedule: a cron DAG would get a run of its last interval on unpausing."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time

COMPONENTS = ("api-server", "scheduler", "triggerer", "dag-processor")
REPO_DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"
# A test-only DAG (never in dags/): the pipeline with an approval that times out after 5 seconds.
TIMEOUT_DAG_ID = "ringflow_approval_times_out"
TIMEOUT_DAG = f'''
import datetime as dt

from airflow.sdk import DAG

from ringflow.operators.pipeline import ringflow_pipeline
from ringflow.operators.pipeline_specs import DataSpec, GateSpec, TrainingSpec

with DAG("{TIMEOUT_DAG_ID}", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
         catchup=False):
    ringflow_pipeline("digits", model_name="digits-timeout",
                      data=DataSpec("builtin:digits", suite="suites/digits.json"),
                      training=TrainingSpec(epochs=1, batch_size=32, learning_rate=0.002),
                      gate=GateSpec(require_approval=True, approval_timeout=dt.timedelta(seconds=5)))
'''


def drop_digits(store: pathlib.Path) -> pathlib.Path:
    """The digits as a new file at the dataset asset's URI (dags/ringflow_retrain.py DIGITS_DROP), where
    ringflow_retrain_on_asset reads by default."""
    from ringflow.training.formats.datasets import load_builtin

    drop = store / "datasets" / "digits.parquet"
    drop.parent.mkdir(parents=True, exist_ok=True)
    load_builtin("digits").to_parquet(drop, index=False)
    return drop


def shared_dag_folder(folder: pathlib.Path) -> pathlib.Path:
    """The DAG folder of the shared Airflow: the repo's DAG files and suites (links) and the test DAGs."""
    folder.mkdir(parents=True)
    for path in REPO_DAGS.iterdir():
        if path.suffix == ".py" or path.name == "suites":
            (folder / path.name).symlink_to(path)
    (folder / "approval_times_out.py").write_text(TIMEOUT_DAG)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Airflow:
    def __init__(self, env: dict[str, str], logs: pathlib.Path, port: int) -> None:
        self.env, self.logs, self.port = env, logs, port
        self.base = f"http://127.0.0.1:{port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.token: str | None = None
        self.unpaused: list[str] = []  # paused again on stop: the metadata database outlives this Airflow
        self.stopped = False

    def start(self) -> None:
        for name in COMPONENTS:
            log = open(self.logs / f"{name}.log", "wb")
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", name], env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """Stop every component (again: nothing; the shared one is stopped after its last test, and then at the
        end of the session)."""
        if self.stopped:
            return
        self.stopped = True
        # A DAG left unpaused in the shared test database would be scheduled by the next real Airflow (its cron
        # run writing into that test's store).
        for dag_id in self.unpaused:
            try:
                self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})
            except OSError:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (workers, gunicorn children)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def tail(self) -> str:
        return "\n".join(f"--- {p.name} ---\n" + p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.logs.glob("*.log")))

    def wait_for_process_end_seen(self, dag_id: str, run_id: str, task_id: str, timeout: float = 120) -> None:
        """Wait until the scheduler has handled the executor's event for the process that ran `task_id` and
        paused it (deferred, or awaiting input). Why: Airflow 3.3 fails a task that resumes before that (its
        trigger fired, or its HITL answer came, within a scheduler loop): "finished with state success, but the
        task instance's state attribute is queued". A person answers minutes later; a test answering at once
        must wait for it. The scheduler's log is the one place that says so."""
        key = f"TaskInstanceKey(dag_id='{dag_id}', task_id='{task_id}', run_id='{run_id}'"
        log = self.logs / "scheduler.log"

        def seen() -> bool:
            return any("Received executor event" in line and key in line
                       for line in log.read_text(errors="replace").splitlines())

        self.wait_for(f"the scheduler to handle the end of {task_id}'s process", seen, timeout, interval=0.5)

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"Airflow components exited: {dead}\n{self.tail()}"

    def request(self, method: str, path: str, body=None, auth: bool = True):
        import requests

        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return requests.request(method, self.base + path, json=body, headers=headers, timeout=30)

    def wait_for(self, what: str, check, timeout: float, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                result = check()
            except OSError:  # not listening yet
                result = None
            if result:
                return result
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.tail()}")

    def user_password(self) -> tuple[str, str]:
        """(user, password) for the UI's login page: the one user, with the password the simple auth manager
        generated when the API server started."""
        password = self.wait_for("the generated password", lambda: self.passwords.exists() and json.loads(
            self.passwords.read_text() or "{}").get("ringflow"), timeout=30)
        return "ringflow", password

    def log_in(self) -> None:
        """Wait for the API server, read the password the simple auth manager generated, take a token."""
        self.wait_for("the API server", lambda: self.request("GET", "/api/v2/monitor/health", auth=False).ok,
                      timeout=180)
        password = self.wait_for("the generated password", lambda: self.passwords.exists() and json.loads(
            self.passwords.read_text() or "{}").get("ringflow"), timeout=30)
        response = self.request("POST", "/auth/token", {"username": "ringflow", "password": password}, auth=False)
        assert response.status_code == 201, response.text
        self.token = response.json()["access_token"]

    def unpause(self, dag_id: str) -> None:
        self.wait_for("the DAG to be parsed", lambda: self.request("GET", f"/api/v2/dags/{dag_id}").ok,
                      timeout=180, interval=2)
        response = self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        assert response.ok and response.json()["is_paused"] is False, response.text
        self.unpaused.append(dag_id)


    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The task's log of its last try, through the REST API."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        ti = self.request("GET", path).json()
        response = self.request("GET", f"{path}/logs/{ti['try_number']}")
        assert response.ok, response.text
        return json.dumps(response.json())

    def failed_task_logs(self, dag_id: str, run_id: str) -> str:
        """The logs of the run's failed tasks: what a test that waited in vain shows."""
        tis = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        return "\n".join(f"--- {ti['task_id']} ---\n{self.task_log(dag_id, run_id, ti['task_id'])[-4000:]}"
                         for ti in tis if ti["state"] == "failed")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> tuple[str, dict[str, str]]:
        """Wait until the run ends; its state and each task's state."""
        def finished():
            state = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
            return state if state in ("success", "failed") else None

        state = self.wait_for(f"run {run_id} to finish", finished, timeout=timeout, interval=3)
        tis = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        return state, {ti["task_id"]: ti["state"] for ti in tis}

@contextlib.contextmanager
def running_airflow(dags_env: dict[str, str], store: pathlib.Path, tmp_path: pathlib.Path, *,
                    use_job_schedule: bool):
    """use_job_schedule False: only the runs a test creates (no cron run when a DAG is unpaused). True: the
    scheduler creates runs, which asset-triggered runs need. Every DAG starts paused either way."""
    port = _free_port()
    passwords = tmp_path / "passwords.json"
    env = {**os.environ, **dags_env,
           "RINGFLOW_STORE": str(store),
           "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__WORKERS": "1",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
           "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
           "AIRFLOW__CORE__AUTH_MANAGER":
               "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ringflow:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__PARALLELISM": "3",
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(use_job_schedule),
           # The DAG files do not change while the tests run: parsed once, not again every 30 s beside the tests.
           "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}
    logs = tmp_path / "logs"
    logs.mkdir()
    instance = Airflow(env, logs, port)
    instance.passwords = passwords
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
