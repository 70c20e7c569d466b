"""Runs a job as local `horovodrun` processes: the embedded default, for a laptop or a single host.

Each job gets a folder under `work_dir`:
    job.json     the training config          labels.json   for find() on retry
    output.log   everything the ranks print   pid           the job's process group
    exit_code    written when the job ends (absent while it runs, or if it was killed); its meaning comes
                 from the one table (training/exit_codes.py), and the job's own result.json is the outcome
                 (the trigger attaches it: backends.base.with_result)
The job runs in its own session, detached from the Airflow worker that launched it, so the worker slot is
free while the task is deferred.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from ringflow.training.backends.base import (
    FAILED, RUNNING, SUCCEEDED, Backend, JobNotFound, JobStatus, LogChunk, exit_reason,
)
from ringflow.training.backends.connections import Connections, require
from ringflow.training.backends.job_spec import JobSpec


def job_environment(worker_env: Mapping[str, str], spec_env: Mapping[str, str],
                    s3_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a local job starts with: the Airflow worker's, less Airflow's own settings, plus the
    spec's variables and the S3 settings of the task's connection (last, so they win).

    Airflow's variables go: connections (`AIRFLOW_CONN_*`), variables and configuration (`AIRFLOW__*`: the
    metadata database URL, Fernet and JWT keys) are secrets a training job never needs, since it does not
    run Airflow code; the only credentials it gets are the ones `s3_env` hands it."""
    inherited = {k: v for k, v in worker_env.items() if not k.lstrip("_").startswith("AIRFLOW")}
    return inherited | dict(spec_env) | dict(s3_env) | {"PYTHONUNBUFFERED": "1"}


def default_work_dir() -> str:
    return os.environ.get("RINGFLOW_LOCAL_JOBS", os.path.join(tempfile.gettempdir(), "ringflow-jobs"))


class LocalProcessBackend(Backend):
    kind = "local"

    def __init__(self, work_dir: str | None = None, python: str | None = None, stop_grace_seconds: float = 10.0,
                 conn_id: str | None = None, connections: Connections | None = None):
        """conn_id: a connection (an Airflow one of type aws, through `connections`) whose S3 credentials
        the job gets in its environment, resolved at launch so they never appear in the job spec or the
        trigger's serialized state; None: no connection, the job keeps the S3 variables of the worker's
        environment (operators/connections.py)."""
        self.work_dir = work_dir or default_work_dir()
        self.python = python or sys.executable
        self.stop_grace_seconds = stop_grace_seconds
        self.conn_id, self.connections = conn_id, connections

    def to_dict(self) -> dict[str, Any]:
        return {"work_dir": self.work_dir, "python": self.python, "stop_grace_seconds": self.stop_grace_seconds,
                "conn_id": self.conn_id}

    def _secret_env(self, spec: JobSpec) -> dict[str, str]:
        uses_s3 = "s3://" in json.dumps(spec.config)
        if not (uses_s3 and self.conn_id):
            return {}
        return require(self.connections, self.conn_id, "the local backend").s3_settings(self.conn_id).to_env()

    def _dir(self, job_id: str) -> Path:
        path = Path(self.work_dir) / job_id
        if not (path / "job.json").exists():
            raise JobNotFound(f"no local job {job_id!r} under {self.work_dir}")
        return path

    def launch(self, spec: JobSpec) -> str:
        if spec.slots_per_worker != 1:
            raise ValueError("local jobs run one rank per process: set slots_per_worker=1")
        job_dir = Path(self.work_dir) / spec.name
        if (job_dir / "pid").exists():
            raise FileExistsError(f"a local job named {spec.name!r} was already launched in {job_dir}")
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "job.json").write_text(json.dumps(spec.config, indent=1))
        (job_dir / "labels.json").write_text(json.dumps(spec.labels))
        train = [self.python, "-m", "ringflow.training.cli", "train", str(job_dir / "job.json"),
                 "--np", str(spec.num_workers), "--controller", spec.controller]
        # The shell records the exit status, since nobody waits on this process once the task defers.
        script = (f"{shlex.join(train)} > {shlex.quote(str(job_dir / 'output.log'))} 2>&1; "
                  f"echo $? > {shlex.quote(str(job_dir / 'exit_code.tmp'))} && "
                  f"mv {shlex.quote(str(job_dir / 'exit_code.tmp'))} {shlex.quote(str(job_dir / 'exit_code'))}")
        proc = subprocess.Popen(["/bin/sh", "-c", script],
                                env=job_environment(os.environ, spec.env, self._secret_env(spec)),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=job_dir)
        (job_dir / "pid").write_text(str(proc.pid))
        return spec.name

    def find(self, labels: dict[str, str]) -> str | None:
        root = Path(self.work_dir)
        if not root.is_dir():
            return None
        for labels_file in sorted(root.glob("*/labels.json")):
            job_id = labels_file.parent.name
            job_labels = json.loads(labels_file.read_text())
            if all(job_labels.get(k) == v for k, v in labels.items()) and not self.status(job_id).finished:
                return job_id
        return None

    def status(self, job_id: str) -> JobStatus:
        job_dir = self._dir(job_id)
        exit_file = job_dir / "exit_code"
        if exit_file.exists():
            code = int(exit_file.read_text().strip() or 1)
            if code == 0:
                return JobStatus(SUCCEEDED, exit_code=0)
            return JobStatus(FAILED, reason=exit_reason(code), exit_code=code,
                             detail={"log_tail": _tail(job_dir / "output.log")})
        if _alive(self._pgid(job_dir)):
            return JobStatus(RUNNING)
        if (job_dir / "deleted").exists():
            return JobStatus(FAILED, reason="stopped on request")
        return JobStatus(FAILED, reason="the job's processes are gone without an exit status (machine restart?)",
                         detail={"log_tail": _tail(job_dir / "output.log")})

    def logs(self, job_id: str, cursor: Any = None) -> LogChunk:
        log_file = self._dir(job_id) / "output.log"
        offset = int(cursor or 0)
        if not log_file.exists():
            return LogChunk([], offset)
        with open(log_file, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]  # a half-written line waits for the next call
        lines = complete.decode("utf-8", errors="replace").splitlines()
        return LogChunk(lines, offset + len(complete))

    def delete(self, job_id: str) -> None:
        try:
            job_dir = self._dir(job_id)
        except JobNotFound:
            return
        pgid = self._pgid(job_dir)
        (job_dir / "deleted").touch()
        if not _alive(pgid):
            return
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_seconds
        while _alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_group(pgid, signal.SIGKILL)

    @staticmethod
    def _pgid(job_dir: Path) -> int | None:
        try:
            return int((job_dir / "pid").read_text())
        except (OSError, ValueError):
            return None


def _alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still "exists"; reap it if it is our child, so status() sees it gone.
    try:
        pid, _ = os.waitpid(pgid, os.WNOHANG)
        if pid == pgid:
            return _group_has_members(pgid)
    except ChildProcessError:
        pass
    return True


def _group_has_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
