"""The Kubernetes backends: settings, labels and manifests (settings, labels, job_parts, mpijob, trainjob), what a
job's status means (outcome, trainjob_outcome), the Kubernetes API client (client) and the Backends on top
(backend: MPIJobs and the shared ClusterJobBackend; trainjob_backend: Kubeflow Trainer v2 TrainJobs)."""
