"""Hosts made of the training image on one machine: what an MPIJob's pods are, without Kubernetes.

Each host is a Linux network namespace with one veth link to a switch (a bridge in a namespace of its
own, so nothing is added to the machine's own network), and its programs run from the mounted image root
(chroot) in their own mount, UTS and PID namespaces, as the image's user: its own hostname, /tmp and
/dev/shm, and, as in a pod, everything dies with the namespace's first process. Every host sees the same
image root and the same store folder (/srv/ringflow), as pods share an image and an object store.
Addresses come from 10.231.0.0/16 and exist only inside these namespaces.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shlex
import signal
import subprocess
import time
from pathlib import Path

PREFIX = "rfmh-"
SWITCH_IF = "br0"
STORE_MOUNT = "/srv/ringflow"
REGISTRY = Path("/run/ringflow-multihost")  # one file per live cluster: its namespaces and owner pid


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclasses.dataclass(frozen=True)
class ImageRoot:
    """A mounted image: its root folder and the environment its config sets (ENV lines)."""

    path: Path
    env: dict[str, str]
    uid: int = 1000
    gid: int = 1000

    def __post_init__(self) -> None:
        if not (self.path / "usr/sbin/sshd").exists():
            raise ValueError(f"{self.path} is not the training image's root: it has no /usr/sbin/sshd")


@dataclasses.dataclass
class Host:
    name: str          # the pod's hostname
    netns: str
    address: str
    switch_port: str   # the veth end on the switch side: set it down to cut this host off
    cluster: "Cluster"
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def command(self, argv: list[str], env: dict[str, str] | None = None,
                mounts: dict[str, Path] | None = None, as_root: bool = False) -> list[str]:
        """argv run on this host: in its namespaces, chrooted into the image, as the image's user, with a
        clean environment (the image's ENV, then `env`) and `mounts` (path in the image -> host folder)."""
        root = self.cluster.root
        full_env = root.env | {"HOME": "/home/mpiuser", "USER": "mpiuser", "LOGNAME": "mpiuser",
                               "HOSTNAME": self.name} | (env or {})
        binds = {STORE_MOUNT: self.cluster.store, "/etc/hosts": self.cluster.hosts_file} | (mounts or {})
        r = shlex.quote(str(root.path))
        lines = ["set -e", f"hostname {shlex.quote(self.name)}",
                 f"mount -t proc proc {r}/proc", f"mount -t sysfs -o ro sysfs {r}/sys",
                 f"mount --rbind /dev {r}/dev",
                 f"mount -t tmpfs -o mode=1777 tmpfs {r}/dev/shm", f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp"]
        for target, source in binds.items():
            lines.append(f"mount --bind {shlex.quote(str(source))} {r}{shlex.quote(target)}")
        user = [] if as_root else [f"--userspec={root.uid}:{root.gid}"]
        env_args = [f"{k}={v}" for k, v in sorted(full_env.items())]
        lines.append("exec " + shlex.join(["chroot", *user, str(root.path), "/usr/bin/env", "-i", *env_args, *argv]))
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
                "--kill-child", "--propagation", "private", "bash", "-c", "\n".join(lines)]

    def start(self, argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
        """Start argv on this host in the background, its output to `log`."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(self.command(argv, **kwargs), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv, **kwargs), capture_output=True, text=True, timeout=timeout)

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (what would still be running in the pod)."""
        out = sh("ip", "netns", "pids", self.netns, check=False).stdout.split()
        return [int(p) for p in out]

    def process_names(self) -> list[str]:
        names = []
        for pid in self.pids():
            try:
                names.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            except OSError:
                pass
        return names

    def kill_all(self) -> None:
        """What deleting the pod does: every process of the host ends (SIGTERM, then SIGKILL)."""
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (self.pids() or any(p.poll() is None for p in self.procs)):
                time.sleep(0.1)
        for proc in self.procs:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.procs = [p for p in self.procs if p.poll() is None]

    def set_link(self, up: bool) -> None:
        sh("ip", "-n", self.cluster.switch, "link", "set", self.switch_port, "up" if up else "down")


class Cluster:
    """A switch namespace and hosts attached to it. Use as a context manager: leaving it (also on an
    error) kills every process of every host and deletes every namespace it made."""

    def __init__(self, root: ImageRoot, workdir: Path, domain_hosts: dict[str, list[str]] | None = None):
        self.root = root
        self.workdir = workdir
        self.suffix = secrets.token_hex(3)
        self.switch = f"{PREFIX}{self.suffix}-sw"
        self.subnet = f"10.231.{secrets.randbelow(250) + 1}"
        self.hosts: list[Host] = []
        self.store = workdir / "store"
        self.hosts_file = workdir / "hosts"
        self._aliases = domain_hosts or {}

    # -- life cycle -------------------------------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        remove_stale_clusters()
        self.store.mkdir(parents=True, exist_ok=True)
        os.chown(self.store, self.root.uid, self.root.gid)
        for target in (STORE_MOUNT, "/etc/ringflow", "/etc/mpi", "/home/mpiuser/.ssh"):
            (self.root.path / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        self._register()
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", SWITCH_IF, "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", SWITCH_IF, "up")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts:
            host.kill_all()
        for ns in [h.netns for h in self.hosts] + [self.switch]:
            sh("ip", "netns", "del", ns, check=False)
        (REGISTRY / self.suffix).unlink(missing_ok=True)

    def _register(self) -> None:
        doc = {"pid": os.getpid(), "namespaces": [self.switch] + [h.netns for h in self.hosts]}
        (REGISTRY / self.suffix).write_text(json.dumps(doc))

    # -- hosts ------------------------------------------------------------------------------------------
    def add_host(self, name: str, aliases: list[str] = ()) -> Host:
        i = len(self.hosts)
        ns, port = f"{PREFIX}{self.suffix}-{i}", f"p{i}"
        address = f"{self.subnet}.{i + 10}"
        host = Host(name=name, netns=ns, address=address, switch_port=port, cluster=self)
        self.hosts.append(host)
        self._register()
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.switch)
        sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.switch, "link", "set", port, "master", SWITCH_IF)
        sh("ip", "-n", self.switch, "link", "set", port, "up")
        self._aliases[name] = [name, *aliases]
        self._write_hosts()
        return host

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"]
        for host in self.hosts:
            lines.append(f"{host.address} {' '.join(self._aliases[host.name])}")
        self.hosts_file.write_text("\n".join(lines) + "\n")


def remove_stale_clusters() -> None:
    """Namespaces and processes of clusters whose test process died without cleaning up (a killed run)."""
    if not REGISTRY.exists():
        return
    for entry in REGISTRY.iterdir():
        try:
            doc = json.loads(entry.read_text())
            os.kill(int(doc["pid"]), 0)
            continue  # its owner is alive
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            doc = {}
        for ns in doc.get("namespaces", []) if isinstance(doc, dict) else []:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", ns, check=False)
        entry.unlink(missing_ok=True)
