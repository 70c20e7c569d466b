"""MLflow tracking and registry for ringflow runs, optional: Airflow-free, and MLflow is imported only when a
function here is called with settings (a pipeline without MLflow never imports it).

    settings.py        where the server is (TrackingSettings) and the alias promotions move
    params.py          a job config as MLflow params (flattened, dotted keys)
    measurements.py    health records, result.json and eval.json as MLflow metrics with their step
    mlflow_runs.py     one MLflow run per run folder: params, metrics, verdict tag, artifacts
    mlflow_registry.py a promotion registers a model version and moves the alias; rollback moves it back
    served_model.py    the registered model: a pyfunc whose files are data (weights, schema), its code ringflow's
"""
