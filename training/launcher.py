"""Start a training job on this machine with horovodrun (Gloo or MPI) and report its exit status."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from typing import Callable

from ringflow.training.config import ConfigError, JobConfig, load_job_config
from ringflow.training.worker_env import ATTEMPT_ENV

CONTROLLERS = ("gloo", "mpi")
# Chosen by bench/throughput.py (bench/results/throughput.md).
DEFAULT_CONTROLLER = "mpi"


def preflight(config_path: str, num_workers: int) -> JobConfig:
    """Every check that can fail before a process starts: the config, the model factory, the manifest."""
    cfg = load_job_config(config_path)
    if cfg.model.kind == "custom":
        from ringflow.training.models import resolve_factory

        resolve_factory(cfg.model.factory)
    from ringflow.training.manifest import ManifestError
    from ringflow.training.store import ObjectNotFound
    from ringflow.training.manifest import load_manifest

    try:
        manifest, _ = load_manifest(cfg.manifest_uri)
    except ObjectNotFound as exc:
        raise ConfigError("manifest_uri", f"{cfg.manifest_uri} does not exist",
                          "run the shard step first or fix the path") from exc
    except ManifestError as exc:
        raise ConfigError("manifest_uri", str(exc), "re-run the shard step") from exc
    if manifest.num_partitions != num_workers:
        raise ConfigError("manifest_uri", f"has {manifest.num_partitions} partitions for {num_workers} workers",
                          f"re-shard for {num_workers} workers or run with --np {manifest.num_partitions}")
    rows = manifest.partitions[0].rows
    if cfg.batch_size > rows:
        raise ConfigError("batch_size", f"{cfg.batch_size} exceeds the {rows} rows of each partition",
                          f"use at most {rows}")
    return cfg


def horovodrun_command(config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
                       python: str = sys.executable) -> list[str]:
    if controller not in CONTROLLERS:
        raise ValueError(f"controller {controller!r}: use one of {CONTROLLERS}")
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
    if horovodrun is None:
        raise FileNotFoundError("horovodrun not found: run scripts/setup.sh to build Horovod")
    return [horovodrun, "-np", str(num_workers), "-H", f"localhost:{num_workers}", f"--{controller}",
            python, "-m", "ringflow.training", config_path]


def job_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    # The Horovod/Open MPI knobs are not here: each rank sets them from the config (worker.start_horovod).
    env = dict(os.environ if base is None else base)
    # OpenMPI refuses root unless told; containers and CI run as root.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_local(config_path: str, num_workers: int, controller: str = DEFAULT_CONTROLLER,
              on_line: Callable[[str], None] = lambda line: print(line, flush=True),
              extra_env: dict[str, str] | None = None) -> int:
    """Preflight, start horovodrun in its own process group, stream its output, return its exit code."""
    cfg = preflight(config_path, num_workers)
    attempt = uuid.uuid4().hex
    env = job_environment() | (extra_env or {}) | {ATTEMPT_ENV: attempt}
    proc = subprocess.Popen(horovodrun_command(config_path, num_workers, controller), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def forward(signum, _frame):  # Ctrl-C or a kill of the launcher takes the whole job down
        _kill_group(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return _job_exit_code(proc.wait(), cfg, attempt)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _kill_group(proc.pid, signal.SIGKILL)


def _job_exit_code(launcher_code: int, cfg: JobConfig, attempt: str) -> int:
    """horovodrun reports any rank's failure as 1; the job's own result.json says which failure it was."""
    if launcher_code == 0:
        return 0
    from ringflow.training import exit_codes, run_layout
    from ringflow.training.store import ObjectNotFound, open_store

    try:
        result = json.loads(open_store(cfg.checkpoint.uri).get_bytes(run_layout.RESULT))
    except (ObjectNotFound, ValueError):
        return launcher_code
    verdict = result.get("verdict") or {}
    if result.get("attempt") == attempt and result.get("status") == "failed":
        return exit_codes.BY_VERDICT.get(verdict.get("status"), launcher_code)
    return launcher_code


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


