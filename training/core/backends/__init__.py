"""Platform core, where a job runs: the job description (job_spec), one Backend interface (base), local
horovodrun processes (local), Kubeflow MPIJobs (kubernetes/), connection ids resolved by the caller
(connections). No Airflow, no torch at import."""
