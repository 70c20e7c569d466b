"""The MPIJob backend: settings, labels and manifests (settings, labels, mpijob), what a job's status means
(outcome), the Kubernetes API client (client) and the Backend on top (backend)."""
