"""How Kubeflow Trainer v2.3.0 and the JobSet it makes name a TrainJob's parts: the replicated jobs and their
container, each pod's hostname and its address on the JobSet's headless Service, and the port Trainer opens
between nodes. The TrainJob builder checks names with these; a TensorFlow pod finds its peers with them
(tf_pod.py), so both read the one pattern.

Plain strings, no imports: a TensorFlow pod imports this in the TF venv.
"""
from __future__ import annotations

# Kubeflow Trainer's names (pkg/constants): the replicated jobs, and the container it puts the trainer in.
LAUNCHER, NODE = "launcher", "node"
# Trainer's ContainerTrainerPort: where its own plugins talk between nodes (torchrun's rendezvous on node 0,
# JAX's coordinator). TensorFlow's workers listen on it too, so a NetworkPolicy written for Trainer's jobs
# lets them through.
TRAINER_PORT = 29500


def pod_hostname(jobset: str, replicated_job: str, index: int) -> str:
    """JobSet's pod hostname: "<jobset>-<replicated job>-<job index>-<pod index>". ringflow's runtimes run one
    Job per replicated job (replicas 1), so the job index is 0 and the pod index is the completion index."""
    return f"{jobset}-{replicated_job}-0-{index}"


def pod_address(jobset: str, replicated_job: str, index: int) -> str:
    """The pod's DNS name on the JobSet's headless Service, which is named like the JobSet (its
    network.subdomain, which ringflow's runtimes leave unset; Trainer's own endpoints assume the same)."""
    return f"{pod_hostname(jobset, replicated_job, index)}.{jobset}"
