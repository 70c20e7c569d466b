"""Runs a job as local `horovodrun`/`torchrun` processes: the embedded default, for a laptop or a single host.

Each job gets a folder under `work_dir`:
    job.json        the training config          labels.json     for find() on retry
    output.log      everything the job prints    pid             the supervisor's pid (its session and process
                                                                 group), as before processes.json existed
    processes.json  who the supervisor is and how the job's processes are tracked (processes/supervise.py)
    deleted         a stop was asked for
    exit_code       written when the job ends (absent while it runs, or if it was killed); its meaning comes
                    from the one table (training/formats/exit_codes.py), and the job's own result.json is the outcome
                    (the failure policy reads it beside this status: core/failure_policy.py)
The job runs under a supervisor (processes/supervise.py) in its own session, detached from the Airflow worker
that launched it, so the worker slot is free while the task is deferred. Every process the job makes is
tracked as one set (a cgroup, or the supervisor's tree as a subreaper: processes/tracking.py), so a stop ends
all of them whatever state they are in, and `status()` reads "running" while any of them lives.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .base import (
    Backend, JobNotFound, JobState, JobStatus, LogChunk, exit_reason,
)
from .connections import Connections, require
from .job_spec import JobSpec
from ...formats.engines import LOCAL
from .processes import proc
from .processes.proc import Process
from .processes.stop import (
    DEFAULT_GRACE_SECONDS, KILL_WAIT_SECONDS, ProcessesRemain, stop_processes,
)
from .processes.subreaper import ProcessTree
from .processes.supervise import EXIT_CODE_FILE, PROCESSES_FILE
from .processes.tracker import RELEASE_WAIT_SECONDS, ProcessTracker
from .processes.tracking import AUTO, check_mode, reopen

log = logging.getLogger(__name__)
# How long launch() waits for the supervisor to record how it tracks the job (a Python start-up, normally
# well under a second) before it calls the launch failed.
SUPERVISOR_START_SECONDS = 60.0


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
    kind = LOCAL

    def __init__(self, work_dir: str | None = None, python: str | None = None,
                 stop_grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 conn_id: str | None = None, connections: Connections | None = None,
                 process_tracking: str = AUTO):
        """conn_id: a connection (an Airflow one of type aws, through `connections`) whose S3 credentials
        the job gets in its environment, resolved at launch so they never appear in the job spec or the
        trigger's serialized state; None: no connection, the job keeps the S3 variables of the worker's
        environment (operators/connections.py).
        process_tracking: how a job's processes are tracked (processes/tracking.py): "auto" takes the best
        this machine allows; "cgroup-v2", "cgroup-v1" or "subreaper" force one (a forced one that cannot
        work here fails the launch, saying why)."""
        self.work_dir = work_dir or default_work_dir()
        self.python = python or sys.executable
        self.stop_grace_seconds = stop_grace_seconds
        self.conn_id, self.connections = conn_id, connections
        self.process_tracking = check_mode(process_tracking)

    def to_dict(self) -> dict[str, Any]:
        return {"work_dir": self.work_dir, "python": self.python, "stop_grace_seconds": self.stop_grace_seconds,
                "conn_id": self.conn_id, "process_tracking": self.process_tracking}

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
        job_dir = Path(self.work_dir) / spec.name
        if (job_dir / "pid").exists():
            raise FileExistsError(f"a local job named {spec.name!r} was already launched in {job_dir}")
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "job.json").write_text(json.dumps(spec.config, indent=1))
        (job_dir / "labels.json").write_text(json.dumps(spec.labels))
        train = [self.python, "-m", "ringflow.training.core.cli", "train", str(job_dir / "job.json"),
                 "--np", str(spec.num_workers), "--controller", spec.controller]
        # The supervisor records the exit status, since nobody waits on this process once the task defers.
        supervise = [self.python, "-m", "ringflow.training.core.backends.processes.supervise", "--job-dir", str(job_dir),
                     "--tracking", self.process_tracking, "--grace", str(self.stop_grace_seconds), "--", *train]
        with open(job_dir / "output.log", "ab") as output:
            supervisor = subprocess.Popen(supervise, env=job_environment(os.environ, spec.env, self._secret_env(spec)),
                                          stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=job_dir)
        (job_dir / "pid").write_text(str(supervisor.pid))
        self._await_tracking(job_dir, supervisor)
        return spec.name

    @staticmethod
    def _await_tracking(job_dir: Path, supervisor: subprocess.Popen) -> None:
        """Return once the supervisor has written how the job's processes are tracked: from then on any
        process can find every one of them."""
        deadline = time.monotonic() + SUPERVISOR_START_SECONDS
        while not (job_dir / PROCESSES_FILE).exists():
            if supervisor.poll() is not None:
                raise RuntimeError(f"local job {job_dir.name!r} ended before it started training (exit "
                                   f"{supervisor.returncode}): {_tail(job_dir / 'output.log', 5)}")
            if time.monotonic() > deadline:
                supervisor.kill()
                raise RuntimeError(f"local job {job_dir.name!r}: its supervisor did not start within "
                                   f"{SUPERVISOR_START_SECONDS:g} s (see {job_dir / 'output.log'})")
            time.sleep(0.05)

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
        tracker, supervisor = _job_processes(job_dir)
        alive = _alive(tracker, supervisor)
        if not alive:
            tracker.release()  # an empty cgroup its supervisor could not remove (it was killed)
        return local_job_status(_exit_code(job_dir), (job_dir / "deleted").exists(), alive,
                                lambda: _tail(job_dir / "output.log"))

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
        """Stop every process of the job (frozen, ignoring SIGTERM, whatever it is doing) and check that none
        is left; raises ProcessesRemain naming those still alive once the check's bound has passed."""
        try:
            job_dir = self._dir(job_id)
        except JobNotFound:
            return
        (job_dir / "deleted").touch()
        tracker, supervisor = _job_processes(job_dir)
        # The supervisor last: while it lives it reaps, and (as a subreaper) keeps orphans in its tree.
        outcome = stop_processes(tracker, self.stop_grace_seconds, last=[supervisor] if supervisor else [])
        if supervisor:
            _reap(supervisor)
        tracker.release(RELEASE_WAIT_SECONDS)
        if outcome.killed:
            log.info("local job %s: killed after %g s: %s", job_id, self.stop_grace_seconds, outcome.describe())
        if not outcome.clean:
            raise ProcessesRemain(f"stopping local job {job_id!r}", outcome, KILL_WAIT_SECONDS)


