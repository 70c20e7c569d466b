"""What the Kubeflow MPI Operator adds to an MPIJob's pods, on top of what build_mpijob generates.

Source: kubeflow/mpi-operator v0.8.2, pkg/controller/mpi_job_controller.go (newConfigMap,
newSSHAuthSecret, newLauncherPodTemplate, newWorker, setupSSHOnPod). Copied as plain data so the
multi-host tests give the launcher and the workers exactly what the operator would:
- the hostfile /etc/mpi/hostfile, one line per worker: "<job>-worker-<i>.<job>-worker.<ns>.svc slots=<n>";
- the launcher's environment (OpenMPI flavour);
- the SSH Secret: an ECDSA P-521 key pair mounted at spec.sshAuthMountPath as id_rsa, id_rsa.pub and
  authorized_keys (the operator keeps the "id_rsa" names), files owned by root, mode 0644 unless the
  mount path is /root/.ssh (then 0600);
- pod hostnames: "<job>-launcher" and "<job>-worker-<i>", subdomain "<job>-worker";
- /etc/mpi/discover_hosts.sh (mode 0555), Horovod elastic's host discovery: "#!/bin/sh" and "echo <fqdn>" for each
  worker pod now Running, sorted by name (v0.8.2 updateDiscoverHostsInConfigMap).
"""
from __future__ import annotations

from pathlib import Path

HOSTFILE_DIR = "/etc/mpi"
HOSTFILE = f"{HOSTFILE_DIR}/hostfile"
SSH_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys")


def worker_hostname(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def launcher_hostname(job: str) -> str:
    return f"{job}-launcher"


def worker_fqdn(job: str, index: int, namespace: str) -> str:
    return f"{worker_hostname(job, index)}.{job}-worker.{namespace}.svc"


def hostfile(job: str, namespace: str, workers: int, slots: int) -> str:
    return "".join(f"{worker_fqdn(job, i, namespace)} slots={slots}\n" for i in range(workers))


def discover_hosts(job: str, namespace: str, running: list[int]) -> str:
    """discover_hosts.sh as the operator writes it when the worker pods `running` are Running."""
    names = sorted(worker_fqdn(job, i, namespace) for i in running)
    return "#!/bin/sh\n" + "".join(f"echo {name}\n" for name in names)


def launcher_env(slots: int) -> dict[str, str]:
    return {
        "K_MPI_JOB_ROLE": "launcher",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": HOSTFILE,
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": str(slots),
        "NVIDIA_VISIBLE_DEVICES": "",
        "NVIDIA_DRIVER_CAPABILITIES": "",
    }


def worker_env() -> dict[str, str]:
    return {"K_MPI_JOB_ROLE": "worker"}


def write_ssh_secret(folder: Path, mount_path: str) -> None:
    """The files of the operator's SSH Secret as its volume shows them in a pod: an ECDSA P-521 key as an
    "EC PRIVATE KEY" PEM and its public key in authorized_keys format (what newSSHAuthSecret writes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH) + b"\n"
    folder.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if mount_path == "/root/.ssh" else 0o644
    for name, data in (("id_rsa", private), ("id_rsa.pub", public), ("authorized_keys", public)):
        (folder / name).write_bytes(data)
        (folder / name).chmod(mode)
