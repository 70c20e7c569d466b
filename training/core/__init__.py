"""The Airflow-free core: launching and stopping jobs (launcher, backends), validating and sharding data,
evaluating, the promotion gate and the model registry, run-folder readers (runs), tracking (MLflow), the
failure policy, and the `ringflow` shell commands.

May import: ringflow.training.formats, .store, .health, and ringflow.training.rank where it needs a rank's code
(evaluate loads the model) -- torch only inside functions that need it.
Never: Airflow, ringflow.operators (the operators call the core, not the other way round).
"""