def local_job_status(exit_code: int | None, deleted: bool, alive: Sequence[Process],
                     log_tail: Callable[[], str]) -> JobStatus:
    """What a local job's folder and live processes say of it. Pure but for reading `log_tail`.

    Never finished while any process of the job lives: a retry must not start beside a rank that still
    writes to the run folder (a frozen one thawed later would)."""
    if alive:
        if exit_code is None and not deleted:
            return JobStatus(JobState.RUNNING)
        which = "; ".join(p.describe() for p in alive)
        ended = "stopping on request" if exit_code is None else f"the job ended ({exit_reason(exit_code)})"
        return JobStatus(JobState.RUNNING, reason=f"{ended}, but {len(alive)} of its processes are still alive: {which}",
                         detail={"alive": [p.to_dict() for p in alive]})
    if exit_code == 0:
        return JobStatus(JobState.SUCCEEDED, exit_code=0)
    if deleted:
        return JobStatus(JobState.FAILED, reason="stopped on request", exit_code=exit_code)
    if exit_code is not None:
        return JobStatus(JobState.FAILED, reason=exit_reason(exit_code), exit_code=exit_code,
                         detail={"log_tail": log_tail()})
    return JobStatus(JobState.FAILED, reason="the job's processes are gone without an exit status (machine restart?)",
                     detail={"log_tail": log_tail()})


def _job_processes(job_dir: Path) -> tuple[ProcessTracker, Process | None]:
    """The job's tracked set and its supervisor, as its processes.json records them."""
    try:
        doc = json.loads((job_dir / PROCESSES_FILE).read_text())
    except FileNotFoundError:
        doc = None
    if doc is not None:
        who = doc["supervisor"]
        supervisor = Process(pid=int(who["pid"]), start=int(who["start"]), ppid=0, state="?")
        return reopen(doc["tracking"]), supervisor
    # A folder from before processes.json (an older ringflow): the tree under the process it started is all
    # that is known of the job, and that process is whoever has its pid now.
    try:
        root = proc.read(int((job_dir / "pid").read_text()))
    except (OSError, ValueError):
        root = None
    if root is None:
        return ProcessTree(Process(pid=0, start=-1, ppid=0, state="X"), None), None
    return ProcessTree(root, None), root  # every descendant: it marked nothing


def _alive(tracker: ProcessTracker, supervisor: Process | None) -> list[Process]:
    if supervisor is not None:
        _reap(supervisor)
    found = {p.identity: p for p in tracker.members()}
    if supervisor is not None and (now := proc.current(supervisor)) is not None:
        found.setdefault(now.identity, now)
    return list(found.values())


def _reap(supervisor: Process) -> None:
    """Collect the supervisor's exit status if this process started it, so it does not linger as a zombie.
    Only that zombie: a pid alone could be another child's by now, whose Popen must reap it itself."""
    now = proc.read(supervisor.pid)
    if now is None or not now.ended or now.start != supervisor.start:
        return
    try:
        os.waitpid(supervisor.pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _exit_code(job_dir: Path) -> int | None:
    try:
        text = (job_dir / EXIT_CODE_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text or 1)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
