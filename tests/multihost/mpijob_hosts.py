"""One MPIJob run on namespace hosts: the pods' commands, environment and mounts taken from build_mpijob and
build_configmap, plus what the MPI Operator adds (mpi_operator.py). Launcher and workers are "pods":
start them, wait for the workers' sshd like the readiness probe, delete them (every process ends)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import mpi_operator as op
from hosts import Cluster, Host, sh

from ringflow.training.core.backends.job_spec import JobSpec
from ringflow.training.core.backends.kubernetes.mpijob import (CONFIG_FILE, CONFIG_MOUNT_PATH, build_configmap,
                                                          build_mpijob)
from ringflow.training.core.backends.kubernetes.settings import MPIJobSettings


def _container(manifest: dict, role: str) -> dict:
    return manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]


def _plain_env(container: dict) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        if "value" not in item:
            raise ValueError(f"env {item['name']} comes from {item.get('valueFrom')}: give these tests a plain value")
        env[item["name"]] = item["value"]
    return env


class MPIJobOnHosts:
    def __init__(self, cluster: Cluster, launcher: Host, workers: list[Host], spec: JobSpec,
                 settings: MPIJobSettings, folder: Path):
        self.cluster, self.launcher, self.workers = cluster, launcher, workers
        self.spec, self.settings, self.folder = spec, settings, folder
        self.manifest = build_mpijob(spec, settings)
        replicas = self.manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
        if len(workers) != replicas:
            raise ValueError(f"{len(workers)} hosts for {replicas} worker pods")
        folder.mkdir(parents=True, exist_ok=True)
        # The ConfigMap volume, the operator's hostfile ConfigMap and its SSH Secret.
        self.config_dir = folder / "configmap"
        self.config_dir.mkdir(exist_ok=True)
        for name, text in build_configmap(spec, settings)["data"].items():
            (self.config_dir / name).write_text(text)
        self.mpi_dir = folder / "mpi"
        self.mpi_dir.mkdir(exist_ok=True)
        namespace = settings.namespace or "default"
        (self.mpi_dir / "hostfile").write_text(op.hostfile(spec.name, namespace, replicas,
                                                           self.manifest["spec"]["slotsPerWorker"]))
        # Every worker pod of the MPIJob Running (their sshd; a rank that dies leaves its pod Running).
        discover = self.mpi_dir / "discover_hosts.sh"
        discover.write_text(op.discover_hosts(spec.name, namespace, list(range(len(workers)))))
        discover.chmod(0o555)
        self.ssh_dir = folder / "ssh"
        op.write_ssh_secret(self.ssh_dir, settings.ssh_path)
        self.launcher_log = folder / "launcher.log"

    @property
    def launcher_argv(self) -> list[str]:
        c = _container(self.manifest, "Launcher")
        return c["command"] + c["args"]

    @property
    def launcher_env(self) -> dict[str, str]:
        return _plain_env(_container(self.manifest, "Launcher")) | op.launcher_env(self.manifest["spec"]["slotsPerWorker"])

    def _mounts(self, role: str) -> dict[str, Path]:
        mounts = {CONFIG_MOUNT_PATH: self.config_dir, self.settings.ssh_path: self.ssh_dir}
        if role == "Launcher":
            mounts[op.HOSTFILE_DIR] = self.mpi_dir
        return mounts

    def worker_log(self, index: int) -> Path:
        return self.folder / f"worker-{index}.log"

    def start_workers(self, ready_timeout: float = 30) -> None:
        c = _container(self.manifest, "Worker")
        for i, host in enumerate(self.workers):
            if host.name != op.worker_hostname(self.spec.name, i):
                raise ValueError(f"host {host.name} cannot be worker {i} of MPIJob {self.spec.name}")
            host.start(c["command"] + c["args"], self.worker_log(i), env=_plain_env(c) | op.worker_env(),
                       mounts=self._mounts("Worker"))
        port = c["readinessProbe"]["tcpSocket"]["port"]
        deadline = time.monotonic() + ready_timeout
        for host in self.workers:
            while sh("ip", "netns", "exec", self.launcher.netns, "bash", "-c",
                     f"exec 3<>/dev/tcp/{host.address}/{port}", check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sshd on {host.name} did not answer on port {port}: "
                                       f"{self.worker_log(self.workers.index(host)).read_text()[-2000:]}")
                time.sleep(0.2)

    def start_launcher(self) -> subprocess.Popen:
        if self.launcher.name != op.launcher_hostname(self.spec.name):
            raise ValueError(f"host {self.launcher.name} cannot be the launcher of MPIJob {self.spec.name}")
        return self.launcher.start(self.launcher_argv, self.launcher_log, env=self.launcher_env,
                                   mounts=self._mounts("Launcher"))

    def run(self, timeout: float) -> tuple[int, str]:
        """Workers up, then the launcher to its end; the pods are deleted afterwards either way."""
        try:
            self.start_workers()
            proc = self.start_launcher()
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            return rc, self.launcher_log.read_text(errors="replace")
        finally:
            self.delete()

    def delete(self) -> None:
        """Deleting the MPIJob: every pod of it ends."""
        for host in [self.launcher, *self.workers]:
            host.kill_all()

    def hosts(self) -> list[Host]:
        return [self.launcher, *self.workers]


def config_path_in_pod() -> str:
    return f"{CONFIG_MOUNT_PATH}/{CONFIG_FILE}"


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
