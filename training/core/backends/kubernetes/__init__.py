"""The Kubernetes backends: settings, labels and manifests (settings, labels, job_parts, mpijob, trainjob), what a
job's status means (mpijob_outcome, trainjob_outcome), the Kubernetes API client (client) and the Backends on top
(mpijob_backend: MPIJobs and the shared ClusterJobBackend; trainjob_backend: Kubeflow Trainer v2 TrainJobs). Two
modules run in a TensorFlow TrainJob's pods, on the TF venv: tf_pod (derives the pod's TF_CONFIG, then
becomes the rank) and jobset_names (how Trainer and JobSet name the pods; the builder reads it too). Nothing
here imports the Kubernetes client at package import, so that they import without it."""
